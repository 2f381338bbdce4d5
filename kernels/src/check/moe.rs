//! The MoE kernels against host references: `crate::moe::moe_route()` against
//! [`crate::moe::route_row`] (ids exactly, weights within [`ROUTE_TOL`]), and
//! `crate::moe::gemv_id()` against f64 dot products of the dequantized bank (each slot's rows
//! against its expert's, the GEMV's bound [`super::GEMV_TOL`]).
use super::{gemv_error_of, rand_f32, read_f32, worse};
use crate::moe::{GemvIdShape, launch_gemv_id, launch_moe_route, route_row};
use crate::{GemvConfig, KernelError, grid_words, words_for_bytes};
use cubecl::client::Client;
use cubecl::prelude::*;
use gguf::GgmlType;

/// Relative tolerance of a routing weight (f32 softmax against the host's f32 softmax: the
/// same operations, so only the exponential's last bits differ).
pub const ROUTE_TOL: f64 = 1e-5;

/// `(tokens, n_expert, k, norm)` routing cases: Qwen3-MoE's 128 experts choosing 8, the
/// fixtures' 4 choosing 2, one choosing all, one choosing one, unnormalised weights, more
/// tokens than a cube's 64 units.
pub fn route_cases() -> Vec<(usize, usize, usize, bool)> {
    vec![
        (5, 128, 8, true),
        (3, 4, 2, true),
        (1, 8, 8, false),
        (4, 16, 1, true),
        (70, 60, 4, false),
    ]
}

/// Router logits for a routing check: `n * n_expert` values on a coarse grid, so rows hold
/// equal logits (ties, ordered by expert id).
pub fn route_input(n: usize, n_expert: usize, seed: u64) -> Vec<f32> {
    rand_f32(n * n_expert, seed)
        .iter()
        .map(|v| (v * 8.0).round() / 2.0)
        .collect()
}

/// Runs [`crate::moe::launch_moe_route`] on [`route_input`] and returns the worst weight error
/// as a fraction of [`ROUTE_TOL`] (<= 1 passes); any id that differs from the host's is an
/// infinite error.
///
/// # Errors
/// Launch errors or a failed read-back.
pub fn route_error(
    client: &Client,
    (n, n_expert, k, norm): (usize, usize, usize, bool),
    seed: u64,
) -> Result<f64, KernelError> {
    let logits = route_input(n, n_expert, seed);
    let lh = client.create_from_slice(f32::as_bytes(&logits));
    let ih = client.empty(n * k * size_of::<u32>());
    let wh = client.empty(n * k * size_of::<f32>());
    // SAFETY: each length is that of the buffer just created.
    let (la, ia, wa) = unsafe {
        (
            BufferArg::from_raw_parts(lh, logits.len()),
            BufferArg::from_raw_parts(ih.clone(), n * k),
            BufferArg::from_raw_parts(wh.clone(), n * k),
        )
    };
    launch_moe_route(client, la, ia, wa, n, n_expert, k, norm)?;
    let ids_bytes = client.read_one(ih).map_err(|e| KernelError::Shape {
        op: "moe_route",
        reason: format!("read-back: {e}"),
    })?;
    let ids = u32::from_bytes(&ids_bytes).to_vec();
    let weights = read_f32(client, wh)?;
    let mut worst = 0f64;
    for (t, row) in logits.chunks_exact(n_expert).enumerate() {
        let (want_ids, want_w) = route_row(row, k, norm);
        for j in 0..k {
            if ids[t * k + j] != want_ids[j] {
                return Ok(f64::INFINITY);
            }
            let (got, want) = (weights[t * k + j] as f64, want_w[j] as f64);
            let err = (got - want).abs() / (ROUTE_TOL * want.abs().max(1e-30));
            worst = worse(worst, err);
        }
    }
    Ok(worst)
}

/// A `crate::moe::gemv_id()` case over a bank of `n_expert` experts of `expert_rows` rows of
/// `cols` values (`bytes`, `reference` its dequantized values): `tokens` tokens with `k` slots
/// each, the rows `row_offset..row_offset + rows` of each expert, the bank split into two
/// parts at `split` rows (inside an expert).
#[derive(Clone, Copy, Debug)]
pub struct GemvIdCase {
    /// Experts in the bank.
    pub n_expert: usize,
    /// Rows of each expert.
    pub expert_rows: usize,
    /// Values per row.
    pub cols: usize,
    /// The first row of each expert the product takes.
    pub row_offset: usize,
    /// Rows taken of each expert.
    pub rows: usize,
    /// Tokens.
    pub tokens: usize,
    /// Experts per token.
    pub k: usize,
    /// Whether each slot has its own activation row (down) or shares its token's (gate, up).
    pub own_x: bool,
    /// Bank rows in the first part (the rest in the second); 0: one part.
    pub split: usize,
}

/// Runs [`crate::moe::launch_gemv_id`] for `case` with `config` (one launch per part, summed)
/// and returns the worst error as a fraction of its bound (<= 1 passes).
///
/// # Errors
/// Launch errors or a failed read-back.
pub fn gemv_id_error(
    client: &Client,
    ty: GgmlType,
    bytes: &[u8],
    reference: &[f32],
    case: GemvIdCase,
    config: GemvConfig,
    seed: u64,
) -> Result<f64, KernelError> {
    let GemvIdCase {
        n_expert,
        expert_rows,
        cols,
        row_offset,
        rows,
        tokens,
        k,
        own_x,
        split,
    } = case;
    let slots = tokens * k;
    let x_div = if own_x { 1 } else { k };
    let x = rand_f32(slots.div_ceil(x_div) * cols, seed);
    // Every expert, in an order that is not the slots'.
    let ids: Vec<u32> = (0..slots)
        .map(|s| ((s * 7 + seed as usize) % n_expert) as u32)
        .collect();
    let bank_rows = n_expert * expert_rows;
    let row_bytes = ty.row_bytes(cols as u64).map_err(|e| KernelError::Shape {
        op: "gemv_id",
        reason: e.to_string(),
    })? as usize;
    let bounds = if split == 0 {
        vec![(0, bank_rows)]
    } else {
        vec![(0, split), (split, bank_rows)]
    };
    let grid = grid_words(ty).ok_or(KernelError::Unsupported(ty))?;
    let gh = client.create_from_slice(u32::as_bytes(&grid));
    let xh = client.create_from_slice(f32::as_bytes(&x));
    let ih = client.create_from_slice(u32::as_bytes(&ids));
    let mut y = vec![0f32; slots * rows];
    for (row_start, end) in bounds {
        let part_rows = end - row_start;
        let words = words_for_bytes(&bytes[row_start * row_bytes..end * row_bytes]);
        let wh = client.create_from_slice(u32::as_bytes(&words));
        let yh = client.empty(slots * rows * size_of::<f32>());
        // SAFETY: each length is that of the buffer just created.
        let (wa, ga, xa, ia, ya) = unsafe {
            (
                BufferArg::from_raw_parts(wh, words.len()),
                BufferArg::from_raw_parts(gh.clone(), grid.len()),
                BufferArg::from_raw_parts(xh.clone(), x.len()),
                BufferArg::from_raw_parts(ih.clone(), slots),
                BufferArg::from_raw_parts(yh.clone(), slots * rows),
            )
        };
        let shape = GemvIdShape {
            rows,
            cols,
            slots,
            x_div,
            expert_rows,
            row_offset,
            row_start,
            part_rows,
            n_expert,
        };
        launch_gemv_id(client, ty, wa, ga, xa, ia, ya, shape, config)?;
        for (acc, v) in y.iter_mut().zip(read_f32(client, yh)?) {
            *acc += v;
        }
    }
    let mut worst = 0f64;
    for s in 0..slots {
        let first = (ids[s] as usize * expert_rows + row_offset) * cols;
        let expert = &reference[first..first + rows * cols];
        let xs = &x[(s / x_div) * cols..(s / x_div + 1) * cols];
        let err = gemv_error_of(&y[s * rows..(s + 1) * rows], xs, expert, rows, cols);
        worst = worse(worst, err);
    }
    Ok(worst)
}

//! Mixture-of-experts on the device, so that a MoE layer reads nothing back to the host:
//! - `moe_route()`: each token's router logits to its `k` experts and their weights (softmax,
//!   top-k, renormalisation: llama.cpp `build_moe_ffn`'s `ggml_soft_max`, `ggml_top_k`,
//!   `ggml_get_rows` and, with `norm_w`, the division by their sum);
//! - `gemv_id()`: the fused dequantize + GEMV of a bank of experts stacked by rows, each
//!   output slot taking its expert from a buffer of ids (llama.cpp `ggml_mul_mat_id`).
use crate::formats::*;
use crate::gemv::{chunk_dot, decode_for_dot, keep_binding};
use crate::{
    GemvConfig, KernelError, check_grid, check_words, cube_count_for, row_bytes, shape_err,
    with_format,
};
use cubecl::client::Client;
use cubecl::prelude::*;
use gguf::GgmlType;

/// Routes each token: one unit per row `t` of `logits` (`[n, n_expert]` f32). The softmax of
/// the row (its maximum subtracted, f32), then the `k` largest probabilities in decreasing
/// order (equal ones by increasing expert id, as a stable sort) into `ids[t * k + j]` and
/// `weights[t * k + j]`, the weights divided by their sum when `norm`.
#[cube(launch_unchecked)]
pub(crate) fn moe_route(
    logits: &[f32],
    ids: &mut [u32],
    weights: &mut [f32],
    n: u32,
    n_expert: u32,
    k: u32,
    #[comptime] norm: bool,
) {
    let t = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) * CUBE_DIM_X + UNIT_POS_X;
    if t < n {
        let base = t * n_expert;
        let mut max = logits[base as usize];
        for e in 1..n_expert {
            let l = logits[(base + e) as usize];
            max = select(l > max, l, max);
        }
        let mut sum = 0.0f32;
        for e in 0..n_expert {
            sum += f32::exp(logits[(base + e) as usize] - max);
        }
        // Each pick is the best of the experts after the previous pick in the order (larger
        // probability, then smaller id).
        let mut last_p = 0.0f32;
        let mut last_e = 0u32;
        let mut picked = 0.0f32;
        for j in 0..k {
            let mut best_p = 0.0f32;
            let mut best_e = n_expert;
            for e in 0..n_expert {
                let p = f32::exp(logits[(base + e) as usize] - max) / sum;
                let after = j == 0 || p < last_p || (p == last_p && e > last_e);
                if after && (best_e == n_expert || p > best_p) {
                    best_p = p;
                    best_e = e;
                }
            }
            // No candidate only when the row holds NaN (its first pick is then expert 0 with
            // a NaN weight): expert 0 with no weight, so every id stays inside the bank.
            let found = best_e < n_expert;
            best_p = select(found, best_p, 0.0f32);
            best_e = select(found, best_e, 0u32);
            ids[(t * k + j) as usize] = best_e;
            weights[(t * k + j) as usize] = best_p;
            picked += best_p;
            last_p = best_p;
            last_e = best_e;
        }
        if comptime!(norm) {
            for j in 0..k {
                weights[(t * k + j) as usize] /= picked;
            }
        }
    }
}

/// `y[s, r] = W[ids[s] * expert_rows + row_offset + r, :] . x[s / x_div, :]` for slots `s <
/// slots` and rows `r < rows`, where `W` is a bank of experts stacked by rows (`[n_expert,
/// expert_rows, cols]`, as the file stores it) of which `w` holds the rows
/// `[row_start, row_start + part_rows)`; zero where the row lies in another part (a bank split
/// into parts runs once per part, and the parts' outputs add up). `row_offset` and `rows`
/// select a range of each expert's rows (the gate or the up half of a merged `gate_up` bank).
/// `x` is f32 rows of `cols`; `x_div` is the slots per activation row: `k` for the gate and up
/// projections (a token's slots share its input), 1 for down (each slot has its own). `y` is
/// `[slots, rows]`. The split layout of [`crate::gemv::gemv()`] with one activation row: `lanes`
/// units per output row (reduced with a plane sum with `plane`, else in shared memory; none
/// with one lane), `rows_per_cube` rows per cube.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_id<F: BlockDecode>(
    w: &[u32],
    grid: &[u32],
    x: &[f32],
    ids: &[u32],
    y: &mut [f32],
    rows: u32,
    cols: u32,
    slots: u32,
    x_div: u32,
    expert_rows: u32,
    row_offset: u32,
    row_start: u32,
    part_rows: u32,
    #[comptime] lanes: u32,
    #[comptime] rows_per_cube: u32,
    #[comptime] plane: bool,
) {
    if comptime!(!F::GRID.has_table()) {
        keep_binding(grid, y, rows == 0);
    }
    let lane = UNIT_POS_X;
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let v = cube * rows_per_cube + UNIT_POS_Y;
    let block_elems = comptime!(F::BLOCK_ELEMS);
    let block_bytes = comptime!(F::BLOCK_BYTES);
    let chunks = comptime!(F::CHUNKS);
    let blocks = cols / block_elems;
    let inside = v < slots * rows;
    let s = select(inside, v / rows, 0u32);
    let g = ids[s as usize] * expert_rows + row_offset + v % rows - row_start;
    // Units of rows past the end or in other parts do no work but still take part in the
    // reduction below.
    let mine = inside && g < part_rows;
    let n_chunks = select(mine, blocks * chunks, 0u32);
    let row_byte = select(mine, g * blocks * block_bytes, 0u32);
    let xo_row = (s / x_div) * cols;

    let mut acc = 0.0f32;
    let mut vals = Array::<f32>::new(comptime!(F::FORM.out_len() as usize));
    let mut c = lane;
    while c < n_chunks {
        let b = c / chunks;
        let kk = c % chunks;
        decode_for_dot::<F>(w, grid, row_byte + b * block_bytes, kk, &mut vals);
        let xo = xo_row + b * block_elems + kk * comptime!(CHUNK_ELEMS);
        acc += chunk_dot::<F>(&vals, x, xo);
        c += lanes;
    }

    // Rows of other parts store the zero they summed.
    if comptime!(lanes == 1) {
        if inside {
            y[v as usize] = acc;
        }
    } else if comptime!(plane) {
        let total = plane_sum(acc);
        if lane == 0 && inside {
            y[v as usize] = total;
        }
    } else {
        let mut smem = Shared::<[f32]>::new_slice(comptime!((lanes * rows_per_cube) as usize));
        let base = UNIT_POS_Y * lanes;
        smem[(base + lane) as usize] = acc;
        sync_cube();
        if lane == 0 && inside {
            let mut total = 0.0f32;
            #[unroll]
            for l in 0..lanes {
                total += smem[(base + l) as usize];
            }
            y[v as usize] = total;
        }
    }
}

/// The host's routing of one token, as `moe_route()` routes on the device: the softmax of
/// `logits` (its maximum subtracted, f32), the `k` largest probabilities in decreasing order
/// (equal ones by increasing expert id), divided by their sum when `norm`. Returns `(ids,
/// weights)`, `k` each (fewer when `logits` has fewer values).
pub fn route_row(logits: &[f32], k: usize, norm: bool) -> (Vec<u32>, Vec<f32>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    let probs: Vec<f32> = logits.iter().map(|l| (l - max).exp() / sum).collect();
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    // Stable: equal probabilities keep increasing ids.
    order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]));
    order.truncate(k);
    let mut weights: Vec<f32> = order.iter().map(|&e| probs[e as usize]).collect();
    if norm {
        let picked: f32 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= picked);
    }
    (order, weights)
}

/// Routes `n` tokens (`moe_route()`): `logits` `[n, n_expert]` f32, `ids` and `weights`
/// `[n, k]` (u32, f32), the weights renormalised to sum to 1 when `norm`.
///
/// # Errors
/// `k` not in `1..=n_expert`, or a buffer shorter than the shapes need.
#[allow(clippy::too_many_arguments)]
pub fn launch_moe_route(
    client: &Client,
    logits: BufferArg,
    ids: BufferArg,
    weights: BufferArg,
    n: usize,
    n_expert: usize,
    k: usize,
    norm: bool,
) -> Result<(), KernelError> {
    const OP: &str = "moe_route";
    let scores = n.checked_mul(n_expert).filter(|s| *s <= u32::MAX as usize);
    let picks = n.checked_mul(k).filter(|s| *s <= u32::MAX as usize);
    let (Some(scores), Some(picks)) = (scores, picks) else {
        return Err(shape_err(
            OP,
            format!("{n} tokens x {n_expert} experts: too many"),
        ));
    };
    if k == 0 || k > n_expert {
        return Err(shape_err(
            OP,
            format!("{k} of {n_expert} experts per token"),
        ));
    }
    if logits.len() < scores || ids.len() < picks || weights.len() < picks {
        return Err(shape_err(
            OP,
            format!(
                "logits {}, ids {} and weights {} values for {n} tokens, {k} of {n_expert} \
                 experts",
                logits.len(),
                ids.len(),
                weights.len()
            ),
        ));
    }
    if n == 0 {
        return Ok(());
    }
    let per_cube = 64u32;
    // SAFETY: units at or past `n` do nothing; the others read below n * n_expert and write
    // below n * k, checked above.
    unsafe {
        moe_route::launch_unchecked(
            client,
            cube_count_for((n as u32).div_ceil(per_cube)),
            CubeDim::new_1d(per_cube),
            logits,
            ids,
            weights,
            n as u32,
            n_expert as u32,
            k as u32,
            norm,
        )
    };
    Ok(())
}

/// The shape of a `gemv_id()` launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvIdShape {
    /// Output rows per slot.
    pub rows: usize,
    /// Values per row (a multiple of the type's block).
    pub cols: usize,
    /// Output slots (tokens x experts per token); `ids` and `y` hold one entry / row each.
    pub slots: usize,
    /// Slots per activation row: `k` when a token's slots share its input, 1 when each slot
    /// has its own.
    pub x_div: usize,
    /// Rows of each expert in the bank (`rows` for a bank of one projection, `2 * rows` for a
    /// merged `gate_up` bank).
    pub expert_rows: usize,
    /// The first of each expert's rows the product takes (0, or `rows` for the up half of a
    /// merged bank).
    pub row_offset: usize,
    /// The bank's first row this part holds.
    pub row_start: usize,
    /// Rows this part holds (`w` holds them).
    pub part_rows: usize,
    /// Experts in the bank (ids must be below it).
    pub n_expert: usize,
}

/// `gemv_id()` over one part of a bank of `ty` experts: `w` holds `part_rows` rows of `cols`
/// values, `grid` the type's codebook ([`crate::grid_words`]), `x` is
/// `[ceil(slots / x_div), cols]` f32, `ids` `slots` u32 expert ids (below `n_expert`), `y`
/// `[slots, rows]` f32 (zero where the row lies in another part). `config` must be a
/// [`GemvConfig::Split`] layout.
///
/// # Errors
/// Unsupported type, `cols` not a multiple of the type's block, a buffer shorter than the
/// shapes need, `x_div` zero, `row_offset + rows` past `expert_rows`, a part outside the bank,
/// or an own-rows `config`.
#[allow(clippy::too_many_arguments)]
pub fn launch_gemv_id(
    client: &Client,
    ty: GgmlType,
    w: BufferArg,
    grid: BufferArg,
    x: BufferArg,
    ids: BufferArg,
    y: BufferArg,
    shape: GemvIdShape,
    config: GemvConfig,
) -> Result<(), KernelError> {
    const OP: &str = "gemv_id";
    let GemvIdShape {
        rows,
        cols,
        slots,
        x_div,
        expert_rows,
        row_offset,
        row_start,
        part_rows,
        n_expert,
    } = shape;
    let GemvConfig::Split { .. } = config else {
        return Err(shape_err(
            OP,
            format!("variant {} is not a split layout", config.name()),
        ));
    };
    let rb = row_bytes(OP, ty, cols)?;
    check_words(OP, &w, part_rows, rb)?;
    check_grid(OP, ty, &grid)?;
    let bank_rows = n_expert
        .checked_mul(expert_rows)
        .filter(|b| *b <= u32::MAX as usize);
    let x_rows = slots.checked_div(x_div);
    let outs = slots.checked_mul(rows).filter(|o| *o <= u32::MAX as usize);
    let (Some(bank_rows), Some(_), Some(outs)) = (bank_rows, x_rows, outs) else {
        return Err(shape_err(
            OP,
            format!("{slots} slots of {rows} rows, x_div {x_div}, {n_expert} x {expert_rows}"),
        ));
    };
    let inputs = slots.div_ceil(x_div).checked_mul(cols);
    if row_offset + rows > expert_rows
        || row_start
            .checked_add(part_rows)
            .is_none_or(|e| e > bank_rows)
        || inputs.is_none_or(|i| x.len() < i || i > u32::MAX as usize)
        || ids.len() < slots
        || y.len() < outs
    {
        return Err(shape_err(
            OP,
            format!(
                "x {}, ids {} and y {} values for {shape:?}",
                x.len(),
                ids.len(),
                y.len()
            ),
        ));
    }
    if outs == 0 {
        return Ok(());
    }
    let (lanes, rows_per_cube, plane) = config.kernel_args();
    let count = cube_count_for((outs as u32).div_ceil(rows_per_cube));
    with_format!(ty, F => {
        // SAFETY: ids are read below `slots`; weight rows only inside the part (`g <
        // part_rows`, checked against `w`; ids past `n_expert` wrap to rows the part check
        // keeps inside `w`); x below ceil(slots / x_div) * cols; writes below slots * rows;
        // grid reads below the table's length (indices masked to its size).
        unsafe {
            gemv_id::launch_unchecked::<F>(
                client, count, config.cube_dim(), w, grid, x, ids, y, rows as u32, cols as u32,
                slots as u32, x_div as u32, expert_rows as u32, row_offset as u32,
                row_start as u32, part_rows as u32, lanes, rows_per_cube, plane,
            )
        };
        Ok(())
    }, Err(KernelError::Unsupported(ty)))
}

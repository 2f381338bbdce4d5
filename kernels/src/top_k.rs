//! The `k` largest values of each row and their indices, on the device: what a sampler needs
//! from a row of logits, so a decoding step reads back `k` (value, id) pairs instead of the whole
//! vocabulary (262,144 values for Gemma 3). llama.cpp's samplers do the same top-k first, on the
//! host (`llama_sampler_init_top_k`); here it runs where the logits are.
//!
//! Two passes of one kernel: each cube takes a chunk of [`TOP_K_CHUNK`] values of a row and
//! writes that chunk's top `k`; one cube per row then takes the top `k` of the chunks'
//! candidates. Each pass selects `k` times: every unit scans its values for the best one after
//! the last selected, writes it to shared memory, and every unit then takes the best of the
//! units' bests (two barriers a round; a tree reduction would take log2(units)). The work is
//! `k` times the row, so it suits GPUs; a CPU-emulated device is better served reading the row
//! back (`burn_gguf_models::generate::SampleFrom`).
use crate::{KernelError, cube_count_for, shape_err};
use cubecl::client::Client;
use cubecl::prelude::*;

/// Units of a cube.
pub const TOP_K_UNITS: u32 = 64;
/// Values of a row each cube of the first pass selects from.
pub const TOP_K_CHUNK: u32 = 4096;
/// The largest `k`.
pub const TOP_K_MAX: usize = 256;
/// The id of an empty candidate (a row with fewer than `k` finite values).
pub const NO_ID: u32 = u32::MAX;

/// Whether (`av`, `ai`) comes before (`bv`, `bi`) in the selection order: larger value first,
/// then smaller id; [`NO_ID`] last.
#[cube]
fn before(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    ai != NO_ID && (bi == NO_ID || av > bv || (av == bv && ai < bi))
}

/// One selection pass. Cube `c` takes chunk `c % chunks` (`chunk` values) of row `c / chunks`
/// of `values` `[rows, n]` f32 (ids `[rows, n]` u32 with `with_ids`, else the column index) and
/// writes its best `k` in order to `out_values`, `out_ids` `[rows * chunks, k]`; unfilled places
/// get [`NO_ID`]. NaN and infinite values are never selected (as the host sampler drops them).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn top_k(
    values: &[f32],
    ids: &[u32],
    out_values: &mut [f32],
    out_ids: &mut [u32],
    rows: u32,
    n: u32,
    chunks: u32,
    chunk: u32,
    k: u32,
    #[comptime] units: u32,
    #[comptime] with_ids: bool,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let unit = UNIT_POS_X;
    let row = cube / chunks;
    // Whole cubes past the last row do nothing; the barriers below stay uniform in a cube.
    let live = row < rows;
    let start = (cube % chunks) * chunk;
    let end = min(start + chunk, n);
    let base = row * n;
    let mut best_v = Shared::<[f32]>::new_slice(comptime!(units as usize));
    let mut best_i = Shared::<[u32]>::new_slice(comptime!(units as usize));
    // The last selected candidate; nothing is selected before it.
    // (A mutable value must start from an expression, not a literal: `max_value()` is NO_ID.)
    let mut last_v = f32::max_value();
    let mut last_i = u32::max_value();
    for r in 0..k {
        let mut bv = f32::min_value();
        let mut bi = u32::max_value();
        let mut i = start + unit;
        while live && i < end {
            let v = values[(base + i) as usize];
            let mut id = i;
            if comptime!(with_ids) {
                id = ids[(base + i) as usize];
            }
            // Finite (NaN fails both comparisons), after the last selected, better than bv.
            let finite = v >= f32::min_value() && v <= f32::max_value();
            let after = r == 0 || before(last_v, last_i, v, id);
            if finite && after && before(v, id, bv, bi) {
                bv = v;
                bi = id;
            }
            i += units;
        }
        best_v[unit as usize] = bv;
        best_i[unit as usize] = bi;
        sync_cube();
        // Every unit finds the winner among the units' bests itself: two barriers a round
        // (this one and the one below) instead of a tree's log2(units) + 1.
        last_v = best_v[0];
        last_i = best_i[0];
        for u in 1..units {
            let ov = best_v[u as usize];
            let oi = best_i[u as usize];
            if before(ov, oi, last_v, last_i) {
                last_v = ov;
                last_i = oi;
            }
        }
        if live && unit == 0 {
            out_values[(cube * k + r) as usize] = last_v;
            out_ids[(cube * k + r) as usize] = last_i;
        }
        // Every unit has read the winner before the next round overwrites it.
        sync_cube();
    }
}

/// The top `k` of each row of `values` `[rows, n]` f32, best first (larger value, then smaller
/// index), into `out_values` `[rows, k]` f32 and `out_ids` `[rows, k]` u32: `top_k()`, one pass
/// for a row of at most [`TOP_K_CHUNK`] values, else two with scratch buffers of `rows *
/// ceil(n / TOP_K_CHUNK) * k` values. NaN and infinite values are skipped; a row with fewer
/// than `k` finite values ends in [`NO_ID`]s.
///
/// # Errors
/// `k` of 0 or past [`TOP_K_MAX`], an empty row, sizes past `u32::MAX`, or buffers shorter
/// than the shapes.
#[allow(clippy::too_many_arguments)]
pub fn launch_top_k(
    client: &Client,
    values: BufferArg,
    out_values: BufferArg,
    out_ids: BufferArg,
    rows: usize,
    n: usize,
    k: usize,
) -> Result<(), KernelError> {
    const OP: &str = "top_k";
    if k == 0 || k > TOP_K_MAX || n == 0 {
        return Err(shape_err(
            OP,
            format!("k = {k} of rows of {n}: k must be in 1..={TOP_K_MAX}, rows not empty"),
        ));
    }
    let chunks = n.div_ceil(TOP_K_CHUNK as usize);
    let sizes = rows
        .checked_mul(n)
        .zip(rows.checked_mul(chunks).and_then(|c| c.checked_mul(k)))
        .filter(|(a, b)| *a <= u32::MAX as usize && *b <= u32::MAX as usize);
    let Some((total, scratch)) = sizes else {
        return Err(shape_err(
            OP,
            format!("{rows} rows of {n}: past u32::MAX values"),
        ));
    };
    let out = rows * k;
    if values.len() < total || out_values.len() < out || out_ids.len() < out {
        return Err(shape_err(
            OP,
            format!(
                "values {}, out_values {}, out_ids {} values for {rows} rows of {n}, k = {k}",
                values.len(),
                out_values.len(),
                out_ids.len()
            ),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let dim = CubeDim::new_1d(TOP_K_UNITS);
    let (rows32, n32, k32) = (rows as u32, n as u32, k as u32);
    // SAFETY: a one-value placeholder for the ids, which a pass without `with_ids` never reads.
    let no_ids = || unsafe { BufferArg::from_raw_parts(client.empty(size_of::<u32>()), 1) };
    if chunks == 1 {
        // SAFETY: cube c < rows reads row c's n values below rows * n <= values.len() and writes
        // k values at c * k < rows * k <= the outputs' lengths.
        unsafe {
            top_k::launch_unchecked(
                client,
                cube_count_for(rows32),
                dim,
                values,
                no_ids(),
                out_values,
                out_ids,
                rows32,
                n32,
                1,
                n32,
                k32,
                TOP_K_UNITS,
                false,
            )
        };
        return Ok(());
    }
    let part_values = client.empty(scratch * size_of::<f32>());
    let part_ids = client.empty(scratch * size_of::<u32>());
    let chunks32 = chunks as u32;
    // SAFETY: pass 1: cube c < rows * chunks reads row c / chunks below rows * n and writes k
    // values at c * k < scratch. Pass 2: cube c < rows reads its row of chunks * k candidates below scratch and
    // writes k values at c * k < rows * k.
    unsafe {
        top_k::launch_unchecked(
            client,
            cube_count_for(rows32 * chunks32),
            dim,
            values,
            no_ids(),
            BufferArg::from_raw_parts(part_values.clone(), scratch),
            BufferArg::from_raw_parts(part_ids.clone(), scratch),
            rows32,
            n32,
            chunks32,
            TOP_K_CHUNK,
            k32,
            TOP_K_UNITS,
            false,
        );
        top_k::launch_unchecked(
            client,
            cube_count_for(rows32),
            dim,
            BufferArg::from_raw_parts(part_values, scratch),
            BufferArg::from_raw_parts(part_ids, scratch),
            out_values,
            out_ids,
            rows32,
            chunks32 * k32,
            1,
            chunks32 * k32,
            k32,
            TOP_K_UNITS,
            true,
        )
    };
    Ok(())
}

/// The host's top `k` of one row, the order `top_k()` reproduces: finite values only, larger
/// value first, then smaller index (-0 and 0 tie); fewer than `k` when the row has fewer finite values. The
/// reference of the kernel's tests and the path of devices without the kernel.
pub fn top_k_row(values: &[f32], k: usize) -> Vec<(f32, u32)> {
    let mut all: Vec<(f32, u32)> = values
        .iter()
        .zip(0u32..)
        .filter(|(v, _)| v.is_finite())
        .map(|(&v, i)| (v, i))
        .collect();
    // Finite values compare totally; -0 equals 0, a tie, as on the device. Ids are distinct,
    // so the order is strict and the first k are the same however they are found.
    let order = |a: &(f32, u32), b: &(f32, u32)| {
        b.0.partial_cmp(&a.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.1.cmp(&b.1))
    };
    if k < all.len() {
        if k == 0 {
            return Vec::new();
        }
        all.select_nth_unstable_by(k - 1, order);
        all.truncate(k);
    }
    all.sort_by(order);
    all
}

//! Fused dequantize + GEMV: `y[r, n] = sum_k x[r, k] * W[n, k]` for 1..=8 activation rows,
//! weights read once straight from their ggml blocks.
//!
//! Each output row `n` is handled by `lanes` units of one cube (CubeDim `(lanes, rows_per_cube)`);
//! lane `l` walks the row's 32-element chunks `l, l + lanes, ...`, decodes each into registers
//! with the type's [`BlockDecode`] and accumulates one f32 partial per activation row. Partials
//! are reduced with a plane (subgroup) sum when `plane` is set (then `lanes` must be the device's
//! plane width) or through workgroup shared memory otherwise. With `lanes == 1` each unit owns a
//! row and no reduction is needed: on CPU-emulated devices (lavapipe) neighbouring units then read
//! the same activations, which become uniform loads instead of gathers.
use crate::formats::{BlockDecode, CHUNK_ELEMS};
use cubecl::prelude::*;

/// The GEMV kernel. `x` is `[m, cols]` row-major f32, `y` is `[m, rows]`, `w` holds `rows`
/// rows of `cols / BLOCK_ELEMS` blocks each, plus one padding word; `grid` is the type's codebook.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn gemv<F: BlockDecode>(
    w: &[u32],
    grid: &[u32],
    x: &[f32],
    y: &mut [f32],
    rows: u32,
    cols: u32,
    #[comptime] m: u32,
    #[comptime] lanes: u32,
    #[comptime] rows_per_cube: u32,
    #[comptime] plane: bool,
) {
    let lane = UNIT_POS_X;
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let row = cube * rows_per_cube + UNIT_POS_Y;
    let block_elems = comptime!(F::BLOCK_ELEMS);
    let block_bytes = comptime!(F::BLOCK_BYTES);
    let chunks = comptime!(F::CHUNKS);
    let blocks = cols / block_elems;
    // Units past the last row do no work but still take part in the reduction below.
    let n_chunks = select(row < rows, blocks * chunks, 0u32);
    let row_byte = row * blocks * block_bytes;

    let mut acc = Array::<f32>::new(comptime!(m as usize));
    #[unroll]
    for r in 0..m {
        acc[r as usize] = 0.0;
    }
    let mut vals = Array::<f32>::new(comptime!(CHUNK_ELEMS as usize));
    let mut c = lane;
    while c < n_chunks {
        let b = c / chunks;
        let k = c % chunks;
        F::decode_chunk(w, grid, row_byte + b * block_bytes, k, &mut vals);
        let xb = b * block_elems + k * comptime!(CHUNK_ELEMS);
        #[unroll]
        for r in 0..m {
            let xo = r * cols + xb;
            let mut s = 0.0f32;
            #[unroll]
            for j in 0..comptime!(CHUNK_ELEMS) {
                s += vals[j as usize] * x[(xo + j) as usize];
            }
            acc[r as usize] += s;
        }
        c += lanes;
    }

    if comptime!(lanes == 1) {
        // One unit per row: the partial is the row's sum.
        if row < rows {
            #[unroll]
            for r in 0..m {
                y[(r * rows + row) as usize] = acc[r as usize];
            }
        }
    } else if comptime!(plane) {
        #[unroll]
        for r in 0..m {
            let total = plane_sum(acc[r as usize]);
            if lane == 0 && row < rows {
                y[(r * rows + row) as usize] = total;
            }
        }
    } else {
        // One barrier: every lane stores its m partials, then lane 0 of each row adds them up
        // (fewer barriers than a tree reduction, which matters on lavapipe where a barrier
        // splits the shader).
        let mut smem = Shared::<[f32]>::new_slice(comptime!((m * lanes * rows_per_cube) as usize));
        let base = UNIT_POS_Y * lanes;
        let stride = comptime!(lanes * rows_per_cube);
        #[unroll]
        for r in 0..m {
            smem[(r * stride + base + lane) as usize] = acc[r as usize];
        }
        sync_cube();
        if lane == 0 && row < rows {
            #[unroll]
            for r in 0..m {
                let mut total = 0.0f32;
                #[unroll]
                for l in 0..lanes {
                    total += smem[(r * stride + base + l) as usize];
                }
                y[(r * rows + row) as usize] = total;
            }
        }
    }
}

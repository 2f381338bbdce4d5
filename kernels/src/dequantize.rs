//! Dequantize rows by id: `out[t, :] = decode(W[ids[t] - row_start, :])`.
//!
//! One op serves the embedding lookup (ids are token ids; the table is never dequantized as a
//! whole) and chunked prefill (ids are a range of weight rows dequantized into a bounded scratch
//! buffer for a dense matmul). A tensor split into parts by rows (buffer size limits) runs once
//! per part: ids outside `[row_start, row_start + part_rows)` produce zero rows, so the parts'
//! outputs add up to the whole lookup.
use crate::formats::{BlockDecode, CHUNK_ELEMS, decode_values};
use cubecl::prelude::*;

/// One unit per 32-element chunk of each output row; `out` is `[ids.len(), cols]` f32.
#[cube(launch_unchecked, create_dummy_kernel)]
pub(crate) fn dequantize_rows<F: BlockDecode>(
    w: &[u32],
    grid: &[u32],
    ids: &[u32],
    out: &mut [f32],
    row_start: u32,
    part_rows: u32,
    cols: u32,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let pos = cube * CUBE_DIM_X + UNIT_POS_X;
    let block_elems = comptime!(F::BLOCK_ELEMS);
    let block_bytes = comptime!(F::BLOCK_BYTES);
    let chunks = comptime!(F::CHUNKS);
    let blocks = cols / block_elems;
    let chunks_per_row = blocks * chunks;
    let t = pos / chunks_per_row;
    let c = pos % chunks_per_row;
    if t < ids.len() as u32 {
        let id = ids[t as usize];
        let o = t * cols + c * comptime!(CHUNK_ELEMS);
        let mut vals = Array::<f32>::new(comptime!(F::FORM.out_len() as usize));
        if id >= row_start && id - row_start < part_rows {
            let b = c / chunks;
            let block = (id - row_start) * blocks * block_bytes + b * block_bytes;
            decode_values::<F>(w, grid, block, c % chunks, &mut vals);
        } else {
            #[unroll]
            for j in 0..comptime!(CHUNK_ELEMS) {
                vals[j as usize] = 0.0;
            }
        }
        #[unroll]
        for j in 0..comptime!(CHUNK_ELEMS) {
            out[(o + j) as usize] = vals[j as usize];
        }
    }
}

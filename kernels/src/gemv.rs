//! Fused dequantize + GEMV: `y[r, n] = sum_k x[r, k] * W[n, k]` for 1..=8 activation rows,
//! weights read once straight from their ggml blocks.
//!
//! The row count `m` is a runtime argument; the unrolled code holds a compile-time `m_pass`
//! rows ([`crate::GemvConfig::pass_rows`]), so a handful of shaders per type serve every `m`:
//! rows past `m` in a pass repeat row `m - 1` (in bounds) and are not stored.
//!
//! Two ways of mapping units to rows, one kernel each, both generic over the one block decoder
//! of each type ([`crate::GemvConfig`] picks one per device):
//!
//! - **split** (`gemv()`, the GPU layout of llama.cpp's `mul_mat_vec`): `lanes` units of
//!   one cube share an output row (CubeDim `(lanes, rows_per_cube)`); lane `l` walks the row's
//!   32-element chunks `l, l + lanes, ...`, so neighbouring lanes read neighbouring bytes, decodes
//!   each with the type's [`BlockDecode`] (`decode_for_dot()`: a [`ChunkForm::Scaled`] chunk
//!   stays factored and `chunk_dot()` applies its two scales once per 16 products) and
//!   accumulates one f32 partial per activation row.
//!   Partials are reduced with a plane (subgroup) sum when `plane` is set (then `lanes` is the
//!   device's plane width) or through workgroup shared memory otherwise.
//! - **own rows** (`gemv_rows()`, the layout of CPU-emulated devices such as lavapipe, where
//!   every load whose address differs between lanes is a scalar loop over the SIMD lanes, so a
//!   4-word vector load costs little more than a word, and arithmetic is cheap): each unit owns
//!   `own_rows` whole rows and walks them a few blocks
//!   ([`crate::formats::BlockFormat::STAGE_BLOCKS`]) at a time. The blocks are staged once into
//!   registers with 4-word vector loads (`stage_vec4()`), where the decoders' unaligned reads
//!   would load two words per field, then decoded chunk by chunk from there (a factored chunk,
//!   [`crate::formats::ChunkForm`], costs one multiply-add per weight, its scales applied once
//!   per 16 products); each activation is loaded once (as 4-float vectors) for all the unit's
//!   rows. With `plane` the cube is one plane
//!   of `lanes` units: lane `l` loads activation vectors `l, l + lanes, ...` of a step and the
//!   plane shares them with `plane_broadcast`, so the plane loads each activation once for
//!   `lanes * own_rows` rows. Codebooks of up to [`LOCAL_GRID_MAX_WORDS`] words are compiled
//!   in: written as constants to invocation-local memory, where a lookup is a gather rather
//!   than a loop.
use crate::formats::{
    BlockDecode, CHUNK_ELEMS, ChunkForm, FACTOR_BIASES, FACTOR_OFFSETS, FACTOR_SCALES,
    decode_values,
};
use crate::glu::{GLU_GELU, GLU_NONE, glu_act};
use cubecl::prelude::*;

/// Reads `buffer` in a branch no launch takes (`never`: the launch functions return before
/// launching a GEMV of no rows), so that the shader uses the binding. A pipeline built from
/// cached WGSL ([`crate::wgsl_cache`]) takes its bind-group layout from the bindings its shader
/// uses, and the codebook buffer is bound for every type but read only by those with one.
#[cube]
pub(crate) fn keep_binding(buffer: &[u32], out: &mut [f32], never: bool) {
    if never {
        out[0] = f32::cast_from(buffer[0]);
    }
}

/// Decodes chunk `chunk` of the block at byte `block` for [`chunk_dot()`]: a
/// [`ChunkForm::Scaled`] chunk stays factored (values and two half-chunk scales), every other
/// form is multiplied out ([`decode_values()`]).
#[cube]
pub(crate) fn decode_for_dot<F: BlockDecode>(
    w: &[u32],
    grid: &[u32],
    block: u32,
    chunk: u32,
    out: &mut Array<f32>,
) {
    if comptime!(matches!(F::FORM, ChunkForm::Scaled)) {
        F::decode_chunk(w, grid, block, chunk, out);
    } else {
        decode_values::<F>(w, grid, block, chunk, out);
    }
}

/// `sum_e weight_e * x[xo + e]` over a chunk decoded by [`decode_for_dot()`], summed in order: a
/// [`ChunkForm::Scaled`] chunk's halves each multiplied by their scale once (a multiply fewer
/// per weight, llama.cpp `mul_mat_vec`'s `d * sum(q * x)`; within
/// [`crate::check::GEMV_TOL`] of the multiplied-out sum).
#[cube]
pub(crate) fn chunk_dot<F: BlockDecode>(vals: &Array<f32>, x: &[f32], xo: u32) -> f32 {
    let mut total = 0.0f32;
    if comptime!(matches!(F::FORM, ChunkForm::Scaled)) {
        #[unroll]
        for h in 0..2u32 {
            let mut s = 0.0f32;
            #[unroll]
            for j in 0..16u32 {
                s += vals[(16 * h + j) as usize] * x[(xo + 16 * h + j) as usize];
            }
            total = fma(vals[comptime!(FACTOR_SCALES + h) as usize], s, total);
        }
    } else {
        #[unroll]
        for j in 0..comptime!(CHUNK_ELEMS) {
            total += vals[j as usize] * x[(xo + j) as usize];
        }
    }
    total
}

/// The GEMV kernel. `x` is `[m, cols]` row-major f32, `y` is `[m, rows]`, `w` holds `rows`
/// rows of `cols / BLOCK_ELEMS` blocks each, plus padding ([`crate::words_len`]); `grid` is the
/// type's codebook. The split layout (see the module docs), one pass of `m_pass >= m` rows.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv<F: BlockDecode>(
    w: &[u32],
    grid: &[u32],
    x: &[f32],
    y: &mut [f32],
    rows: u32,
    cols: u32,
    m: u32,
    #[comptime] m_pass: u32,
    #[comptime] lanes: u32,
    #[comptime] rows_per_cube: u32,
    #[comptime] plane: bool,
) {
    if comptime!(!F::GRID.has_table()) {
        keep_binding(grid, y, rows == 0);
    }
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

    let mut acc = Array::<f32>::new(comptime!(m_pass as usize));
    #[unroll]
    for r in 0..m_pass {
        acc[r as usize] = 0.0;
    }
    let mut vals = Array::<f32>::new(comptime!(F::FORM.out_len() as usize));
    let mut c = lane;
    while c < n_chunks {
        let b = c / chunks;
        let k = c % chunks;
        decode_for_dot::<F>(w, grid, row_byte + b * block_bytes, k, &mut vals);
        let xb = b * block_elems + k * comptime!(CHUNK_ELEMS);
        #[unroll]
        for r in 0..m_pass {
            // Rows past `m` (padding up to `m_pass`) repeat the last row and are not stored.
            let xo = select(r < m, r, m - 1) * cols + xb;
            acc[r as usize] += chunk_dot::<F>(&vals, x, xo);
        }
        c += lanes;
    }

    if comptime!(lanes == 1) {
        // One unit per row: the partial is the row's sum.
        if row < rows {
            #[unroll]
            for r in 0..m_pass {
                if r < m {
                    y[(r * rows + row) as usize] = acc[r as usize];
                }
            }
        }
    } else if comptime!(plane) {
        #[unroll]
        for r in 0..m_pass {
            let total = plane_sum(acc[r as usize]);
            if lane == 0 && row < rows && r < m {
                y[(r * rows + row) as usize] = total;
            }
        }
    } else {
        // One barrier: every lane stores its partials, then lane 0 of each row adds them up
        // (fewer barriers than a tree reduction, which matters on lavapipe where a barrier
        // splits the shader).
        let mut smem =
            Shared::<[f32]>::new_slice(comptime!((m_pass * lanes * rows_per_cube) as usize));
        let base = UNIT_POS_Y * lanes;
        let stride = comptime!(lanes * rows_per_cube);
        #[unroll]
        for r in 0..m_pass {
            smem[(r * stride + base + lane) as usize] = acc[r as usize];
        }
        sync_cube();
        if lane == 0 && row < rows {
            #[unroll]
            for r in 0..m_pass {
                if r < m {
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
}

/// [`gemv()`] with a gated-activation epilogue (`glu`: [`crate::glu::GLU_GELU`] or
/// [`crate::glu::GLU_SILU`]; [`GLU_NONE`] gives [`gemv()`]'s values): `w` is a stacked gate/up
/// projection of `rows = 2 * half` rows and `y` is `[m, half]`; each of the cube's row slots
/// sums the gate row `n` and the up row `n + half` and stores `act(gate) * up`. A kernel of
/// its own so that [`gemv()`]'s shaders stay as they were (the driver's shader caches keep
/// them).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_glu<F: BlockDecode>(
    w: &[u32],
    grid: &[u32],
    x: &[f32],
    y: &mut [f32],
    rows: u32,
    cols: u32,
    m: u32,
    #[comptime] m_pass: u32,
    #[comptime] lanes: u32,
    #[comptime] rows_per_cube: u32,
    #[comptime] plane: bool,
    #[comptime] glu: u32,
) {
    if comptime!(!F::GRID.has_table()) {
        keep_binding(grid, y, rows == 0);
    }
    let lane = UNIT_POS_X;
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let row = cube * rows_per_cube + UNIT_POS_Y;
    let block_elems = comptime!(F::BLOCK_ELEMS);
    let block_bytes = comptime!(F::BLOCK_BYTES);
    let chunks = comptime!(F::CHUNKS);
    // Weight rows summed per output row (gate and up with an epilogue) and output rows.
    let parts = comptime!(if glu == GLU_NONE { 1u32 } else { 2u32 });
    let out_rows = rows / parts;
    let blocks = cols / block_elems;
    // Units past the last row do no work but still take part in the reduction below.
    let n_chunks = select(row < out_rows, blocks * chunks, 0u32);
    let row_bytes = blocks * block_bytes;

    let mut acc = Array::<f32>::new(comptime!((parts * m_pass) as usize));
    #[unroll]
    for i in 0..comptime!(parts * m_pass) {
        acc[i as usize] = 0.0;
    }
    let mut vals = Array::<f32>::new(comptime!(F::FORM.out_len() as usize));
    let mut c = lane;
    while c < n_chunks {
        let b = c / chunks;
        let k = c % chunks;
        let xb = b * block_elems + k * comptime!(CHUNK_ELEMS);
        #[unroll]
        for h in 0..parts {
            let start = (row + h * out_rows) * row_bytes + b * block_bytes;
            decode_for_dot::<F>(w, grid, start, k, &mut vals);
            #[unroll]
            for r in 0..m_pass {
                // Rows past `m` (padding up to `m_pass`) repeat the last row and are not stored.
                let xo = select(r < m, r, m - 1) * cols + xb;
                acc[(h * m_pass + r) as usize] += chunk_dot::<F>(&vals, x, xo);
            }
        }
        c += lanes;
    }

    if comptime!(lanes == 1) {
        // One unit per row: the partials are the row's sums.
        if row < out_rows {
            store_rows(y, &acc, row, out_rows, m, m_pass, glu);
        }
    } else if comptime!(plane) {
        let mut total = Array::<f32>::new(comptime!((parts * m_pass) as usize));
        #[unroll]
        for i in 0..comptime!(parts * m_pass) {
            total[i as usize] = plane_sum(acc[i as usize]);
        }
        if lane == 0 && row < out_rows {
            store_rows(y, &total, row, out_rows, m, m_pass, glu);
        }
    } else {
        // One barrier: every lane stores its partials, then lane 0 of each row adds them up
        // (fewer barriers than a tree reduction, which matters on lavapipe where a barrier
        // splits the shader).
        let values = comptime!(parts * m_pass);
        let mut smem =
            Shared::<[f32]>::new_slice(comptime!((values * lanes * rows_per_cube) as usize));
        let base = UNIT_POS_Y * lanes;
        let stride = comptime!(lanes * rows_per_cube);
        #[unroll]
        for i in 0..values {
            smem[(i * stride + base + lane) as usize] = acc[i as usize];
        }
        sync_cube();
        if lane == 0 && row < out_rows {
            let mut total = Array::<f32>::new(comptime!(values as usize));
            #[unroll]
            for i in 0..values {
                let mut t = 0.0f32;
                #[unroll]
                for l in 0..lanes {
                    t += smem[(i * stride + base + l) as usize];
                }
                total[i as usize] = t;
            }
            store_rows(y, &total, row, out_rows, m, m_pass, glu);
        }
    }
}

/// Stores output row `row` of `y` (`[m, out_rows]`) from its sums `total` (`[parts, m_pass]`:
/// the row's own, or the gate's then the up's with a `glu` epilogue), activation rows below
/// `m` only.
#[cube]
fn store_rows(
    y: &mut [f32],
    total: &Array<f32>,
    row: u32,
    out_rows: u32,
    m: u32,
    #[comptime] m_pass: u32,
    #[comptime] glu: u32,
) {
    #[unroll]
    for r in 0..m_pass {
        if r < m {
            let v = if comptime!(glu == GLU_NONE) {
                total[r as usize]
            } else {
                glu_act(total[r as usize], comptime!(glu == GLU_GELU))
                    * total[(m_pass + r) as usize]
            };
            y[(r * out_rows + row) as usize] = v;
        }
    }
}

/// Four words or four floats: one load instruction.
pub type Vec4<T> = Vector<T, Const<4>>;

/// The GEMV kernel in the own-rows layout. `w` is the word stream as 4-word vectors (its length
/// padded to whole vectors, [`crate::words_len`]), `grid` the type's codebook buffer
/// ([`crate::grid_words`]), bound as for the split kernel but not read (the codebook is
/// compiled in, [`LOCAL_GRID_MAX_WORDS`]; see [`keep_binding()`]), `x` is `[m, cols]` f32 as
/// 4-float vectors, `y` is `[m, rows]`. Unit `l` of cube `c` owns rows
/// `c * lanes * own_rows + j * lanes + l` for `j < own_rows` (CubeDim `(lanes, 1)`); with
/// `plane`, `lanes` is the device's plane width.
/// Activation rows go in `ceil(m / m_pass)` passes.
///
/// With a `glu` epilogue (as [`gemv_glu()`]'s: `w` a stacked gate/up projection of `rows = 2 * half`
/// rows, `y` `[m, half]`) unit `l` of cube `c` owns output rows
/// `n = c * lanes * own_rows / 2 + j * lanes + l` for `j < own_rows / 2`, and sums weight rows
/// `n` and `n + half` for each.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_rows<F: BlockDecode>(
    w: &[Vec4<u32>],
    grid: &[u32],
    x: &[Vec4<f32>],
    y: &mut [f32],
    rows: u32,
    cols: u32,
    m: u32,
    #[comptime] m_pass: u32,
    #[comptime] lanes: u32,
    #[comptime] plane: bool,
    #[comptime] own_rows: u32,
    #[comptime] glu: u32,
) {
    keep_binding(grid, y, rows == 0);
    let lane = UNIT_POS_X;
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let parts = comptime!(if glu == GLU_NONE { 1u32 } else { 2u32 });
    let first = cube * comptime!(lanes * own_rows / parts) + lane;
    let grid_words = comptime!(F::GRID.len_words() as u32);
    comptime!(assert!(
        grid_words <= LOCAL_GRID_MAX_WORDS,
        "the own-rows GEMV compiles in codebooks of at most LOCAL_GRID_MAX_WORDS words"
    ));
    // The codebook written into invocation-local memory as compile-time constants (see
    // LOCAL_GRID_MAX_WORDS). Types without one write nothing (their decoders do not read it).
    let mut local = Array::<u32>::new(comptime!(grid_words as usize));
    if comptime!(F::GRID.has_table()) {
        let table = comptime!(F::GRID.words());
        #[unroll]
        for i in 0..grid_words {
            local[i as usize] = comptime!(table[i as usize]);
        }
    }
    rows_passes::<F>(
        w,
        local.as_slice(),
        x,
        y,
        rows,
        cols,
        m,
        first,
        m_pass,
        lanes,
        plane,
        own_rows,
        glu,
    );
}

/// Largest codebook (in words) that `gemv_rows()` compiles in, as every codebook is: the IQ2
/// and IQ1 grids as 2-bit codes and the IQ3 grids (128-1024 words). The kernel writes the
/// table's words ([`crate::formats::Grid::words`]) as constants to an invocation-local array
/// before its loop, and its decoders look up that array. On lavapipe:
/// - a storage-buffer load whose index differs between lanes, or is not a compile-time
///   constant, is a loop over the SIMD lanes with a bounds-check branch in each step, where an
///   indexed local array is a plain gather (IQ2_XXS, m = 1, 4096x4096: 13.8 ms reading the
///   buffer, 9.7 ms with its table local, `cargo xtask bench --quick`, 2026-12-01);
/// - copying the table from the buffer in a loop made every workgroup pay such a load per
///   vector and a masked scatter per word. Written as constants, the table costs a plain
///   vector store per word (IQ1_S, 1024 words, m = 1, 4096x4096: 4.4-4.9 ms in three runs,
///   with the half-word staging of [`stage_vectors`] in the same change, against 5.2-6.0 ms
///   copying 4-word vectors in a loop; runs alternating, 2026-12-02).
///
/// The cost is compile time, which grows faster than the table: `cargo xtask kernel-test --type
/// IQ1_S --op gemv` took 4 min 11 s with the table compiled in (all but two of its shaders new
/// to Mesa's cache), about what the loop took with the cache disabled (4 min 13 s); loading the
/// table in an unrolled copy took 9 min 11 s. On a GPU the split kernel runs, which reads the
/// buffer (cached loads).
pub const LOCAL_GRID_MAX_WORDS: u32 = 1024;

/// Activation rows one pass of `gemv_rows()` takes for `m >= 2` (`m = 2, 3` pad a pass); more
/// take further passes, each reading and decoding the weights again. 4 rather than 2: the grid
/// types' decode costs far more than a row's multiply-adds, and at m = 8 on 4096x4096 IQ2_XXS
/// took 16.4-26.1 ms in passes of 4 against 38.6 ms in passes of 2 (`cargo xtask bench --quick
/// --type IQ2_XXS --type IQ1_S --no-e2e`, 2026-12-01); the key types showed no clear
/// difference either way in earlier runs.
pub const OWN_ROWS_M: u32 = 4;

/// `y[0..m]` for the unit's rows (output rows `first + j * lanes`; each sums `parts` weight
/// rows, see [`unit_row`]), the activation rows in passes of `m_pass` (the unrolled code and
/// the registers it holds grow with it); each pass reads the weights once.
#[cube]
#[allow(clippy::too_many_arguments)]
fn rows_passes<F: BlockDecode>(
    w: &[Vec4<u32>],
    grid: &[u32],
    x: &[Vec4<f32>],
    y: &mut [f32],
    rows: u32,
    cols: u32,
    m: u32,
    first: u32,
    #[comptime] m_pass: u32,
    #[comptime] lanes: u32,
    #[comptime] plane: bool,
    #[comptime] own_rows: u32,
    #[comptime] glu: u32,
) {
    let parts = comptime!(if glu == GLU_NONE { 1u32 } else { 2u32 });
    let out_rows = rows / parts;
    let blocks = cols / comptime!(F::BLOCK_ELEMS);
    let row_bytes = blocks * comptime!(F::BLOCK_BYTES);
    // Whole groups of STAGE_BLOCKS blocks, then (when the row has a remainder) single blocks.
    let group = comptime!(F::STAGE_BLOCKS);
    let grouped = blocks / group * group;
    let mut r0 = 0u32;
    while r0 < m {
        let mut acc = Array::<f32>::new(comptime!((m_pass * own_rows) as usize));
        #[unroll]
        for i in 0..comptime!(m_pass * own_rows) {
            acc[i as usize] = 0.0;
        }
        rows_blocks::<F>(
            w, grid, x, &mut acc, rows, cols, m, row_bytes, first, r0, 0, grouped, m_pass, lanes,
            plane, own_rows, group, parts,
        );
        if comptime!(group > 1) {
            rows_blocks::<F>(
                w, grid, x, &mut acc, rows, cols, m, row_bytes, first, r0, grouped, blocks, m_pass,
                lanes, plane, own_rows, 1u32, parts,
            );
        }
        let slots = comptime!(own_rows / parts);
        #[unroll]
        for j in 0..slots {
            let row = first + j * lanes;
            if row < out_rows {
                #[unroll]
                for r in 0..m_pass {
                    if r0 + r < m {
                        let v = acc[(j * m_pass + r) as usize];
                        let v = if comptime!(glu == GLU_NONE) {
                            v
                        } else {
                            let up = acc[((j + slots) * m_pass + r) as usize];
                            glu_act(v, comptime!(glu == GLU_GELU)) * up
                        };
                        y[((r0 + r) * out_rows + row) as usize] = v;
                    }
                }
            }
        }
        r0 += m_pass;
    }
}

/// Accumulates blocks `start..end` (a multiple of `group` apart) of the unit's rows, for
/// activation rows `r0..r0 + m_pass`, into `acc` (`[own_rows, m_pass]`), `group` blocks per
/// step; rows at or past `m` repeat row `m - 1` (in bounds; the caller does not store them).
///
/// The step is unrolled (lavapipe does not unroll runtime loops, and indexing the register
/// arrays with a loop counter halved Gemma 3's decode), but each activation row's loads and
/// each chunk sit in their own `if b < end` block, a condition the enclosing loop already
/// holds (the driver folds it): a scope for CubeCL's common-subexpression pass, which looks
/// every expression up in a list of those of its enclosing scopes, so its cost grows with the
/// square of a scope's size. CubeCL took 5.5-7.1 s to build Q4_K's 4-row shader without them
/// and 1.7-2.0 s with them, in every fresh process (`cargo xtask kernel-gen`; docs/decode.md).
#[cube]
#[allow(clippy::too_many_arguments)]
fn rows_blocks<F: BlockDecode>(
    w: &[Vec4<u32>],
    grid: &[u32],
    x: &[Vec4<f32>],
    acc: &mut Array<f32>,
    rows: u32,
    cols: u32,
    m: u32,
    row_bytes: u32,
    first: u32,
    r0: u32,
    start: u32,
    end: u32,
    #[comptime] m_pass: u32,
    #[comptime] lanes: u32,
    #[comptime] plane: bool,
    #[comptime] own_rows: u32,
    #[comptime] group: u32,
    #[comptime] parts: u32,
) {
    let lane = UNIT_POS_X;
    let block_elems = comptime!(F::BLOCK_ELEMS);
    let block_bytes = comptime!(F::BLOCK_BYTES);
    let step_elems = comptime!(group * F::BLOCK_ELEMS);
    // Activation vectors each unit loads per step and activation row: its share when the plane
    // shares them, all of them otherwise.
    let share = comptime!(if plane { lanes } else { 1 });
    let held = comptime!(step_elems / 4 / share);
    let words = comptime!((group * F::BLOCK_BYTES).div_ceil(4));
    let align = comptime!(stage_alignment(F::BLOCK_BYTES));
    let mut xs = Array::<f32>::new(comptime!((m_pass * step_elems) as usize));
    let mut staged = Array::<u32>::new(comptime!((words + 1) as usize));
    staged[words as usize] = 0;
    let mut vals = Array::<f32>::new(comptime!(F::FORM.out_len() as usize));
    // For chunks with offsets or biases, the sums of each `sum_elems` activations of the step
    // (8 or 16, [`ChunkForm::sum_elems`]), `xsum[r * groups + g]`.
    let sum_elems = comptime!(F::FORM.sum_elems());
    // A divisor for the sums' index, 1 for forms without sums (which do not read them).
    let sum_div = comptime!(if sum_elems > 0 { sum_elems } else { 1 });
    let groups = comptime!(F::FORM.sum_groups(step_elems));
    let xsum_len = comptime!(if groups > 0 { m_pass * groups } else { 1 });
    let mut xsum = Array::<f32>::new(comptime!(xsum_len as usize));
    // The unit's offset among the plane's activation loads (none when it loads them all).
    let lane_off = lane * comptime!(if plane { 1u32 } else { 0u32 });
    let mut b = start;
    while b < end {
        // The step's activations, `xs[r * step_elems + e]`: each unit loads its share of
        // vectors, and with `plane` the plane's lanes exchange them (vector `v` of the step is
        // loaded by lane `v % share`), once for all of the unit's rows.
        let xv = (b * block_elems) / 4;
        #[unroll]
        for r in 0..m_pass {
            // Always true: a scope for CubeCL's CSE (see above).
            if b < end {
                let xr = select(r0 + r < m, r0 + r, m - 1);
                let xo = r * step_elems;
                #[unroll]
                for i in 0..held {
                    let v = x[(xr * (cols / 4) + xv + lane_off + i * share) as usize];
                    #[unroll]
                    for c in 0..4u32 {
                        xs[(xo + 4 * i * share + c) as usize] = v.extract(c as usize);
                    }
                }
                if comptime!(plane) {
                    // Lane `l`'s vectors land at `4 * (i * share + l)`; fill in the other
                    // lanes' slots from their owners, in place (each slot is read before it
                    // is written).
                    #[unroll]
                    for i in 0..held {
                        #[unroll]
                        for c in 0..4u32 {
                            let own = xs[(xo + 4 * i * share + c) as usize];
                            #[unroll]
                            for l in 0..share {
                                let e = xo + 4 * (i * share + l) + c;
                                xs[e as usize] = plane_broadcast(own, l);
                            }
                        }
                    }
                }
                if comptime!(groups > 0) {
                    #[unroll]
                    for g in 0..groups {
                        xsum[(r * groups + g) as usize] =
                            sum_pairs(&xs, xo + sum_elems * g, sum_elems);
                    }
                }
            }
        }
        // A runtime loop over the unit's rows (one copy of the step's code, so compile time
        // does not grow with `own_rows`), each row summed in registers and added to its
        // accumulators once per step.
        for j in 0..own_rows {
            let row = unit_row(first, j, rows, lanes, own_rows, parts);
            stage_vec4(
                w,
                row * row_bytes + b * block_bytes,
                &mut staged,
                comptime!(group * F::BLOCK_BYTES),
                align,
            );
            let mut sums = Array::<f32>::new(comptime!(m_pass as usize));
            #[unroll]
            for r in 0..m_pass {
                sums[r as usize] = 0.0;
            }
            #[unroll]
            for g in 0..group {
                #[unroll]
                for k in 0..comptime!(F::CHUNKS) {
                    // Always true: a scope for CubeCL's CSE (see above).
                    if b < end {
                        F::decode_chunk(staged.as_slice(), grid, g * block_bytes, k, &mut vals);
                        let e0 = g * block_elems + k * comptime!(CHUNK_ELEMS);
                        #[unroll]
                        for r in 0..m_pass {
                            let x0 = r * step_elems + e0;
                            if comptime!(F::FORM.factored()) {
                                let s0 = r * groups + e0 / sum_div;
                                let f = comptime!(F::FORM);
                                sums[r as usize] += factored_chunk(&vals, &xs, &xsum, x0, s0, f);
                            } else {
                                sums[r as usize] += dot_chains(&vals, &xs, 0u32, x0, CHUNK_ELEMS);
                            }
                        }
                    }
                }
            }
            #[unroll]
            for r in 0..m_pass {
                acc[(j * m_pass + r) as usize] += sums[r as usize];
            }
        }
        b += group;
    }
}

/// The weight row of the unit's row slot `j < own_rows` in the own-rows layout: output row
/// `first + (j % slots) * lanes` with `slots = own_rows / parts`, and of a stacked gate/up
/// projection (`parts` 2) its gate row for `j < slots`, its up row (`rows / 2` further) for the
/// rest. Rows past the last compute on the last row (in bounds) and are not stored.
#[cube]
fn unit_row(
    first: u32,
    j: u32,
    rows: u32,
    #[comptime] lanes: u32,
    #[comptime] own_rows: u32,
    #[comptime] parts: u32,
) -> u32 {
    let slots = comptime!(own_rows / parts);
    let row = first + (j % slots) * lanes + (j / slots) * (rows / parts);
    select(row < rows, row, rows - 1)
}

/// A factored chunk ([`crate::formats::ChunkForm`]) against the activations at `xs[x0..]`:
/// per half-chunk `h`, `scale_h * (sum_e q_e x_e + sum_g offset_g xsum_g)` with offsets
/// (`ScaledOffsets`; none for `Scaled`), `scale_h * sum_e q_e x_e + bias_h * xsum_h` with
/// biases (`ScaledBiases`), so each weight costs one fused multiply-add ([`dot_chains`] per
/// half). `xsum[s0..]` holds the sums of [`ChunkForm::sum_elems`] activations of the chunk.
#[cube]
fn factored_chunk(
    vals: &Array<f32>,
    xs: &Array<f32>,
    xsum: &Array<f32>,
    x0: u32,
    s0: u32,
    #[comptime] form: ChunkForm,
) -> f32 {
    let mut sum = 0.0f32;
    #[unroll]
    for h in 0..2u32 {
        let mut t = dot_chains(vals, xs, comptime!(16 * h), x0 + 16 * h, 16u32);
        if comptime!(form.offsets()) {
            #[unroll]
            for g in 0..2u32 {
                let gi = comptime!(2 * h + g);
                t = fma(
                    vals[comptime!(FACTOR_OFFSETS + gi) as usize],
                    xsum[(s0 + gi) as usize],
                    t,
                );
            }
        }
        let scale = vals[comptime!(FACTOR_SCALES + h) as usize];
        sum = fma(scale, t, sum);
        if comptime!(form.biases()) {
            let bias = vals[comptime!(FACTOR_BIASES + h) as usize];
            sum = fma(bias, xsum[(s0 + h) as usize], sum);
        }
    }
    sum
}

/// `sum_i xs[e + i]` for `i < n` (a power of two: 8 or 16), added as a tree of pairs, not a
/// chain.
#[cube]
fn sum_pairs(xs: &Array<f32>, e: u32, #[comptime] n: u32) -> f32 {
    let mut part = Array::<f32>::new(comptime!(n as usize));
    #[unroll]
    for i in 0..n {
        part[i as usize] = xs[(e + i) as usize];
    }
    #[unroll]
    for level in 0..comptime!(n.trailing_zeros()) {
        let width = comptime!(n >> (level + 1));
        #[unroll]
        for i in 0..width {
            part[i as usize] = part[i as usize] + part[(i + width) as usize];
        }
    }
    part[0]
}

/// `sum_i vals[v0 + i] * xs[x0 + i]` for `i < n` (a multiple of 4), in four independent chains
/// of fused multiply-adds: the chains do not wait on each other's latency (the split kernel sums
/// in order; both are within GEMV_TOL).
#[cube]
fn dot_chains(
    vals: &Array<f32>,
    xs: &Array<f32>,
    #[comptime] v0: u32,
    x0: u32,
    #[comptime] n: u32,
) -> f32 {
    let mut s = Array::<f32>::new(4usize);
    #[unroll]
    for q in 0..4u32 {
        s[q as usize] = 0.0;
    }
    #[unroll]
    for i in 0..n {
        let q = (i % 4) as usize;
        s[q] = fma(vals[(v0 + i) as usize], xs[(x0 + i) as usize], s[q]);
    }
    (s[0] + s[1]) + (s[2] + s[3])
}

/// What is known at compile time of where a staged run starts for blocks of `block_bytes`
/// bytes (every start is a multiple of `block_bytes`, since rows are whole blocks and each
/// buffer starts on a row): 16 (on a vector), 4 (on a word), 2 (on a half-word: every ggml
/// block but MXFP4's has an even size) or 1 (anywhere).
pub const fn stage_alignment(block_bytes: u32) -> u32 {
    let bytes = block_bytes;
    if bytes.is_multiple_of(16) {
        16
    } else if bytes.is_multiple_of(4) {
        4
    } else if bytes.is_multiple_of(2) {
        2
    } else {
        1
    }
}

/// Vectors `stage_vec4()` loads for a run of `bytes` bytes that starts on a multiple of
/// `align` (1, 2, 4 or 16): enough to cover the run from the latest such start in a vector,
/// `16 - align` bytes in. (IQ1_S, 50 bytes on half-words: 4 vectors, where counting whole
/// words after a start anywhere took 5.)
pub const fn stage_vectors(bytes: u32, align: u32) -> u32 {
    (16 - align + bytes).div_ceil(16)
}

/// Copies the `bytes` bytes from byte `start` of the vector stream `w` into
/// `out[0..bytes.div_ceil(4)]` as words, with [`stage_vectors`] vector loads (one instruction
/// each) and register shuffles: `align` says what is known of `start` at compile time. Bytes
/// of the last word past the run may read as zero rather than as the stream's next bytes. The
/// stream's padding ([`crate::words_len`]) keeps every load in bounds for the last block of a
/// buffer.
#[cube]
pub(crate) fn stage_vec4(
    w: &[Vec4<u32>],
    start: u32,
    out: &mut Array<u32>,
    #[comptime] bytes: u32,
    #[comptime] align: u32,
) {
    let v0 = start / 16;
    let words = comptime!(bytes.div_ceil(4));
    let nv = comptime!(stage_vectors(bytes, align));
    // The loaded words, then zeros up to the last word `pick4` reads (`words + 3`).
    let len = comptime!(4 * nv);
    let flat_len = comptime!(if len > words + 4 { len } else { words + 4 });
    let mut flat = Array::<u32>::new(comptime!(flat_len as usize));
    #[unroll]
    for t in 0..nv {
        let v = w[(v0 + t) as usize];
        #[unroll]
        for c in 0..4u32 {
            flat[(4 * t + c) as usize] = v.extract(c as usize);
        }
    }
    #[unroll]
    for i in len..flat_len {
        flat[i as usize] = 0;
    }
    if comptime!(align == 16) {
        #[unroll]
        for i in 0..words {
            out[i as usize] = flat[i as usize];
        }
    } else {
        // Word `q + i` of the loaded vectors is word `i` of the run; with a byte offset `s`,
        // each word is funnel-shifted from two. Loaded words past the vectors are past the
        // run's end, and read as zero.
        let q = (start / 4) % 4;
        let s = (start % 4) * 8;
        let mut lo = pick4(&flat, q, 0u32);
        #[unroll]
        for i in 0..words {
            if comptime!(align == 4) {
                out[i as usize] = pick4(&flat, q, i);
            } else {
                let hi = pick4(&flat, q, comptime!(i + 1));
                out[i as usize] = select(s == 0, lo, (lo >> s) | (hi << ((32 - s) % 32)));
                lo = hi;
            }
        }
    }
}

/// `flat[q + i]` for a runtime `q < 4` and a compile-time `i`: three selects.
#[cube]
fn pick4(flat: &Array<u32>, q: u32, #[comptime] i: u32) -> u32 {
    let a = select(q == 0, flat[i as usize], flat[(i + 1) as usize]);
    let b = select(q == 2, flat[(i + 2) as usize], flat[(i + 3) as usize]);
    select(q < 2, a, b)
}

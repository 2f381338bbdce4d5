//! Fused dequantize + matrix multiply for many activation rows (prefill, training): the blocks
//! of a tile of weight rows are decoded once into workgroup shared memory and reused by a tile
//! of activation rows, as llama.cpp's Vulkan `mul_mm` does with its `dequant_funcs`. No
//! dequantized copy of the weight is written to device memory.
//!
//! One kernel, two products over the weight rows `first..first + n` of `W` (`rows` x `cols`):
//! - **forward** (`y = x W^T`): `x` `[m, cols]` -> `y` `[m, n]`, reduced over `cols` one
//!   32-element chunk at a time;
//! - **transposed** (`y = x W`, the backward pass's `dx = dy W`): `x` `[m, n]` -> `y`
//!   `[m, cols]`, reduced over the weight rows [`MM_STEP`] at a time.
//!
//! A cube of [`MM_UNITS_SIDE`] x [`MM_UNITS_SIDE`] units computes a [`MM_TILE`] x [`MM_TILE`]
//! output tile, each unit a [`MM_MICRO`] x [`MM_MICRO`] block of it in registers. Per step,
//! each unit decodes one 32-element chunk (`decode_values`: the bit-exact weights) into the
//! shared weight tile and loads 32 activations into the shared activation tile; both tiles are
//! `[32][64]` f32 (the step's reduction index outermost), 16 KiB together: WebGPU's default
//! workgroup storage limit.
//!
//! Where it runs: [`MatmulPath::for_client`].
use crate::formats::*;
use crate::formats::{BlockDecode, CHUNK_ELEMS, decode_values};
use crate::gemv::{Vec4, keep_binding};
use crate::{
    KernelError, check_grid, check_words, row_bytes, shape_err, shared_memory_ok, with_format,
};
use cubecl::client::Client;
use cubecl::prelude::*;
use gguf::GgmlType;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

/// How a product over many activation rows runs on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulPath {
    /// The tile kernel ([`crate::launch_dequantize_matmul`]): blocks decoded into workgroup
    /// memory, no dequantized copy in device memory.
    Tile,
    /// Bounded chunks of weight rows dequantized into a scratch buffer
    /// ([`crate::launch_dequantize_rows`]) and multiplied with the framework's matmul.
    Chunked,
}

/// [`MatmulPath::set_override`]'s choice: 0 none, 1 tile, 2 chunked.
static PATH_OVERRIDE: AtomicU8 = AtomicU8::new(0);
/// `BURN_GGUF_MATMUL_PATH`, read once ([`MatmulPath::from_env`]).
static ENV_PATH: OnceLock<Option<MatmulPath>> = OnceLock::new();

impl MatmulPath {
    /// The path of a product on this device: `transposed` is `y = x W` (the backward pass's
    /// `dx = dy W`, the only user of that product), else `y = x W^T`.
    ///
    /// [`MatmulPath::set_override`], else the environment variable `BURN_GGUF_MATMUL_PATH`
    /// (`tile` or `chunked`), chooses for both products; otherwise the tile kernel runs the
    /// transposed product and the chunked path the forward one. The tile kernel needs
    /// workgroup shared memory ([`shared_memory_ok`]): without it, every product is chunked.
    ///
    /// Chosen by measurement on lavapipe, the only device measured so far (2026-12-07):
    /// - forward, chunked faster: a 512 x 4096 x 4096 Q4_K product in 1306 ms against the
    ///   tile kernel's 1806 ms (`cargo xtask bench --quick --type Q4_K --no-e2e`), and Gemma 3
    ///   270M's 229-token prompt in 9.5-10.1 s against 10.6-12.4 s (`burn-gguf run --json`);
    /// - LoRA training of Gemma 3 270M (`cargo xtask bench --finetune`), against the dense
    ///   f32 model: 0.91x its tokens/s with both products chunked, 0.97x with the tile kernel
    ///   transposed, 1.02x with the tile kernel for both. The chunked transposed product
    ///   slices `dy` per chunk and adds the chunks' products; the tile kernel writes each
    ///   output once.
    ///
    /// `cargo xtask bench` times both paths of the forward product on the device it runs on,
    /// and `--matmul-path` runs the fine-tuning measurement on either.
    pub fn for_client(client: &Client, transposed: bool) -> Self {
        let chosen = Self::overridden().or_else(|| *ENV_PATH.get_or_init(Self::from_env));
        let tile = match chosen {
            Some(path) => path == MatmulPath::Tile,
            None => transposed,
        };
        if tile && shared_memory_ok(client) {
            MatmulPath::Tile
        } else {
            MatmulPath::Chunked
        }
    }

    /// `BURN_GGUF_MATMUL_PATH` (`tile` or `chunked`), read once; anything else is ignored with
    /// a warning.
    fn from_env() -> Option<MatmulPath> {
        let v = std::env::var("BURN_GGUF_MATMUL_PATH").ok()?;
        match v.as_str() {
            "tile" => Some(MatmulPath::Tile),
            "chunked" => Some(MatmulPath::Chunked),
            other => {
                eprintln!(
                    "warning: BURN_GGUF_MATMUL_PATH={other:?} is not tile or chunked; ignored"
                );
                None
            }
        }
    }

    /// Makes every later [`MatmulPath::for_client`] in this process return `path` for both
    /// products (where the device can run it), or the default choice again with `None`: for
    /// benchmarks and tests.
    pub fn set_override(path: Option<MatmulPath>) {
        let v = match path {
            None => 0,
            Some(MatmulPath::Tile) => 1,
            Some(MatmulPath::Chunked) => 2,
        };
        PATH_OVERRIDE.store(v, Ordering::Relaxed);
    }

    /// Makes the tile kernel run both products in this process, unless
    /// [`MatmulPath::set_override`] or `BURN_GGUF_MATMUL_PATH` already chose: the choice for a
    /// process that trains (`burn-gguf finetune`), measured faster for training than the
    /// default (see [`MatmulPath::for_client`]).
    pub fn prefer_tile_for_training() {
        if Self::overridden().is_none() && ENV_PATH.get_or_init(Self::from_env).is_none() {
            Self::set_override(Some(MatmulPath::Tile));
        }
    }

    /// The path [`MatmulPath::set_override`] last chose, if any.
    pub fn overridden() -> Option<MatmulPath> {
        match PATH_OVERRIDE.load(Ordering::Relaxed) {
            1 => Some(MatmulPath::Tile),
            2 => Some(MatmulPath::Chunked),
            _ => None,
        }
    }
}

/// Output rows and columns of one cube's tile.
pub const MM_TILE: u32 = 64;
/// Reduction elements per step (one chunk of a weight row, or 32 weight rows).
pub const MM_STEP: u32 = 32;
/// Output rows (and columns) each unit computes in registers.
pub const MM_MICRO: u32 = 8;
/// Units per side of a cube (`MM_TILE / MM_MICRO`).
pub const MM_UNITS_SIDE: u32 = MM_TILE / MM_MICRO;
/// Units per cube.
pub const MM_UNITS: u32 = MM_UNITS_SIDE * MM_UNITS_SIDE;

// Each unit decodes one chunk a step: forward, one of the tile's weight rows; transposed, one
// of the two chunks of the step's 32 weight rows that cover the tile's 64 columns.
const _: () = assert!(MM_UNITS == MM_TILE && 2 * MM_STEP == MM_TILE && MM_STEP == CHUNK_ELEMS);

/// The tile kernel (see the module docs). Cube `(x, y)` computes output columns
/// `x * MM_TILE..` and activation rows `y * MM_TILE..` (the launcher checks that both counts fit
/// a dispatch dimension).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn dequantize_matmul<F: BlockDecode>(
    w: &[u32],
    grid: &[u32],
    x: &[f32],
    y: &mut [f32],
    m: u32,
    first: u32,
    n: u32,
    cols: u32,
    #[comptime] transposed: bool,
) {
    if comptime!(!F::GRID.has_table()) {
        keep_binding(grid, y, m == 0);
    }
    let tile = comptime!(MM_TILE);
    let step = comptime!(MM_STEP);
    let block_elems = comptime!(F::BLOCK_ELEMS);
    let block_bytes = comptime!(F::BLOCK_BYTES);
    let chunks = comptime!(F::CHUNKS);
    let row_bytes = cols / block_elems * block_bytes;
    let row_chunks = cols / comptime!(CHUNK_ELEMS);

    let tx = UNIT_POS_X;
    let ty = UNIT_POS_Y;
    let unit = ty * comptime!(MM_UNITS_SIDE) + tx;
    let out0 = CUBE_POS_X * tile;
    let m0 = CUBE_POS_Y * tile;
    // Output columns: weight rows (forward) or weight columns (transposed); the reduction runs
    // over weight columns (forward) or weight rows (transposed).
    let mut out_len = n;
    let mut red_len = cols;
    if comptime!(transposed) {
        out_len = cols;
        red_len = n;
    }
    // Activation columns are the reduction index in both products.
    let x_cols = red_len;

    // Both tiles as 4-float vectors (one load per 4 values); see the module docs for layouts.
    let lines = comptime!((MM_STEP * MM_TILE / 4) as usize);
    let mut xs = Shared::<[Vec4<f32>]>::new_slice(lines);
    let mut ws = Shared::<[Vec4<f32>]>::new_slice(lines);
    let micro = comptime!(MM_MICRO);
    let mut acc = Array::<f32>::new(comptime!((MM_MICRO * MM_MICRO) as usize));
    #[unroll]
    for i in 0..comptime!(MM_MICRO * MM_MICRO) {
        acc[i as usize] = 0.0;
    }
    let mut vals = Array::<f32>::new(comptime!(F::FORM.out_len() as usize));
    let mut a = Array::<Vec4<f32>>::new(comptime!(MM_MICRO as usize));
    let mut b = Array::<Vec4<f32>>::new(comptime!(MM_MICRO as usize));
    // Vectors of a tile row: 8 along a 32-long reduction step (forward), 16 along the 64
    // outputs or activation rows (transposed).
    let row_vecs = comptime!(if transposed { MM_TILE / 4 } else { MM_STEP / 4 });

    let steps = red_len.div_ceil(step);
    for s in 0..steps {
        let r0 = s * step;
        // Activation tile, zero past the edges. Forward: xs[r][q] = x[m0 + r, r0 + 4q..+4].
        // Transposed: xs[k][q] = x[m0 + 4q..+4, r0 + k], gathered into a vector.
        #[unroll]
        for i in 0..comptime!(MM_STEP * MM_TILE / 4 / MM_UNITS) {
            let e = unit + i * comptime!(MM_UNITS);
            let (p, q) = (e / row_vecs, e % row_vecs);
            let mut v = Vec4::<f32>::empty();
            #[unroll]
            for c in 0..4u32 {
                let mut row = m0 + p;
                let mut col = r0 + 4 * q + c;
                if comptime!(transposed) {
                    row = m0 + 4 * q + c;
                    col = r0 + p;
                }
                let inside = row < m && col < x_cols;
                let idx = select(inside, row * x_cols + col, 0u32);
                v.insert(c as usize, select(inside, x[idx as usize], 0.0f32));
            }
            xs[e as usize] = v;
        }
        // Weight tile: each unit decodes one chunk into 8 vectors. Forward: row out0 + u,
        // chunk s, ws[u][0..8]. Transposed: row r0 + u / 2, chunk out0 / 32 + u % 2,
        // ws[u / 2][8 (u % 2)..+8].
        let mut wrow = out0 + unit;
        let mut chunk = s;
        if comptime!(transposed) {
            wrow = r0 + unit / 2;
            chunk = out0 / comptime!(CHUNK_ELEMS) + unit % 2;
        }
        if wrow < n && chunk < row_chunks {
            let block = (first + wrow) * row_bytes + chunk / chunks * block_bytes;
            decode_values::<F>(w, grid, block, chunk % chunks, &mut vals);
        } else {
            #[unroll]
            for j in 0..comptime!(CHUNK_ELEMS) {
                vals[j as usize] = 0.0;
            }
        }
        #[unroll]
        for q in 0..comptime!(CHUNK_ELEMS / 4) {
            let mut v = Vec4::<f32>::empty();
            #[unroll]
            for c in 0..4u32 {
                v.insert(c as usize, vals[(4 * q + c) as usize]);
            }
            ws[(unit * comptime!(CHUNK_ELEMS / 4) + q) as usize] = v;
        }
        sync_cube();
        if comptime!(transposed) {
            // Outer products: unit (tx, ty) holds rows ty * 8..+8 and outputs tx * 8..+8.
            for k in 0..step {
                #[unroll]
                for h in 0..2u32 {
                    a[h as usize] = xs[(k * row_vecs + 2 * ty + h) as usize];
                    b[h as usize] = ws[(k * row_vecs + 2 * tx + h) as usize];
                }
                #[unroll]
                for i in 0..micro {
                    let ai = a[(i / 4) as usize].extract((i % 4) as usize);
                    #[unroll]
                    for j in 0..micro {
                        let bj = b[(j / 4) as usize].extract((j % 4) as usize);
                        acc[(i * micro + j) as usize] = fma(ai, bj, acc[(i * micro + j) as usize]);
                    }
                }
            }
        } else {
            // Dot products along the step, 4 at a time.
            for q in 0..comptime!(MM_STEP / 4) {
                #[unroll]
                for i in 0..micro {
                    a[i as usize] = xs[((ty * micro + i) * row_vecs + q) as usize];
                    b[i as usize] = ws[((tx * micro + i) * row_vecs + q) as usize];
                }
                #[unroll]
                for i in 0..micro {
                    #[unroll]
                    for j in 0..micro {
                        let mut t = acc[(i * micro + j) as usize];
                        #[unroll]
                        for c in 0..4u32 {
                            t = fma(
                                a[i as usize].extract(c as usize),
                                b[j as usize].extract(c as usize),
                                t,
                            );
                        }
                        acc[(i * micro + j) as usize] = t;
                    }
                }
            }
        }
        sync_cube();
    }
    #[unroll]
    for i in 0..micro {
        let row = m0 + ty * micro + i;
        #[unroll]
        for j in 0..micro {
            let col = out0 + tx * micro + j;
            if row < m && col < out_len {
                y[(row * out_len + col) as usize] = acc[(i * micro + j) as usize];
            }
        }
    }
}

/// Fused dequantize + matrix multiply over the weight rows `first..first + n` of `w` (`rows`
/// rows of `cols` elements of `ty`), for any number `m` of activation rows (this module):
/// - `transposed == false`: `y = x W[first..first + n]^T`, `x` `[m, cols]` f32 -> `y` `[m, n]`;
/// - `transposed == true`: `y = x W[first..first + n]`, `x` `[m, n]` f32 -> `y` `[m, cols]`
///   (the backward pass's `dx = dy W`).
///
/// `grid`: [`crate::grid_words`] of `ty`. Needs workgroup shared memory ([`crate::shared_memory_ok`]).
///
/// # Errors
/// Unsupported type, `cols` not a multiple of the type's block, rows past `rows`, a shape past
/// `u32` or the cube grid, or buffers shorter than the shapes need.
#[allow(clippy::too_many_arguments)]
pub fn launch_dequantize_matmul(
    client: &Client,
    ty: GgmlType,
    w: BufferArg,
    grid: BufferArg,
    x: BufferArg,
    y: BufferArg,
    m: usize,
    first: usize,
    n: usize,
    rows: usize,
    cols: usize,
    transposed: bool,
) -> Result<(), KernelError> {
    const OP: &str = "dequantize_matmul";
    let rb = row_bytes(OP, ty, cols)?;
    check_words(OP, &w, rows, rb)?;
    check_grid(OP, ty, &grid)?;
    if first.checked_add(n).is_none_or(|end| end > rows) {
        return Err(shape_err(
            OP,
            format!("weight rows {first}..{first}+{n} pass the tensor's {rows}"),
        ));
    }
    let (x_cols, y_cols) = if transposed { (n, cols) } else { (cols, n) };
    let fits = |a: usize, b: usize| a.checked_mul(b).filter(|t| *t <= u32::MAX as usize);
    let (Some(x_len), Some(y_len)) = (fits(m, x_cols), fits(m, y_cols)) else {
        return Err(shape_err(
            OP,
            format!("{m} rows of {x_cols} or {y_cols} pass u32"),
        ));
    };
    if x.len() < x_len || y.len() < y_len {
        return Err(shape_err(
            OP,
            format!(
                "x has {} values and y {}, {m} x {x_cols} and {m} x {y_cols} needed",
                x.len(),
                y.len()
            ),
        ));
    }
    let tile = MM_TILE as usize;
    let (cubes_x, cubes_y) = (y_cols.div_ceil(tile), m.div_ceil(tile));
    if cubes_x > 65_535 || cubes_y > 65_535 {
        return Err(shape_err(
            OP,
            format!("{cubes_x} x {cubes_y} tiles pass the 65 535 cubes of a dimension"),
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let count = CubeCount::Static(cubes_x as u32, cubes_y as u32, 1);
    let dim = CubeDim::new_2d(MM_UNITS_SIDE, MM_UNITS_SIDE);
    with_format!(ty, F => {
        // SAFETY: weight reads are of rows first..first + n < rows, each checked to lie in `w`,
        // at chunks below cols / 32; activation reads are below m * x_cols <= x.len() and
        // writes below m * y_cols <= y.len() (the kernel checks each index against m and the
        // output width).
        unsafe {
            dequantize_matmul::launch_unchecked::<F>(
                client, count, dim, w, grid, x, y,
                m as u32, first as u32, n as u32, cols as u32, transposed,
            )
        };
        Ok(())
    }, Err(KernelError::Unsupported(ty)))
}

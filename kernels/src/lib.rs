//! CubeCL kernels over raw ggml blocks.
//!
//! A GGUF tensor's bytes live on the device unchanged, as `u32` words ([`words_for_bytes`]).
//! Each ggml type has one block decoder ([`formats`], behind the [`formats::BlockDecode`] trait);
//! each op is one kernel generic over it, started by its launch function:
//! - [`launch_gemv`]: fused dequantize + GEMV for 1..=[`MAX_GEMV_ROWS`] activation rows (decode),
//!   and [`launch_gemv_glu`] with the gated activation as its epilogue;
//! - [`launch_dequantize_rows`]: dequantize rows by id (embedding lookup, and the bounded
//!   scratch of chunked prefill);
//! - [`launch_dequantize_matmul`]: the tile matmul for many activation rows, `x W^T` and the
//!   backward pass's transposed `x W`, blocks decoded into workgroup memory ([`matmul`]; which
//!   products take it: [`matmul::MatmulPath`]);
//! - not quantized ops, but the models' per-layer ops that Burn ops ran as several small kernels
//!   each: [`launch_rms_norm`] (RMSNorm with its weight), [`launch_add_rms_norm`] (residual add
//!   and the next norm), [`launch_rope`] (rotary position embedding), [`launch_glu`]
//!   (`act(gate) * up`), and attention over a KV cache on the device
//!   ([`launch_qk_rope_cache`], [`launch_attention`]); linear attention over a recurrent
//!   state (Qwen3.5's gated delta net: [`launch_causal_conv`], [`launch_gated_delta_net`]);
//!   [`launch_top_k`] for sampling;
//! - mixture of experts without host round-trips: [`launch_moe_route`] (softmax, top-k,
//!   renormalisation) and [`launch_gemv_id`] (the expert GEMV taking its experts from a buffer
//!   of ids, llama.cpp's `mul_mat_id`).
//!
//! The launch functions check every buffer length against the shapes before launching the
//! unchecked kernels, so they are safe to call with any arguments. The `#[cube]` kernels
//! themselves are private to the crate; [`source`] writes any variant's WGSL, SPIR-V or MSL.
//!
//! ```
//! use cubecl::prelude::*;
//! use ggml_kernels::{GemvConfig, grid_words, launch_gemv, words_for_bytes};
//! use gguf::GgmlType;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = cubecl::Device::from(cubecl::wgpu::WgpuDevice::default()).client();
//! // One row of 32 weights as one llama.cpp `block_q8_0`: f16 `d` = 1.0, then `qs` = 0..32.
//! let mut block = vec![0x00, 0x3c];
//! block.extend(0u8..32);
//! let (words, grid) = (words_for_bytes(&block), grid_words(GgmlType::Q8_0).unwrap());
//! let x = [1.0f32; 32];
//! let w = client.create_from_slice(u32::as_bytes(&words));
//! let g = client.create_from_slice(u32::as_bytes(&grid));
//! let xh = client.create_from_slice(f32::as_bytes(&x));
//! let yh = client.empty(size_of::<f32>());
//! // SAFETY: each length is that of its buffer (and launch_gemv checks them against the shapes).
//! let (wa, ga, xa, ya) = unsafe {
//!     (
//!         BufferArg::from_raw_parts(w, words.len()),
//!         BufferArg::from_raw_parts(g, grid.len()),
//!         BufferArg::from_raw_parts(xh, x.len()),
//!         BufferArg::from_raw_parts(yh.clone(), 1),
//!     )
//! };
//! let config = GemvConfig::for_client(&client);
//! launch_gemv(&client, GgmlType::Q8_0, wa, ga, xa, ya, 1, 32, config)?;
//! let y = client.read_one(yh).map_err(|e| format!("{e:?}"))?;
//! assert_eq!(f32::from_bytes(&y)[0], 496.0); // 0 + 1 + ... + 31
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
pub mod attention;
pub mod check;
pub mod delta_net;
pub mod dequantize;
pub mod formats;
pub mod gemv;
mod gemv_config;
pub mod glu;
pub mod kv_cache;
pub mod matmul;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod source;
pub mod top_k;
pub mod wgsl_cache;
pub mod words;

use cubecl::client::Client;
use cubecl::prelude::*;
use formats::{
    BF16, BlockFormat, F16, F32, IQ1M, IQ1S, IQ2S, IQ2XS, IQ2XXS, IQ3S, IQ3XXS, IQ4NL, IQ4XS,
    MXFP4, NVFP4, Q1_0, Q2_0, Q2K, Q3K, Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0, TQ1_0, TQ2_0,
};
use gguf::GgmlType;
use wgsl_cache::launch_unchecked_cached;

pub use attention::{AttentionShape, KvPaging, launch_attention};
pub use delta_net::{DeltaNetShape, DeltaNetStrides, launch_causal_conv, launch_gated_delta_net};
pub use gemv_config::GemvConfig;
pub use glu::launch_glu;
pub use kv_cache::{QkRopeShape, launch_qk_rope_cache};
pub use matmul::launch_dequantize_matmul;
pub use moe::{GemvIdShape, launch_gemv_id, launch_moe_route};
pub use norm::{launch_add_rms_norm, launch_rms_norm};
pub use rope::launch_rope;
pub use top_k::launch_top_k;

/// Runs `$body` with `$F` bound to the decoder type of `$ty`, or evaluates `$none`.
macro_rules! with_format {
    ($ty:expr, $F:ident => $body:expr, $none:expr) => {
        match $ty {
            GgmlType::F32 => {
                type $F = F32;
                $body
            }
            GgmlType::F16 => {
                type $F = F16;
                $body
            }
            GgmlType::BF16 => {
                type $F = BF16;
                $body
            }
            GgmlType::Q8_0 => {
                type $F = Q8_0;
                $body
            }
            GgmlType::Q4_0 => {
                type $F = Q4_0;
                $body
            }
            GgmlType::Q4_1 => {
                type $F = Q4_1;
                $body
            }
            GgmlType::Q5_1 => {
                type $F = Q5_1;
                $body
            }
            GgmlType::Q2_K => {
                type $F = Q2K;
                $body
            }
            GgmlType::Q3_K => {
                type $F = Q3K;
                $body
            }
            GgmlType::Q5_K => {
                type $F = Q5K;
                $body
            }
            GgmlType::Q5_0 => {
                type $F = Q5_0;
                $body
            }
            GgmlType::Q4_K => {
                type $F = Q4K;
                $body
            }
            GgmlType::Q6_K => {
                type $F = Q6K;
                $body
            }
            GgmlType::TQ2_0 => {
                type $F = TQ2_0;
                $body
            }
            GgmlType::TQ1_0 => {
                type $F = TQ1_0;
                $body
            }
            GgmlType::IQ4_NL => {
                type $F = IQ4NL;
                $body
            }
            GgmlType::IQ4_XS => {
                type $F = IQ4XS;
                $body
            }
            GgmlType::MXFP4 => {
                type $F = MXFP4;
                $body
            }
            GgmlType::NVFP4 => {
                type $F = NVFP4;
                $body
            }
            GgmlType::Q1_0 => {
                type $F = Q1_0;
                $body
            }
            GgmlType::Q2_0 => {
                type $F = Q2_0;
                $body
            }
            GgmlType::IQ2_XXS => {
                type $F = IQ2XXS;
                $body
            }
            GgmlType::IQ2_XS => {
                type $F = IQ2XS;
                $body
            }
            GgmlType::IQ2_S => {
                type $F = IQ2S;
                $body
            }
            GgmlType::IQ3_XXS => {
                type $F = IQ3XXS;
                $body
            }
            GgmlType::IQ3_S => {
                type $F = IQ3S;
                $body
            }
            GgmlType::IQ1_S => {
                type $F = IQ1S;
                $body
            }
            GgmlType::IQ1_M => {
                type $F = IQ1M;
                $body
            }
            _ => $none,
        }
    };
}
pub(crate) use with_format;

/// Most activation rows one fused GEMV launch takes; more rows go through chunked prefill.
pub const MAX_GEMV_ROWS: usize = 8;

/// The widest plane the own-rows GEMV shares activations across: a step's 32 elements are 8
/// vectors of 4, one per lane.
pub const MAX_OWN_ROWS_PLANE: u32 = 8;

/// Errors from the launch functions: arguments that do not fit the kernels.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No block decoder for this ggml type (the loader falls back to dequantization).
    #[error("no kernel for ggml type {0}")]
    Unsupported(GgmlType),
    /// Shapes or buffer lengths that do not fit the op.
    #[error("{op}: {reason}")]
    Shape {
        /// The op, e.g. `gemv`.
        op: &'static str,
        /// What does not fit.
        reason: String,
    },
}

/// Whether a kernel decoder exists for `ty`.
pub fn supports(ty: GgmlType) -> bool {
    kernel_block_elems(ty).is_some()
}

/// Elements per block as the kernels read them (32-element pseudo-blocks for F32/F16/BF16):
/// a row must be a multiple of this long.
pub fn kernel_block_elems(ty: GgmlType) -> Option<usize> {
    with_format!(ty, F => Some(F::BLOCK_ELEMS as usize), None)
}

/// The codebook buffer the kernels of `ty` read (`grid` argument of every launch): the type's
/// `ggml_codec::grids` table as words (`Grid::words`, whole 4-word vectors), or one zero vector
/// for types without one; `None` when no kernel decodes `ty`. Upload it once per device and type
/// and share it between tensors.
pub fn grid_words(ty: GgmlType) -> Option<Vec<u32>> {
    with_format!(ty, F => Some(F::GRID.words()), None)
}

/// Packs a tensor's raw bytes into little-endian `u32` words, zero-padded to [`words_len`]:
/// whole 4-word vectors, with room past the bytes for the decoders' unaligned reads (one word
/// past a field) and the own-rows GEMV's vector loads (up to 7 words past the last byte).
pub fn words_for_bytes(bytes: &[u8]) -> Vec<u32> {
    let mut words = vec![0u32; words_len(bytes.len())];
    let (body, tail) = bytes.split_at(bytes.len() / 4 * 4);
    for (w, c) in words.iter_mut().zip(body.chunks_exact(4)) {
        *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    for (i, b) in tail.iter().enumerate() {
        words[body.len() / 4] |= (*b as u32) << (8 * i);
    }
    words
}

/// Words needed to hold `n_bytes` of blocks (see [`words_for_bytes`]): `ceil(n_bytes / 4) + 7`
/// rounded up to a multiple of 4, so at most [`PAD_BYTES`] past the data.
pub fn words_len(n_bytes: usize) -> usize {
    (n_bytes.div_ceil(4) + 7).next_multiple_of(4)
}

/// The most bytes [`words_for_bytes`] adds past a tensor's data (a buffer limit must leave room
/// for them).
pub const PAD_BYTES: usize = 44;

/// Whether `client`'s device is a software one: no physical card behind it (lavapipe,
/// llvmpipe), so its kernels run on the host's CPU cores. [`GemvConfig::for_client`] picks the
/// own-rows GEMV there.
pub fn is_software_device(client: &Client) -> bool {
    client.properties().identity.physical.is_none()
}

/// Whether `client`'s device runs plane (subgroup) operations: CubeCL lists them, or the device
/// is a native software one (lavapipe runs them, though CubeCL does not list plane ops for CPU
/// devices; `cargo xtask kernel-test` checks the plane variants there). Never in a browser
/// unless CubeCL lists them: WebGPU compiles subgroup operations only on a device created
/// with its `subgroups` feature, which wgpu 30's WebGPU backend does not request, whatever the
/// adapter (SwiftShader's included) offers.
pub fn plane_ops(client: &Client) -> bool {
    client
        .features()
        .plane
        .contains(cubecl::features::Plane::Ops)
        || (cfg!(not(target_family = "wasm")) && is_software_device(client))
}

/// Whether kernels with workgroup shared memory are valid on `client`'s compiler: not on CubeCL
/// 0.11.3's SPIR-V path (runtime `wgpu<spirv>`), whose shared-memory modules fail `spirv-val`
/// (`cargo xtask kernel-gen --target spirv` shows which).
pub fn shared_memory_ok(client: &Client) -> bool {
    client.name() != "wgpu<spirv>"
}

/// A cube count for `n` cubes that respects the 65 535-per-dimension limit (case C29).
pub fn cube_count_for(n: u32) -> CubeCount {
    const MAX: u32 = 65_535;
    if n <= MAX {
        CubeCount::Static(n.max(1), 1, 1)
    } else {
        CubeCount::Static(MAX, n.div_ceil(MAX), 1)
    }
}

pub(crate) fn shape_err(op: &'static str, reason: String) -> KernelError {
    KernelError::Shape { op, reason }
}

/// Checks that `cols` is a whole number of kernel blocks and returns the bytes of one row.
pub(crate) fn row_bytes(op: &'static str, ty: GgmlType, cols: usize) -> Result<usize, KernelError> {
    let be = kernel_block_elems(ty).ok_or(KernelError::Unsupported(ty))?;
    if cols == 0 || !cols.is_multiple_of(be) {
        return Err(shape_err(
            op,
            format!("row length {cols} is not a positive multiple of {be} for {ty}"),
        ));
    }
    let bb = with_format!(ty, F => F::BLOCK_BYTES as usize, 0);
    Ok(cols / be * bb)
}

pub(crate) fn check_grid(
    op: &'static str,
    ty: GgmlType,
    grid: &BufferArg,
) -> Result<(), KernelError> {
    let need = with_format!(ty, F => F::GRID.len_words(), 0);
    if grid.len() < need {
        return Err(shape_err(
            op,
            format!(
                "grid buffer has {} words, {ty} needs {need} (see grid_words)",
                grid.len()
            ),
        ));
    }
    Ok(())
}

pub(crate) fn check_words(
    op: &'static str,
    w: &BufferArg,
    rows: usize,
    row_bytes: usize,
) -> Result<(), KernelError> {
    let need = rows
        .checked_mul(row_bytes)
        .filter(|b| *b <= u32::MAX as usize - PAD_BYTES)
        .ok_or_else(|| {
            shape_err(
                op,
                format!("{rows} rows of {row_bytes} bytes exceed a 4 GiB buffer"),
            )
        })?;
    if w.len() < words_len(need) {
        return Err(shape_err(
            op,
            format!(
                "weight buffer has {} words, {rows} rows need {}",
                w.len(),
                words_len(need)
            ),
        ));
    }
    Ok(())
}

/// `y[r, n] = sum_k x[r, k] * W[n, k]` for `m = x.len() / cols` activation rows
/// (`1..=MAX_GEMV_ROWS`). `w`: `rows` rows of `cols` elements of `ty` as words; `grid`:
/// [`grid_words`] of `ty`; `x`: `[m, cols]` f32; `y`: `[m, rows]` f32.
///
/// # Errors
/// Unsupported type, `cols` not a multiple of the type's block, `m` out of range, or a buffer
/// shorter than the shapes need.
#[allow(clippy::too_many_arguments)]
pub fn launch_gemv(
    client: &Client,
    ty: GgmlType,
    w: BufferArg,
    grid: BufferArg,
    x: BufferArg,
    y: BufferArg,
    rows: usize,
    cols: usize,
    config: GemvConfig,
) -> Result<(), KernelError> {
    launch_gemv_with(
        client,
        ty,
        w,
        grid,
        x,
        y,
        rows,
        cols,
        config,
        GemvLaunch::default(),
    )
}

/// [`launch_gemv`] over a stacked gate/up projection with the gated activation as its
/// epilogue, one kernel: `w` holds `rows = 2 * half` rows (the gate's `half` rows, then up's),
/// `y` is `[m, half]` f32, `y[r, n] = act(x_r . W[n]) * (x_r . W[n + half])` with ggml's GELU
/// (tanh approximation) when `gelu`, else SiLU (`glu::glu_act()`); llama.cpp's `ggml_geglu` /
/// `ggml_swiglu` of the two projections.
///
/// # Errors
/// As [`launch_gemv_with`].
#[allow(clippy::too_many_arguments)]
pub fn launch_gemv_glu(
    client: &Client,
    ty: GgmlType,
    w: BufferArg,
    grid: BufferArg,
    x: BufferArg,
    y: BufferArg,
    rows: usize,
    cols: usize,
    config: GemvConfig,
    gelu: bool,
) -> Result<(), KernelError> {
    let launch = GemvLaunch {
        glu: Some(gelu),
        ..GemvLaunch::default()
    };
    launch_gemv_with(client, ty, w, grid, x, y, rows, cols, config, launch)
}

/// What a GEMV launch ([`launch_gemv_with`]) chooses beyond its variant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemvLaunch {
    /// Activation rows per pass of the unrolled code, one of the variant's
    /// [`GemvConfig::pass_widths`] (the split layout takes all rows in one pass, so at least
    /// `m` there); `None` takes [`GemvConfig::pass_rows`] of `m`. Each width is a shader of its
    /// own; the values do not depend on it (each row's sums are formed the same way).
    pub pass_rows: Option<u32>,
    /// The gated-activation epilogue of a stacked gate/up projection ([`launch_gemv_glu`]):
    /// `Some(gelu)`.
    pub glu: Option<bool>,
}

/// [`launch_gemv`] with the choices of `launch`: its pass width and epilogue.
///
/// # Errors
/// As [`launch_gemv`]; with an epilogue, `rows` odd or an own-rows variant with an odd
/// `rows_per_unit`; a pass width the variant has no shader for (or below `m` in the split
/// layout).
#[allow(clippy::too_many_arguments)]
pub fn launch_gemv_with(
    client: &Client,
    ty: GgmlType,
    w: BufferArg,
    grid: BufferArg,
    x: BufferArg,
    y: BufferArg,
    rows: usize,
    cols: usize,
    config: GemvConfig,
    launch: GemvLaunch,
) -> Result<(), KernelError> {
    const OP: &str = "gemv";
    let glu = launch.glu.map_or(glu::GLU_NONE, glu::glu_code);
    let parts = if glu == glu::GLU_NONE { 1 } else { 2 };
    let odd_unit =
        matches!(config, GemvConfig::OwnRows { rows_per_unit, .. } if rows_per_unit % 2 == 1);
    if parts == 2 && (rows % 2 == 1 || odd_unit) {
        return Err(shape_err(
            OP,
            format!(
                "a stacked gate/up projection needs an even row count ({rows}) and an even \
                 rows_per_unit ({})",
                config.name()
            ),
        ));
    }
    let out_rows = rows / parts;
    let rb = row_bytes(OP, ty, cols)?;
    check_words(OP, &w, rows, rb)?;
    check_grid(OP, ty, &grid)?;
    let m = x.len() / cols;
    if m == 0 || m > MAX_GEMV_ROWS || x.len() != m * cols {
        return Err(shape_err(
            OP,
            format!(
                "x has {} values, not 1..={MAX_GEMV_ROWS} rows of {cols}",
                x.len()
            ),
        ));
    }
    if y.len() < m * out_rows
        || rows > u32::MAX as usize
        || m * cols > u32::MAX as usize
        || m * rows > u32::MAX as usize
    {
        return Err(shape_err(
            OP,
            format!("y has {} values, {m} x {out_rows} needed", y.len()),
        ));
    }
    let pass_rows = launch.pass_rows.unwrap_or(config.pass_rows(m));
    let one_pass = matches!(config, GemvConfig::Split { .. });
    if !config.pass_widths().contains(&pass_rows) || (one_pass && (pass_rows as usize) < m) {
        return Err(shape_err(
            OP,
            format!(
                "no {pass_rows}-row pass for {m} rows in variant {}",
                config.name()
            ),
        ));
    }
    if rows == 0 {
        // Nothing to compute (and the own-rows kernel clamps rows to `rows - 1`).
        return Ok(());
    }
    // Output rows per cube: an own-rows unit's slots hold a gate and an up row each.
    let per_cube = match config {
        GemvConfig::OwnRows { .. } => config.rows_per_cube() / parts as u32,
        GemvConfig::Split { .. } => config.rows_per_cube(),
    };
    let cubes = (out_rows as u32).div_ceil(per_cube);
    let count = cube_count_for(cubes);
    let dim = config.cube_dim();
    let (a, b, plane) = config.kernel_args();
    if let GemvConfig::OwnRows { lanes, .. } = config {
        if plane && lanes > MAX_OWN_ROWS_PLANE {
            return Err(shape_err(
                OP,
                format!(
                    "own-rows variant {} shares activations across at most \
                     {MAX_OWN_ROWS_PLANE} lanes",
                    config.name()
                ),
            ));
        }
        // The own-rows kernel reads `w` and `x` as 4-element vectors.
        if !w.len().is_multiple_of(4) {
            return Err(shape_err(
                OP,
                format!(
                    "weight buffer of {} words is not whole 4-word vectors",
                    w.len()
                ),
            ));
        }
        let (w, x) = (as_vec4(w)?, as_vec4(x)?);
        return with_format!(ty, F => {
            // SAFETY (the kernel is unchecked): as below, and the staging's vector loads end at
            // most 7 words past the last row's data, inside the words_len padding checked above.
            unsafe {
                launch_unchecked_cached!(client, count, dim, gemv::gemv_rows::GemvRows<F>, (
                    w => [gemv::Vec4<u32>], ReadOnly,
                    grid => [u32], ReadOnly,
                    x => [gemv::Vec4<f32>], ReadOnly,
                    y => [f32], ReadWrite,
                    rows as u32 => u32, ReadWrite,
                    cols as u32 => u32, ReadWrite,
                    m as u32 => u32, ReadWrite,
                ), (pass_rows, a, plane, b, glu))
            };
            Ok(())
        }, Err(KernelError::Unsupported(ty)));
    }
    with_format!(ty, F => {
        // SAFETY (the kernels are unchecked): every index the kernel forms is below the lengths
        // checked above: chunk reads stay inside `rows * row_bytes` bytes (+1 padding word),
        // grid reads below the table's length (indices are masked to its size), x reads below
        // m * cols, writes below m * out_rows.
        unsafe {
            if glu == glu::GLU_NONE {
                launch_unchecked_cached!(client, count, dim, gemv::gemv::Gemv<F>, (
                    w => [u32], ReadOnly,
                    grid => [u32], ReadOnly,
                    x => [f32], ReadOnly,
                    y => [f32], ReadWrite,
                    rows as u32 => u32, ReadWrite,
                    cols as u32 => u32, ReadWrite,
                    m as u32 => u32, ReadWrite,
                ), (pass_rows, a, b, plane));
            } else {
                launch_unchecked_cached!(client, count, dim, gemv::gemv_glu::GemvGlu<F>, (
                    w => [u32], ReadOnly,
                    grid => [u32], ReadOnly,
                    x => [f32], ReadOnly,
                    y => [f32], ReadWrite,
                    rows as u32 => u32, ReadWrite,
                    cols as u32 => u32, ReadWrite,
                    m as u32 => u32, ReadWrite,
                ), (pass_rows, a, b, plane, glu));
            }
        }
        Ok(())
    }, Err(KernelError::Unsupported(ty)))
}

/// The same buffer declared as 4-element vectors (its length divided by 4).
fn as_vec4(arg: BufferArg) -> Result<BufferArg, KernelError> {
    let len = arg.len();
    match arg {
        // SAFETY: the same memory, a quarter as many elements of four times the size.
        BufferArg::Handle { handle } => {
            Ok(unsafe { BufferArg::from_raw_parts_binding(handle.handle, len / 4) })
        }
        BufferArg::Alias { .. } => Err(shape_err(
            "gemv",
            "an aliased buffer cannot be read as vectors".into(),
        )),
    }
}

/// `out[t, :] = W[ids[t] - row_start, :]` dequantized to f32 when `ids[t]` lies in
/// `[row_start, row_start + rows)`, zeros otherwise. `w`: `rows` rows of `cols` elements of
/// `ty`; `grid`: [`grid_words`] of `ty`; `ids`: u32; `out`: `[ids.len(), cols]` f32.
///
/// # Errors
/// Unsupported type, `cols` not a multiple of the type's block, or buffers shorter than needed.
#[allow(clippy::too_many_arguments)]
pub fn launch_dequantize_rows(
    client: &Client,
    ty: GgmlType,
    w: BufferArg,
    grid: BufferArg,
    ids: BufferArg,
    out: BufferArg,
    row_start: usize,
    rows: usize,
    cols: usize,
) -> Result<(), KernelError> {
    const OP: &str = "dequantize_rows";
    let rb = row_bytes(OP, ty, cols)?;
    check_words(OP, &w, rows, rb)?;
    check_grid(OP, ty, &grid)?;
    let n = ids.len();
    let total = n.checked_mul(cols).filter(|t| *t <= u32::MAX as usize);
    if total.is_none_or(|t| out.len() < t)
        || row_start > u32::MAX as usize
        || rows > u32::MAX as usize
    {
        return Err(shape_err(
            OP,
            format!("out has {} values, {n} x {cols} needed", out.len()),
        ));
    }
    if n == 0 {
        return Ok(());
    }
    let units = (n * cols / formats::CHUNK_ELEMS as usize) as u32;
    let per_cube = 64u32;
    let count = cube_count_for(units.div_ceil(per_cube));
    with_format!(ty, F => {
        // SAFETY: weight reads happen only for ids inside the part, whose rows were checked to
        // lie in `w`; writes are below n * cols <= out.len().
        unsafe {
            dequantize::dequantize_rows::launch_unchecked::<F>(
                client, count, CubeDim::new_1d(per_cube), w, grid, ids, out,
                row_start as u32, rows as u32, cols as u32,
            )
        };
        Ok(())
    }, Err(KernelError::Unsupported(ty)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIGS: [GemvConfig; 5] = [
        GemvConfig::ROW_PER_UNIT,
        GemvConfig::SHARED,
        GemvConfig::SHARED_ONE_ROW,
        GemvConfig::OWN_ROWS,
        GemvConfig::Split {
            lanes: 32,
            rows_per_cube: 8,
            plane: true,
        },
    ];

    /// Every row count maps to a pass width the variant lists, one pass holds every row of the
    /// split layout, and the test rows fill every pass width and pad each one that some row
    /// count pads.
    #[test]
    fn pass_widths_cover_every_row_count() {
        for config in CONFIGS {
            let widths = config.pass_widths();
            let tests = config.test_rows();
            for m in 1..=MAX_GEMV_ROWS {
                let p = config.pass_rows(m);
                assert!(
                    widths.contains(&p),
                    "{config:?} m={m}: width {p} not listed"
                );
                if let GemvConfig::Split { .. } = config {
                    assert!(
                        p as usize >= m && p.is_power_of_two(),
                        "{config:?} m={m}: {p}"
                    );
                }
            }
            assert_eq!(
                config.pass_rows(1),
                1,
                "{config:?}: m = 1 is its own shader"
            );
            for &p in &widths {
                assert!(
                    tests.contains(&(p as usize)),
                    "{config:?}: no full pass of {p}"
                );
                let padded = |m: &usize| config.pass_rows(*m) == p && !m.is_multiple_of(p as usize);
                if (1..=MAX_GEMV_ROWS).any(|m| padded(&m)) {
                    assert!(
                        tests.iter().any(padded),
                        "{config:?}: no padded pass of {p}"
                    );
                }
            }
            assert!(tests.contains(&MAX_GEMV_ROWS), "{config:?}");
        }
        assert_eq!(GemvConfig::SHARED.pass_widths(), [1, 2, 4, 8]);
        assert_eq!(GemvConfig::OWN_ROWS.pass_widths(), [1, gemv::OWN_ROWS_M]);
    }

    #[test]
    fn variant_names_parse_back() {
        for config in CONFIGS {
            assert_eq!(config.name().parse::<GemvConfig>(), Ok(config));
        }
        assert!("own-r8".parse::<GemvConfig>().is_err());
    }
}

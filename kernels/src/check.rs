//! Running one kernel variant on the device against reference values: the core of
//! `cargo xtask kernel-test` and of the kernel tests. References come from the caller (the CPU
//! codec), so this crate stays independent of it.
use crate::{
    GemvConfig, GemvLaunch, KernelError, grid_words, launch_dequantize_matmul,
    launch_dequantize_rows, launch_gemv_with, words_for_bytes,
};
use cubecl::client::Client;
use cubecl::prelude::*;
use gguf::GgmlType;

pub mod attention;
pub mod delta_net;
pub mod moe;
pub mod norm;
pub mod top_k;
pub use attention::{
    ATTENTION_TOL, AttentionCase, attention_cases, attention_error, attention_error_async,
};
pub use delta_net::{DELTA_NET_TOL, DeltaNetCase, delta_net_cases, delta_net_error};
pub use moe::{GemvIdCase, ROUTE_TOL, gemv_id_error, route_cases, route_error, route_input};
pub use norm::{NORM_TOL, norm_cases, rms_norm_error, rms_norm_error_async};
pub use top_k::{top_k_cases, top_k_error, top_k_input, top_k_mismatches};

/// GEMV tolerance: `|y - y_ref| <= GEMV_TOL * sum_k |w_k x_k|`, the scale of f32 rounding in a dot.
pub const GEMV_TOL: f64 = 1e-5;
/// Dequantize tolerance: `|y - y_ref| <= DEQUANT_TOL * max |y_ref|`.
pub const DEQUANT_TOL: f64 = 1e-6;

/// Deterministic pseudo-random values in [-1, 1) (xorshift64): activations and weights for
/// kernel checks, the same on every machine.
pub fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `rows` x `cols` weights of `ty` for a kernel check, deterministic in `seed`: the codec's
/// quantization of [`rand_f32`] values where it has a quantizer, else pseudo-random blocks
/// that decode to finite values below 1e30 (the IQ codebook types, whose quantizers need an
/// importance matrix).
///
/// # Errors
/// A codec error, or a type with no finite random block in 1,000 tries.
pub fn input_blocks(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Result<Vec<u8>, String> {
    if ggml_codec::supports_quantize(ty) {
        return ggml_codec::quantize(ty, &rand_f32(rows * cols, seed)).map_err(|e| e.to_string());
    }
    let (be, bb) = (ty.block_size(), ty.type_size());
    let blocks = rows * cols / be;
    let mut out = Vec::with_capacity(blocks * bb);
    let mut state = seed | 1;
    let mut vals = vec![0f32; be];
    for _ in 0..blocks {
        for attempt in 0.. {
            let block: Vec<u8> = (0..bb)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 24) as u8
                })
                .collect();
            ggml_codec::dequantize(ty, &block, &mut vals).map_err(|e| e.to_string())?;
            if vals.iter().all(|v| v.is_finite() && v.abs() < 1e30) {
                out.extend_from_slice(&block);
                break;
            }
            if attempt > 1000 {
                return Err(format!("{ty}: no finite random block found"));
            }
        }
    }
    Ok(out)
}

/// Reads `h` back as f32, awaiting the device (a browser's thread cannot block on it).
async fn read_f32_async(
    client: &Client,
    h: cubecl::server::Handle,
) -> Result<Vec<f32>, KernelError> {
    let mut bytes = client
        .read_async(vec![h])
        .await
        .map_err(|e| KernelError::Shape {
            op: "read-back",
            reason: format!("{e:?}"),
        })?;
    Ok(f32::from_bytes(&bytes.remove(0)).to_vec())
}

/// [`read_f32_async`], blocking (native).
fn read_f32(client: &Client, h: cubecl::server::Handle) -> Result<Vec<f32>, KernelError> {
    cubecl::future::block_on(read_f32_async(client, h))
}

/// Runs the fused GEMV `config` with the choices of `launch` (pass width, gated-activation
/// epilogue: [`crate::launch_gemv_with`]) on `bytes` (`rows` x `cols` of `ty`) with activations
/// `x` (`[m, cols]`) and returns the worst error as a fraction of its bound (<= 1 passes)
/// against `reference`, the weights dequantized by the CPU codec (`[rows, cols]`):
/// [`gemv_error_of`], or [`gemv_glu_error_of`] with an epilogue (`rows` then a stacked gate/up
/// projection).
///
/// # Errors
/// Launch errors (unsupported type, shapes) or a failed read-back.
#[allow(clippy::too_many_arguments)]
pub fn gemv_error(
    client: &Client,
    ty: GgmlType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    config: GemvConfig,
    launch: GemvLaunch,
    x: &[f32],
    reference: &[f32],
) -> Result<f64, KernelError> {
    cubecl::future::block_on(gemv_error_async(
        client, ty, bytes, rows, cols, config, launch, x, reference,
    ))
}

/// [`gemv_error`] awaiting the read-back (the browser's kernel checks).
///
/// # Errors
/// As [`gemv_error`].
#[allow(clippy::too_many_arguments)]
pub async fn gemv_error_async(
    client: &Client,
    ty: GgmlType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    config: GemvConfig,
    launch: GemvLaunch,
    x: &[f32],
    reference: &[f32],
) -> Result<f64, KernelError> {
    let m = x.len() / cols;
    let out_rows = if launch.glu.is_some() { rows / 2 } else { rows };
    let words = words_for_bytes(bytes);
    let w = client.create_from_slice(u32::as_bytes(&words));
    let grid = grid_words(ty).ok_or(KernelError::Unsupported(ty))?;
    let gh = client.create_from_slice(u32::as_bytes(&grid));
    let xh = client.create_from_slice(f32::as_bytes(x));
    let yh = client.empty(m * out_rows * size_of::<f32>());
    // SAFETY: each length is that of the buffer just created.
    let (wa, ga, xa, ya) = unsafe {
        (
            BufferArg::from_raw_parts(w, words.len()),
            BufferArg::from_raw_parts(gh, grid.len()),
            BufferArg::from_raw_parts(xh, x.len()),
            BufferArg::from_raw_parts(yh.clone(), m * out_rows),
        )
    };
    launch_gemv_with(client, ty, wa, ga, xa, ya, rows, cols, config, launch)?;
    let y = read_f32_async(client, yh).await?;
    Ok(match launch.glu {
        Some(gelu) => gemv_glu_error_of(&y, x, reference, rows, cols, gelu),
        None => gemv_error_of(&y, x, reference, rows, cols),
    })
}

/// The worst error of `y` (`[m, rows / 2]`) against `act(x W_gate^T) * (x W_up^T)` computed in
/// f64 from `reference` (`[rows, cols]`: the gate's `rows / 2` rows, then up's), `act` ggml's
/// GELU (tanh approximation) with `gelu`, else SiLU, as a fraction of its bound: each dot's
/// [`GEMV_TOL`] bound carried through the product (the activation's slope is below 1.2),
/// plus 1e-5 of the value for the f32 activation. NaN counts as infinite.
pub fn gemv_glu_error_of(
    y: &[f32],
    x: &[f32],
    reference: &[f32],
    rows: usize,
    cols: usize,
    gelu: bool,
) -> f64 {
    let (m, half) = (x.len() / cols, rows / 2);
    let dot = |n: usize, r: usize| dot_f64(reference, x, n, r, cols);
    let act = |g: f64| {
        if gelu {
            let inner = 0.797_884_560_802_865_4 * (g + 0.044715 * g * g * g);
            0.5 * g * (1.0 + inner.tanh())
        } else {
            g / (1.0 + (-g).exp())
        }
    };
    let mut worst = 0f64;
    for n in 0..half {
        for r in 0..m {
            let ((g, mag_g), (u, mag_u)) = (dot(n, r), dot(n + half, r));
            let (dg, du) = (GEMV_TOL * mag_g, GEMV_TOL * mag_u);
            let want = act(g) * u;
            let bound = 1.2 * dg * (u.abs() + du) + act(g).abs() * du + 1e-5 * want.abs();
            worst = worse(
                worst,
                (y[r * half + n] as f64 - want).abs() / bound.max(1e-30),
            );
        }
    }
    worst
}

/// `(sum_k w_k x_k, sum_k |w_k x_k|)` in f64 for weight row `n` of `reference` and activation
/// row `r` of `x` (rows of `cols`).
fn dot_f64(reference: &[f32], x: &[f32], n: usize, r: usize, cols: usize) -> (f64, f64) {
    let w = &reference[n * cols..(n + 1) * cols];
    w.iter()
        .zip(&x[r * cols..(r + 1) * cols])
        .fold((0f64, 0f64), |(d, a), (wk, xk)| {
            let p = *wk as f64 * *xk as f64;
            (d + p, a + p.abs())
        })
}

/// The larger of `worst` and `err`, NaN counting as infinite.
fn worse(worst: f64, err: f64) -> f64 {
    if err.is_nan() {
        f64::INFINITY
    } else {
        worst.max(err)
    }
}

/// The worst error of `y` (`[m, rows]`) against `x W^T` computed in f64 from `reference` (`W`,
/// `[rows, cols]`), as a fraction of its bound ([`GEMV_TOL`] x `sum_k |w_k x_k|`; <= 1 passes).
/// NaN counts as infinite.
pub fn gemv_error_of(y: &[f32], x: &[f32], reference: &[f32], rows: usize, cols: usize) -> f64 {
    let m = x.len() / cols;
    let mut worst = 0f64;
    for n in 0..rows {
        for r in 0..m {
            let (dot, mag) = dot_f64(reference, x, n, r, cols);
            let err = (y[r * rows + n] as f64 - dot).abs() / (GEMV_TOL * mag.max(1e-30));
            worst = worse(worst, err);
        }
    }
    worst
}

/// Runs dequantize-rows over all `rows` of `bytes` and returns the worst error as a fraction of
/// its bound ([`DEQUANT_TOL`]; <= 1 passes) against `reference` (`[rows, cols]`).
///
/// # Errors
/// Launch errors or a failed read-back.
pub fn dequantize_error(
    client: &Client,
    ty: GgmlType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    reference: &[f32],
) -> Result<f64, KernelError> {
    cubecl::future::block_on(dequantize_error_async(
        client, ty, bytes, rows, cols, reference,
    ))
}

/// [`dequantize_error`] awaiting the read-back (the browser's kernel checks).
///
/// # Errors
/// As [`dequantize_error`].
pub async fn dequantize_error_async(
    client: &Client,
    ty: GgmlType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    reference: &[f32],
) -> Result<f64, KernelError> {
    let words = words_for_bytes(bytes);
    let ids: Vec<u32> = (0..rows as u32).collect();
    let w = client.create_from_slice(u32::as_bytes(&words));
    let grid = grid_words(ty).ok_or(KernelError::Unsupported(ty))?;
    let gh = client.create_from_slice(u32::as_bytes(&grid));
    let ih = client.create_from_slice(u32::as_bytes(&ids));
    let oh = client.empty(rows * cols * size_of::<f32>());
    // SAFETY: each length is that of the buffer just created.
    let (wa, ga, ia, oa) = unsafe {
        (
            BufferArg::from_raw_parts(w, words.len()),
            BufferArg::from_raw_parts(gh, grid.len()),
            BufferArg::from_raw_parts(ih, rows),
            BufferArg::from_raw_parts(oh.clone(), rows * cols),
        )
    };
    launch_dequantize_rows(client, ty, wa, ga, ia, oa, 0, rows, cols)?;
    let y = read_f32_async(client, oh).await?;
    let scale = reference
        .iter()
        .fold(0f64, |m, v| m.max(v.abs() as f64))
        .max(f64::MIN_POSITIVE);
    Ok(y.iter().zip(reference).fold(0f64, |worst, (a, b)| {
        let e = (*a as f64 - *b as f64).abs() / (DEQUANT_TOL * scale);
        if e.is_nan() {
            f64::INFINITY
        } else {
            worst.max(e)
        }
    }))
}

/// Runs the tile matmul ([`launch_dequantize_matmul`]) over weight rows `first..first + n` of
/// `bytes` (`rows` x `cols` of `ty`) with activations `x` (`[m, cols]`, or `[m, n]` when
/// `transposed`) and returns the worst error as a fraction of its bound ([`GEMV_TOL`] x the sum
/// of the products' magnitudes, as for the GEMV; <= 1 passes) against the same product in f64
/// from `reference` (`[rows, cols]`, the CPU codec's weights).
///
/// # Errors
/// Launch errors or a failed read-back.
#[allow(clippy::too_many_arguments)]
pub fn matmul_error(
    client: &Client,
    ty: GgmlType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    first: usize,
    n: usize,
    transposed: bool,
    x: &[f32],
    reference: &[f32],
) -> Result<f64, KernelError> {
    let (x_cols, y_cols) = if transposed { (n, cols) } else { (cols, n) };
    let m = x.len() / x_cols;
    let words = words_for_bytes(bytes);
    let w = client.create_from_slice(u32::as_bytes(&words));
    let grid = grid_words(ty).ok_or(KernelError::Unsupported(ty))?;
    let gh = client.create_from_slice(u32::as_bytes(&grid));
    let xh = client.create_from_slice(f32::as_bytes(x));
    let yh = client.empty((m * y_cols).max(1) * size_of::<f32>());
    // SAFETY: each length is that of the buffer just created.
    let (wa, ga, xa, ya) = unsafe {
        (
            BufferArg::from_raw_parts(w, words.len()),
            BufferArg::from_raw_parts(gh, grid.len()),
            BufferArg::from_raw_parts(xh, x.len()),
            BufferArg::from_raw_parts(yh.clone(), m * y_cols),
        )
    };
    launch_dequantize_matmul(
        client, ty, wa, ga, xa, ya, m, first, n, rows, cols, transposed,
    )?;
    let y = read_f32(client, yh)?;
    let mut worst = 0f64;
    for r in 0..m {
        for o in 0..y_cols {
            let (dot, mag) = (0..x_cols).fold((0f64, 0f64), |(d, a), k| {
                let (xv, wv) = if transposed {
                    (x[r * n + k], reference[(first + k) * cols + o])
                } else {
                    (x[r * cols + k], reference[(first + o) * cols + k])
                };
                let p = xv as f64 * wv as f64;
                (d + p, a + p.abs())
            });
            let err = (y[r * y_cols + o] as f64 - dot).abs() / (GEMV_TOL * mag.max(1e-30));
            worst = worse(worst, err);
        }
    }
    Ok(worst)
}

//! RMSNorm ([`crate::launch_rms_norm`]) against an f64 reference: the norm every decoder layer
//! runs two to four times, checked on the device as `kernel-test --op norm` and the browser's
//! kernel checks run it.
use super::{rand_f32, read_f32_async, worse};
use crate::{KernelError, launch_rms_norm};
use cubecl::client::Client;
use cubecl::prelude::*;

/// RMSNorm tolerance: `|y - y_ref| <= NORM_TOL * max |y_ref|` over the row (f32 rounding of a
/// sum of squares, a square root and two products).
pub const NORM_TOL: f64 = 1e-5;

/// The shapes checked, `(rows, cols)`: one decode row of Gemma 3 270M's width, a prompt's rows
/// of a wider model, and a width that is no multiple of anything.
pub fn norm_cases() -> Vec<(usize, usize)> {
    vec![(1, 640), (7, 1152), (5, 33)]
}

/// [`rms_norm_error_async`], blocking (native `kernel-test`).
///
/// # Errors
/// As [`rms_norm_error_async`].
pub fn rms_norm_error(
    client: &Client,
    rows: usize,
    cols: usize,
    seed: u64,
) -> Result<f64, KernelError> {
    cubecl::future::block_on(rms_norm_error_async(client, rows, cols, seed))
}

/// Runs RMSNorm with its weight on `[rows, cols]` pseudo-random activations (eps 1e-6) and
/// returns the worst error as a fraction of its bound ([`NORM_TOL`]; <= 1 passes) against
/// `x / sqrt(mean(x^2) + eps) * w` in f64. NaN counts as infinite.
///
/// # Errors
/// Launch errors (shapes) or a failed read-back.
pub async fn rms_norm_error_async(
    client: &Client,
    rows: usize,
    cols: usize,
    seed: u64,
) -> Result<f64, KernelError> {
    const EPS: f32 = 1e-6;
    let x: Vec<f32> = rand_f32(rows * cols, seed)
        .iter()
        .map(|v| v * 4.0)
        .collect();
    let w = rand_f32(cols, seed + 1);
    let xh = client.create_from_slice(f32::as_bytes(&x));
    let wh = client.create_from_slice(f32::as_bytes(&w));
    let yh = client.empty(x.len() * size_of::<f32>());
    // SAFETY: each length is that of the buffer just created.
    let (xa, wa, ya) = unsafe {
        (
            BufferArg::from_raw_parts(xh, x.len()),
            BufferArg::from_raw_parts(wh, w.len()),
            BufferArg::from_raw_parts(yh.clone(), x.len()),
        )
    };
    launch_rms_norm(client, xa, wa, ya, rows, cols, EPS)?;
    let y = read_f32_async(client, yh).await?;
    let mut worst = 0f64;
    for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact(cols)) {
        let mean = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
        let inv = 1.0 / (mean + EPS as f64).sqrt();
        let reference: Vec<f64> = xr
            .iter()
            .zip(&w)
            .map(|(&xv, &wv)| xv as f64 * inv * wv as f64)
            .collect();
        let scale = reference
            .iter()
            .fold(0f64, |m, v| m.max(v.abs()))
            .max(f64::MIN_POSITIVE);
        for (got, want) in yr.iter().zip(&reference) {
            worst = worse(worst, (*got as f64 - want).abs() / (NORM_TOL * scale));
        }
    }
    Ok(worst)
}

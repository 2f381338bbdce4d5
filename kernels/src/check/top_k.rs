//! The top-k kernel against the host's order ([`crate::top_k::top_k_row`]): ids and values
//! must match exactly.
use super::{rand_f32, read_f32};
use crate::KernelError;
use crate::top_k::{NO_ID, TOP_K_MAX, launch_top_k, top_k_row};
use cubecl::client::Client;
use cubecl::prelude::*;

/// `(rows, n, k)` shapes that cover one chunk and several (two passes), a last chunk that is
/// not full, `k` of 1 and [`TOP_K_MAX`], and rows with fewer finite values than `k`.
pub fn top_k_cases() -> Vec<(usize, usize, usize)> {
    vec![
        (2, 1000, 40),
        (1, 4096, 1),
        (3, 4097, 40),
        (1, 262_144, 40),
        (2, 10_000, TOP_K_MAX),
        (1, 100, TOP_K_MAX),
    ]
}

/// Logits for a top-k check: `rows * n` values on a coarse grid (many ties), every 97th NaN or
/// infinite.
pub fn top_k_input(rows: usize, n: usize, seed: u64) -> Vec<f32> {
    let mut x: Vec<f32> = rand_f32(rows * n, seed)
        .iter()
        .map(|v| (v * 20.0).round() / 4.0)
        .collect();
    for (i, v) in x.iter_mut().enumerate() {
        match i % 97 {
            3 => *v = f32::NAN,
            5 => *v = f32::INFINITY,
            7 => *v = f32::NEG_INFINITY,
            _ => {}
        }
    }
    x
}

/// How many of the `rows * k` outputs (`values`, `ids`, `[rows, k]`) differ from the host's
/// top `k` of each row of `x` `[rows, n]`, bit for bit ([`NO_ID`] past a row's finite values).
pub fn top_k_mismatches(x: &[f32], n: usize, k: usize, values: &[f32], ids: &[u32]) -> usize {
    let mut wrong = 0;
    for (r, row) in x.chunks_exact(n).enumerate() {
        let want = top_k_row(row, k);
        for j in 0..k {
            let (v, id) = (values[r * k + j], ids[r * k + j]);
            let ok = match want.get(j) {
                Some(&(wv, wid)) => id == wid && v.to_bits() == wv.to_bits(),
                None => id == NO_ID,
            };
            wrong += usize::from(!ok);
        }
    }
    wrong
}

/// 0 when the kernel's outputs for [`top_k_input`] match the host's, else 1 plus the share
/// that differ (the check's bound is 1, so any mismatch fails).
///
/// # Errors
/// A launch or read-back failure.
pub fn top_k_error(
    client: &Client,
    (rows, n, k): (usize, usize, usize),
    seed: u64,
) -> Result<f64, KernelError> {
    let x = top_k_input(rows, n, seed);
    let xh = client.create_from_slice(f32::as_bytes(&x));
    let vh = client.empty(rows * k * 4);
    let ih = client.empty(rows * k * 4);
    // SAFETY: the buffers hold the lengths given.
    let [xa, va, ia] = unsafe {
        [
            (xh, x.len()),
            (vh.clone(), rows * k),
            (ih.clone(), rows * k),
        ]
        .map(|(h, len)| BufferArg::from_raw_parts(h, len))
    };
    launch_top_k(client, xa, va, ia, rows, n, k)?;
    let values = read_f32(client, vh)?;
    let ids = client.read_one(ih).map_err(|e| KernelError::Shape {
        op: "read-back",
        reason: format!("{e:?}"),
    })?;
    let wrong = top_k_mismatches(&x, n, k, &values, u32::from_bytes(&ids));
    Ok(match wrong {
        0 => 0.0,
        w => 1.0 + w as f64 / (rows * k) as f64,
    })
}

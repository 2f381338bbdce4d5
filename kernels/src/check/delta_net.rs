//! The delta-net kernels ([`crate::launch_causal_conv`], [`crate::launch_gated_delta_net`])
//! against float64 references: random inputs, states and windows; one sequence's prompt
//! (starting fresh at position 0, or after earlier tokens) or a batch of decode rows, one per
//! slot at different positions (some at 0: a slot reused for a new sequence). Inputs sit in
//! wider rows, as in the model's stacked projection. Slot 0 is never named and must stay bit
//! for bit as it was.
use super::{rand_f32, read_f32};
use crate::{
    DeltaNetShape, DeltaNetStrides, KernelError, launch_causal_conv, launch_gated_delta_net,
};
use cubecl::client::Client;
use cubecl::prelude::*;

/// Tolerance: `|y - y_ref| <= DELTA_NET_TOL * max(1, |y_ref|)` for outputs, states and windows.
pub const DELTA_NET_TOL: f64 = 1e-4;

/// One delta-net check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetCase {
    /// Token rows of the pass.
    pub n: usize,
    /// Position of the first row (one sequence), or with `batch` the largest position.
    pub past: usize,
    /// One row in each of `n` sequences (slots `n, n - 1, .., 1` of `n + 1`) instead of one
    /// sequence's rows (slot 1 of 2).
    pub batch: bool,
    /// Heads and sizes.
    pub shape: DeltaNetShape,
    /// Convolution taps.
    pub d_conv: usize,
}

impl DeltaNetCase {
    /// A short label for tables.
    pub fn label(&self) -> String {
        let s = self.shape;
        format!(
            "{}n={} past={} heads={}/{} d={}x{} conv={}",
            if self.batch { "batch " } else { "" },
            self.n,
            self.past,
            s.n_head_k,
            s.n_head_v,
            s.d_k,
            s.d_v,
            self.d_conv
        )
    }

    /// Slots, and each row's (slot, position).
    pub fn rows(&self) -> (usize, Vec<(usize, usize)>) {
        if self.batch {
            let n = self.n;
            // Every third slot starts a new sequence (position 0).
            let rows = (0..n)
                .map(|t| {
                    let c = n - t;
                    (c, if c % 3 == 0 { 0 } else { self.past - t })
                })
                .collect();
            (n + 1, rows)
        } else {
            (2, (0..self.n).map(|t| (1, self.past + t)).collect())
        }
    }
}

/// The cases `cargo xtask kernel-test --op delta_net` runs and the tests run: 1 and 8
/// sequences, prompts from 0 and after earlier tokens, one longer (150 tokens) than a prefill
/// chunk of the chunked scan llama.cpp uses (64), head ratios 1, 2 and 4, state sizes 16 to 128
/// (Qwen3.5's), 2 to 4 taps.
pub fn delta_net_cases() -> Vec<DeltaNetCase> {
    let shape = |n_head_k, n_head_v, d_k, d_v| DeltaNetShape {
        n_head_k,
        n_head_v,
        d_k,
        d_v,
    };
    let case = |n, past, batch, s, d_conv| DeltaNetCase {
        n,
        past,
        batch,
        shape: s,
        d_conv,
    };
    vec![
        case(1, 0, false, shape(1, 1, 16, 16), 4),
        case(1, 9, false, shape(2, 4, 32, 32), 4),
        case(5, 0, false, shape(2, 4, 64, 64), 4),
        case(2, 1, false, shape(1, 2, 16, 24), 3),
        case(150, 0, false, shape(2, 2, 32, 16), 4),
        case(37, 20, false, shape(4, 8, 128, 128), 4),
        case(8, 30, true, shape(2, 4, 64, 64), 4),
        case(3, 7, true, shape(1, 4, 16, 32), 2),
        case(1, 5, true, shape(2, 2, 128, 128), 4),
    ]
}

/// Runs `case` on `client` and returns the worst error as a fraction of its bound
/// ([`DELTA_NET_TOL`]; <= 1 passes; NaN is infinite), over the convolution's output and
/// windows and the delta rule's output and states.
///
/// # Errors
/// Launch errors (shapes) or a failed read-back.
pub fn delta_net_error(client: &Client, case: DeltaNetCase, seed: u64) -> Result<f64, KernelError> {
    let DeltaNetCase {
        n,
        shape: s,
        d_conv,
        ..
    } = case;
    let (slots, rows) = case.rows();
    let (hk, hv, dk, dv) = (s.n_head_k, s.n_head_v, s.d_k, s.d_v);
    let (kd, vd) = (s.key_dim(), s.value_dim());
    let ch = 2 * kd + vd;
    let taps = d_conv - 1;
    let eps = 1e-6f32;
    let scaled =
        |len, seed, by: f32| -> Vec<f32> { rand_f32(len, seed).iter().map(|v| v * by).collect() };
    // Rows wider than their inputs: the convolution's first `ch` columns of `x_stride`; q, k,
    // v from column 0 of `qkv_stride`; beta at column 2 of `gate_stride`, alpha after it.
    let (x_stride, qkv_stride, gate_stride, beta_off) = (ch + 5, 2 * kd + vd + 3, 2 * hv + 4, 2);
    let x = scaled(n * x_stride, seed, 2.0);
    let weight = scaled(ch * d_conv, seed + 1, 1.0);
    let window0 = scaled(slots * taps * ch, seed + 2, 1.0);
    let q = scaled(n * kd, seed + 3, 1.0);
    let k = scaled(n * kd, seed + 4, 1.0);
    let v = scaled(n * vd, seed + 5, 2.0);
    let alpha = scaled(n * hv, seed + 6, 3.0);
    let beta = scaled(n * hv, seed + 7, 3.0);
    let dt_bias = scaled(hv, seed + 8, 1.0);
    let a: Vec<f32> = rand_f32(hv, seed + 9).iter().map(|v| -v.exp()).collect();
    let state0 = scaled(slots * hv * dk * dv, seed + 10, 0.5);
    let mut qkv = vec![7f32; n * qkv_stride];
    let mut gates = vec![7f32; n * gate_stride];
    for t in 0..n {
        let row = &mut qkv[t * qkv_stride..];
        row[..kd].copy_from_slice(&q[t * kd..(t + 1) * kd]);
        row[kd..2 * kd].copy_from_slice(&k[t * kd..(t + 1) * kd]);
        row[2 * kd..2 * kd + vd].copy_from_slice(&v[t * vd..(t + 1) * vd]);
        let row = &mut gates[t * gate_stride + beta_off..];
        row[..hv].copy_from_slice(&beta[t * hv..(t + 1) * hv]);
        row[hv..2 * hv].copy_from_slice(&alpha[t * hv..(t + 1) * hv]);
    }
    let rows_u32: Vec<u32> = rows
        .iter()
        .flat_map(|&(c, p)| [c as u32, p as u32])
        .collect();

    let up = |v: &[f32]| client.create_from_slice(f32::as_bytes(v));
    let (x_h, w_h, win_h) = (up(&x), up(&weight), up(&window0));
    let (qkv_h, gates_h) = (up(&qkv), up(&gates));
    let (dt_h, a_h, st_h) = (up(&dt_bias), up(&a), up(&state0));
    let rows_h = client.create_from_slice(u32::as_bytes(&rows_u32));
    let conv_h = client.empty(n * ch * 4);
    let out_h = client.empty(n * vd * 4);
    // SAFETY: each length is that of the buffer it names.
    let arg = |h: &cubecl::server::Handle, len: usize| unsafe {
        BufferArg::from_raw_parts(h.clone(), len)
    };
    launch_causal_conv(
        client,
        arg(&x_h, x.len()),
        arg(&w_h, weight.len()),
        arg(&rows_h, rows_u32.len()),
        arg(&win_h, window0.len()),
        arg(&conv_h, n * ch),
        n,
        ch,
        x_stride,
        d_conv,
        slots,
    )?;
    launch_gated_delta_net(
        client,
        arg(&qkv_h, qkv.len()),
        arg(&gates_h, gates.len()),
        arg(&dt_h, hv),
        arg(&a_h, hv),
        arg(&rows_h, rows_u32.len()),
        arg(&st_h, state0.len()),
        arg(&out_h, n * vd),
        n,
        slots,
        s,
        DeltaNetStrides {
            qkv_stride,
            gate_stride,
            beta_off,
        },
        eps,
    )?;
    let conv = read_f32(client, conv_h)?;
    let window = read_f32(client, win_h)?;
    let out = read_f32(client, out_h)?;
    let state = read_f32(client, st_h)?;

    // The reference, in f64, row by row: each slot's window and state carried along.
    let mut win: Vec<f64> = window0.iter().map(|&v| v as f64).collect();
    let mut st: Vec<f64> = state0.iter().map(|&v| v as f64).collect();
    let mut conv_ref = vec![0f64; n * ch];
    let mut out_ref = vec![0f64; n * vd];
    for (t, &(c, p)) in rows.iter().enumerate() {
        let held = &mut win[c * taps * ch..(c + 1) * taps * ch];
        let sc = &mut st[c * hv * dk * dv..(c + 1) * hv * dk * dv];
        if p == 0 {
            held.iter_mut().for_each(|v| *v = 0.0);
            sc.iter_mut().for_each(|v| *v = 0.0);
        }
        for ci in 0..ch {
            let mut acc = 0f64;
            for j in 0..d_conv {
                let input = if j < taps {
                    held[j * ch + ci]
                } else {
                    x[t * x_stride + ci] as f64
                };
                acc += input * weight[ci * d_conv + j] as f64;
            }
            conv_ref[t * ch + ci] = acc / (1.0 + (-acc).exp());
            // Shift the window by one input.
            for j in 0..taps {
                held[j * ch + ci] = if j + 1 < taps {
                    held[(j + 1) * ch + ci]
                } else {
                    x[t * x_stride + ci] as f64
                };
            }
        }
        for h in 0..hv {
            let g = h % hk;
            let qh: Vec<f64> = (0..dk).map(|i| q[t * kd + g * dk + i] as f64).collect();
            let kh: Vec<f64> = (0..dk).map(|i| k[t * kd + g * dk + i] as f64).collect();
            let l2 = |x: &[f64]| 1.0 / (x.iter().map(|v| v * v).sum::<f64>() + eps as f64).sqrt();
            let (qi, ki) = (l2(&qh) / (dk as f64).sqrt(), l2(&kh));
            let xa = alpha[t * hv + h] as f64 + dt_bias[h] as f64;
            let sp = if xa > 20.0 { xa } else { xa.exp().ln_1p() };
            let decay = (sp * a[h] as f64).exp();
            let b = 1.0 / (1.0 + (-(beta[t * hv + h] as f64)).exp());
            let sh = &mut sc[h * dk * dv..(h + 1) * dk * dv];
            sh.iter_mut().for_each(|v| *v *= decay);
            for j in 0..dv {
                let sk: f64 = (0..dk).map(|i| sh[i * dv + j] * kh[i] * ki).sum();
                let d = (v[t * vd + h * dv + j] as f64 - sk) * b;
                for i in 0..dk {
                    sh[i * dv + j] += kh[i] * ki * d;
                }
                out_ref[t * vd + h * dv + j] = (0..dk).map(|i| sh[i * dv + j] * qh[i] * qi).sum();
            }
        }
    }
    let mut worst = 0f64;
    let mut note = |got: &[f32], want: &[f64]| {
        for (g, w) in got.iter().zip(want) {
            let e = (*g as f64 - w).abs() / (DELTA_NET_TOL * w.abs().max(1.0));
            worst = if e.is_nan() {
                f64::INFINITY
            } else {
                worst.max(e)
            };
        }
    };
    note(&conv, &conv_ref);
    note(&window, &win);
    note(&out, &out_ref);
    note(&state, &st);
    // Slot 0 is in no row: its window and state stay bit for bit.
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let untouched = same(&window[..taps * ch], &window0[..taps * ch])
        && same(&state[..hv * dk * dv], &state0[..hv * dk * dv]);
    Ok(if untouched { worst } else { f64::INFINITY })
}

//! Linear attention with a recurrent state on the device: the short causal convolution
//! ([`causal_conv_silu`]) and the gated delta rule ([`gated_delta_net`]) of Qwen3.5's linear
//! attention layers (llama.cpp `src/models/qwen35.cpp`, `delta-net-base.cpp`, and the CPU
//! `ggml_ssm_conv` / `ggml_gated_delta_net` in `ggml-cpu/ops.cpp`).
//!
//! Both walk each sequence's tokens in order, so a prompt of any length (prefill) leaves the
//! same state as stepping through it token by token (decode). The states live in the decode
//! state of each sequence, `slots` of them side by side; [`CacheRows`] says which slot and
//! position each token row of a pass has. A run of rows that starts at position 0 starts from
//! a zero state (a slot reused for a new sequence needs no reset).
use crate::attention::CacheRows;
use crate::nn::is_cube;
use crate::ops::GgmlOps;
use burn::backend::Dispatch;
use burn::tensor::Tensor;
use burn::tensor::activation::{sigmoid, silu, softplus};

pub use ggml_kernels::DeltaNetShape;

/// Causal depthwise convolution of the first `channels` columns of `x` `[n, cols]` (a wider
/// projection is read in place) with `weight` `[channels, d_conv]` (ggml `ssm_conv1d`
/// `{d_conv, channels}`), then SiLU: the output of row `t` is
/// `silu(sum_j x[t - (d_conv - 1) + j] * weight[:, j])`, tap `d_conv - 1` on the row itself and
/// the earlier ones on the sequence's previous rows, from `window` (`[slots * (d_conv - 1),
/// channels]`: each slot's last `d_conv - 1` inputs) before the pass. Returns the output
/// `[n, channels]` and the windows after the pass. llama.cpp `ggml_ssm_conv` + `ggml_silu`.
///
/// On a CubeCL device one kernel ([`GgmlOps::ggml_causal_conv`]) that updates the windows in
/// place (copying them first only if another tensor shares their buffer); elsewhere Burn ops
/// per run of rows in one slot.
///
/// # Panics
/// If the shapes disagree, or a row's slot is out of range or a slot's rows are not at
/// consecutive positions (a programming error in the caller).
pub fn causal_conv_silu(
    x: Tensor<2>,
    weight: &Tensor<2>,
    window: Tensor<2>,
    rows: &CacheRows,
) -> (Tensor<2>, Tensor<2>) {
    let [n, cols] = x.dims();
    let [ch, d_conv] = weight.dims();
    let taps = d_conv.saturating_sub(1);
    let [wr, wch] = window.dims();
    assert!(
        cols >= ch && wch == ch && rows.len() == n && taps > 0 && wr % taps == 0,
        "causal_conv_silu: x {:?}, weight {:?}, window {:?}, {} rows",
        x.dims(),
        weight.dims(),
        window.dims(),
        rows.len()
    );
    let slots = wr / taps;
    if is_cube(&x.device()) {
        let (out, window) = Dispatch::ggml_causal_conv(
            x.into_dispatch(),
            weight.clone().into_dispatch(),
            window.into_dispatch(),
            rows.device.clone().into_dispatch(),
        );
        return (Tensor::from_dispatch(out), Tensor::from_dispatch(window));
    }
    let dev = x.device();
    let x = x.narrow(1, 0, ch);
    let mut window = window;
    let mut out = Vec::new();
    for (t, slot, past, len) in rows.runs() {
        assert!(slot < slots, "causal_conv_silu: slot {slot} of {slots}");
        let held = if past == 0 {
            Tensor::zeros([taps, ch], &dev)
        } else {
            window.clone().narrow(0, slot * taps, taps)
        };
        let xs = Tensor::cat(vec![held, x.clone().narrow(0, t, len)], 0);
        let mut acc =
            xs.clone().narrow(0, 0, len) * weight.clone().narrow(1, 0, 1).reshape([1, ch]);
        for j in 1..d_conv {
            acc = acc
                + xs.clone().narrow(0, j, len) * weight.clone().narrow(1, j, 1).reshape([1, ch]);
        }
        out.push(silu(acc));
        window = window.slice_assign(
            [slot * taps..(slot + 1) * taps, 0..ch],
            xs.narrow(0, len, taps),
        );
    }
    (Tensor::cat(out, 0), window)
}

/// The gated delta rule over each sequence's tokens (llama.cpp `ggml_gated_delta_net`, with
/// the gates of `qwen35.cpp`): per value head `h` with state `S` `[d_k, d_v]` (from `state`
/// `[slots * n_head_v, d_k, d_v]`, slot `c`'s head `h` at row `c * n_head_v + h`), and per
/// token, with `q`, `k` of key head `h % n_head_k` L2-normalised (`x / sqrt(sum x^2 + eps)`,
/// llama.cpp `build_gdn_l2_norm`), `q` scaled by `1 / sqrt(d_k)`, the decay
/// `g = softplus(alpha + dt_bias) * a` and the write strength `beta = sigmoid(beta_raw)`:
///
/// ```text
/// S <- S * exp(g)            (g <= 0: the decay, per head)
/// d <- (v - S^T k) * beta    (beta in (0, 1): the write strength, per head)
/// S <- S + k d^T
/// o <- S^T q
/// ```
///
/// `qkv` `[n, cols]` holds `q`, `k` (`n_head_k * d_k` each) and `v` (`n_head_v * d_v`) from
/// column 0 (the convolution's output); `gates` `[n, cols']` the raw `ssm_beta` projection at
/// column `beta_off` and the `ssm_alpha` one after it (`n_head_v` each: a wider projection is
/// read in place); `dt_bias`, `a` `[n_head_v]` are `ssm_dt.bias` and `ssm_a` (`-exp(A_log)`).
/// All f32. Returns `o` `[n, n_head_v * d_v]` and the states after the pass.
///
/// On a CubeCL device one kernel ([`GgmlOps::ggml_gated_delta_net`]) that updates the states in
/// place (copying them first only if another tensor shares their buffer); elsewhere Burn ops,
/// token by token.
///
/// # Panics
/// If the shapes disagree with `shape`, or a row's slot is out of range or a slot's rows are
/// not at consecutive positions (a programming error in the caller).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    qkv: Tensor<2>,
    gates: Tensor<2>,
    beta_off: usize,
    dt_bias: &Tensor<1>,
    a: &Tensor<1>,
    state: Tensor<3>,
    rows: &CacheRows,
    shape: DeltaNetShape,
    eps: f32,
) -> (Tensor<2>, Tensor<3>) {
    let DeltaNetShape {
        n_head_k: hk,
        n_head_v: hv,
        d_k: dk,
        d_v: dv,
    } = shape;
    let [n, cols] = qkv.dims();
    let [sr, sk, sv] = state.dims();
    let (kd, vd) = (shape.key_dim(), shape.value_dim());
    assert!(
        hk > 0
            && hv.is_multiple_of(hk)
            && cols >= 2 * kd + vd
            && gates.dims()[0] == n
            && gates.dims()[1] >= beta_off + 2 * hv
            && dt_bias.dims() == [hv]
            && a.dims() == [hv]
            && [sk, sv] == [dk, dv]
            && sr.is_multiple_of(hv)
            && rows.len() == n,
        "gated_delta_net: qkv {:?}, gates {:?} (beta at {beta_off}), state {:?} for {shape:?}",
        qkv.dims(),
        gates.dims(),
        state.dims()
    );
    if is_cube(&qkv.device()) {
        let (o, state) = Dispatch::ggml_gated_delta_net(
            qkv.into_dispatch(),
            gates.into_dispatch(),
            dt_bias.clone().into_dispatch(),
            a.clone().into_dispatch(),
            state.into_dispatch(),
            rows.device.clone().into_dispatch(),
            shape,
            beta_off,
            eps,
        );
        return (Tensor::from_dispatch(o), Tensor::from_dispatch(state));
    }
    let (q, k, v) = (
        qkv.clone().narrow(1, 0, kd),
        qkv.clone().narrow(1, kd, kd),
        qkv.narrow(1, 2 * kd, vd),
    );
    let beta_raw = gates.clone().narrow(1, beta_off, hv);
    let alpha = gates.narrow(1, beta_off + hv, hv);
    let slots = sr / hv;
    let dev = q.device();
    // softplus is x past 20 (ggml), where log(1 + e^x) rounds to x in f32 anyway.
    let g = softplus(alpha + dt_bias.clone().reshape([1, hv]), 1.0) * a.clone().reshape([1, hv]);
    let beta = sigmoid(beta_raw);
    let l2 = |x: Tensor<2>| {
        let x = x.reshape([n, hk, dk]);
        let inv = (x.clone().powi_scalar(2).sum_dim(2) + eps as f64)
            .sqrt()
            .recip();
        (x * inv).repeat_dim(1, hv / hk)
    };
    let q = l2(q) * (1.0 / (dk as f64).sqrt());
    let k = l2(k);
    let v = v.reshape([n, hv, 1, dv]);
    let decay = g.exp().reshape([n, hv, 1, 1]);
    let beta = beta.reshape([n, hv, 1, 1]);
    let mut state = state;
    let mut out = Vec::with_capacity(n);
    for (t0, slot, past, len) in rows.runs() {
        assert!(slot < slots, "gated_delta_net: slot {slot} of {slots}");
        let heads = slot * hv..(slot + 1) * hv;
        let mut s = if past == 0 {
            Tensor::zeros([hv, dk, dv], &dev)
        } else {
            state.clone().slice([heads.clone(), 0..dk, 0..dv])
        };
        for t in t0..t0 + len {
            let kt = k.clone().narrow(0, t, 1).reshape([hv, dk, 1]);
            let qt = q.clone().narrow(0, t, 1).reshape([hv, dk, 1]);
            s = s * decay.clone().narrow(0, t, 1).reshape([hv, 1, 1]);
            let sk = (s.clone() * kt.clone()).sum_dim(1);
            let d = (v.clone().narrow(0, t, 1).reshape([hv, 1, dv]) - sk)
                * beta.clone().narrow(0, t, 1).reshape([hv, 1, 1]);
            s = s + kt * d;
            out.push((s.clone() * qt).sum_dim(1).reshape([1, hv * dv]));
        }
        state = state.slice_assign([heads, 0..dk, 0..dv], s);
    }
    (Tensor::cat(out, 0), state)
}

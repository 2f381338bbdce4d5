//! A layer's projections and the LoRA updates added to them: Q, K and V ([`Qkv`]) and a dense
//! FFN's gate and up ([`GateUp`]), each stacked into one packed weight where the types allow,
//! and [`LayerLora`], the adapters of a pass as one layer sees them.
use super::load::expect;
use crate::Error;
use crate::config::DecoderConfig;
use crate::lora::DecoderLora;
use burn::tensor::Tensor;
use burn_gguf::{Activation, GgmlLinear, GgufLoader, QkRopeShape, gated};

/// The adapters a pass applies, seen from one layer.
#[derive(Clone, Copy)]
pub(super) struct LayerLora<'a> {
    pub(super) lora: Option<&'a DecoderLora>,
    pub(super) layer: usize,
}

impl LayerLora<'_> {
    /// `y` plus the update of the layer's weight `name` for `x`, where an adapter has one.
    pub(super) fn add(&self, y: Tensor<2>, name: &str, x: &Tensor<2>) -> Tensor<2> {
        match self.lora.and_then(|l| l.delta(self.layer, name, x)) {
            Some(d) => y + d,
            None => y,
        }
    }

    /// The updates of a stacked projection whose output columns are `parts`, if any part has
    /// an adapter.
    pub(super) fn stacked(&self, parts: &[(&str, usize)], x: &Tensor<2>) -> Option<Tensor<2>> {
        self.lora
            .and_then(|l| l.delta_stacked(self.layer, parts, x))
    }

    /// `y` plus the updates of a stacked projection whose output columns are `parts`.
    pub(super) fn add_stacked(
        &self,
        y: Tensor<2>,
        parts: &[(&str, usize)],
        x: &Tensor<2>,
    ) -> Tensor<2> {
        match self.stacked(parts, x) {
            Some(d) => y + d,
            None => y,
        }
    }
}

/// A layer's Q, K and V projections, their weights' rows stacked where the types allow
/// ([`GgufLoader::stacked_linear`]), so they run as one or two GEMVs instead of three.
// One per layer and long-lived, so the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Qkv {
    /// `[q; k; v]` in one weight.
    Stacked(GgmlLinear),
    /// `[q; k]` in one weight, `v` apart (Gemma 3's Q4_K_M mix: Q5_0 Q and K, Q8_0 V).
    StackedQk(GgmlLinear, GgmlLinear),
    /// Each apart.
    Each([GgmlLinear; 3]),
}

impl Qkv {
    /// `blk.{il}.attn_qkv` where the file has the fused weight (Phi-3; llama.cpp
    /// `build_qkv`), else `attn_q`, `attn_k` and `attn_v`, stacked where the types allow.
    pub(super) fn load(loader: &GgufLoader, il: usize) -> Result<Self, Error> {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        if loader.file().tensor(&n("attn_qkv")).is_some() {
            return Ok(Self::Stacked(loader.linear(&n("attn_qkv"))?));
        }
        let (q, k, v) = (&n("attn_q"), &n("attn_k"), &n("attn_v"));
        if let Some(qkv) = loader.stacked_linear(&[q, k, v])? {
            return Ok(Self::Stacked(qkv));
        }
        if let Some(qk) = loader.stacked_linear(&[q, k])? {
            return Ok(Self::StackedQk(qk, loader.linear(v)?));
        }
        Ok(Self::Each([
            loader.linear(q)?,
            loader.linear(k)?,
            loader.linear(v)?,
        ]))
    }

    /// The projections of `h` `[n, n_embd]`: `(qk, v, layout, gate)` with the query heads at
    /// columns `0..n_head * head_dim` of `qk`, the key heads at `layout.k_off`, the value heads
    /// at `layout.v_off` of `v` (the same tensor as `qk` when stacked), and with gated
    /// attention the gates `[n, n_head * head_dim]`. `layout` leaves `n`, `slots`, `capacity`,
    /// `positions` and `rope_dims` for the caller.
    ///
    /// `bias` (`[q; k; v]` rows, Qwen2) is added to the projections.
    /// `lora` adds the adapters' updates of `attn_q`, `attn_k`, `attn_v` (or of `attn_qkv`
    /// when `fused`) to their columns.
    pub(super) fn forward(
        &self,
        h: Tensor<2>,
        bias: Option<&Tensor<1>>,
        c: &DecoderConfig,
        lora: LayerLora<'_>,
        fused: bool,
    ) -> (Tensor<2>, Tensor<2>, QkRopeShape, Option<Tensor<2>>) {
        let (q, kv) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        // Gated attention: per head `head_dim` query rows, then `head_dim` gate rows.
        let qw = if c.gated_attention { 2 * q } else { q };
        let layout = |qk_stride, v_stride, v_off| QkRopeShape {
            n: 0,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            rope_dims: 0,
            qk_stride,
            k_off: qw,
            v_stride,
            v_off,
            paging: Default::default(),
            positions: 0,
        };
        // Adds `bias[at..at + width]` to `y` `[n, width]`.
        let add = |y: Tensor<2>, at: usize| match bias {
            None => y,
            Some(b) => {
                let width = y.dims()[1];
                y + b.clone().narrow(0, at, width).unsqueeze()
            }
        };
        let qkv_parts: &[(&str, usize)] = match fused {
            true => &[("attn_qkv", qw + 2 * kv)],
            false => &[("attn_q", qw), ("attn_k", kv), ("attn_v", kv)],
        };
        let (qk, v, layout) = match self {
            Self::Stacked(w) => {
                let y = lora.add_stacked(add(w.forward(h.clone()), 0), qkv_parts, &h);
                (y.clone(), y, layout(qw + 2 * kv, qw + 2 * kv, qw + kv))
            }
            Self::StackedQk(wqk, wv) => (
                lora.add_stacked(add(wqk.forward(h.clone()), 0), &qkv_parts[..2], &h),
                lora.add(add(wv.forward(h.clone()), qw + kv), "attn_v", &h),
                layout(qw + kv, kv, 0),
            ),
            Self::Each([wq, wk, wv]) => {
                let q = lora.add(wq.forward(h.clone()), "attn_q", &h);
                let k = lora.add(wk.forward(h.clone()), "attn_k", &h);
                (
                    add(Tensor::cat(vec![q, k], 1), 0),
                    lora.add(add(wv.forward(h.clone()), qw + kv), "attn_v", &h),
                    layout(qw + kv, kv, 0),
                )
            }
        };
        if !c.gated_attention {
            return (qk, v, layout, None);
        }
        // Queries and keys side by side for the cache step, the gates apart.
        let n = qk.dims()[0];
        let qg = qk
            .clone()
            .narrow(1, 0, qw)
            .reshape([n, c.n_head, 2, c.head_dim]);
        let gate = qg.clone().narrow(2, 1, 1).reshape([n, q]);
        let qk = Tensor::cat(
            vec![
                qg.narrow(2, 0, 1).reshape([n, q]),
                qk.narrow(1, layout.k_off, kv),
            ],
            1,
        );
        let layout = QkRopeShape {
            qk_stride: q + kv,
            k_off: q,
            ..layout
        };
        (qk, v, layout, Some(gate))
    }
}

/// A dense FFN's gate and up projections, stacked into one weight where the types allow.
#[allow(clippy::large_enum_variant)]
pub(super) enum GateUp {
    /// `[gate; up]` in one weight.
    Stacked(GgmlLinear),
    /// Each apart.
    Each(GgmlLinear, GgmlLinear),
}

impl GateUp {
    /// `gate` and `up`, stacked where the types allow; without a `gate` tensor, `up` holds
    /// both, the gate rows first (Phi-3's `ffn_up` `[2 * n_ff, n_embd]`: llama.cpp
    /// `ggml_swiglu` takes the first half as the gate).
    pub(super) fn load(loader: &GgufLoader, gate: &str, up: &str) -> Result<Self, Error> {
        if loader.file().tensor(gate).is_none() && loader.file().tensor(up).is_some() {
            return Ok(GateUp::Stacked(loader.linear(up)?));
        }
        Ok(match loader.stacked_linear(&[gate, up])? {
            Some(w) => GateUp::Stacked(w),
            None => GateUp::Each(loader.linear(gate)?, loader.linear(up)?),
        })
    }

    /// `act(gate h) * up h`, with `lora`'s updates of `ffn_gate` and `ffn_up` (of `ffn_up`
    /// holding both when `fused`) added before the activation.
    pub(super) fn forward(
        &self,
        h: Tensor<2>,
        act: Activation,
        lora: LayerLora<'_>,
        fused: bool,
    ) -> Tensor<2> {
        match self {
            GateUp::Stacked(w) => {
                let width = w.weight.shape()[0] / 2;
                let parts: &[(&str, usize)] = match fused {
                    true => &[("ffn_up", 2 * width)],
                    false => &[("ffn_gate", width), ("ffn_up", width)],
                };
                // Without an adapter here, the GEMV with the activation as its epilogue.
                match lora.stacked(parts, &h) {
                    None => w.forward_gated(h, act),
                    Some(d) => burn_gguf::gated_stacked(w.forward(h) + d, act),
                }
            }
            GateUp::Each(gate, up) => gated(
                lora.add(gate.forward(h.clone()), "ffn_gate", &h),
                lora.add(up.forward(h.clone()), "ffn_up", &h),
                act,
            ),
        }
    }

    /// Checks the weights are `[n_ff, n_embd]` each.
    pub(super) fn check(&self, what: &str, n_ff: usize, e: usize) -> Result<(), Error> {
        let got = match self {
            GateUp::Stacked(w) => w.weight.shape(),
            GateUp::Each(g, u) if g.weight.shape() == u.weight.shape() => {
                let [r, c] = g.weight.shape();
                [2 * r, c]
            }
            GateUp::Each(g, _) => g.weight.shape(),
        };
        expect(format!("{what} gate + up"), got, [2 * n_ff, e])
    }
}

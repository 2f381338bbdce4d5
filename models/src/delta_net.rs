//! Qwen3.5's linear-attention layer, a gated delta net (llama.cpp `src/models/qwen35.cpp`
//! `build_layer_attn_linear`), on the packed modules and burn-gguf's recurrent ops.
//!
//! Per token: `qkv`, `z`, `beta`, `alpha` projections of the normed input (one GEMV where the
//! four weights share a ggml type); the causal convolution over `qkv` and SiLU; `q`, `k`, `v`
//! split from it; the decay `g = softplus(alpha + ssm_dt.bias) * ssm_a` and the write strength
//! `sigmoid(beta)`; the delta rule over the layer's recurrent state; an RMSNorm of each head's
//! output (`ssm_norm`) times `silu(z)`; and `ssm_out`.
use crate::Error;
use crate::config::DecoderConfig;
use burn::tensor::Tensor;
use burn::tensor::activation::silu;
use burn_gguf::{CacheRows, GgmlLinear, GgufLoader, causal_conv_silu, gated_delta_net, rms_norm};

/// The input projections `[qkv; z; beta; alpha]`, stacked into one weight where the types
/// allow (else run apart and their outputs concatenated).
// One per layer and long-lived, so the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum InProj {
    Stacked(GgmlLinear),
    Each([GgmlLinear; 4]),
}

/// One delta-net layer's weights.
pub(crate) struct DeltaNetLayer {
    in_proj: InProj,
    /// `ssm_conv1d` `[channels, d_conv]`.
    conv: Tensor<2>,
    /// `ssm_dt.bias` `[n_head_v]`.
    dt_bias: Tensor<1>,
    /// `ssm_a` `[n_head_v]` (`-exp(A_log)`).
    a: Tensor<1>,
    /// `ssm_norm` `[d_v]`.
    norm: Tensor<1>,
    /// `ssm_out` `[n_embd, n_head_v * d_v]`.
    out: GgmlLinear,
}

impl DeltaNetLayer {
    /// Loads layer `il`'s weights and checks their shapes against `c`.
    pub(crate) fn load(loader: &GgufLoader, il: usize, c: &DecoderConfig) -> Result<Self, Error> {
        let d = c
            .delta_net
            .as_ref()
            .ok_or_else(|| Error::Model(format!("layer {il}: no delta-net config")))?;
        let s = d.shape;
        let e = c.n_embd;
        let n = |name: &str| format!("blk.{il}.{name}");
        let names = [
            n("attn_qkv.weight"),
            n("attn_gate.weight"),
            n("ssm_beta.weight"),
            n("ssm_alpha.weight"),
        ];
        let rows = [d.conv_channels(), s.value_dim(), s.n_head_v, s.n_head_v];
        for (name, rows) in names.iter().zip(rows) {
            let got = loader.file().tensor(name).map(|t| t.shape());
            if got.as_deref().is_some_and(|g| g != [rows, e]) {
                return Err(Error::Model(format!(
                    "{name}: shape {:?}, expected {:?}",
                    got.unwrap_or_default(),
                    [rows, e]
                )));
            }
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let in_proj = match loader.stacked_linear(&refs)? {
            Some(w) => InProj::Stacked(w),
            None => InProj::Each([
                loader.linear(&names[0])?,
                loader.linear(&names[1])?,
                loader.linear(&names[2])?,
                loader.linear(&names[3])?,
            ]),
        };
        let layer = Self {
            in_proj,
            conv: loader.dense(&n("ssm_conv1d.weight"))?,
            dt_bias: loader.dense(&n("ssm_dt.bias"))?,
            a: loader.dense(&n("ssm_a"))?,
            norm: loader.dense(&n("ssm_norm.weight"))?,
            out: loader.linear(&n("ssm_out.weight"))?,
        };
        let checks = [
            (
                n("ssm_conv1d.weight"),
                layer.conv.dims().to_vec(),
                vec![d.conv_channels(), d.d_conv],
            ),
            (
                n("ssm_dt.bias"),
                layer.dt_bias.dims().to_vec(),
                vec![s.n_head_v],
            ),
            (n("ssm_a"), layer.a.dims().to_vec(), vec![s.n_head_v]),
            (
                n("ssm_norm.weight"),
                layer.norm.dims().to_vec(),
                vec![s.d_v],
            ),
            (
                n("ssm_out.weight"),
                layer.out.weight.shape().to_vec(),
                vec![e, s.value_dim()],
            ),
        ];
        for (name, got, want) in checks {
            if got != want {
                return Err(Error::Model(format!(
                    "{name}: shape {got:?}, expected {want:?}"
                )));
            }
        }
        Ok(layer)
    }

    /// The layer's output `[n, n_embd]` for the normed input `h` `[n, n_embd]`, and the
    /// recurrent states and convolution windows after it (see [`crate::LayerState`]).
    pub(crate) fn forward(
        &self,
        h: Tensor<2>,
        state: Tensor<3>,
        window: Tensor<2>,
        rows: &CacheRows,
        c: &DecoderConfig,
    ) -> (Tensor<2>, Tensor<3>, Tensor<2>) {
        let d = c
            .delta_net
            .as_ref()
            .expect("a delta-net layer has a delta-net config");
        let s = d.shape;
        let n = h.dims()[0];
        let (ch, vd, hv) = (d.conv_channels(), s.value_dim(), s.n_head_v);
        // The projections side by side, `[qkv | z | beta | alpha]`: the kernels read the
        // convolution's input and the gates from it in place.
        let y = match &self.in_proj {
            InProj::Stacked(w) => w.forward(h),
            InProj::Each(ws) => Tensor::cat(ws.each_ref().map(|w| w.forward(h.clone())).into(), 1),
        };
        let z = y.clone().narrow(1, ch, vd);
        let (x, window) = causal_conv_silu(y.clone(), &self.conv, window, rows);
        let (o, state) = gated_delta_net(
            x,
            y,
            ch + vd,
            &self.dt_bias,
            &self.a,
            state,
            rows,
            s,
            c.rms_eps,
        );
        let o = rms_norm(o.reshape([n, hv, s.d_v]), &self.norm, c.rms_eps)
            * silu(z.reshape([n, hv, s.d_v]));
        (self.out.forward(o.reshape([n, vd])), state, window)
    }
}

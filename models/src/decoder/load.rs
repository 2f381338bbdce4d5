//! Building a [`Decoder`] from a GGUF file: every layer's tensors by name, their shapes checked
//! against the config.
use super::projections::{GateUp, Qkv};
use super::{Decoder, Ffn, Layer, Mixer, SharedExpert};
use crate::Error;
use crate::config::DecoderConfig;
use crate::delta_net::DeltaNetLayer;
use crate::lora::LoraTarget;
use burn::tensor::Tensor;
use burn_gguf::{GgufLoader, QkNorm};
use std::sync::Mutex;

impl Decoder {
    /// Loads the model of `loader`'s file, its architecture from `general.architecture`.
    ///
    /// # Errors
    /// An unsupported architecture, missing keys or tensors, or shapes that do not match the
    /// config.
    pub fn load(loader: &GgufLoader) -> Result<Self, Error> {
        let file = loader.file();
        let config = DecoderConfig::from_gguf(file)?;
        let embed = loader.embedding("token_embd.weight")?;
        let mut layers = Vec::with_capacity(config.n_layers);
        let mut lora_targets = Vec::new();
        for il in 0..config.n_layers {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let pair = |a: &str, b: &str| -> Result<[Tensor<1>; 2], Error> {
                Ok([loader.dense(&n(a))?, loader.dense(&n(b))?])
            };
            let mixer = if config.is_recurrent(il) {
                Mixer::DeltaNet(DeltaNetLayer::load(loader, il, &config)?)
            } else {
                // Checked on the file before Q/K/V are stacked into one weight.
                let (e, hd) = (config.n_embd, config.head_dim);
                let q_rows = config.n_head * hd * if config.gated_attention { 2 } else { 1 };
                let kv_rows = config.n_head_kv * hd;
                for (name, rows) in [
                    ("attn_q", q_rows),
                    ("attn_k", kv_rows),
                    ("attn_v", kv_rows),
                    ("attn_qkv", q_rows + 2 * kv_rows),
                ] {
                    let got = file.tensor(&n(name)).map(|t| t.shape());
                    if got.as_deref().is_some_and(|s| s != [rows, e]) {
                        return Err(Error::Model(format!(
                            "{}: shape {:?}, expected {:?}",
                            n(name),
                            got.unwrap_or_default(),
                            [rows, e]
                        )));
                    }
                }
                Mixer::Attention {
                    qkv: Qkv::load(loader, il)?,
                    bias: qkv_bias(loader, il, [q_rows, kv_rows, kv_rows])?,
                    wo: loader.linear(&n("attn_output"))?,
                    qk_norm: match config.qk_norm {
                        true => {
                            let [q, k] = pair("attn_q_norm", "attn_k_norm")?;
                            // Checked apart before they are stacked into one buffer.
                            expect(n("attn_q_norm"), [q.dims()[0], 1], [hd, 1])?;
                            expect(n("attn_k_norm"), [k.dims()[0], 1], [hd, 1])?;
                            Some(QkNorm::stack(q, k))
                        }
                        false => None,
                    },
                }
            };
            let mut adaptable = vec!["ffn_gate", "ffn_up", "ffn_down"];
            if config.moe.is_some() {
                adaptable.clear();
            }
            if !config.is_recurrent(il) {
                adaptable.extend(["attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output"]);
            }
            for name in adaptable {
                if let Some(t) = file.tensor(&n(name))
                    && let [rows, cols] = t.shape()[..]
                {
                    let target = LoraTarget {
                        layer: il,
                        name: name.to_string(),
                    };
                    lora_targets.push((target, [rows, cols]));
                }
            }
            layers.push(Layer {
                fused_qkv: file.tensor(&n("attn_qkv")).is_some(),
                fused_gate_up: file.tensor(&n("ffn_gate")).is_none(),
                attn_norm: loader.dense(&n("attn_norm"))?,
                mixer,
                post_norms: match config.post_norms {
                    true => Some(pair("post_attention_norm", "post_ffw_norm")?),
                    false => None,
                },
                ffn_norm: loader.dense(&n(config.ffn_norm_name()))?,
                ffn: match &config.moe {
                    None => Ffn::Dense {
                        gate_up: GateUp::load(loader, &n("ffn_gate"), &n("ffn_up"))?,
                        down: loader.linear(&n("ffn_down"))?,
                    },
                    Some(m) => {
                        let mut router: Tensor<2> = loader.dense(&n("ffn_gate_inp"))?;
                        let shared = match m.n_ff_shared {
                            None => None,
                            Some(_) => {
                                let gate: Tensor<1> = loader.dense(&n("ffn_gate_inp_shexp"))?;
                                let [e] = gate.dims();
                                router = Tensor::cat(vec![router, gate.reshape([1, e])], 0);
                                Some(SharedExpert {
                                    gate_up: GateUp::load(
                                        loader,
                                        &n("ffn_gate_shexp"),
                                        &n("ffn_up_shexp"),
                                    )?,
                                    down: loader.linear(&n("ffn_down_shexp"))?,
                                })
                            }
                        };
                        Ffn::Moe {
                            router,
                            experts: if file.tensor(&n("ffn_gate_up_exps")).is_some() {
                                loader
                                    .experts_merged(&n("ffn_gate_up_exps"), &n("ffn_down_exps"))?
                            } else {
                                loader.experts(
                                    &n("ffn_gate_exps"),
                                    &n("ffn_up_exps"),
                                    &n("ffn_down_exps"),
                                )?
                            },
                            shared,
                        }
                    }
                },
            });
        }
        let output_norm = loader.dense("output_norm.weight")?;
        // Tied embeddings (case C14): no `output.weight` (or Gemma), the head reuses
        // `token_embd`.
        let head = if file.tensor("output.weight").is_some() && !config.tied_head {
            loader.linear("output.weight")?
        } else {
            embed.as_linear()
        };
        let head_bias = match file.tensor("output.bias") {
            Some(_) => Some(loader.dense("output.bias")?),
            None => None,
        };
        for name in ["rope_factors_long.weight", "rope_factors_short.weight"] {
            if file.tensor(name).is_some() {
                return Err(Error::Model(format!(
                    "{name}: LongRoPE scaling (Phi-3 128k and later) is not supported yet"
                )));
            }
        }
        let rope_freqs = match file.tensor("rope_freqs.weight") {
            None => config.rope_section_factors(),
            Some(_) => {
                let f = loader.host_values("rope_freqs.weight")?;
                if f.len() != config.rope_dims / 2 || f.iter().any(|x| !(x.is_finite() && *x > 0.0))
                {
                    return Err(Error::Model(format!(
                        "rope_freqs.weight: {} values, expected {} positive ones",
                        f.len(),
                        config.rope_dims / 2
                    )));
                }
                Some(f)
            }
        };
        // Linear scaling divides every angle: one more divisor per frequency.
        let rope_freqs = match config.rope_linear_scale {
            1.0 => rope_freqs,
            k => Some(
                rope_freqs
                    .unwrap_or_else(|| vec![1.0; config.rope_dims / 2])
                    .into_iter()
                    .map(|f| f * k)
                    .collect(),
            ),
        };
        let model = Self {
            config,
            embed,
            layers,
            output_norm,
            head,
            head_bias,
            rope_freqs,
            rope: Mutex::new(None),
            device: loader.device().clone(),
            lora_targets,
            lora: None,
        };
        model.check_shapes()?;
        Ok(model)
    }

    fn check_shapes(&self) -> Result<(), Error> {
        let c = &self.config;
        let (e, hd) = (c.n_embd, c.head_dim);
        expect(
            "token_embd.weight".into(),
            self.embed.weight.shape(),
            [c.vocab_size, e],
        )?;
        expect(
            "output head".into(),
            self.head.weight.shape(),
            [c.vocab_size, e],
        )?;
        if let Some(b) = &self.head_bias {
            expect("output.bias".into(), [b.dims()[0], 1], [c.vocab_size, 1])?;
        }
        for (il, l) in self.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let mut norms = vec![
                ("attn_norm", &l.attn_norm, e),
                (c.ffn_norm_name(), &l.ffn_norm, e),
            ];
            // (`qk_norm` is checked as its two tensors at load, before they are stacked.)
            if let Mixer::Attention { wo, .. } = &l.mixer {
                expect(n("attn_output"), wo.weight.shape(), [e, c.n_head * hd])?;
            }
            match (&l.ffn, &c.moe) {
                (Ffn::Dense { gate_up, down }, _) => {
                    gate_up.check(&n("ffn"), c.n_ff, e)?;
                    expect(n("ffn_down"), down.weight.shape(), [e, c.n_ff])?;
                }
                (
                    Ffn::Moe {
                        router,
                        experts,
                        shared,
                    },
                    Some(m),
                ) => {
                    let routes = m.n_expert + usize::from(shared.is_some());
                    expect(n("ffn_gate_inp"), router.dims(), [routes, e])?;
                    if experts.n_expert() != m.n_expert {
                        return Err(Error::Model(format!(
                            "{}: {} experts, expected {}",
                            n("ffn_down_exps"),
                            experts.n_expert(),
                            m.n_expert
                        )));
                    }
                    expect(n("ffn_gate_exps"), experts.ffn_shape(), [m.n_ff_expert, e])?;
                    if let (Some(sh), Some(n_ff)) = (shared, m.n_ff_shared) {
                        sh.gate_up.check(&n("ffn_shexp"), n_ff, e)?;
                        expect(n("ffn_down_shexp"), sh.down.weight.shape(), [e, n_ff])?;
                    }
                }
                (Ffn::Moe { .. }, None) => {
                    return Err(Error::Model(format!(
                        "{}: a MoE layer without a MoE config",
                        n("ffn")
                    )));
                }
            }
            if let Some([a, f]) = &l.post_norms {
                norms.extend([("post_attention_norm", a, e), ("post_ffw_norm", f, e)]);
            }
            for (name, t, len) in norms {
                expect(n(name), [t.dims()[0], 1], [len, 1])?;
            }
        }
        Ok(())
    }
}

/// Layer `il`'s attention biases as one vector `[q; k; v]` (`widths` values each), where the
/// file has any (`attn_q.bias`, `attn_k.bias`, `attn_v.bias`, or a fused `attn_qkv.bias`;
/// llama.cpp `build_qkv` adds each after its projection); a missing one is zeros.
fn qkv_bias(
    loader: &GgufLoader,
    il: usize,
    widths: [usize; 3],
) -> Result<Option<Tensor<1>>, Error> {
    let file = loader.file();
    let n = |s: &str| format!("blk.{il}.{s}.bias");
    let total: usize = widths.iter().sum();
    let check = |name: String, t: Tensor<1>, width: usize| -> Result<Tensor<1>, Error> {
        expect(name, [t.dims()[0], 1], [width, 1])?;
        Ok(t)
    };
    if file.tensor(&n("attn_qkv")).is_some() {
        let b = loader.dense(&n("attn_qkv"))?;
        return Ok(Some(check(n("attn_qkv"), b, total)?));
    }
    let names = ["attn_q", "attn_k", "attn_v"];
    if names.iter().all(|m| file.tensor(&n(m)).is_none()) {
        return Ok(None);
    }
    let parts = names
        .iter()
        .zip(widths)
        .map(|(m, w)| match file.tensor(&n(m)) {
            Some(_) => check(n(m), loader.dense(&n(m))?, w),
            None => Ok(Tensor::zeros([w], loader.device())),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Tensor::cat(parts, 0)))
}

/// `Ok` when `got` is `want`, else an error naming `what` and both shapes.
pub(super) fn expect(what: String, got: [usize; 2], want: [usize; 2]) -> Result<(), Error> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Model(format!(
            "{what}: shape {got:?}, expected {want:?}"
        )))
    }
}

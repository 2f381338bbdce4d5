//! A decoder's hyper-parameters ([`DecoderConfig`]), read from the GGUF metadata (`<arch>.*`
//! keys, as llama.cpp `src/llama-model.cpp` reads them for each architecture).
use crate::Error;
use burn_gguf::{Activation, DeltaNetShape, RopeStyle};
use gguf::GgufFile;

/// The values of `general.architecture` a [`crate::Decoder`] loads.
pub const ARCHITECTURES: &[&str] = &[
    "gemma2",
    "gemma3",
    "llama",
    "phi3",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "qwen35",
    "qwen35moe",
];

/// Gemma's local attention: every layer but each `pattern`-th (1-based) sees only the last
/// `window` tokens and uses RoPE base `rope_base` (Gemma 3: pattern 6; Gemma 2: 2, so the
/// even layers are local; llama.cpp `llama_hparams::set_swa_pattern`).
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Tokens a query sees, itself included (`attention.sliding_window`).
    pub window: usize,
    /// Every `pattern`-th layer (1-based) is global (`attention.sliding_window_pattern` for
    /// Gemma 2).
    pub pattern: usize,
    /// RoPE base of the local layers (`rope.freq_base_swa`).
    pub rope_base: f32,
}

/// A mixture-of-experts FFN's routing.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    /// `<arch>.expert_count`.
    pub n_expert: usize,
    /// `<arch>.expert_used_count`: experts per token.
    pub n_expert_used: usize,
    /// `<arch>.expert_feed_forward_length`.
    pub n_ff_expert: usize,
    /// Whether the chosen experts' weights are renormalised to sum to 1.
    pub norm_top_k: bool,
    /// `<arch>.expert_shared_feed_forward_length`: a shared expert every token goes through,
    /// scaled by a sigmoid gate (`ffn_gate_inp_shexp`), as in Qwen3.5-MoE.
    pub n_ff_shared: Option<usize>,
}

/// Qwen3.5's linear-attention layers: a gated delta net (llama.cpp `src/models/qwen35.cpp`).
#[derive(Clone, Debug, PartialEq)]
pub struct DeltaNet {
    /// `<arch>.ssm.conv_kernel`: taps of the causal convolution.
    pub d_conv: usize,
    /// Heads and head sizes: `ssm.group_count` key heads and `ssm.time_step_rank` value heads
    /// of `ssm.state_size` values.
    pub shape: DeltaNetShape,
    /// Per layer, whether it is a delta-net layer (`attention.recurrent_layers`, else every
    /// layer but each `full_attention_interval`-th, default 4).
    pub recurrent: Vec<bool>,
}

impl DeltaNet {
    /// Channels of the convolution: `[q | k | v]`, `2 * key_dim + value_dim`.
    pub fn conv_channels(&self) -> usize {
        2 * self.shape.key_dim() + self.shape.value_dim()
    }
}

/// Hyper-parameters of a decoder, from the GGUF metadata (`<arch>.*` keys).
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// `general.architecture`, one of [`ARCHITECTURES`].
    pub architecture: String,
    /// `<arch>.block_count`.
    pub n_layers: usize,
    /// `<arch>.embedding_length`.
    pub n_embd: usize,
    /// `<arch>.feed_forward_length`.
    pub n_ff: usize,
    /// `<arch>.attention.head_count`.
    pub n_head: usize,
    /// `<arch>.attention.head_count_kv`.
    pub n_head_kv: usize,
    /// `<arch>.attention.key_length` (= value_length), else `n_embd / n_head`.
    pub head_dim: usize,
    /// `<arch>.attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// `<arch>.rope.freq_base` (of the global layers where there is a sliding window).
    pub rope_base: f32,
    /// Values of each head RoPE rotates, its first (`<arch>.rope.dimension_count`, default
    /// `head_dim`; Qwen3.5 rotates a quarter).
    pub rope_dims: usize,
    /// Qwen3.5's multi-section RoPE (`rope.dimension_sections`): for text every position
    /// is `(p, p, p, 0)`, so pair `i` turns with position `p` unless its section is the 4th,
    /// which stays at 0. `None` elsewhere.
    pub rope_sections: Option<[u32; 4]>,
    /// How RoPE pairs dimensions: NORM for `llama`, NEOX otherwise.
    pub rope_style: RopeStyle,
    /// Linear RoPE scaling: positions are divided by this factor (`rope.scaling.type`
    /// `linear` with `rope.scaling.factor`, or the older `rope.scale_linear`); 1 without.
    pub rope_linear_scale: f32,
    /// Local attention (Gemma 3), if any.
    pub sliding_window: Option<SlidingWindow>,
    /// Factor applied to the token embeddings (Gemma: `sqrt(n_embd)`).
    pub embed_scale: Option<f64>,
    /// The FFN activation.
    pub activation: Activation,
    /// Whether Q and K get a per-head RMSNorm (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Whether attention and FFN outputs get an RMSNorm before the residual
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// The attention scores' factor: `1 / sqrt(head_dim)`, except Gemma 2 27B (46 layers),
    /// `1 / sqrt(n_embd / n_head)` (llama.cpp `src/models/gemma2.cpp`).
    pub attention_scale: f32,
    /// Gemma 2's attention-logit soft-cap (`attn_logit_softcapping`, default 50): scores
    /// `x` become `cap * tanh(x / cap)`.
    pub attention_softcap: Option<f32>,
    /// Gemma 2's final-logit soft-cap (`final_logit_softcapping`, default 30), applied to
    /// the head's logits the same way.
    pub final_softcap: Option<f32>,
    /// Whether the output head is always `token_embd` (Gemma 2 and 3: llama.cpp loads no
    /// `output.weight` for them); elsewhere it is tied only when `output.weight` is absent.
    pub tied_head: bool,
    /// Qwen3.5's gated attention: `attn_q` holds per head `head_dim` query rows then
    /// `head_dim` gate rows, and the attention output is multiplied by the gate's sigmoid.
    pub gated_attention: bool,
    /// Qwen3.5's delta-net layers, where the architecture has them.
    pub delta_net: Option<DeltaNet>,
    /// The mixture-of-experts FFN, where the architecture has one.
    pub moe: Option<Moe>,
    /// `<arch>.context_length`.
    pub context_length: usize,
    /// Vocabulary size (rows of `token_embd`).
    pub vocab_size: usize,
}

impl DecoderConfig {
    /// Reads the config from `file`.
    ///
    /// # Errors
    /// An architecture not in [`ARCHITECTURES`] (named, with the supported ones), or a missing /
    /// mistyped / inconsistent key (named in the error).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, Error> {
        let arch = file.architecture()?.to_string();
        if !ARCHITECTURES.contains(&arch.as_str()) {
            return Err(Error::Model(format!(
                "architecture '{arch}' is not supported (supported: {})",
                ARCHITECTURES.join(", ")
            )));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| -> Result<usize, Error> { Ok(file.get_u32(&key(k))? as usize) };
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let head_dim = match file.get_opt_u32(&key("attention.key_length"))? {
            Some(k) => k as usize,
            None => n_embd / n_head.max(1),
        };
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::Model("tensor 'token_embd.weight' is missing".into()))?;
        let gemma2 = arch == "gemma2";
        let gemma = gemma2 || arch == "gemma3";
        let qwen35 = arch == "qwen35" || arch == "qwen35moe";
        // llama.cpp's defaults: Gemma 3's global base is 1e6, everyone else's 1e4.
        let rope_base = file
            .get_opt_f32(&key("rope.freq_base"))?
            .unwrap_or(if arch == "gemma3" {
                1_000_000.0
            } else {
                10_000.0
            });
        let sliding_window = if gemma {
            Some(SlidingWindow {
                window: file
                    .get_opt_u32(&key("attention.sliding_window"))?
                    .unwrap_or(if gemma2 { 4096 } else { 512 }) as usize,
                pattern: if gemma2 {
                    file.get_opt_u32(&key("attention.sliding_window_pattern"))?
                        .unwrap_or(2) as usize
                } else {
                    6
                },
                // Gemma 3's local base is llama.cpp's built-in 1e4 (the key is usually
                // absent); Gemma 2's defaults to the global one.
                rope_base: file
                    .get_opt_f32(&key("rope.freq_base_swa"))?
                    .unwrap_or(if gemma2 { rope_base } else { 10_000.0 }),
            })
        } else {
            None
        };
        let softcap = |k: &str, default: f32| -> Result<Option<f32>, Error> {
            if !gemma2 {
                return Ok(None);
            }
            let cap = file.get_opt_f32(&key(k))?.unwrap_or(default);
            match cap.is_finite() && cap > 0.0 {
                true => Ok(Some(cap)),
                false => Err(Error::Model(format!(
                    "{}: {cap}, expected a positive soft-cap",
                    key(k)
                ))),
            }
        };
        let moe = if arch == "qwen3moe" || arch == "qwen35moe" {
            Some(Moe {
                n_expert: u("expert_count")?,
                n_expert_used: u("expert_used_count")?,
                n_ff_expert: u("expert_feed_forward_length")?,
                norm_top_k: true,
                n_ff_shared: match arch == "qwen35moe" {
                    true => Some(u("expert_shared_feed_forward_length")?),
                    false => None,
                },
            })
        } else {
            None
        };
        let n_layers = u("block_count")?;
        let delta_net = match qwen35 {
            true => Some(delta_net(file, &arch, n_layers)?),
            false => None,
        };
        let rope_sections = match qwen35 {
            true => {
                let k = key("rope.dimension_sections");
                let s = file.get_i32_array(&k)?;
                let s: [u32; 4] = s
                    .iter()
                    .map(|&v| u32::try_from(v).ok())
                    .collect::<Option<Vec<_>>>()
                    .and_then(|v| v.try_into().ok())
                    .filter(|v: &[u32; 4]| v.iter().map(|&x| x as u64).sum::<u64>() > 0)
                    .ok_or_else(|| {
                        Error::Model(format!("{k}: {s:?}, expected 4 non-negative sections"))
                    })?;
                Some(s)
            }
            false => None,
        };
        let cfg = Self {
            n_layers,
            n_embd,
            n_ff: u("feed_forward_length")?,
            n_head,
            n_head_kv: u("attention.head_count_kv")?,
            head_dim,
            rms_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_base,
            rope_dims: match file.get_opt_u32(&key("rope.dimension_count"))? {
                Some(d) => d as usize,
                None => head_dim,
            },
            rope_sections,
            sliding_window,
            embed_scale: gemma.then(|| (n_embd as f64).sqrt()),
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            rope_style: if arch == "llama" {
                RopeStyle::Norm
            } else {
                RopeStyle::Neox
            },
            qk_norm: !matches!(arch.as_str(), "llama" | "qwen2" | "phi3" | "gemma2"),
            rope_linear_scale: rope_linear_scale(file, &arch)?,
            post_norms: gemma,
            attention_scale: if gemma2 && n_layers == 46 {
                1.0 / ((n_embd / n_head.max(1)) as f32).sqrt()
            } else {
                1.0 / (head_dim.max(1) as f32).sqrt()
            },
            attention_softcap: softcap("attn_logit_softcapping", 50.0)?,
            final_softcap: softcap("final_logit_softcapping", 30.0)?,
            tied_head: gemma,
            gated_attention: qwen35,
            delta_net,
            moe,
            context_length: u("context_length")?,
            vocab_size: embd.shape()[0],
            architecture: arch,
        };
        let ok = cfg.n_layers > 0
            && cfg.n_layers <= 1024
            && cfg.n_head > 0
            && cfg.n_head_kv > 0
            && cfg.n_head.is_multiple_of(cfg.n_head_kv)
            && cfg.head_dim > 0
            && cfg.head_dim.is_multiple_of(2)
            && cfg.rope_dims > 0
            && cfg.rope_dims <= cfg.head_dim
            && cfg.rope_dims.is_multiple_of(2)
            && cfg
                .delta_net
                .as_ref()
                .is_none_or(|d| d.recurrent.len() == cfg.n_layers)
            && cfg
                .sliding_window
                .as_ref()
                .is_none_or(|w| w.window > 0 && w.pattern > 0)
            && cfg.rope_linear_scale.is_finite()
            && cfg.rope_linear_scale > 0.0
            && cfg.moe.as_ref().is_none_or(|m| {
                m.n_expert > 0 && m.n_expert <= 4096 && (1..=m.n_expert).contains(&m.n_expert_used)
            });
        if !ok {
            return Err(Error::Model(format!(
                "inconsistent {} hyper-parameters: {cfg:?}",
                cfg.architecture
            )));
        }
        Ok(cfg)
    }

    /// The name of the FFN's norm weight: `ffn_norm`, or for Qwen3.5 `post_attention_norm`
    /// (llama.cpp `qwen35.cpp` loads that name as the FFN's input norm).
    pub fn ffn_norm_name(&self) -> &'static str {
        if self.gated_attention {
            "post_attention_norm"
        } else {
            "ffn_norm"
        }
    }

    /// Whether layer `il` is a linear-attention (delta-net) layer.
    pub fn is_recurrent(&self, il: usize) -> bool {
        self.delta_net
            .as_ref()
            .is_some_and(|d| d.recurrent.get(il).copied().unwrap_or(false))
    }

    /// RoPE frequency divisors from the multi-section layout (`rope_dims / 2` values): 1 for
    /// a pair that turns with the text position, infinite (angle 0) for one of the 4th
    /// section, whose position is 0 for text (llama.cpp `ggml_mrope_cache_init`, IMROPE:
    /// pair `i`'s sector `i % sum(sections)` is t, h or w when `sector % 3` is 0, 1, 2 and
    /// below 3 times that section's size, else e). `None` when every pair turns (the usual
    /// case: then IMROPE is NEOX RoPE over the first `rope_dims` values).
    pub fn rope_section_factors(&self) -> Option<Vec<f32>> {
        let s = self.rope_sections?;
        let sum = s.iter().sum::<u32>() as usize;
        let f: Vec<f32> = (0..self.rope_dims / 2)
            .map(|i| {
                let sector = i % sum;
                let turns = (0..3).any(|c| sector % 3 == c && sector < 3 * s[c] as usize);
                if turns { 1.0 } else { f32::INFINITY }
            })
            .collect();
        f.iter().any(|x| x.is_infinite()).then_some(f)
    }

    /// Whether layer `il` uses the sliding window (llama.cpp gemma3: `(il + 1) % 6 != 0`).
    pub fn is_local(&self, il: usize) -> bool {
        self.sliding_window
            .as_ref()
            .is_some_and(|w| !(il + 1).is_multiple_of(w.pattern))
    }
}

/// The linear RoPE scaling factor (llama.cpp `llama_model::load_hparams`:
/// `rope.scaling.type` with `rope.scaling.factor`, else the older `rope.scale_linear`): 1
/// without scaling. YaRN and LongRoPE scaling change more than the angles and are an error.
fn rope_linear_scale(file: &GgufFile, arch: &str) -> Result<f32, Error> {
    let key = |k: &str| format!("{arch}.{k}");
    let kind = match file.get(&key("rope.scaling.type")) {
        None => None,
        Some(v) => Some(v.as_str().ok_or_else(|| {
            Error::Model(format!(
                "{}: {}, expected STRING",
                key("rope.scaling.type"),
                v.value_type_name()
            ))
        })?),
    };
    let factor = match file.get_opt_f32(&key("rope.scaling.factor"))? {
        Some(f) => Some(f),
        None => file.get_opt_f32(&key("rope.scale_linear"))?,
    };
    match kind {
        Some("none") => return Ok(1.0),
        None | Some("linear") => {}
        Some(other) => {
            return Err(Error::Model(format!(
                "{}: '{other}' RoPE scaling is not supported (linear is)",
                key("rope.scaling.type")
            )));
        }
    }
    match factor {
        // llama.cpp reads a factor of 0 as no scaling.
        None => Ok(1.0),
        Some(f) if f == 0.0 => Ok(1.0),
        Some(f) if f.is_finite() && f > 0.0 => Ok(f),
        Some(f) => Err(Error::Model(format!(
            "{}: {f}, expected a positive factor",
            key("rope.scaling.factor")
        ))),
    }
}

/// Qwen3.5's delta-net keys (llama.cpp `qwen35.cpp`: `ssm.*`, `attention.recurrent_layers`
/// or `full_attention_interval`).
fn delta_net(file: &GgufFile, arch: &str, n_layers: usize) -> Result<DeltaNet, Error> {
    let key = |k: &str| format!("{arch}.{k}");
    let u = |k: &str| -> Result<usize, Error> { Ok(file.get_u32(&key(k))? as usize) };
    let (d_conv, d_state) = (u("ssm.conv_kernel")?, u("ssm.state_size")?);
    let (n_head_k, n_head_v) = (u("ssm.group_count")?, u("ssm.time_step_rank")?);
    let inner = u("ssm.inner_size")?;
    let shape = DeltaNetShape {
        n_head_k,
        n_head_v,
        d_k: d_state,
        d_v: d_state,
    };
    let recurrent = match file.get(&key("attention.recurrent_layers")) {
        Some(v) => match v.as_array() {
            Some(gguf::MetadataArray::Bool(flags)) => flags.clone(),
            _ => {
                return Err(Error::Model(format!(
                    "{}: {}, expected ARRAY[BOOL]",
                    key("attention.recurrent_layers"),
                    v.value_type_name()
                )));
            }
        },
        None => {
            let every = file
                .get_opt_u32(&key("full_attention_interval"))?
                .unwrap_or(4) as usize;
            if every == 0 {
                return Err(Error::Model(format!(
                    "{}: 0, expected at least 1",
                    key("full_attention_interval")
                )));
            }
            (0..n_layers)
                .map(|il| !(il + 1).is_multiple_of(every))
                .collect()
        }
    };
    let ok = (2..=64).contains(&d_conv)
        && d_state > 0
        && d_state <= 1024
        && n_head_k > 0
        && n_head_v > 0
        && n_head_v.is_multiple_of(n_head_k)
        && n_head_v <= 4096
        && inner == n_head_v * d_state
        && recurrent.len() == n_layers;
    if !ok {
        return Err(Error::Model(format!(
            "inconsistent {arch} delta-net keys: ssm.conv_kernel {d_conv}, ssm.state_size \
             {d_state}, ssm.group_count {n_head_k}, ssm.time_step_rank {n_head_v}, \
             ssm.inner_size {inner}, {} layer flags for {n_layers} layers",
            recurrent.len()
        )));
    }
    Ok(DeltaNet {
        d_conv,
        shape,
        recurrent,
    })
}

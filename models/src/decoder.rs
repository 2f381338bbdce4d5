//! The decoder-only transformer shared by every architecture, with per-architecture parts
//! chosen from `general.architecture` ([`ARCHITECTURES`]).
//!
//! The skeleton follows llama.cpp `src/models/*.cpp`: token embeddings; per layer RMSNorm, Q/K/V,
//! optional per-head RMSNorm of Q and K, RoPE, grouped-query attention scaled by
//! `1/sqrt(head_dim)` with a KV cache, the output projection, a residual; RMSNorm, `act(gate) * up`,
//! down, a residual; a final norm and the output head (tied to `token_embd` when `output.weight`
//! is absent, case C14). The parts that differ:
//! - `llama` (`src/models/llama.cpp`, Llama 3 family): SiLU, NORM-style RoPE (the converter
//!   permutes Q and K for it, case C16) with the optional `rope_freqs` frequency factors.
//! - `qwen3` (`src/models/qwen3.cpp`): Q/K norms, SiLU.
//! - `qwen3moe` (`src/models/qwen3moe.cpp`): as `qwen3`, with a mixture-of-experts FFN: a
//!   softmax router over `expert_count` experts (`ffn_gate_inp`), the top `expert_used_count`
//!   taken and their weights renormalised to sum to 1, each a SiLU FFN of
//!   `expert_feed_forward_length` ([`burn_gguf::GgmlExperts`]).
//! - `gemma3` (`src/models/gemma3.cpp`): embeddings scaled by `sqrt(n_embd)`; Q/K norms; a norm
//!   after attention and after the FFN (`post_attention_norm`, `post_ffw_norm`; the GGUF norm
//!   weights already hold Gemma's `1 + w`); GELU (tanh); five of every six layers use a sliding
//!   window (`attention.sliding_window`) with RoPE base `rope.freq_base_swa` (default 10 000,
//!   llama.cpp's built-in value: the key is usually absent); every sixth layer is global with
//!   `rope.freq_base` (case C17).
use crate::Error;
use crate::state::{BatchState, LayerKind, LayerState, SequenceState};
use burn::tensor::{Device, Tensor};
use burn_gguf::{
    AttentionShape, CacheRows, GgmlEmbedding, GgmlExperts, GgmlLinear, GgufLoader, QkNorm,
    QkRopeShape, RopeTable, add_rms_norm, attention, gated, moe_route, qk_rope_cache,
};
use gguf::GgufFile;
use std::sync::Mutex;

/// The values of `general.architecture` a [`Decoder`] loads.
pub const ARCHITECTURES: &[&str] = &["gemma3", "llama", "qwen3", "qwen3moe"];

pub use burn_gguf::{Activation, RopeStyle, rms_norm};

/// Gemma 3's local attention: every layer but each `pattern`-th (1-based) sees only the last
/// `window` tokens and uses RoPE base `rope_base`.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Tokens a query sees, itself included (`attention.sliding_window`).
    pub window: usize,
    /// Every `pattern`-th layer (1-based) is global.
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
    /// How RoPE pairs dimensions: NORM for `llama`, NEOX otherwise.
    pub rope_style: RopeStyle,
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
        let gemma = arch == "gemma3";
        let sliding_window = if gemma {
            Some(SlidingWindow {
                window: file
                    .get_opt_u32(&key("attention.sliding_window"))?
                    .unwrap_or(512) as usize,
                pattern: 6,
                rope_base: file
                    .get_opt_f32(&key("rope.freq_base_swa"))?
                    .unwrap_or(10_000.0),
            })
        } else {
            None
        };
        let moe = if arch == "qwen3moe" {
            Some(Moe {
                n_expert: u("expert_count")?,
                n_expert_used: u("expert_used_count")?,
                n_ff_expert: u("expert_feed_forward_length")?,
                norm_top_k: true,
            })
        } else {
            None
        };
        let cfg = Self {
            n_layers: u("block_count")?,
            n_embd,
            n_ff: u("feed_forward_length")?,
            n_head,
            n_head_kv: u("attention.head_count_kv")?,
            head_dim,
            rms_eps: file.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_base: file
                .get_opt_f32(&key("rope.freq_base"))?
                .unwrap_or(if gemma { 1_000_000.0 } else { 10_000.0 }),
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
            qk_norm: arch != "llama",
            post_norms: gemma,
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
            && cfg.sliding_window.as_ref().is_none_or(|w| w.window > 0)
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

    /// Whether layer `il` uses the sliding window (llama.cpp gemma3: `(il + 1) % 6 != 0`).
    pub fn is_local(&self, il: usize) -> bool {
        self.sliding_window
            .as_ref()
            .is_some_and(|w| !(il + 1).is_multiple_of(w.pattern))
    }
}

struct Layer {
    attn_norm: Tensor<1>,
    qkv: Qkv,
    wo: GgmlLinear,
    /// `[q_norm, k_norm]` where the architecture has them.
    qk_norm: Option<[Tensor<1>; 2]>,
    /// `[post_attention_norm, post_ffw_norm]` where the architecture has them.
    post_norms: Option<[Tensor<1>; 2]>,
    ffn_norm: Tensor<1>,
    ffn: Ffn,
}

/// A layer's Q, K and V projections, their weights' rows stacked where the types allow
/// ([`GgufLoader::stacked_linear`]), so they run as one or two GEMVs instead of three.
// One per layer and long-lived, so the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Qkv {
    /// `[q; k; v]` in one weight.
    Stacked(GgmlLinear),
    /// `[q; k]` in one weight, `v` apart (Gemma 3's Q4_K_M mix: Q5_0 Q and K, Q8_0 V).
    StackedQk(GgmlLinear, GgmlLinear),
    /// Each apart.
    Each([GgmlLinear; 3]),
}

impl Qkv {
    fn load(loader: &GgufLoader, q: &str, k: &str, v: &str) -> Result<Self, Error> {
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

    /// The projections of `h` `[n, n_embd]`: `(qk, v, layout)` with the query heads at
    /// columns `0..n_head * head_dim` of `qk`, the key heads at `layout.k_off`, the value heads
    /// at `layout.v_off` of `v` (the same tensor as `qk` when stacked). `layout` leaves `n`,
    /// `slots`, `capacity` and `positions` for the caller.
    fn forward(&self, h: Tensor<2>, c: &DecoderConfig) -> (Tensor<2>, Tensor<2>, QkRopeShape) {
        let (q, kv) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let layout = |qk_stride, v_stride, v_off| QkRopeShape {
            n: 0,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            qk_stride,
            k_off: q,
            v_stride,
            v_off,
            slots: 0,
            capacity: 0,
            positions: 0,
        };
        match self {
            Self::Stacked(w) => {
                let y = w.forward(h);
                (y.clone(), y, layout(q + 2 * kv, q + 2 * kv, q + kv))
            }
            Self::StackedQk(wqk, wv) => {
                (wqk.forward(h.clone()), wv.forward(h), layout(q + kv, kv, 0))
            }
            Self::Each([wq, wk, wv]) => {
                let qk = Tensor::cat(vec![wq.forward(h.clone()), wk.forward(h.clone())], 1);
                (qk, wv.forward(h), layout(q + kv, kv, 0))
            }
        }
    }
}

/// A dense FFN's gate and up projections, stacked into one weight where the types allow.
#[allow(clippy::large_enum_variant)]
enum GateUp {
    /// `[gate; up]` in one weight.
    Stacked(GgmlLinear),
    /// Each apart.
    Each(GgmlLinear, GgmlLinear),
}

/// A layer's feed-forward network.
// One per layer and long-lived, so the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Ffn {
    /// `down(act(gate x) * up x)`.
    Dense { gate_up: GateUp, down: GgmlLinear },
    /// Routed experts: `router` `[n_expert, n_embd]` (`ffn_gate_inp`).
    Moe {
        router: Tensor<2>,
        experts: GgmlExperts,
    },
}

/// A decoder-only language model with packed weights on one device.
pub struct Decoder {
    config: DecoderConfig,
    embed: GgmlEmbedding,
    layers: Vec<Layer>,
    output_norm: Tensor<1>,
    head: GgmlLinear,
    /// `rope_freqs.weight` (`head_dim / 2` frequency divisors, Llama 3.1+), if present.
    rope_freqs: Option<Vec<f32>>,
    /// RoPE angle tables on the device, `[global, local]` (the same table twice without a
    /// sliding window), built for the positions used so far and grown with them.
    rope: Mutex<Option<[RopeTable; 2]>>,
    device: Device,
}

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
        for il in 0..config.n_layers {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            // Checked on the file before Q/K/V are stacked into one weight.
            let (e, hd) = (config.n_embd, config.head_dim);
            for (name, rows) in [
                ("attn_q", config.n_head * hd),
                ("attn_k", config.n_head_kv * hd),
                ("attn_v", config.n_head_kv * hd),
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
            let pair = |a: &str, b: &str| -> Result<[Tensor<1>; 2], Error> {
                Ok([loader.dense(&n(a))?, loader.dense(&n(b))?])
            };
            layers.push(Layer {
                attn_norm: loader.dense(&n("attn_norm"))?,
                qkv: Qkv::load(loader, &n("attn_q"), &n("attn_k"), &n("attn_v"))?,
                wo: loader.linear(&n("attn_output"))?,
                qk_norm: match config.qk_norm {
                    true => Some(pair("attn_q_norm", "attn_k_norm")?),
                    false => None,
                },
                post_norms: match config.post_norms {
                    true => Some(pair("post_attention_norm", "post_ffw_norm")?),
                    false => None,
                },
                ffn_norm: loader.dense(&n("ffn_norm"))?,
                ffn: match config.moe {
                    None => Ffn::Dense {
                        gate_up: match loader.stacked_linear(&[&n("ffn_gate"), &n("ffn_up")])? {
                            Some(w) => GateUp::Stacked(w),
                            None => GateUp::Each(
                                loader.linear(&n("ffn_gate"))?,
                                loader.linear(&n("ffn_up"))?,
                            ),
                        },
                        down: loader.linear(&n("ffn_down"))?,
                    },
                    Some(_) => Ffn::Moe {
                        router: loader.dense(&n("ffn_gate_inp"))?,
                        experts: if file.tensor(&n("ffn_gate_up_exps")).is_some() {
                            loader.experts_merged(&n("ffn_gate_up_exps"), &n("ffn_down_exps"))?
                        } else {
                            loader.experts(
                                &n("ffn_gate_exps"),
                                &n("ffn_up_exps"),
                                &n("ffn_down_exps"),
                            )?
                        },
                    },
                },
            });
        }
        let output_norm = loader.dense("output_norm.weight")?;
        // Tied embeddings (case C14): no `output.weight`, the head reuses `token_embd`.
        let head = if file.tensor("output.weight").is_some() {
            loader.linear("output.weight")?
        } else {
            embed.as_linear()
        };
        let rope_freqs = match file.tensor("rope_freqs.weight") {
            None => None,
            Some(_) => {
                let t: Tensor<1> = loader.dense("rope_freqs.weight")?;
                let f = t
                    .try_into_data()
                    .map_err(|e| Error::Device(format!("{e:?}")))?
                    .try_to_vec::<f32>()
                    .map_err(|e| Error::Device(format!("{e:?}")))?;
                if f.len() != config.head_dim / 2 || f.iter().any(|x| !(x.is_finite() && *x > 0.0))
                {
                    return Err(Error::Model(format!(
                        "rope_freqs.weight: {} values, expected {} positive ones",
                        f.len(),
                        config.head_dim / 2
                    )));
                }
                Some(f)
            }
        };
        let model = Self {
            config,
            embed,
            layers,
            output_norm,
            head,
            rope_freqs,
            rope: Mutex::new(None),
            device: loader.device().clone(),
        };
        model.check_shapes()?;
        Ok(model)
    }

    fn check_shapes(&self) -> Result<(), Error> {
        let c = &self.config;
        let (e, hd) = (c.n_embd, c.head_dim);
        let expect = |what: String, got: [usize; 2], want: [usize; 2]| {
            if got == want {
                Ok(())
            } else {
                Err(Error::Model(format!(
                    "{what}: shape {got:?}, expected {want:?}"
                )))
            }
        };
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
        for (il, l) in self.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            expect(n("attn_output"), l.wo.weight.shape(), [e, c.n_head * hd])?;
            match (&l.ffn, &c.moe) {
                (Ffn::Dense { gate_up, down }, _) => {
                    match gate_up {
                        GateUp::Stacked(w) => {
                            expect(n("ffn_gate + ffn_up"), w.weight.shape(), [2 * c.n_ff, e])?
                        }
                        GateUp::Each(gate, up) => {
                            expect(n("ffn_gate"), gate.weight.shape(), [c.n_ff, e])?;
                            expect(n("ffn_up"), up.weight.shape(), [c.n_ff, e])?;
                        }
                    }
                    expect(n("ffn_down"), down.weight.shape(), [e, c.n_ff])?;
                }
                (Ffn::Moe { router, experts }, Some(m)) => {
                    expect(n("ffn_gate_inp"), router.dims(), [m.n_expert, e])?;
                    if experts.n_expert() != m.n_expert {
                        return Err(Error::Model(format!(
                            "{}: {} experts, expected {}",
                            n("ffn_down_exps"),
                            experts.n_expert(),
                            m.n_expert
                        )));
                    }
                    expect(n("ffn_gate_exps"), experts.ffn_shape(), [m.n_ff_expert, e])?;
                }
                (Ffn::Moe { .. }, None) => {
                    return Err(Error::Model(format!(
                        "{}: a MoE layer without a MoE config",
                        n("ffn")
                    )));
                }
            }
            let mut norms = vec![("attn_norm", &l.attn_norm, e), ("ffn_norm", &l.ffn_norm, e)];
            if let Some([q, k]) = &l.qk_norm {
                norms.extend([("attn_q_norm", q, hd), ("attn_k_norm", k, hd)]);
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

    /// The model's hyper-parameters.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The layers' state kinds, for [`SequenceState`] to allocate.
    fn layer_kinds(&self) -> Vec<LayerKind> {
        let c = &self.config;
        vec![
            LayerKind::Attention {
                n_head_kv: c.n_head_kv,
                head_dim: c.head_dim,
            };
            c.n_layers
        ]
    }

    /// RoPE tables `[global, local]` covering at least `positions` positions, built on first
    /// use and rebuilt (at least doubled, at most `context_length`) when a longer sequence
    /// comes.
    fn rope_tables(&self, positions: usize) -> [RopeTable; 2] {
        let mut tables = self.rope.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = tables.as_ref().filter(|t| t[0].positions() >= positions) {
            return t.clone();
        }
        let c = &self.config;
        let have = tables.as_ref().map_or(0, |t| t[0].positions());
        let n = positions
            .max(2 * have)
            .max(crate::state::CAPACITY_STEP)
            .min(c.context_length)
            .max(positions);
        let (hd, dev) = (c.head_dim, &self.device);
        let global = RopeTable::new(n, hd, c.rope_base, self.rope_freqs.as_deref(), dev);
        // llama.cpp gemma3: the local layers use their own base and no frequency scaling.
        let local = match &c.sliding_window {
            Some(w) => RopeTable::new(n, hd, w.rope_base, None, dev),
            None => global.clone(),
        };
        let t = [global, local];
        *tables = Some(t.clone());
        t
    }

    /// Runs `ids` (the next tokens after those in `state`) and appends them to `state`.
    /// Returns logits `[ids.len(), vocab]` when `all_logits`, else `[1, vocab]` for the last
    /// token only.
    ///
    /// Per layer on a CubeCL device: the residual add and norm as one kernel, Q/K/V as one to
    /// three GEMVs (stacked weights), Q/K norm + RoPE + the KV-cache write as one kernel,
    /// attention as one kernel over the preallocated cache, the output projection, the
    /// residual step, gate/up as one GEMV, the activation, and down.
    ///
    /// # Errors
    /// Empty `ids`, a token id not below the vocabulary size, or a context past
    /// `context_length`. A failure part way through a pass leaves `state` empty.
    pub fn forward(
        &self,
        ids: &[u32],
        state: &mut SequenceState,
        all_logits: bool,
    ) -> Result<Tensor<2>, Error> {
        self.forward_batch(&mut state.0, &[(0, ids)], all_logits)
    }

    /// Runs several sequences in one pass: `seqs` holds `(slot, ids)` pairs, each slot's
    /// `ids` the next tokens after those its slot of `state` holds (at most one entry per
    /// slot). The projections take all the rows at once (the fused GEMV reads each weight once
    /// per 8 rows), and each layer's KV-cache write and attention is one launch over every
    /// slot. Returns the logits of each sequence's last token `[seqs.len(), vocab]`, or of
    /// every row (`[sum of ids.len(), vocab]`, in `seqs` order) when `all_logits`.
    ///
    /// A row's result does not depend on the other rows of the pass: each row's norms,
    /// products and attention are computed alone, in the same order.
    ///
    /// # Errors
    /// No sequence, empty `ids`, a slot out of range or named twice, a token id not below the
    /// vocabulary size, or a context past `context_length`. A failure part way through a pass
    /// leaves every slot of `state` empty.
    pub fn forward_batch(
        &self,
        state: &mut BatchState,
        seqs: &[(usize, &[u32])],
        all_logits: bool,
    ) -> Result<Tensor<2>, Error> {
        let c = &self.config;
        if seqs.is_empty() || seqs.iter().any(|(_, ids)| ids.is_empty()) {
            return Err(Error::Model("forward needs at least one token".into()));
        }
        let mut rows = Vec::new();
        let mut lens = state.lens().to_vec();
        let mut seen = vec![false; lens.len()];
        let mut last_rows = Vec::with_capacity(seqs.len());
        let mut ids = Vec::new();
        for &(slot, seq_ids) in seqs {
            let Some(len) = lens.get_mut(slot) else {
                return Err(Error::Model(format!(
                    "slot {slot} is out of range: the state holds {} sequences",
                    state.slots()
                )));
            };
            if seen[slot] {
                return Err(Error::Model(format!(
                    "slot {slot} is named twice in one pass"
                )));
            }
            seen[slot] = true;
            let past = *len;
            let total = past + seq_ids.len();
            if total > c.context_length {
                return Err(Error::Model(format!(
                    "context of {total} tokens exceeds the model's {}",
                    c.context_length
                )));
            }
            rows.extend((past..total).map(|p| (slot, p)));
            ids.extend_from_slice(seq_ids);
            last_rows.push(rows.len() - 1);
            *len = total;
        }
        let n = ids.len();
        let end = rows.iter().map(|r| r.1 + 1).max().unwrap_or(0);
        let dev = &self.device;
        state.reserve(end, c.context_length, &self.layer_kinds(), dev);
        let (slots, capacity) = (state.slots(), state.capacity());
        let tables = self.rope_tables(end);
        let rows = CacheRows::new(rows, dev);
        let (hd, eps) = (c.head_dim, c.rms_eps);
        let scale = 1.0 / (hd as f32).sqrt();

        let mut x = self.embed.forward(&ids)?;
        if let Some(s) = c.embed_scale {
            x = x * s;
        }
        let first_norm = self
            .layers
            .first()
            .map_or(&self.output_norm, |l| &l.attn_norm);
        let mut h = burn_gguf::rms_norm(x.clone(), first_norm, eps);
        let old = state.take_layers();
        let mut layers = Vec::with_capacity(old.len());
        for ((il, l), layer_state) in self.layers.iter().enumerate().zip(old) {
            let LayerState::Attention {
                k: k_cache,
                v: v_cache,
            } = layer_state
            else {
                return Err(Error::Model(format!("layer {il} holds no KV cache")));
            };
            let local = c.is_local(il);
            let (qk, v, layout) = l.qkv.forward(h, c);
            let layout = QkRopeShape {
                n,
                slots,
                capacity,
                ..layout
            };
            let norm = l.qk_norm.as_ref().map(|[q, k]| QkNorm { q, k, eps });
            let table = &tables[usize::from(local)];
            let (q, k_cache, v_cache) = qk_rope_cache(
                qk,
                v,
                norm,
                table,
                c.rope_style,
                k_cache,
                v_cache,
                &rows,
                layout,
            );
            let window = if local {
                c.sliding_window.as_ref().map(|w| w.window)
            } else {
                None
            };
            let shape = AttentionShape {
                n,
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                head_dim: hd,
                slots,
                capacity,
                window,
                keys: 0,
            };
            let attn = attention(q, &k_cache, &v_cache, &rows, shape, scale);
            layers.push(LayerState::Attention {
                k: k_cache,
                v: v_cache,
            });
            let o = l.wo.forward(attn);
            let post = l.post_norms.as_ref();
            let (x_mid, h_ffn) = add_rms_norm(x, o, post.map(|[a, _]| a), &l.ffn_norm, eps);
            let d = match &l.ffn {
                Ffn::Dense { gate_up, down } => down.forward(match gate_up {
                    GateUp::Stacked(w) => w.forward_gated(h_ffn, c.activation),
                    GateUp::Each(gate, up) => {
                        gated(gate.forward(h_ffn.clone()), up.forward(h_ffn), c.activation)
                    }
                }),
                Ffn::Moe { router, experts } => {
                    let m = c
                        .moe
                        .as_ref()
                        .ok_or_else(|| Error::Model("a MoE layer without a MoE config".into()))?;
                    // Routing and experts on the device: nothing read back.
                    let logits = h_ffn.clone().matmul(router.clone().transpose());
                    let (weights, ids) = moe_route(logits, m.n_expert_used, m.norm_top_k);
                    experts.forward(h_ffn, ids, weights)?
                }
            };
            // The next layer's attention norm, or after the last layer the output norm.
            let next = self
                .layers
                .get(il + 1)
                .map_or(&self.output_norm, |n| &n.attn_norm);
            (x, h) = add_rms_norm(x_mid, d, post.map(|[_, f]| f), next, eps);
        }
        state.put_layers(layers, lens);
        drop(x);
        let h = if all_logits || last_rows.len() == n {
            h
        } else if let [last] = last_rows[..] {
            h.narrow(0, last, 1)
        } else {
            let at: Vec<i64> = last_rows.iter().map(|&r| r as i64).collect();
            let at = Tensor::<1, burn::tensor::Int>::from_data(
                burn::tensor::TensorData::new(at, [last_rows.len()]),
                dev,
            );
            h.select(0, at)
        };
        Ok(self.head.forward(h))
    }
}

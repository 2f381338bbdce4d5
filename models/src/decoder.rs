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
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Tensor, TensorData};
use burn_gguf::{GgmlEmbedding, GgmlExperts, GgmlLinear, GgufLoader};
use gguf::GgufFile;

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
    wq: GgmlLinear,
    wk: GgmlLinear,
    wv: GgmlLinear,
    wo: GgmlLinear,
    /// `[q_norm, k_norm]` where the architecture has them.
    qk_norm: Option<[Tensor<1>; 2]>,
    /// `[post_attention_norm, post_ffw_norm]` where the architecture has them.
    post_norms: Option<[Tensor<1>; 2]>,
    ffn_norm: Tensor<1>,
    ffn: Ffn,
}

/// A layer's feed-forward network.
// One per layer and long-lived, so the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Ffn {
    /// `down(act(gate x) * up x)`.
    Dense {
        gate: GgmlLinear,
        up: GgmlLinear,
        down: GgmlLinear,
    },
    /// Routed experts: `router` `[n_expert, n_embd]` (`ffn_gate_inp`).
    Moe {
        router: Tensor<2>,
        experts: GgmlExperts,
    },
}

/// Keys and values of the tokens seen so far, per layer: `[n_head_kv, len, head_dim]` each.
#[derive(Clone, Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor<3>, Tensor<3>)>>,
    len: usize,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the first `len` tokens (no-op when `len >= self.len()`), so a conversation reuses
    /// the keys and values of its common prefix.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for layer in &mut self.layers {
            *layer = match layer.take() {
                Some((k, v)) if len > 0 => Some((k.narrow(1, 0, len), v.narrow(1, 0, len))),
                _ => None,
            };
        }
        self.len = len;
    }
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
    device: Device,
}

/// Rotary position embedding tables for positions `start..start + n`: `cos` and `sin` of
/// `pos * base^(-2i/d) / freq_factors[i]`, each `[n, d/2]` (angles in f64).
#[derive(Clone, Debug)]
pub struct Rope {
    cos: Tensor<2>,
    sin: Tensor<2>,
    style: RopeStyle,
}

impl Rope {
    /// Tables for `n` positions from `start`, heads of `head_dim`; `freq_factors` (`head_dim / 2`
    /// values, llama.cpp `rope_freqs`) divide the frequencies where given.
    pub fn new(
        start: usize,
        n: usize,
        head_dim: usize,
        base: f32,
        style: RopeStyle,
        freq_factors: Option<&[f32]>,
        device: &Device,
    ) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in start..start + n {
            for i in 0..half {
                let factor = freq_factors.map_or(1.0, |f| f[i] as f64);
                let theta = (base as f64).powf(-2.0 * i as f64 / head_dim as f64) / factor;
                let a = p as f64 * theta;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Self {
            cos: Tensor::from_data(TensorData::new(cos, [n, half]), device),
            sin: Tensor::from_data(TensorData::new(sin, [n, half]), device),
            style,
        }
    }

    /// Rotates `x` `[n, heads, head_dim]` ([`burn_gguf::rope`]).
    pub fn apply(&self, x: Tensor<3>) -> Tensor<3> {
        burn_gguf::rope(x, &self.cos, &self.sin, self.style)
    }
}

/// The top `n_expert_used` experts of each row of `probs` (`[n, n_expert]`, softmax of the
/// router logits), highest first, with their probabilities, renormalised to sum to 1 when
/// `norm_top_k` (llama.cpp `build_moe_ffn` with `norm_w`). Returns `(ids, weights)`, `[n, k]`
/// row-major each.
fn route(probs: &[f32], moe: &Moe) -> (Vec<u32>, Vec<f32>) {
    let (ne, k) = (moe.n_expert, moe.n_expert_used);
    let mut ids = Vec::with_capacity(probs.len() / ne * k);
    let mut weights = Vec::with_capacity(ids.capacity());
    for row in probs.chunks_exact(ne) {
        let mut order: Vec<usize> = (0..ne).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let top = &order[..k];
        let sum: f32 = top.iter().map(|&e| row[e]).sum();
        for &e in top {
            ids.push(e as u32);
            weights.push(if moe.norm_top_k { row[e] / sum } else { row[e] });
        }
    }
    (ids, weights)
}

/// Additive mask `[n, total]` for queries at positions `past..past + n` over keys `0..total`:
/// causal, and within `window` tokens when given.
fn attention_mask(
    past: usize,
    n: usize,
    window: Option<usize>,
    device: &Device,
) -> Option<Tensor<2>> {
    let total = past + n;
    let limited = window.is_some_and(|w| total > w);
    if n == 1 && !limited {
        return None;
    }
    let mut m = vec![0.0f32; n * total];
    for t in 0..n {
        let p = past + t;
        for s in 0..total {
            let visible = s <= p && window.is_none_or(|w| p - s < w);
            if !visible {
                m[t * total + s] = f32::NEG_INFINITY;
            }
        }
    }
    Some(Tensor::from_data(TensorData::new(m, [n, total]), device))
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
            let pair = |a: &str, b: &str| -> Result<[Tensor<1>; 2], Error> {
                Ok([loader.dense(&n(a))?, loader.dense(&n(b))?])
            };
            layers.push(Layer {
                attn_norm: loader.dense(&n("attn_norm"))?,
                wq: loader.linear(&n("attn_q"))?,
                wk: loader.linear(&n("attn_k"))?,
                wv: loader.linear(&n("attn_v"))?,
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
                        gate: loader.linear(&n("ffn_gate"))?,
                        up: loader.linear(&n("ffn_up"))?,
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
            expect(n("attn_q"), l.wq.weight.shape(), [c.n_head * hd, e])?;
            expect(n("attn_k"), l.wk.weight.shape(), [c.n_head_kv * hd, e])?;
            expect(n("attn_v"), l.wv.weight.shape(), [c.n_head_kv * hd, e])?;
            expect(n("attn_output"), l.wo.weight.shape(), [e, c.n_head * hd])?;
            match (&l.ffn, &c.moe) {
                (Ffn::Dense { gate, up, down }, _) => {
                    expect(n("ffn_gate"), gate.weight.shape(), [c.n_ff, e])?;
                    expect(n("ffn_up"), up.weight.shape(), [c.n_ff, e])?;
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
                    expect(
                        n("ffn_gate_exps"),
                        experts.gate[0].shape(),
                        [m.n_ff_expert, e],
                    )?;
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

    /// Runs `ids` (the next tokens after those in `cache`) and appends them to `cache`.
    /// Returns logits `[ids.len(), vocab]` when `all_logits`, else `[1, vocab]` for the last
    /// token only.
    ///
    /// # Errors
    /// Empty `ids`, a token id not below the vocabulary size, or a context past
    /// `context_length`.
    pub fn forward(
        &self,
        ids: &[u32],
        cache: &mut KvCache,
        all_logits: bool,
    ) -> Result<Tensor<2>, Error> {
        let c = &self.config;
        let n = ids.len();
        if n == 0 {
            return Err(Error::Model("forward needs at least one token".into()));
        }
        let past = cache.len;
        if past + n > c.context_length {
            return Err(Error::Model(format!(
                "context of {} tokens exceeds the model's {}",
                past + n,
                c.context_length
            )));
        }
        if cache.layers.len() != c.n_layers {
            cache.layers = (0..c.n_layers).map(|_| None).collect();
        }
        let dev = &self.device;
        let (hd, nh, nkv) = (c.head_dim, c.n_head, c.n_head_kv);
        let rep = nh / nkv;
        let scale = 1.0 / (hd as f64).sqrt();
        let total = past + n;

        let mut x = self.embed.forward(ids)?;
        if let Some(s) = c.embed_scale {
            x = x * s;
        }
        let factors = self.rope_freqs.as_deref();
        let rope_global = Rope::new(past, n, hd, c.rope_base, c.rope_style, factors, dev);
        let mask_global = attention_mask(past, n, None, dev);
        let (rope_local, mask_local) = match &c.sliding_window {
            // llama.cpp gemma3: the local layers use their own base and no frequency scaling.
            Some(w) => (
                Rope::new(past, n, hd, w.rope_base, c.rope_style, None, dev),
                attention_mask(past, n, Some(w.window), dev),
            ),
            None => (rope_global.clone(), mask_global.clone()),
        };

        for (il, l) in self.layers.iter().enumerate() {
            let local = c.is_local(il);
            let rope = if local { &rope_local } else { &rope_global };
            let mask = if local { &mask_local } else { &mask_global };

            let h = rms_norm(x.clone(), &l.attn_norm, c.rms_eps);
            let mut q = l.wq.forward(h.clone()).reshape([n, nh, hd]);
            let mut k = l.wk.forward(h.clone()).reshape([n, nkv, hd]);
            if let Some([qn, kn]) = &l.qk_norm {
                q = rms_norm(q, qn, c.rms_eps);
                k = rms_norm(k, kn, c.rms_eps);
            }
            let v = l.wv.forward(h).reshape([n, nkv, hd]);
            let q = rope.apply(q).swap_dims(0, 1); // [nh, n, hd]
            let k = rope.apply(k).swap_dims(0, 1); // [nkv, n, hd]
            let v = v.swap_dims(0, 1);
            let (k, v) = match cache.layers[il].take() {
                Some((pk, pv)) => (Tensor::cat(vec![pk, k], 1), Tensor::cat(vec![pv, v], 1)),
                None => (k, v),
            };
            cache.layers[il] = Some((k.clone(), v.clone()));

            // Grouped-query attention: query heads g*rep..(g+1)*rep share kv head g.
            let qg = q.reshape([nkv, rep * n, hd]);
            let scores = qg.matmul(k.swap_dims(1, 2)) * scale; // [nkv, rep*n, total]
            let mut scores = scores.reshape([nkv, rep, n, total]);
            if let Some(m) = mask {
                scores = scores + m.clone().unsqueeze::<4>();
            }
            let probs = softmax(scores, 3).reshape([nkv, rep * n, total]);
            let attn = probs
                .matmul(v)
                .reshape([nh, n, hd])
                .swap_dims(0, 1)
                .reshape([n, nh * hd]);
            let mut o = l.wo.forward(attn);
            if let Some([post_attn, _]) = &l.post_norms {
                o = rms_norm(o, post_attn, c.rms_eps);
            }
            x = x + o;

            let h = rms_norm(x.clone(), &l.ffn_norm, c.rms_eps);
            let mut d = match &l.ffn {
                Ffn::Dense { gate, up, down } => {
                    let g = gate.forward(h.clone());
                    down.forward(burn_gguf::gated(g, up.forward(h), c.activation))
                }
                Ffn::Moe { router, experts } => {
                    let m = c
                        .moe
                        .as_ref()
                        .ok_or_else(|| Error::Model("a MoE layer without a MoE config".into()))?;
                    let probs = softmax(h.clone().matmul(router.clone().transpose()), 1);
                    let probs = probs
                        .try_into_data()
                        .map_err(|e| Error::Device(format!("{e:?}")))?
                        .try_to_vec::<f32>()
                        .map_err(|e| Error::Device(format!("{e:?}")))?;
                    let (ids, weights) = route(&probs, m);
                    experts.forward(h, &ids, &weights, m.n_expert_used)?
                }
            };
            if let Some([_, post_ffw]) = &l.post_norms {
                d = rms_norm(d, post_ffw, c.rms_eps);
            }
            x = x + d;
        }
        cache.len = total;

        let x = if all_logits { x } else { x.narrow(0, n - 1, 1) };
        let x = rms_norm(x, &self.output_norm, c.rms_eps);
        Ok(self.head.forward(x))
    }
}

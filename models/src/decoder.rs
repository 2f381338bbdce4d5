//! Gemma 3 (llama.cpp architecture `gemma3`) over packed ggml weights.
//!
//! The graph follows llama.cpp `src/models/gemma3.cpp`: embeddings scaled by `sqrt(n_embd)`;
//! per layer RMSNorm (the GGUF norm weights already hold Gemma's `1 + w`), Q/K/V, per-head
//! RMSNorm of Q and K, NEOX RoPE, grouped-query attention scaled by `1/sqrt(key_length)`, a
//! post-attention norm, then RMSNorm, `GELU_tanh(gate) * up`, down and a post-FFN norm; a final
//! norm and the output head (tied to `token_embd` when `output.weight` is absent).
//! Five of every six layers use a sliding window (`attention.sliding_window`) with RoPE base
//! `rope.freq_base_swa` (default 10 000, llama.cpp's built-in value: the key is usually absent);
//! every sixth layer is global with `rope.freq_base` (case C17).
use crate::Error;
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Tensor, TensorData};
use burn_gguf::{GgmlEmbedding, GgmlLinear, GgufLoader};
use gguf::GgufFile;

/// Hyper-parameters of a Gemma 3 model, from the GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Config {
    /// `gemma3.block_count`.
    pub n_layers: usize,
    /// `gemma3.embedding_length`.
    pub n_embd: usize,
    /// `gemma3.feed_forward_length`.
    pub n_ff: usize,
    /// `gemma3.attention.head_count`.
    pub n_head: usize,
    /// `gemma3.attention.head_count_kv`.
    pub n_head_kv: usize,
    /// `gemma3.attention.key_length` (= value_length).
    pub head_dim: usize,
    /// `gemma3.attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// `gemma3.rope.freq_base`, used by the global layers.
    pub rope_base_global: f32,
    /// `gemma3.rope.freq_base_swa` or 10 000, used by the sliding-window layers.
    pub rope_base_local: f32,
    /// `gemma3.attention.sliding_window` (tokens a query sees, itself included).
    pub sliding_window: usize,
    /// Every `swa_pattern`-th layer (1-based) is global.
    pub swa_pattern: usize,
    /// `gemma3.context_length`.
    pub context_length: usize,
    /// Vocabulary size (rows of `token_embd`).
    pub vocab_size: usize,
}

impl Gemma3Config {
    /// Reads the config from `file` (architecture must be `gemma3`).
    ///
    /// # Errors
    /// Wrong architecture, or a missing / mistyped / inconsistent key (named in the error).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, Error> {
        let arch = file.architecture()?;
        if arch != "gemma3" {
            return Err(Error::Model(format!("architecture '{arch}' is not gemma3")));
        }
        let u = |k: &str| -> Result<usize, Error> {
            Ok(file.get_u32(&format!("gemma3.{k}"))? as usize)
        };
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let head_dim = match file.get_opt_u32("gemma3.attention.key_length")? {
            Some(k) => k as usize,
            None => n_embd / n_head.max(1),
        };
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::Model("tensor 'token_embd.weight' is missing".into()))?;
        let cfg = Self {
            n_layers: u("block_count")?,
            n_embd,
            n_ff: u("feed_forward_length")?,
            n_head,
            n_head_kv: u("attention.head_count_kv")?,
            head_dim,
            rms_eps: file.get_f32("gemma3.attention.layer_norm_rms_epsilon")?,
            rope_base_global: file
                .get_opt_f32("gemma3.rope.freq_base")?
                .unwrap_or(1_000_000.0),
            rope_base_local: file
                .get_opt_f32("gemma3.rope.freq_base_swa")?
                .unwrap_or(10_000.0),
            sliding_window: file
                .get_opt_u32("gemma3.attention.sliding_window")?
                .unwrap_or(512) as usize,
            swa_pattern: 6,
            context_length: u("context_length")?,
            vocab_size: embd.shape()[0],
        };
        let ok = cfg.n_layers > 0
            && cfg.n_layers <= 1024
            && cfg.n_head > 0
            && cfg.n_head_kv > 0
            && cfg.n_head.is_multiple_of(cfg.n_head_kv)
            && cfg.head_dim > 0
            && cfg.head_dim.is_multiple_of(2)
            && cfg.sliding_window > 0;
        if !ok {
            return Err(Error::Model(format!(
                "inconsistent gemma3 hyper-parameters: {cfg:?}"
            )));
        }
        Ok(cfg)
    }

    /// Whether layer `il` uses the sliding window (llama.cpp: `(il + 1) % 6 != 0`).
    pub fn is_local(&self, il: usize) -> bool {
        !(il + 1).is_multiple_of(self.swa_pattern)
    }
}

struct Layer {
    attn_norm: Tensor<1>,
    wq: GgmlLinear,
    wk: GgmlLinear,
    wv: GgmlLinear,
    wo: GgmlLinear,
    q_norm: Tensor<1>,
    k_norm: Tensor<1>,
    post_attn_norm: Tensor<1>,
    ffn_norm: Tensor<1>,
    gate: GgmlLinear,
    up: GgmlLinear,
    down: GgmlLinear,
    post_ffw_norm: Tensor<1>,
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
}

/// A Gemma 3 model with packed weights on one device.
pub struct Gemma3 {
    config: Gemma3Config,
    embed: GgmlEmbedding,
    layers: Vec<Layer>,
    output_norm: Tensor<1>,
    head: GgmlLinear,
    device: Device,
}

fn rms_norm<const D: usize>(x: Tensor<D>, w: &Tensor<1>, eps: f32) -> Tensor<D> {
    let inv = (x.clone().powi_scalar(2).mean_dim(D - 1) + eps)
        .sqrt()
        .recip();
    x * inv * w.clone().unsqueeze::<D>()
}

/// ggml's GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
fn gelu_tanh<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
    let x3 = x.clone() * x.clone() * x.clone();
    let inner = (x.clone() + x3 * 0.044715) * SQRT_2_OVER_PI;
    x * (inner.tanh() + 1.0) * 0.5
}

/// cos and sin of NEOX RoPE angles `pos * base^(-2i/d)` for positions `start..start + n`,
/// each `[n, 1, d/2]`; angles in f64 as the reference does.
fn rope_tables(
    start: usize,
    n: usize,
    head_dim: usize,
    base: f32,
    device: &Device,
) -> (Tensor<3>, Tensor<3>) {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(n * half);
    let mut sin = Vec::with_capacity(n * half);
    for p in start..start + n {
        for i in 0..half {
            let theta = (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let a = p as f64 * theta;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (
        Tensor::from_data(TensorData::new(cos, [n, 1, half]), device),
        Tensor::from_data(TensorData::new(sin, [n, 1, half]), device),
    )
}

/// NEOX rotation of `x` `[n, heads, d]`: pairs `(i, i + d/2)`.
fn rope(x: Tensor<3>, cos: &Tensor<3>, sin: &Tensor<3>) -> Tensor<3> {
    let [_, _, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().narrow(2, 0, half);
    let x2 = x.narrow(2, half, half);
    let r1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
    let r2 = x1 * sin.clone() + x2 * cos.clone();
    Tensor::cat(vec![r1, r2], 2)
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

impl Gemma3 {
    /// Loads a Gemma 3 model from `loader`'s file.
    ///
    /// # Errors
    /// Missing keys or tensors, or shapes that do not match the config.
    pub fn load(loader: &GgufLoader) -> Result<Self, Error> {
        let file = loader.file();
        let config = Gemma3Config::from_gguf(file)?;
        let embed = loader.embedding("token_embd.weight")?;
        let mut layers = Vec::with_capacity(config.n_layers);
        for il in 0..config.n_layers {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            layers.push(Layer {
                attn_norm: loader.dense(&n("attn_norm"))?,
                wq: loader.linear(&n("attn_q"))?,
                wk: loader.linear(&n("attn_k"))?,
                wv: loader.linear(&n("attn_v"))?,
                wo: loader.linear(&n("attn_output"))?,
                q_norm: loader.dense(&n("attn_q_norm"))?,
                k_norm: loader.dense(&n("attn_k_norm"))?,
                post_attn_norm: loader.dense(&n("post_attention_norm"))?,
                ffn_norm: loader.dense(&n("ffn_norm"))?,
                gate: loader.linear(&n("ffn_gate"))?,
                up: loader.linear(&n("ffn_up"))?,
                down: loader.linear(&n("ffn_down"))?,
                post_ffw_norm: loader.dense(&n("post_ffw_norm"))?,
            });
        }
        let output_norm = loader.dense("output_norm.weight")?;
        // Tied embeddings (case C14): no `output.weight`, the head reuses `token_embd`.
        let head = if file.tensor("output.weight").is_some() {
            loader.linear("output.weight")?
        } else {
            embed.as_linear()
        };
        let model = Self {
            config,
            embed,
            layers,
            output_norm,
            head,
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
            expect(n("ffn_gate"), l.gate.weight.shape(), [c.n_ff, e])?;
            expect(n("ffn_up"), l.up.weight.shape(), [c.n_ff, e])?;
            expect(n("ffn_down"), l.down.weight.shape(), [e, c.n_ff])?;
            for (name, t, len) in [
                ("attn_norm", &l.attn_norm, e),
                ("attn_q_norm", &l.q_norm, hd),
                ("attn_k_norm", &l.k_norm, hd),
                ("post_attention_norm", &l.post_attn_norm, e),
                ("ffn_norm", &l.ffn_norm, e),
                ("post_ffw_norm", &l.post_ffw_norm, e),
            ] {
                expect(n(name), [t.dims()[0], 1], [len, 1])?;
            }
        }
        Ok(())
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Gemma3Config {
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

        let mut x = self.embed.forward(ids)? * (c.n_embd as f64).sqrt();
        let rope_local = rope_tables(past, n, hd, c.rope_base_local, dev);
        let rope_global = rope_tables(past, n, hd, c.rope_base_global, dev);
        let mask_local = attention_mask(past, n, Some(c.sliding_window), dev);
        let mask_global = attention_mask(past, n, None, dev);

        for (il, l) in self.layers.iter().enumerate() {
            let local = c.is_local(il);
            let (cos, sin) = if local { &rope_local } else { &rope_global };
            let mask = if local { &mask_local } else { &mask_global };

            let h = rms_norm(x.clone(), &l.attn_norm, c.rms_eps);
            let q = rms_norm(
                l.wq.forward(h.clone()).reshape([n, nh, hd]),
                &l.q_norm,
                c.rms_eps,
            );
            let k = rms_norm(
                l.wk.forward(h.clone()).reshape([n, nkv, hd]),
                &l.k_norm,
                c.rms_eps,
            );
            let v = l.wv.forward(h).reshape([n, nkv, hd]);
            let q = rope(q, cos, sin).swap_dims(0, 1); // [nh, n, hd]
            let k = rope(k, cos, sin).swap_dims(0, 1); // [nkv, n, hd]
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
            let o = rms_norm(l.wo.forward(attn), &l.post_attn_norm, c.rms_eps);
            x = x + o;

            let h = rms_norm(x.clone(), &l.ffn_norm, c.rms_eps);
            let a = gelu_tanh(l.gate.forward(h.clone())) * l.up.forward(h);
            let d = rms_norm(l.down.forward(a), &l.post_ffw_norm, c.rms_eps);
            x = x + d;
        }
        cache.len = total;

        let x = if all_logits { x } else { x.narrow(0, n - 1, 1) };
        let x = rms_norm(x, &self.output_norm, c.rms_eps);
        Ok(self.head.forward(x))
    }
}

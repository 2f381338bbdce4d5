//! The decoder-only transformer shared by every architecture, with per-architecture parts
//! chosen from `general.architecture` ([`crate::ARCHITECTURES`]).
//!
//! The skeleton follows llama.cpp `src/models/*.cpp`: token embeddings; per layer RMSNorm, Q/K/V,
//! optional per-head RMSNorm of Q and K, RoPE, grouped-query attention scaled by
//! `1/sqrt(head_dim)` with a KV cache, the output projection, a residual; RMSNorm, `act(gate) * up`,
//! down, a residual; a final norm and the output head (tied to `token_embd` when `output.weight`
//! is absent, case C14). The parts that differ:
//! - `llama` (`src/models/llama.cpp`, Llama 3 family): SiLU, NORM-style RoPE (the converter
//!   permutes Q and K for it, case C16) with the optional `rope_freqs` frequency factors
//!   (Llama 3.1+) or linear `rope.scaling`.
//! - `qwen2` (`src/models/qwen2.cpp`): biases on Q, K and V (`attn_q.bias`, ...), NEOX RoPE,
//!   no Q/K norm, an optional `output.bias`.
//! - `phi3` (`src/models/phi3.cpp`): one `attn_qkv` weight (`[q; k; v]` rows) and one
//!   `ffn_up` holding gate then up; NEOX RoPE; its `sliding_window` key is ignored, as
//!   llama.cpp does.
//! - `gemma2` (`src/models/gemma2.cpp`): as `gemma3` without Q/K norms, with attention scores
//!   and final logits soft-capped (`cap * tanh(x / cap)`), the even layers local
//!   (`sliding_window_pattern` 2) with `rope.freq_base_swa` defaulting to `rope.freq_base`.
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
//! - `qwen35`, `qwen35moe` (`src/models/qwen35.cpp`, `qwen35moe.cpp`): three of every four
//!   layers are gated delta-net linear attention with a recurrent state (`crate::delta_net`);
//!   the others gated attention: `attn_q` yields a query and a gate per head, Q/K norms,
//!   NEOX RoPE over the first `rope.dimension_count` values (IMROPE for text), the output
//!   times the gate's sigmoid. `post_attention_norm` is the FFN's norm. The MoE variant adds a
//!   shared expert scaled by `sigmoid(ffn_gate_inp_shexp . x)`.
use crate::Error;
use crate::config::DecoderConfig;
use crate::delta_net::DeltaNetLayer;
use crate::lora::{DecoderLora, LoraTarget};
use crate::state::{BatchState, KV_BLOCK, LayerKind, LayerState, SequenceState};
use burn::tensor::activation::sigmoid;
use burn::tensor::{Device, Tensor};
use burn_gguf::{
    AttentionShape, CacheRows, GgmlEmbedding, GgmlExperts, GgmlLinear, QkNorm, QkRopeShape,
    RopeTable, add_rms_norm, attention, moe_route, qk_rope_cache,
};
use projections::{GateUp, LayerLora, Qkv};
use std::sync::Mutex;

/// Positions the RoPE tables cover at least, so they are rebuilt rarely.
const ROPE_TABLE_MIN: usize = 256;

pub use burn_gguf::{Activation, RopeStyle, rms_norm};

mod load;
mod projections;

struct Layer {
    attn_norm: Tensor<1>,
    mixer: Mixer,
    /// `[post_attention_norm, post_ffw_norm]` where the architecture has them.
    post_norms: Option<[Tensor<1>; 2]>,
    ffn_norm: Tensor<1>,
    ffn: Ffn,
    /// Q, K and V come from one `attn_qkv` weight (Phi-3): a LoRA adapter adapts it whole.
    fused_qkv: bool,
    /// Gate and up come from one `ffn_up` weight (Phi-3).
    fused_gate_up: bool,
}

/// What mixes a layer's tokens: attention over a KV cache, or a delta net's recurrent state.
// One per layer and long-lived, so the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Mixer {
    Attention {
        qkv: Qkv,
        /// The Q, K and V biases as one vector `[q; k; v]` where the file has any
        /// (`attn_q.bias`, ...; Qwen2), a missing one as zeros.
        bias: Option<Tensor<1>>,
        wo: GgmlLinear,
        /// `q_norm` then `k_norm`, `[2 * head_dim]` ([`QkNorm::stack`]), where the
        /// architecture has them.
        qk_norm: Option<Tensor<1>>,
    },
    DeltaNet(DeltaNetLayer),
}

/// A layer's feed-forward network.
// One per layer and long-lived, so the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Ffn {
    /// `down(act(gate x) * up x)`.
    Dense { gate_up: GateUp, down: GgmlLinear },
    /// Routed experts: `router` `[n_expert, n_embd]` (`ffn_gate_inp`), with a shared expert
    /// `[n_expert + 1, n_embd]`, its gate (`ffn_gate_inp_shexp`) the last row.
    Moe {
        router: Tensor<2>,
        experts: GgmlExperts,
        shared: Option<SharedExpert>,
    },
}

/// Qwen3.5-MoE's shared expert: a dense SiLU FFN every token goes through.
struct SharedExpert {
    gate_up: GateUp,
    down: GgmlLinear,
}

/// A decoder-only language model with packed weights on one device.
pub struct Decoder {
    config: DecoderConfig,
    embed: GgmlEmbedding,
    layers: Vec<Layer>,
    output_norm: Tensor<1>,
    head: GgmlLinear,
    /// `output.bias` `[vocab]`, where the file has one (Qwen2).
    head_bias: Option<Tensor<1>>,
    /// `rope_freqs.weight` (`head_dim / 2` frequency divisors, Llama 3.1+), if present.
    rope_freqs: Option<Vec<f32>>,
    /// RoPE angle tables on the device, `[global, local]` (the same table twice without a
    /// sliding window), built for the positions used so far and grown with them.
    rope: Mutex<Option<[RopeTable; 2]>>,
    device: Device,
    /// The projections a LoRA adapter can adapt, with their shapes `[out, in]`: every
    /// attention layer's Q, K, V (or fused QKV) and output, every dense FFN's gate, up and
    /// down.
    lora_targets: Vec<(LoraTarget, [usize; 2])>,
    /// Adapters every pass applies ([`Decoder::set_lora`]).
    lora: Option<DecoderLora>,
}

impl Decoder {
    /// The model's hyper-parameters.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The projections a LoRA adapter can adapt ([`DecoderLora`]), with their shapes
    /// `[out, in]`: each attention layer's `attn_q`, `attn_k`, `attn_v` (or `attn_qkv`) and
    /// `attn_output`, each dense FFN's `ffn_gate`, `ffn_up` and `ffn_down`. Not the experts of
    /// a MoE layer, the delta-net layers' projections, the embeddings or the head.
    pub fn lora_targets(&self) -> &[(LoraTarget, [usize; 2])] {
        &self.lora_targets
    }

    /// Attaches adapters that every pass of [`Decoder::forward`] and
    /// [`Decoder::forward_batch`] applies (so `generate`, chat and the server use them), or
    /// detaches them with `None`. Returns the ones attached before.
    pub fn set_lora(&mut self, lora: Option<DecoderLora>) -> Option<DecoderLora> {
        std::mem::replace(&mut self.lora, lora)
    }

    /// The attached adapters, if any.
    pub fn lora(&self) -> Option<&DecoderLora> {
        self.lora.as_ref()
    }

    /// The most positions a [`BatchState`]'s KV caches can hold on this device, all its
    /// sequences together: one attention layer's K (or V) cache, `[n_head_kv, positions,
    /// head_dim]` f32, within the device's largest buffer ([`burn_gguf::max_buffer_bytes`]:
    /// 128 MiB on lavapipe), in whole blocks of [`KV_BLOCK`] positions
    /// (`usize::MAX` where nothing limits it). A sequence holds at most this and the model's
    /// `context_length`; [`Decoder::forward_batch`] refuses a pass past either, and `serve`
    /// caps each request's context to them.
    pub fn max_kv_positions(&self) -> usize {
        let Some(max_buffer) = burn_gguf::max_buffer_bytes(&self.device) else {
            return usize::MAX;
        };
        let per_position = self
            .layer_kinds()
            .iter()
            .filter_map(|k| match *k {
                LayerKind::Attention {
                    n_head_kv,
                    head_dim,
                } => Some(
                    n_head_kv
                        .saturating_mul(head_dim)
                        .saturating_mul(size_of::<f32>()),
                ),
                LayerKind::Recurrent { .. } => None,
            })
            .max();
        match per_position {
            Some(bytes) if bytes > 0 => {
                let fits = usize::try_from(max_buffer / bytes as u64).unwrap_or(usize::MAX);
                fits / KV_BLOCK * KV_BLOCK
            }
            _ => usize::MAX,
        }
    }

    /// The layers' state kinds, for [`SequenceState`] to allocate.
    fn layer_kinds(&self) -> Vec<LayerKind> {
        let c = &self.config;
        (0..c.n_layers)
            .map(|il| match &c.delta_net {
                Some(d) if c.is_recurrent(il) => LayerKind::Recurrent {
                    n_head_v: d.shape.n_head_v,
                    d_k: d.shape.d_k,
                    d_v: d.shape.d_v,
                    channels: d.conv_channels(),
                    d_conv: d.d_conv,
                },
                _ => LayerKind::Attention {
                    n_head_kv: c.n_head_kv,
                    head_dim: c.head_dim,
                },
            })
            .collect()
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
            .max(ROPE_TABLE_MIN)
            .min(c.context_length)
            .max(positions);
        let (hd, dev) = (c.rope_dims, &self.device);
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
    /// attention as one kernel over the paged cache, the output projection, the
    /// residual step, gate/up as one GEMV, the activation, and down.
    ///
    /// # Errors
    /// Empty `ids`, a token id not below the vocabulary size, or a context past
    /// `context_length` or [`Decoder::max_kv_positions`]. A failure part way through a pass
    /// leaves `state` empty.
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
    /// vocabulary size, a context past `context_length` or [`Decoder::max_kv_positions`] (or
    /// [`BatchState::with_limit`]), or more KV blocks than are free while other slots hold them
    /// (the state unchanged then). A failure part way through a pass leaves every slot of
    /// `state` empty.
    pub fn forward_batch(
        &self,
        state: &mut BatchState,
        seqs: &[(usize, &[u32])],
        all_logits: bool,
    ) -> Result<Tensor<2>, Error> {
        self.forward_batch_with(state, seqs, all_logits, self.lora.as_ref())
    }

    /// [`Decoder::forward_batch`] with the adapters `lora` (none for `None`) in place of the
    /// attached ones: a training step's adapters, or a request's choice among several.
    ///
    /// # Errors
    /// As [`Decoder::forward_batch`].
    pub fn forward_batch_with(
        &self,
        state: &mut BatchState,
        seqs: &[(usize, &[u32])],
        all_logits: bool,
        lora: Option<&DecoderLora>,
    ) -> Result<Tensor<2>, Error> {
        let (h, last_rows) = self.hidden_batch(state, seqs, lora)?;
        let n = h.dims()[0];
        let h = if all_logits || last_rows.len() == n {
            h
        } else if let [last] = last_rows[..] {
            h.narrow(0, last, 1)
        } else {
            let at: Vec<i64> = last_rows.iter().map(|&r| r as i64).collect();
            let at = Tensor::<1, burn::tensor::Int>::from_data(
                burn::tensor::TensorData::new(at, [last_rows.len()]),
                &self.device,
            );
            h.select(0, at)
        };
        Ok(self.logits(h))
    }

    /// The final hidden states (after the output norm) of every token of `ids`, the next
    /// tokens after those in `state`, with the adapters `lora`: `[ids.len(), n_embd]` f32.
    /// [`Decoder::logits`] turns rows of it into logits; a training loss takes them a few
    /// rows at a time, so a large vocabulary's `[tokens, vocab]` is never whole.
    ///
    /// # Errors
    /// As [`Decoder::forward`].
    pub fn forward_hidden(
        &self,
        ids: &[u32],
        state: &mut SequenceState,
        lora: Option<&DecoderLora>,
    ) -> Result<Tensor<2>, Error> {
        Ok(self.hidden_batch(&mut state.0, &[(0, ids)], lora)?.0)
    }

    /// [`Decoder::forward_hidden`] of several sequences in one pass (`seqs`: `(slot, ids)` as
    /// [`Decoder::forward_batch`] takes them): every row's final hidden state, `[sum of
    /// ids.len(), n_embd]`, in `seqs` order. A training batch runs as one pass, so each packed
    /// weight is read (and, backward, dequantized) once for the batch.
    ///
    /// # Errors
    /// As [`Decoder::forward_batch`].
    pub fn forward_hidden_batch(
        &self,
        state: &mut BatchState,
        seqs: &[(usize, &[u32])],
        lora: Option<&DecoderLora>,
    ) -> Result<Tensor<2>, Error> {
        Ok(self.hidden_batch(state, seqs, lora)?.0)
    }

    /// The output head over final hidden states: `h` `[n, n_embd]` -> logits `[n, vocab]`
    /// (with `output.bias` and the final soft-cap where the model has them).
    pub fn logits(&self, h: Tensor<2>) -> Tensor<2> {
        let mut logits = self.head.forward(h);
        if let Some(b) = &self.head_bias {
            logits = logits + b.clone().unsqueeze();
        }
        self.softcap(logits)
    }

    /// Row ranges `(first, n)` of the output head's vocabulary, each one device buffer's piece
    /// of at most [`burn_gguf::tensor::PREFILL_SCRATCH_BYTES`] of f32: the pieces of
    /// [`Decoder::logits_rows`].
    pub fn head_chunks(&self) -> Vec<(usize, usize)> {
        self.head.weight.row_chunks()
    }

    /// The logits of vocabulary entries `first..first + n` (one of [`Decoder::head_chunks`])
    /// for final hidden states `h` `[m, n_embd]`: `[m, n]`, as [`Decoder::logits`] gives them.
    /// A training loss over a large vocabulary runs the head a piece at a time, so its
    /// backward pass dequantizes each piece of the head once.
    pub fn logits_rows(&self, h: Tensor<2>, first: usize, n: usize) -> Tensor<2> {
        let mut logits = self.head.weight.matmul_t_rows(h, first, n);
        if let Some(b) = &self.head_bias {
            logits = logits + b.clone().narrow(0, first, n).unsqueeze();
        }
        self.softcap(logits)
    }

    /// The logit of token `ids[i]` for each row `h[i]` (`h` `[m, n_embd]`, `ids` of length
    /// `m`, each below the vocabulary size): `[m, 1]`, as [`Decoder::logits`] gives them.
    ///
    /// # Errors
    /// An id not below the vocabulary size.
    pub fn target_logits(&self, h: Tensor<2>, ids: &[u32]) -> Result<Tensor<2>, Error> {
        let rows = self.head.weight.rows(ids)?;
        let mut logits = (h * rows).sum_dim(1);
        if let Some(b) = &self.head_bias {
            let at: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
            let at = Tensor::<1, burn::tensor::Int>::from_data(
                burn::tensor::TensorData::new(at, [ids.len()]),
                &self.device,
            );
            logits = logits + b.clone().select(0, at).unsqueeze_dim(1);
        }
        Ok(self.softcap(logits))
    }

    /// The final soft-cap where the model has one (Gemma 2).
    fn softcap(&self, logits: Tensor<2>) -> Tensor<2> {
        match self.config.final_softcap {
            // tanh's argument clamped where tanh is 1 to f32 precision, as in attention.
            Some(cap) => (logits / cap as f64).clamp(-15.0, 15.0).tanh() * cap as f64,
            None => logits,
        }
    }

    /// Every row's final hidden state `[n, n_embd]` and each sequence's last row in it.
    fn hidden_batch(
        &self,
        state: &mut BatchState,
        seqs: &[(usize, &[u32])],
        lora: Option<&DecoderLora>,
    ) -> Result<(Tensor<2>, Vec<usize>), Error> {
        let c = &self.config;
        if seqs.is_empty() || seqs.iter().any(|(_, ids)| ids.is_empty()) {
            return Err(Error::Model("forward needs at least one token".into()));
        }
        let limit = self.max_kv_positions().min(state.limit());
        let mut rows = Vec::new();
        let mut ends = Vec::with_capacity(seqs.len());
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
            if past == 0 {
                state.forget_checkpoint(slot);
            }
            let total = past + seq_ids.len();
            if total > c.context_length {
                return Err(Error::Model(format!(
                    "context of {total} tokens exceeds the model's {}",
                    c.context_length
                )));
            }
            if total > limit {
                return Err(Error::Model(format!(
                    "context of {total} tokens exceeds the {limit} positions the KV cache \
                     holds, all sequences together (the device's largest buffer, or the \
                     state's limit)"
                )));
            }
            rows.extend((past..total).map(|p| (slot, p)));
            ends.push((slot, total));
            ids.extend_from_slice(seq_ids);
            last_rows.push(rows.len() - 1);
            *len = total;
        }
        let n = ids.len();
        let end = rows.iter().map(|r| r.1 + 1).max().unwrap_or(0);
        let dev = &self.device;
        state
            .reserve(&ends, limit, &self.layer_kinds(), dev)
            .map_err(Error::Model)?;
        let tables = self.rope_tables(end);
        let rows = CacheRows::new(rows, state.tables(), KV_BLOCK, state.blocks(), dev);
        let (hd, eps) = (c.head_dim, c.rms_eps);
        let scale = c.attention_scale;

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
            let lora = LayerLora { lora, layer: il };
            let o = match (&l.mixer, layer_state) {
                (
                    Mixer::Attention {
                        qkv,
                        bias,
                        wo,
                        qk_norm,
                    },
                    LayerState::Attention {
                        k: k_cache,
                        v: v_cache,
                    },
                ) => {
                    let local = c.is_local(il);
                    let (qk, v, layout, gate) = qkv.forward(h, bias.as_ref(), c, lora, l.fused_qkv);
                    let layout = QkRopeShape { n, ..layout };
                    let norm = qk_norm.as_ref().map(|weights| QkNorm { weights, eps });
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
                        paging: rows.paging(),
                        window,
                        keys: 0,
                    };
                    let softcap = c.attention_softcap;
                    let mut attn = attention(q, &k_cache, &v_cache, &rows, shape, scale, softcap);
                    layers.push(LayerState::Attention {
                        k: k_cache,
                        v: v_cache,
                    });
                    if let Some(gate) = gate {
                        attn = attn * sigmoid(gate);
                    }
                    lora.add(wo.forward(attn.clone()), "attn_output", &attn)
                }
                (Mixer::DeltaNet(dn), LayerState::Recurrent { state: s, conv }) => {
                    let (o, s, conv) = dn.forward(h, s, conv, &rows, c);
                    layers.push(LayerState::Recurrent { state: s, conv });
                    o
                }
                _ => {
                    return Err(Error::Model(format!(
                        "layer {il}: the state holds another kind of layer"
                    )));
                }
            };
            let post = l.post_norms.as_ref();
            let (x_mid, h_ffn) = add_rms_norm(x, o, post.map(|[a, _]| a), &l.ffn_norm, eps);
            let d = match &l.ffn {
                Ffn::Dense { gate_up, down } => {
                    let a = gate_up.forward(h_ffn, c.activation, lora, l.fused_gate_up);
                    lora.add(down.forward(a.clone()), "ffn_down", &a)
                }
                Ffn::Moe {
                    router,
                    experts,
                    shared,
                } => {
                    let m = c
                        .moe
                        .as_ref()
                        .ok_or_else(|| Error::Model("a MoE layer without a MoE config".into()))?;
                    // Routing and experts on the device: nothing read back. With a shared
                    // expert the router's last column is its gate.
                    let logits = h_ffn.clone().matmul(router.clone().transpose());
                    let routed = logits.clone().narrow(1, 0, m.n_expert);
                    let (weights, ids) = moe_route(routed, m.n_expert_used, m.norm_top_k);
                    let y = experts.forward(h_ffn.clone(), ids, weights)?;
                    match shared {
                        None => y,
                        Some(sh) => {
                            let g = sigmoid(logits.narrow(1, m.n_expert, 1));
                            let none = LayerLora { lora: None, ..lora };
                            let a = sh.gate_up.forward(h_ffn, c.activation, none, false);
                            y + sh.down.forward(a) * g
                        }
                    }
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
        Ok((h, last_rows))
    }
}

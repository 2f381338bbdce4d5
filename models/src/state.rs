//! The per-sequence decode state: what a model keeps on the device between forward passes of
//! one sequence, layer by layer.
//!
//! Attention layers keep a KV cache, preallocated for `capacity` positions and written in
//! place ([`burn_gguf::qk_rope_cache`]), so a decode step copies nothing but the new token's
//! heads. Linear-attention layers (the gated delta-net layers of Qwen3.5, for one) keep a
//! fixed-size recurrent state and a short convolution window instead ([`LayerState::Recurrent`]).
use burn::tensor::{Device, Tensor};

/// Positions a cache grows by at least, so growth is rare and sizes are few.
pub const CAPACITY_STEP: usize = 256;

/// One layer's state.
#[derive(Clone, Debug)]
pub enum LayerState {
    /// Keys and values of an attention layer, `[n_head_kv, capacity, head_dim]` f32 each;
    /// positions `0..len` of the sequence are valid.
    Attention {
        /// Keys, rotated.
        k: Tensor<3>,
        /// Values.
        v: Tensor<3>,
    },
    /// A linear-attention layer's state: the recurrent state matrix `[heads, d_k, d_v]` and
    /// the last `d_conv - 1` inputs of its causal convolution, `[d_conv - 1, channels]`, f32.
    /// Its size does not depend on the sequence length; it cannot be cut back to an earlier
    /// position, only reset ([`SequenceState::truncate`]).
    Recurrent {
        /// The state matrix.
        state: Tensor<3>,
        /// The convolution window.
        conv: Tensor<2>,
    },
}

/// What a model needs to allocate one layer's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// An attention layer with `n_head_kv` KV heads of `head_dim`.
    Attention {
        /// KV heads.
        n_head_kv: usize,
        /// Values per head.
        head_dim: usize,
    },
}

/// The decode state of one sequence: every layer's [`LayerState`] on the device, and how many
/// positions of the sequence it holds. Made empty by [`SequenceState::new`] (or
/// [`SequenceState::with_capacity`] to preallocate), filled by the model's forward passes.
#[derive(Clone, Debug, Default)]
pub struct SequenceState {
    layers: Vec<LayerState>,
    len: usize,
    capacity: usize,
    /// Positions to allocate on first use (0: as needed).
    reserve: usize,
}

impl SequenceState {
    /// An empty state; caches are allocated on the first forward pass, sized for it
    /// (rounded up to [`CAPACITY_STEP`]), and grown when needed.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty state whose caches are allocated for `positions` positions on the first
    /// forward pass (a server's or CLI's context size), so they never grow below that.
    pub fn with_capacity(positions: usize) -> Self {
        Self {
            reserve: positions,
            ..Self::default()
        }
    }

    /// Positions of the sequence the state holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the state holds no position.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the attention caches hold before they must grow (0 before the first pass).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The layers' states (empty before the first pass).
    pub fn layers(&self) -> &[LayerState] {
        &self.layers
    }

    /// Keeps the first `len` positions (nothing changes when `len >= self.len()`), so a
    /// conversation reuses the state of its common prefix. A KV cache only forgets positions;
    /// a recurrent layer cannot go back, so a state with one resets to empty instead. Returns
    /// the positions kept.
    pub fn truncate(&mut self, len: usize) -> usize {
        if len >= self.len {
            return self.len;
        }
        let recurrent = self
            .layers
            .iter()
            .any(|l| matches!(l, LayerState::Recurrent { .. }));
        self.len = if recurrent { 0 } else { len };
        if recurrent {
            self.layers.clear();
            self.capacity = 0;
        }
        self.len
    }

    /// Makes room for `positions` positions: allocates the layers on first use (`kinds`, one
    /// per layer), and grows every KV cache (to at least twice its capacity, rounded up to
    /// [`CAPACITY_STEP`], at most `max`) when `positions` exceeds it, copying what it holds.
    ///
    /// # Panics
    /// If `kinds` does not match the layers already allocated (a programming error: one state
    /// serves one model).
    pub(crate) fn reserve(
        &mut self,
        positions: usize,
        max: usize,
        kinds: &[LayerKind],
        device: &Device,
    ) {
        let round = |p: usize| p.div_ceil(CAPACITY_STEP) * CAPACITY_STEP;
        if self.layers.is_empty() {
            let cap = round(positions.max(self.reserve)).min(max).max(positions);
            self.layers = kinds.iter().map(|k| alloc(*k, cap, device)).collect();
            self.capacity = cap;
            return;
        }
        assert_eq!(self.layers.len(), kinds.len(), "a state serves one model");
        if positions <= self.capacity {
            return;
        }
        let cap = round(positions.max(2 * self.capacity))
            .min(max)
            .max(positions);
        let keep = self.len;
        for (layer, kind) in self.layers.iter_mut().zip(kinds) {
            if let LayerState::Attention { k, v } = layer {
                let LayerState::Attention { k: nk, v: nv } = alloc(*kind, cap, device) else {
                    unreachable!("an attention kind allocates an attention layer")
                };
                let [h, _, d] = k.dims();
                let held = |t: &Tensor<3>| t.clone().narrow(1, 0, keep);
                *k = nk.slice_assign([0..h, 0..keep, 0..d], held(k));
                *v = nv.slice_assign([0..h, 0..keep, 0..d], held(v));
            }
        }
        self.capacity = cap;
    }

    /// Takes every layer's state out for a forward pass, which hands each KV cache to the op
    /// that writes it in place (and must hold its only reference). Until
    /// [`SequenceState::put_layers`] the state is empty: a pass that fails part way leaves it
    /// so, to be filled again from scratch.
    pub(crate) fn take_layers(&mut self) -> Vec<LayerState> {
        // Empty layers make the next `reserve` allocate afresh, whatever `capacity` says.
        self.len = 0;
        std::mem::take(&mut self.layers)
    }

    /// Puts the layers back after a forward pass, now holding `len` positions.
    pub(crate) fn put_layers(&mut self, layers: Vec<LayerState>, len: usize) {
        self.layers = layers;
        self.len = len;
    }
}

fn alloc(kind: LayerKind, capacity: usize, device: &Device) -> LayerState {
    match kind {
        LayerKind::Attention {
            n_head_kv,
            head_dim,
        } => LayerState::Attention {
            k: Tensor::zeros([n_head_kv, capacity, head_dim], device),
            v: Tensor::zeros([n_head_kv, capacity, head_dim], device),
        },
    }
}

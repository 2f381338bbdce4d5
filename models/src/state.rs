//! The decode state: what a model keeps on the device between forward passes, layer by layer,
//! for one sequence ([`SequenceState`]) or for several decoded together ([`BatchState`]).
//!
//! Attention layers keep a KV cache, preallocated for `capacity` positions per sequence and
//! written in place ([`burn_gguf::qk_rope_cache`]), so a decode step copies nothing but the new
//! tokens' heads. The sequences of a batch share one cache tensor per layer, each in its own
//! slot, so one kernel launch writes or attends for all of them ([`burn_gguf::CacheRows`]).
//! Linear-attention layers (the gated delta-net layers of Qwen3.5, for one) keep a fixed-size
//! recurrent state and a short convolution window instead ([`LayerState::Recurrent`]). Such
//! a state cannot be cut back to an earlier position, so a slot can keep a copy of it at one
//! position ([`BatchState::checkpoint`], taken after a prompt): a chat's next turn, whose
//! rendered history starts with that prompt, resumes from there.
use burn::tensor::{Device, Tensor};

/// Positions a cache grows by at least, so growth is rare and sizes are few.
pub const CAPACITY_STEP: usize = 256;

/// One layer's state, for every slot of the batch.
#[derive(Clone, Debug)]
pub enum LayerState {
    /// Keys and values of an attention layer, `[slots * n_head_kv, capacity, head_dim]` f32
    /// each: slot `c`'s KV head `g` is row `c * n_head_kv + g`; positions `0..len(c)` are
    /// valid.
    Attention {
        /// Keys, rotated.
        k: Tensor<3>,
        /// Values.
        v: Tensor<3>,
    },
    /// A linear-attention layer's state: the recurrent state matrices `[slots * heads, d_k,
    /// d_v]` and the last `d_conv - 1` inputs of its causal convolution, `[slots * (d_conv -
    /// 1), channels]`, f32. Its size does not depend on the sequence length; it cannot be cut
    /// back to an earlier position, only reset ([`BatchState::truncate`]).
    Recurrent {
        /// The state matrices.
        state: Tensor<3>,
        /// The convolution windows.
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
    /// A gated delta-net layer.
    Recurrent {
        /// Value heads (state matrices per slot).
        n_head_v: usize,
        /// Rows of each state matrix (key head size).
        d_k: usize,
        /// Columns of each state matrix (value head size).
        d_v: usize,
        /// Channels of the causal convolution.
        channels: usize,
        /// Taps of the causal convolution.
        d_conv: usize,
    },
}

/// The decode state of up to `slots` sequences decoded together (a server's running
/// requests): every layer's [`LayerState`] on the device, shared by the slots, and how many
/// positions each slot holds. Made empty by [`BatchState::new`], filled by the model's
/// forward passes ([`crate::Decoder::forward_batch`]).
#[derive(Clone, Debug)]
pub struct BatchState {
    layers: Vec<LayerState>,
    lens: Vec<usize>,
    capacity: usize,
    /// Positions to allocate on first use (0: as needed).
    reserve: usize,
    /// Per slot, the recurrent layers' state at one earlier position (the end of a prompt).
    checkpoints: Vec<Option<Checkpoint>>,
    /// Per slot, the recurrent layers' state before the latest speculative verify pass
    /// ([`BatchState::checkpoint_draft`]), apart from `checkpoints` so that drafting does not
    /// lose a chat turn's checkpoint.
    drafts: Vec<Option<Checkpoint>>,
}

/// One slot's recurrent states (and convolution windows) at position `len`, one entry per
/// layer (`None` for an attention layer, whose cache keeps every position anyway).
#[derive(Clone, Debug)]
struct Checkpoint {
    len: usize,
    layers: Vec<Option<(Tensor<3>, Tensor<2>)>>,
}

impl BatchState {
    /// An empty state of `slots` sequences (at least 1); caches are allocated on the first
    /// forward pass, sized for it (rounded up to [`CAPACITY_STEP`]), and grown when needed.
    pub fn new(slots: usize) -> Self {
        Self {
            layers: Vec::new(),
            lens: vec![0; slots.max(1)],
            capacity: 0,
            reserve: 0,
            checkpoints: vec![None; slots.max(1)],
            drafts: vec![None; slots.max(1)],
        }
    }

    /// An empty state whose caches are allocated for `positions` positions per slot on the
    /// first forward pass, so they never grow below that.
    pub fn with_capacity(slots: usize, positions: usize) -> Self {
        Self {
            reserve: positions,
            ..Self::new(slots)
        }
    }

    /// Sequences the state holds.
    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    /// Positions slot `slot` holds (0 for a slot past the last).
    pub fn len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    /// Positions each slot's caches hold before they must grow (0 before the first pass).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The layers' states (empty before the first pass).
    pub fn layers(&self) -> &[LayerState] {
        &self.layers
    }

    /// Keeps the first `len` positions of `slot` (nothing changes when `len >= len(slot)`),
    /// so a conversation reuses the state of its common prefix; `truncate(slot, 0)` frees the
    /// slot for a new sequence. A KV cache only forgets positions; a recurrent layer cannot go
    /// back, so a slot of a model with one goes back to the latest of its checkpoints at or
    /// before `len` ([`BatchState::checkpoint`], [`BatchState::checkpoint_draft`]), else to
    /// empty. Returns the positions kept.
    pub fn truncate(&mut self, slot: usize, len: usize) -> usize {
        let Some(&now) = self.lens.get(slot) else {
            return 0;
        };
        if len >= now {
            return now;
        }
        let recurrent = self
            .layers
            .iter()
            .any(|l| matches!(l, LayerState::Recurrent { .. }));
        let kept = if !recurrent {
            len
        } else {
            let best = [&self.checkpoints[slot], &self.drafts[slot]]
                .into_iter()
                .flatten()
                .filter(|c| c.len <= len)
                .max_by_key(|c| c.len)
                .cloned();
            match best {
                Some(c) => {
                    self.restore(slot, &c);
                    c.len
                }
                None => 0,
            }
        };
        // A checkpoint past what is kept describes tokens the slot no longer holds.
        for c in [&mut self.checkpoints[slot], &mut self.drafts[slot]] {
            if c.as_ref().is_some_and(|c| c.len > kept) {
                *c = None;
            }
        }
        self.lens[slot] = kept;
        kept
    }

    /// Remembers `slot`'s recurrent states at its current length, replacing an earlier
    /// checkpoint, so a later [`BatchState::truncate`] to this length or past it keeps this
    /// much. A copy of each recurrent layer's state for the slot (`n_head_v * d_k * d_v` and
    /// `(d_conv - 1) * channels` f32 each), and nothing for a model without recurrent layers.
    pub fn checkpoint(&mut self, slot: usize) {
        if slot < self.slots() {
            self.checkpoints[slot] = self.snapshot(slot);
        }
    }

    /// [`BatchState::checkpoint`] kept apart from it, taken before a speculative verify pass
    /// ([`crate::speculative`]) so that the rejected drafted tokens can be cut off again: the
    /// prompt's checkpoint stays for the next turn.
    pub fn checkpoint_draft(&mut self, slot: usize) {
        if slot < self.slots() {
            self.drafts[slot] = self.snapshot(slot);
        }
    }

    /// `slot`'s recurrent states at its current length, or `None` for a model without
    /// recurrent layers.
    fn snapshot(&self, slot: usize) -> Option<Checkpoint> {
        let len = self.lens[slot];
        let slots = self.slots();
        let part = |rows: usize| slot * rows / slots..(slot + 1) * rows / slots;
        let layers: Vec<_> = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Attention { .. } => None,
                LayerState::Recurrent { state, conv } => {
                    let [r, dk, dv] = state.dims();
                    let [w, ch] = conv.dims();
                    Some((
                        copied(state.clone().slice([part(r), 0..dk, 0..dv])),
                        copied(conv.clone().slice([part(w), 0..ch])),
                    ))
                }
            })
            .collect();
        layers
            .iter()
            .any(Option::is_some)
            .then_some(Checkpoint { len, layers })
    }

    /// Writes checkpoint `c` back into `slot`'s recurrent layers.
    fn restore(&mut self, slot: usize, c: &Checkpoint) {
        let slots = self.slots();
        let part = |rows: usize| slot * rows / slots..(slot + 1) * rows / slots;
        for (layer, saved) in self.layers.iter_mut().zip(&c.layers) {
            if let (LayerState::Recurrent { state, conv }, Some((s, w))) = (layer, saved) {
                let [r, dk, dv] = state.dims();
                let [wr, ch] = conv.dims();
                *state = state
                    .clone()
                    .slice_assign([part(r), 0..dk, 0..dv], s.clone());
                *conv = conv.clone().slice_assign([part(wr), 0..ch], w.clone());
            }
        }
    }

    /// A copy of `slot`'s state at the longest length it can be restored to: every position it
    /// holds, or for a model with recurrent layers its checkpoint ([`BatchState::checkpoint`],
    /// a prompt's end) with the KV caches up to there. `None` when that is no position at all.
    /// Costs a device copy of the slot's rows (see [`SlotSnapshot::bytes`]).
    pub fn save_slot(&self, slot: usize) -> Option<SlotSnapshot> {
        let now = *self.lens.get(slot)?;
        let recurrent = self
            .layers
            .iter()
            .any(|l| matches!(l, LayerState::Recurrent { .. }));
        let checkpoint = match recurrent {
            true => Some(self.checkpoints[slot].as_ref().filter(|c| c.len <= now)?),
            false => None,
        };
        let len = checkpoint.map_or(now, |c| c.len);
        if len == 0 {
            return None;
        }
        let slots = self.slots();
        let part = |rows: usize| slot * rows / slots..(slot + 1) * rows / slots;
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| match l {
                LayerState::Attention { k, v } => {
                    let [h, _, d] = k.dims();
                    let rows = |t: &Tensor<3>| copied(t.clone().slice([part(h), 0..len, 0..d]));
                    SavedLayer::Attention(rows(k), rows(v))
                }
                LayerState::Recurrent { .. } => {
                    let saved = checkpoint.and_then(|c| c.layers[i].clone());
                    let (state, conv) = saved.expect("a checkpoint holds every recurrent layer");
                    // A checkpoint's tensors are copies already ([`BatchState::snapshot`]).
                    SavedLayer::Recurrent(state, conv)
                }
            })
            .collect();
        Some(SlotSnapshot { len, layers })
    }

    /// Writes `snapshot` (from [`BatchState::save_slot`] of a state of the same model) into
    /// `slot`, which then holds its positions, with a checkpoint at its end for a model with
    /// recurrent layers. Returns the positions loaded: 0, with the slot emptied, when the
    /// caches are not allocated or shorter than the snapshot (after a failed pass), or the
    /// snapshot does not match this state's layers.
    pub fn load_slot(&mut self, slot: usize, snapshot: &SlotSnapshot) -> usize {
        if slot >= self.slots() {
            return 0;
        }
        self.truncate(slot, 0);
        self.forget_checkpoint(slot);
        let len = snapshot.len;
        let fits = len <= self.capacity
            && self.layers.len() == snapshot.layers.len()
            && self
                .layers
                .iter()
                .zip(&snapshot.layers)
                .all(|(l, s)| match (l, s) {
                    (LayerState::Attention { k, .. }, SavedLayer::Attention(sk, _)) => {
                        let ([h, _, d], [sh, sl, sd]) = (k.dims(), sk.dims());
                        sh * self.slots() == h && sl == len && sd == d
                    }
                    (LayerState::Recurrent { state, conv }, SavedLayer::Recurrent(ss, sc)) => {
                        let ([r, dk, dv], [sr, sdk, sdv]) = (state.dims(), ss.dims());
                        let ([w, ch], [sw, sch]) = (conv.dims(), sc.dims());
                        let n = self.slots();
                        (sr * n, sdk, sdv, sw * n, sch) == (r, dk, dv, w, ch)
                    }
                    _ => false,
                });
        if !fits {
            return 0;
        }
        let slots = self.slots();
        let part = |rows: usize| slot * rows / slots..(slot + 1) * rows / slots;
        let mut checkpoint = Vec::with_capacity(self.layers.len());
        for (layer, saved) in self.layers.iter_mut().zip(&snapshot.layers) {
            match (layer, saved) {
                (LayerState::Attention { k, v }, SavedLayer::Attention(sk, sv)) => {
                    let [h, _, d] = k.dims();
                    *k = k.clone().slice_assign([part(h), 0..len, 0..d], sk.clone());
                    *v = v.clone().slice_assign([part(h), 0..len, 0..d], sv.clone());
                    checkpoint.push(None);
                }
                (LayerState::Recurrent { state, conv }, SavedLayer::Recurrent(ss, sc)) => {
                    let [r, dk, dv] = state.dims();
                    let [w, ch] = conv.dims();
                    *state = state
                        .clone()
                        .slice_assign([part(r), 0..dk, 0..dv], ss.clone());
                    *conv = conv.clone().slice_assign([part(w), 0..ch], sc.clone());
                    checkpoint.push(Some((ss.clone(), sc.clone())));
                }
                _ => unreachable!("checked above"),
            }
        }
        if checkpoint.iter().any(Option::is_some) {
            self.checkpoints[slot] = Some(Checkpoint {
                len,
                layers: checkpoint,
            });
        }
        self.lens[slot] = len;
        len
    }

    /// Forgets `slot`'s checkpoints (a pass starts the slot afresh).
    pub(crate) fn forget_checkpoint(&mut self, slot: usize) {
        for c in [self.checkpoints.get_mut(slot), self.drafts.get_mut(slot)]
            .into_iter()
            .flatten()
        {
            *c = None;
        }
    }

    /// Makes room for `positions` positions in every slot: allocates the layers on first use
    /// (`kinds`, one per layer), and grows every KV cache (to at least twice its capacity,
    /// rounded up to [`CAPACITY_STEP`], at most `max`) when `positions` exceeds it, copying
    /// what the slots hold.
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
        let slots = self.slots();
        if self.layers.is_empty() {
            let cap = round(positions.max(self.reserve)).min(max).max(positions);
            self.layers = kinds
                .iter()
                .map(|k| alloc(*k, slots, cap, device))
                .collect();
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
        let keep = self.lens.iter().copied().max().unwrap_or(0);
        for (layer, kind) in self.layers.iter_mut().zip(kinds) {
            if let LayerState::Attention { k, v } = layer {
                let LayerState::Attention { k: nk, v: nv } = alloc(*kind, slots, cap, device)
                else {
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
    /// [`BatchState::put_layers`] the state is empty: a pass that fails part way leaves every
    /// slot so, to be filled again from scratch.
    pub(crate) fn take_layers(&mut self) -> Vec<LayerState> {
        // Empty layers make the next `reserve` allocate afresh, whatever `capacity` says.
        self.lens.iter_mut().for_each(|l| *l = 0);
        std::mem::take(&mut self.layers)
    }

    /// Puts the layers back after a forward pass; `lens` is each slot's length now.
    pub(crate) fn put_layers(&mut self, layers: Vec<LayerState>, lens: Vec<usize>) {
        self.layers = layers;
        self.lens = lens;
    }

    /// Each slot's length (to restore after [`BatchState::take_layers`]).
    pub(crate) fn lens(&self) -> &[usize] {
        &self.lens
    }
}

/// One slot's state at `len` positions, copied out of a [`BatchState`] by
/// [`BatchState::save_slot`] and written back, into any slot of a state of the same model, by
/// [`BatchState::load_slot`]: a server keeps prompt prefixes this way after their slot has
/// gone to another request. Its tensors live on the device.
#[derive(Clone, Debug)]
pub struct SlotSnapshot {
    len: usize,
    layers: Vec<SavedLayer>,
}

/// One layer of a [`SlotSnapshot`].
#[derive(Clone, Debug)]
enum SavedLayer {
    /// Keys and values, `[n_head_kv, len, head_dim]` each.
    Attention(Tensor<3>, Tensor<3>),
    /// The recurrent state matrices and the convolution window at `len`.
    Recurrent(Tensor<3>, Tensor<2>),
}

impl SlotSnapshot {
    /// Positions it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no position (never, as made by [`BatchState::save_slot`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device memory it holds, in bytes (f32 tensors).
    pub fn bytes(&self) -> usize {
        let n = |dims: &[usize]| dims.iter().product::<usize>() * size_of::<f32>();
        self.layers
            .iter()
            .map(|l| match l {
                SavedLayer::Attention(k, v) => n(&k.dims()) + n(&v.dims()),
                SavedLayer::Recurrent(s, c) => n(&s.dims()) + n(&c.dims()),
            })
            .sum()
    }

    /// Whether it holds recurrent layers' state, which can only be resumed at its end.
    pub fn is_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, SavedLayer::Recurrent(..)))
    }
}

/// The decode state of one sequence: a [`BatchState`] of one slot. Made empty by
/// [`SequenceState::new`] (or [`SequenceState::with_capacity`] to preallocate), filled by the
/// model's forward passes.
#[derive(Clone, Debug)]
pub struct SequenceState(pub(crate) BatchState);

impl Default for SequenceState {
    fn default() -> Self {
        Self::new()
    }
}

impl SequenceState {
    /// An empty state; caches are allocated on the first forward pass, sized for it
    /// (rounded up to [`CAPACITY_STEP`]), and grown when needed.
    pub fn new() -> Self {
        Self(BatchState::new(1))
    }

    /// An empty state whose caches are allocated for `positions` positions on the first
    /// forward pass (a server's or CLI's context size), so they never grow below that.
    pub fn with_capacity(positions: usize) -> Self {
        Self(BatchState::with_capacity(1, positions))
    }

    /// Positions of the sequence the state holds.
    pub fn len(&self) -> usize {
        self.0.len(0)
    }

    /// Whether the state holds no position.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions the attention caches hold before they must grow (0 before the first pass).
    pub fn capacity(&self) -> usize {
        self.0.capacity()
    }

    /// The layers' states (empty before the first pass), `[n_head_kv, capacity, head_dim]`
    /// for an attention layer.
    pub fn layers(&self) -> &[LayerState] {
        self.0.layers()
    }

    /// Keeps the first `len` positions (see [`BatchState::truncate`]). Returns the positions
    /// kept.
    pub fn truncate(&mut self, len: usize) -> usize {
        self.0.truncate(0, len)
    }

    /// Remembers the recurrent layers' state at the current length (see
    /// [`BatchState::checkpoint`]).
    pub fn checkpoint(&mut self) {
        self.0.checkpoint(0)
    }

    /// Remembers the recurrent layers' state before a speculative verify pass (see
    /// [`BatchState::checkpoint_draft`]).
    pub fn checkpoint_draft(&mut self) {
        self.0.checkpoint_draft(0)
    }
}

/// `t` in a buffer of its own. A slice is a view of its tensor's buffer where the offsets
/// allow: kept in a checkpoint or a [`SlotSnapshot`], it would keep the whole state's buffer
/// alive (not the bytes [`SlotSnapshot::bytes`] counts), and make the next in-place write of
/// that state copy all of it, every slot.
fn copied<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    let dims = t.dims();
    Tensor::<D>::empty(dims, &t.device()).slice_assign(dims.map(|n| 0..n), t)
}

fn alloc(kind: LayerKind, slots: usize, capacity: usize, device: &Device) -> LayerState {
    match kind {
        LayerKind::Attention {
            n_head_kv,
            head_dim,
        } => LayerState::Attention {
            k: Tensor::zeros([slots * n_head_kv, capacity, head_dim], device),
            v: Tensor::zeros([slots * n_head_kv, capacity, head_dim], device),
        },
        LayerKind::Recurrent {
            n_head_v,
            d_k,
            d_v,
            channels,
            d_conv,
        } => LayerState::Recurrent {
            state: Tensor::zeros([slots * n_head_v, d_k, d_v], device),
            conv: Tensor::zeros([slots * (d_conv - 1), channels], device),
        },
    }
}

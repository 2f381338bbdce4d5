//! The decode state: what a model keeps on the device between forward passes, layer by layer,
//! for one sequence ([`SequenceState`]) or for several decoded together ([`BatchState`]).
//!
//! Attention layers keep a KV cache written in place ([`burn_gguf::qk_rope_cache`]), so a decode
//! step copies nothing but the new tokens' heads. The cache is paged (vLLM's PagedAttention,
//! llama.cpp's unified KV cache): the sequences of a batch share one pool of blocks of
//! [`KV_BLOCK`] positions per layer, each slot taking blocks as it grows and giving them back
//! when it is cut ([`BatchState::truncate`]), so the caches hold what the sequences hold, not
//! slots times the longest, and one kernel launch writes or attends for every slot through the
//! block table ([`burn_gguf::CacheRows`]).
//! Linear-attention layers (the gated delta-net layers of Qwen3.5, for one) keep a fixed-size
//! recurrent state and a short convolution window instead ([`LayerState::Recurrent`]). Such
//! a state cannot be cut back to an earlier position, so a slot can keep a copy of it at one
//! position ([`BatchState::checkpoint`], taken after a prompt): a chat's next turn, whose
//! rendered history starts with that prompt, resumes from there.
use std::collections::BTreeSet;

use burn::tensor::{Device, Tensor};
use burn_gguf::{block_pieces, slot_positions};

/// Positions per block of the paged KV caches: a slot holds whole blocks, so it leaves at most
/// `KV_BLOCK - 1` positions unused.
pub const KV_BLOCK: usize = 64;

/// One layer's state, for every slot of the batch.
#[derive(Clone, Debug)]
pub enum LayerState {
    /// Keys and values of an attention layer, `[n_head_kv, blocks * KV_BLOCK, head_dim]` f32
    /// each: a pool of blocks, a slot's positions in the blocks its table gives
    /// ([`BatchState::table`]).
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
/// requests): every layer's [`LayerState`] on the device, shared by the slots, how many
/// positions each slot holds and, for the paged KV caches, which blocks. Made empty by
/// [`BatchState::new`], filled by the model's forward passes
/// ([`crate::Decoder::forward_batch`]).
#[derive(Clone, Debug)]
pub struct BatchState {
    layers: Vec<LayerState>,
    lens: Vec<usize>,
    /// Per slot, the blocks of the KV caches it holds, in position order (one table for every
    /// attention layer): `ceil(len / KV_BLOCK)` of them, or more after a pass that failed
    /// (until the slot is cut: [`BatchState::truncate`]).
    tables: Vec<Vec<u32>>,
    /// Blocks no slot holds; the lowest is taken first, so a slot's blocks tend to follow each
    /// other (a prompt's attention reads them as one view).
    free: BTreeSet<u32>,
    /// Blocks each KV cache holds (0 before the first pass).
    blocks: usize,
    /// Most positions the caches may hold, all slots together ([`BatchState::with_limit`]).
    limit: usize,
    /// The most blocks the caches may grow to: `limit`, and the device's largest buffer as the
    /// last pass gave it.
    max_blocks: usize,
    /// Positions per slot to allocate on first use (0: as needed).
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
    /// forward pass, sized for it (in whole blocks of [`KV_BLOCK`] positions), and grown (at
    /// least doubled) when the slots need more blocks than are free.
    pub fn new(slots: usize) -> Self {
        Self {
            layers: Vec::new(),
            lens: vec![0; slots.max(1)],
            tables: vec![Vec::new(); slots.max(1)],
            free: BTreeSet::new(),
            blocks: 0,
            limit: usize::MAX,
            max_blocks: usize::MAX,
            reserve: 0,
            checkpoints: vec![None; slots.max(1)],
            drafts: vec![None; slots.max(1)],
        }
    }

    /// An empty state whose caches are allocated for `positions` positions per slot on the
    /// first forward pass (within the limit), so they need not grow below that.
    pub fn with_capacity(slots: usize, positions: usize) -> Self {
        Self {
            reserve: positions,
            ..Self::new(slots)
        }
    }

    /// The state with its KV caches held to `positions` positions, all slots together, rounded
    /// down to whole blocks (at least one): llama.cpp's `-c` of a unified cache. A pass that
    /// would need more fails, saying so, and leaves the state as it was; the device's largest
    /// buffer limits them too ([`crate::Decoder::max_kv_positions`]).
    pub fn with_limit(self, positions: usize) -> Self {
        Self {
            limit: positions.max(KV_BLOCK) / KV_BLOCK * KV_BLOCK,
            ..self
        }
    }

    /// Most positions the caches may hold, all slots together ([`BatchState::with_limit`];
    /// `usize::MAX` without a limit).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Sequences the state holds.
    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    /// Positions slot `slot` holds (0 for a slot past the last).
    pub fn len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    /// Positions the KV caches hold now, all slots together (every block, held or free; 0
    /// before the first pass).
    pub fn capacity(&self) -> usize {
        self.blocks * KV_BLOCK
    }

    /// Positions of the blocks `slot` holds (its length rounded up to [`KV_BLOCK`]; 0 for a
    /// slot past the last).
    pub fn held(&self, slot: usize) -> usize {
        match self.layers.is_empty() {
            true => 0,
            false => self.tables.get(slot).map_or(0, |t| t.len() * KV_BLOCK),
        }
    }

    /// Slot `slot`'s blocks of the KV caches, in position order: its positions `i * KV_BLOCK
    /// .. (i + 1) * KV_BLOCK` are in block `table(slot)[i]` of every attention layer.
    ///
    /// # Panics
    /// A slot past the last.
    pub fn table(&self, slot: usize) -> &[u32] {
        &self.tables[slot]
    }

    /// Every slot's blocks ([`BatchState::table`]).
    pub(crate) fn tables(&self) -> &[Vec<u32>] {
        &self.tables
    }

    /// Blocks each KV cache holds (0 before the first pass).
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }

    /// The layers' states (empty before the first pass).
    pub fn layers(&self) -> &[LayerState] {
        &self.layers
    }

    /// Keeps the first `len` positions of `slot` (nothing changes when `len >= len(slot)`),
    /// so a conversation reuses the state of its common prefix; `truncate(slot, 0)` frees the
    /// slot for a new sequence. The KV blocks past what is kept go back to the pool. A KV cache
    /// only forgets positions; a recurrent layer cannot go back, so a slot of a model with one
    /// goes back to the latest of its checkpoints at or before `len`
    /// ([`BatchState::checkpoint`], [`BatchState::checkpoint_draft`]), else to empty. Returns
    /// the positions kept.
    pub fn truncate(&mut self, slot: usize, len: usize) -> usize {
        let Some(&now) = self.lens.get(slot) else {
            return 0;
        };
        if len >= now {
            // Blocks a pass took and did not fill (it failed after taking them) go back.
            self.release(slot, now);
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
        self.release(slot, kept);
        kept
    }

    /// Gives back the blocks of `slot` past its first `len` positions.
    fn release(&mut self, slot: usize, len: usize) {
        let keep = len.div_ceil(KV_BLOCK);
        if let Some(t) = self.tables.get_mut(slot)
            && t.len() > keep
        {
            self.free.extend(t.drain(keep..));
        }
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
        let table = &self.tables[slot];
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| match l {
                LayerState::Attention { k, v } => {
                    let rows = |t: &Tensor<3>| copied(slot_positions(t, table, KV_BLOCK, 0, len));
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
    /// caches are not allocated (after a failed pass), the snapshot does not match this
    /// state's layers, or its blocks are not free within the limit.
    pub fn load_slot(&mut self, slot: usize, snapshot: &SlotSnapshot) -> usize {
        if slot >= self.slots() {
            return 0;
        }
        self.truncate(slot, 0);
        self.forget_checkpoint(slot);
        let len = snapshot.len;
        let fits = self.layers.len() == snapshot.layers.len()
            && self
                .layers
                .iter()
                .zip(&snapshot.layers)
                .all(|(l, s)| match (l, s) {
                    (LayerState::Attention { k, .. }, SavedLayer::Attention(sk, _)) => {
                        let ([h, _, d], [sh, sl, sd]) = (k.dims(), sk.dims());
                        sh == h && sl == len && sd == d
                    }
                    (LayerState::Recurrent { state, conv }, SavedLayer::Recurrent(ss, sc)) => {
                        let ([r, dk, dv], [sr, sdk, sdv]) = (state.dims(), ss.dims());
                        let ([w, ch], [sw, sch]) = (conv.dims(), sc.dims());
                        let n = self.slots();
                        (sr * n, sdk, sdv, sw * n, sch) == (r, dk, dv, w, ch)
                    }
                    _ => false,
                });
        if !fits || self.take_blocks(&[(slot, len)]).is_err() {
            return 0;
        }
        let slots = self.slots();
        let part = |rows: usize| slot * rows / slots..(slot + 1) * rows / slots;
        let pieces = block_pieces(&self.tables[slot], KV_BLOCK, 0, len);
        let mut checkpoint = Vec::with_capacity(self.layers.len());
        for (layer, saved) in self.layers.iter_mut().zip(&snapshot.layers) {
            match (layer, saved) {
                (LayerState::Attention { k, v }, SavedLayer::Attention(sk, sv)) => {
                    let [h, _, d] = k.dims();
                    let mut o = 0;
                    for &(start, n) in &pieces {
                        let at = [0..h, start..start + n, 0..d];
                        *k = k
                            .clone()
                            .slice_assign(at.clone(), sk.clone().narrow(1, o, n));
                        *v = v.clone().slice_assign(at, sv.clone().narrow(1, o, n));
                        o += n;
                    }
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

    /// Makes room for a pass: slot `c` of each `(c, end)` of `ends` holds blocks for positions
    /// `0..end` after it. Allocates the layers on first use (`kinds`, one per layer) and grows
    /// every KV cache (at least doubling it, copying what it holds) when the free blocks do not
    /// suffice, within the limit ([`BatchState::with_limit`]) and `max` positions (the device's
    /// largest buffer).
    ///
    /// # Errors
    /// When the blocks the pass needs are more than are free within those limits (the other
    /// slots hold them); the state is unchanged.
    ///
    /// # Panics
    /// If `kinds` does not match the layers already allocated (a programming error: one state
    /// serves one model).
    pub(crate) fn reserve(
        &mut self,
        ends: &[(usize, usize)],
        max: usize,
        kinds: &[LayerKind],
        device: &Device,
    ) -> Result<(), String> {
        self.max_blocks = (self.limit.min(max) / KV_BLOCK).max(1);
        if self.layers.is_empty() {
            // First use, or after a failed pass: every slot starts empty.
            let slots = self.slots();
            let need: usize = ends.iter().map(|&(_, end)| end.div_ceil(KV_BLOCK)).sum();
            if need > self.max_blocks {
                return Err(self.full(need));
            }
            let blocks = need
                .max(slots * self.reserve.div_ceil(KV_BLOCK))
                .clamp(1, self.max_blocks);
            self.layers = kinds
                .iter()
                .map(|k| alloc(*k, slots, blocks, device))
                .collect();
            self.tables = vec![Vec::new(); slots];
            self.free = (0..blocks as u32).collect();
            self.blocks = blocks;
        }
        assert_eq!(self.layers.len(), kinds.len(), "a state serves one model");
        self.take_blocks(ends)
    }

    /// Gives each `(slot, end)` of `ends` blocks for positions `0..end`, growing the caches
    /// within `max_blocks` when the free blocks do not suffice; nothing changes on an error.
    fn take_blocks(&mut self, ends: &[(usize, usize)]) -> Result<(), String> {
        let need: usize = ends
            .iter()
            .map(|&(c, end)| end.div_ceil(KV_BLOCK).saturating_sub(self.tables[c].len()))
            .sum();
        if need > self.free.len() {
            let want = self.blocks + need - self.free.len();
            if want > self.max_blocks {
                return Err(self.full(need));
            }
            self.grow(want.max(2 * self.blocks).min(self.max_blocks));
        }
        for &(c, end) in ends {
            while self.tables[c].len() < end.div_ceil(KV_BLOCK) {
                let b = self.free.pop_first().expect("blocks counted above");
                self.tables[c].push(b);
            }
        }
        Ok(())
    }

    /// Why a pass needing `need` more blocks cannot have them.
    fn full(&self, need: usize) -> String {
        let free = self.max_blocks.saturating_sub(self.blocks) + self.free.len();
        format!(
            "the KV cache holds {} positions, all sequences together, and {} of them are free: \
             this pass needs {} more",
            self.max_blocks * KV_BLOCK,
            free * KV_BLOCK,
            need * KV_BLOCK
        )
    }

    /// Grows every KV cache to `blocks` blocks, copying what it holds; the new blocks are free.
    fn grow(&mut self, blocks: usize) {
        if blocks <= self.blocks {
            return;
        }
        let added = blocks - self.blocks;
        for layer in &mut self.layers {
            if let LayerState::Attention { k, v } = layer {
                let [h, _, d] = k.dims();
                let more = |t: &Tensor<3>| {
                    let zeros = Tensor::zeros([h, added * KV_BLOCK, d], &t.device());
                    Tensor::cat(vec![t.clone(), zeros], 1)
                };
                *k = more(k);
                *v = more(v);
            }
        }
        self.free.extend(self.blocks as u32..blocks as u32);
        self.blocks = blocks;
    }

    /// Takes every layer's state out for a forward pass, which hands each KV cache to the op
    /// that writes it in place (and must hold its only reference). Until
    /// [`BatchState::put_layers`] the state is empty: a pass that fails part way leaves every
    /// slot so, to be filled again from scratch.
    pub(crate) fn take_layers(&mut self) -> Vec<LayerState> {
        // Empty layers make the next `reserve` allocate afresh, whatever the tables say.
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
    /// An empty state; caches are allocated on the first forward pass, sized for it (whole
    /// blocks of [`KV_BLOCK`] positions), and grown when needed.
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

    /// The layers' states (empty before the first pass), `[n_head_kv, blocks * KV_BLOCK,
    /// head_dim]` for an attention layer (the sequence's blocks: [`SequenceState::table`]).
    pub fn layers(&self) -> &[LayerState] {
        self.0.layers()
    }

    /// The sequence's blocks of the KV caches, in position order (see
    /// [`BatchState::table`]).
    pub fn table(&self) -> &[u32] {
        self.0.table(0)
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

/// A layer's state: KV caches of `blocks` blocks, or `slots` recurrent states.
fn alloc(kind: LayerKind, slots: usize, blocks: usize, device: &Device) -> LayerState {
    match kind {
        LayerKind::Attention {
            n_head_kv,
            head_dim,
        } => LayerState::Attention {
            k: Tensor::zeros([n_head_kv, blocks * KV_BLOCK, head_dim], device),
            v: Tensor::zeros([n_head_kv, blocks * KV_BLOCK, head_dim], device),
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

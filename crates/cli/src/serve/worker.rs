//! The worker of one served model: its sequences, their slots in one [`BatchState`], and the
//! rounds that prefill and decode them (the module docs of [`super::engine`] say how a round
//! goes: continuous batching, the prefix cache, grammars and speculative decoding).

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use burn::tensor::Tensor;
use burn_gguf_models::generate::{SampleFrom, sample_from};
use burn_gguf_models::speculative::{NgramConfig, NgramDrafter, Verdict, verify};
use burn_gguf_models::structured::{TokenConstraint, apply_bias};
use burn_gguf_models::{
    BatchState, Decoder, DecoderLora, GgufTokenizer, KV_BLOCK, Sampler, SlotSnapshot,
};

use super::engine::{DECODE_ROWS, Event, FinishReason, Job, PREFILL_CHUNK};
use super::metrics::Metrics;
use super::output::{Logprobs, first_stop, held_back, logprobs};
use super::prefix_store::{PrefixStore, common_prefix};

/// A running sequence.
pub(super) struct Sequence {
    job: Job,
    /// The adapters its passes apply.
    lora: Option<Arc<DecoderLora>>,
    /// Its slot in the worker's [`BatchState`].
    slot: usize,
    sampler: Sampler,
    /// Its grammar state, if the request has one (taken out while its mask is computed).
    constraint: Option<TokenConstraint>,
    /// Its drafts, with speculative decoding on.
    drafter: Option<NgramDrafter>,
    /// Prompt tokens in the cache.
    fed: usize,
    generated: Vec<u32>,
    /// Text of `generated` decoded so far (complete UTF-8 only).
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
    /// Log-probabilities of tokens not yet sent with text.
    logprobs: Vec<Logprobs>,
    /// When the worker took the job (time to first token).
    received: Instant,
    /// Ended: to be dropped at the end of the round.
    done: bool,
}

impl Sequence {
    fn prefilled(&self) -> bool {
        self.fed == self.job.prompt_ids.len()
    }
}

/// The worker of one model: its batch state, free slots and sequences.
pub(super) struct Worker<'a> {
    pub(super) model: &'a Decoder,
    pub(super) tokenizer: &'a GgufTokenizer,
    pub(super) state: BatchState,
    /// Free slots of `state`.
    pub(super) free: Vec<usize>,
    /// Per slot, the tokens whose state it holds: a running sequence's fed tokens, or what a
    /// finished one left for reuse.
    pub(super) cached: Vec<Vec<u32>>,
    /// Per slot, the adapters its cached state was computed with.
    pub(super) cached_lora: Vec<Option<Arc<DecoderLora>>>,
    /// Per slot, the round it was last taken (the least recent free slot is overwritten first).
    pub(super) last_used: Vec<u64>,
    /// Rounds run so far.
    pub(super) rounds: u64,
    /// Whether a new request may start after a cached prefix.
    pub(super) prefix_cache: bool,
    /// Prefixes kept after their slot went to another request (`--cache-memory`).
    pub(super) store: PrefixStore<SlotSnapshot, DecoderLora>,
    /// Jobs waiting for a slot (only when more jobs reach this worker than it has slots).
    pub(super) waiting: VecDeque<Job>,
    pub(super) active: Vec<Sequence>,
    pub(super) metrics: &'a Metrics,
    pub(super) from: SampleFrom,
    /// The adapter files, by id, each at scale 1.
    pub(super) loras: Vec<DecoderLora>,
    /// Their default scale.
    pub(super) lora_scale: f32,
    /// The adapters of each choice made so far (`(id, scale bits)` pairs), built once.
    pub(super) merged: HashMap<Vec<(usize, u32)>, Option<Arc<DecoderLora>>>,
    /// Prompt-lookup parameters of the sequences' drafters.
    pub(super) ngram: NgramConfig,
    /// Most drafted tokens a pass for requests that do not choose (0: no drafts).
    pub(super) draft_max: usize,
}

impl Worker<'_> {
    /// Serves jobs until every sender is dropped and no sequence runs.
    pub(super) fn run(&mut self, jobs: mpsc::Receiver<Job>, running: &AtomicUsize) {
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                running.store(0, Ordering::SeqCst);
                match jobs.recv() {
                    Ok(job) => self.waiting.push_back(job),
                    Err(_) => return,
                }
            }
            while let Ok(job) = jobs.try_recv() {
                self.waiting.push_back(job);
            }
            self.admit();
            running.store(self.active.len(), Ordering::SeqCst);
            // A panic in a pass (a bug) ends the sequences of that pass, not the server.
            if std::panic::catch_unwind(AssertUnwindSafe(|| self.round())).is_err() {
                self.fail_all("internal error in generation");
            }
            self.retire();
        }
    }

    /// Gives waiting jobs free slots, in order, while the paged KV cache can hold each one's
    /// longest (its prompt and `max_tokens`) beside the running sequences' longest: each the
    /// slot whose cached tokens share the longest prefix with its prompt (at most all but the
    /// prompt's last token, which the first pass needs), else the least recently used one.
    /// Free slots then give back their cached blocks, least recently used first, as far as the
    /// running sequences may need them, so no pass runs out of blocks.
    fn admit(&mut self) {
        let limit = self.state.limit() / KV_BLOCK;
        while let Some(front) = self.waiting.front()
            && !self.free.is_empty()
        {
            let committed: usize = self.active.iter().map(|s| longest(&s.job)).sum();
            let total = committed.saturating_add(longest(front));
            // Alone, a request fits: its context is capped to the cache.
            if !self.active.is_empty() && total > limit {
                break;
            }
            let Some(mut job) = self.waiting.pop_front() else {
                break;
            };
            let lora = self.lora_for(job.lora.as_deref());
            let usable = job.prompt_ids.len().saturating_sub(1);
            // A cache computed with other adapters is not this request's prefix.
            let same_lora = |slot: usize| match (&self.cached_lora[slot], &lora) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            let (at, common) = (self.free.iter().enumerate())
                .map(|(k, &slot)| {
                    let common = if self.prefix_cache && same_lora(slot) {
                        common_prefix(&self.cached[slot], &job.prompt_ids).min(usable)
                    } else {
                        0
                    };
                    (k, common)
                })
                .max_by_key(|&(k, common)| {
                    (common, std::cmp::Reverse(self.last_used[self.free[k]]))
                })
                .unwrap_or((0, 0));
            let slot = self.free.swap_remove(at);
            self.metrics.request();
            self.make_room(total, limit);
            // A stored prefix longer than the slot's is loaded into it; what the slot held is
            // stored first when the request would overwrite part of it.
            // (Without the prefix cache the store is off and empty.)
            let stored = self.store.fetch(&job.prompt_ids, &lora, usable, common);
            let had = self.cached[slot].len();
            let saved = (stored.is_some() || common < had) && self.store_slot(slot);
            let (mut from_store, replaced) = (0, stored.is_some());
            if let Some((tokens, snapshot)) = stored {
                let loaded = self.state.load_slot(slot, &snapshot);
                self.cached[slot] = tokens[..loaded].to_vec();
                self.cached_lora[slot] = lora.clone();
                from_store = common_prefix(&self.cached[slot], &job.prompt_ids).min(usable);
            }
            let kept = self.state.truncate(slot, from_store.max(common));
            if from_store > 0 {
                self.metrics.prefix_store_hit();
            }
            // Tokens of the slot's own that are gone (all of them when a stored state replaced
            // them), unless the store kept them.
            let dropped = match (saved, replaced) {
                (true, _) => 0,
                (false, true) => had,
                (false, false) => had - kept.min(had),
            };
            self.cached[slot].truncate(kept);
            self.metrics.prefix_cache(kept, dropped);
            self.last_used[slot] = self.rounds;
            self.cached_lora[slot] = lora.clone();
            let constraint = job.constraint.take();
            // Drafts for free text whose tokens are taken as they come (a grammar's mask and
            // log-probabilities are per token).
            let draft_max = job.draft_max.unwrap_or(self.draft_max);
            let drafter =
                (draft_max > 0 && constraint.is_none() && job.logprobs.is_none()).then(|| {
                    NgramDrafter::new(NgramConfig {
                        draft_max,
                        ..self.ngram.clone()
                    })
                });
            self.active.push(Sequence {
                lora,
                sampler: Sampler::new(job.sampler.clone()),
                constraint,
                drafter,
                job,
                slot,
                fed: kept,
                generated: Vec::new(),
                text: String::new(),
                sent: 0,
                logprobs: Vec::new(),
                received: Instant::now(),
                done: false,
            });
        }
    }

    /// Empties free slots, least recently used first (each kept in the prefix store where it
    /// has room), until the blocks they hold and `committed` blocks fit `limit`.
    fn make_room(&mut self, committed: usize, limit: usize) {
        let mut idle: Vec<usize> = (self.free.iter().copied())
            .filter(|&c| self.state.held(c) > 0)
            .collect();
        idle.sort_by_key(|&c| self.last_used[c]);
        let mut held: usize = idle.iter().map(|&c| self.state.held(c) / KV_BLOCK).sum();
        for c in idle {
            if committed.saturating_add(held) <= limit {
                break;
            }
            held -= self.state.held(c) / KV_BLOCK;
            let saved = self.store_slot(c);
            self.state.truncate(c, 0);
            let dropped = std::mem::take(&mut self.cached[c]).len();
            self.metrics
                .prefix_cache(0, if saved { 0 } else { dropped });
        }
    }

    /// Keeps what `slot` holds in the prefix store (with its adapters); whether it is there.
    fn store_slot(&mut self, slot: usize) -> bool {
        if !self.store.enabled() {
            return false;
        }
        let Some(snapshot) = self.state.save_slot(slot) else {
            return false;
        };
        let (entries, bytes) = (self.store.len() as i64, self.store.bytes() as i64);
        let tokens = &self.cached[slot];
        let done = self
            .store
            .insert(tokens, self.cached_lora[slot].clone(), snapshot);
        let entries = self.store.len() as i64 - entries;
        self.metrics
            .prefix_store(done.evicted, entries, self.store.bytes() as i64 - bytes);
        done.stored
    }

    /// The adapters of a request's choice (`None`: every file at the default scale), built on
    /// first use; `None` when no adapter applies. Ids were checked against the files.
    fn lora_for(&mut self, choice: Option<&[(usize, f32)]>) -> Option<Arc<DecoderLora>> {
        let pairs: Vec<(usize, f32)> = match choice {
            Some(c) => c.iter().copied().filter(|&(_, s)| s != 0.0).collect(),
            None if self.lora_scale == 0.0 => Vec::new(),
            None => (0..self.loras.len())
                .map(|i| (i, self.lora_scale))
                .collect(),
        };
        let key: Vec<(usize, u32)> = pairs.iter().map(|&(i, s)| (i, s.to_bits())).collect();
        let loras = &self.loras;
        self.merged
            .entry(key)
            .or_insert_with(|| {
                pairs
                    .iter()
                    .filter_map(|&(i, s)| Some(loras.get(i)?.clone().with_user_scale(s)))
                    .reduce(DecoderLora::merge)
                    .map(Arc::new)
            })
            .clone()
    }

    /// Drops ended sequences (and their permits) and frees their slots, which keep the state
    /// of the tokens they hold for a later request sharing their prefix.
    fn retire(&mut self) {
        let (free, cached, state) = (&mut self.free, &mut self.cached, &self.state);
        self.active.retain(|s| {
            let keep = !s.done && !s.job.events.is_closed();
            if !keep {
                free.push(s.slot);
                // The cache holds the prompt and every generated token but the last.
                let held = state.len(s.slot);
                let tokens = s.job.prompt_ids.iter().chain(&s.generated).take(held);
                cached[s.slot] = tokens.copied().collect();
            }
            keep
        });
    }

    /// One round: a prefill chunk of the first sequence still in its prompt, then one decode
    /// step of every sequence past its prompt. A failed pass ends every sequence (the batch
    /// state is lost with it).
    fn round(&mut self) {
        self.rounds += 1;
        // A client that left frees its slot before any work is done for it.
        for s in &mut self.active {
            s.done |= s.job.events.is_closed();
        }
        if let Some(i) = self.active.iter().position(|s| !s.done && !s.prefilled())
            && let Err(e) = self.prefill(i)
        {
            self.fail_all(&e);
            return;
        }
        let ready: Vec<usize> = (0..self.active.len())
            .filter(|&i| {
                let s = &self.active[i];
                !s.done && s.prefilled() && !s.generated.is_empty()
            })
            .collect();
        // One pass per choice of adapters: a pass applies one set.
        let mut by_lora: Vec<Vec<usize>> = Vec::new();
        for i in ready {
            let same = |g: &Vec<usize>| {
                let (a, b) = (&self.active[g[0]].lora, &self.active[i].lora);
                match (a, b) {
                    (None, None) => true,
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                }
            };
            match by_lora.iter_mut().find(|g| same(g)) {
                Some(g) => g.push(i),
                None => by_lora.push(vec![i]),
            }
        }
        for group in by_lora.iter().flat_map(|g| g.chunks(DECODE_ROWS)) {
            if let Err(e) = self.decode(group) {
                self.fail_all(&e);
                return;
            }
        }
    }

    /// Prefills the next chunk of sequence `i`'s prompt; after its last chunk, its first token.
    fn prefill(&mut self, i: usize) -> Result<(), String> {
        let s = &self.active[i];
        let end = (s.fed + PREFILL_CHUNK).min(s.job.prompt_ids.len());
        let chunk = &s.job.prompt_ids[s.fed..end];
        let t = Instant::now();
        let logits = self
            .model
            .forward_batch_with(
                &mut self.state,
                &[(s.slot, chunk)],
                false,
                s.lora.as_deref(),
            )
            .map_err(|e| e.to_string())?;
        let tokens = chunk.len();
        let s = &mut self.active[i];
        s.fed = end;
        if s.prefilled() {
            // A recurrent model's state at the end of the prompt, for a later request that
            // shares the prompt (nothing to copy for attention-only models).
            self.state.checkpoint(s.slot);
            let s = &mut self.active[i];
            let logits = match s.constraint.as_mut().map(TokenConstraint::compute_bias) {
                None => logits,
                Some(Ok(bias)) => apply_bias(logits, 0, bias).map_err(|e| e.to_string())?,
                Some(Err(e)) => {
                    self.end_with_error(i, &e.to_string());
                    self.metrics.prefill(tokens, t.elapsed());
                    return Ok(());
                }
            };
            let token = self.choose(i, logits)?;
            self.metrics.prefill(tokens, t.elapsed());
            self.metrics.first_token_generated();
            let s = &self.active[i];
            self.metrics.first_token(s.received.elapsed());
            self.accept(i, token);
        } else {
            // The logits of a middle chunk are not needed; the pass ran all the same.
            drop(logits);
            self.metrics.prefill(tokens, t.elapsed());
        }
        Ok(())
    }

    /// One decode pass over sequences `group` (each past its prompt, with a last token): each
    /// sequence's last token, and its drafted tokens where it drafts (within [`DECODE_ROWS`]
    /// rows in all).
    fn decode(&mut self, group: &[usize]) -> Result<(), String> {
        let t = Instant::now();
        let rows = self.draft_rows(group);
        let drafted = rows.iter().any(|r| r.len() > 1);
        // Where each sequence's rows start in the logits (every row's logits with drafts, else
        // each sequence's one row).
        let mut offsets = Vec::with_capacity(group.len());
        let mut at = 0;
        for r in &rows {
            offsets.push(at);
            at += r.len();
        }
        let past: Vec<usize> = group
            .iter()
            .map(|&i| self.state.len(self.active[i].slot))
            .collect();
        for (&i, r) in group.iter().zip(&rows) {
            if r.len() > 1 {
                // A recurrent state cannot be cut back: copied before the verify pass.
                self.state.checkpoint_draft(self.active[i].slot);
            }
        }
        let seqs: Vec<(usize, &[u32])> = group
            .iter()
            .zip(&rows)
            .map(|(&i, r)| (self.active[i].slot, &r[..]))
            .collect();
        let lora = self.active[group[0]].lora.clone();
        // The constrained rows' masks, computed beside the pass.
        let mut constrained: Vec<(usize, TokenConstraint)> = (group.iter().enumerate())
            .filter_map(|(k, &i)| Some((offsets[k], self.active[i].constraint.take()?)))
            .collect();
        let (model, state) = (self.model, &mut self.state);
        let (logits, biases) = std::thread::scope(|scope| {
            let masks = (!constrained.is_empty()).then(|| {
                scope.spawn(|| {
                    (constrained.iter_mut())
                        .map(|(_, c)| c.compute_bias())
                        .collect::<Vec<_>>()
                })
            });
            let logits = model.forward_batch_with(state, &seqs, drafted, lora.as_deref());
            let biases = masks.map(|h| h.join());
            (logits, biases)
        });
        let mut failed = Vec::new();
        let mut logits = logits.map_err(|e| e.to_string())?;
        if let Some(biases) = biases {
            let biases = biases.map_err(|_| "the grammar engine panicked".to_string())?;
            for ((row, c), bias) in constrained.into_iter().zip(biases) {
                let k = offsets.iter().position(|&o| o == row).unwrap_or(0);
                let i = group[k];
                self.active[i].constraint = Some(c);
                match bias {
                    Ok(b) => logits = apply_bias(logits, row, b).map_err(|e| e.to_string())?,
                    Err(e) => failed.push((i, e.to_string())),
                }
            }
        }
        for (i, e) in failed {
            self.end_with_error(i, &e);
        }
        let verdicts = self.choose_rows(group, &rows, &offsets, logits)?;
        let mut taken_total = 0;
        let mut refill: Vec<(usize, Vec<u32>)> = Vec::new();
        for (k, (&i, v)) in group.iter().zip(verdicts).enumerate() {
            if self.active[i].done {
                continue;
            }
            let draft = &rows[k][1..];
            if !draft.is_empty() {
                self.metrics.speculative(draft.len(), v.accepted);
                if let Some(d) = self.active[i].drafter.as_mut() {
                    d.record(draft.len(), v.accepted);
                }
            }
            // The accepted drafted tokens, then the model's own, until the sequence ends.
            let mut taken = 0;
            for &token in draft[..v.accepted].iter().chain([&v.next]) {
                self.accept(i, token);
                taken += 1;
                if self.active[i].done {
                    break;
                }
            }
            taken_total += taken;
            if draft.is_empty() {
                continue;
            }
            // The slot keeps the rows before the last token taken (which is not run yet).
            let slot = self.active[i].slot;
            let keep = past[k] + taken;
            let kept = self.state.truncate(slot, keep);
            if kept < keep && !self.active[i].done {
                let s = &self.active[i];
                let fed = s.job.prompt_ids.iter().chain(&s.generated);
                refill.push((slot, fed.skip(kept).take(keep - kept).copied().collect()));
            }
        }
        if !refill.is_empty() {
            // Recurrent states went back to their checkpoints: the accepted rows run again.
            let seqs: Vec<(usize, &[u32])> = refill.iter().map(|(s, r)| (*s, &r[..])).collect();
            let again = self
                .model
                .forward_batch_with(&mut self.state, &seqs, false, lora.as_deref())
                .map_err(|e| e.to_string())?;
            drop(again);
        }
        self.metrics.decode(group.len(), taken_total, t.elapsed());
        Ok(())
    }

    /// Each sequence's rows for a decode pass: its last token, then its drafted tokens where
    /// it drafts, within [`DECODE_ROWS`] rows for the whole group and the sequence's
    /// `max_tokens`.
    fn draft_rows(&mut self, group: &[usize]) -> Vec<Vec<u32>> {
        let mut budget = DECODE_ROWS.saturating_sub(group.len());
        let mut rows = Vec::with_capacity(group.len());
        for &i in group {
            let s = &mut self.active[i];
            let mut r = vec![*s.generated.last().unwrap_or(&0)];
            // A pass yields the accepted tokens and one more.
            let room = s
                .job
                .max_tokens
                .saturating_sub(s.generated.len() + 1)
                .min(budget);
            if let Some(d) = s.drafter.as_mut()
                && room > 0
            {
                let history: Vec<u32> = s
                    .job
                    .prompt_ids
                    .iter()
                    .chain(&s.generated)
                    .copied()
                    .collect();
                let mut draft = d.draft(&history, room);
                // Nothing follows an end-of-generation token.
                if let Some(end) = draft.iter().position(|&t| self.tokenizer.is_eog(t)) {
                    draft.truncate(end + 1);
                }
                budget -= draft.len();
                r.extend(draft);
            }
            rows.push(r);
        }
        rows
    }

    /// Ends sequence `i` alone with an error (its grammar failed); the batch goes on.
    fn end_with_error(&mut self, i: usize, message: &str) {
        let s = &mut self.active[i];
        let _ = s.job.events.send(Event::Error(message.to_string()));
        s.done = true;
    }

    /// Each sequence of `group`'s verdict from its rows of `logits` (sequence `k`'s
    /// `rows[k].len()` rows from row `offsets[k]`: its last token's, then its drafted tokens'):
    /// the drafted tokens accepted and the next token. One argmax read for all rows when every
    /// sequence is greedy without log-probabilities; else each sequence on its own.
    fn choose_rows(
        &mut self,
        group: &[usize],
        rows: &[Vec<u32>],
        offsets: &[usize],
        logits: Tensor<2>,
    ) -> Result<Vec<Verdict>, String> {
        let simple = |s: &Sequence| s.sampler.config().is_greedy() && s.job.logprobs.is_none();
        if group.iter().all(|&i| simple(&self.active[i])) {
            let ids = logits
                .argmax(1)
                .try_into_data()
                .map_err(|e| format!("{e:?}"))?;
            let ids: Vec<u32> = ids.iter::<i64>().map(|v| v as u32).collect();
            return Ok((rows.iter().zip(offsets))
                .map(|(r, &at)| {
                    let accepted = (r[1..].iter().zip(&ids[at..]))
                        .take_while(|(d, t)| d == t)
                        .count();
                    Verdict {
                        accepted,
                        next: ids[at + accepted],
                    }
                })
                .collect());
        }
        let mut out = Vec::with_capacity(group.len());
        for ((r, &at), &i) in rows.iter().zip(offsets).zip(group) {
            let own = logits.clone().narrow(0, at, r.len());
            out.push(if r.len() == 1 {
                Verdict {
                    accepted: 0,
                    next: self.choose(i, own)?,
                }
            } else {
                let sampler = &mut self.active[i].sampler;
                verify(own, &r[1..], sampler).map_err(|e| e.to_string())?
            });
        }
        Ok(out)
    }

    /// Sequence `i`'s next token from `logits` `[1, vocab]`, with its log-probabilities when
    /// the request asked for them.
    fn choose(&mut self, i: usize, logits: Tensor<2>) -> Result<u32, String> {
        let s = &mut self.active[i];
        let token =
            sample_from(logits.clone(), &mut s.sampler, self.from).map_err(|e| e.to_string())?;
        if let Some(k) = s.job.logprobs {
            let lp = logprobs(self.tokenizer, logits, token, k)?;
            self.active[i].logprobs.push(lp);
        }
        Ok(token)
    }

    /// Takes sequence `i`'s new `token`: sends the text it completes, ends the sequence on an
    /// end-of-generation token, a stop string or its length.
    fn accept(&mut self, i: usize, token: u32) {
        let tokenizer = self.tokenizer;
        let seq = &mut self.active[i];
        seq.generated.push(token);
        let mut eog = tokenizer.is_eog(token);
        // The grammar takes the token; once it is complete nothing but the end may follow, so
        // the sequence ends here instead of spending a pass on the end token.
        if !eog && let Some(c) = seq.constraint.as_mut() {
            if let Err(e) = c.commit(token) {
                let _ = seq.job.events.send(Event::Error(e.to_string()));
                seq.done = true;
                return;
            }
            eog = c.is_done();
        }
        let last = eog || seq.generated.len() >= seq.job.max_tokens;
        // Text grows only by complete UTF-8, except at the end, where the last (lossy) decode
        // is taken as `run` does.
        let ids = match seq.generated.split_last() {
            Some((&t, rest)) if tokenizer.is_eog(t) => rest,
            _ => &seq.generated[..],
        };
        if let Ok(full) = tokenizer.decode_with(ids, seq.job.special_text)
            && (last || !full.ends_with('\u{FFFD}'))
            && full.starts_with(seq.text.as_str())
        {
            seq.text = full;
        }
        let finish = if let Some(at) = first_stop(&seq.text, &seq.job.stop) {
            flush(seq, at, true);
            Some(FinishReason::Stop)
        } else if last {
            flush(seq, seq.text.len(), true);
            Some(if eog {
                FinishReason::Stop
            } else {
                FinishReason::Length
            })
        } else {
            // Hold back a tail that could be the start of a stop string.
            let safe = seq.text.len() - held_back(&seq.text, &seq.job.stop);
            flush(seq, safe, false);
            None
        };
        if let Some(reason) = finish {
            let _ = seq.job.events.send(Event::Done {
                finish_reason: reason,
                prompt_tokens: seq.job.prompt_ids.len(),
                completion_tokens: seq.generated.len(),
            });
            seq.done = true;
        }
    }

    /// Ends every running sequence with `message` and starts a fresh batch state (a failed
    /// pass leaves it empty).
    fn fail_all(&mut self, message: &str) {
        for s in &mut self.active {
            if !s.done {
                let _ = s.job.events.send(Event::Error(message.to_string()));
                s.done = true;
            }
        }
        self.state = BatchState::new(self.state.slots()).with_limit(self.state.limit());
        for c in &mut self.cached {
            c.clear();
        }
    }
}

/// Blocks of the KV cache a job may hold at most: its prompt and `max_tokens` (within the
/// context: [`super::api::max_tokens_for`]).
fn longest(job: &Job) -> usize {
    (job.prompt_ids.len().saturating_add(job.max_tokens)).div_ceil(KV_BLOCK)
}

/// Sends `text[sent..upto]` (if any) with the log-probabilities gathered since the last
/// text, and advances `sent`; at the `end`, sends the remaining log-probabilities even with
/// no new text.
fn flush(seq: &mut Sequence, upto: usize, end: bool) {
    if upto > seq.sent || (end && !seq.logprobs.is_empty()) {
        let piece = seq.text[seq.sent..upto.max(seq.sent)].to_string();
        seq.sent = upto.max(seq.sent);
        let lps = std::mem::take(&mut seq.logprobs);
        let _ = seq.job.events.send(Event::Text(piece, lps));
    }
}

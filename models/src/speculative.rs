//! Exact speculative decoding, with drafts taken from the context (prompt lookup) or from a
//! smaller draft model sharing the target's vocabulary.
//!
//! A decode step reads every weight once whatever the number of rows it takes (up to
//! [`burn_gguf::tensor::MAX_GEMV_ROWS`] rows a GEMV pass), so checking several guessed tokens
//! costs little more than producing one. Each step of [`crate::generate_ids`] with speculation
//! on:
//!
//! 1. **draft**: [`NgramDrafter::draft`] looks up the last few tokens (an n-gram of
//!    [`NgramConfig::min_ngram`]..=[`NgramConfig::max_ngram`] tokens, longest first) earlier in
//!    the prompt and output ([`lookup`]) and proposes the tokens that followed its most recent
//!    occurrence: text that copies its prompt (a summary, an extraction, an edit of code)
//!    continues as it did there. No draft model, so the draft costs a scan of the ids on the
//!    host (llama.cpp `--spec-type ngram` / lookup decoding, Transformers' prompt lookup).
//!    Or [`ModelDrafter`]: a draft model ([`DraftModel`], any GGUF with the target's
//!    vocabulary) decodes the draft greedily from its own KV cache, kept in step with the
//!    accepted text (llama.cpp `--model-draft`).
//! 2. **verify**: the last sampled token and the `k` drafted tokens run as one pass of `k + 1`
//!    rows with every row's logits kept ([`verify_async`]); the recurrent layers' state is
//!    checkpointed before it ([`crate::CausalLm::checkpoint_draft`]).
//! 3. **accept**: greedy keeps the longest prefix of the draft that equals the rows' argmaxes
//!    plus the model's own token after it, so the text is token for token what plain greedy
//!    decoding gives; sampling uses the speculative-sampling acceptance rule
//!    ([`crate::Sampler::accept_draft`]: a drafted token `d` is kept with probability `p(d)`,
//!    else the token is drawn from `p` without `d`), so each token's distribution is the
//!    sampler's (Leviathan et al. 2023, for a draft that puts all its mass on one token).
//! 4. **roll back**: the cache keeps the accepted rows only. A KV cache is written in place,
//!    so only its length moves ([`crate::CausalLm::truncate_cache`]); a recurrent state goes
//!    back to the checkpoint and the accepted rows run again.
//!
//! The draft length adapts ([`Drafter::record`]): it doubles after a draft is accepted
//! whole, shrinks to one past the accepted part after a partial one, and after a draft of
//! which nothing was accepted the drafter waits 1, 3, 7 then 15 steps before it looks again,
//! so text that copies nothing runs almost as plain decoding does.
use crate::Error;
use crate::decoder::Decoder;
use crate::generate::SampleFrom;
use crate::sampling::Sampler;
use crate::state::SequenceState;
use burn::tensor::Tensor;
use std::sync::Arc;

/// Most tokens a draft holds by default: with the last sampled token they make
/// [`burn_gguf::tensor::MAX_GEMV_ROWS`] rows, one GEMV pass.
pub const DEFAULT_DRAFT_MAX: usize = burn_gguf::tensor::MAX_GEMV_ROWS - 1;

/// The most tokens a draft may hold ([`NgramConfig::draft_max`]): the verify pass stays on the
/// batched GEMV ([`burn_gguf::tensor::GEMV_BATCH_ROWS`] rows).
pub const DRAFT_MAX_LIMIT: usize = burn_gguf::tensor::GEMV_BATCH_ROWS - 1;

/// How a [`crate::Session`] decodes: one pass per token, or with drafts verified in one pass.
#[derive(Clone, Debug, Default)]
pub enum Speculation {
    /// One forward pass per token.
    #[default]
    Off,
    /// Drafts from the context ([`lookup`]), verified exactly.
    Ngram(NgramConfig),
    /// Drafts from a draft model, verified exactly.
    Draft(DraftModel),
}

/// A draft model for [`Speculation::Draft`]: a smaller model with the target's vocabulary
/// (the same ids for the same tokens: the same tokenizer), on the same device.
#[derive(Clone)]
pub struct DraftModel {
    /// The draft model.
    pub model: Arc<Decoder>,
    /// Most tokens one draft holds (1..=[`DRAFT_MAX_LIMIT`]).
    pub draft_max: usize,
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModel")
            .field("architecture", &self.model.config().architecture)
            .field("n_layers", &self.model.config().n_layers)
            .field("draft_max", &self.draft_max)
            .finish()
    }
}

/// Parameters of prompt-lookup drafting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest n-gram looked up (at least 1).
    pub min_ngram: usize,
    /// Longest n-gram looked up (tried first).
    pub max_ngram: usize,
    /// Most tokens one draft holds (1..=[`DRAFT_MAX_LIMIT`]).
    pub draft_max: usize,
}

impl Default for NgramConfig {
    /// Bigrams to 4-grams (llama.cpp's lookup decoding looks up 1- to 4-grams; a single token
    /// matches too often to be worth a pass), drafts of up to [`DEFAULT_DRAFT_MAX`] tokens.
    fn default() -> Self {
        Self {
            min_ngram: 2,
            max_ngram: 4,
            draft_max: DEFAULT_DRAFT_MAX,
        }
    }
}

impl NgramConfig {
    /// Checks the bounds.
    ///
    /// # Errors
    /// [`Error::Model`] naming the field out of range.
    pub fn validate(&self) -> Result<(), Error> {
        if self.min_ngram == 0 || self.min_ngram > self.max_ngram {
            return Err(Error::Model(format!(
                "n-gram sizes {}..={} are not a range of at least 1",
                self.min_ngram, self.max_ngram
            )));
        }
        if !(1..=DRAFT_MAX_LIMIT).contains(&self.draft_max) {
            return Err(Error::Model(format!(
                "draft_max {} is not in 1..={DRAFT_MAX_LIMIT}",
                self.draft_max
            )));
        }
        Ok(())
    }
}

/// The continuation of the most recent earlier occurrence of `history`'s last `n` tokens, for
/// `n` from `max_ngram` down to `min_ngram` (the first `n` that occurs wins), at most
/// `max_len` tokens; empty when none occurs. A slice of `history`.
pub fn lookup(history: &[u32], min_ngram: usize, max_ngram: usize, max_len: usize) -> &[u32] {
    let len = history.len();
    if max_len == 0 {
        return &[];
    }
    for n in (min_ngram.max(1)..=max_ngram).rev() {
        if n >= len {
            continue;
        }
        let pattern = &history[len - n..];
        // Starts up to `len - n - 1`: at least one token follows the occurrence.
        if let Some(start) = (0..len - n).rev().find(|&s| history[s..s + n] == *pattern) {
            let from = start + n;
            return &history[from..(from + max_len).min(len)];
        }
    }
    &[]
}

/// Counts of one generation's speculation.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpecStats {
    /// Verify passes run (each also yields the model's own next token).
    pub verify_passes: usize,
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafted tokens the model accepted.
    pub accepted: usize,
}

impl SpecStats {
    /// Accepted over drafted tokens (0 with no draft).
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// Tokens a verify pass gave on average: the accepted drafted ones plus the model's own.
    pub fn tokens_per_pass(&self) -> f64 {
        (self.accepted + self.verify_passes) as f64 / self.verify_passes.max(1) as f64
    }
}

/// How long the next draft may be: doubled after a draft accepted whole, one past the
/// accepted part after a partial one, and after a draft of which nothing was accepted one
/// token, after waiting 1, 3, 7, then 15 steps.
#[derive(Clone, Debug)]
struct DraftLength {
    max: usize,
    /// Most tokens the next draft holds.
    len: usize,
    /// Steps to go before the next draft.
    wait: usize,
    /// Drafts in a row of which nothing was accepted.
    misses: u32,
}

impl DraftLength {
    fn new(max: usize) -> Self {
        Self {
            max,
            len: max,
            wait: 0,
            misses: 0,
        }
    }

    /// The next draft's bound within `room` (0 while waiting, counting the step).
    fn next(&mut self, room: usize) -> usize {
        if self.wait > 0 {
            self.wait -= 1;
            return 0;
        }
        self.len.min(room)
    }

    fn record(&mut self, drafted: usize, accepted: usize) {
        if accepted >= drafted {
            self.len = (self.len * 2).min(self.max);
            self.misses = 0;
        } else if accepted == 0 {
            self.len = 1;
            self.misses += 1;
            self.wait = (1usize << self.misses.min(4)) - 1;
        } else {
            self.len = accepted + 1;
            self.misses = 0;
        }
    }
}

/// Prompt-lookup drafts with a draft length that follows the acceptance (see the module docs).
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    config: NgramConfig,
    length: DraftLength,
}

impl NgramDrafter {
    /// A drafter starting at `config.draft_max` tokens.
    pub fn new(config: NgramConfig) -> Self {
        let length = DraftLength::new(config.draft_max);
        Self { config, length }
    }

    /// The draft after `history` (the prompt and the tokens generated so far, the last one
    /// not yet run), at most `room` tokens; empty while the drafter waits or nothing matches.
    pub fn draft(&mut self, history: &[u32], room: usize) -> Vec<u32> {
        let c = &self.config;
        match self.length.next(room) {
            0 => Vec::new(),
            len => lookup(history, c.min_ngram, c.max_ngram, len).to_vec(),
        }
    }

    /// Adapts the draft length to a verify pass that accepted `accepted` of `drafted` tokens.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.length.record(drafted, accepted);
    }
}

/// Drafts from a draft model: its greedy tokens after the history, from its own KV cache,
/// which keeps the longest prefix it shares with each new history (the rejected drafted tokens
/// are cut off, a recurrent state going back to the checkpoint taken before them).
#[derive(Debug)]
pub struct ModelDrafter {
    draft: DraftModel,
    cache: SequenceState,
    /// The ids whose state `cache` holds.
    ids: Vec<u32>,
    length: DraftLength,
}

impl ModelDrafter {
    /// A drafter over `draft`, with an empty cache.
    pub fn new(draft: DraftModel) -> Self {
        let length = DraftLength::new(draft.draft_max);
        Self {
            draft,
            cache: SequenceState::new(),
            ids: Vec::new(),
            length,
        }
    }

    /// The draft after `history` (as [`NgramDrafter::draft`] takes it), at most `room`
    /// tokens: the draft model's greedy tokens, one pass and one id read back each (the
    /// history's tokens its cache lacks run in the first pass), up to the first token `stop`
    /// holds (an end of generation); none once the history passes the draft model's context
    /// (`context_length`, and [`Decoder::max_kv_positions`]).
    ///
    /// # Errors
    /// A model or device error of the draft model.
    pub async fn draft_async(
        &mut self,
        history: &[u32],
        room: usize,
        stop: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<u32>, Error> {
        let k = self.length.next(room);
        // Past the draft model's context the target decodes alone.
        let model = &self.draft.model;
        let fits = model.config().context_length.min(model.max_kv_positions());
        if k == 0 || history.is_empty() || history.len() + k > fits {
            return Ok(Vec::new());
        }
        let common = (self.ids.iter().zip(history))
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len() - 1);
        let kept = self.cache.truncate(common);
        self.ids.truncate(kept);
        self.cache.checkpoint_draft();
        let model = &self.draft.model;
        let mut out = Vec::with_capacity(k);
        let mut ids = history[kept..].to_vec();
        while out.len() < k {
            let logits = model.forward(&ids, &mut self.cache, false)?;
            self.ids.extend_from_slice(&ids);
            let token = read_ids(logits.argmax(1)).await?[0];
            out.push(token);
            if stop(token) {
                break;
            }
            ids = vec![token];
        }
        Ok(out)
    }

    /// Adapts the draft length to a verify pass that accepted `accepted` of `drafted` tokens.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.length.record(drafted, accepted);
    }
}

/// A session's drafter: the [`Speculation`] it was set up with, and its state.
#[derive(Debug)]
pub enum Drafter {
    /// Prompt lookup.
    Ngram(NgramDrafter),
    /// A draft model.
    Model(Box<ModelDrafter>),
}

impl Drafter {
    /// The drafter of `speculation` (`None` for [`Speculation::Off`]).
    ///
    /// # Errors
    /// [`Error::Model`] for parameters out of range.
    pub fn new(speculation: &Speculation) -> Result<Option<Self>, Error> {
        Ok(match speculation {
            Speculation::Off => None,
            Speculation::Ngram(c) => {
                c.validate()?;
                Some(Drafter::Ngram(NgramDrafter::new(c.clone())))
            }
            Speculation::Draft(d) => {
                if !(1..=DRAFT_MAX_LIMIT).contains(&d.draft_max) {
                    return Err(Error::Model(format!(
                        "draft_max {} is not in 1..={DRAFT_MAX_LIMIT}",
                        d.draft_max
                    )));
                }
                Some(Drafter::Model(Box::new(ModelDrafter::new(d.clone()))))
            }
        })
    }

    /// The draft after `history`, at most `room` tokens; a draft model stops after a token
    /// `stop` holds (an end of generation: the caller cuts a draft there in any case).
    ///
    /// # Errors
    /// A draft model's model or device error.
    pub async fn draft_async(
        &mut self,
        history: &[u32],
        room: usize,
        stop: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<u32>, Error> {
        match self {
            Drafter::Ngram(d) => Ok(d.draft(history, room)),
            Drafter::Model(d) => d.draft_async(history, room, stop).await,
        }
    }

    /// Adapts the draft length to a verify pass that accepted `accepted` of `drafted` tokens.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        match self {
            Drafter::Ngram(d) => d.record(drafted, accepted),
            Drafter::Model(d) => d.record(drafted, accepted),
        }
    }
}

/// The verdict on a draft: how many drafted tokens are accepted, and the token after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Leading drafted tokens accepted.
    pub accepted: usize,
    /// The model's token after them: its correction at the first rejected position, or its
    /// next token after a draft accepted whole.
    pub next: u32,
}

/// [`verify_async`], blocking on the read-backs (on wasm use [`verify_async`]).
///
/// # Errors
/// A failed device read-back.
///
/// # Panics
/// If `logits` does not have `draft.len() + 1` rows (a programming error of the caller).
pub fn verify(logits: Tensor<2>, draft: &[u32], sampler: &mut Sampler) -> Result<Verdict, Error> {
    crate::generate::read_now(verify_async(logits, draft, sampler))
}

/// Checks `draft` against the logits of a verify pass, `logits` `[draft.len() + 1, vocab]`
/// (row `i` predicts the token after draft token `i - 1`, row 0 the token after the last
/// sampled one). Greedy reads back one argmax id per row; sampling reads each row's
/// candidates (where [`SampleFrom::for_device`] says, as [`crate::generate::next_token`]
/// does) and walks
/// the draft with [`Sampler::accept_draft`], drawing the token after a draft accepted whole
/// from the last row with [`Sampler::sample_candidates`].
///
/// # Errors
/// A failed device read-back.
///
/// # Panics
/// If `logits` does not have `draft.len() + 1` rows (a programming error of the caller).
pub async fn verify_async(
    logits: Tensor<2>,
    draft: &[u32],
    sampler: &mut Sampler,
) -> Result<Verdict, Error> {
    let rows = logits.dims()[0];
    let from = SampleFrom::for_device(&logits.device());
    assert_eq!(
        rows,
        draft.len() + 1,
        "verify: {rows} rows for a draft of {}",
        draft.len()
    );
    if sampler.config().is_greedy() {
        let ids = read_ids(logits.argmax(1)).await?;
        let accepted = draft.iter().zip(&ids).take_while(|(d, t)| d == t).count();
        return Ok(Verdict {
            accepted,
            next: ids[accepted],
        });
    }
    let candidates = row_candidates(logits, sampler, from).await?;
    for (i, (&d, row)) in draft.iter().zip(&candidates).enumerate() {
        if let Some(next) = sampler.accept_draft(row, d) {
            return Ok(Verdict { accepted: i, next });
        }
    }
    Ok(Verdict {
        accepted: draft.len(),
        next: sampler.sample_candidates(&candidates[draft.len()]),
    })
}

/// Reads back an Int tensor of ids, `[rows, 1]`.
async fn read_ids(ids: Tensor<2, burn::tensor::Int>) -> Result<Vec<u32>, Error> {
    let data = ids.into_data_async().await.map_err(device)?;
    Ok(data.iter::<i64>().map(|id| id as u32).collect())
}

fn device(e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("{e:?}"))
}

/// Each row's sampling candidates `(logit, id)`, best first, as [`Sampler::sample_candidates`]
/// takes them: the device's top-k where [`SampleFrom::Candidates`] and `top_k` allow, else
/// from the rows read back; a row without a finite logit gives its argmax alone.
async fn row_candidates(
    logits: Tensor<2>,
    sampler: &Sampler,
    from: SampleFrom,
) -> Result<Vec<Vec<(f32, u32)>>, Error> {
    let [rows, vocab] = logits.dims();
    let k = sampler.config().top_k;
    let mut out: Vec<Vec<(f32, u32)>> = Vec::with_capacity(rows);
    if from == SampleFrom::Candidates && (1..=burn_gguf::sampling::TOP_K_MAX).contains(&k) {
        let (values, ids) = burn_gguf::top_k(logits.clone(), k);
        let values = values.into_data_async().await.map_err(device)?;
        let ids = ids.into_data_async().await.map_err(device)?;
        let pairs: Vec<(f32, u32)> = values
            .iter::<f32>()
            .zip(ids.iter::<i64>())
            .map(|(v, id)| (v, id as u32))
            .collect();
        for row in pairs.chunks(k) {
            out.push(
                row.iter()
                    .copied()
                    .filter(|&(_, id)| id != burn_gguf::sampling::NO_ID)
                    .collect(),
            );
        }
        if out.iter().all(|c| !c.is_empty()) {
            return Ok(out);
        }
        out.clear();
    }
    let data = logits
        .into_data_async()
        .await
        .map_err(device)?
        .try_to_vec::<f32>()
        .map_err(device)?;
    let keep = if k == 0 { vocab } else { k };
    for row in data.chunks(vocab.max(1)) {
        let c = burn_gguf::sampling::top_k_row(row, keep);
        out.push(if c.is_empty() {
            vec![(0.0, crate::sampling::argmax(row))]
        } else {
            c
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_longest_most_recent_match() {
        // "a b c d | a b x | a b" : the bigram "a b" last occurred before "x".
        let h = [1, 2, 3, 4, 1, 2, 9, 1, 2];
        assert_eq!(lookup(&h, 2, 4, 3), &[9, 1, 2]);
        // The trigram "4 1 2" occurs once, earlier: longest n wins over recency.
        let h = [4, 1, 2, 3, 5, 1, 2, 7, 4, 1, 2];
        assert_eq!(lookup(&h, 2, 4, 2), &[3, 5]);
        // Nothing repeats: no draft; a draft never runs past the history.
        assert!(lookup(&[1, 2, 3, 4], 2, 4, 5).is_empty());
        assert_eq!(lookup(&[7, 7, 7], 2, 2, 5), &[7]);
        assert!(lookup(&[1, 2, 1, 2], 2, 4, 0).is_empty());
        assert!(lookup(&[], 1, 4, 3).is_empty());
    }

    #[test]
    fn draft_length_follows_acceptance() {
        let mut d = NgramDrafter::new(NgramConfig {
            draft_max: 6,
            ..NgramConfig::default()
        });
        let h: Vec<u32> = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2].to_vec();
        assert_eq!(d.draft(&h, 100), vec![3, 4, 5, 6, 7, 8]);
        assert_eq!(d.draft(&h, 2), vec![3, 4], "bounded by the room left");
        d.record(6, 2);
        assert_eq!(d.draft(&h, 100).len(), 3);
        d.record(3, 3);
        assert_eq!(d.draft(&h, 100).len(), 6);
        // A draft rejected whole: one token next time, after waiting 1, then 3 steps.
        d.record(6, 0);
        assert!(d.draft(&h, 100).is_empty());
        assert_eq!(d.draft(&h, 100), vec![3]);
        d.record(1, 0);
        for _ in 0..3 {
            assert!(d.draft(&h, 100).is_empty());
        }
        assert_eq!(d.draft(&h, 100), vec![3]);
    }

    #[test]
    fn config_bounds() {
        assert!(NgramConfig::default().validate().is_ok());
        let bad = |min_ngram, max_ngram, draft_max| NgramConfig {
            min_ngram,
            max_ngram,
            draft_max,
        };
        assert!(bad(0, 2, 4).validate().is_err());
        assert!(bad(3, 2, 4).validate().is_err());
        assert!(bad(1, 2, 0).validate().is_err());
        assert!(bad(1, 2, DRAFT_MAX_LIMIT + 1).validate().is_err());
    }
}

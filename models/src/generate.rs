//! Text generation with a KV cache: prefill the prompt in one forward pass, then decode one
//! token a pass, or several with speculation ([`Session::set_speculation`],
//! [`crate::speculative`]).
use crate::Error;
use crate::sampling::Sampler;
use crate::speculative::{Drafter, SpecStats, Speculation, verify_async};
use crate::tokenizer::GgufTokenizer;
use burn::tensor::Tensor;
use std::time::Duration;
use web_time::Instant;

/// A causal language model that generation can drive.
pub trait CausalLm {
    /// Its per-sequence state (KV cache).
    type Cache;
    /// An empty cache.
    fn new_cache(&self) -> Self::Cache;
    /// Runs `ids` after the cached tokens and appends them to `cache`; logits `[ids.len(), vocab]`
    /// when `all_logits`, else `[1, vocab]` for the last token.
    ///
    /// # Errors
    /// Invalid ids or a context too long for the model.
    fn forward(
        &self,
        ids: &[u32],
        cache: &mut Self::Cache,
        all_logits: bool,
    ) -> Result<Tensor<2>, Error>;
    /// Drops all but the first `len` cached tokens; returns the tokens kept (fewer than `len`
    /// where the state cannot be cut back there, as a recurrent layer's).
    fn truncate_cache(&self, cache: &mut Self::Cache, len: usize) -> usize;
    /// Marks the cache's current length as one [`CausalLm::truncate_cache`] can go back to
    /// (a recurrent state's checkpoint). Nothing by default.
    fn checkpoint_cache(&self, _cache: &mut Self::Cache) {}
    /// [`CausalLm::checkpoint_cache`] for a speculative verify pass, kept apart from the
    /// prompt's checkpoint. Nothing by default: without it, cutting back rejected drafted
    /// tokens may keep fewer tokens, which generation then runs again.
    fn checkpoint_draft(&self, _cache: &mut Self::Cache) {}
}

impl CausalLm for crate::decoder::Decoder {
    type Cache = crate::state::SequenceState;
    fn new_cache(&self) -> Self::Cache {
        crate::state::SequenceState::new()
    }
    fn forward(
        &self,
        ids: &[u32],
        cache: &mut Self::Cache,
        all_logits: bool,
    ) -> Result<Tensor<2>, Error> {
        crate::decoder::Decoder::forward(self, ids, cache, all_logits)
    }
    fn truncate_cache(&self, cache: &mut Self::Cache, len: usize) -> usize {
        cache.truncate(len)
    }
    fn checkpoint_cache(&self, cache: &mut Self::Cache) {
        cache.checkpoint()
    }
    fn checkpoint_draft(&self, cache: &mut Self::Cache) {
        cache.checkpoint_draft()
    }
}

/// A conversation's KV cache and the token ids it holds, carried across turns: a new prompt
/// that starts with the same ids (a chat history rendered again) only runs its new tokens.
/// Also how it decodes ([`Session::set_speculation`]).
pub struct Session<C> {
    cache: C,
    ids: Vec<u32>,
    speculation: Speculation,
    drafter: Option<Drafter>,
}

impl<C> Session<C> {
    /// An empty session for `model`.
    pub fn new<M: CausalLm<Cache = C>>(model: &M) -> Self {
        Self::with_cache(model.new_cache())
    }

    /// An empty session over `cache` (for example a [`crate::SequenceState::with_capacity`]).
    pub fn with_cache(cache: C) -> Self {
        Self {
            cache,
            ids: Vec::new(),
            speculation: Speculation::Off,
            drafter: None,
        }
    }

    /// The ids whose keys and values are cached.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Decodes with `speculation` from the next generation on: drafts from the context or a
    /// draft model, verified in one pass ([`crate::speculative`]; the same greedy text, the
    /// same sampling distribution), or one pass per token ([`Speculation::Off`], the default).
    /// A draft model must share the target's vocabulary (the caller checks the tokenizers).
    ///
    /// # Errors
    /// [`Error::Model`] for a configuration out of range ([`crate::NgramConfig::validate`],
    /// a draft model's `draft_max`).
    pub fn set_speculation(&mut self, speculation: Speculation) -> Result<(), Error> {
        self.drafter = Drafter::new(&speculation)?;
        self.speculation = speculation;
        Ok(())
    }

    /// How the session decodes.
    pub fn speculation(&self) -> &Speculation {
        &self.speculation
    }
}

/// Wall-clock timings of one generation.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Timings {
    /// Prompt tokens processed in the prefill pass.
    pub prompt_tokens: usize,
    /// Time of the prefill pass, first token chosen included (ms).
    pub prompt_ms: f64,
    /// Tokens produced by decode steps (after the first).
    pub decode_tokens: usize,
    /// Time of the decode steps (ms).
    pub decode_ms: f64,
}

impl Timings {
    /// Prompt tokens per second.
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / (self.prompt_ms / 1e3).max(1e-9)
    }
    /// Decode tokens per second.
    pub fn decode_tps(&self) -> f64 {
        self.decode_tokens as f64 / (self.decode_ms / 1e3).max(1e-9)
    }
}

/// The result of [`generate`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct Generation {
    /// Tokenized prompt (BOS included when the tokenizer adds it).
    pub prompt_ids: Vec<u32>,
    /// New tokens, in order (an end-of-generation token is included when it stopped the run).
    pub generated_ids: Vec<u32>,
    /// Text of the new tokens.
    pub text: String,
    /// Timings.
    pub timings: Timings,
    /// Drafted and accepted tokens, with speculation on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpecStats>,
}

/// Where [`next_token`] draws from when the sampler is not greedy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleFrom {
    /// The device selects the top-k candidates ([`burn_gguf::top_k`]) and `k` values and ids
    /// are read back (a whole row instead when `top_k` is 0 or past
    /// [`burn_gguf::sampling::TOP_K_MAX`]).
    Candidates,
    /// The whole row is read back.
    Row,
}

impl SampleFrom {
    /// The cheaper one on `device`: [`SampleFrom::Row`] on a software device (its memory is the
    /// host's, so a row costs a copy, while selecting on its emulated cores costs the
    /// selection's `k` passes over the row: 80 ms a Gemma token for `k` = 40 on lavapipe against
    /// 3 ms on the host), else [`SampleFrom::Candidates`].
    pub fn for_device(device: &burn::tensor::Device) -> Self {
        if burn_gguf::is_software_device(device) {
            SampleFrom::Row
        } else {
            SampleFrom::Candidates
        }
    }
}

/// Picks the next token from logits `[1, vocab]`, reading back as little as the sampler needs:
/// greedy takes the argmax on the device (one id read back); otherwise it draws from where
/// [`SampleFrom::for_device`] says, the same token either way (see [`sample_from`]).
///
/// Blocks on the read-back: on wasm use [`next_token_async`].
///
/// # Errors
/// A failed device read-back.
pub fn next_token(logits: Tensor<2>, sampler: &mut Sampler) -> Result<u32, Error> {
    read_now(next_token_async(logits, sampler))
}

/// [`next_token`] awaiting the read-back instead of blocking on it (the browser's way).
///
/// # Errors
/// A failed device read-back.
pub async fn next_token_async(logits: Tensor<2>, sampler: &mut Sampler) -> Result<u32, Error> {
    let from = SampleFrom::for_device(&logits.device());
    sample_from_async(logits, sampler, from).await
}

/// [`next_token`] with the place to draw from given: greedy takes the argmax on the device (one
/// id read back); [`SampleFrom::Candidates`] with `top_k` in
/// 1..=[`burn_gguf::sampling::TOP_K_MAX`] draws from the device's top-k candidates
/// ([`Sampler::sample_candidates`], the same token as from the whole row); else the row is read
/// back for [`Sampler::sample`].
///
/// Blocks on the read-back: on wasm use [`sample_from_async`].
///
/// # Errors
/// A failed device read-back.
pub fn sample_from(
    logits: Tensor<2>,
    sampler: &mut Sampler,
    from: SampleFrom,
) -> Result<u32, Error> {
    read_now(sample_from_async(logits, sampler, from))
}

/// [`sample_from`] awaiting its read-backs instead of blocking on them.
///
/// # Errors
/// A failed device read-back.
pub async fn sample_from_async(
    logits: Tensor<2>,
    sampler: &mut Sampler,
    from: SampleFrom,
) -> Result<u32, Error> {
    fn read(e: impl std::fmt::Debug) -> Error {
        Error::Device(format!("{e:?}"))
    }
    let config = sampler.config();
    if config.is_greedy() {
        let data = logits.argmax(1).into_data_async().await.map_err(read)?;
        let id = data
            .iter::<i64>()
            .next()
            .ok_or_else(|| Error::Device("empty argmax".into()))?;
        return Ok(id as u32);
    }
    let k = config.top_k;
    if from == SampleFrom::Candidates
        && (1..=burn_gguf::sampling::TOP_K_MAX).contains(&k)
        && logits.dims()[1] > 1
    {
        let (values, ids) = burn_gguf::top_k(logits.clone(), k);
        let values = values.into_data_async().await.map_err(read)?;
        let ids = ids.into_data_async().await.map_err(read)?;
        let candidates: Vec<(f32, u32)> = values
            .iter::<f32>()
            .zip(ids.iter::<i64>())
            .map(|(v, id)| (v, id as u32))
            .filter(|&(_, id)| id != burn_gguf::sampling::NO_ID)
            .collect();
        if !candidates.is_empty() {
            return Ok(sampler.sample_candidates(&candidates));
        }
        // No finite logit: the host sampler's rule for that, from the row.
    }
    let row = logits
        .into_data_async()
        .await
        .map_err(read)?
        .try_to_vec::<f32>()
        .map_err(read)?;
    Ok(sampler.sample(&row))
}

/// Runs a future of device read-backs to its end on this thread, as Burn's blocking
/// `into_data` does: natively it blocks; on wasm, where a thread cannot wait for the GPU, it
/// fails unless the future is ready at once (call the `_async` function there).
pub(crate) fn read_now<T>(f: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
    burn::tensor::try_read_sync(f).unwrap_or_else(|| {
        Err(Error::Device(
            "a blocking device read-back is not possible on this platform (wasm): \
             use the _async function"
                .into(),
        ))
    })
}

/// Generates up to `max_new` tokens after `prompt` (encoded with the tokenizer's BOS rule),
/// calling `on_text` with each new piece of text as soon as it is complete UTF-8. Stops early at
/// an end-of-generation token.
///
/// Blocks on each token's read-back: on wasm use [`generate_async`].
///
/// # Errors
/// Tokenizer, model or device errors.
pub fn generate<M: CausalLm>(
    model: &M,
    tokenizer: &GgufTokenizer,
    prompt: &str,
    max_new: usize,
    sampler: &mut Sampler,
    on_text: impl FnMut(&str),
) -> Result<Generation, Error> {
    read_now(generate_async(
        model, tokenizer, prompt, max_new, sampler, on_text,
    ))
}

/// [`generate`] awaiting each token's read-back instead of blocking on it: the browser's way,
/// where the page's thread (or a worker's) must return to its event loop while the GPU works.
///
/// # Errors
/// Tokenizer, model or device errors.
pub async fn generate_async<M: CausalLm>(
    model: &M,
    tokenizer: &GgufTokenizer,
    prompt: &str,
    max_new: usize,
    sampler: &mut Sampler,
    on_text: impl FnMut(&str),
) -> Result<Generation, Error> {
    let prompt_ids = tokenizer.encode(prompt, true)?;
    let mut session = Session::new(model);
    generate_ids_async(
        model,
        tokenizer,
        &mut session,
        prompt_ids,
        max_new,
        sampler,
        on_text,
    )
    .await
}

/// [`generate`] from token ids in a [`Session`]: the longest prefix of `prompt_ids` already in
/// the session's cache is reused (for a model with recurrent layers, back to the end of the
/// previous prompt at most: its checkpoint), the rest is prefilled (`timings.prompt_tokens`
/// counts those). Afterwards the session holds `prompt_ids` and the generated tokens fed back.
///
/// Blocks on each token's read-back: on wasm use [`generate_ids_async`].
///
/// # Errors
/// An empty prompt; tokenizer, model or device errors.
pub fn generate_ids<M: CausalLm>(
    model: &M,
    tokenizer: &GgufTokenizer,
    session: &mut Session<M::Cache>,
    prompt_ids: Vec<u32>,
    max_new: usize,
    sampler: &mut Sampler,
    on_text: impl FnMut(&str),
) -> Result<Generation, Error> {
    read_now(generate_ids_async(
        model, tokenizer, session, prompt_ids, max_new, sampler, on_text,
    ))
}

/// [`generate_ids`] awaiting each token's read-back instead of blocking on it.
///
/// # Errors
/// An empty prompt; tokenizer, model or device errors.
pub async fn generate_ids_async<M: CausalLm>(
    model: &M,
    tokenizer: &GgufTokenizer,
    session: &mut Session<M::Cache>,
    prompt_ids: Vec<u32>,
    max_new: usize,
    sampler: &mut Sampler,
    mut on_text: impl FnMut(&str),
) -> Result<Generation, Error> {
    if prompt_ids.is_empty() {
        return Err(Error::Model("the prompt has no tokens".into()));
    }
    // Reuse the common prefix, but always run at least the last prompt token.
    let reuse = session
        .ids
        .iter()
        .zip(&prompt_ids)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt_ids.len() - 1);
    let reuse = model.truncate_cache(&mut session.cache, reuse);
    session.ids.truncate(reuse);
    let mut timings = Timings {
        prompt_tokens: prompt_ids.len() - reuse,
        ..Default::default()
    };
    let mut generated = Vec::new();
    let mut text = String::new();
    let mut emit = |generated: &[u32], text: &mut String| -> Result<(), Error> {
        let full = tokenizer.decode(generated)?;
        if full.len() > text.len() && !full.ends_with('\u{FFFD}') && full.starts_with(text.as_str())
        {
            on_text(&full[text.len()..]);
            *text = full;
        }
        Ok(())
    };
    let mut spec = session.drafter.as_ref().map(|_| SpecStats::default());
    if max_new == 0 {
        return Ok(Generation {
            prompt_ids,
            generated_ids: generated,
            text,
            timings,
            speculation: spec,
        });
    }

    let t0 = Instant::now();
    let logits = model.forward(&prompt_ids[reuse..], &mut session.cache, false)?;
    session.ids.extend_from_slice(&prompt_ids[reuse..]);
    // The next turn's prompt starts with this one: a recurrent state can go back here.
    model.checkpoint_cache(&mut session.cache);
    let mut token = next_token_async(logits, sampler).await?;
    timings.prompt_ms = ms(t0.elapsed());
    generated.push(token);
    emit(&generated, &mut text)?;

    let t1 = Instant::now();
    // The prompt and the tokens generated so far: where drafts are looked up.
    let mut history = prompt_ids.clone();
    history.push(token);
    while generated.len() < max_new && !tokenizer.is_eog(token) {
        // A verify pass yields the accepted tokens and one more: draft one fewer than room.
        let room = max_new - generated.len() - 1;
        let eog = |t: u32| tokenizer.is_eog(t);
        let mut draft = match session.drafter.as_mut() {
            Some(d) if room > 0 => d.draft_async(&history, room, &eog).await?,
            _ => Vec::new(),
        };
        // Nothing follows an end-of-generation token.
        if let Some(end) = draft.iter().position(|&t| eog(t)) {
            draft.truncate(end + 1);
        }
        if draft.is_empty() {
            let logits = model.forward(&[token], &mut session.cache, false)?;
            session.ids.push(token);
            token = next_token_async(logits, sampler).await?;
            generated.push(token);
            history.push(token);
            timings.decode_tokens += 1;
            emit(&generated, &mut text)?;
            continue;
        }
        let past = session.ids.len();
        let mut rows = Vec::with_capacity(draft.len() + 1);
        rows.push(token);
        rows.extend_from_slice(&draft);
        model.checkpoint_draft(&mut session.cache);
        let logits = model.forward(&rows, &mut session.cache, true)?;
        let verdict = verify_async(logits, &draft, sampler).await?;
        if let Some(d) = session.drafter.as_mut() {
            d.record(draft.len(), verdict.accepted);
        }
        if let Some(s) = spec.as_mut() {
            s.verify_passes += 1;
            s.drafted += draft.len();
            s.accepted += verdict.accepted;
        }
        // The new tokens, up to an end-of-generation token among the accepted ones.
        let mut new = draft[..verdict.accepted].to_vec();
        new.push(verdict.next);
        if let Some(end) = new.iter().position(|&t| tokenizer.is_eog(t)) {
            new.truncate(end + 1);
        }
        // The cache keeps the rows before the last new token (which is not run yet).
        let keep = past + new.len();
        let kept = model.truncate_cache(&mut session.cache, keep);
        session.ids.extend_from_slice(&rows[..new.len()]);
        if kept < keep {
            // A recurrent state went back to a checkpoint: run the kept rows again.
            model.forward(&session.ids[kept..keep], &mut session.cache, false)?;
        }
        for &t in &new {
            generated.push(t);
            history.push(t);
            emit(&generated, &mut text)?;
        }
        timings.decode_tokens += new.len();
        token = new[new.len() - 1];
    }
    timings.decode_ms = ms(t1.elapsed());
    let full = tokenizer.decode(&generated)?;
    if full.len() > text.len() && full.starts_with(text.as_str()) {
        on_text(&full[text.len()..]);
    }
    Ok(Generation {
        prompt_ids,
        generated_ids: generated,
        text: full,
        timings,
        speculation: spec,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

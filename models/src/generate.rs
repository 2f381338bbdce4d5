//! Text generation with a KV cache: prefill the prompt in one forward pass, then decode one
//! token at a time.
use crate::Error;
use crate::sampling::Sampler;
use crate::tokenizer::GgufTokenizer;
use burn::tensor::Tensor;
use std::time::{Duration, Instant};

/// A causal language model that generation can drive.
pub trait CausalLm {
    /// Its KV cache.
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
}

impl CausalLm for crate::decoder::Decoder {
    type Cache = crate::decoder::KvCache;
    fn new_cache(&self) -> Self::Cache {
        crate::decoder::KvCache::new()
    }
    fn forward(
        &self,
        ids: &[u32],
        cache: &mut Self::Cache,
        all_logits: bool,
    ) -> Result<Tensor<2>, Error> {
        crate::decoder::Decoder::forward(self, ids, cache, all_logits)
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
}

/// Picks the next token from logits `[1, vocab]`: argmax on the device when greedy (one id read
/// back), else the whole row to the host for the sampler.
///
/// # Errors
/// A failed device read-back.
pub fn next_token(logits: Tensor<2>, sampler: &mut Sampler) -> Result<u32, Error> {
    if sampler.config().is_greedy() {
        let data = logits
            .argmax(1)
            .try_into_data()
            .map_err(|e| Error::Device(format!("{e:?}")))?;
        let id = data
            .iter::<i64>()
            .next()
            .ok_or_else(|| Error::Device("empty argmax".into()))?;
        Ok(id as u32)
    } else {
        let data = logits
            .try_into_data()
            .map_err(|e| Error::Device(format!("{e:?}")))?;
        let row = data
            .try_to_vec::<f32>()
            .map_err(|e| Error::Device(format!("{e:?}")))?;
        Ok(sampler.sample(&row))
    }
}

/// Generates up to `max_new` tokens after `prompt`, calling `on_text` with each new piece of
/// text as soon as it is complete UTF-8. Stops early at an end-of-generation token.
///
/// # Errors
/// Tokenizer, model or device errors.
pub fn generate<M: CausalLm>(
    model: &M,
    tokenizer: &GgufTokenizer,
    prompt: &str,
    max_new: usize,
    sampler: &mut Sampler,
    mut on_text: impl FnMut(&str),
) -> Result<Generation, Error> {
    let prompt_ids = tokenizer.encode(prompt, true)?;
    if prompt_ids.is_empty() {
        return Err(Error::Model("the prompt has no tokens".into()));
    }
    let mut cache = model.new_cache();
    let mut timings = Timings {
        prompt_tokens: prompt_ids.len(),
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
    if max_new == 0 {
        return Ok(Generation {
            prompt_ids,
            generated_ids: generated,
            text,
            timings,
        });
    }

    let t0 = Instant::now();
    let logits = model.forward(&prompt_ids, &mut cache, false)?;
    let mut token = next_token(logits, sampler)?;
    timings.prompt_ms = ms(t0.elapsed());
    generated.push(token);
    emit(&generated, &mut text)?;

    let t1 = Instant::now();
    while generated.len() < max_new && !tokenizer.is_eog(token) {
        let logits = model.forward(&[token], &mut cache, false)?;
        token = next_token(logits, sampler)?;
        generated.push(token);
        timings.decode_tokens += 1;
        emit(&generated, &mut text)?;
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
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

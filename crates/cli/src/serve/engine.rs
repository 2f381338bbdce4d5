//! The generation engine of one served model: a worker thread that owns the model on the
//! device and runs its sequences with continuous batching.
//!
//! Every running sequence has a slot in one [`BatchState`] (its KV cache rows). Each round of
//! the worker takes the jobs that arrived, prefills one chunk of at most [`PREFILL_CHUNK`]
//! prompt tokens of one new sequence (so a long prompt does not stall the others for long),
//! then decodes one token of every sequence past its prompt in one forward pass
//! ([`Decoder::forward_batch`]; passes of [`DECODE_ROWS`] rows). A sequence joins at a round
//! boundary and leaves as soon as it ends or its client is gone, freeing its slot and its
//! concurrency permit.
//!
//! Requests reach the worker as [`Job`]s over a channel; text goes back as [`Event`]s over a
//! channel per job.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use burn::tensor::Tensor;
use burn_gguf_models::generate::{SampleFrom, sample_from};
use burn_gguf_models::{
    BatchState, ChatTemplate, Decoder, DecoderLora, GgufTokenizer, Sampler, SamplerConfig,
};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;

/// Prompt tokens one prefill pass takes: a longer prompt is prefilled in several rounds, each
/// followed by a decode step of the running sequences.
pub const PREFILL_CHUNK: usize = 256;

/// Sequences one decode pass takes (the fused GEMV's batch,
/// [`burn_gguf::tensor::GEMV_BATCH_ROWS`]); more run in further passes of the same round.
pub const DECODE_ROWS: usize = burn_gguf::tensor::GEMV_BATCH_ROWS;

/// Most `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Why a sequence ended, as OpenAI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// One candidate token and its log-probability.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (lossy where its bytes are part of a character).
    pub token: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Natural log of its probability under the model's distribution (the softmax of the
    /// logits, before temperature or truncation).
    pub logprob: f32,
}

/// The log-probability of a generated token and of the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct Logprobs {
    /// The generated token.
    pub chosen: TokenLogprob,
    /// The `top_logprobs` most likely tokens, most likely first.
    pub top: Vec<TokenLogprob>,
}

/// What the worker sends back for one job.
#[derive(Debug)]
pub enum Event {
    /// New text (complete UTF-8, never part of a stop string), and the log-probabilities of
    /// the tokens generated since the last text when the request asked for them.
    Text(String, Vec<Logprobs>),
    /// The end: why, and the token counts for `usage`.
    Done {
        /// Why generation ended.
        finish_reason: FinishReason,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens (an end-of-generation token included).
        completion_tokens: usize,
    },
    /// Generation failed (a model or device error); the message is for the client.
    Error(String),
}

/// One generation request, validated: the prompt fits the context with `max_tokens`.
pub struct Job {
    /// Prompt token ids (not empty).
    pub prompt_ids: Vec<u32>,
    /// Most new tokens (at least 1).
    pub max_tokens: usize,
    /// Sampling parameters.
    pub sampler: SamplerConfig,
    /// Stop strings: generation ends before the first occurrence of any.
    pub stop: Vec<String>,
    /// Log-probabilities: `None`, or `Some(k)` for the chosen token's and the `k` (at most
    /// [`MAX_TOP_LOGPROBS`]) most likely tokens'.
    pub logprobs: Option<usize>,
    /// The adapters to apply, `(id, scale)` with ids below [`ModelHandle::adapters`]'s
    /// length; `None` for every adapter at its `--lora-scale`.
    pub lora: Option<Vec<(usize, f32)>>,
    /// Where events go; closed when the client is gone.
    pub events: UnboundedSender<Event>,
    /// The concurrency slot this job holds until it is dropped.
    pub permit: OwnedSemaphorePermit,
}

/// What the worker shares about its model once loaded.
pub struct ModelHandle {
    /// Its tokenizer.
    pub tokenizer: Arc<GgufTokenizer>,
    /// Its chat template (the file's, or a built-in one).
    pub template: Arc<ChatTemplate>,
    /// Context length served: the model's, capped by `--ctx-size` and by what a KV cache of
    /// `--max-concurrent` sequences holds in the device's largest buffer
    /// ([`burn_gguf_models::Decoder::max_positions`]).
    pub n_ctx: usize,
    /// Sends jobs to the worker; dropping every sender ends the worker after its running jobs.
    pub jobs: mpsc::Sender<Job>,
    /// Sequences running on the worker now.
    pub running: Arc<AtomicUsize>,
    /// The LoRA adapter files loaded (`serve --lora`), by id, with their default scale.
    pub adapters: Vec<(PathBuf, f32)>,
    /// The worker thread.
    pub thread: std::thread::JoinHandle<()>,
}

/// Starts the worker thread of the model at `path`: it loads the model on `device` (a
/// [`burn_gguf::select_device`] choice; packed, or dequantized with `dequantize`) and then
/// serves jobs, up to `slots` sequences at once (the server's `--max-concurrent`). Returns once
/// the model is loaded.
///
/// # Errors
/// A load error as a message (the thread has ended then).
#[allow(clippy::too_many_arguments)]
pub fn start(
    path: PathBuf,
    device: Option<String>,
    dequantize: bool,
    ctx_cap: usize,
    slots: usize,
    lora: (Vec<PathBuf>, f32),
    metrics: Arc<Metrics>,
) -> Result<ModelHandle, String> {
    let (lora_paths, lora_scale) = lora;
    let adapters: Vec<(PathBuf, f32)> =
        lora_paths.iter().map(|p| (p.clone(), lora_scale)).collect();
    let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
    let (ready_tx, ready_rx) = mpsc::channel();
    let running = Arc::new(AtomicUsize::new(0));
    let running_w = running.clone();
    let thread = std::thread::Builder::new()
        .name(format!(
            "model {}",
            path.file_name().unwrap_or_default().to_string_lossy()
        ))
        .spawn(move || {
            let loaded = match crate::run::load(&path, device.as_deref(), dequantize, false) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let template = match ChatTemplate::from_gguf(&loaded.file, &loaded.tokenizer) {
                Ok(t) => t,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("{}: {e}", path.display())));
                    return;
                }
            };
            // Each file apart, so a request can choose among them.
            let mut loras = Vec::with_capacity(lora_paths.len());
            for p in &lora_paths {
                match crate::finetune::read_loras(&loaded.model, std::slice::from_ref(p), 1.0) {
                    Ok(Some(l)) => loras.push(l),
                    Ok(None) => {}
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                }
            }
            let tokenizer = Arc::new(loaded.tokenizer);
            let fits = loaded.model.max_positions(slots.max(1));
            if fits < loaded.model.config().context_length.min(ctx_cap) {
                tracing::warn!(
                    "{}: a KV cache of {} sequences holds {fits} positions each in this \
                     device's largest buffer; serving a context of {fits} tokens",
                    path.display(),
                    slots.max(1)
                );
            }
            let n_ctx = loaded.model.config().context_length.min(ctx_cap).min(fits);
            let _ = ready_tx.send(Ok((tokenizer.clone(), Arc::new(template), n_ctx)));
            drop(loaded.file);
            let mut worker = Worker {
                model: &loaded.model,
                tokenizer: &tokenizer,
                state: BatchState::new(slots.max(1)),
                free: (0..slots.max(1)).rev().collect(),
                waiting: VecDeque::new(),
                active: Vec::new(),
                metrics: &metrics,
                from: SampleFrom::for_device(loaded.model.device()),
                loras,
                lora_scale,
                merged: HashMap::new(),
            };
            worker.run(jobs_rx, &running_w);
        })
        .map_err(|e| format!("could not start a model thread: {e}"))?;
    match ready_rx.recv() {
        Ok(Ok((tokenizer, template, n_ctx))) => Ok(ModelHandle {
            tokenizer,
            template,
            n_ctx,
            jobs: jobs_tx,
            running,
            adapters,
            thread,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("the model thread ended while loading".into()),
    }
}

/// A running sequence.
struct Sequence {
    job: Job,
    /// The adapters its passes apply.
    lora: Option<Arc<DecoderLora>>,
    /// Its slot in the worker's [`BatchState`].
    slot: usize,
    sampler: Sampler,
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
struct Worker<'a> {
    model: &'a Decoder,
    tokenizer: &'a GgufTokenizer,
    state: BatchState,
    /// Free slots of `state`.
    free: Vec<usize>,
    /// Jobs waiting for a slot (only when more jobs reach this worker than it has slots).
    waiting: VecDeque<Job>,
    active: Vec<Sequence>,
    metrics: &'a Metrics,
    from: SampleFrom,
    /// The adapter files, by id, each at scale 1.
    loras: Vec<DecoderLora>,
    /// Their default scale.
    lora_scale: f32,
    /// The adapters of each choice made so far (`(id, scale bits)` pairs), built once.
    merged: HashMap<Vec<(usize, u32)>, Option<Arc<DecoderLora>>>,
}

impl Worker<'_> {
    /// Serves jobs until every sender is dropped and no sequence runs.
    fn run(&mut self, jobs: mpsc::Receiver<Job>, running: &AtomicUsize) {
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

    /// Gives waiting jobs free slots.
    fn admit(&mut self) {
        while !self.waiting.is_empty() {
            let Some(slot) = self.free.pop() else {
                break;
            };
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.metrics.request();
            self.state.truncate(slot, 0);
            let lora = self.lora_for(job.lora.as_deref());
            self.active.push(Sequence {
                lora,
                sampler: Sampler::new(job.sampler.clone()),
                job,
                slot,
                fed: 0,
                generated: Vec::new(),
                text: String::new(),
                sent: 0,
                logprobs: Vec::new(),
                received: Instant::now(),
                done: false,
            });
        }
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

    /// Drops ended sequences (and their permits) and frees their slots.
    fn retire(&mut self) {
        let free = &mut self.free;
        self.active.retain(|s| {
            let keep = !s.done && !s.job.events.is_closed();
            if !keep {
                free.push(s.slot);
            }
            keep
        });
    }

    /// One round: a prefill chunk of the first sequence still in its prompt, then one decode
    /// step of every sequence past its prompt. A failed pass ends every sequence (the batch
    /// state is lost with it).
    fn round(&mut self) {
        // A client that left frees its slot before any work is done for it.
        for s in &mut self.active {
            s.done |= s.job.events.is_closed();
        }
        if let Some(i) = self.active.iter().position(|s| !s.done && !s.prefilled()) {
            if let Err(e) = self.prefill(i) {
                self.fail_all(&e);
                return;
            }
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

    /// One decode pass over sequences `group` (each past its prompt, with a last token).
    fn decode(&mut self, group: &[usize]) -> Result<(), String> {
        let t = Instant::now();
        let last: Vec<[u32; 1]> = group
            .iter()
            .map(|&i| [*self.active[i].generated.last().unwrap_or(&0)])
            .collect();
        let seqs: Vec<(usize, &[u32])> = group
            .iter()
            .zip(&last)
            .map(|(&i, id)| (self.active[i].slot, &id[..]))
            .collect();
        let lora = self.active[group[0]].lora.clone();
        let logits = self
            .model
            .forward_batch_with(&mut self.state, &seqs, false, lora.as_deref())
            .map_err(|e| e.to_string())?;
        let tokens = self.choose_rows(group, logits)?;
        self.metrics.decode(group.len(), t.elapsed());
        for (&i, token) in group.iter().zip(tokens) {
            self.accept(i, token);
        }
        Ok(())
    }

    /// The next token of each sequence of `group` from its row of `logits` `[group.len(),
    /// vocab]`: one argmax read for all greedy rows without log-probabilities, each other row
    /// on its own.
    fn choose_rows(&mut self, group: &[usize], logits: Tensor<2>) -> Result<Vec<u32>, String> {
        let simple = |s: &Sequence| s.sampler.config().is_greedy() && s.job.logprobs.is_none();
        if group.iter().all(|&i| simple(&self.active[i])) {
            let ids = logits
                .argmax(1)
                .try_into_data()
                .map_err(|e| format!("{e:?}"))?;
            return Ok(ids.iter::<i64>().map(|v| v as u32).collect());
        }
        let mut out = Vec::with_capacity(group.len());
        for (r, &i) in group.iter().enumerate() {
            out.push(self.choose(i, logits.clone().narrow(0, r, 1))?);
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
        let eog = tokenizer.is_eog(token);
        let last = eog || seq.generated.len() >= seq.job.max_tokens;
        // Text grows only by complete UTF-8, except at the end, where the last (lossy) decode
        // is taken as `run` does.
        if let Ok(full) = tokenizer.decode(&seq.generated)
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
        self.state = BatchState::new(self.state.slots());
    }
}

/// The log-probability of `token` and the `k` most likely tokens under `logits` `[1, vocab]`:
/// the log-softmax and the selection run on the device; `k + 1` values come back.
fn logprobs(
    tokenizer: &GgufTokenizer,
    logits: Tensor<2>,
    token: u32,
    k: usize,
) -> Result<Logprobs, String> {
    fn read(e: impl std::fmt::Debug) -> String {
        format!("{e:?}")
    }
    let lp = burn::tensor::activation::log_softmax(logits, 1);
    let t = token as usize;
    let chosen = lp
        .clone()
        .slice([0..1, t..t + 1])
        .try_into_data()
        .map_err(read)?
        .iter::<f32>()
        .next()
        .unwrap_or(f32::NEG_INFINITY);
    let entry = |id: u32, logprob: f32| {
        let bytes = tokenizer.token_bytes(id, true).unwrap_or_default();
        TokenLogprob {
            token: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            logprob,
        }
    };
    let mut top = Vec::new();
    if k > 0 {
        let (values, ids) = burn_gguf::top_k(lp, k.min(MAX_TOP_LOGPROBS));
        let values = values.try_into_data().map_err(read)?;
        let ids = ids.try_into_data().map_err(read)?;
        top = values
            .iter::<f32>()
            .zip(ids.iter::<i64>())
            .filter(|&(_, id)| id as u32 != burn_gguf::sampling::NO_ID)
            .map(|(v, id)| entry(id as u32, v))
            .collect();
    }
    Ok(Logprobs {
        chosen: entry(token, chosen),
        top,
    })
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

/// Byte offset of the first occurrence of any stop string in `text`.
pub fn first_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

/// Length of the longest tail of `text` that is a proper prefix of a stop string (at a char
/// boundary): text that may still turn into a stop string and must not be sent yet.
pub fn held_back(text: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for s in stops {
        for (k, _) in s.char_indices().skip(1) {
            if k > best && text.ends_with(&s[..k]) {
                best = k;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_cut_and_hold_back() {
        let stops = vec!["</end>".to_string(), "\n\n".to_string()];
        assert_eq!(first_stop("abc</end>x", &stops), Some(3));
        assert_eq!(first_stop("a\n\nb</end>", &stops), Some(1));
        assert_eq!(first_stop("abc", &stops), None);
        assert_eq!(held_back("abc</e", &stops), 3);
        assert_eq!(held_back("abc\n", &stops), 1);
        assert_eq!(held_back("abc", &stops), 0);
        // Multi-byte characters: only char boundaries of the stop string count.
        let stops = vec!["é!".to_string()];
        assert_eq!(held_back("caf\u{e9}", &stops), 2);
    }
}

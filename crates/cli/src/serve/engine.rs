//! The generation engine of one served model: a worker thread that owns the model on the
//! device and interleaves the running sequences one forward pass at a time, each with its own
//! KV cache.
//!
//! Requests reach the worker as [`Job`]s over a channel; tokens go back as [`Event`]s over a
//! channel per job. A job whose receiver is gone (the client disconnected) is dropped before
//! its next step, which frees its concurrency permit at once.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use burn_gguf_models::{
    CausalLm, ChatTemplate, Decoder, GgufTokenizer, Sampler, SamplerConfig, SequenceState,
    generate::next_token,
};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::UnboundedSender;

/// Why a sequence ended, as OpenAI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
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

/// What the worker sends back for one job.
#[derive(Debug)]
pub enum Event {
    /// New text (complete UTF-8, never part of a stop string).
    Text(String),
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
    /// Context length served: the model's, capped by `--ctx-size`.
    pub n_ctx: usize,
    /// Sends jobs to the worker; dropping every sender ends the worker after its running jobs.
    pub jobs: mpsc::Sender<Job>,
    /// Sequences running on the worker now.
    pub running: Arc<AtomicUsize>,
    /// The worker thread.
    pub thread: std::thread::JoinHandle<()>,
}

/// Starts the worker thread of the model at `path`: it loads the model on the default device
/// (packed, or dequantized with `dequantize`) and then serves jobs. Returns once the model is
/// loaded.
///
/// # Errors
/// A load error as a message (the thread has ended then).
pub fn start(path: PathBuf, dequantize: bool, ctx_cap: usize) -> Result<ModelHandle, String> {
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
            let loaded = match crate::run::load(&path, dequantize, false) {
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
            let tokenizer = Arc::new(loaded.tokenizer);
            let n_ctx = loaded.model.config().context_length.min(ctx_cap);
            let _ = ready_tx.send(Ok((tokenizer.clone(), Arc::new(template), n_ctx)));
            drop(loaded.file);
            worker(&loaded.model, &tokenizer, jobs_rx, &running_w);
        })
        .map_err(|e| format!("could not start a model thread: {e}"))?;
    match ready_rx.recv() {
        Ok(Ok((tokenizer, template, n_ctx))) => Ok(ModelHandle {
            tokenizer,
            template,
            n_ctx,
            jobs: jobs_tx,
            running,
            thread,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("the model thread ended while loading".into()),
    }
}

/// A running sequence.
struct Sequence {
    job: Job,
    cache: <Decoder as CausalLm>::Cache,
    sampler: Sampler,
    generated: Vec<u32>,
    /// Text of `generated` decoded so far (complete UTF-8 only).
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
}

/// Serves jobs until every sender is dropped and no sequence runs: each round takes the jobs
/// that arrived, then runs one step (prefill, or one decode token) of every running sequence.
fn worker(
    model: &Decoder,
    tokenizer: &GgufTokenizer,
    jobs: mpsc::Receiver<Job>,
    running: &AtomicUsize,
) {
    let mut active: VecDeque<Sequence> = VecDeque::new();
    loop {
        if active.is_empty() {
            running.store(0, Ordering::SeqCst);
            match jobs.recv() {
                Ok(job) => active.push_back(new_sequence(job)),
                Err(_) => return,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            active.push_back(new_sequence(job));
        }
        running.store(active.len(), Ordering::SeqCst);
        for _ in 0..active.len() {
            let Some(mut seq) = active.pop_front() else {
                break;
            };
            // A panic in one sequence's step (a bug) ends that sequence, not the server.
            let keep =
                std::panic::catch_unwind(AssertUnwindSafe(|| step(model, tokenizer, &mut seq)))
                    .unwrap_or_else(|_| {
                        let _ = seq
                            .job
                            .events
                            .send(Event::Error("internal error in generation".into()));
                        false
                    });
            if keep {
                active.push_back(seq);
            }
        }
    }
}

fn new_sequence(job: Job) -> Sequence {
    // The whole answer's KV cache at once: it never grows (reallocates) mid-answer.
    let positions = job.prompt_ids.len() + job.max_tokens;
    Sequence {
        cache: SequenceState::with_capacity(positions),
        sampler: Sampler::new(job.sampler.clone()),
        generated: Vec::new(),
        text: String::new(),
        sent: 0,
        job,
    }
}

/// Runs one forward pass of `seq` and sends what it produced. Returns whether it goes on.
fn step(model: &Decoder, tokenizer: &GgufTokenizer, seq: &mut Sequence) -> bool {
    if seq.job.events.is_closed() {
        // The client is gone: drop the sequence (and its permit) now.
        return false;
    }
    let input: Vec<u32> = match seq.generated.last() {
        None => seq.job.prompt_ids.clone(),
        Some(&t) => vec![t],
    };
    let token = match model
        .forward(&input, &mut seq.cache, false)
        .and_then(|logits| next_token(logits, &mut seq.sampler))
    {
        Ok(t) => t,
        Err(e) => {
            let _ = seq.job.events.send(Event::Error(e.to_string()));
            return false;
        }
    };
    seq.generated.push(token);
    let done = |seq: &Sequence, reason| {
        let _ = seq.job.events.send(Event::Done {
            finish_reason: reason,
            prompt_tokens: seq.job.prompt_ids.len(),
            completion_tokens: seq.generated.len(),
        });
        false
    };
    let eog = tokenizer.is_eog(token);
    let last = eog || seq.generated.len() >= seq.job.max_tokens;
    // Text grows only by complete UTF-8, except at the end, where the last (lossy) decode is
    // taken as `run` does.
    if let Ok(full) = tokenizer.decode(&seq.generated)
        && (last || !full.ends_with('\u{FFFD}'))
        && full.starts_with(seq.text.as_str())
    {
        seq.text = full;
    }
    if let Some(at) = first_stop(&seq.text, &seq.job.stop) {
        flush(seq, at);
        return done(seq, FinishReason::Stop);
    }
    if last {
        flush(seq, seq.text.len());
        let reason = if eog {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        return done(seq, reason);
    }
    // Hold back a tail that could be the start of a stop string.
    let safe = seq.text.len() - held_back(&seq.text, &seq.job.stop);
    flush(seq, safe);
    true
}

/// Sends `text[sent..upto]` (if any) and advances `sent`.
fn flush(seq: &mut Sequence, upto: usize) {
    if upto > seq.sent {
        let piece = seq.text[seq.sent..upto].to_string();
        seq.sent = upto;
        let _ = seq.job.events.send(Event::Text(piece));
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

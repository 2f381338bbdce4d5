//! The generation engine of one served model: a worker thread that owns the model on the
//! device and runs its sequences with continuous batching.
//!
//! Every running sequence has a slot in one [`BatchState`], whose KV cache is paged: a pool of
//! blocks the slots share (`--kv-size` positions in all), each slot holding the blocks of its
//! positions. A request waits for a slot until the cache can hold its prompt and `max_tokens`
//! beside what the running sequences may reach, and free slots give back their cached blocks
//! (least recently used first) when those need them; so no pass runs out of blocks, and short
//! requests leave room for more of them.
//!
//! Each round of the worker takes the jobs that arrived, prefills one chunk of at most
//! [`PREFILL_CHUNK`] prompt tokens of one new sequence (so a long prompt does not stall the
//! others for long), then decodes one token of every sequence past its prompt in one forward
//! pass ([`burn_gguf_models::Decoder::forward_batch`]; passes of [`DECODE_ROWS`] rows). A
//! sequence joins at a round boundary and leaves as soon as it ends or its client is gone,
//! freeing its slot and its concurrency permit.
//!
//! Prefix reuse: a slot keeps the state of the tokens it last held (a finished sequence's
//! prompt and reply) until it takes another request. A new request takes the free slot whose
//! tokens share the longest prefix with its prompt (else the one used least recently), keeps
//! that prefix ([`BatchState::truncate`]; a recurrent model goes back to the checkpoint taken
//! at the end of the slot's last prompt) and prefills only the rest. A long system prompt or
//! a conversation's history is computed once per slot, not once per request. Before a slot
//! loses tokens to a request that does not share them, its state is copied into the worker's
//! prefix store (`serve/prefix_store.rs`, `--cache-memory`), and a request whose prompt shares
//! more with a stored prefix than with any free slot starts from that copy
//! ([`BatchState::load_slot`]), so more prefixes stay cached than there are slots.
//!
//! A sequence with a grammar (`response_format`) carries its [`TokenConstraint`]: its mask for
//! the next token is computed on another thread while the pass runs, then added to its row of
//! the logits on the device before sampling, so the rows beside it are sampled as without it.
//!
//! Speculative decoding (`serve --spec ngram`, or a request's `speculative.n_max`): a sequence
//! with a drafter ([`burn_gguf_models::speculative::NgramDrafter`]: prompt lookup over its prompt and reply) joins the pass
//! with its last token and its drafted tokens as rows of its slot, every row's logits kept;
//! the longest agreeing prefix and the model's own token after it are taken
//! ([`burn_gguf_models::speculative`]), and the slot is cut back past the first rejected row
//! ([`BatchState::truncate`]; a recurrent state goes back to the checkpoint taken before the
//! pass, and the accepted rows run again). A pass keeps to [`DECODE_ROWS`] rows in all, so
//! every row goes through the fused GEMV and a greedy reply is the same with drafts or
//! without. Sequences with a grammar or log-probabilities decode one token a pass.
//!
//! Requests reach the worker as [`Job`]s over a channel; text goes back as [`Event`]s over a
//! channel per job.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;

use burn_gguf_models::generate::SampleFrom;
use burn_gguf_models::speculative::{NgramConfig, Speculation};
use burn_gguf_models::structured::{GrammarCompiler, TokenConstraint};
use burn_gguf_models::{BatchState, ChatTemplate, GgufTokenizer, KV_BLOCK, SamplerConfig};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;
pub use super::output::{Logprobs, TokenLogprob, first_stop, held_back};
use super::prefix_store::PrefixStore;
use super::worker::Worker;

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
    /// An end-of-generation token, a stop string, or the end of the request's grammar.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// The reply is tool calls (set by the response layer when the text parses as calls; the
    /// worker never ends a sequence with it).
    ToolCalls,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
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
    /// The grammar the output must follow (`response_format`), compiled for this model's
    /// vocabulary by [`ModelHandle::grammars`].
    pub constraint: Option<TokenConstraint>,
    /// Decode control tokens as their text (not the end-of-generation one): tool-call markers
    /// such as `<|python_tag|>` and `[TOOL_CALLS]` are control tokens.
    pub special_text: bool,
    /// Most drafted tokens a verify pass (`speculative.n_max`; 0: one token a pass); `None`
    /// for the server's [`WorkerOptions::speculation`].
    pub draft_max: Option<usize>,
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
    /// Context length served: the model's, capped by `--ctx-size` and by the positions the
    /// paged KV cache holds (`--kv-size`, within the device's largest buffer:
    /// [`burn_gguf_models::Decoder::max_kv_positions`]).
    pub n_ctx: usize,
    /// Sends jobs to the worker; dropping every sender ends the worker after its running jobs.
    pub jobs: mpsc::Sender<Job>,
    /// Sequences running on the worker now.
    pub running: Arc<AtomicUsize>,
    /// The LoRA adapter files loaded (`serve --lora`), by id, with their default scale.
    pub adapters: Vec<(PathBuf, f32)>,
    /// The grammar compiler of its vocabulary (structured outputs), or why there is none.
    pub grammars: Result<GrammarCompiler, String>,
    /// The worker thread.
    pub thread: std::thread::JoinHandle<()>,
}

/// How one model's worker is set up (the server's options, per model).
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// A [`burn_gguf::select_device`] choice; the default adapter when `None`.
    pub device: Option<String>,
    /// Dequantize every weight at load (no packed kernels).
    pub dequantize: bool,
    /// Context length cap (`--ctx-size`).
    pub ctx_cap: usize,
    /// Positions of the KV cache, all sequences together (`--kv-size`; `None`: `slots` times
    /// the context), at most [`burn_gguf_models::Decoder::max_kv_positions`].
    pub kv_size: Option<usize>,
    /// Sequences decoded at once (`--max-concurrent`).
    pub slots: usize,
    /// LoRA adapter files (`--lora`).
    pub lora: Vec<PathBuf>,
    /// Their default scale (`--lora-scale`).
    pub lora_scale: f32,
    /// A chat template's source replacing the file's (`--chat-template`).
    pub chat_template: Option<String>,
    /// Reuse a slot's cached prompt prefix (off: `--no-prefix-cache`).
    pub prefix_cache: bool,
    /// Device memory, in bytes, for prefixes kept after their slot went to another request
    /// (`--cache-memory`; 0: none kept).
    pub cache_memory: usize,
    /// Speculative decoding of requests that do not choose (`--spec`, `--draft-max`): off or
    /// [`Speculation::Ngram`] ([`start`] refuses a draft model).
    pub speculation: Speculation,
}

/// [`WorkerOptions::cache_memory`]'s default: 1 GiB (`serve --cache-memory 1024`).
pub const DEFAULT_CACHE_MEMORY: usize = 1 << 30;

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            device: None,
            dequantize: false,
            ctx_cap: 4096,
            kv_size: None,
            slots: 8,
            lora: Vec::new(),
            lora_scale: 1.0,
            chat_template: None,
            prefix_cache: true,
            cache_memory: DEFAULT_CACHE_MEMORY,
            speculation: Speculation::Off,
        }
    }
}

/// Starts the worker thread of the model at `path`: it loads the model as `opts` say (packed,
/// or dequantized) and then serves jobs, up to `opts.slots` sequences at once. Returns once the
/// model is loaded.
///
/// # Errors
/// A load error as a message (the thread has ended then), or a draft model in
/// `opts.speculation`.
pub fn start(
    path: PathBuf,
    opts: WorkerOptions,
    metrics: Arc<Metrics>,
) -> Result<ModelHandle, String> {
    let WorkerOptions {
        device,
        dequantize,
        ctx_cap,
        kv_size,
        slots,
        lora: lora_paths,
        lora_scale,
        chat_template,
        prefix_cache,
        cache_memory,
        speculation,
    } = opts;
    // The server's drafts; a request's `speculative.n_max` replaces `draft_max`.
    let (ngram, draft_max) = match speculation {
        Speculation::Off => (NgramConfig::default(), 0),
        Speculation::Ngram(c) => {
            let n = c.draft_max;
            (c, n)
        }
        Speculation::Draft(_) => {
            return Err(
                "the server's batch takes drafts from each request's text only \
                        (Speculation::Ngram), not from a draft model"
                    .into(),
            );
        }
    };
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
            let template = match &chat_template {
                Some(source) => {
                    let text = |id: Option<u32>| {
                        id.and_then(|i| loaded.tokenizer.token_text(i))
                            .unwrap_or_default()
                            .to_string()
                    };
                    let (bos, eos) = (
                        text(loaded.tokenizer.bos_id()),
                        text(loaded.tokenizer.eos_id()),
                    );
                    ChatTemplate::new(source, &bos, &eos)
                }
                None => ChatTemplate::from_gguf(&loaded.file, &loaded.tokenizer),
            };
            let template = match template {
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
            let grammars =
                GrammarCompiler::new(&loaded.tokenizer, loaded.model.config().vocab_size)
                    .map_err(|e| e.to_string());
            if let Err(e) = &grammars {
                tracing::warn!("{}: no structured outputs: {e}", path.display());
            }
            let tokenizer = Arc::new(loaded.tokenizer);
            // The paged KV cache: `--kv-size` positions, or a full context per slot, within
            // the device's largest buffer; no request's context passes it.
            let ctx = loaded.model.config().context_length.min(ctx_cap);
            let per_slot = ctx.next_multiple_of(KV_BLOCK);
            let kv = kv_size.unwrap_or(slots.max(1).saturating_mul(per_slot));
            let state =
                BatchState::new(slots.max(1)).with_limit(kv.min(loaded.model.max_kv_positions()));
            let n_ctx = ctx.min(state.limit());
            if n_ctx < ctx {
                tracing::warn!(
                    "{}: the KV cache holds {} positions (--kv-size, or this device's largest \
                     buffer); serving a context of {n_ctx} tokens",
                    path.display(),
                    state.limit()
                );
            }
            let _ = ready_tx.send(Ok((tokenizer.clone(), Arc::new(template), n_ctx, grammars)));
            drop(loaded.file);
            let mut worker = Worker {
                model: &loaded.model,
                tokenizer: &tokenizer,
                state,
                free: (0..slots.max(1)).rev().collect(),
                cached: vec![Vec::new(); slots.max(1)],
                cached_lora: vec![None; slots.max(1)],
                last_used: vec![0; slots.max(1)],
                rounds: 0,
                prefix_cache,
                store: PrefixStore::new(if prefix_cache { cache_memory } else { 0 }),
                waiting: VecDeque::new(),
                active: Vec::new(),
                metrics: &metrics,
                from: SampleFrom::for_device(loaded.model.device()),
                loras,
                lora_scale,
                merged: HashMap::new(),
                ngram,
                draft_max,
            };
            worker.run(jobs_rx, &running_w);
        })
        .map_err(|e| format!("could not start a model thread: {e}"))?;
    match ready_rx.recv() {
        Ok(Ok((tokenizer, template, n_ctx, grammars))) => Ok(ModelHandle {
            tokenizer,
            template,
            n_ctx,
            jobs: jobs_tx,
            running,
            adapters,
            grammars,
            thread,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("the model thread ended while loading".into()),
    }
}

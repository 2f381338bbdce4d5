//! `burn-gguf serve`: an OpenAI-compatible HTTP server (axum on tokio).
//!
//! Endpoints: `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions` (both with
//! `stream: true` as server-sent events ending in `data: [DONE]`), `GET /health`, and
//! `GET /metrics` (Prometheus text, [`metrics`]). Requests may ask for structured outputs
//! (`response_format`) and tool calls (`tools`, [`mod@format`]); fields the server does not honour
//! are refused with a 400 ([`format::Unsupported`]).
//!
//! Each model has one worker thread ([`engine`]) that owns its weights on the device and
//! decodes its running sequences together, one forward pass per step (continuous batching),
//! each in its own slot of one batched KV cache. At most `max_concurrent` sequences run (over
//! all models); up to `max_queue` more wait, and past that a request gets 429. A client that
//! disconnects frees its slot before the next step. Ctrl-C or SIGTERM stops accepting
//! connections, lets running requests finish, and exits.

pub mod api;
pub mod body;
pub mod engine;
pub mod format;
pub mod metrics;
pub mod models;
pub mod output;
mod prefix_store;
mod response;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use api::{ApiError, LogprobsStyle, Reasoning};
use engine::{Event, Job, ModelHandle};
use metrics::Metrics;
use response::{Kind, Meta, collect_response, stream_response};

/// Options of `serve` (its command line).
#[derive(Clone, Debug, clap::Args)]
pub struct ServeOptions {
    /// A model: a .gguf file, a directory (every .gguf in it), `org/repo:file.gguf` or
    /// `org/repo` (the Hugging Face hub cache; a missing file is downloaded unless
    /// HF_HUB_OFFLINE=1), or a known name (gemma3-270m). Repeat for several models.
    #[arg(short, long = "model", required = true)]
    pub models: Vec<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Thinking for templates that support it (`enable_thinking`); a request's `reasoning`
    /// field overrides it. auto: the template's default.
    #[arg(long, value_enum, default_value = "auto")]
    pub reasoning: Reasoning,
    /// Most sequences generating at once (over all models): each model's worker decodes up to
    /// this many together, one forward pass per step.
    #[arg(long, default_value_t = 8)]
    pub max_concurrent: usize,
    /// Most requests waiting for a slot; more are answered 429.
    #[arg(long, default_value_t = 128)]
    pub max_queue: usize,
    /// Context length per sequence, capped by the model's own and by `--kv-size` (a warning
    /// says so).
    #[arg(long, default_value_t = 4096)]
    pub ctx_size: usize,
    /// Positions the paged KV cache of each model holds, all its sequences together (as
    /// llama.cpp's `-c` of a unified cache): a request waits for a slot until the cache can hold
    /// its prompt and `max_tokens` beside the running ones. Default: `--max-concurrent` times
    /// the context; at most what the device's largest buffer holds.
    #[arg(long, value_name = "POSITIONS")]
    pub kv_size: Option<usize>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 2 << 20)]
    pub max_body_bytes: usize,
    /// Dequantize all weights at load (no packed kernels).
    #[arg(long)]
    pub dequantize: bool,
    /// Device: an index or part of a name from `burn-gguf devices`, or `cpu` (Burn's CPU
    /// backend, every weight dequantized); the default wgpu adapter when absent.
    #[arg(long)]
    pub device: Option<String>,
    /// A LoRA adapter in llama.cpp's GGUF format, loaded for every model (repeat for several;
    /// `GET /lora-adapters` lists them by id). Requests apply them all unless their `lora` field
    /// chooses (llama-server's `[{"id": 0, "scale": 0.5}]`).
    #[arg(long = "lora", value_name = "FILE")]
    pub lora: Vec<std::path::PathBuf>,
    /// The default factor of the adapters' updates.
    #[arg(long, default_value_t = 1.0)]
    pub lora_scale: f32,
    /// A Jinja chat template file used for every model instead of the file's own (as
    /// llama-server's `--chat-template-file`): e.g. one with tool support for a model whose
    /// template has none.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<std::path::PathBuf>,
    /// Compute every prompt in full: no request starts after the prefix a slot's cache holds
    /// (a finished request's prompt and reply stay in its slot for reuse otherwise).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Device memory, in MiB, for prompt prefixes kept after their slot went to another
    /// request (a prefix store per model, least recently used evicted first; 0: keep only
    /// what the slots hold), so more conversations stay cached than `--max-concurrent`.
    #[arg(long, value_name = "MIB", default_value_t = engine::DEFAULT_CACHE_MEMORY >> 20)]
    pub cache_memory: usize,
    /// Speculative decoding of every request that does not choose with its
    /// `speculative.n_max` (sequences with a grammar or log-probabilities decode a token a
    /// pass).
    #[command(flatten)]
    pub spec: crate::run::SpecArgs,
}

/// A served model.
struct Served {
    id: String,
    handle: ModelHandle,
}

/// Shared state of the handlers.
struct AppState {
    models: Vec<Served>,
    reasoning: Reasoning,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_queue: usize,
    max_concurrent: usize,
    max_body_bytes: usize,
    created: u64,
    next_id: AtomicU64,
    metrics: Arc<Metrics>,
}

type Shared = Arc<AppState>;

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Default for ServeOptions {
    /// The command line's defaults, with no model: push paths or names onto `models`.
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            opts: ServeOptions,
        }
        let mut line = <Line as clap::Parser>::try_parse_from(["serve", "-m", ""])
            .expect("ServeOptions' defaults parse");
        line.opts.models.clear();
        line.opts
    }
}

/// The server as a library: every model loaded on its worker thread, and the HTTP routes to
/// mount in any axum app ([`Server::router`]). [`serve`] is this plus a listener and signals.
pub struct Server {
    state: Shared,
}

impl Server {
    /// Resolves and loads every model of `opts` (each on its own worker thread), printing each
    /// to stderr as it loads.
    ///
    /// # Errors
    /// No model, `max_concurrent` of 0, a model that does not resolve or load, or a duplicate
    /// model id, as a message.
    pub fn load(opts: &ServeOptions) -> Result<Self, String> {
        if opts.models.is_empty() {
            return Err("serve needs at least one -m MODEL".into());
        }
        if opts.max_concurrent == 0 {
            return Err("--max-concurrent must be at least 1".into());
        }
        if opts.spec.draft_model.is_some() {
            return Err(
                "serve takes no --draft-model yet: use --spec ngram (drafts from each \
                        request's own text)"
                    .into(),
            );
        }
        let speculation = opts.spec.context_drafts();
        if let burn_gguf_models::Speculation::Ngram(c) = &speculation {
            c.validate().map_err(|e| format!("--draft-max: {e}"))?;
        }
        let mut sources = Vec::new();
        for spec in &opts.models {
            sources.extend(models::resolve(spec)?);
        }
        let chat_template = match &opts.chat_template {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| format!("--chat-template {}: {e}", p.display()))?,
            ),
            None => None,
        };
        let metrics = Arc::new(Metrics::new());
        let mut served: Vec<Served> = Vec::new();
        for s in sources {
            if served.iter().any(|m| m.id == s.id) {
                return Err(format!("two models are named '{}'", s.id));
            }
            eprintln!("loading '{}' from {}", s.id, s.path.display());
            let worker = engine::WorkerOptions {
                device: opts.device.clone(),
                dequantize: opts.dequantize,
                ctx_cap: opts.ctx_size,
                kv_size: opts.kv_size,
                slots: opts.max_concurrent,
                lora: opts.lora.clone(),
                lora_scale: opts.lora_scale,
                chat_template: chat_template.clone(),
                prefix_cache: !opts.no_prefix_cache,
                cache_memory: opts.cache_memory.saturating_mul(1 << 20),
                speculation: speculation.clone(),
            };
            let handle = engine::start(s.path.clone(), worker, metrics.clone())?;
            served.push(Served { id: s.id, handle });
        }
        Ok(Self {
            state: Arc::new(AppState {
                models: served,
                reasoning: opts.reasoning,
                slots: Arc::new(Semaphore::new(opts.max_concurrent)),
                waiting: AtomicUsize::new(0),
                max_queue: opts.max_queue,
                max_concurrent: opts.max_concurrent,
                max_body_bytes: opts.max_body_bytes,
                created: now_secs(),
                next_id: AtomicU64::new(1),
                metrics,
            }),
        })
    }

    /// The ids clients name the models by (`/v1/models`).
    pub fn model_ids(&self) -> Vec<String> {
        self.state.models.iter().map(|m| m.id.clone()).collect()
    }

    /// The routes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`,
    /// `/metrics`; 404 with an OpenAI error body elsewhere), to serve or to `nest` under a
    /// prefix of another axum app. Handlers need a tokio runtime.
    pub fn router(&self) -> Router {
        router(self.state.clone())
    }

    /// Ends every model's worker once its running sequences are done, and waits for it. Routers
    /// still alive keep the workers (they end with the process).
    pub fn shutdown(self) {
        // Dropping the last job senders ends each worker once its sequences are done.
        if let Ok(state) = Arc::try_unwrap(self.state) {
            for m in state.models {
                drop(m.handle.jobs);
                let _ = m.handle.thread.join();
            }
        }
    }
}

/// Loads every model, binds, prints the address (`listening on http://HOST:PORT`), and serves
/// until Ctrl-C or SIGTERM; then finishes running requests and returns.
///
/// # Errors
/// As [`Server::load`], and an address that cannot be bound, as a message.
pub fn serve(opts: &ServeOptions) -> Result<(), String> {
    let server = Server::load(opts)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("could not start the async runtime: {e}"))?;
    let app = server.router();
    let addr = format!("{}:{}", opts.host, opts.port);
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!("listening on http://{local}");
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .map_err(|e| format!("server error: {e}"))
    })?;
    eprintln!("shutting down: running requests finished");
    // (A connection task that still holds the state is ended with the process.)
    server.shutdown();
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("signal received: no new connections; finishing running requests");
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/v1/models", get(list_models))
        .route("/lora-adapters", get(list_adapters))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .fallback(|| async {
            ApiError::bad_request("no such endpoint", None).status(StatusCode::NOT_FOUND)
        })
        .with_state(state)
}

/// Sequences running now, over all models.
fn running(s: &AppState) -> usize {
    s.models
        .iter()
        .map(|m| m.handle.running.load(Ordering::SeqCst))
        .sum()
}

async fn health(State(s): State<Shared>) -> Response {
    let running = running(&s);
    axum::Json(json!({
        "status": "ok",
        "models": s.models.iter().map(|m| m.id.clone()).collect::<Vec<_>>(),
        "running": running,
        "slots_in_use": s.max_concurrent - s.slots.available_permits(),
        "waiting": s.waiting.load(Ordering::SeqCst),
        "max_concurrent": s.max_concurrent,
    }))
    .into_response()
}

async fn metrics_text(State(s): State<Shared>) -> Response {
    let body = s
        .metrics
        .render(running(&s), s.waiting.load(Ordering::SeqCst));
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn list_models(State(s): State<Shared>) -> Response {
    let data: Vec<Value> = s
        .models
        .iter()
        .map(|m| {
            json!({
                "id": m.id,
                "object": "model",
                "created": s.created,
                "owned_by": "burn-gguf",
                "context_length": m.handle.n_ctx,
            })
        })
        .collect();
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

/// `GET /lora-adapters` (llama-server's): the adapters `--lora` loaded, by id, with their path
/// and default scale (the first model's; every model loads the same files).
async fn list_adapters(State(s): State<Shared>) -> Response {
    let data: Vec<Value> = s
        .models
        .first()
        .map(|m| m.handle.adapters.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(id, (path, scale))| json!({"id": id, "path": path.display().to_string(), "scale": scale}))
        .collect();
    axum::Json(Value::Array(data)).into_response()
}

/// Reads and parses a JSON body; every failure (too large, not UTF-8, not JSON, wrong shape) is
/// a 4xx.
async fn parse_body<T: DeserializeOwned>(s: &AppState, body: Body) -> Result<T, ApiError> {
    let bytes = body::read_limited(body, s.max_body_bytes).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}"), None))
}

fn model<'a>(s: &'a AppState, id: &str) -> Result<&'a Served, ApiError> {
    s.models.iter().find(|m| m.id == id).ok_or_else(|| {
        ApiError::bad_request(
            format!(
                "model '{id}' does not exist; served: {}",
                s.models
                    .iter()
                    .map(|m| m.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some("model"),
        )
        .status(StatusCode::NOT_FOUND)
        .code("model_not_found")
    })
}

/// Decrements the waiting count when dropped (also when the client leaves while waiting).
struct WaitGuard<'a>(&'a AtomicUsize);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Takes a concurrency slot, waiting in the bounded queue.
///
/// # Errors
/// 429 when the queue is full; 503 when the server is shutting down.
async fn slot(s: &AppState) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    if let Ok(p) = s.slots.clone().try_acquire_owned() {
        return Ok(p);
    }
    if s.waiting.fetch_add(1, Ordering::SeqCst) >= s.max_queue {
        s.waiting.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::bad_request(
            format!(
                "server busy: {} requests running and {} waiting; retry later",
                s.max_concurrent, s.max_queue
            ),
            None,
        )
        .status(StatusCode::TOO_MANY_REQUESTS));
    }
    let _guard = WaitGuard(&s.waiting);
    s.slots.clone().acquire_owned().await.map_err(|_| {
        ApiError::bad_request("server shutting down", None).status(StatusCode::SERVICE_UNAVAILABLE)
    })
}

/// A validated request ready for the worker.
struct Prepared<'a> {
    served: &'a Served,
    prompt_ids: Vec<u32>,
    checked: api::Checked,
    max_tokens: usize,
    constraint: Option<burn_gguf_models::structured::TokenConstraint>,
    special_text: bool,
}

/// Queues `p` on its model's worker. Returns the event receiver.
async fn submit(s: &AppState, p: Prepared<'_>) -> Result<UnboundedReceiver<Event>, ApiError> {
    let permit = slot(s).await?;
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt_ids: p.prompt_ids,
        max_tokens: p.max_tokens,
        sampler: p.checked.sampler,
        stop: p.checked.stop,
        logprobs: p.checked.logprobs,
        lora: p.checked.lora,
        constraint: p.constraint,
        special_text: p.special_text,
        draft_max: p.checked.draft_max,
        events: tx,
        permit,
    };
    p.served.handle.jobs.send(job).map_err(|_| {
        ApiError::bad_request("the model's worker has stopped", None)
            .status(StatusCode::SERVICE_UNAVAILABLE)
    })?;
    Ok(rx)
}

async fn chat_completions(State(s): State<Shared>, body: Body) -> Response {
    match chat_inner(&s, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat_inner(s: &Shared, body: Body) -> Result<Response, ApiError> {
    let req: api::ChatRequest = parse_body(s, body).await?;
    let served = model(s, &req.model)?;
    let messages = api::check_messages(&req.messages)?;
    let mut checked = api::check_generation(&req.generation, LogprobsStyle::Chat)?;
    let tools = api::check_tools(&req)?;
    // Precedence: the request's `reasoning`, then its `chat_template_kwargs`, then --reasoning.
    let mut vars = req.chat_template_kwargs.clone().unwrap_or_default();
    let reasoning = match req.reasoning {
        Some(r) => r,
        None if vars.contains_key("enable_thinking") => Reasoning::Auto,
        None => s.reasoning,
    };
    match reasoning {
        Reasoning::On => {
            vars.insert("enable_thinking".into(), true.into());
        }
        Reasoning::Off => {
            vars.insert("enable_thinking".into(), false.into());
        }
        Reasoning::Auto => {}
    }
    let tool_mode = match &tools {
        Some(t) => tool_mode(served, t, &mut checked, &mut vars)?,
        None => None,
    };
    let prompt = served
        .handle
        .template
        .render(&messages, true, &Value::Object(vars))
        .map_err(|e| ApiError::bad_request(format!("chat template: {e}"), Some("messages")))?;
    let prompt_ids = served
        .handle
        .tokenizer
        .encode_prompt(&prompt)
        .map_err(|e| ApiError::bad_request(format!("tokenizer: {e}"), Some("messages")))?;
    finish(
        s,
        served,
        prompt_ids,
        checked,
        &req.generation,
        Kind::Chat,
        tool_mode,
    )
    .await
}

/// Readies a chat request's tools: the template's `tools` variable, and for `required` or a
/// named function the grammar of one call. Returns how the reply is read for calls (`None`
/// for `tool_choice` `none`).
///
/// # Errors
/// A 400 naming `tools` when the model's template takes none, `logprobs` with tools,
/// `response_format` beside a forced call, or `tool_choice` when the template's syntax has no
/// grammar for a forced call.
fn tool_mode(
    served: &Served,
    t: &api::ToolRequest,
    checked: &mut api::Checked,
    vars: &mut serde_json::Map<String, Value>,
) -> Result<Option<response::ToolMode>, ApiError> {
    use burn_gguf_models::tool_calls::ToolCallFormat;
    let Some(format) = ToolCallFormat::detect(served.handle.template.source()) else {
        return Err(ApiError::bad_request(
            format!(
                "model '{}': its chat template takes no tools (serve --chat-template FILE gives \
                 one that does)",
                served.id
            ),
            Some("tools"),
        ));
    };
    if checked.logprobs.is_some() {
        return Err(ApiError::bad_request(
            "logprobs with tools is not supported",
            Some("logprobs"),
        ));
    }
    let list = t.tools.iter().map(|t| t.to_template_value()).collect();
    vars.insert("tools".into(), Value::Array(list));
    let forced = match &t.choice {
        api::ToolChoice::None => return Ok(None),
        api::ToolChoice::Auto => false,
        api::ToolChoice::Required | api::ToolChoice::Named(_) => {
            if checked.grammar.is_some() {
                return Err(ApiError::bad_request(
                    "response_format cannot be combined with a required tool call",
                    Some("response_format"),
                ));
            }
            let chosen: Vec<_> = match &t.choice {
                api::ToolChoice::Named(n) => {
                    t.tools.iter().filter(|x| &x.name == n).cloned().collect()
                }
                _ => t.tools.clone(),
            };
            let tokenizer = &served.handle.tokenizer;
            let grammar = format
                .grammar(&chosen, |text| tokenizer.token_to_id(text))
                .map_err(|e| ApiError::bad_request(e, Some("tool_choice")))?;
            checked.grammar = Some(grammar);
            true
        }
    };
    Ok(Some(response::ToolMode {
        format,
        tools: t.tools.clone().into(),
        forced,
        parallel: t.parallel && !forced,
    }))
}

async fn completions(State(s): State<Shared>, body: Body) -> Response {
    match completion_inner(&s, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn completion_inner(s: &Shared, body: Body) -> Result<Response, ApiError> {
    let req: api::CompletionRequest = parse_body(s, body).await?;
    let served = model(s, &req.model)?;
    let prompt = match req.prompt {
        api::Prompt::One(p) => p,
        api::Prompt::Many(mut v) if v.len() == 1 => v.remove(0),
        api::Prompt::Many(_) => {
            return Err(ApiError::bad_request(
                "only one prompt per request is supported",
                Some("prompt"),
            ));
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::bad_request(
            "prompt must not be empty",
            Some("prompt"),
        ));
    }
    let checked = api::check_generation(&req.generation, LogprobsStyle::Completion)?;
    // As `run` does: the tokenizer's BOS rule, special tokens in the text parsed.
    let prompt_ids = served
        .handle
        .tokenizer
        .encode(&prompt, true)
        .map_err(|e| ApiError::bad_request(format!("tokenizer: {e}"), Some("prompt")))?;
    finish(
        s,
        served,
        prompt_ids,
        checked,
        &req.generation,
        Kind::Completion,
        None,
    )
    .await
}

async fn finish(
    s: &Shared,
    served: &Served,
    prompt_ids: Vec<u32>,
    checked: api::Checked,
    g: &api::Generation,
    kind: Kind,
    tools: Option<response::ToolMode>,
) -> Result<Response, ApiError> {
    if prompt_ids.is_empty() {
        return Err(ApiError::bad_request("the prompt has no tokens", None));
    }
    let max_tokens =
        api::max_tokens_for(checked.max_tokens, prompt_ids.len(), served.handle.n_ctx)?;
    let loaded = served.handle.adapters.len();
    if let Some((i, (id, _))) =
        (checked.lora.iter().flatten().enumerate()).find(|(_, (id, _))| *id >= loaded)
    {
        return Err(ApiError::bad_request(
            format!(
                "lora[{i}].id: no adapter {id}; the server loaded {loaded} (GET /lora-adapters)"
            ),
            Some("lora"),
        ));
    }
    let constraint = match &checked.grammar {
        None => None,
        Some(g) => Some(compile_grammar(served, g.clone()).await?),
    };
    let p = Prepared {
        served,
        prompt_ids,
        max_tokens,
        checked,
        constraint,
        special_text: tools.is_some(),
    };
    let id = format!(
        "{}-{}",
        match kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        },
        s.next_id.fetch_add(1, Ordering::SeqCst)
    );
    let logprobs = p.checked.logprobs.is_some();
    let rx = submit(s, p).await?;
    let meta = Meta {
        id,
        model: served.id.clone(),
        created: now_secs(),
        kind,
        tools,
    };
    if g.stream {
        let include_usage = g.stream_options.as_ref().is_some_and(|o| o.include_usage);
        Ok(stream_response(meta, rx, include_usage, logprobs))
    } else {
        collect_response(meta, rx, logprobs).await
    }
}

/// `grammar` compiled for `served`'s vocabulary, off the async threads (a large schema takes
/// a while).
///
/// # Errors
/// A 400 naming `response_format` with the compiler's reason, or when the model's vocabulary
/// has no grammar support.
async fn compile_grammar(
    served: &Served,
    grammar: burn_gguf_models::structured::Grammar,
) -> Result<burn_gguf_models::structured::TokenConstraint, ApiError> {
    let bad = |m: String| ApiError::bad_request(m, Some("response_format"));
    let compiler = match &served.handle.grammars {
        Ok(c) => c.clone(),
        Err(e) => {
            return Err(bad(format!(
                "model '{}' has no structured outputs: {e}",
                served.id
            )));
        }
    };
    tokio::task::spawn_blocking(move || compiler.compile(&grammar))
        .await
        .map_err(|_| bad("the grammar compiler failed".into()))?
        .map_err(|e| bad(format!("response_format: {e}")))
}

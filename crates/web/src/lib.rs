//! burn-gguf in a web page: GGUF models on the browser's WebGPU (Burn's `webgpu` backend on
//! wasm32), for the page's Web Worker (`crates/web/static/worker.js`) to drive through wasm-bindgen.
//!
//! Nothing here blocks: the device comes up with `Device::wgpu_options().init_async()`, every
//! read-back is awaited (`burn_gguf_models::generate_async`, the `_async` kernel checks), and
//! the file arrives in chunks ([`GgufBytes::push`]) as a streamed `fetch` or a `File`'s stream
//! delivers them. The file is then parsed with the same checks and limits as a native one
//! (`gguf::GgufFile::from_bytes`), loaded packed where a kernel fits (the loader's report says
//! what fell back), and dropped: the weights live in the device's buffers.
//!
//! `cargo xtask web --out DIR` builds the page; `docs/web.md` says what runs and its limits.
#![warn(missing_docs)]
pub mod checks;
pub mod request;

use burn::tensor::Device;
use burn_gguf::{GgufConfig, GgufLoader, LoadKind};
use burn_gguf_models::{
    ChatTemplate, Decoder, Generation, GgufTokenizer, Sampler, SequenceState, Session,
    generate_async, generate_ids_async,
};
use request::{FileBytes, GenerateRequest, Input};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use wasm_bindgen::prelude::*;

thread_local! {
    /// The WebGPU device, brought up once per worker.
    static DEVICE: RefCell<Option<Device>> = const { RefCell::new(None) };
}

/// Installs a panic hook that sends the panic's message to the console (a panic is a bug: the
/// library returns errors for bad input).
#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| {
        web_log(&format!("panic: {info}"));
    }));
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn web_log(s: &str);
}

/// The WebGPU device, brought up on the first call (the adapter's own limits are requested, so
/// the loader splits a tensor at the device's `maxStorageBufferBindingSize`).
async fn device() -> Result<Device, JsError> {
    if let Some(d) = DEVICE.with(|d| d.borrow().clone()) {
        return Ok(d);
    }
    let d = Device::wgpu_options()
        .init_async()
        .await
        .map_err(|e| JsError::new(&format!("WebGPU device: {e}")))?;
    DEVICE.with(|c| *c.borrow_mut() = Some(d.clone()));
    Ok(d)
}

/// Brings up the WebGPU device and describes it as JSON: `max_buffer_bytes` (the largest
/// buffer a tensor part may take) and `software` (a CPU-emulated adapter such as SwiftShader).
///
/// # Errors
/// No WebGPU adapter or device.
#[wasm_bindgen]
pub async fn init_device() -> Result<String, JsError> {
    let d = device().await?;
    Ok(serde_json::json!({
        "max_buffer_bytes": burn_gguf::max_buffer_bytes(&d),
        "software": burn_gguf::is_software_device(&d),
    })
    .to_string())
}

/// A GGUF file's bytes as they arrive, bounded ([`request::MAX_FILE_BYTES`]).
#[wasm_bindgen]
pub struct GgufBytes(FileBytes);

#[wasm_bindgen]
impl GgufBytes {
    /// An empty buffer; `expected_len` (bytes, e.g. a `Content-Length`) reserves room.
    ///
    /// # Errors
    /// `expected_len` past the limit, or no memory for it.
    #[wasm_bindgen(constructor)]
    pub fn new(expected_len: Option<f64>) -> Result<GgufBytes, JsError> {
        let expected = expected_len
            .filter(|n| n.is_finite() && *n >= 0.0)
            .map(|n| n as u64);
        FileBytes::with_expected(expected)
            .map(GgufBytes)
            .map_err(|e| JsError::new(&e))
    }

    /// Appends a chunk (a `Uint8Array`).
    ///
    /// # Errors
    /// The file growing past the limit, or no memory.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), JsError> {
        self.0.push(chunk).map_err(|e| JsError::new(&e))
    }

    /// Bytes received so far.
    #[wasm_bindgen(getter)]
    pub fn length(&self) -> f64 {
        self.0.len() as f64
    }
}

/// A model loaded on the WebGPU device with its tokenizer and chat template.
#[wasm_bindgen]
pub struct Model {
    inner: Rc<Loaded>,
}

struct Loaded {
    decoder: Decoder,
    tokenizer: GgufTokenizer,
    template: Result<ChatTemplate, String>,
    info: String,
    /// The chat's KV cache, reused across turns.
    session: RefCell<Option<Session<SequenceState>>>,
    busy: Cell<bool>,
}

/// Parses `bytes` as a GGUF file and loads its model onto the WebGPU device (packed where a
/// kernel decodes the type, else dequantized: [`Model::info`]'s `report` says which).
///
/// # Errors
/// A malformed or truncated file (the reader's error, naming the key or tensor), an
/// architecture or tokenizer the library does not support, or a device error.
#[wasm_bindgen]
pub async fn load_model(bytes: GgufBytes) -> Result<Model, JsError> {
    let device = device().await?;
    let t0 = web_time::Instant::now();
    let err = |e: &dyn std::fmt::Display| JsError::new(&e.to_string());
    let file_bytes = bytes.0.len();
    let file = gguf::GgufFile::from_bytes(bytes.0.into_vec()).map_err(|e| err(&e))?;
    let tokenizer = GgufTokenizer::from_gguf(&file).map_err(|e| err(&e))?;
    let loader = GgufLoader::new(&file, &device, GgufConfig::default());
    let decoder = Decoder::load(&loader).map_err(|e| err(&e))?;
    let report = loader.report();
    let template = ChatTemplate::from_gguf(&file, &tokenizer).map_err(|e| e.to_string());
    let dequantized: Vec<_> = report
        .entries
        .iter()
        .filter_map(|e| match &e.kind {
            LoadKind::Dequantized(why) => Some(serde_json::json!({
                "name": e.name, "ggml_type": e.ggml_type.to_string(), "reason": why,
            })),
            _ => None,
        })
        .collect();
    let info = serde_json::json!({
        "architecture": file.architecture().unwrap_or("unknown"),
        "file_bytes": file_bytes,
        "tensors": report.entries.len(),
        "packed": report.packed_count(),
        "dequantized": dequantized,
        "report": report.to_string(),
        "chat_template": match &template {
            Ok(t) if t.is_builtin() => "built-in".to_string(),
            Ok(_) => "from the file".to_string(),
            Err(e) => format!("none: {e}"),
        },
        "load_ms": t0.elapsed().as_secs_f64() * 1e3,
    })
    .to_string();
    drop(loader);
    drop(file);
    Ok(Model {
        inner: Rc::new(Loaded {
            decoder,
            tokenizer,
            template,
            info,
            session: RefCell::new(None),
            busy: Cell::new(false),
        }),
    })
}

#[wasm_bindgen]
impl Model {
    /// What was loaded, as JSON: `architecture`, `file_bytes`, `tensors`, `packed`,
    /// `dequantized` (name, type and reason of each tensor that fell back), `report` (the
    /// loader's summary), `chat_template`, `load_ms`.
    pub fn info(&self) -> String {
        self.inner.info.clone()
    }

    /// Generates for `request` (JSON, [`request::GenerateRequest`]), calling `on_piece` with
    /// each new piece of text as soon as it is complete UTF-8. Resolves to JSON with
    /// `prompt_ids`, `generated_ids` and `text` (as `burn-gguf run --json` prints them) and
    /// `timings`; rejects with the error's message (a bad request names its field).
    pub fn generate(&self, request: String, on_piece: js_sys::Function) -> js_sys::Promise {
        let inner = self.inner.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            if inner.busy.replace(true) {
                return Err(JsError::new("a generation is already running").into());
            }
            let out = inner.generate(&request, &on_piece).await;
            inner.busy.set(false);
            out.map(|s| JsValue::from_str(&s))
                .map_err(|e| JsError::new(&e).into())
        })
    }

    /// Forgets the chat's cached turns (the next `messages` request starts afresh).
    pub fn reset_chat(&self) {
        *self.inner.session.borrow_mut() = None;
    }
}

impl Loaded {
    async fn generate(&self, request: &str, on_piece: &js_sys::Function) -> Result<String, String> {
        let (input, max_new, config) = GenerateRequest::parse(request)?;
        let mut sampler = Sampler::new(config);
        let emit = |piece: &str| {
            let _ = on_piece.call1(&JsValue::NULL, &JsValue::from_str(piece));
        };
        let out = match input {
            Input::Prompt(prompt) => generate_async(
                &self.decoder,
                &self.tokenizer,
                &prompt,
                max_new,
                &mut sampler,
                emit,
            )
            .await
            .map_err(|e| e.to_string())?,
            Input::Chat(messages) => {
                let template = self.template.as_ref().map_err(|e| e.clone())?;
                let prompt = template
                    .render(&messages, true, &serde_json::Value::Null)
                    .map_err(|e| e.to_string())?;
                let ids = self
                    .tokenizer
                    .encode_prompt(&prompt)
                    .map_err(|e| e.to_string())?;
                // The session leaves the cell while it is in use, so nothing borrows the cell
                // across an await.
                let mut session = self
                    .session
                    .borrow_mut()
                    .take()
                    .unwrap_or_else(|| Session::new(&self.decoder));
                let out = generate_ids_async(
                    &self.decoder,
                    &self.tokenizer,
                    &mut session,
                    ids,
                    max_new,
                    &mut sampler,
                    emit,
                )
                .await;
                if out.is_ok() {
                    *self.session.borrow_mut() = Some(session);
                }
                out.map_err(|e| e.to_string())?
            }
        };
        Ok(result_json(&out))
    }
}

/// `run --json`'s object: ids, text and timings.
fn result_json(out: &Generation) -> String {
    let t = &out.timings;
    serde_json::json!({
        "prompt_ids": out.prompt_ids,
        "generated_ids": out.generated_ids,
        "text": out.text,
        "timings": {
            "prompt_tokens": t.prompt_tokens,
            "prompt_ms": t.prompt_ms,
            "prompt_tokens_per_s": t.prompt_tps(),
            "decode_tokens": t.decode_tokens,
            "decode_ms": t.decode_ms,
            "decode_tokens_per_s": t.decode_tps(),
        },
    })
    .to_string()
}

/// Runs the browser's kernel checks ([`checks`]) and resolves to their report as JSON:
/// `cases` (each with `variant`, `shape`, `err`, `passed`), `passed` and `failed`.
///
/// # Errors
/// No WebGPU device, or the checks' inputs could not be made.
#[wasm_bindgen]
pub async fn check_kernels() -> Result<String, JsError> {
    let d = device().await?;
    let report = checks::run(&d).await.map_err(|e| JsError::new(&e))?;
    serde_json::to_string(&report).map_err(|e| JsError::new(&e.to_string()))
}

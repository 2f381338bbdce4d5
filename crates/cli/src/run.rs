//! `burn-gguf run`: load a GGUF model and generate text.
use burn_gguf::{GgufConfig, GgufLoader};
use burn_gguf_models::speculative::{DEFAULT_DRAFT_MAX, DraftModel};
use burn_gguf_models::{
    Decoder, Generation, GgufTokenizer, NgramConfig, Sampler, SamplerConfig, Session, Speculation,
    generate_ids,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Speculative decoding options of `run`, `chat` and `serve`.
#[derive(Clone, Debug, clap::Args)]
pub struct SpecArgs {
    /// Speculative decoding: `ngram` drafts tokens from the prompt and the output so far
    /// (prompt lookup) and verifies them in one pass (the same greedy text, the same sampling
    /// distribution); `none` runs one pass per token.
    #[arg(long, value_enum, default_value_t = SpecKind::None)]
    pub spec: SpecKind,
    /// Most tokens one draft holds (1..=63; 7 keeps a verify pass to one GEMV pass of 8 rows).
    #[arg(long, default_value_t = DEFAULT_DRAFT_MAX)]
    pub draft_max: usize,
    /// A draft model for speculative decoding (`run` and `chat`): a smaller GGUF model with the
    /// same tokenizer, which drafts greedily from its own KV cache (llama.cpp
    /// `--model-draft`). A file path, `org/repo:file.gguf` or a known name.
    #[arg(long, value_name = "MODEL", conflicts_with = "spec")]
    pub draft_model: Option<String>,
}

/// `--spec`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecKind {
    /// One pass per token.
    None,
    /// Drafts from the context (prompt lookup).
    Ngram,
}

impl SpecArgs {
    /// The drafts from the context these options ask for (`--spec`); a draft model is
    /// [`SpecArgs::speculation`]'s.
    pub fn context_drafts(&self) -> Speculation {
        match self.spec {
            SpecKind::None => Speculation::Off,
            SpecKind::Ngram => Speculation::Ngram(NgramConfig {
                draft_max: self.draft_max,
                ..NgramConfig::default()
            }),
        }
    }

    /// The speculative decoding these options ask for with `target` loaded: with
    /// `--draft-model`, that model loaded on the target's device (its tokenizer checked
    /// against the target's: the same tokens under the same ids), else
    /// [`SpecArgs::context_drafts`].
    ///
    /// # Errors
    /// A draft model that fails to load or whose vocabulary differs, as a message.
    pub fn speculation(
        &self,
        target: &Loaded,
        device: Option<&str>,
    ) -> Result<Speculation, String> {
        let Some(name) = &self.draft_model else {
            return Ok(self.context_drafts());
        };
        let path = crate::serve::models::resolve_one(name)?;
        let draft = load(&path, device, false, false)?;
        check_same_vocabulary(&target.tokenizer, &draft.tokenizer)
            .map_err(|e| format!("--draft-model {}: {e}", path.display()))?;
        Ok(Speculation::Draft(DraftModel {
            model: std::sync::Arc::new(draft.model),
            draft_max: self.draft_max,
        }))
    }
}

/// Whether `draft`'s tokens are `target`'s, id for id: the same count and the same text of
/// every token.
///
/// # Errors
/// The first difference, as a message.
pub fn check_same_vocabulary(target: &GgufTokenizer, draft: &GgufTokenizer) -> Result<(), String> {
    let (n, m) = (target.vocab_size(), draft.vocab_size());
    if n != m {
        return Err(format!(
            "its vocabulary has {m} tokens, the target's {n}: a draft model must share the \
             target's tokenizer"
        ));
    }
    for id in 0..n as u32 {
        if target.token_text(id) != draft.token_text(id) {
            return Err(format!(
                "token {id} is {:?} there and {:?} in the target: a draft model must share the \
                 target's tokenizer",
                draft.token_text(id),
                target.token_text(id)
            ));
        }
    }
    Ok(())
}

/// Options of one `run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Prompt text.
    pub prompt: String,
    /// Most new tokens.
    pub max_new: usize,
    /// Sampling parameters.
    pub sampler: SamplerConfig,
    /// Speculative decoding ([`Session::set_speculation`]).
    pub spec: SpecArgs,
    /// Dequantize every weight at load instead of keeping blocks packed.
    pub dequantize: bool,
    /// Print one JSON object instead of streaming text.
    pub json: bool,
    /// Show a progress bar while loading.
    pub progress: bool,
    /// The device ([`burn_gguf::select_device`]'s choice: `None` for the default adapter, an
    /// index or name from `burn-gguf devices`, or `cpu`).
    pub device: Option<String>,
    /// LoRA adapter files applied together ([`crate::finetune::attach_lora`]).
    pub lora: Vec<std::path::PathBuf>,
    /// The factor of the adapters' updates (llama.cpp `--lora-scaled`).
    pub lora_scale: f32,
    /// Where to write the prompt's teacher-forced logits, `[prompt tokens, vocab]` little-endian
    /// f32 row-major (to compare with another implementation).
    pub dump_logits: Option<std::path::PathBuf>,
}

/// A model loaded for generation.
pub struct Loaded {
    /// The file (metadata stays readable: chat template, architecture).
    pub file: gguf::GgufFile,
    /// Its tokenizer.
    pub tokenizer: GgufTokenizer,
    /// Its model, on the chosen device.
    pub model: Decoder,
    /// Seconds spent loading.
    pub load_s: f64,
}

/// Opens `model_path` and loads its tokenizer and model onto `device` (a
/// [`burn_gguf::select_device`] choice; packed, or dequantized with `dequantize`), with a progress bar on stderr when `progress`; prints the
/// load report to stderr. On a software device the calling thread, which is to generate, and
/// Burn fusion's service thread then run at a lower priority ([`crate::host`]).
///
/// # Errors
/// Any file, model, tokenizer or device error, as a message.
pub fn load(
    model_path: &Path,
    device: Option<&str>,
    dequantize: bool,
    progress: bool,
) -> Result<Loaded, String> {
    let t0 = Instant::now();
    let file =
        gguf::GgufFile::open(model_path).map_err(|e| format!("{}: {e}", model_path.display()))?;
    let tokenizer = GgufTokenizer::from_gguf(&file).map_err(|e| e.to_string())?;
    let device = burn_gguf::select_device(device).map_err(|e| e.to_string())?;
    let mem0 = burn_gguf::device_memory_in_use(&device).unwrap_or(0);
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let bar = if progress {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes} ({elapsed})")
            .expect("valid template"),
    );
    let loader = GgufLoader::new(
        &file,
        &device,
        GgufConfig {
            dequantize,
            ..GgufConfig::default()
        },
    )
    .with_progress(|n| bar.inc(n));
    let model = Decoder::load(&loader).map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    let load_s = t0.elapsed().as_secs_f64();
    eprintln!(
        "loaded {} in {load_s:.2} s: {}",
        model_path.display(),
        loader.report()
    );
    if let Some(mem) = burn_gguf::device_memory_in_use(&device) {
        eprintln!(
            "device memory for the weights: {} bytes (tensor data in the file: {total} bytes)",
            mem.saturating_sub(mem0)
        );
    }
    drop(loader);
    // This thread generates from here on; see `host` for why it runs at a lower priority on a
    // software device.
    match crate::host::yield_to_software_device(&device) {
        Ok(0) => {}
        Ok(n) => eprintln!(
            "software device: {n} host threads at a lower priority (nice), so the device's \
             workers get the cores ({} to change it)",
            crate::host::HOST_NICE_ENV
        ),
        Err(e) => eprintln!("warning: host thread priority unchanged: {e}"),
    }
    Ok(Loaded {
        file,
        tokenizer,
        model,
        load_s,
    })
}

/// Loads `model_path` and generates from `opts.prompt`, streaming text to stdout (or printing
/// one JSON object with `prompt_ids`, `generated_ids`, `text`, `timings`); load time and
/// speeds go to stderr.
///
/// # Errors
/// Any file, model, tokenizer or device error, as a message.
pub fn run(model_path: &Path, opts: &RunOptions) -> Result<(), String> {
    let loaded = load(
        model_path,
        opts.device.as_deref(),
        opts.dequantize,
        opts.progress,
    )?;
    let speculation = opts.spec.speculation(&loaded, opts.device.as_deref())?;
    let Loaded {
        tokenizer,
        mut model,
        load_s,
        ..
    } = loaded;
    crate::finetune::attach_lora(&mut model, &opts.lora, opts.lora_scale)?;

    let mut sampler = Sampler::new(opts.sampler.clone());
    let json = opts.json;
    let prompt_ids = tokenizer
        .encode(&opts.prompt, true)
        .map_err(|e| e.to_string())?;
    let mut session = Session::new(&model);
    session
        .set_speculation(speculation)
        .map_err(|e| e.to_string())?;
    let out = generate_ids(
        &model,
        &tokenizer,
        &mut session,
        prompt_ids,
        opts.max_new,
        &mut sampler,
        |piece| {
            if !json {
                let mut stdout = std::io::stdout().lock();
                let _ = stdout.write_all(piece.as_bytes());
                let _ = stdout.flush();
            }
        },
    )
    .map_err(|e| e.to_string())?;
    if let Some(path) = &opts.dump_logits {
        dump_logits(&model, &out.prompt_ids, path)?;
    }
    let t = &out.timings;
    if json {
        let v = serde_json::json!({
            "prompt_ids": out.prompt_ids,
            "generated_ids": out.generated_ids,
            "text": out.text,
            "timings": {
                "load_ms": load_s * 1e3,
                "prompt_tokens": t.prompt_tokens,
                "prompt_ms": t.prompt_ms,
                "prompt_tokens_per_s": t.prompt_tps(),
                "decode_tokens": t.decode_tokens,
                "decode_ms": t.decode_ms,
                "decode_tokens_per_s": t.decode_tps(),
            },
            "speculation": out.speculation,
        });
        println!("{v}");
    } else {
        println!();
    }
    eprintln!("load {load_s:.2} s | {}", speeds(&out));
    Ok(())
}

/// One line of a generation's speeds (and its speculation's counts, when on).
pub fn speeds(out: &Generation) -> String {
    let t = &out.timings;
    let mut line = format!(
        "prompt {} tokens, {:.1} tokens/s | decode {} tokens, {:.2} tokens/s",
        t.prompt_tokens,
        t.prompt_tps(),
        t.decode_tokens,
        t.decode_tps()
    );
    if let Some(s) = &out.speculation {
        line += &format!(
            " | drafted {}, accepted {} ({:.0}%), {:.2} tokens a verify pass",
            s.drafted,
            s.accepted,
            100.0 * s.acceptance_rate(),
            s.tokens_per_pass()
        );
    }
    line
}

/// Writes the teacher-forced logits of `ids` through `model` (a fresh state) to `path`:
/// `[ids.len(), vocab]` little-endian f32, row-major.
fn dump_logits(model: &Decoder, ids: &[u32], path: &Path) -> Result<(), String> {
    let mut state = burn_gguf_models::SequenceState::new();
    let logits = model
        .forward(ids, &mut state, true)
        .map_err(|e| e.to_string())?
        .try_into_data()
        .map_err(|e| format!("{e:?}"))?
        .convert::<f32>()
        .try_to_vec::<f32>()
        .map_err(|e| format!("{e:?}"))?;
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

//! `burn-gguf run`: load a GGUF model and generate text.
use burn_gguf::{GgufConfig, GgufLoader};
use burn_gguf_models::{Decoder, GgufTokenizer, Sampler, SamplerConfig, generate};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Options of one `run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Prompt text.
    pub prompt: String,
    /// Most new tokens.
    pub max_new: usize,
    /// Sampling parameters.
    pub sampler: SamplerConfig,
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
    let Loaded {
        tokenizer,
        mut model,
        load_s,
        ..
    } = load(
        model_path,
        opts.device.as_deref(),
        opts.dequantize,
        opts.progress,
    )?;
    crate::finetune::attach_lora(&mut model, &opts.lora, opts.lora_scale)?;

    let mut sampler = Sampler::new(opts.sampler.clone());
    let json = opts.json;
    let out = generate(
        &model,
        &tokenizer,
        &opts.prompt,
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
        });
        println!("{v}");
    } else {
        println!();
    }
    eprintln!(
        "load {load_s:.2} s | prompt {} tokens, {:.1} tokens/s | decode {} tokens, {:.2} tokens/s",
        t.prompt_tokens,
        t.prompt_tps(),
        t.decode_tokens,
        t.decode_tps()
    );
    Ok(())
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

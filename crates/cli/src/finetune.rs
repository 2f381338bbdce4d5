//! `burn-gguf finetune`: train a LoRA adapter over a GGUF model's packed weights and write it in
//! llama.cpp's adapter format; and `--lora` for `run`, `chat` and `serve` ([`attach_lora`]).
use burn_gguf::{GgufConfig, GgufLoader, LoraConfig, MatmulPath};
use burn_gguf_models::finetune::{Example, FineTune, TrainConfig, chat_examples, text_examples};
use burn_gguf_models::{ChatTemplate, Decoder, DecoderLora, GgufTokenizer};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Options of one `finetune` run.
#[derive(Clone, Debug)]
pub struct FinetuneOptions {
    /// Training data: plain text, or JSONL chat (`.jsonl`: one `{"messages": [...]}` a line).
    pub data: PathBuf,
    /// Where the adapter is written (and checkpointed).
    pub out: PathBuf,
    /// LoRA rank, alpha, dropout and targets.
    pub lora: LoraConfig,
    /// Optimizer steps.
    pub steps: usize,
    /// Learning rate, batch, seed.
    pub train: TrainConfig,
    /// Tokens per training sequence.
    pub seq_len: usize,
    /// Steps between checkpoints (0: only at the end).
    pub checkpoint_every: usize,
    /// The device (as `run --device`; `cpu` for Burn's CPU backend).
    pub device: Option<String>,
    /// Show a progress bar.
    pub progress: bool,
}

/// The training examples of `path`: JSONL chat when it ends in `.jsonl`, else plain text.
///
/// # Errors
/// An unreadable file, or the data errors of [`chat_examples`] / [`text_examples`] (a JSONL
/// line that does not parse names its number).
pub fn read_examples(
    path: &Path,
    file: &gguf::GgufFile,
    tokenizer: &GgufTokenizer,
    seq_len: usize,
) -> Result<Vec<Example>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let at = |e: burn_gguf_models::Error| format!("{}: {e}", path.display());
    if path.extension().is_some_and(|x| x == "jsonl") {
        let template = ChatTemplate::from_gguf(file, tokenizer).map_err(|e| e.to_string())?;
        chat_examples(tokenizer, &template, &text, seq_len).map_err(at)
    } else {
        text_examples(tokenizer, &text, seq_len).map_err(at)
    }
}

/// Loads `model_path` on an autodiff device, trains `opts.lora` adapters on `opts.data` for
/// `opts.steps` steps with a progress bar (loss, tokens/s), and writes the adapter to
/// `opts.out` every `opts.checkpoint_every` steps and at the end.
///
/// The packed products of this process run on the tile kernel, forward and transposed
/// ([`MatmulPath::Tile`], unless `BURN_GGUF_MATMUL_PATH` says otherwise): training measured
/// 1.02x the dense model's tokens/s that way, 0.97x with the library's default of chunked
/// forward products (`cargo xtask bench --finetune`, Gemma 3 270M on lavapipe, 2026-12-07).
///
/// # Errors
/// As a message: file, model, data or device errors; a sequence longer than the model's context;
/// a non-finite loss (the last checkpoint stays as written).
pub fn finetune(model_path: &Path, opts: &FinetuneOptions) -> Result<(), String> {
    let t0 = Instant::now();
    MatmulPath::prefer_tile_for_training();
    let file =
        gguf::GgufFile::open(model_path).map_err(|e| format!("{}: {e}", model_path.display()))?;
    let tokenizer = GgufTokenizer::from_gguf(&file).map_err(|e| e.to_string())?;
    let device = burn_gguf::select_device(opts.device.as_deref())
        .map_err(|e| e.to_string())?
        .autodiff();
    let loader = GgufLoader::new(&file, &device, GgufConfig::default());
    let model = Decoder::load(&loader).map_err(|e| e.to_string())?;
    eprintln!(
        "loaded {} in {:.2} s: {}",
        model_path.display(),
        t0.elapsed().as_secs_f64(),
        loader.report()
    );
    drop(loader);
    let c = model.config();
    if c.moe.is_some() {
        return Err(format!(
            "{}: fine-tuning a mixture-of-experts model ({}) is not supported yet (the expert \
             GEMV has no backward pass)",
            model_path.display(),
            c.architecture
        ));
    }
    if opts.seq_len + 1 > c.context_length {
        return Err(format!(
            "--seq-len {}: longer than the model's context of {} tokens",
            opts.seq_len, c.context_length
        ));
    }
    let data = read_examples(&opts.data, &file, &tokenizer, opts.seq_len)?;
    device.seed(opts.train.seed);
    let lora = DecoderLora::new(&model, &opts.lora, &device).map_err(|e| e.to_string())?;
    let targets: usize = data.iter().map(Example::targets).sum();
    eprintln!(
        "training {} LoRA adapters (rank {}, alpha {}, {} values) on {} sequences \
         ({targets} target tokens)",
        lora.targets().len(),
        opts.lora.rank,
        opts.lora.alpha,
        lora.num_values(),
        data.len()
    );
    let arch = c.architecture.clone();
    let mut run = FineTune::new(&model, lora, opts.train.clone());
    let bar = if opts.progress {
        ProgressBar::new(opts.steps as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg} ({elapsed}, eta {eta})")
            .expect("valid template"),
    );
    let save = |lora: &DecoderLora| -> Result<(), String> {
        let w = lora.to_gguf(&arch).map_err(|e| e.to_string())?;
        // Written beside the target and renamed, so an interrupted write keeps the last one.
        let tmp = opts.out.with_extension("gguf.tmp");
        w.write(&tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))
    };
    let eval_before = run.eval_loss(&data).map_err(|e| e.to_string())?;
    eprintln!("loss over all the data before training: {eval_before:.4}");
    let mut recent: std::collections::VecDeque<f32> = std::collections::VecDeque::new();
    for step in 1..=opts.steps {
        let stats = match run.step(&data) {
            Ok(s) => s,
            Err(e) => {
                bar.abandon();
                let kept = if step > 1 && opts.checkpoint_every > 0 {
                    format!("; the last checkpoint is {}", opts.out.display())
                } else {
                    String::new()
                };
                return Err(format!("{e}{kept}"));
            }
        };
        // The mean of the last 10 steps: one step's batch alone is a noisy figure.
        recent.push_back(stats.loss);
        if recent.len() > 10 {
            recent.pop_front();
        }
        let mean = recent.iter().sum::<f32>() / recent.len() as f32;
        bar.set_message(format!(
            "loss {mean:.4} (mean of the last {} steps), {:.0} tokens/s",
            recent.len(),
            stats.tokens as f64 / stats.seconds.max(1e-9)
        ));
        bar.inc(1);
        if !opts.progress && (step == 1 || step % 10 == 0 || step == opts.steps) {
            eprintln!(
                "step {step}/{}: loss {:.4} (mean of the last {} steps {mean:.4}), {:.1} tokens/s",
                opts.steps,
                stats.loss,
                recent.len(),
                stats.tokens as f64 / stats.seconds.max(1e-9)
            );
        }
        if opts.checkpoint_every > 0 && step % opts.checkpoint_every == 0 && step < opts.steps {
            save(run.lora())?;
        }
    }
    bar.finish();
    save(run.lora())?;
    let eval_after = run.eval_loss(&data).map_err(|e| e.to_string())?;
    eprintln!(
        "wrote {} after {} steps in {:.1} s: loss over all the data {eval_before:.4} -> \
         {eval_after:.4}",
        opts.out.display(),
        run.steps(),
        t0.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// Reads the adapter files `paths` for `model`, their updates multiplied by `scale`, and
/// attaches them (several files apply together, as llama.cpp's repeated `--lora`).
///
/// # Errors
/// As a message naming the file: an unreadable file, or an adapter that does not fit the model
/// ([`DecoderLora::from_gguf`]); nothing is attached then.
pub fn attach_lora(model: &mut Decoder, paths: &[PathBuf], scale: f32) -> Result<(), String> {
    if let Some(lora) = read_loras(model, paths, scale)? {
        eprintln!(
            "LoRA: {} adapted weights from {} file(s), scale {scale}",
            lora.targets().len(),
            paths.len()
        );
        model.set_lora(Some(lora));
    }
    Ok(())
}

/// The adapters of `paths` for `model` merged into one, or `None` for no path.
///
/// # Errors
/// As [`attach_lora`].
pub fn read_loras(
    model: &Decoder,
    paths: &[PathBuf],
    scale: f32,
) -> Result<Option<DecoderLora>, String> {
    let mut all: Option<DecoderLora> = None;
    for path in paths {
        let file = gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let lora = DecoderLora::from_gguf(&file, model, scale, model.device())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        all = Some(match all {
            None => lora,
            Some(a) => a.merge(lora),
        });
    }
    Ok(all)
}

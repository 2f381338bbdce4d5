//! LoRA fine-tuning, for `cargo xtask bench --finetune`: Gemma 3 270M Q4_K_M (or `--model`)
//! with rank-8 adapters on every attention and FFN projection, sequences of 256 tokens of the
//! repository's JSONL chat sample, trained twice in one run: over the packed blocks (the
//! ggml-quant tensor type under Burn's `Autodiff`), and over the same model with every weight
//! dequantized to f32 (the dense baseline, Burn's autodiff over dense matmuls). For each:
//! training tokens/s, device memory of the weights, and the peak device memory in use while
//! training (sampled every 2 ms), against what it must hold (weights + adapters + AdamW's two
//! moments + activations).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use burn_gguf::{GgufConfig, GgufLoader, LoraConfig};
use burn_gguf_models::finetune::{FineTune, TrainConfig, chat_examples};
use burn_gguf_models::{ChatTemplate, Decoder, DecoderLora, GgufTokenizer};
use ggml_kernels::matmul::MatmulPath;
use serde_json::{Value, json};

/// The chat sample the measurement trains on.
pub(super) const DATA: &str = "data/chat-sample.jsonl";
/// Tokens per training sequence.
const SEQ_LEN: usize = 256;

/// Peak of [`burn_gguf::device_memory_in_use`] while alive, sampled on a thread.
struct PeakMemory {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeakMemory {
    fn start(device: &burn::tensor::Device) -> Self {
        let (stop, peak) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (s, p, d) = (stop.clone(), peak.clone(), device.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(m) = burn_gguf::device_memory_in_use(&d) {
                    p.fetch_max(m, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Self {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

/// One variant's figures: load the model (packed, or dense with `dequantize`), train `steps`
/// steps (the first a warm-up: shader compiles), measure.
fn train(path: &Path, dequantize: bool, steps: usize) -> Result<Value, String> {
    let device = burn_gguf::default_device().autodiff();
    let mem0 = burn_gguf::device_memory_in_use(&device).unwrap_or(0);
    let file = gguf::GgufFile::open(path).map_err(|e| e.to_string())?;
    let tokenizer = GgufTokenizer::from_gguf(&file).map_err(|e| e.to_string())?;
    let template = ChatTemplate::from_gguf(&file, &tokenizer).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let config = GgufConfig {
        dequantize,
        ..GgufConfig::default()
    };
    let model =
        Decoder::load(&GgufLoader::new(&file, &device, config)).map_err(|e| e.to_string())?;
    let load_s = t0.elapsed().as_secs_f64();
    let weights = burn_gguf::device_memory_in_use(&device).unwrap_or(0) - mem0;
    let text = std::fs::read_to_string(DATA).map_err(|e| format!("{DATA}: {e}"))?;
    let data = chat_examples(&tokenizer, &template, &text, SEQ_LEN).map_err(|e| e.to_string())?;
    device.seed(0);
    let lora =
        DecoderLora::new(&model, &LoraConfig::default(), &device).map_err(|e| e.to_string())?;
    let lora_values = lora.num_values();
    let train_config = TrainConfig {
        lr: 1e-3,
        batch: 4,
        ..TrainConfig::default()
    };
    let mut run = FineTune::new(&model, lora, train_config);
    let peak = PeakMemory::start(&device);
    let mut losses = Vec::new();
    let (mut tokens, mut seconds) = (0usize, 0f64);
    for step in 0..steps {
        let s = run.step(&data).map_err(|e| e.to_string())?;
        losses.push(s.loss);
        if step > 0 {
            tokens += s.tokens;
            seconds += s.seconds;
        }
        println!(
            "  {} step {}: loss {:.4}, {} tokens in {:.1} s",
            if dequantize { "dense " } else { "packed" },
            step + 1,
            s.loss,
            s.tokens,
            s.seconds
        );
    }
    let peak = peak.finish().saturating_sub(mem0);
    let tps = tokens as f64 / seconds.max(1e-9);
    let f32_bytes = 4 * lora_values as u64;
    Ok(json!({
        "variant": if dequantize { "dense f32 (every weight dequantized)" } else { "packed" },
        "load_seconds": load_s,
        "weights_bytes": weights,
        "adapter_values": lora_values,
        "adapter_and_adamw_bytes": 3 * f32_bytes,
        "peak_bytes_in_use": peak,
        "peak_over_weights_bytes": peak.saturating_sub(weights),
        "tokens_per_second": tps,
        "timed_steps": steps.saturating_sub(1),
        "sequences_per_step": 4,
        "losses": losses,
    }))
}

/// Both variants in one run, side by side.
pub(super) fn run(model: Option<PathBuf>, steps: usize) -> Result<Value, String> {
    let path = model.ok_or("no model: pass --model or fetch gemma3-270m")?;
    // The path `burn-gguf finetune` takes, unless `--matmul-path` chose one.
    MatmulPath::prefer_tile_for_training();
    let client = burn_gguf::cube_client(&burn_gguf::default_device())
        .ok_or("the default device is not a CubeCL device")?;
    let matmul_path = format!(
        "{:?} forward, {:?} transposed",
        MatmulPath::for_client(&client, false),
        MatmulPath::for_client(&client, true)
    );
    println!(
        "fine-tuning: {} LoRA rank 8 on attn_q/k/v/output and ffn_gate/up/down, {SEQ_LEN}-token \
         sequences of {DATA}, AdamW lr 1e-3, 4 sequences a step, {steps} steps (the first a \
         warm-up), packed products on the {matmul_path} path",
        path.display()
    );
    let packed = train(&path, false, steps)?;
    let dense = train(&path, true, steps)?;
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "{:<8} {:>12} {:>14} {:>14} {:>10}",
        "variant", "tokens/s", "weights MiB", "peak MiB", "load s"
    );
    for (name, v) in [("packed", &packed), ("dense", &dense)] {
        println!(
            "{name:<8} {:>12.1} {:>14.1} {:>14.1} {:>10.2}",
            f(v, "tokens_per_second"),
            f(v, "weights_bytes") / 1048576.0,
            f(v, "peak_bytes_in_use") / 1048576.0,
            f(v, "load_seconds")
        );
    }
    let speed = f(&packed, "tokens_per_second") / f(&dense, "tokens_per_second");
    let memory = f(&packed, "peak_bytes_in_use") / f(&dense, "peak_bytes_in_use");
    println!("packed / dense: {speed:.2}x the training tokens/s, {memory:.2}x the peak memory\n");
    Ok(json!({
        "model": path.display().to_string(),
        "data": DATA,
        "seq_len": SEQ_LEN,
        "matmul_path": matmul_path,
        "packed": packed,
        "dense": dense,
        "speed_ratio": speed,
        "peak_memory_ratio": memory,
    }))
}

//! LoRA fine-tuning with the library API: load a GGUF model packed on an autodiff wgpu device
//! (its blocks stay quantized and frozen), train rank-8 adapters on a text, and write them in
//! llama.cpp's adapter format (`llama-cli --lora`, `burn-gguf run --lora`).
//!
//!     cargo run --example lora_finetune -- MODEL.gguf TEXT_FILE STEPS OUT.gguf
//!
//! Without arguments: the tiny Llama fixture, a built-in sentence, 20 steps, `lora.gguf` in the
//! system's temporary directory.
use burn_gguf::{GgufConfig, GgufLoader, LoraConfig};
use burn_gguf_models::finetune::{FineTune, TrainConfig, text_examples};
use burn_gguf_models::{Decoder, DecoderLora, GgufTokenizer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    burn_gguf_cli::host::use_private_runtime_dir(); // no Mesa warning without XDG_RUNTIME_DIR
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or("../shared/fixtures/arch/tiny-llama-Q8_0.gguf".into());
    let text = match args.next() {
        Some(f) => std::fs::read_to_string(f)?,
        None => "The quick brown fox jumps over the lazy dog.".into(),
    };
    let steps: usize = args.next().map_or(Ok(20), |s| s.parse())?;
    let out = args
        .next()
        .unwrap_or_else(|| std::env::temp_dir().join("lora.gguf").display().to_string());

    let file = gguf::GgufFile::open(&path)?;
    let device = burn_gguf::default_device().autodiff(); // gradients on the wgpu device
    let model = Decoder::load(&GgufLoader::new(&file, &device, GgufConfig::default()))?;
    let tokenizer = GgufTokenizer::from_gguf(&file)?;
    let data = text_examples(&tokenizer, &text, 256)?;

    let lora = DecoderLora::new(&model, &LoraConfig::default(), &device)?; // B = 0: no change yet
    let config = TrainConfig {
        lr: 3e-3,
        ..TrainConfig::default()
    };
    let mut run = FineTune::new(&model, lora, config);
    for step in 1..=steps {
        let stats = run.step(&data)?; // forward, backward through the packed blocks, AdamW
        println!("step {step}: loss {:.4}", stats.loss);
    }
    run.lora()
        .to_gguf(&model.config().architecture)?
        .write(&out)?;
    println!("wrote {out}");
    Ok(())
}

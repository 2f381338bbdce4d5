//! Text generation with the library API: open a GGUF file, load the model packed on the default
//! wgpu device, and generate greedily, printing the text as it comes.
//!
//!     cargo run --example generate -- ~/.cache/burn-gguf/models/gemma-3-270m-q4_k_m.gguf "Once upon a time"
use burn_gguf::{GgufConfig, GgufLoader};
use burn_gguf_models::{Decoder, GgufTokenizer, Sampler, SamplerConfig, generate};
use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    burn_gguf_cli::host::use_private_runtime_dir(); // no Mesa warning without XDG_RUNTIME_DIR
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or("../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf".into());
    let prompt = args.next().unwrap_or("Once upon a time".into());

    let file = gguf::GgufFile::open(&path)?;
    let device = burn_gguf::default_device();
    let loader = GgufLoader::new(&file, &device, GgufConfig::default());
    let model = Decoder::load(&loader)?;
    let tokenizer = GgufTokenizer::from_gguf(&file)?;
    println!("{}", loader.report()); // what was packed, and why anything was not

    let mut sampler = Sampler::new(SamplerConfig::default()); // greedy
    print!("{prompt}");
    let out = generate(&model, &tokenizer, &prompt, 32, &mut sampler, |piece| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
    })?;
    println!("\n{:.1} tokens/s", out.timings.decode_tps());
    Ok(())
}

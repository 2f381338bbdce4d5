//! End-to-end generation for `cargo xtask bench`: load time, time to first token, prompt and
//! greedy decode tokens/s (a cold and a warm generation), peak resident memory, and llama.cpp's
//! figure for the same model when the fixture table is beside the checkout.
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The llama.cpp figure for the same model on this machine class (CPU, 2 threads).
const LLAMA_BENCH_MD: &str = "shared/fixtures/gemma/gemma3_270m_llama_bench.md";

/// Prompt of a full run's end-to-end measurement (a paragraph).
const LONG_PROMPT: &str = "The old lighthouse keeper climbed the spiral stairs every evening, \
    counting the one hundred and twelve steps as his father had taught him. At the top he wiped \
    the salt from the great lens, trimmed the wick, and watched the fishing boats come home \
    across the darkening bay. One night, a ship he had never seen before";
/// Prompt of a quick run's end-to-end measurement.
const SHORT_PROMPT: &str = "Once upon a time";

/// The end-to-end measurement as JSON; `{"skipped": reason}` when there is no model or it fails
/// (the kernel benchmarks still run).
pub(super) fn end_to_end(opts: &super::Options) -> Value {
    let Some(path) = model_path(opts) else {
        return json!({"skipped": "no known gemma3-270m model"});
    };
    if !path.is_file() {
        let why = format!(
            "model {} not found (`cargo xtask fetch-model gemma3-270m`, or --model PATH)",
            path.display()
        );
        println!("end to end: skipped: {why}\n");
        return json!({"skipped": why, "model": path.display().to_string()});
    }
    match generate_timed(&path, opts.quick) {
        Ok(v) => v,
        Err(e) => {
            println!("end to end: failed: {e}\n");
            json!({"skipped": format!("failed: {e}"), "model": path.display().to_string()})
        }
    }
}

/// The model of the end-to-end and decode measurements: `--model`, else Gemma 3 270M in the
/// model cache (which may not exist yet).
pub(super) fn model_path(opts: &super::Options) -> Option<PathBuf> {
    match &opts.model {
        Some(p) => Some(p.clone()),
        None => {
            let known = burn_gguf_cli::fetch::known_model("gemma3-270m")?;
            Some(
                burn_gguf_cli::fetch::cache_dir()
                    .join("models")
                    .join(known.file_name),
            )
        }
    }
}

fn generate_timed(path: &Path, quick: bool) -> Result<Value, String> {
    use burn_gguf_models::{Sampler, SamplerConfig, generate};
    let (prompt, cold_n, warm_n) = if quick {
        (SHORT_PROMPT, 4, 16)
    } else {
        (LONG_PROMPT, 8, 64)
    };
    println!("end to end: {}", path.display());
    let loaded = burn_gguf_cli::run::load(path, None, false, false)?;
    let greedy = SamplerConfig::default();
    let mut runs = Vec::new();
    for (label, n) in [("cold", cold_n), ("warm", warm_n)] {
        let g = generate(
            &loaded.model,
            &loaded.tokenizer,
            prompt,
            n,
            &mut Sampler::new(greedy.clone()),
            |_| {},
        )
        .map_err(|e| e.to_string())?;
        let t = &g.timings;
        println!(
            "  {label}: time to first token {:.1} ms ({} prompt tokens, {:.1} tokens/s), decode {} tokens at {:.2} tokens/s",
            t.prompt_ms,
            t.prompt_tokens,
            t.prompt_tps(),
            t.decode_tokens,
            t.decode_tps()
        );
        runs.push(json!({
            "run": label,
            "ttft_ms": t.prompt_ms,
            "prompt_tokens": t.prompt_tokens,
            "prompt_tokens_per_s": t.prompt_tps(),
            "decode_tokens": t.decode_tokens,
            "decode_ms": t.decode_ms,
            "decode_tokens_per_s": t.decode_tps(),
            "text": g.text,
        }));
    }
    let rss_kb = peak_rss_kb();
    let warm_decode = runs[1]["decode_tokens_per_s"].as_f64().unwrap_or(f64::NAN);
    let warm_prompt = runs[1]["prompt_tokens_per_s"].as_f64().unwrap_or(f64::NAN);
    let is_gemma = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("gemma-3-270m"));
    let llama = if is_gemma { llama_reference() } else { None };
    println!(
        "  load {:.2} s, peak RSS {}",
        loaded.load_s,
        rss_kb.map_or("unknown".into(), |k| format!("{k} kB"))
    );
    match &llama {
        Some((file, pp, tg)) => println!(
            "  llama.cpp ({file}): pp64 {pp:.2} t/s, tg32 {tg:.2} t/s; decode here / llama.cpp = {:.3}, prompt here / llama.cpp = {:.3}\n",
            warm_decode / tg,
            warm_prompt / pp
        ),
        None => println!("  (no llama.cpp reference for this model here)\n"),
    }
    Ok(json!({
        "model": path.display().to_string(),
        "prompt": prompt,
        "load_seconds": loaded.load_s,
        "runs": runs,
        "decode_tokens_per_s": warm_decode,
        "prompt_tokens_per_s": warm_prompt,
        "ttft_ms": runs[1]["ttft_ms"],
        "peak_rss_kb": rss_kb,
        "llama_cpp": llama.as_ref().map(|(file, pp, tg)| json!({
            "file": file,
            "pp64_tokens_per_s": pp,
            "tg32_tokens_per_s": tg,
            "decode_ratio": warm_decode / tg,
            "prompt_ratio": warm_prompt / pp,
        })),
    }))
}

/// `VmHWM` of this process (peak resident set), in kB.
fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// llama.cpp's pp64 and tg32 tokens/s for Gemma 3 270M from the fixture table (`../shared`
/// beside the checkout, found from the working directory or from where xtask was built).
fn llama_reference() -> Option<(String, f64, f64)> {
    let candidates = [
        PathBuf::from("..").join(LLAMA_BENCH_MD),
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(LLAMA_BENCH_MD),
    ];
    let (path, text) = candidates
        .iter()
        .find_map(|p| Some((p, std::fs::read_to_string(p).ok()?)))?;
    let rate = |test: &str| -> Option<f64> {
        text.lines().find_map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            let i = cols.iter().position(|c| *c == test)?;
            cols.get(i + 1)?.split_whitespace().next()?.parse().ok()
        })
    };
    Some((path.display().to_string(), rate("pp64")?, rate("tg32")?))
}

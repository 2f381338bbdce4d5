//! What one decoded token costs, for `cargo xtask bench`: kernels launched per token (counted
//! with CubeCL's launch observer, on every thread that issues launches: the generating thread
//! and Burn fusion's), the generating thread's CPU time per token (host time), wall time per
//! token (decode tokens/s), the floor those launches set (kernels per token x the time of one
//! empty kernel's dispatch on this device, measured in the same run), the first token of a
//! fresh process (a child `xtask first-token` process: start, load, prefill, first token), and,
//! with `--llama-bench PATH`, llama.cpp's `tg` and `pp` on the same file in the same run.
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn_gguf_models::generate::next_token;
use burn_gguf_models::{CausalLm, Sampler, SamplerConfig};
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl_runtime::logging::{LaunchObservation, LaunchObserver};
use serde_json::{Value, json};

/// The prompt of every decode measurement.
pub(super) const PROMPT: &str = "Once upon a time";
/// Tiny fixture whose weights (1.4 MB) make its decode time per-token overhead.
pub(super) const TINY: &str = "../shared/fixtures/gguf/tiny-qwen3-Q8_0.gguf";

/// Kernel launches by name while installed.
#[derive(Default)]
struct Launches(Mutex<HashMap<&'static str, usize>>);

impl LaunchObserver for Launches {
    fn launched(&self, kernel: &'static str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kernel)
            .or_default() += 1;
    }
}

/// CPU seconds of the calling thread.
fn thread_cpu_s() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// CPU seconds of the whole process (every thread).
fn process_cpu_s() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Seconds one empty kernel's dispatch takes on `client`: `count` launches of a kernel that
/// writes one word, then one sync, divided by `count` (after a warm-up that compiles it).
pub(super) fn empty_kernel_s(client: &Client, count: usize) -> Result<f64, String> {
    let out = client.empty(4);
    let launch = || {
        // SAFETY: one unit writes index 0 of a one-word buffer.
        unsafe {
            empty::launch_unchecked(
                client,
                CubeCount::Static(1, 1, 1),
                CubeDim::new_1d(1),
                BufferArg::from_raw_parts(out.clone(), 1),
            )
        }
    };
    let sync = || cubecl::future::block_on(client.sync()).map_err(|e| format!("{e:?}"));
    launch();
    sync()?;
    let t = Instant::now();
    for _ in 0..count {
        launch();
    }
    sync()?;
    Ok(t.elapsed().as_secs_f64() / count as f64)
}

#[cube(launch_unchecked)]
fn empty(out: &mut [u32]) {
    out[0] = 1u32;
}

/// Per-token costs of greedy decoding `steps` tokens of `model` after [`PROMPT`], in `rounds`
/// rounds, each from an empty cache (as llama-bench's `tg` runs), after a warm-up generation
/// (kernels compiled). Wall time per token is the median round's; launches and CPU time are
/// summed over all rounds.
pub(super) fn decode_costs(
    label: &str,
    path: &Path,
    steps: usize,
    rounds: usize,
    floor_s: f64,
) -> Result<Value, String> {
    let loaded = burn_gguf_cli::run::load(path, None, false, false)?;
    let (model, tokenizer) = (&loaded.model, &loaded.tokenizer);
    let greedy = SamplerConfig::default();
    let mut sampler = Sampler::new(greedy.clone());
    // Warm-up: every kernel of prefill and decode compiled, tables and caches sized.
    burn_gguf_models::generate(model, tokenizer, PROMPT, 8, &mut sampler, |_| {})
        .map_err(|e| e.to_string())?;
    let ids = tokenizer.encode(PROMPT, true).map_err(|e| e.to_string())?;
    let launches = Arc::new(Launches::default());
    let rounds = rounds.max(1);
    let (mut walls, mut cpu, mut proc) = (Vec::with_capacity(rounds), 0.0, 0.0);
    for _ in 0..rounds {
        let mut state = model.new_cache();
        let logits = model
            .forward(&ids, &mut state, false)
            .map_err(|e| e.to_string())?;
        let mut token = next_token(logits, &mut sampler).map_err(|e| e.to_string())?;
        // One decode step unobserved, then `steps` observed.
        let logits = model
            .forward(&[token], &mut state, false)
            .map_err(|e| e.to_string())?;
        token = next_token(logits, &mut sampler).map_err(|e| e.to_string())?;
        let observation = LaunchObservation::new(launches.clone());
        let (wall0, cpu0, proc0) = (Instant::now(), thread_cpu_s(), process_cpu_s());
        for _ in 0..steps {
            let logits = model
                .forward(&[token], &mut state, false)
                .map_err(|e| e.to_string())?;
            token = next_token(logits, &mut sampler).map_err(|e| e.to_string())?;
        }
        walls.push(wall0.elapsed().as_secs_f64());
        cpu += thread_cpu_s() - cpu0;
        proc += process_cpu_s() - proc0;
        drop(observation);
    }
    walls.sort_by(f64::total_cmp);
    let wall = walls[walls.len() / 2];
    let counts = launches.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let total: usize = counts.values().sum();
    let observed = (steps * rounds) as f64;
    let per_token = total as f64 / observed;
    let mut by_kernel: Vec<(&str, usize)> = counts.into_iter().collect();
    by_kernel.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let n = steps as f64;
    let ms = |round_s: f64| round_s / n * 1e3;
    println!(
        "  {label}: {per_token:.1} kernels/token, host {:.2} ms/token (process CPU {:.2} ms), \
         {:.2} ms/token = {:.2} tokens/s (median of {rounds} rounds of {steps}; {:.2}-{:.2} ms); \
         launch floor {:.3} ms/token",
        cpu / observed * 1e3,
        proc / observed * 1e3,
        ms(wall),
        n / wall,
        ms(walls[0]),
        ms(walls[walls.len() - 1]),
        per_token * floor_s * 1e3
    );
    for (name, c) in by_kernel.iter().take(12) {
        println!("      {:>7.2}/token  {name}", *c as f64 / observed);
    }
    Ok(json!({
        "model": path.display().to_string(),
        "n_layers": model.config().n_layers,
        "steps": steps,
        "rounds": rounds,
        "kernels_per_token": per_token,
        "kernels_per_token_by_name": by_kernel
            .iter()
            .map(|(k, c)| json!({"kernel": k, "per_token": *c as f64 / observed}))
            .collect::<Vec<_>>(),
        "host_ms_per_token": cpu / observed * 1e3,
        "process_cpu_ms_per_token": proc / observed * 1e3,
        "ms_per_token": ms(wall),
        "ms_per_token_rounds": walls.iter().map(|w| ms(*w)).collect::<Vec<_>>(),
        "decode_tokens_per_s": n / wall,
        "launch_floor_ms_per_token": per_token * floor_s * 1e3,
    }))
}

/// Seconds from starting a child `xtask first-token PATH` to its first token on stdout, and
/// the child's own split (load, prefill + first token). `kernel_cache` sets the child's
/// `BURN_GGUF_KERNEL_CACHE` (its WGSL cache folder, `ggml_kernels::wgsl_cache`).
pub(super) fn fresh_first_token(path: &Path, kernel_cache: Option<&Path>) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut command = Command::new(exe);
    if let Some(dir) = kernel_cache {
        command.env("BURN_GGUF_KERNEL_CACHE", dir);
    }
    let mut child = command
        .arg("first-token")
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("first-token child: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let wall = t.elapsed().as_secs_f64();
    let status = child.wait().map_err(|e| e.to_string())?;
    let child_json: Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("first-token child ({status}): {e}: {line:?}"))?;
    Ok(json!({"seconds": wall, "child": child_json}))
}

/// A fresh process's first token with an empty WGSL cache (in a folder of its own, removed
/// after), then with the cache of this build filled (the second of two runs), the driver's
/// shader cache as it is. Prints both, each with the child's load and first-token split.
fn fresh_first_tokens(label: &str, path: &Path) -> Result<Value, String> {
    let empty = std::env::temp_dir().join(format!("burn-gguf-bench-wgsl-{}", std::process::id()));
    let cold = fresh_first_token(path, Some(&empty));
    let _ = std::fs::remove_dir_all(&empty);
    let cold = cold?;
    fresh_first_token(path, None)?;
    let warm = fresh_first_token(path, None)?;
    for (name, f) in [("empty WGSL cache", &cold), ("warm WGSL cache", &warm)] {
        println!(
            "  {label}: fresh process to first token, {name}: {:.2} s (load {:.2} s, then prefill and \
             first token {:.2} s)",
            f["seconds"].as_f64().unwrap_or(f64::NAN),
            f["child"]["load_s"].as_f64().unwrap_or(f64::NAN),
            f["child"]["first_token_s"].as_f64().unwrap_or(f64::NAN),
        );
    }
    Ok(json!({"empty_wgsl_cache": cold, "warm_wgsl_cache": warm}))
}

/// The child of [`fresh_first_token`]: loads `path`, prefills [`PROMPT`], picks the first
/// token and prints one JSON line (then exits without tearing anything down).
pub fn first_token_child(path: &Path) -> Result<(), String> {
    let t = Instant::now();
    let loaded = burn_gguf_cli::run::load(path, None, false, false)?;
    let load_s = t.elapsed().as_secs_f64();
    let ids = loaded
        .tokenizer
        .encode(PROMPT, true)
        .map_err(|e| e.to_string())?;
    let mut state = loaded.model.new_cache();
    let logits = loaded
        .model
        .forward(&ids, &mut state, false)
        .map_err(|e| e.to_string())?;
    let token = next_token(logits, &mut Sampler::new(SamplerConfig::default()))
        .map_err(|e| e.to_string())?;
    let line = json!({
        "load_s": load_s,
        "first_token_s": t.elapsed().as_secs_f64() - load_s,
        "token": token,
    });
    println!("{line}");
    std::process::exit(0)
}

/// llama.cpp's `llama-bench` on `model` (2 threads, CPU): `(pp tokens/s, tg tokens/s)` for a
/// `pp`-token prompt and `tg` generated tokens.
pub(super) fn llama_bench(
    bin: &Path,
    model: &Path,
    pp: usize,
    tg: usize,
) -> Result<(f64, f64), String> {
    let out = Command::new(bin)
        .args(["-m"])
        .arg(model)
        .args([
            "-p",
            &pp.to_string(),
            "-n",
            &tg.to_string(),
            "-t",
            "2",
            "-o",
            "json",
        ])
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let rows: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let rate = |prompt: bool| -> Option<f64> {
        rows.as_array()?.iter().find_map(|r| {
            let (p, g) = (r["n_prompt"].as_u64()?, r["n_gen"].as_u64()?);
            (if prompt {
                p > 0 && g == 0
            } else {
                g > 0 && p == 0
            })
            .then(|| r["avg_ts"].as_f64())?
        })
    };
    Ok((
        rate(true).ok_or("no pp row in llama-bench's output")?,
        rate(false).ok_or("no tg row in llama-bench's output")?,
    ))
}

/// One model of the decode section.
pub(super) struct DecodeModel {
    /// Its name in the output (`tiny` is measured against llama.cpp's tg64, others tg32).
    pub label: &'static str,
    /// The GGUF file.
    pub path: PathBuf,
    /// Decode steps per round.
    pub steps: usize,
    /// Rounds of `steps` from an empty cache.
    pub rounds: usize,
    /// Streams of the batched-decode measurement ([`super::batch::batched_decode`]).
    pub streams: usize,
    /// Tokens per stream of the batched-decode measurement.
    pub batch_steps: usize,
}

/// The decode section of the bench: the empty-kernel floor, then for each model its per-token
/// costs, batched decode of several streams against each alone, its fresh-process first
/// token, and llama.cpp's figures when `llama` is given.
pub(super) fn run(client: &Client, models: &[DecodeModel], llama: Option<&Path>) -> Value {
    println!("decode (greedy, after \"{PROMPT}\"):");
    let floor = match empty_kernel_s(client, 2000) {
        Ok(s) => s,
        Err(e) => {
            println!("  empty kernel: failed: {e}\n");
            return json!({"skipped": e});
        }
    };
    println!("  empty kernel dispatch: {:.1} us", floor * 1e6);
    let mut out = serde_json::Map::new();
    out.insert("empty_kernel_us".into(), json!(floor * 1e6));
    for m in models {
        let (label, path) = (&m.label, &m.path);
        if !path.is_file() {
            println!("  {label}: skipped: {} not found", path.display());
            out.insert(
                (*label).into(),
                json!({"skipped": format!("{} not found", path.display())}),
            );
            continue;
        }
        let mut v = decode_costs(label, path, m.steps, m.rounds, floor).unwrap_or_else(|e| {
            println!("  {label}: failed: {e}");
            json!({"skipped": e})
        });
        match super::batch::batched_decode(label, path, m.streams, m.batch_steps) {
            Ok(b) => v["batched"] = b,
            Err(e) => println!("  {label}: batched decode failed: {e}"),
        }
        match fresh_first_tokens(label, path) {
            Ok(f) => v["fresh_first_token"] = f,
            Err(e) => println!("  {label}: fresh first token failed: {e}"),
        }
        if let Some(bin) = llama {
            let tg = if *label == "tiny" { 64 } else { 32 };
            match llama_bench(bin, path, 64, tg) {
                Ok((pp, tgs)) => {
                    let ours = v["decode_tokens_per_s"].as_f64().unwrap_or(f64::NAN);
                    println!(
                        "  {label}: llama.cpp pp64 {pp:.1} t/s, tg{tg} {tgs:.1} t/s; decode here / llama.cpp = {:.3}",
                        ours / tgs
                    );
                    v["llama_cpp"] = json!({
                        "binary": bin.display().to_string(),
                        "pp64_tokens_per_s": pp,
                        format!("tg{tg}_tokens_per_s"): tgs,
                        "decode_ratio": ours / tgs,
                    });
                }
                Err(e) => println!("  {label}: llama-bench failed: {e}"),
            }
        }
        out.insert((*label).into(), v);
    }
    println!();
    Value::Object(out)
}

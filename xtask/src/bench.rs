//! `cargo xtask bench`: how fast the packed path runs on the default wgpu device, next to the
//! device's own read bandwidth and the dense (dequantized f32) path, plus one end-to-end
//! generation on Gemma 3 270M. A harness, not a test: it prints a table and, with `--json`,
//! writes every figure to a file.
//!
//! What is measured (all times are wall-clock seconds per call: the least of three round means,
//! each round repeated calls after one warm-up call that compiles the kernel and runs any
//! autotuning):
//! - **GEMV** (`y = x W^T`, `x` of 1 or 8 activation rows) for each ggml type with a kernel and
//!   each shape `rows x cols`: the fused dequantize + GEMV kernel launched directly with the
//!   variant the library selects for this device ([`GemvConfig::for_client`], what the model
//!   runs), split by rows into buffers the device takes (128 MiB on lavapipe). `gbps` is weight
//!   bytes / seconds (10^9 bytes per second; activations and outputs are not counted).
//! - **read**: a plain read kernel ([`read_words()`]) over the same weight buffers, as wide vectors
//!   of `u32` words, each unit writing one word (1/32 of the bytes read with 4-word vectors, not
//!   counted): the bandwidth this device reaches on these bytes, measured in the same run.
//!   `ratio_to_read` is GEMV GB/s over read GB/s (1.0: the GEMV reads its weights as fast as a
//!   plain read would).
//! - **Burn path**: the same GEMV through [`GgmlTensor::matmul_t`] (Burn's dispatch, fusion and
//!   allocation included), and the **dense** path: Burn's f32 matmul of a dequantized weight of
//!   the same shape ([`DenseWeight`], split by rows like the loader's), what a model runs when the
//!   loader does not pack. The dense time does not depend on the source type, so it is measured
//!   once per shape and batch (on random f32 values); on the first shape (4096 x 4096, which every
//!   type runs on) it is timed again for each type at one activation row, in rounds alternating
//!   with the kernel's ([`measure_alternating`]: a shared machine's speed drifts over a run, and
//!   the ratio of two times taken side by side is steadier), and that row reports it
//!   (`dense_alternated`). `packed_over_dense` is Burn-path packed time over dense time (below
//!   1: packed is faster); `--quick` skips the Burn path and divides the kernel's time instead
//!   (`packed_over_dense_from` says which).
//! - **prefill**: 512 activation rows through [`GgmlTensor::matmul_t`] against the dense matmul,
//!   on the path the library picks for the device ([`MatmulPath::for_client`]) and on each path
//!   in turn (`tile_seconds`: the tile kernel; `chunked_seconds`: bounded chunks of rows
//!   dequantized and multiplied with Burn's matmul); GFLOP/s = 2 * m * rows * cols / seconds /
//!   10^9.
//! - **end to end** (Gemma 3 270M Q4_K_M from the model cache, or `--model`): load time, time to
//!   first token (prefill of the prompt and the choice of the first token), prompt tokens/s and
//!   greedy decode tokens/s, in a first (cold: kernels compile) and a second (warm) generation;
//!   peak resident memory of the process (`VmHWM`), measured right after it, before the kernel
//!   benchmarks allocate. It runs first for that reason.
//! - **caches**: whether CubeCL's environment database (autotune results; `target/environment`
//!   under the outermost `Cargo.toml` above the working directory, else the user cache) and the
//!   driver's shader caches (Mesa, NVIDIA) existed when the run started: cold caches make the
//!   warm-up calls and the first generation slower.
//!
//! `--quick` runs every type on the first shape at 1 and 8 rows but only the key types at 1 row
//! on the others, prefill on the first shape, rounds of at least 0.05 s and one call (so one
//! timed call per round where a call takes longer), and a short generation.
//!
//! Weights are random valid blocks (a small set repeated: the values do not matter for timing,
//! only that they decode to finite numbers).
mod batch;
pub(crate) mod decode;
mod depth;
mod e2e;
mod finetune;
mod serve;
mod spec;
mod system;
mod timing;

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::{Device, FloatDType, Tensor, TensorData};
use burn_gguf::{DenseWeight, GgmlTensor, Weight};
use cubecl::client::Client;
use cubecl::prelude::*;
use ggml_kernels::check::rand_f32;
use ggml_kernels::matmul::MatmulPath;
use ggml_kernels::{GemvConfig, MAX_GEMV_ROWS, cube_count_for, words_for_bytes};
use gguf::GgmlType;
use serde_json::{Value, json};
use system::{adapters, cache_state, print_caches, utc_now};
use timing::*;

/// The GEMV shapes `[rows, cols]`: a 4096-wide projection, the FFN up/gate and down of an
/// 8B-class model, and Gemma 3's 262,144 x 640 token embedding (its tied output head).
pub const SHAPES: [[usize; 2]; 4] = [[4096, 4096], [14336, 4096], [4096, 14336], [262_144, 640]];

/// The types of llama.cpp's common mixes (Q4_K_M: Q4_K, Q6_K, Q5_0, Q8_0) and F16: the only ones
/// benchmarked beyond the first shape with `--quick`, and the prefill types of a full run.
pub const KEY_TYPES: [GgmlType; 5] = [
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::F16,
];

/// Activation rows of the prefill measurement.
pub const PREFILL_ROWS: usize = 512;

/// Units per cube of the read kernel.
const READ_CUBE_DIM: u32 = 256;
/// Vectors each unit of the read kernel loads (unrolled, so they are all in flight at once).
const READ_UNROLL: u32 = 8;

/// Options of one run (the command line of `cargo xtask bench`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Options {
    /// Also write every figure to this JSON file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Reduced set (all types on 4096x4096, the key types on the other shapes; prefill of Q4_K
    /// on 4096x4096; 16 decode tokens) and shorter timings: under 5 minutes on lavapipe.
    #[arg(long)]
    pub quick: bool,
    /// Only this ggml type (repeatable; e.g. --type Q4_K --type Q8_0). All with a kernel when
    /// absent.
    #[arg(long = "type", value_name = "T")]
    pub types: Vec<GgmlType>,
    /// Skip the end-to-end generation.
    #[arg(long)]
    pub no_e2e: bool,
    /// GGUF model for the end-to-end generation (default: Gemma 3 270M from the model cache;
    /// skipped with a message when absent).
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Least seconds each measurement repeats for (default 0.25, or 0.05 with --quick).
    #[arg(long, value_name = "SECONDS")]
    pub min_time: Option<f64>,
    /// Time this GEMV variant instead of the library's choice: a `GemvConfig` name
    /// (own-r8-l8-plane, own-r8-l8, split-l8-r8-smem, split-l32-r8-plane, ...) or one of
    /// row-per-unit, shared, shared-one-row, own-rows, plane.
    #[arg(long, value_name = "NAME")]
    pub variant: Option<String>,
    /// llama.cpp's `llama-bench` binary (`scripts/build-llama-bench.sh` builds one): its `tg`
    /// and `pp` on the same model files, measured in this run next to ours.
    #[arg(long, value_name = "PATH")]
    pub llama_bench: Option<PathBuf>,
    /// Tiny model of the per-token overhead measurement (default: the tiny-qwen3-Q8_0 fixture
    /// in ../shared).
    #[arg(long, value_name = "PATH")]
    pub tiny: Option<PathBuf>,
    /// The wgpu adapter to measure: an index or part of a name from `burn-gguf devices` (the
    /// default adapter when absent). It becomes the process's default device, and that of the
    /// fresh processes the first-token measurement starts.
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// Only the decode measurements (kernels, host time and tokens/s per token, fresh-process
    /// first token, llama.cpp): no GEMV, prefill or end-to-end tables.
    #[arg(long)]
    pub decode_only: bool,
    /// Only the fine-tuning measurement: LoRA training over the packed model against the same
    /// model dequantized to f32 (tokens/s, peak device memory), `--finetune-steps` steps each.
    #[arg(long)]
    pub finetune: bool,
    /// Training steps of each fine-tuning variant, the first a warm-up (default 4).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub finetune_steps: usize,
    /// The path of every product over many activation rows in this run (prefill, training):
    /// `tile` (the tile kernel) or `chunked` (dequantized chunks and Burn's matmul). When
    /// absent: the library's choice per product (`MatmulPath::for_client`), except that the
    /// fine-tuning measurement takes `tile`, as `burn-gguf finetune` does. The prefill rows
    /// time both paths regardless.
    #[arg(long, value_name = "PATH", value_parser = ["tile", "chunked"])]
    pub matmul_path: Option<String>,
    /// Only the serving measurements, through the server's engine on the end-to-end model:
    /// 8 batched greedy streams, all free and then one under a JSON schema (the free streams'
    /// decode tokens/s side by side); then the prefix cache: time to first token of requests
    /// sharing a long system prompt, the first against the others.
    #[arg(long)]
    pub serve: bool,
    /// Tokens each stream of the serving measurements generates (default 32).
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub serve_steps: usize,
    /// Tokens of the prefix-cache measurement's shared system prompt (default 1,500).
    #[arg(long, value_name = "N", default_value_t = 1500)]
    pub serve_prompt_tokens: usize,
    /// Requests of the prefix-cache measurement (default 10).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub serve_requests: usize,
    /// Only the speculative-decoding measurement on the end-to-end model: greedy decode
    /// tokens/s with drafts from the context against plain decoding, on prompts that copy and
    /// one that does not (acceptance rates, the same text checked).
    #[arg(long)]
    pub spec: bool,
    /// Tokens each generation of the speculative-decoding measurement produces (default 64).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub spec_steps: usize,
    /// Only the decode-at-depth measurement: the attention kernel over 64 to 2,048 cached keys
    /// (a key per unit against a plane per key), and the end-to-end model's decode tokens/s
    /// after a 590-token prompt against after a 5-token one.
    #[arg(long)]
    pub depth: bool,
}

/// Makes the adapter `choice` names the default wgpu device of this process and of the processes
/// it starts, through CubeCL's `CUBECL_WGPU_DEFAULT_DEVICE` (spelled as Burn's `DeviceKind`
/// debug form, e.g. `DiscreteGpu(0)`). Called before any device exists, on the main thread.
fn pin_default_device(choice: &str) -> Result<(), String> {
    if choice.eq_ignore_ascii_case("cpu") {
        return Err("--device cpu: the benchmark times CubeCL kernels; name a wgpu adapter".into());
    }
    let kind = burn_gguf::device::adapter_kind(choice).map_err(|e| e.to_string())?;
    println!("device: {kind:?} (--device {choice})");
    // SAFETY: the benchmark has started no thread yet; nothing reads the environment at once.
    unsafe { std::env::set_var("CUBECL_WGPU_DEFAULT_DEVICE", format!("{kind:?}")) };
    Ok(())
}

/// The GEMV variant `name` ([`GemvConfig`]'s `FromStr`: `own-r8-l8-plane`, `split-l8-r8-smem`, the
/// aliases `row-per-unit`, `shared`, `shared-one-row`, `own-rows`, or `plane` for the device's
/// plane split variant) if `client` can run it.
fn named_variant(client: &Client, name: &str) -> Result<GemvConfig, String> {
    let config = match name {
        "plane" => GemvConfig::variants(client)
            .into_iter()
            .find(|c| matches!(c, GemvConfig::Split { plane: true, .. }))
            .ok_or_else(|| format!("variant '{name}' does not run on this device"))?,
        _ => name.parse::<GemvConfig>()?,
    };
    let shared = matches!(config, GemvConfig::Split { lanes, plane: false, .. } if lanes > 1);
    if shared && !ggml_kernels::shared_memory_ok(client) {
        return Err(format!(
            "variant '{name}' needs shared memory, which this compiler lacks"
        ));
    }
    Ok(config)
}

/// What every measurement of a run shares.
struct Bench {
    device: Device,
    client: Client,
    /// Largest buffer the device takes, in bytes.
    max_buffer: u64,
    /// The GEMV variant the library selects for the device.
    config: GemvConfig,
    budget: Budget,
    /// Also time the GEMV through Burn ([`GgmlTensor::matmul_t`]).
    burn_path: bool,
}

impl Bench {
    /// The dense path on `shape`: the weight, and seconds per call for each of `batches` and
    /// for [`PREFILL_ROWS`] when `prefill`.
    fn dense(
        &self,
        shape: [usize; 2],
        batches: &[usize],
        prefill: bool,
    ) -> Result<(Weight, Vec<Timing>, Option<Timing>), String> {
        let [rows, cols] = shape;
        let values = rand_f32(rows * cols, 99);
        let dense = DenseWeight::from_values(
            values,
            shape,
            &self.device,
            self.max_buffer,
            FloatDType::F32,
        )
        .map_err(|e| e.to_string())?;
        let dense = Weight::Dense(dense);
        let matmul = |x| dense.matmul_t(x);
        let times = batches
            .iter()
            .map(|&m| time_burn(&self.device, m, cols, self.budget, matmul))
            .collect::<Result<Vec<_>, _>>()?;
        let prefill = match prefill {
            true => Some(time_burn(
                &self.device,
                PREFILL_ROWS,
                cols,
                self.budget,
                matmul,
            )?),
            false => None,
        };
        Ok((dense, times, prefill))
    }

    /// The packed measurements of `ty` on `shape`: one GEMV row per batch, and the prefill row
    /// when `dense_prefill` (the dense time to compare with) is given; each is printed, then
    /// handed to `emit` as JSON with `true` for the prefill row. `dense` has the shape's dense
    /// times per batch; with `alternate` the kernel at one activation row is timed in rounds
    /// alternating with the `dense_weight` GEMV ([`measure_alternating`]), and that row
    /// compares with the dense time measured there.
    #[allow(clippy::too_many_arguments)]
    fn packed(
        &self,
        ty: GgmlType,
        shape: [usize; 2],
        batches: &[usize],
        (dense_weight, dense): (&Weight, &[Timing]),
        alternate: bool,
        dense_prefill: Option<Timing>,
        emit: &mut dyn FnMut(Value, bool) -> Result<(), String>,
    ) -> Result<(), String> {
        let [rows, cols] = shape;
        let name = format!("{rows}x{cols}");
        let bytes = weight_bytes(ty, shape)?;
        let n_bytes = bytes.len();
        let raw = RawWeight::upload(&self.client, ty, &bytes, shape, self.max_buffer)?;
        let read = read_bandwidth(&self.client, &raw, n_bytes, self.budget)?;
        let tensor =
            GgmlTensor::from_bytes(&bytes, ty, shape, &self.device).map_err(|e| e.to_string())?;
        drop(bytes);
        for (&m, &d) in batches.iter().zip(dense) {
            let alternated = alternate && m == 1;
            let (k, d) = if alternated {
                measure_alternating(
                    self.budget,
                    (
                        gemv_call(&self.client, ty, &raw, [cols, m], self.config),
                        || sync_client(&self.client),
                    ),
                    (
                        burn_call(&self.device, m, cols, |x| dense_weight.matmul_t(x)),
                        || sync_device(&self.device),
                    ),
                )?
            } else {
                let k = time_gemv(&self.client, ty, &raw, [cols, m], self.config, self.budget)?;
                (k, d)
            };
            let b = match self.burn_path {
                true => Some(time_burn(&self.device, m, cols, self.budget, |x| {
                    tensor.matmul_t(x)
                })?),
                false => None,
            };
            let packed = b.unwrap_or(k).seconds;
            let gbps = n_bytes as f64 / k.seconds / 1e9;
            let ratio = gbps / read.gbps;
            println!(
                "{:<8} {name:>12} {m:>2} {:>10.3} {gbps:>8.2} {:>9.2} {ratio:>6.2} {:>10} {:>10.3} {:>8.2}",
                ty.to_string(),
                k.seconds * 1e3,
                read.gbps,
                b.map_or("-".to_string(), |b| format!("{:.3}", b.seconds * 1e3)),
                d.seconds * 1e3,
                packed / d.seconds
            );
            emit(
                json!({
                "type": ty.to_string(),
                "rows": rows,
                "cols": cols,
                "batch": m,
                "variant": self.config.name(),
                "weight_bytes": n_bytes,
                "parts": raw.parts.len(),
                "seconds": k.seconds,
                "iterations": k.iterations,
                "gbps": gbps,
                "read_gbps": read.gbps,
                "read_seconds": read.timing.seconds,
                "read_vector_size": read.vector_size,
                "ratio_to_read": ratio,
                "burn_seconds": b.map(|b| b.seconds),
                "dense_seconds": d.seconds,
                "dense_alternated": alternated,
                "dense_gbps": (rows * cols * 4) as f64 / d.seconds / 1e9,
                "packed_over_dense": packed / d.seconds,
                "packed_over_dense_from": if b.is_some() { "burn" } else { "kernel" },
                }),
                false,
            )?;
        }
        let Some(dp) = dense_prefill else {
            return Ok(());
        };
        // Each path of the product ([`MatmulPath`]) in turn, then the library's choice.
        let client = burn_gguf::cube_client(&self.device).ok_or("not a CubeCL device")?;
        let mut path_seconds = Vec::new();
        let run_path = MatmulPath::overridden();
        for path in [MatmulPath::Tile, MatmulPath::Chunked] {
            MatmulPath::set_override(Some(path));
            let runs = MatmulPath::for_client(&client, false) == path;
            let t = runs
                .then(|| {
                    time_burn(&self.device, PREFILL_ROWS, cols, self.budget, |x| {
                        tensor.matmul_t(x)
                    })
                })
                .transpose();
            MatmulPath::set_override(run_path);
            path_seconds.push(t?.map(|t| t.seconds));
        }
        let chosen = MatmulPath::for_client(&client, false);
        let p = time_burn(&self.device, PREFILL_ROWS, cols, self.budget, |x| {
            tensor.matmul_t(x)
        })?;
        let flop = 2.0 * (PREFILL_ROWS * rows * cols) as f64;
        let ms = |s: Option<f64>| s.map_or("-".into(), |s| format!("{:.1} ms", s * 1e3));
        println!(
            "{:<8} {name:>12} {PREFILL_ROWS:>3} prefill: packed {:.1} ms ({:.1} GFLOP/s, {chosen:?}; tile {}, chunked {}), dense {:.1} ms ({:.1} GFLOP/s), packed/dense {:.2}",
            ty.to_string(),
            p.seconds * 1e3,
            flop / p.seconds / 1e9,
            ms(path_seconds[0]),
            ms(path_seconds[1]),
            dp.seconds * 1e3,
            flop / dp.seconds / 1e9,
            p.seconds / dp.seconds
        );
        emit(
            json!({
            "type": ty.to_string(),
            "rows": rows,
            "cols": cols,
            "batch": PREFILL_ROWS,
            "seconds": p.seconds,
            "iterations": p.iterations,
            "gflops": flop / p.seconds / 1e9,
            "path": format!("{chosen:?}"),
            "tile_seconds": path_seconds[0],
            "chunked_seconds": path_seconds[1],
            "dense_seconds": dp.seconds,
            "dense_gflops": flop / dp.seconds / 1e9,
            "packed_over_dense": p.seconds / dp.seconds,
            }),
            true,
        )
    }
}

/// Runs the benchmark and prints the table; writes the JSON file when asked.
///
/// # Errors
/// A device that is not a CubeCL one, a failed launch or read-back, an unwritable JSON file.
pub fn run(opts: &Options) -> Result<(), String> {
    let t_start = Instant::now();
    let path = match opts.matmul_path.as_deref() {
        Some("tile") => Some(MatmulPath::Tile),
        Some(_) => Some(MatmulPath::Chunked),
        None => None,
    };
    MatmulPath::set_override(path);
    let started = utc_now();
    let budget = Budget {
        min_s: opts
            .min_time
            .unwrap_or(if opts.quick { 0.05 } else { 0.25 }),
        min_iters: if opts.quick { 1 } else { 3 },
    };
    if !(budget.min_s.is_finite() && budget.min_s >= 0.0) {
        return Err(format!("--min-time {} is not a duration", budget.min_s));
    }
    if let Some(t) = opts.types.iter().find(|t| !ggml_kernels::supports(**t)) {
        return Err(format!("no kernel for {t}"));
    }
    if let Some(choice) = &opts.device {
        pin_default_device(choice)?;
    }
    let caches = cache_state();
    let (adapters, backend) = adapters();
    let device = burn_gguf::default_device();
    let client =
        burn_gguf::cube_client(&device).ok_or("the default device is not a CubeCL device")?;
    let max_buffer = burn_gguf::max_buffer_bytes(&device).unwrap_or(u64::MAX);
    let config = match &opts.variant {
        Some(name) => named_variant(&client, name)?,
        None => GemvConfig::for_client(&client),
    };
    let props = client.properties();
    let device_json = json!({
        "name": props.identity.name,
        "runtime": client.name(),
        "backend": backend,
        "fingerprint": props.identity.fingerprint,
        "plane_size_min": props.hardware.plane_size_min,
        "plane_size_max": props.hardware.plane_size_max,
        "max_buffer_bytes": max_buffer,
        "gemv_variant": config.name(),
        "adapters": adapters,
    });
    println!(
        "device: {} ({}, {}), buffers up to {} MiB, GEMV variant {}",
        props.identity.name,
        client.name(),
        backend.as_deref().unwrap_or("no adapter found"),
        max_buffer >> 20,
        config.name()
    );
    for a in adapters.as_array().into_iter().flatten() {
        println!("  adapter: {a}");
    }
    print_caches(&caches);
    println!(
        "timing: one warm-up call, then {ROUNDS} rounds of repeats for at least {} s and {} calls; \
         the least round mean per call\n",
        budget.min_s, budget.min_iters
    );

    // The measurements that run alone: one JSON document each, with the run's device.
    let single = |tool: &str, figures: Value| -> Result<(), String> {
        let Some(path) = &opts.json else {
            return Ok(());
        };
        let mut doc = json!({
            "tool": format!("cargo xtask bench {tool}"),
            "date": started,
            "written": utc_now(),
            "device": device_json,
            "total_seconds": t_start.elapsed().as_secs_f64(),
        });
        if let (Some(doc), Value::Object(figures)) = (doc.as_object_mut(), figures) {
            doc.extend(figures);
        }
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
    };
    if opts.serve {
        let path = e2e::model_path(opts).ok_or("no model: --model PATH")?;
        let structured = serve::structured(&path, opts.serve_steps.max(4))?;
        let prefix = serve::prefix_cache(
            &path,
            opts.serve_prompt_tokens.max(1),
            opts.serve_requests.max(2),
        )?;
        return single(
            "--serve",
            json!({"structured": structured, "prefix_cache": prefix}),
        );
    }
    if opts.depth {
        let path = e2e::model_path(opts).ok_or("no model: --model PATH")?;
        let steps = if opts.quick { 16 } else { 32 };
        let v = depth::run(&path, steps, budget)?;
        return single("--depth", json!({ "depth": v }));
    }
    if opts.spec {
        let path = e2e::model_path(opts).ok_or("no model: --model PATH")?;
        let v = spec::run(&path, opts.spec_steps.max(2))?;
        return single("--spec", json!({ "speculative": v }));
    }
    if opts.finetune {
        let v = finetune::run(e2e::model_path(opts), opts.finetune_steps.max(2))?;
        return single("--finetune", json!({ "finetune": v }));
    }
    let end_to_end = if opts.no_e2e || opts.decode_only {
        println!("end to end: skipped\n");
        json!({"skipped": "--no-e2e"})
    } else {
        e2e::end_to_end(opts)
    };
    let decode_json = if opts.no_e2e && !opts.decode_only {
        json!({"skipped": "--no-e2e"})
    } else {
        let steps = if opts.quick { 16 } else { 32 };
        let tiny = opts
            .tiny
            .clone()
            .unwrap_or_else(|| PathBuf::from(decode::TINY));
        // The tiny model as llama-bench's tg64 runs it (64 tokens from an empty cache), in
        // rounds: one round is a fraction of a second, too short alone on a shared machine.
        let mut models = vec![decode::DecodeModel {
            label: "tiny",
            path: tiny,
            steps: 64,
            rounds: if opts.quick { 3 } else { 9 },
            streams: 64,
            batch_steps: if opts.quick { 16 } else { 32 },
        }];
        if let Some(p) = e2e::model_path(opts) {
            models.insert(
                0,
                decode::DecodeModel {
                    label: "model",
                    path: p,
                    steps,
                    rounds: 1,
                    streams: 8,
                    batch_steps: if opts.quick { 8 } else { 16 },
                },
            );
        }
        decode::run(&client, &models, opts.llama_bench.as_deref())
    };

    let selected: Vec<GgmlType> = GgmlType::all()
        .iter()
        .copied()
        .filter(|t| ggml_kernels::supports(*t))
        .filter(|t| opts.types.is_empty() || opts.types.contains(t))
        .collect();
    let explicit = !opts.types.is_empty();
    let prefill_types: Vec<GgmlType> = if explicit {
        selected.clone()
    } else if opts.quick {
        vec![GgmlType::Q4_K]
    } else {
        KEY_TYPES.to_vec()
    };
    let save = |gemv: &[Value], prefill: &[Value], complete: bool| -> Result<(), String> {
        let Some(path) = &opts.json else {
            return Ok(());
        };
        let doc = json!({
            "tool": "cargo xtask bench",
            "date": started,
            "written": utc_now(),
            "complete": complete,
            "quick": opts.quick,
            "min_seconds": budget.min_s,
            "min_iterations": budget.min_iters,
            "device": device_json,
            "caches": caches,
            "gemv": gemv,
            "prefill": prefill,
            "end_to_end": end_to_end,
            "decode": decode_json,
            "total_seconds": t_start.elapsed().as_secs_f64(),
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        // Through a temporary file, so a run stopped while writing leaves the previous version.
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text + "\n")
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    // Written after every measurement too, so a run cut short leaves what it measured.
    save(&[], &[], false)?;
    if opts.decode_only {
        save(&[], &[], true)?;
        return Ok(());
    }

    let bench = Bench {
        device,
        client,
        max_buffer,
        config,
        budget,
        burn_path: !opts.quick,
    };
    let mut gemv_rows: Vec<Value> = Vec::new();
    let mut prefill_rows: Vec<Value> = Vec::new();
    println!(
        "{:<8} {:>12} {:>2} {:>10} {:>8} {:>9} {:>6} {:>10} {:>10} {:>8}",
        "type",
        "shape",
        "m",
        "kernel ms",
        "GB/s",
        "read GB/s",
        "ratio",
        "burn ms",
        "dense ms",
        "pk/dense"
    );
    for (si, &shape) in SHAPES.iter().enumerate() {
        let [rows, cols] = shape;
        // --quick: beyond the first shape only the key types (or the chosen ones), at m = 1.
        let reduced = opts.quick && si > 0;
        let types: Vec<GgmlType> = selected
            .iter()
            .copied()
            .filter(|t| !reduced || explicit || KEY_TYPES.contains(t))
            .collect();
        let batches: &[usize] = if reduced { &[1] } else { &[1, MAX_GEMV_ROWS] };
        let (fitting, skipped): (Vec<GgmlType>, Vec<GgmlType>) =
            types.iter().partition(|t| fits(**t, cols));
        if !skipped.is_empty() {
            let names: Vec<String> = skipped.iter().map(|t| t.to_string()).collect();
            println!(
                "{rows}x{cols}: skipped {} (rows of {cols} are not whole blocks)",
                names.join(", ")
            );
        }
        if fitting.is_empty() {
            continue;
        }
        let prefill_here = !reduced && fitting.iter().any(|t| prefill_types.contains(t));

        let (dense_weight, dense, dense_prefill) = bench.dense(shape, batches, prefill_here)?;
        for ty in fitting {
            let prefill = dense_prefill.filter(|_| prefill_types.contains(&ty));
            // The first shape, which every type runs on, times the dense GEMV again for each
            // type at one activation row; the others keep the --quick run short.
            bench.packed(
                ty,
                shape,
                batches,
                (&dense_weight, &dense),
                si == 0,
                prefill,
                &mut |row, is_prefill| {
                    match is_prefill {
                        true => prefill_rows.push(row),
                        false => gemv_rows.push(row),
                    }
                    save(&gemv_rows, &prefill_rows, false)
                },
            )?;
        }
    }

    println!("\ntotal {:.1} s", t_start.elapsed().as_secs_f64());
    save(&gemv_rows, &prefill_rows, true)?;
    if let Some(path) = &opts.json {
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measure_meets_the_budget() {
        let budget = Budget {
            min_s: 0.01,
            min_iters: 3,
        };
        let mut calls = 0;
        let t = measure(
            budget,
            || {
                calls += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
                Ok(())
            },
            || Ok(()),
        )
        .unwrap();
        assert!(t.iterations >= 3 * ROUNDS);
        assert_eq!(calls, t.iterations + 1);
        assert!(t.seconds >= 0.001);
    }

    /// The two calls' rounds take turns after one warm-up call each, and each timing counts
    /// only its own calls.
    #[test]
    fn alternating_rounds_take_turns() {
        let budget = Budget {
            min_s: 0.0,
            min_iters: 2,
        };
        let log = std::cell::RefCell::new(String::new());
        let call = |c: char| {
            let log = &log;
            move || {
                log.borrow_mut().push(c);
                Ok(())
            }
        };
        let (ta, tb) =
            measure_alternating(budget, (call('a'), || Ok(())), (call('b'), || Ok(()))).unwrap();
        assert_eq!(*log.borrow(), format!("ab{}", "aabb".repeat(ROUNDS)));
        assert_eq!((ta.iterations, tb.iterations), (2 * ROUNDS, 2 * ROUNDS));
        assert!(ta.seconds.is_finite() && tb.seconds.is_finite());
    }

    #[test]
    fn shapes_and_types() {
        assert!(fits(GgmlType::Q8_0, 640));
        assert!(!fits(GgmlType::Q4_K, 640));
        assert!(KEY_TYPES.iter().all(|t| ggml_kernels::supports(*t)));
    }
}

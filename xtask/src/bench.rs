//! `cargo xtask bench`: how fast the packed path runs on the default wgpu device, next to the
//! device's own read bandwidth and the dense (dequantized f32) path, plus one end-to-end
//! generation on Gemma 3 270M. A harness, not a test: it prints a table and, with `--json`,
//! writes every figure to a file.
//!
//! What is measured (all times are wall-clock seconds per call, the mean over repeated calls
//! after one warm-up call that compiles the kernel and runs any autotuning):
//! - **GEMV** (`y = x W^T`, `x` of 1 or 8 activation rows) for each ggml type with a kernel and
//!   each shape `rows x cols`: the fused dequantize + GEMV kernel launched directly with the
//!   variant the library selects for this device ([`GemvConfig::for_client`], what the model
//!   runs), split by rows into buffers the device takes (128 MiB on lavapipe). `gbps` is weight
//!   bytes / seconds (10^9 bytes per second; activations and outputs are not counted).
//! - **read**: a plain read kernel ([`read_words`]) over the same weight buffers, as wide vectors
//!   of `u32` words, each unit writing one word (1/32 of the bytes read, not counted): the
//!   bandwidth this device reaches on these bytes, measured in the same run. `ratio_to_read` is
//!   GEMV GB/s over read GB/s (1.0: the GEMV reads its weights as fast as a plain copy would).
//! - **Burn path**: the same GEMV through [`GgmlTensor::matmul_t`] (Burn's dispatch, fusion and
//!   allocation included), and the **dense** path: Burn's f32 matmul of a dequantized weight of
//!   the same shape ([`DenseWeight`], split by rows like the loader's), what a model runs when the
//!   loader does not pack. The dense time does not depend on the source type, so it is measured
//!   once per shape and batch (on random f32 values). `packed_over_dense` is Burn-path packed
//!   time over dense time (below 1: packed is faster); `--quick` skips the Burn path and divides
//!   the kernel's time instead (`packed_over_dense_from` says which).
//! - **prefill**: 512 activation rows through [`GgmlTensor::matmul_t`] (which dequantizes bounded
//!   chunks of rows and uses Burn's matmul) against the dense matmul; GFLOP/s = 2 * m * rows * cols
//!   / seconds / 10^9.
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
//! on the others, prefill on the first shape, two timed calls after the warm-up where a call
//! takes over 0.025 s, and a short generation.
//!
//! Weights are random valid blocks (a small set repeated: the values do not matter for timing,
//! only that they decode to finite numbers).
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use burn::tensor::{Device, FloatDType, Tensor, TensorData};
use burn_gguf::{DenseWeight, GgmlTensor, Weight};
use cubecl::client::Client;
use cubecl::prelude::*;
use ggml_kernels::check::rand_f32;
use ggml_kernels::{GemvConfig, MAX_GEMV_ROWS, cube_count_for, words_for_bytes};
use gguf::GgmlType;
use serde_json::{Value, json};

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

/// The llama.cpp figure for the same model on this machine class (CPU, 2 threads).
const LLAMA_BENCH_MD: &str = "shared/fixtures/gemma/gemma3_270m_llama_bench.md";

/// Prompt of a full run's end-to-end measurement (about 60 tokens).
const LONG_PROMPT: &str = "The old lighthouse keeper climbed the spiral stairs every evening, \
    counting the one hundred and twelve steps as his father had taught him. At the top he wiped \
    the salt from the great lens, trimmed the wick, and watched the fishing boats come home \
    across the darkening bay. One night, a ship he had never seen before";
/// Prompt of a quick run's end-to-end measurement.
const SHORT_PROMPT: &str = "Once upon a time";

/// Options of one run (the command line of `cargo xtask bench`).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Write the results as JSON to this file.
    pub json: Option<PathBuf>,
    /// Reduced set and shorter timings (under 5 minutes on lavapipe).
    pub quick: bool,
    /// Only these types (all with a kernel when empty).
    pub types: Vec<GgmlType>,
    /// Skip the end-to-end generation.
    pub no_e2e: bool,
    /// Model for the end-to-end generation (Gemma 3 270M from the model cache when absent).
    pub model: Option<PathBuf>,
    /// Least time each measurement repeats for, in seconds (0.25, or 0.05 with `--quick`).
    pub min_time: Option<f64>,
}

/// Timing settings of a run.
#[derive(Clone, Copy, Debug)]
struct Budget {
    /// Least seconds a measurement repeats for (after the warm-up call).
    min_s: f64,
    /// Least calls a measurement makes (after the warm-up call).
    min_iters: usize,
}

/// Mean seconds per call of one measurement.
#[derive(Clone, Copy, Debug)]
struct Timing {
    seconds: f64,
    iterations: usize,
}

/// Calls `call` once (warm-up: compilation, autotuning), waits with `sync`, then repeats it in
/// batches, each followed by `sync`, until `budget` is spent; returns the mean seconds per call
/// over the repeats.
fn measure(
    budget: Budget,
    mut call: impl FnMut() -> Result<(), String>,
    sync: impl Fn() -> Result<(), String>,
) -> Result<Timing, String> {
    call()?;
    sync()?;
    let start = Instant::now();
    let (mut n, mut batch) = (0usize, 1usize);
    loop {
        for _ in 0..batch {
            call()?;
        }
        sync()?;
        n += batch;
        let elapsed = start.elapsed().as_secs_f64();
        if elapsed >= budget.min_s && n >= budget.min_iters {
            return Ok(Timing {
                seconds: elapsed / n as f64,
                iterations: n,
            });
        }
        // Aim at the budget from the mean so far; grow at most 4x per batch, and sync at least
        // every 1024 calls so the queue stays short.
        let per_call = (elapsed / n as f64).max(1e-9);
        let total = ((budget.min_s * 1.02 / per_call).ceil() as usize).max(budget.min_iters);
        batch = total.saturating_sub(n).clamp(1, (4 * n).min(1024));
    }
}

/// Each unit XORs `READ_UNROLL` vectors of `w` (cube `c` reads the `CUBE_DIM * unroll` vectors
/// from `c * CUBE_DIM * unroll`, unit-interleaved so neighbouring units read neighbouring
/// vectors) and writes the XOR of the lanes to `out[unit]`, so no load can be optimised away.
#[cube(launch_unchecked)]
fn read_words<N: Size>(w: &[Vector<u32, N>], out: &mut [u32], len: u32, #[comptime] unroll: u32) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let base = cube * CUBE_DIM_X * unroll + UNIT_POS_X;
    let mut acc = Vector::<u32, N>::new(0u32);
    #[unroll]
    for k in 0..unroll {
        let i = base + k * CUBE_DIM_X;
        if i < len {
            acc ^= w[i as usize];
        }
    }
    let mut s = 0u32;
    #[unroll]
    for j in 0..N::value() {
        s ^= acc.extract(j);
    }
    out[(cube * CUBE_DIM_X + UNIT_POS_X) as usize] = s;
}

/// One row range of a weight in its own device buffer.
struct RawPart {
    handle: cubecl::server::Handle,
    /// `u32` words in the buffer.
    words: usize,
    rows: usize,
}

/// A weight uploaded as raw words, split by rows like [`GgmlTensor`] does.
struct RawWeight {
    parts: Vec<RawPart>,
    grid: (cubecl::server::Handle, usize),
}

impl RawWeight {
    fn upload(
        client: &Client,
        ty: GgmlType,
        bytes: &[u8],
        [rows, cols]: [usize; 2],
        max_buffer: u64,
    ) -> Result<Self, String> {
        let per_part =
            GgmlTensor::rows_per_buffer(ty, [rows, cols], max_buffer).map_err(|e| e.to_string())?;
        let row_bytes = bytes.len() / rows;
        let parts = (0..rows)
            .step_by(per_part)
            .map(|start| {
                let n = per_part.min(rows - start);
                let words = words_for_bytes(&bytes[start * row_bytes..(start + n) * row_bytes]);
                RawPart {
                    handle: client.create_from_slice(u32::as_bytes(&words)),
                    words: words.len(),
                    rows: n,
                }
            })
            .collect();
        let grid = ggml_kernels::grid_words(ty).ok_or(format!("no kernel for {ty}"))?;
        Ok(Self {
            parts,
            grid: (client.create_from_slice(u32::as_bytes(&grid)), grid.len()),
        })
    }
}

/// What the read kernel reached on a weight's buffers.
struct ReadResult {
    gbps: f64,
    vector_size: usize,
    timing: Timing,
}

/// The read bandwidth over `w`'s buffers (`bytes` bytes of weights), the best of the vector
/// widths the device is fast at and single words.
fn read_bandwidth(
    client: &Client,
    w: &RawWeight,
    bytes: usize,
    budget: Budget,
) -> Result<ReadResult, String> {
    let mut sizes: Vec<usize> = client.io_optimized_vector_sizes(4).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    sizes.retain(|s| [1, 4].contains(s));
    if sizes.is_empty() {
        sizes.push(1);
    }
    let mut best: Option<ReadResult> = None;
    for vs in sizes {
        // Per part: (weights, vectors, out buffer, its length, cube count).
        let launches: Vec<_> = w
            .parts
            .iter()
            .map(|p| {
                let vectors = p.words / vs;
                let cubes = (vectors as u32).div_ceil(READ_CUBE_DIM * READ_UNROLL);
                let count = cube_count_for(cubes);
                let launched = match count {
                    CubeCount::Static(x, y, z) => (x * y * z) as usize,
                    _ => cubes as usize,
                };
                let out_len = launched * READ_CUBE_DIM as usize;
                let out = client.empty(out_len * size_of::<u32>());
                (p.handle.clone(), vectors, out, out_len, count)
            })
            .collect();
        let timing = measure(
            budget,
            || {
                for (h, vectors, out, out_len, count) in &launches {
                    // SAFETY: every index the kernel reads is below `vectors` (checked in the
                    // kernel), which fits the buffer (`words / vs` whole vectors); it writes one
                    // word per launched unit, `out_len` of them.
                    unsafe {
                        read_words::launch_unchecked(
                            client,
                            count.clone(),
                            CubeDim::new_1d(READ_CUBE_DIM),
                            vs,
                            BufferArg::from_raw_parts(h.clone(), *vectors),
                            BufferArg::from_raw_parts(out.clone(), *out_len),
                            *vectors as u32,
                            READ_UNROLL,
                        )
                    };
                }
                Ok(())
            },
            || sync_client(client),
        )?;
        let gbps = bytes as f64 / timing.seconds / 1e9;
        if best.as_ref().is_none_or(|b| gbps > b.gbps) {
            best = Some(ReadResult {
                gbps,
                vector_size: vs,
                timing,
            });
        }
    }
    best.ok_or_else(|| "no read measurement".to_string())
}

fn sync_client(client: &Client) -> Result<(), String> {
    cubecl::future::block_on(client.sync()).map_err(|e| format!("device sync: {e:?}"))
}

fn sync_device(device: &Device) -> Result<(), String> {
    device.sync().map_err(|e| format!("device sync: {e:?}"))
}

/// Times the fused GEMV kernel on `w` for `m` activation rows with `config`.
#[allow(clippy::too_many_arguments)]
fn time_gemv(
    client: &Client,
    ty: GgmlType,
    w: &RawWeight,
    cols: usize,
    m: usize,
    config: GemvConfig,
    budget: Budget,
) -> Result<Timing, String> {
    let x = rand_f32(m * cols, m as u64);
    let xh = client.create_from_slice(f32::as_bytes(&x));
    let ys: Vec<_> = w
        .parts
        .iter()
        .map(|p| client.empty(m * p.rows * size_of::<f32>()))
        .collect();
    measure(
        budget,
        || {
            for (p, y) in w.parts.iter().zip(&ys) {
                // SAFETY: each length is that of the buffer it describes (launch_gemv checks them
                // against the shapes).
                let (wa, ga, xa, ya) = unsafe {
                    (
                        BufferArg::from_raw_parts(p.handle.clone(), p.words),
                        BufferArg::from_raw_parts(w.grid.0.clone(), w.grid.1),
                        BufferArg::from_raw_parts(xh.clone(), x.len()),
                        BufferArg::from_raw_parts(y.clone(), m * p.rows),
                    )
                };
                ggml_kernels::launch_gemv(client, ty, wa, ga, xa, ya, p.rows, cols, config)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        },
        || sync_client(client),
    )
}

/// Times `f(x)` through Burn for a random `x` of `[m, cols]`.
fn time_burn(
    device: &Device,
    m: usize,
    cols: usize,
    budget: Budget,
    f: impl Fn(Tensor<2>) -> Tensor<2>,
) -> Result<Timing, String> {
    let x = Tensor::<2>::from_data(
        TensorData::new(rand_f32(m * cols, 17 + m as u64), [m, cols]),
        device,
    );
    measure(
        budget,
        || {
            drop(f(x.clone()));
            Ok(())
        },
        || sync_device(device),
    )
}

/// Random valid blocks of `ty` for a `[rows, cols]` tensor: 8,192 elements' worth of blocks from
/// the kernel tests' generator, repeated.
fn weight_bytes(ty: GgmlType, [rows, cols]: [usize; 2]) -> Result<Vec<u8>, String> {
    let pattern = crate::kernel_test::input(ty, 1, 8192, ty.id() as u64 + 1)?;
    let total = ty
        .row_bytes(cols as u64)
        .map_err(|e| e.to_string())?
        .checked_mul(rows as u64)
        .ok_or("weight too large")? as usize;
    let mut out = Vec::with_capacity(total + pattern.len());
    while out.len() < total {
        out.extend_from_slice(&pattern);
    }
    out.truncate(total);
    Ok(out)
}

/// Whether the kernels take rows of `cols` elements of `ty`.
fn fits(ty: GgmlType, cols: usize) -> bool {
    ggml_kernels::kernel_block_elems(ty).is_some_and(|be| cols.is_multiple_of(be))
        && cols.is_multiple_of(ty.block_size())
}

fn variant_name(c: GemvConfig) -> String {
    format!(
        "lanes={} rows/cube={} plane={}",
        c.lanes, c.rows_per_cube, c.plane
    )
}

/// Runs the benchmark and prints the table; writes the JSON file when asked.
///
/// # Errors
/// A device that is not a CubeCL one, a failed launch or read-back, an unwritable JSON file.
pub fn run(opts: &Options) -> Result<(), String> {
    let t_start = Instant::now();
    let budget = Budget {
        min_s: opts
            .min_time
            .unwrap_or(if opts.quick { 0.05 } else { 0.25 }),
        min_iters: if opts.quick { 2 } else { 3 },
    };
    if !(budget.min_s.is_finite() && budget.min_s >= 0.0) {
        return Err(format!("--min-time {} is not a duration", budget.min_s));
    }
    let caches = cache_state();
    let (adapters, backend) = adapters();
    let device = burn_gguf::default_device();
    let client =
        burn_gguf::cube_client(&device).ok_or("the default device is not a CubeCL device")?;
    let max_buffer = burn_gguf::max_buffer_bytes(&device).unwrap_or(u64::MAX);
    let config = GemvConfig::for_client(&client);
    let props = client.properties();
    let device_json = json!({
        "name": props.identity.name,
        "runtime": client.name(),
        "backend": backend,
        "fingerprint": props.identity.fingerprint,
        "plane_size_min": props.hardware.plane_size_min,
        "plane_size_max": props.hardware.plane_size_max,
        "max_buffer_bytes": max_buffer,
        "gemv_variant": variant_name(config),
        "adapters": adapters,
    });
    println!(
        "device: {} ({}, {}), buffers up to {} MiB, GEMV variant {}",
        props.identity.name,
        client.name(),
        backend.as_deref().unwrap_or("no adapter found"),
        max_buffer >> 20,
        variant_name(config)
    );
    for a in adapters.as_array().into_iter().flatten() {
        println!("  adapter: {a}");
    }
    print_caches(&caches);
    println!(
        "timing: one warm-up call, then repeats for at least {} s and {} calls; mean per call\n",
        budget.min_s, budget.min_iters
    );

    let end_to_end = if opts.no_e2e {
        println!("end to end: skipped (--no-e2e)\n");
        json!({"skipped": "--no-e2e"})
    } else {
        end_to_end(opts)
    };

    let selected: Vec<GgmlType> = GgmlType::all()
        .iter()
        .copied()
        .filter(|t| ggml_kernels::supports(*t))
        .filter(|t| opts.types.is_empty() || opts.types.contains(t))
        .collect();
    if let Some(t) = opts.types.iter().find(|t| !ggml_kernels::supports(**t)) {
        return Err(format!("no kernel for {t}"));
    }
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
            "date": utc_now(),
            "complete": complete,
            "quick": opts.quick,
            "min_seconds": budget.min_s,
            "min_iterations": budget.min_iters,
            "device": device_json,
            "caches": caches,
            "gemv": gemv,
            "prefill": prefill,
            "end_to_end": end_to_end,
            "total_seconds": t_start.elapsed().as_secs_f64(),
        });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
    };
    // Written after every measurement too, so a run cut short leaves what it measured.
    save(&[], &[], false)?;

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

        // The dense path for this shape (its time does not depend on the source type).
        let dense = DenseWeight::from_values(
            rand_f32(rows * cols, 99),
            shape,
            &device,
            max_buffer,
            FloatDType::F32,
        )
        .map_err(|e| e.to_string())?;
        let dense = Weight::Dense(dense);
        let mut dense_t = Vec::new();
        for &m in batches {
            dense_t.push(time_burn(&device, m, cols, budget, |x| dense.matmul_t(x))?);
        }
        let dense_prefill = if prefill_here {
            Some(time_burn(&device, PREFILL_ROWS, cols, budget, |x| {
                dense.matmul_t(x)
            })?)
        } else {
            None
        };
        drop(dense);

        for ty in fitting {
            let bytes = weight_bytes(ty, shape)?;
            let n_bytes = bytes.len();
            let raw = RawWeight::upload(&client, ty, &bytes, shape, max_buffer)?;
            let read = read_bandwidth(&client, &raw, n_bytes, budget)?;
            let tensor =
                GgmlTensor::from_bytes(&bytes, ty, shape, &device).map_err(|e| e.to_string())?;
            drop(bytes);
            for (mi, &m) in batches.iter().enumerate() {
                let k = time_gemv(&client, ty, &raw, cols, m, config, budget)?;
                // The Burn path only in a full run (on lavapipe it is the kernel's time).
                let b = if opts.quick {
                    None
                } else {
                    Some(time_burn(&device, m, cols, budget, |x| tensor.matmul_t(x))?)
                };
                let packed = b.unwrap_or(k).seconds;
                let d = dense_t[mi];
                let gbps = n_bytes as f64 / k.seconds / 1e9;
                let ratio = gbps / read.gbps;
                println!(
                    "{:<8} {:>12} {m:>2} {:>10.3} {gbps:>8.2} {:>9.2} {ratio:>6.2} {:>10} {:>10.3} {:>8.2}",
                    ty.to_string(),
                    format!("{rows}x{cols}"),
                    k.seconds * 1e3,
                    read.gbps,
                    b.map_or("-".to_string(), |b| format!("{:.3}", b.seconds * 1e3)),
                    d.seconds * 1e3,
                    packed / d.seconds
                );
                gemv_rows.push(json!({
                    "type": ty.to_string(),
                    "rows": rows,
                    "cols": cols,
                    "batch": m,
                    "variant": variant_name(config),
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
                    "dense_gbps": (rows * cols * 4) as f64 / d.seconds / 1e9,
                    "packed_over_dense": packed / d.seconds,
                    "packed_over_dense_from": if b.is_some() { "burn" } else { "kernel" },
                }));
                save(&gemv_rows, &prefill_rows, false)?;
            }
            if let (true, Some(dp)) = (prefill_types.contains(&ty), dense_prefill) {
                let p = time_burn(&device, PREFILL_ROWS, cols, budget, |x| tensor.matmul_t(x))?;
                let flop = 2.0 * (PREFILL_ROWS * rows * cols) as f64;
                println!(
                    "{:<8} {:>12} {PREFILL_ROWS:>3} prefill: packed {:.1} ms ({:.1} GFLOP/s), dense {:.1} ms ({:.1} GFLOP/s), packed/dense {:.2}",
                    ty.to_string(),
                    format!("{rows}x{cols}"),
                    p.seconds * 1e3,
                    flop / p.seconds / 1e9,
                    dp.seconds * 1e3,
                    flop / dp.seconds / 1e9,
                    p.seconds / dp.seconds
                );
                prefill_rows.push(json!({
                    "type": ty.to_string(),
                    "rows": rows,
                    "cols": cols,
                    "batch": PREFILL_ROWS,
                    "seconds": p.seconds,
                    "iterations": p.iterations,
                    "gflops": flop / p.seconds / 1e9,
                    "dense_seconds": dp.seconds,
                    "dense_gflops": flop / dp.seconds / 1e9,
                    "packed_over_dense": p.seconds / dp.seconds,
                }));
                save(&gemv_rows, &prefill_rows, false)?;
            }
            drop(tensor);
            drop(raw);
        }
    }

    println!("\ntotal {:.1} s", t_start.elapsed().as_secs_f64());
    save(&gemv_rows, &prefill_rows, true)?;
    if let Some(path) = &opts.json {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The end-to-end measurement as JSON; `{"skipped": reason}` when there is no model or it fails
/// (the kernel benchmarks still run).
fn end_to_end(opts: &Options) -> Value {
    let path = match &opts.model {
        Some(p) => p.clone(),
        None => {
            let Some(known) = burn_gguf_cli::fetch::known_model("gemma3-270m") else {
                return json!({"skipped": "no known gemma3-270m model"});
            };
            burn_gguf_cli::fetch::cache_dir()
                .join("models")
                .join(known.file_name)
        }
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

fn generate_timed(path: &Path, quick: bool) -> Result<Value, String> {
    use burn_gguf_models::{Sampler, SamplerConfig, generate};
    let (prompt, cold_n, warm_n) = if quick {
        (SHORT_PROMPT, 4, 16)
    } else {
        (LONG_PROMPT, 8, 64)
    };
    println!("end to end: {}", path.display());
    let loaded = burn_gguf_cli::run::load(path, false, false)?;
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

/// The wgpu adapters this machine has, on every backend, as text (name, backend, type,
/// driver), and the backend CubeCL's automatic choice lands on: the first of Vulkan, DX12 and
/// OpenGL with a GPU adapter, else the first with any (`cubecl-wgpu`'s `AutoGraphicsApi` order;
/// it reads no `WGPU_BACKEND`).
fn adapters() -> (Value, Option<String>) {
    use cubecl::wgpu::wgpu;
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::all(),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let infos: Vec<wgpu::AdapterInfo> =
        cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
            .iter()
            .map(|a| a.get_info())
            .collect();
    let chain = [
        wgpu::Backend::Vulkan,
        wgpu::Backend::Dx12,
        wgpu::Backend::Gl,
    ];
    let on = |b: wgpu::Backend| infos.iter().filter(move |i| i.backend == b);
    let gpu = chain
        .iter()
        .find(|b| on(**b).any(|i| i.device_type != wgpu::DeviceType::Cpu));
    let backend = gpu
        .or_else(|| chain.iter().find(|b| on(**b).next().is_some()))
        .map(|b| format!("{b:?}"));
    let list = infos
        .iter()
        .map(|i| {
            Value::String(format!(
                "{} ({:?}, {:?}, driver {} {})",
                i.name, i.backend, i.device_type, i.driver, i.driver_info
            ))
        })
        .collect();
    (Value::Array(list), backend)
}

/// Whether CubeCL's environment database and the drivers' shader caches existed (and how big they
/// were) when the run started.
fn cache_state() -> Value {
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    // Loads cubecl.toml / CUBECL_* so the environment path is the one the runtime will use.
    let _ = CubeClRuntimeConfig::get();
    let cubecl_db = cubecl::environment::path();
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let cache_home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| home.map(|h| h.join(".cache")));
    let mut mesa: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("MESA_SHADER_CACHE_DIR") {
        mesa.push(PathBuf::from(dir));
    }
    if let Some(c) = &cache_home {
        match std::fs::read_dir(c) {
            Ok(entries) => {
                let mut found: Vec<PathBuf> = entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("mesa_shader_cache"))
                    })
                    .collect();
                found.sort();
                mesa.extend(found);
            }
            Err(_) => mesa.push(c.join("mesa_shader_cache")),
        }
        if mesa.is_empty() {
            mesa.push(c.join("mesa_shader_cache"));
        }
    }
    let nvidia = std::env::var_os("__GL_SHADER_DISK_CACHE_PATH")
        .map(PathBuf::from)
        .or_else(|| {
            cache_home
                .as_ref()
                .map(|c| c.join("nvidia").join("GLCache"))
        });
    let entry = |p: &Path| {
        let (files, bytes) = dir_size(p);
        json!({
            "path": p.display().to_string(),
            "existed": p.exists(),
            "files": files,
            "bytes": bytes,
        })
    };
    json!({
        "cubecl": entry(&cubecl_db),
        "mesa": mesa.iter().map(|p| entry(p)).collect::<Vec<_>>(),
        "nvidia": nvidia.as_deref().map(entry),
    })
}

fn print_caches(caches: &Value) {
    let line = |what: &str, v: &Value| {
        let existed = v["existed"].as_bool().unwrap_or(false);
        println!(
            "cache at start: {what} {}: {}",
            v["path"].as_str().unwrap_or("?"),
            if existed {
                format!("present, {} files, {} bytes (warm)", v["files"], v["bytes"])
            } else {
                "absent (cold)".to_string()
            }
        );
    };
    line("cubecl environment", &caches["cubecl"]);
    for m in caches["mesa"].as_array().into_iter().flatten() {
        line("mesa shaders", m);
    }
    if !caches["nvidia"].is_null() {
        line("nvidia shaders", &caches["nvidia"]);
    }
}

/// Files and bytes under `p` (a file counts as one), following no links.
fn dir_size(p: &Path) -> (u64, u64) {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return (0, 0);
    };
    if meta.is_file() {
        return (1, meta.len());
    }
    if !meta.is_dir() {
        return (0, 0);
    }
    let mut total = (0, 0);
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        let (f, b) = dir_size(&e.path());
        total.0 += f;
        total.1 += b;
    }
    total
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
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
        assert!(t.iterations >= 3);
        assert_eq!(calls, t.iterations + 1);
        assert!(t.seconds >= 0.001);
    }

    #[test]
    fn utc_date_format() {
        let s = utc_now();
        assert_eq!(s.len(), 20);
        assert!(s.starts_with("20") && s.ends_with('Z'));
    }

    #[test]
    fn shapes_and_types() {
        assert!(fits(GgmlType::Q8_0, 640));
        assert!(!fits(GgmlType::Q4_K, 640));
        assert!(KEY_TYPES.iter().all(|t| ggml_kernels::supports(*t)));
    }
}

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
//! on the others, prefill on the first shape, rounds of at least 0.05 s and one call (so one
//! timed call per round where a call takes longer), and a short generation.
//!
//! Weights are random valid blocks (a small set repeated: the values do not matter for timing,
//! only that they decode to finite numbers).
mod batch;
pub(crate) mod decode;
mod e2e;
mod system;

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::{Device, FloatDType, Tensor, TensorData};
use burn_gguf::{DenseWeight, GgmlTensor, Weight};
use cubecl::client::Client;
use cubecl::prelude::*;
use ggml_kernels::check::rand_f32;
use ggml_kernels::{GemvConfig, MAX_GEMV_ROWS, cube_count_for, words_for_bytes};
use gguf::GgmlType;
use serde_json::{Value, json};
use system::{adapters, cache_state, print_caches, utc_now};

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

/// Timing settings of a run.
#[derive(Clone, Copy, Debug)]
struct Budget {
    /// Least seconds a measurement repeats for (after the warm-up call).
    min_s: f64,
    /// Least calls a measurement makes (after the warm-up call).
    min_iters: usize,
}

/// Seconds per call of one measurement: the least of [`ROUNDS`] round means.
#[derive(Clone, Copy, Debug)]
struct Timing {
    seconds: f64,
    /// Calls timed, over all rounds.
    iterations: usize,
}

impl Timing {
    /// No round yet.
    const NONE: Timing = Timing {
        seconds: f64::INFINITY,
        iterations: 0,
    };

    /// Takes in a round's mean seconds per call and its calls.
    fn add_round(&mut self, (seconds, calls): (f64, usize)) {
        self.seconds = self.seconds.min(seconds);
        self.iterations += calls;
    }
}

/// Rounds of a measurement. Each round repeats the call for the whole [`Budget`] and the least
/// round mean is reported: other jobs on a shared machine only ever slow a round down, so the
/// fastest round is the closest to what the device can do (the read kernel and the GEMV are
/// measured the same way).
const ROUNDS: usize = 3;

/// Calls `call` once (warm-up: compilation, autotuning), waits with `sync`, then, [`ROUNDS`]
/// times, repeats it in batches, each followed by `sync`, until `budget` is spent; returns the
/// least mean seconds per call of the rounds.
fn measure(
    budget: Budget,
    mut call: impl FnMut() -> Result<(), String>,
    sync: impl Fn() -> Result<(), String>,
) -> Result<Timing, String> {
    call()?;
    sync()?;
    let mut timing = Timing::NONE;
    for _ in 0..ROUNDS {
        timing.add_round(round(budget, &mut call, &sync)?);
    }
    Ok(timing)
}

/// [`measure`] for two calls, their rounds alternating (`a`, `b`, `a`, `b`, ...). The speed of
/// a shared machine drifts over a run (other tenants of the host; on this VM the dense 4096 x
/// 4096 f32 GEMV took 48-107 ms in different runs of the same binary), so two measurements
/// taken minutes apart can differ by that drift alone; alternating rounds lets both see the
/// same drift, and their ratio is what stays steady.
fn measure_alternating(
    budget: Budget,
    (mut a, sync_a): (
        impl FnMut() -> Result<(), String>,
        impl Fn() -> Result<(), String>,
    ),
    (mut b, sync_b): (
        impl FnMut() -> Result<(), String>,
        impl Fn() -> Result<(), String>,
    ),
) -> Result<(Timing, Timing), String> {
    a()?;
    sync_a()?;
    b()?;
    sync_b()?;
    let (mut ta, mut tb) = (Timing::NONE, Timing::NONE);
    for _ in 0..ROUNDS {
        ta.add_round(round(budget, &mut a, &sync_a)?);
        tb.add_round(round(budget, &mut b, &sync_b)?);
    }
    Ok((ta, tb))
}

/// One round: `call` repeated in batches, each followed by `sync`, until `budget` is spent;
/// the mean seconds per call and the calls made.
fn round(
    budget: Budget,
    call: &mut impl FnMut() -> Result<(), String>,
    sync: &impl Fn() -> Result<(), String>,
) -> Result<(f64, usize), String> {
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
            return Ok((elapsed / n as f64, n));
        }
        // Aim at the budget from the mean so far; grow at most 4x per batch, and sync at
        // least every 1024 calls so the queue stays short.
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
fn time_gemv(
    client: &Client,
    ty: GgmlType,
    w: &RawWeight,
    [cols, m]: [usize; 2],
    config: GemvConfig,
    budget: Budget,
) -> Result<Timing, String> {
    measure(budget, gemv_call(client, ty, w, [cols, m], config), || {
        sync_client(client)
    })
}

/// One launch of the fused GEMV kernel on `w` (each of its buffers) for a random `x` of
/// `[m, cols]`, as a call to time.
fn gemv_call<'a>(
    client: &'a Client,
    ty: GgmlType,
    w: &'a RawWeight,
    [cols, m]: [usize; 2],
    config: GemvConfig,
) -> impl FnMut() -> Result<(), String> + 'a {
    let x = rand_f32(m * cols, m as u64);
    let xh = client.create_from_slice(f32::as_bytes(&x));
    let ys: Vec<_> = w
        .parts
        .iter()
        .map(|p| client.empty(m * p.rows * size_of::<f32>()))
        .collect();
    move || {
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
    }
}

/// Times `f(x)` through Burn for a random `x` of `[m, cols]`.
fn time_burn(
    device: &Device,
    m: usize,
    cols: usize,
    budget: Budget,
    f: impl Fn(Tensor<2>) -> Tensor<2>,
) -> Result<Timing, String> {
    measure(budget, burn_call(device, m, cols, f), || {
        sync_device(device)
    })
}

/// `f(x)` through Burn for a random `x` of `[m, cols]`, as a call to time.
fn burn_call<'a>(
    device: &Device,
    m: usize,
    cols: usize,
    f: impl Fn(Tensor<2>) -> Tensor<2> + 'a,
) -> impl FnMut() -> Result<(), String> + 'a {
    let x = Tensor::<2>::from_data(
        TensorData::new(rand_f32(m * cols, 17 + m as u64), [m, cols]),
        device,
    );
    move || {
        drop(f(x.clone()));
        Ok(())
    }
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
        let p = time_burn(&self.device, PREFILL_ROWS, cols, self.budget, |x| {
            tensor.matmul_t(x)
        })?;
        let flop = 2.0 * (PREFILL_ROWS * rows * cols) as f64;
        println!(
            "{:<8} {name:>12} {PREFILL_ROWS:>3} prefill: packed {:.1} ms ({:.1} GFLOP/s), dense {:.1} ms ({:.1} GFLOP/s), packed/dense {:.2}",
            ty.to_string(),
            p.seconds * 1e3,
            flop / p.seconds / 1e9,
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

//! The timing harness (rounds, budgets, alternating measurements) and the calls it times: the
//! fused GEMV launched directly on raw weight buffers, the same product through Burn, and the
//! plain read kernel that gives the device's bandwidth on the same bytes.
use super::*;

/// Timing settings of a run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Budget {
    /// Least seconds a measurement repeats for (after the warm-up call).
    pub(super) min_s: f64,
    /// Least calls a measurement makes (after the warm-up call).
    pub(super) min_iters: usize,
}

/// Seconds per call of one measurement: the least of [`ROUNDS`] round means.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timing {
    pub(super) seconds: f64,
    /// Calls timed, over all rounds.
    pub(super) iterations: usize,
}

impl Timing {
    /// No round yet.
    pub(super) const NONE: Timing = Timing {
        seconds: f64::INFINITY,
        iterations: 0,
    };

    /// Takes in a round's mean seconds per call and its calls.
    pub(super) fn add_round(&mut self, (seconds, calls): (f64, usize)) {
        self.seconds = self.seconds.min(seconds);
        self.iterations += calls;
    }
}

/// Rounds of a measurement. Each round repeats the call for the whole [`Budget`] and the least
/// round mean is reported: other jobs on a shared machine only ever slow a round down, so the
/// fastest round is the closest to what the device can do (the read kernel and the GEMV are
/// measured the same way).
pub(super) const ROUNDS: usize = 3;

/// Calls `call` once (warm-up: compilation, autotuning), waits with `sync`, then, [`ROUNDS`]
/// times, repeats it in batches, each followed by `sync`, until `budget` is spent; returns the
/// least mean seconds per call of the rounds.
pub(super) fn measure(
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
pub(super) fn measure_alternating(
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
pub(super) fn round(
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
pub(super) fn read_words<N: Size>(
    w: &[Vector<u32, N>],
    out: &mut [u32],
    len: u32,
    #[comptime] unroll: u32,
) {
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
pub(super) struct RawPart {
    pub(super) handle: cubecl::server::Handle,
    /// `u32` words in the buffer.
    pub(super) words: usize,
    pub(super) rows: usize,
}

/// A weight uploaded as raw words, split by rows like [`GgmlTensor`] does.
pub(super) struct RawWeight {
    pub(super) parts: Vec<RawPart>,
    pub(super) grid: (cubecl::server::Handle, usize),
}

impl RawWeight {
    pub(super) fn upload(
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
pub(super) struct ReadResult {
    pub(super) gbps: f64,
    pub(super) vector_size: usize,
    pub(super) timing: Timing,
}

/// The read bandwidth over `w`'s buffers (`bytes` bytes of weights), the best of the vector
/// widths the device is fast at and single words.
pub(super) fn read_bandwidth(
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

pub(super) fn sync_client(client: &Client) -> Result<(), String> {
    cubecl::future::block_on(client.sync()).map_err(|e| format!("device sync: {e:?}"))
}

pub(super) fn sync_device(device: &Device) -> Result<(), String> {
    device.sync().map_err(|e| format!("device sync: {e:?}"))
}

/// Times the fused GEMV kernel on `w` for `m` activation rows with `config`.
pub(super) fn time_gemv(
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
pub(super) fn gemv_call<'a>(
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
pub(super) fn time_burn(
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
pub(super) fn burn_call<'a>(
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
pub(super) fn weight_bytes(ty: GgmlType, [rows, cols]: [usize; 2]) -> Result<Vec<u8>, String> {
    let pattern = ggml_kernels::check::input_blocks(ty, 1, 8192, ty.id() as u64 + 1)?;
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
pub(super) fn fits(ty: GgmlType, cols: usize) -> bool {
    ggml_kernels::kernel_block_elems(ty).is_some_and(|be| cols.is_multiple_of(be))
        && cols.is_multiple_of(ty.block_size())
}

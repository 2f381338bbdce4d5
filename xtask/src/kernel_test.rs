//! `cargo xtask kernel-test`: every kernel variant (ggml type x op x comptime parameters x
//! activation rows) on the wgpu device against the CPU codec, as a table; non-zero exit on any
//! failure.
use burn::tensor::{Tensor, TensorData};
use burn_gguf::GgmlTensor;
use ggml_kernels::check::{
    dequantize_error, gemv_error, input_blocks as input, matmul_error, rand_f32,
};
use ggml_kernels::{GemvConfig, GemvLaunch};
use gguf::GgmlType;

/// The types the GEMV's gated-activation epilogue is checked on (llama.cpp's Q4_K_M mix): the
/// epilogue and its row mapping do not depend on the type, the staging and decoding they wrap
/// do and are covered for every type by the plain GEMV.
const GLU_TYPES: [GgmlType; 4] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Blocks for `rows` x `cols` of `ty`: codec-quantized random values where a quantizer exists,
/// else random bytes, each block redrawn until it decodes to finite values (no NaN/Inf scales).
struct Row {
    variant: String,
    shape: String,
    /// Worst error over its bound; NaN and launch errors are recorded as infinite.
    err: f64,
}

impl Row {
    fn passed(&self) -> bool {
        self.err <= 1.0
    }
}

/// Runs the variants selected by `types` (every type with a kernel when empty; the ops that do
/// not depend on a type run either way) and `op` (`gemv`, `dequantize`, `matmul`, `big`,
/// `attention`, `delta_net`, `top_k`, `moe`); prints the table. Returns the number of failures.
///
/// Kernels run from WGSL text as in every process (`ggml_kernels::wgsl_cache`), generated here:
/// the sweep's variants are not written to the cache folder.
pub fn run(only: &[GgmlType], op: Option<&str>) -> Result<usize, String> {
    use ggml_kernels::wgsl_cache::{CacheMode, mode, set_mode};
    if mode() == CacheMode::Disk {
        set_mode(Some(CacheMode::InProcess));
    }
    let device = burn_gguf::default_device();
    let client =
        burn_gguf::cube_client(&device).ok_or("the default device is not a CubeCL device")?;
    let max_buffer = burn_gguf::max_buffer_bytes(&device).unwrap_or(u64::MAX) as usize;
    let types: Vec<GgmlType> = GgmlType::all()
        .iter()
        .copied()
        .filter(|t| ggml_kernels::supports(*t) && (only.is_empty() || only.contains(t)))
        .collect();
    if let Some(t) = only.iter().find(|t| !ggml_kernels::supports(**t)) {
        return Err(format!("no kernel for {t}"));
    }
    let wants = |o: &str| op.is_none_or(|x| x == o);
    let mut rows_out: Vec<Row> = Vec::new();
    let mut push = |variant: String, shape: String, err: Result<f64, String>| {
        let err = err.unwrap_or_else(|e| {
            eprintln!("{variant} {shape}: {e}");
            f64::INFINITY
        });
        println!(
            "{variant:<52} {shape:>16} {err:>10.3} {}",
            if err <= 1.0 { "ok" } else { "FAIL" }
        );
        rows_out.push(Row {
            variant,
            shape,
            err,
        });
    };
    println!(
        "{:<52} {:>16} {:>10} verdict",
        "variant", "shape", "err/bound"
    );
    let (rows, cols) = (61, 512);
    for &t in &types {
        let bytes = input(t, rows, cols, t.id() as u64 + 1)?;
        let reference =
            ggml_codec::dequantize_to_vec(t, &bytes, rows * cols).map_err(|e| e.to_string())?;
        if wants("dequantize") {
            let e = dequantize_error(&client, t, &bytes, rows, cols, &reference)
                .map_err(|e| e.to_string());
            push(format!("{t} dequantize_rows"), format!("{rows}x{cols}"), e);
        }
        // The tile matmul on odd shapes: 67 activation rows (a partial second tile), weight
        // rows 3..61 (an offset, a partial tile, and a partial reduction step transposed).
        if wants("matmul") && ggml_kernels::shared_memory_ok(&client) {
            let (m, first, n) = (67, 3, rows - 3);
            for transposed in [false, true] {
                let x = rand_f32(m * if transposed { n } else { cols }, 17);
                let e = matmul_error(
                    &client, t, &bytes, rows, cols, first, n, transposed, &x, &reference,
                )
                .map_err(|e| e.to_string());
                let (v, shape) = if transposed {
                    ("x W", format!("{m}x{n} . {n}x{cols}"))
                } else {
                    ("x W^T", format!("{m}x{cols} . {n}x{cols}"))
                };
                push(format!("{t} dequantize_matmul {v}"), shape, e);
            }
            // Forward, as prefill runs it, at 1, 9, 64 and 300 activation rows (one row, a
            // partial tile, a whole one, five with a partial last), over a column count that is
            // not a multiple of 256 where the type's block allows it (544: 17 blocks of 32).
            let odd = 544;
            let (cols_m, bytes_m, reference_m) = if t.block_size() <= 32
                && odd % t.block_size() == 0
                && odd % ggml_kernels::kernel_block_elems(t).unwrap_or(odd + 1) == 0
            {
                let b = input(t, rows, odd, t.id() as u64 + 7)?;
                let r =
                    ggml_codec::dequantize_to_vec(t, &b, rows * odd).map_err(|e| e.to_string())?;
                (odd, b, r)
            } else {
                (cols, bytes.clone(), reference.clone())
            };
            for m in [1usize, 9, 64, 300] {
                let x = rand_f32(m * cols_m, 19 + m as u64);
                let e = matmul_error(
                    &client,
                    t,
                    &bytes_m,
                    rows,
                    cols_m,
                    0,
                    rows,
                    false,
                    &x,
                    &reference_m,
                )
                .map_err(|e| e.to_string());
                let shape = format!("{m}x{cols_m} . {rows}x{cols_m}");
                push(format!("{t} dequantize_matmul x W^T"), shape, e);
            }
        }
        if wants("gemv") {
            for config in GemvConfig::variants(&client) {
                let launch = GemvLaunch::default();
                for m in config.test_rows() {
                    let x = rand_f32(m * cols, m as u64);
                    let e = gemv_error(
                        &client, t, &bytes, rows, cols, config, launch, &x, &reference,
                    )
                    .map_err(|e| e.to_string());
                    let v = format!("{t} gemv {} m={m}", config.name());
                    push(v, format!("{m}x{cols} . {rows}x{cols}"), e);
                }
                // Several rows in single-row passes of the decode shader (`GemvLaunch`).
                if matches!(config, GemvConfig::OwnRows { .. }) {
                    let m = 5;
                    let launch = GemvLaunch {
                        pass_rows: Some(1),
                        ..launch
                    };
                    let x = rand_f32(m * cols, 50);
                    let e = gemv_error(
                        &client, t, &bytes, rows, cols, config, launch, &x, &reference,
                    )
                    .map_err(|e| e.to_string());
                    let v = format!("{t} gemv {} m={m} in 1-row passes", config.name());
                    push(v, format!("{m}x{cols} . {rows}x{cols}"), e);
                }
            }
        }
        // The gated-activation epilogue (a stacked gate/up projection of 2 x 31 rows: a cube
        // not full) on the types of llama.cpp's Q4_K_M mix: GELU and SiLU alternating.
        if wants("gemv") && GLU_TYPES.contains(&t) {
            let (rows, cols) = (62, 512);
            let bytes = input(t, rows, cols, t.id() as u64 + 21)?;
            let reference =
                ggml_codec::dequantize_to_vec(t, &bytes, rows * cols).map_err(|e| e.to_string())?;
            for config in GemvConfig::variants(&client) {
                for m in config.test_rows() {
                    let gelu = m % 2 == 1;
                    let x = rand_f32(m * cols, m as u64 + 9);
                    let launch = GemvLaunch {
                        pass_rows: None,
                        glu: Some(gelu),
                    };
                    let e = gemv_error(
                        &client, t, &bytes, rows, cols, config, launch, &x, &reference,
                    )
                    .map_err(|e| e.to_string());
                    let act = if gelu { "gelu" } else { "silu" };
                    let v = format!("{t} gemv+{act} {} m={m}", config.name());
                    push(v, format!("{m}x{cols} . {rows}x{cols}"), e);
                }
            }
        }
        // 262,144 rows, one per cube: more than 65,535 workgroups in one dispatch (case C29).
        let (big_rows, big_cols) = (262_144, 256);
        let row_bytes = t.row_bytes(big_cols as u64).map_err(|e| e.to_string())? as usize;
        if wants("big") && big_rows * row_bytes + 8 <= max_buffer {
            let bytes = input(t, big_rows, big_cols, 7)?;
            let reference = ggml_codec::dequantize_to_vec(t, &bytes, big_rows * big_cols)
                .map_err(|e| e.to_string())?;
            let x = rand_f32(big_cols, 3);
            let config = GemvConfig::SHARED_ONE_ROW;
            let launch = GemvLaunch::default();
            let e = gemv_error(
                &client, t, &bytes, big_rows, big_cols, config, launch, &x, &reference,
            )
            .map_err(|e| e.to_string());
            push(
                format!("{t} gemv {} m=1 (262144 cubes)", config.name()),
                format!("{big_rows}x{big_cols}"),
                e,
            );
        }
    }
    // A tensor over 128 MiB through the ggml-quant tensor type: split into buffers by rows (C28).
    if wants("big") && types.contains(&GgmlType::Q8_0) {
        let (r, c) = (262_144, 640);
        let bytes = input(GgmlType::Q8_0, r, c, 11)?;
        let reference = ggml_codec::dequantize_to_vec(GgmlType::Q8_0, &bytes, r * c)
            .map_err(|e| e.to_string())?;
        let t = GgmlTensor::from_bytes(&bytes, GgmlType::Q8_0, [r, c], &device)
            .map_err(|e| e.to_string())?;
        let x = rand_f32(c, 5);
        let y = t
            .matmul_t(Tensor::<2>::from_data(
                TensorData::new(x.clone(), [1, c]),
                &device,
            ))
            .try_into_data()
            .map_err(|e| format!("{e:?}"))?
            .try_to_vec::<f32>()
            .map_err(|e| format!("{e:?}"))?;
        let worst = ggml_kernels::check::gemv_error_of(&y, &x, &reference, r, c);
        push(
            format!("Q8_0 GgmlTensor matmul_t, {} buffers", t.num_parts()),
            format!("{r}x{c} ({} MB)", bytes.len() / 1_000_000),
            Ok(worst),
        );
    }
    // The KV-cache step (Q/K norm + RoPE + cache write) and attention (with its split
    // combine): no ggml type, so whatever types are asked for.
    if op.is_none_or(|o| o == "attention") {
        for (i, case) in ggml_kernels::check::attention_cases()
            .into_iter()
            .enumerate()
        {
            let e = ggml_kernels::check::attention_error(&client, case, 40 + i as u64)
                .map_err(|e| e.to_string());
            push("qk_rope_cache + attention".into(), case.label(), e);
        }
    }
    // RMSNorm with its weight: no ggml type either.
    if op.is_none_or(|o| o == "norm") {
        for (i, (r, c)) in ggml_kernels::check::norm_cases().into_iter().enumerate() {
            let e = ggml_kernels::check::rms_norm_error(&client, r, c, 70 + i as u64)
                .map_err(|e| e.to_string());
            push("rms_norm".into(), format!("{r}x{c}"), e);
        }
    }
    // The delta-net kernels (Qwen3.5's linear attention): no ggml type either.
    if op.is_none_or(|o| o == "delta_net") {
        for (i, case) in ggml_kernels::check::delta_net_cases()
            .into_iter()
            .enumerate()
        {
            let e = ggml_kernels::check::delta_net_error(&client, case, 110 + i as u64)
                .map_err(|e| e.to_string());
            push("causal_conv + gated_delta_net".into(), case.label(), e);
        }
    }
    // MoE routing (no ggml type) and the expert GEMV of every type.
    if wants("moe") {
        for (i, case) in ggml_kernels::check::route_cases().into_iter().enumerate() {
            let e = ggml_kernels::check::route_error(&client, case, 90 + i as u64)
                .map_err(|e| e.to_string());
            let (n, ne, k, norm) = case;
            push(
                "moe_route".into(),
                format!("{n}x{ne} k={k}{}", if norm { " norm" } else { "" }),
                e,
            );
        }
        moe_rows(&client, &types, &mut push)?;
    }
    // Top-k (sampling candidates): no ggml type either.
    if op.is_none_or(|o| o == "top_k") {
        for (i, case) in ggml_kernels::check::top_k_cases().into_iter().enumerate() {
            let e = ggml_kernels::check::top_k_error(&client, case, 70 + i as u64)
                .map_err(|e| e.to_string());
            let (rows, n, k) = case;
            push("top_k".into(), format!("{rows}x{n} k={k}"), e);
        }
    }
    let failed = rows_out.iter().filter(|r| !r.passed()).count();
    println!(
        "\n{} variants, {} passed, {failed} failed",
        rows_out.len(),
        rows_out.len() - failed
    );
    for r in rows_out.iter().filter(|r| !r.passed()) {
        println!("FAILED: {} {} ({:.3})", r.variant, r.shape, r.err);
    }
    Ok(failed)
}

/// The expert GEMV ([`ggml_kernels::launch_gemv_id`]) of every type on every split variant: a
/// merged gate/up bank of 5 experts of 2 x 7 rows (the up half: rows 7..14 of each), 3 tokens
/// choosing 2 experts each with their tokens' inputs, and a down bank with an input per slot
/// split into two buffers inside an expert.
fn moe_rows(
    client: &cubecl::client::Client,
    types: &[GgmlType],
    push: &mut impl FnMut(String, String, Result<f64, String>),
) -> Result<(), String> {
    use ggml_kernels::check::{GemvIdCase, gemv_id_error};
    let cols = 256;
    let cases = [
        GemvIdCase {
            n_expert: 5,
            expert_rows: 14,
            cols,
            row_offset: 7,
            rows: 7,
            tokens: 3,
            k: 2,
            own_x: false,
            split: 0,
        },
        GemvIdCase {
            n_expert: 5,
            expert_rows: 9,
            cols,
            row_offset: 0,
            rows: 9,
            tokens: 3,
            k: 2,
            own_x: true,
            split: 22,
        },
    ];
    let configs: Vec<GemvConfig> = GemvConfig::variants(client)
        .into_iter()
        .filter(|c| matches!(c, GemvConfig::Split { .. }))
        .collect();
    for &t in types {
        for (i, case) in cases.iter().enumerate() {
            let bank_rows = case.n_expert * case.expert_rows;
            let bytes = input(t, bank_rows, cols, t.id() as u64 + 31 + i as u64)?;
            let reference = ggml_codec::dequantize_to_vec(t, &bytes, bank_rows * cols)
                .map_err(|e| e.to_string())?;
            for &config in &configs {
                let e = gemv_id_error(client, t, &bytes, &reference, *case, config, 5 + i as u64)
                    .map_err(|e| e.to_string());
                let what = if case.own_x {
                    "down, 2 parts"
                } else {
                    "up half"
                };
                push(
                    format!("{t} gemv_id {} ({what})", config.name()),
                    format!("{}x{} of {}", case.tokens, case.k, case.n_expert),
                    e,
                );
            }
        }
    }
    Ok(())
}

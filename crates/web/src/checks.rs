//! The browser's kernel checks: `kernel-test`'s cases for one ggml type per family, compiled by
//! the browser's WGSL compiler (Chrome's Tint, stricter than naga in places) and run on its
//! WebGPU device, each against the CPU codec or an f64 reference as the native
//! `cargo xtask kernel-test` does (the same `ggml_kernels::check` functions, awaiting their
//! read-backs instead of blocking on them).
use ggml_kernels::GemvConfig;
use ggml_kernels::GemvLaunch;
use ggml_kernels::check::{
    attention_cases, attention_error_async, dequantize_error_async, gemv_error_async, input_blocks,
    norm_cases, rand_f32, rms_norm_error_async,
};
use gguf::GgmlType;
use serde::Serialize;

/// One type per family: a legacy block, a K-quant, an IQ codebook type (its grid in a
/// buffer), a ternary type and the float-4 type.
pub const TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_K,
    GgmlType::IQ2_XXS,
    GgmlType::TQ1_0,
    GgmlType::MXFP4,
];

/// One checked kernel variant.
#[derive(Clone, Debug, Serialize)]
pub struct Case {
    /// Kernel and variant, named as `kernel-test` names them.
    pub variant: String,
    /// The shape checked.
    pub shape: String,
    /// The worst error as a fraction of its bound (<= 1 passes); `null` in JSON when the
    /// kernel failed to compile, launch or read back (see `error`).
    pub err: Option<f64>,
    /// Whether it passed.
    pub passed: bool,
    /// Why it could not run, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Every case's result and the counts, as the page's `RESULT` line prints them.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// In the order run.
    pub cases: Vec<Case>,
    /// Cases that passed.
    pub passed: usize,
    /// Cases that failed.
    pub failed: usize,
}

impl Report {
    fn push(&mut self, variant: String, shape: String, result: Result<f64, String>) {
        let (err, error) = match result {
            Ok(e) => (Some(e), None),
            Err(e) => (None, Some(e)),
        };
        let passed = err.is_some_and(|e| e <= 1.0);
        if passed {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
        self.cases.push(Case {
            variant,
            shape,
            err: err.filter(|e| e.is_finite()),
            passed,
            error,
        });
    }
}

/// Runs every case on `device`'s CubeCL client.
///
/// # Errors
/// The device is not a CubeCL one, or a type's test blocks cannot be made (a codec error).
pub async fn run(device: &burn::tensor::Device) -> Result<Report, String> {
    let client = burn_gguf::cube_client(device).ok_or("the device is not a CubeCL device")?;
    let mut report = Report {
        cases: Vec::new(),
        passed: 0,
        failed: 0,
    };
    let (rows, cols) = (61, 512);
    let shape = |m: usize| format!("{m}x{cols} . {rows}x{cols}");
    for ty in TYPES {
        let bytes = input_blocks(ty, rows, cols, ty.id() as u64 + 1)?;
        let reference =
            ggml_codec::dequantize_to_vec(ty, &bytes, rows * cols).map_err(|e| e.to_string())?;
        let e = dequantize_error_async(&client, ty, &bytes, rows, cols, &reference).await;
        report.push(
            format!("{ty} dequantize_rows"),
            format!("{rows}x{cols}"),
            e.map_err(|e| e.to_string()),
        );
        for config in GemvConfig::variants(&client) {
            for m in config.test_rows().into_iter().filter(|&m| m == 1 || m == 8) {
                let x = rand_f32(m * cols, m as u64);
                let e = gemv_error_async(
                    &client,
                    ty,
                    &bytes,
                    rows,
                    cols,
                    config,
                    GemvLaunch::default(),
                    &x,
                    &reference,
                )
                .await;
                report.push(
                    format!("{ty} gemv {} m={m}", config.name()),
                    shape(m),
                    e.map_err(|e| e.to_string()),
                );
            }
        }
    }
    for (i, case) in attention_cases().into_iter().enumerate() {
        let e = attention_error_async(&client, case, 40 + i as u64).await;
        report.push(
            "qk_rope_cache + attention".into(),
            case.label(),
            e.map_err(|e| e.to_string()),
        );
    }
    for (i, (r, c)) in norm_cases().into_iter().enumerate() {
        let e = rms_norm_error_async(&client, r, c, 70 + i as u64).await;
        report.push(
            "rms_norm".into(),
            format!("{r}x{c}"),
            e.map_err(|e| e.to_string()),
        );
    }
    Ok(report)
}

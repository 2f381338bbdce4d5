//! `cargo xtask kernel-gen`: every kernel variant's source written to a folder per target.
//!
//! WGSL is validated with naga (a failure fails the run). SPIR-V is validated with `spirv-val`
//! (Debian `spirv-tools`) where it is installed: CubeCL 0.11.3's SPIR-V for kernels with
//! workgroup shared memory fails it, so those variants are reported as not to be selected on
//! the SPIR-V path (the plane and one-unit-per-row GEMVs use no shared memory), without failing
//! the run. MSL is written for reading and for compiling where a Mac is.
use ggml_kernels::GemvConfig;
use ggml_kernels::source::{Target, Variant, source};
use gguf::GgmlType;
use std::path::Path;
use std::process::Command;

/// Every op variant: dequantize-rows, and the GEMV for each configuration and pass width
/// ([`GemvConfig::pass_widths`]; file names end in `_p<m_pass>`).
/// The plane GEMV is listed for a 32-wide plane even where this device has none, so its source
/// is generated everywhere.
fn variants(client: &cubecl::client::Client) -> Vec<(String, Variant)> {
    let mut configs = GemvConfig::variants(client);
    let extras = [
        GemvConfig::Split {
            lanes: 32,
            rows_per_cube: 8,
            plane: true,
        },
        GemvConfig::OwnRows {
            rows_per_unit: 8,
            lanes: 8,
            plane: true,
        },
    ];
    for extra in extras {
        // A plane variant of the same layout already listed (kernel_args().2 is `plane`).
        let listed = configs.iter().any(|c| {
            std::mem::discriminant(c) == std::mem::discriminant(&extra) && c.kernel_args().2
        });
        if !listed {
            configs.push(extra);
        }
    }
    let mut out = vec![("dequantize_rows".to_string(), Variant::DequantizeRows)];
    for (name, transposed) in [("dequantize_matmul", false), ("dequantize_matmul_t", true)] {
        out.push((name.to_string(), Variant::DequantizeMatmul { transposed }));
    }
    for config in configs {
        for m_pass in config.pass_widths() {
            let name = format!("gemv_{}_p{m_pass}", config.name().replace('-', "_"));
            out.push((name, Variant::Gemv { config, m_pass }));
            let name = format!("gemv_glu_{}_p{m_pass}", config.name().replace('-', "_"));
            out.push((name, Variant::GemvGlu { config, m_pass }));
        }
    }
    out
}

/// Whether `variant` is generated for `ty`: the gated-activation epilogue only for the types of
/// `kernel-test`'s check of it (llama.cpp's Q4_K_M mix; the epilogue does not depend on the
/// type).
fn generated_for(ty: GgmlType, variant: &Variant) -> bool {
    const GLU_TYPES: [GgmlType; 4] = [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];
    !matches!(variant, Variant::GemvGlu { .. }) || GLU_TYPES.contains(&ty)
}

fn validate_wgsl(src: &[u8]) -> Result<&'static str, String> {
    let src = std::str::from_utf8(src).map_err(|e| e.to_string())?;
    let module = naga::front::wgsl::parse_str(src).map_err(|e| format!("naga parse: {e}"))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("naga validation: {e:?}"))?;
    Ok("valid (naga)")
}

/// `spirv-val`'s verdict on `file`, or `None` when it is not installed.
fn spirv_val(file: &Path) -> Option<Result<(), String>> {
    let out = Command::new("spirv-val")
        .args(["--target-env", "vulkan1.2"])
        .arg(file)
        .output()
        .ok()?;
    Some(if out.status.success() {
        Ok(())
    } else {
        let msg = String::from_utf8_lossy(&out.stderr);
        Err(msg.lines().next().unwrap_or("").trim().to_string())
    })
}

/// Writes one file per variant and target into `out/<target>/` and validates it; prints the
/// variant list with sizes. Returns the number of variants that failed to compile, or whose
/// WGSL failed validation.
pub fn run(out: &Path, targets: &[Target], only: &[GgmlType]) -> Result<usize, String> {
    let device = burn_gguf::default_device();
    let client =
        burn_gguf::cube_client(&device).ok_or("the default device is not a CubeCL device")?;
    let variants = variants(&client);
    let types: Vec<GgmlType> = GgmlType::all()
        .iter()
        .copied()
        .filter(|t| ggml_kernels::supports(*t) && (only.is_empty() || only.contains(t)))
        .collect();
    let (mut total, mut failed) = (0usize, 0usize);
    let mut spirv_rejected: Vec<String> = Vec::new();
    for &target in targets {
        let dir = out.join(target.extension());
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for &ty in &types {
            for (name, variant) in variants.iter().filter(|(_, v)| generated_for(ty, v)) {
                total += 1;
                let file_name =
                    format!("{}_{name}.{}", ty.name().to_lowercase(), target.extension());
                let file = dir.join(&file_name);
                let t = std::time::Instant::now();
                let verdict = source(&client, ty, *variant, target)
                    .map_err(|e| e.to_string())
                    .and_then(|src| {
                        let compile_s = t.elapsed().as_secs_f64();
                        std::fs::write(&file, &src)
                            .map_err(|e| format!("{}: {e}", file.display()))?;
                        let note = match target {
                            Target::Wgsl => validate_wgsl(&src)?,
                            Target::Spirv => match spirv_val(&file) {
                                None => "written (spirv-val not installed)",
                                Some(Ok(())) => "valid (spirv-val)",
                                Some(Err(e)) => {
                                    spirv_rejected.push(format!("{file_name}: {e}"));
                                    "spirv-val rejects it: not selected on SPIR-V"
                                }
                            },
                            Target::Msl => "written",
                        };
                        Ok((
                            src.len(),
                            compile_s,
                            t.elapsed().as_secs_f64() - compile_s,
                            note,
                        ))
                    });
                match verdict {
                    Ok((bytes, compile_s, check_s, note)) => println!(
                        "{file_name:<52} {bytes:>8} bytes {:>8.1} ms {:>7.1} ms  {note}",
                        compile_s * 1e3,
                        check_s * 1e3
                    ),
                    Err(e) => {
                        failed += 1;
                        println!("{file_name:<52} FAILED: {e}");
                    }
                }
            }
        }
    }
    if !spirv_rejected.is_empty() {
        println!(
            "\n{} SPIR-V variants rejected by spirv-val (CubeCL's SPIR-V for workgroup shared \
             memory), first: {}",
            spirv_rejected.len(),
            spirv_rejected[0]
        );
    }
    println!(
        "\n{total} variant sources ({} types x up to {} variants x {} targets) written to {}, \
         {} ok, {failed} failed",
        types.len(),
        variants.len(),
        targets.len(),
        out.display(),
        total - failed
    );
    Ok(failed)
}

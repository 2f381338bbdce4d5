//! `cargo xtask kernel-gen`: every kernel variant's source written to a folder, WGSL validated
//! with naga.
use ggml_kernels::GemvConfig;
use ggml_kernels::source::{Variant, wgsl};
use gguf::GgmlType;
use std::path::Path;

/// Writes one `.wgsl` file per variant into `out` and validates each with naga; prints the
/// variant list with sizes. Returns the number of variants that failed to compile or validate.
pub fn run(out: &Path) -> Result<usize, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let device = burn_gguf::default_device();
    let client =
        burn_gguf::cube_client(&device).ok_or("the default device is not a CubeCL device")?;
    let mut variants = vec![("dequantize_rows".to_string(), Variant::DequantizeRows)];
    for config in GemvConfig::variants(&client) {
        for m in 1..=ggml_kernels::MAX_GEMV_ROWS as u32 {
            let name = format!(
                "gemv_l{}_r{}_{}_m{m}",
                config.lanes,
                config.rows_per_cube,
                if config.plane { "plane" } else { "smem" }
            );
            variants.push((name, Variant::Gemv { config, m }));
        }
    }
    let (mut total, mut failed) = (0usize, 0usize);
    for &ty in GgmlType::all()
        .iter()
        .filter(|t| ggml_kernels::supports(**t))
    {
        for (name, variant) in &variants {
            total += 1;
            let file = out.join(format!("{}_{name}.wgsl", ty.name().to_lowercase()));
            let verdict = wgsl(&client, ty, *variant)
                .map_err(|e| e.to_string())
                .and_then(|src| {
                    std::fs::write(&file, &src).map_err(|e| format!("{}: {e}", file.display()))?;
                    let module = naga::front::wgsl::parse_str(&src)
                        .map_err(|e| format!("naga parse: {e}"))?;
                    naga::valid::Validator::new(
                        naga::valid::ValidationFlags::all(),
                        naga::valid::Capabilities::all(),
                    )
                    .validate(&module)
                    .map_err(|e| format!("naga validation: {e:?}"))?;
                    Ok(src.len())
                });
            match verdict {
                Ok(bytes) => println!(
                    "{:<48} {bytes:>8} bytes  valid",
                    file.file_name().unwrap().to_string_lossy()
                ),
                Err(e) => {
                    failed += 1;
                    println!(
                        "{:<48} FAILED: {e}",
                        file.file_name().unwrap().to_string_lossy()
                    );
                }
            }
        }
    }
    println!(
        "\n{total} variants written to {}, {} valid, {failed} failed",
        out.display(),
        total - failed
    );
    Ok(failed)
}

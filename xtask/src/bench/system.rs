//! The machine side of `cargo xtask bench`: which adapters wgpu sees, whether the caches that
//! make a run warm existed, and the date.
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// The wgpu adapters CubeCL's automatic choice looks at, as text (name, backend, type, driver),
/// and the backend it lands on: Vulkan, DX12 and OpenGL in turn (`cubecl-wgpu`'s
/// `AutoGraphicsApi` order; it reads no `WGPU_BACKEND`), stopping at the first with a GPU adapter,
/// else the first with any. Later backends are not probed once one has a GPU, as in CubeCL.
pub(super) fn adapters() -> (Value, Option<String>) {
    use cubecl::wgpu::wgpu;
    let mut infos: Vec<wgpu::AdapterInfo> = Vec::new();
    let mut chosen: Option<wgpu::Backend> = None;
    for backend in [
        wgpu::Backend::Vulkan,
        wgpu::Backend::Dx12,
        wgpu::Backend::Gl,
    ] {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: backend.into(),
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let found: Vec<wgpu::AdapterInfo> =
            cubecl::future::block_on(instance.enumerate_adapters(backend.into()))
                .iter()
                .map(|a| a.get_info())
                .collect();
        let gpu = found.iter().any(|i| i.device_type != wgpu::DeviceType::Cpu);
        if gpu || (chosen.is_none() && !found.is_empty()) {
            chosen = Some(backend);
        }
        infos.extend(found);
        if gpu {
            break;
        }
    }
    let list = infos
        .iter()
        .map(|i| {
            Value::String(format!(
                "{} ({:?}, {:?}, driver {} {})",
                i.name, i.backend, i.device_type, i.driver, i.driver_info
            ))
        })
        .collect();
    (Value::Array(list), chosen.map(|b| format!("{b:?}")))
}

/// Whether CubeCL's environment database and the drivers' shader caches existed (and how big they
/// were) when the run started.
pub(super) fn cache_state() -> Value {
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

pub(super) fn print_caches(caches: &Value) {
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
pub(super) fn utc_now() -> String {
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
    #[test]
    fn utc_date_format() {
        let s = super::utc_now();
        assert_eq!(s.len(), 20);
        assert!(s.starts_with("20") && s.ends_with('Z'));
        assert_eq!(&s[4..5], "-");
        assert_eq!(&s[10..11], "T");
    }
}

//! Host threads on a software device.
//!
//! On a software Vulkan device (lavapipe) every kernel runs on Mesa's worker threads, on the same
//! CPU cores as the threads that record Burn ops. Those threads busy-wait: CubeCL 0.11's device
//! channels (`cubecl-common`, `custom_channel`) spin on a full queue, up to 524,288
//! `spin_loop` iterations before they yield. During a decode the generating thread fills Burn
//! fusion's queue and waits on it, and fusion's service thread (named `DSU-…`) fills the
//! runtime's queue and waits on that. On the 2-core VM of the README, `perf record -a` during
//! the Gemma 3 270M decode counted about 40% of the CPU samples in those two threads' spin loops
//! and 27% in the shader code (2026-12-03).
//!
//! So the CLI runs those two threads at a lower priority on a software device (nice 19 unless
//! [`HOST_NICE_ENV`] says otherwise). While they spin, the workers get the cores; while the
//! device is idle, nothing else competes and they run as before. A device with a physical card
//! runs its kernels elsewhere, and its threads are left alone.

/// Environment variable with the nice value (0-19) for the host threads on a software device;
/// `0` leaves their priority alone.
pub const HOST_NICE_ENV: &str = "BURN_GGUF_HOST_NICE";

/// The nice value used when [`HOST_NICE_ENV`] is unset: the lowest priority.
pub const DEFAULT_HOST_NICE: i32 = 19;

/// The nice value from [`HOST_NICE_ENV`]'s value (`None`: unset).
///
/// # Errors
/// A value that is not an integer in 0..=19, naming the variable.
pub fn parse_host_nice(value: Option<&str>) -> Result<i32, String> {
    match value {
        None => Ok(DEFAULT_HOST_NICE),
        Some(v) => match v.trim().parse::<i32>() {
            Ok(n) if (0..=19).contains(&n) => Ok(n),
            _ => Err(format!(
                "{HOST_NICE_ENV}={v:?}: expected a nice value from 0 to 19"
            )),
        },
    }
}

/// On a software device, lowers the calling thread (the one that will generate) and Burn
/// fusion's service threads to the nice value of [`HOST_NICE_ENV`] (default 19). A thread
/// already at that value or lower priority is left alone (raising a priority needs privileges).
/// Does nothing on other devices, outside Linux, or with the value 0.
///
/// Returns the number of threads whose priority it changed.
///
/// # Errors
/// A bad [`HOST_NICE_ENV`] value, or a failed `getpriority`/`setpriority` call, as a message.
pub fn yield_to_software_device(device: &burn::tensor::Device) -> Result<usize, String> {
    if !burn_gguf::is_software_device(device) {
        return Ok(0);
    }
    let nice = parse_host_nice(std::env::var(HOST_NICE_ENV).ok().as_deref())?;
    if nice == 0 {
        return Ok(0);
    }
    lower_host_threads(nice)
}

#[cfg(target_os = "linux")]
fn lower_host_threads(nice: i32) -> Result<usize, String> {
    use rustix::process::{Pid, getpriority_process, setpriority_process};
    // On Linux a thread id names one thread for `PRIO_PROCESS` (setpriority(2), NOTES).
    let lower = |tid: Pid| -> Result<bool, String> {
        let now =
            getpriority_process(Some(tid)).map_err(|e| format!("getpriority({tid:?}): {e}"))?;
        if now >= nice {
            return Ok(false);
        }
        setpriority_process(Some(tid), nice)
            .map_err(|e| format!("setpriority({tid:?}, {nice}): {e}"))?;
        Ok(true)
    };
    let mut changed = usize::from(lower(rustix::thread::gettid())?);
    for tid in fusion_service_threads() {
        changed += usize::from(lower(tid)?);
    }
    Ok(changed)
}

#[cfg(not(target_os = "linux"))]
fn lower_host_threads(_nice: i32) -> Result<usize, String> {
    Ok(0)
}

/// The ids of this process's threads named `DSU-…`: CubeCL's device-service threads of the
/// upstream stage, where Burn fusion runs (`cubecl-common` 0.11 names them
/// `DS{U|D}-{service}-{device}`). A thread that ends while it is read is skipped.
#[cfg(target_os = "linux")]
fn fusion_service_threads() -> Vec<rustix::process::Pid> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.starts_with("DSU-"))
        })
        .filter_map(|task| task.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(rustix::process::Pid::from_raw)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_nice_values() {
        assert_eq!(parse_host_nice(None), Ok(19));
        assert_eq!(parse_host_nice(Some("0")), Ok(0));
        assert_eq!(parse_host_nice(Some(" 10 ")), Ok(10));
        for bad in ["-1", "20", "", "nice", "1.5"] {
            let e = parse_host_nice(Some(bad)).unwrap_err();
            assert!(e.contains(HOST_NICE_ENV), "{e}");
        }
    }

    /// On a software device (lavapipe in CI) the calling thread and the fusion service thread
    /// end at nice 19; elsewhere nothing changes.
    #[cfg(target_os = "linux")]
    #[test]
    fn lowers_the_generating_and_fusion_threads_on_a_software_device() {
        use burn::tensor::{Tensor, TensorData};
        use rustix::process::getpriority_process;
        if std::env::var_os(HOST_NICE_ENV).is_some() {
            eprintln!("skipped: {HOST_NICE_ENV} is set");
            return;
        }
        // A thread of its own, whose priority nothing else in the test binary shares.
        std::thread::spawn(|| {
            let device = burn_gguf::default_device();
            let x = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, 2.0], [2]), &device);
            let sum: Vec<f32> = (x.clone() + x).into_data().try_to_vec::<f32>().unwrap();
            assert_eq!(sum, [2.0, 4.0]);
            let before = getpriority_process(None).unwrap();
            let changed = yield_to_software_device(&device).unwrap();
            let after = getpriority_process(None).unwrap();
            if burn_gguf::is_software_device(&device) {
                assert_eq!(after, 19);
                let dsu = fusion_service_threads();
                assert!(!dsu.is_empty(), "no DSU- thread after a fused op");
                for tid in &dsu {
                    assert_eq!(getpriority_process(Some(*tid)).unwrap(), 19);
                }
                assert!(changed >= usize::from(before < 19));
                // A second call finds them lowered already.
                assert_eq!(yield_to_software_device(&device), Ok(0));
            } else {
                assert_eq!((changed, after), (0, before));
            }
        })
        .join()
        .unwrap();
    }
}

/// Sets `XDG_RUNTIME_DIR` to [`private_runtime_dir`] when it is unset or not a directory, so
/// Mesa's drivers do not print `error: XDG_RUNTIME_DIR is invalid or not set`. Call it first
/// thing in `main`, before any thread exists (it changes the process environment).
pub fn use_private_runtime_dir() {
    if let Some(dir) = private_runtime_dir() {
        // SAFETY: the caller runs this before spawning threads (see above).
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", dir) };
    }
}

/// A private runtime directory for the graphics drivers when `XDG_RUNTIME_DIR` is unset or not a
/// directory: `$TMPDIR/burn-gguf-runtime-UID`, created with mode 0700 (Mesa's drivers print
/// `error: XDG_RUNTIME_DIR is invalid or not set` without one). `None` when the variable names a
/// directory already, or on a platform without the variable's convention.
pub fn private_runtime_dir() -> Option<std::path::PathBuf> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        if std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir()) {
            return None;
        }
        let uid = rustix::process::getuid().as_raw();
        let dir = std::env::temp_dir().join(format!("burn-gguf-runtime-{uid}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(_) => return None,
        }
        // Only a directory of ours that nobody else can read.
        let meta = std::fs::symlink_metadata(&dir).ok()?;
        if !meta.is_dir() || meta.uid() != uid {
            return None;
        }
        if meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).ok()?;
        }
        Some(dir)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

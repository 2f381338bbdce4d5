//! A cache on disk of the WGSL CubeCL generates for this crate's kernels, so that a fresh process
//! skips CubeCL's code generation (its expansion stays: tens of milliseconds).
//!
//! Why: CubeCL 0.11.3 keeps compiled kernels across processes only on its SPIR-V path (a
//! `compilation_store` keyed by the device); the WGSL path (Burn's `webgpu` feature, which this
//! project runs on) generates every kernel again in every process. For the unrolled GEMV shaders
//! that is 0.15-2 s each on this project's 2-core machine (CubeCL's optimiser passes over
//! 100-600 KB of source, see `docs/decode.md`), most of a fresh process's first token. naga and
//! the driver still see the text in every process (the driver keeps its own cache of the
//! pipelines it builds).
//!
//! How: a launch through `launch` wraps the kernel in [`Cached`], whose
//! [`CubeKernel::source`] hands the server WGSL text ([`PrecompiledSource`]), read from the cache
//! or generated with CubeCL's own WGSL compiler from the kernel's definition (what the server
//! would have run) and written to it. Generated or read, the pipeline comes from the same text.
//!
//! Keys: a file per kernel, named by a 128-bit hash of the kernel's [`KernelId`] (its type and
//! comptime arguments: [`KernelId::stable_hash`]), the device's properties
//! ([`DeviceProperties::checksum`], its name and fingerprint) and the runtime's name, in a
//! folder per build of the executable (its GNU build id, as CubeCL's SPIR-V cache is keyed):
//! any rebuild, so any change to a kernel or to CubeCL, starts a new folder; folders of other
//! builds untouched for [`PRUNE_AFTER`], and all but the [`KEEP_BUILDS`] newest, are removed
//! when a process first uses the cache. Each
//! file holds a checksum of its text; a file that fails it is generated again. Files are
//! written to a temporary name and renamed, so concurrent processes never read half a file.
//!
//! Where: `$BURN_GGUF_KERNEL_CACHE` if set (`off`, `0` or empty: [`CacheMode::Off`], CubeCL's
//! own path), else `$XDG_CACHE_HOME/burn-gguf/wgsl`, else `$HOME/.cache/burn-gguf/wgsl`. With no
//! folder (an executable without a build id, a folder that cannot be created) the text is
//! generated in the process, so pipelines are built the same way either way. A runtime that
//! does not compile WGSL (`wgpu<spirv>`, `wgpu<msl>`, CUDA) launches kernels as CubeCL makes
//! them.
//!
//! A pipeline built from text has no IR behind it, so wgpu derives its bind-group layout from
//! the shader, and that layout lists only the bindings the entry point reads or writes: every
//! kernel launched through here must use each of its buffer arguments (see
//! `crate::gemv::keep_binding()`).
use cubecl::hash::StableHasher;
use cubecl::ir::UIntKind;
use cubecl::prelude::*;
use cubecl::{Compiler, WgpuCompilationOptions};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

/// Folders of other builds unused this long are removed.
pub const PRUNE_AFTER: Duration = Duration::from_secs(14 * 24 * 3600);

/// Build folders kept, this build's included (each test binary is a build of its own).
pub const KEEP_BUILDS: usize = 32;

/// The first line of every cache file: the format's version.
const MAGIC: &str = "// burn-gguf wgsl cache v1";

/// The runtime name of CubeCL's wgpu runtime compiling WGSL (`Client::name`).
const WGSL_RUNTIME: &str = "wgpu<wgsl>";

static HITS: AtomicU64 = AtomicU64::new(0);
static STORED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

/// What this process's launches did with the cache so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Kernels whose WGSL was read from the cache.
    pub hits: u64,
    /// Kernels generated and written to the cache.
    pub stored: u64,
    /// Kernels the cache could not serve (CubeCL then compiled them itself) or write.
    pub failed: u64,
}

/// Counts of this process's cache use ([`CacheStats`]).
pub fn stats() -> CacheStats {
    CacheStats {
        hits: HITS.load(Ordering::Relaxed),
        stored: STORED.load(Ordering::Relaxed),
        failed: FAILED.load(Ordering::Relaxed),
    }
}

/// The folder this build's kernels are cached in, or `None` when the cache is off (see the
/// module docs). Created, and other builds' stale folders pruned, on the first call.
pub fn cache_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = cache_root()?;
        let build = buildid::build_id()?;
        let name: String = build.iter().map(|b| format!("{b:02x}")).collect();
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).ok()?;
        prune(&root, &dir);
        Some(dir)
    })
    .as_deref()
}

fn cache_root() -> Option<PathBuf> {
    match std::env::var_os("BURN_GGUF_KERNEL_CACHE") {
        Some(v) if v.is_empty() || v == "off" || v == "0" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("burn-gguf").join("wgsl"))
        }
    }
}

/// Removes the folders of other builds under `root` not modified for [`PRUNE_AFTER`], and all
/// but the [`KEEP_BUILDS`] most recently modified.
fn prune(root: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut builds: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path() != keep)
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(|m| m.is_dir())?;
            Some((meta.modified().ok()?, e.path()))
        })
        .collect();
    builds.sort_by(|a, b| b.0.cmp(&a.0));
    for (i, (modified, path)) in builds.iter().enumerate() {
        let stale = modified.elapsed().is_ok_and(|age| age > PRUNE_AFTER);
        if stale || i + 1 >= KEEP_BUILDS {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// Launches the `#[cube(launch_unchecked)]` kernel whose generated struct is `$kernel` through
/// the cache ([`launch`]), with the statements CubeCL's `launch_unchecked` expands to
/// (cubecl-macros 0.11.3, `Launch::launch_body`): the runtime arguments registered in order,
/// each after its declared use (`ReadOnly` for `&T`, else `ReadWrite`), then the comptime
/// arguments. Used in an `unsafe` block: the caller keeps `launch_unchecked`'s contract (every
/// index in bounds); `tests/tests/kernels.rs::wgsl_cache_matches_cubecl` checks the
/// outputs against CubeCL's own launch.
macro_rules! launch_unchecked_cached {
    ($client:expr, $count:expr, $dim:expr, $kernel:ty,
     ($($arg:expr => $ty:ty, $io:ident),* $(,)?), ($($comptime:expr),* $(,)?)) => {{
        let settings = KernelSettings::new($dim.into(), ExecutionMode::Unchecked, AddressType::U32);
        let mut launcher = KernelLauncher::new(settings.clone());
        launcher.with_scope(|scope| scope.device_properties($client.properties()));
        let kernel = <$kernel>::new(
            settings,
            $client.properties_shared(),
            $client.target_properties_shared(),
            $({
                launcher.declare_io(BufferIOAttr::$io);
                <$ty as LaunchArg>::register($arg, &mut launcher)
            },)*
            $($comptime,)*
        );
        $crate::wgsl_cache::launch(launcher, $count, kernel, $client);
    }};
}
pub(crate) use launch_unchecked_cached;

/// Launches `kernel` as [`KernelLauncher::launch`] does: on a runtime compiling WGSL, unless
/// the [`CacheMode`] is [`CacheMode::Off`], as [`Cached`] (its text from the cache folder, or
/// generated in the process); elsewhere as it is.
///
/// # Safety
/// As the `launch_unchecked` of the kernel: every index it forms is in bounds.
pub(crate) unsafe fn launch<K: CubeKernel>(
    launcher: KernelLauncher,
    count: CubeCount,
    kernel: K,
    client: &Client,
) {
    let dir = match mode() {
        CacheMode::Off => return launcher.launch(count, kernel, client),
        CacheMode::InProcess => None,
        CacheMode::Disk => cache_dir(),
    };
    if client.name() == WGSL_RUNTIME {
        launcher.launch(count, Cached::new(kernel, client, dir), client)
    } else {
        launcher.launch(count, kernel, client)
    }
}

/// How kernels launched through the cache get their WGSL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// Read from the cache folder ([`cache_dir`]), or generated and written to it (generated in
    /// the process when there is no folder). The default.
    Disk,
    /// Generated in the process, the folder neither read nor written: `cargo xtask kernel-test`
    /// runs so, as its sweep of every variant would fill the folder.
    InProcess,
    /// Not through the cache: CubeCL generates the text and builds the pipeline from its IR, as
    /// for any other kernel. `BURN_GGUF_KERNEL_CACHE=off` sets it.
    Off,
}

/// 0: not set (the environment decides), else 1 + the mode's index.
static MODE: AtomicU8 = AtomicU8::new(0);

/// Sets how this process's later pipelines get their WGSL (pipelines already built stay);
/// `None` leaves it to the environment again (see [`mode`]).
pub fn set_mode(mode: Option<CacheMode>) {
    MODE.store(mode.map_or(0, |m| m as u8 + 1), Ordering::Relaxed);
}

/// The mode in force: the one [`set_mode`] set, else [`CacheMode::Off`] when
/// `$BURN_GGUF_KERNEL_CACHE` is `off`, `0` or empty, else [`CacheMode::Disk`].
pub fn mode() -> CacheMode {
    match MODE.load(Ordering::Relaxed) {
        1 => CacheMode::Disk,
        2 => CacheMode::InProcess,
        3 => CacheMode::Off,
        _ => match std::env::var_os("BURN_GGUF_KERNEL_CACHE") {
            Some(v) if v.is_empty() || v == "off" || v == "0" => CacheMode::Off,
            _ => CacheMode::Disk,
        },
    }
}

/// `kernel` with its WGSL from the cache ([`CubeKernel::source`]). Its id is its own (the
/// inner kernel's, hashed), so a process holds its pipeline apart from the inner kernel's.
/// Built on every launch, so it defers all but that hash to [`CubeKernel::source`], which the
/// server calls only to build a pipeline.
pub struct Cached<K> {
    inner: K,
    id: KernelId,
    inner_hash: u128,
    props: std::sync::Arc<DeviceProperties>,
    runtime: &'static str,
    dir: Option<&'static Path>,
}

impl<K: CubeKernel> Cached<K> {
    /// `kernel` for `client`'s device, cached in `dir` (if any).
    pub fn new(kernel: K, client: &Client, dir: Option<&'static Path>) -> Self {
        let inner_id = kernel.id();
        let inner_hash = inner_id.stable_hash();
        let id = KernelId::new::<Self>()
            .address_type(inner_id.address_type)
            .cube_dim(inner_id.cube_dim)
            .mode(inner_id.mode)
            .info(inner_hash);
        Self {
            inner: kernel,
            id,
            inner_hash,
            props: client.properties_shared(),
            runtime: client.name(),
            dir,
        }
    }

    /// The kernel's file in the cache folder: its id's hash with the device's.
    fn file(&self) -> Option<PathBuf> {
        let props = &self.props;
        let key = StableHasher::hash_one(&(
            self.inner_hash,
            props.checksum(),
            &props.identity.name,
            &props.identity.fingerprint,
            self.runtime,
        ));
        Some(self.dir?.join(format!("{key:032x}.wgsl")))
    }

    /// The cached text and entry point, or the kernel generated (and stored).
    fn load_or_generate(&self) -> Option<PrecompiledSource> {
        let file = self.file();
        if let Some(source) = file.as_deref().and_then(read) {
            HITS.fetch_add(1, Ordering::Relaxed);
            return Some(source);
        }
        let definition = define_kernel(&self.inner).ok()?;
        let entrypoint_name = definition.settings.kernel_name.clone();
        // What CubeCL's wgpu runtime sets for its WGSL compiler (`register_wgsl_features`).
        let options = WgpuCompilationOptions {
            supports_u64: self.props.supports_type(ElemType::UInt(UIntKind::U64)),
            ..WgpuCompilationOptions::default()
        };
        let text = cubecl::wgpu::WgslCompiler
            .compile(definition, &options)
            .ok()?
            .to_string();
        if let Some(file) = &file {
            match write(file, &entrypoint_name, &text) {
                Ok(()) => STORED.fetch_add(1, Ordering::Relaxed),
                Err(_) => FAILED.fetch_add(1, Ordering::Relaxed),
            };
        }
        Some(PrecompiledSource {
            source: text,
            entrypoint_name,
            lang: "wgsl",
        })
    }
}

impl<K: CubeKernel> KernelMetadata for Cached<K> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn id(&self) -> KernelId {
        self.id.clone()
    }

    fn address_type(&self) -> ElemType {
        self.inner.address_type()
    }
}

impl<K: CubeKernel> CubeKernel for Cached<K> {
    fn define(&self) -> KernelDefinition {
        self.inner.define()
    }

    fn source(&self) -> Option<PrecompiledSource> {
        let source = self.load_or_generate();
        if source.is_none() {
            // CubeCL compiles the definition itself and reports what failed.
            FAILED.fetch_add(1, Ordering::Relaxed);
        }
        source
    }
}

fn checksum(text: &str) -> u128 {
    StableHasher::hash_one(&text)
}

/// The cached kernel in `file`, if it is whole.
fn read(file: &Path) -> Option<PrecompiledSource> {
    let data = std::fs::read_to_string(file).ok()?;
    let mut lines = data.splitn(4, '\n');
    if lines.next()? != MAGIC {
        return None;
    }
    let entrypoint_name = lines.next()?.strip_prefix("// entry ")?.to_string();
    let sum = u128::from_str_radix(lines.next()?.strip_prefix("// checksum ")?, 16).ok()?;
    let text = lines.next()?;
    (checksum(text) == sum && !entrypoint_name.is_empty()).then(|| PrecompiledSource {
        source: text.to_string(),
        entrypoint_name,
        lang: "wgsl",
    })
}

/// Writes `text` to `file` under a temporary name first, then renames it into place.
fn write(file: &Path, entrypoint_name: &str, text: &str) -> std::io::Result<()> {
    let data = format!(
        "{MAGIC}\n// entry {entrypoint_name}\n// checksum {:032x}\n{text}",
        checksum(text)
    );
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, file).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("wgsl-cache-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("k.wgsl");
        let text = "@compute @workgroup_size(1)\nfn main_1() {}\n";
        write(&file, "main_1", text).unwrap();
        let back = read(&file).expect("a whole file reads back");
        assert_eq!(back.source, text);
        assert_eq!(back.entrypoint_name, "main_1");

        // A changed byte fails the checksum, a truncated file or another version is no entry.
        let data = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, data.replace("main_1() {}", "main_1() { }")).unwrap();
        assert!(read(&file).is_none());
        std::fs::write(&file, &data[..data.len() - 5]).unwrap();
        assert!(read(&file).is_none());
        std::fs::write(&file, data.replace("cache v1", "cache v0")).unwrap();
        assert!(read(&file).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

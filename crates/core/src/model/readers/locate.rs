//! Where a model named by the user lies (docs/formats.md#locating-a-model): a directory, a
//! `.gguf` file, a Hugging Face cache repository (`models--org--name`, one of its snapshots) or a
//! model id (`org/name`) looked up offline in the Hugging Face cache. Nothing is downloaded.
//!
//! The cache is laid out as `huggingface_hub` writes it: `ROOT/models--org--name/refs/<branch or
//! tag>` holds a commit hash, `snapshots/<hash>/` holds the repository's files as symlinks into
//! `blobs/`. `ROOT` is `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.

use std::path::{Path, PathBuf};

/// A model found: the directory (or `.gguf` file) to load, and the name it goes by (a cache
/// hit is named by its id, not by its snapshot's hash).
#[derive(Debug, Clone, PartialEq)]
pub struct Located {
    pub path: PathBuf,
    pub name: Option<String>,
}

/// Which snapshot of a cached repository, and which `.gguf` of a GGUF repository.
#[derive(Debug, Clone, Default)]
pub struct Pick<'a> {
    /// A branch, a tag or a commit hash (`main` when none is given).
    pub revision: Option<&'a str>,
    /// The `.gguf` file of a repository holding several.
    pub gguf_file: Option<&'a str>,
}

/// The Hugging Face cache's root, as `huggingface_hub` resolves it.
pub fn hub_cache_root() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("HF_HUB_CACHE")
        .or_else(|| env("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| env("HOME").map(|h| h.join(".cache/huggingface/hub")))
}

/// Whether `spec` reads as a hub model id: `name` or `org/name`, of the characters the hub
/// allows (letters, digits, `-`, `_`, `.`), not `.` or `..`.
pub fn is_model_id(spec: &str) -> bool {
    let parts: Vec<&str> = spec.split('/').collect();
    (1..=2).contains(&parts.len())
        && parts.iter().all(|p| {
            !p.is_empty()
                && *p != "."
                && *p != ".."
                && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

/// The cache directory of a model id: `models--org--name`.
pub fn repo_dir_name(id: &str) -> String {
    format!("models--{}", id.replace('/', "--"))
}

/// The id of a cache repository directory (`models--org--name` -> `org/name`).
fn id_of_repo_dir(dir: &Path) -> Option<String> {
    let name = dir.file_name()?.to_str()?;
    Some(name.strip_prefix("models--")?.replace("--", "/"))
}

fn is_repo_dir(dir: &Path) -> bool {
    id_of_repo_dir(dir).is_some() && dir.join("snapshots").is_dir()
}

/// A path the user gave, resolved: a `.gguf` file, a cache repository (its snapshot of `pick`'s
/// revision), a snapshot inside one (named by the repository's id), or a directory as it is.
pub fn existing(path: &Path, pick: &Pick) -> Result<Located, String> {
    if path.is_file() {
        return match path.extension().and_then(|e| e.to_str()) {
            Some("gguf") => Ok(Located {
                path: path.to_path_buf(),
                name: path.file_stem().map(|s| s.to_string_lossy().into_owned()),
            }),
            _ => Err(format!("'{}' is a file, not a model: give its directory, or a .gguf file", path.display())),
        };
    }
    if is_repo_dir(path) {
        let id = id_of_repo_dir(path).unwrap_or_default();
        return snapshot(path, &id, pick);
    }
    // A snapshot directory: named by its repository's id, not by its hash.
    let parent = path.parent().filter(|p| p.file_name().is_some_and(|n| n == "snapshots")).and_then(Path::parent);
    if let Some(repo) = parent.filter(|r| is_repo_dir(r)) {
        let id = id_of_repo_dir(repo).unwrap_or_default();
        check_links(path)?;
        return pick_gguf(path, Some(id), pick);
    }
    Ok(Located { path: path.to_path_buf(), name: None })
}

/// A model id in the cache under `root`; a miss says where it looked and how a snapshot gets
/// there.
pub fn in_cache(id: &str, root: Option<&Path>, pick: &Pick) -> Result<Located, String> {
    let Some(root) = root else {
        return Err(format!("'{id}' is not a directory or a named asset, and no Hugging Face cache is set (HF_HUB_CACHE, HF_HOME and HOME are unset)"));
    };
    let repo = root.join(repo_dir_name(id));
    if !repo.is_dir() {
        return Err(format!(
            "'{id}' is not a directory or a named asset, and not in the Hugging Face cache (looked for {}); headscope downloads nothing: \
             put a snapshot there with `huggingface-cli download {id}` (or `hf download {id}`) on a machine online, or set HF_HUB_CACHE to a cache holding it",
            repo.display()
        ));
    }
    snapshot(&repo, id, pick)
}

/// The snapshot of `repo` (a `models--org--name` directory) at the chosen revision.
fn snapshot(repo: &Path, id: &str, pick: &Pick) -> Result<Located, String> {
    let revision = pick.revision.unwrap_or("main");
    if revision.is_empty() || revision.contains("..") || revision.starts_with('/') {
        return Err(format!("revision '{revision}' of '{id}' is not a branch, a tag or a commit hash"));
    }
    let refs = repo.join("refs").join(revision);
    let hash = if refs.is_file() {
        let text = std::fs::read_to_string(&refs).map_err(|e| format!("{}: {e}", refs.display()))?;
        let hash = text.trim().to_string();
        if hash.len() != 40 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!(
                "{}: broken ref: expected a 40-digit commit hash, found {:?}",
                refs.display(),
                text.chars().take(60).collect::<String>()
            ));
        }
        hash
    } else if repo.join("snapshots").join(revision).is_dir() {
        revision.to_string()
    } else {
        let mut have: Vec<String> = std::fs::read_dir(repo.join("refs"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        have.sort();
        return Err(format!(
            "'{id}' has no revision '{revision}' in the Hugging Face cache ({}: refs {}; or give a commit hash of its snapshots)",
            repo.display(),
            if have.is_empty() { "none".to_string() } else { have.join(", ") }
        ));
    };
    let snap = repo.join("snapshots").join(&hash);
    if !snap.is_dir() {
        return Err(format!(
            "{}: points at snapshot {hash}, which is missing from {} (an interrupted download?)",
            refs.display(),
            repo.join("snapshots").display()
        ));
    }
    check_links(&snap)?;
    pick_gguf(&snap, Some(id.to_string()), pick)
}

/// Every file of a snapshot must resolve: a symlink whose blob is missing is named.
fn check_links(snap: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(snap).map_err(|e| format!("{}: {e}", snap.display()))?;
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) && std::fs::metadata(&p).is_err() {
            let target = std::fs::read_link(&p).map(|t| t.display().to_string()).unwrap_or_default();
            return Err(format!(
                "{}: dangling symlink to '{target}' (its blob is missing: re-download the snapshot)",
                p.display()
            ));
        }
    }
    Ok(())
}

/// A snapshot holding `.gguf` files: the one `gguf_file` names, or the only one; else the
/// directory itself.
fn pick_gguf(dir: &Path, name: Option<String>, pick: &Pick) -> Result<Located, String> {
    let mut ggufs: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".gguf"))
                .collect()
        })
        .unwrap_or_default();
    ggufs.sort();
    if let Some(f) = pick.gguf_file {
        if !ggufs.iter().any(|g| g == f) {
            return Err(format!(
                "gguf_file '{f}' is not in {} (it holds: {})",
                dir.display(),
                if ggufs.is_empty() { "no .gguf".into() } else { ggufs.join(", ") }
            ));
        }
        return Ok(Located { path: dir.join(f), name });
    }
    if crate::model::readers::hf::is_hf_dir(dir) || ggufs.is_empty() {
        return Ok(Located { path: dir.to_path_buf(), name });
    }
    if ggufs.len() == 1 {
        return Ok(Located { path: dir.join(&ggufs[0]), name });
    }
    Err(format!(
        "{} holds {} .gguf files ({}): choose one with the option gguf_file",
        dir.display(),
        ggufs.len(),
        ggufs.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_are_told_from_paths() {
        assert!(is_model_id("HuggingFaceTB/SmolLM2-135M"));
        assert!(is_model_id("gpt2"));
        assert!(!is_model_id("a/b/c"));
        assert!(!is_model_id("../x"));
        assert!(!is_model_id("org/"));
        assert!(!is_model_id("a b/c"));
        assert_eq!(repo_dir_name("org/name"), "models--org--name");
        assert_eq!(id_of_repo_dir(Path::new("/x/models--org--na-me")).as_deref(), Some("org/na-me"));
    }
}

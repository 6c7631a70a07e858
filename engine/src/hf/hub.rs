//! A Hugging Face hub id (`org/name`) served from the local hub cache, as `vllm serve org/name`
//! finds it: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, holding
//! `models--org--name/refs/<revision>` (a commit hash) and `snapshots/<commit>/`.
//! Downloading a missing checkpoint is not built: a missing one is an error naming the id, the
//! revision and the folder looked in.

use std::path::{Path, PathBuf};

/// Whether `s` reads as a hub id rather than a path: `org/name` of the hub's characters.
pub fn is_hub_id(s: &str) -> bool {
    let mut parts = s.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// The hub cache folder this process uses.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
}

/// The snapshot folder of `id` at `revision` (a branch or tag name, or a commit hash; `main`
/// when `None`) in the hub cache at `cache`.
pub fn resolve_in(cache: &Path, id: &str, revision: Option<&str>) -> Result<PathBuf, String> {
    let revision = revision.unwrap_or("main");
    let repo = cache.join(format!("models--{}", id.replace('/', "--")));
    let missing = |what: String| {
        format!(
            "{id} (revision {revision}) is not in the local Hugging Face cache: {what} (looked in {}); \
             downloading from the hub is not built here: fetch it first (`huggingface-cli download {id}`) \
             or give its folder",
            repo.display()
        )
    };
    if !revision.is_empty()
        && (revision.contains('/') || revision.contains("..") || revision.starts_with('.'))
    {
        return Err(format!(
            "revision {revision:?} is not a branch, tag or commit name"
        ));
    }
    let commit = if revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit()) {
        revision.to_string()
    } else {
        let r = repo.join("refs").join(revision);
        std::fs::read_to_string(&r)
            .map(|c| c.trim().to_string())
            .map_err(|_| missing(format!("no refs/{revision}")))?
    };
    let snapshot = repo.join("snapshots").join(&commit);
    if snapshot.is_dir() {
        Ok(snapshot)
    } else {
        Err(missing(format!("no snapshots/{commit}")))
    }
}

/// [`resolve_in`] in this process's hub cache.
pub fn resolve(id: &str, revision: Option<&str>) -> Result<PathBuf, String> {
    let cache = cache_dir().ok_or_else(|| {
        format!("{id}: no Hugging Face cache folder (set HF_HUB_CACHE or HF_HOME)")
    })?;
    resolve_in(&cache, id, revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_paths_are_told_apart() {
        assert!(is_hub_id("Qwen/Qwen2.5-0.5B-Instruct"));
        assert!(is_hub_id("meta-llama/Llama-3.2-1B"));
        for path in [
            "model.gguf",
            "./a/b",
            "/abs/dir",
            "a/b/c",
            "a/",
            "../x",
            "a b/c",
        ] {
            assert!(!is_hub_id(path), "{path}");
        }
    }

    #[test]
    fn a_cached_snapshot_resolves_by_ref_or_commit_and_a_missing_one_says_where() {
        let cache = std::env::temp_dir().join(format!("hub-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        let repo = cache.join("models--org--tiny");
        let commit = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), format!("{commit}\n")).unwrap();
        let want = repo.join("snapshots").join(commit);
        assert_eq!(resolve_in(&cache, "org/tiny", None).unwrap(), want);
        assert_eq!(resolve_in(&cache, "org/tiny", Some(commit)).unwrap(), want);
        let err = resolve_in(&cache, "org/tiny", Some("v2")).unwrap_err();
        assert!(
            err.contains("org/tiny (revision v2)") && err.contains("no refs/v2"),
            "{err}"
        );
        assert!(err.contains(&repo.display().to_string()), "{err}");
        let err = resolve_in(&cache, "org/other", None).unwrap_err();
        assert!(err.contains("models--org--other"), "{err}");
        assert!(resolve_in(&cache, "org/tiny", Some("../../etc")).is_err());
        let _ = std::fs::remove_dir_all(&cache);
    }
}

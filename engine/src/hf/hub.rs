//! A Hugging Face hub id (`org/name`) served from the local hub cache, as `vllm serve org/name`
//! finds it: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, holding
//! `models--org--name/refs/<revision>` (a commit hash) and `snapshots/<commit>/`.
//! This module only reads the cache; the gateway downloads what it lacks.

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

/// The folder of `id` in the hub cache at `cache` (`models--org--name`).
pub fn repo_dir(cache: &Path, id: &str) -> PathBuf {
    cache.join(format!("models--{}", id.replace('/', "--")))
}

/// Whether `revision` is a commit hash (which names a snapshot with no ref to read).
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Why a hub id at a revision has no snapshot in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// Not a branch, tag or commit name the cache could hold (`..`, `/`).
    BadRevision,
    /// The cache lacks it; what is missing (`no refs/main`, `no snapshots/<commit>`).
    Absent(String),
}

/// The snapshot folder of `id` at `revision` (a branch or tag name, or a commit hash) in the
/// hub cache at `cache`.
pub fn resolve_in(cache: &Path, id: &str, revision: &str) -> Result<PathBuf, Miss> {
    if revision.is_empty()
        || revision.contains('/')
        || revision.contains("..")
        || revision.starts_with('.')
    {
        return Err(Miss::BadRevision);
    }
    let repo = repo_dir(cache, id);
    let commit = if is_commit(revision) {
        revision.to_string()
    } else {
        let r = repo.join("refs").join(revision);
        std::fs::read_to_string(&r)
            .map(|c| c.trim().to_string())
            .map_err(|_| Miss::Absent(format!("no refs/{revision}")))?
    };
    if !is_commit(&commit) {
        return Err(Miss::Absent(format!(
            "refs/{revision} holds no commit hash"
        )));
    }
    let snapshot = repo.join("snapshots").join(&commit);
    if snapshot.is_dir() {
        Ok(snapshot)
    } else {
        Err(Miss::Absent(format!("no snapshots/{commit}")))
    }
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
        assert_eq!(resolve_in(&cache, "org/tiny", "main").unwrap(), want);
        assert_eq!(resolve_in(&cache, "org/tiny", commit).unwrap(), want);
        let miss = resolve_in(&cache, "org/tiny", "v2").unwrap_err();
        assert_eq!(miss, Miss::Absent("no refs/v2".into()));
        assert_eq!(
            repo_dir(&cache, "org/other"),
            cache.join("models--org--other")
        );
        assert!(matches!(
            resolve_in(&cache, "org/other", "main"),
            Err(Miss::Absent(_))
        ));
        assert_eq!(
            resolve_in(&cache, "org/tiny", "../../etc"),
            Err(Miss::BadRevision)
        );
        let _ = std::fs::remove_dir_all(&cache);
    }
}

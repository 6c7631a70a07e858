//! A Hugging Face hub id as `vllm serve` takes it: `org/name` (or `org/name:QUANT`, a GGUF
//! repository's file of that quantisation) is served from the local hub cache, and when the
//! cache lacks it, downloaded into it first, unless `HF_HUB_OFFLINE` is set.
//!
//! The cache is `--download-dir`, else `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`, laid out as `huggingface_hub` lays it out, so a checkpoint
//! fetched by either is found by the other.

mod download;
mod files;
mod progress;

use std::path::{Path, PathBuf};

pub use download::Hub;

/// A model named by hub id, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSpec<'a> {
    pub id: &'a str,
    /// `QUANT` of `org/name:QUANT`: the GGUF file of that quantisation.
    pub quant: Option<&'a str>,
}

impl<'a> HubSpec<'a> {
    /// `given` as a hub id, or `None` when it reads as a path.
    pub fn parse(given: &'a str) -> Option<Self> {
        let (id, quant) = match given.split_once(':') {
            Some((id, quant)) if files::is_quant(quant) => (id, Some(quant)),
            Some(_) => return None,
            None => (given, None),
        };
        engine::hf::hub::is_hub_id(id).then_some(Self { id, quant })
    }
}

/// A hub id that could not be served; one line naming the id, the revision and the folder.
#[derive(Debug, thiserror::Error)]
#[error("model {id} (revision {revision}): {failure} (cache folder {})", folder.display())]
pub struct HubError {
    pub id: String,
    pub revision: String,
    pub folder: PathBuf,
    pub failure: Box<Failure>,
}

/// What went wrong with a hub id.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("no Hugging Face cache folder: set HF_HUB_CACHE or HF_HOME, or give --download-dir")]
    NoCacheFolder,
    #[error("{0:?} is not a branch, tag or commit name")]
    BadRevision(String),
    #[error(
        "not in the local Hugging Face cache ({0}), and HF_HUB_OFFLINE forbids downloading it"
    )]
    Offline(String),
    #[error("the hub at {endpoint} cannot be reached: {why}")]
    Unreachable { endpoint: String, why: String },
    #[error("the hub at {endpoint} refused access ({status}): the repository does not exist, or it is private or gated; set HF_TOKEN to a token that may read it")]
    Unauthorized { endpoint: String, status: u16 },
    #[error("the hub at {endpoint} has no such repository or revision (404)")]
    NotFound { endpoint: String },
    #[error("the hub at {endpoint} answered {status} to {what}")]
    Status {
        endpoint: String,
        status: u16,
        what: String,
    },
    #[error("the hub's answer about the repository is unusable: {0}")]
    BadAnswer(String),
    #[error("downloading {file} failed: {why}; nothing of it is in the snapshot, and a new start fetches it again")]
    Download { file: String, why: String },
    #[error("downloading {file} stalled: no data for {secs} s (HF_HUB_DOWNLOAD_TIMEOUT); nothing of it is in the snapshot")]
    Stalled { file: String, secs: u64 },
    #[error("{0}")]
    Files(String),
    #[error("writing the cache: {0}")]
    Cache(String),
    #[error("the download stopped on a fault in the hub client (its message is above)")]
    Crashed,
}

/// The local path to load for `spec` at `revision` (`main` when `None`): the snapshot folder,
/// or the GGUF file in it. Downloads what the cache lacks unless `HF_HUB_OFFLINE` is set.
pub fn resolve(
    spec: &HubSpec<'_>,
    revision: Option<&str>,
    download_dir: Option<&Path>,
    hub: &Hub,
) -> Result<PathBuf, HubError> {
    let revision = revision.unwrap_or("main");
    let cache = download_dir
        .map(Path::to_path_buf)
        .or_else(engine::hf::hub::cache_dir);
    let error = |folder: PathBuf, failure: Failure| HubError {
        id: spec.id.to_string(),
        revision: revision.to_string(),
        folder,
        failure: Box::new(failure),
    };
    let Some(cache) = cache else {
        return Err(error(PathBuf::from("(none)"), Failure::NoCacheFolder));
    };
    let folder = engine::hf::hub::repo_dir(&cache, spec.id);
    let missing = match engine::hf::hub::resolve_in(&cache, spec.id, revision) {
        Ok(snapshot) if download::interrupted(&snapshot) => {
            String::from("its snapshot is an interrupted download")
        }
        Ok(snapshot) => match spec.quant {
            None => return Ok(snapshot),
            Some(quant) => match files::cached_gguf(&snapshot, quant) {
                Ok(file) => return Ok(file),
                Err(why) => why,
            },
        },
        Err(engine::hf::hub::Miss::BadRevision) => {
            return Err(error(folder, Failure::BadRevision(revision.to_string())))
        }
        Err(engine::hf::hub::Miss::Absent(why)) => why,
    };
    if offline() {
        return Err(error(folder, Failure::Offline(missing)));
    }
    tracing::info!(
        model = spec.id,
        revision,
        cache = %cache.display(),
        endpoint = hub.endpoint(),
        "not in the local Hugging Face cache ({missing}): downloading"
    );
    hub.fetch(&cache, spec, revision)
        .map_err(|failure| error(folder, failure))
}

/// `HF_HUB_OFFLINE` as `huggingface_hub` reads it: 1, ON, YES or TRUE, any case.
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_with_and_without_a_quantisation_and_paths() {
        assert_eq!(
            HubSpec::parse("org/name"),
            Some(HubSpec {
                id: "org/name",
                quant: None
            })
        );
        assert_eq!(
            HubSpec::parse("unsloth/Qwen3-0.6B-GGUF:Q4_K_M"),
            Some(HubSpec {
                id: "unsloth/Qwen3-0.6B-GGUF",
                quant: Some("Q4_K_M")
            })
        );
        for path in [
            "./model",
            "/abs/dir",
            "a/b/c",
            "org/name:",
            "org/name:../x",
            "c:/x",
        ] {
            assert_eq!(HubSpec::parse(path), None, "{path}");
        }
    }
}

//! Which way a checkpoint is served, decided as vLLM decides it from `--runner` and
//! `--convert`: a decoder generates unless a pooling runner is asked for or its
//! sentence-transformers files name a Pooling module (Qwen3-Embedding's `Qwen3ForCausalLM`);
//! an architecture that only embeds (`Qwen3Model`, `LlamaModel`) and an encoder pool.

use std::path::Path;

use super::{detect, CheckpointKind};
use crate::error::{EngineError, Result};
use crate::hf::{HfConfig, SentenceTransformersConfig};

/// vLLM's `--runner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Runner {
    #[default]
    Auto,
    Generate,
    Pooling,
}

/// vLLM's `--convert`, as far as it is built: a decoder into an embedding model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Convert {
    #[default]
    Auto,
    None,
    Embed,
}

/// How every model of a deployment is to be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunAs {
    pub runner: Runner,
    pub convert: Convert,
}

impl std::str::FromStr for Runner {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Runner::Auto),
            "generate" => Ok(Runner::Generate),
            "pooling" => Ok(Runner::Pooling),
            other => Err(format!(
                "--runner {other}: not built (supported: auto, generate, pooling)"
            )),
        }
    }
}

impl std::str::FromStr for Convert {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Convert::Auto),
            "none" => Ok(Convert::None),
            "embed" => Ok(Convert::Embed),
            other => Err(format!(
                "--convert {other}: converting a decoder into a {other} model is not built (supported: auto, none, embed)"
            )),
        }
    }
}

/// What `path` is served as under `run`: [`detect`]'s kind, with a decoder folder turned into
/// [`CheckpointKind::DecoderEmbedder`] when it is to pool. A combination vLLM refuses, or one
/// this server does not build, is a load error naming the flags.
pub fn served_kind(path: &Path, run: RunAs) -> Result<CheckpointKind> {
    let kind = detect(path);
    let fail = |reason: String| EngineError::load(path.display().to_string(), reason);
    let pooling = match run.runner {
        Runner::Pooling => true,
        Runner::Generate => false,
        Runner::Auto => run.convert == Convert::Embed || pools_by_default(path, kind)?,
    };
    match (kind, pooling, run.convert) {
        (CheckpointKind::Unknown, ..) => Ok(kind),
        (_, false, Convert::Embed) => Err(fail(
            "--convert embed serves a model for pooling: it goes with --runner pooling (or auto), not --runner generate".into(),
        )),
        (CheckpointKind::Gguf | CheckpointKind::Decoder, false, _) => Ok(kind),
        (CheckpointKind::Encoder | CheckpointKind::DecoderEmbedder, false, _) => Err(fail(
            "Embedding models do not support `--runner generate`. Use `--runner pooling` or `--runner auto` for embedding models.".into(),
        )),
        (CheckpointKind::Gguf, true, _) => Err(fail(
            "--runner pooling: serving a GGUF decoder as an embedding model is not built (an HF folder is)".into(),
        )),
        (CheckpointKind::Decoder, true, Convert::None) => Err(fail(format!(
            "--runner pooling --convert none: `{}` is a generative model; it pools with --convert embed (or auto)",
            architecture(path)
        ))),
        (CheckpointKind::Decoder, true, _) => Ok(CheckpointKind::DecoderEmbedder),
        (CheckpointKind::Encoder | CheckpointKind::DecoderEmbedder, true, _) => Ok(kind),
    }
}

/// vLLM's `--runner auto`: a folder whose sentence-transformers files name a Pooling module
/// pools (some embedding models name a `*ForCausalLM`); otherwise the architecture decides.
fn pools_by_default(path: &Path, kind: CheckpointKind) -> Result<bool> {
    Ok(match kind {
        CheckpointKind::Encoder | CheckpointKind::DecoderEmbedder => true,
        CheckpointKind::Decoder => SentenceTransformersConfig::from_dir(path)?
            .pooling
            .is_some(),
        CheckpointKind::Gguf | CheckpointKind::Unknown => false,
    })
}

fn architecture(path: &Path) -> String {
    HfConfig::from_dir(path)
        .map(|c| c.architecture().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(tag: &str, arch: &str, pooling: bool) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("engine-runner-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        std::fs::write(
            dir.join("config.json"),
            format!(r#"{{"architectures": ["{arch}"], "model_type": "qwen3"}}"#),
        )
        .unwrap();
        if pooling {
            std::fs::write(
                dir.join("modules.json"),
                r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
                    {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#,
            )
            .unwrap();
            std::fs::write(
                dir.join("1_Pooling/config.json"),
                r#"{"pooling_mode_lasttoken": true}"#,
            )
            .unwrap();
        }
        dir
    }

    fn run(runner: Runner, convert: Convert) -> RunAs {
        RunAs { runner, convert }
    }

    #[test]
    fn a_decoder_pools_by_its_files_or_the_flags() {
        use CheckpointKind::{Decoder, DecoderEmbedder};
        let plain = folder("plain", "Qwen3ForCausalLM", false);
        let st = folder("st", "Qwen3ForCausalLM", true);
        let auto = RunAs::default();
        assert_eq!(served_kind(&plain, auto).unwrap(), Decoder);
        assert_eq!(served_kind(&st, auto).unwrap(), DecoderEmbedder);
        let pooling = run(Runner::Pooling, Convert::Auto);
        assert_eq!(served_kind(&plain, pooling).unwrap(), DecoderEmbedder);
        let embed = run(Runner::Auto, Convert::Embed);
        assert_eq!(served_kind(&plain, embed).unwrap(), DecoderEmbedder);
        // The sentence-transformers files do not stop a generate runner.
        let generate = run(Runner::Generate, Convert::Auto);
        assert_eq!(served_kind(&st, generate).unwrap(), Decoder);
        for dir in [plain, st] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn refusals_name_the_flags() {
        let bare = folder("bare", "Qwen3Model", false);
        let plain = folder("refuse", "Qwen3ForCausalLM", false);
        let err = |dir: &Path, r: Runner, c: Convert| {
            served_kind(dir, run(r, c)).unwrap_err().to_string()
        };
        assert_eq!(
            served_kind(&bare, RunAs::default()).unwrap(),
            CheckpointKind::DecoderEmbedder
        );
        let e = err(&bare, Runner::Generate, Convert::Auto);
        assert!(e.contains("do not support `--runner generate`"), "{e}");
        let e = err(&plain, Runner::Generate, Convert::Embed);
        assert!(
            e.contains("--convert embed") && e.contains("--runner generate"),
            "{e}"
        );
        let e = err(&plain, Runner::Pooling, Convert::None);
        assert!(
            e.contains("--convert none") && e.contains("Qwen3ForCausalLM"),
            "{e}"
        );
        assert!("classify".parse::<Convert>().is_err());
        assert!("draft".parse::<Runner>().is_err());
        for dir in [bare, plain] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

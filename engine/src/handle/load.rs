//! From a model path to a loaded checkpoint: GGUF files, HF decoder and encoder folders.

use std::path::Path;

use super::LoadedModel;
use crate::error::{EngineError, Result};

/// Dispatch a model path to its loader.
pub(super) fn load(path: &str) -> Result<LoadedModel> {
    let p = Path::new(path);
    if !p.exists() {
        return Err(EngineError::load(path, "no such file or directory"));
    }
    match crate::hf::detect(p) {
        crate::hf::CheckpointKind::Gguf => {
            let file = if p.is_dir() {
                single_gguf(p)?
            } else {
                p.to_path_buf()
            };
            Ok(LoadedModel::Decoder(crate::gguf::load_decoder(&file)?))
        }
        crate::hf::CheckpointKind::Encoder => {
            let encoder = crate::hf::load_encoder(p)?;
            Ok(LoadedModel::Encoder {
                encoder,
                chat_template: crate::hf::read_chat_template(p),
            })
        }
        crate::hf::CheckpointKind::Decoder => Ok(LoadedModel::Decoder(crate::hf::load_decoder(p)?)),
        crate::hf::CheckpointKind::Unknown => Err(EngineError::load(
            path,
            "not a recognised model: expected a .gguf file or an HF folder with config.json",
        )),
    }
}

fn single_gguf(dir: &Path) -> Result<std::path::PathBuf> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| EngineError::load(dir.display().to_string(), e.to_string()))?;
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
        .ok_or_else(|| EngineError::load(dir.display().to_string(), "no .gguf file in the folder"))
}

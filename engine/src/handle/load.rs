//! From a model path to a loaded checkpoint: GGUF files, HF decoder and encoder folders.

use std::path::Path;

use super::{EngineConfig, LoadedModel, ModelSpec};
use crate::error::{EngineError, Result};
use crate::load::CheckpointKind;
use crate::weight_cache::{CacheRequest, CachedDevice, LoadFormat, WeightsSource};

/// Dispatch a model to its loader as `--load-format` says, and say which path loaded it (a
/// log line and the weights-source gauge). `device` is where the model will run. With the
/// model, the device weights a GPU weight cache handed over, for the bring-up to map.
pub(super) fn load(
    spec: &ModelSpec,
    config: &EngineConfig,
    device: &str,
) -> Result<(LoadedModel, Option<CachedDevice>)> {
    let path = spec.path.as_str();
    let p = Path::new(path);
    if !p.exists() {
        return Err(EngineError::load(path, "no such file or directory"));
    }
    let kind = crate::load::served_kind(p, config.run_as)?;
    let reason = match config.load_format {
        LoadFormat::Auto => "load format auto".to_string(),
        LoadFormat::Gguf if kind == CheckpointKind::Gguf => "load format gguf".to_string(),
        LoadFormat::Safetensors
            if matches!(
                kind,
                CheckpointKind::Encoder | CheckpointKind::Decoder | CheckpointKind::DecoderEmbedder
            ) =>
        {
            "load format safetensors".to_string()
        }
        LoadFormat::Gguf | LoadFormat::Safetensors => {
            return Err(EngineError::load(
                path,
                format!(
                    "--load-format {} does not match this checkpoint",
                    config.load_format
                ),
            ))
        }
        LoadFormat::IpcCache if kind == CheckpointKind::DecoderEmbedder => {
            return Err(EngineError::load(
                path,
                "--load-format ipc_cache: the weight cache serves decoders for generation, and this one is served as an embedding model (use --load-format auto)",
            ))
        }
        LoadFormat::IpcCache => {
            let req = CacheRequest {
                served_name: &spec.served_name,
                config: &config.loader,
                dtype: config.dtype,
                device,
            };
            match crate::weight_cache::load_decoder(p, &req)? {
                Ok((decoder, source, device)) => {
                    announce(spec, &source);
                    return Ok((LoadedModel::Decoder(decoder), device));
                }
                Err(why) => why,
            }
        }
    };
    let model = load_from_disk(path, p, kind)?;
    announce(spec, &WeightsSource::Disk { reason });
    Ok((model, None))
}

fn announce(spec: &ModelSpec, source: &WeightsSource) {
    source.log(&spec.served_name);
    crate::metrics::weights_source(&spec.served_name, source.label());
}

fn load_from_disk(path: &str, p: &Path, kind: CheckpointKind) -> Result<LoadedModel> {
    match kind {
        crate::load::CheckpointKind::Gguf => {
            let file = if p.is_dir() {
                crate::gguf::single_gguf(p)?
            } else {
                p.to_path_buf()
            };
            Ok(LoadedModel::Decoder(crate::load::load_gguf_decoder(&file)?))
        }
        crate::load::CheckpointKind::Encoder => {
            let encoder = crate::load::load_encoder(p)?;
            Ok(LoadedModel::Encoder {
                encoder,
                chat_template: crate::hf::read_chat_template(p),
            })
        }
        crate::load::CheckpointKind::Decoder => {
            Ok(LoadedModel::Decoder(crate::load::load_hf_decoder(p)?))
        }
        crate::load::CheckpointKind::DecoderEmbedder => Ok(LoadedModel::Encoder {
            encoder: crate::load::load_decoder_embedder(p)?,
            chat_template: crate::hf::read_chat_template(p),
        }),
        crate::load::CheckpointKind::Unknown => Err(EngineError::load(
            path,
            "not a recognised model: expected a .gguf file or an HF folder with config.json",
        )),
    }
}

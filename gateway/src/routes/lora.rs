//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`, served only when
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING` is true (otherwise they are unknown routes, as in vLLM).
//! Answers are vLLM's: a plain-text success line, a 400 naming the adapter and the reason, a
//! 404 for unloading an unknown name. With several models served, a loaded adapter attaches
//! to the one its `adapter_config.json` records as its base (`engine::lora::base`).

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::http::extract::ValidJson;
use crate::state::AppState;

#[derive(Debug, Deserialize)]
pub struct LoadRequest {
    #[serde(default)]
    lora_name: String,
    #[serde(default)]
    lora_path: String,
    /// vLLM's in-place reload of a loaded name: refused, so that a name never changes its
    /// weights under requests that picked it.
    #[serde(default)]
    load_inplace: bool,
    /// vLLM's flag for MoE adapters saved with fused 3-D expert tensors. The decoders here
    /// have no experts, so `false` is what every adapter they run is; `true` is refused.
    #[serde(default)]
    is_3d_lora_weight: bool,
}

#[derive(Debug, Deserialize)]
pub struct UnloadRequest {
    #[serde(default)]
    lora_name: String,
}

pub async fn load(
    State(state): State<Arc<AppState>>,
    ValidJson(req): ValidJson<LoadRequest>,
) -> ApiResult<String> {
    if req.lora_name.is_empty() || req.lora_path.is_empty() {
        return Err(ApiError::bad_request(
            "Both 'lora_name' and 'lora_path' must be provided.",
            None,
        ));
    }
    if req.load_inplace {
        return Err(ApiError::bad_request(
            "load_inplace is not supported: unload the adapter, then load it again",
            Some("load_inplace"),
        ));
    }
    if req.is_3d_lora_weight {
        return Err(ApiError::bad_request(
            "is_3d_lora_weight: no served model has MoE experts, so no adapter here has fused 3-D expert weights",
            Some("is_3d_lora_weight"),
        ));
    }
    if state.served.primary(&req.lora_name).is_some() {
        return Err(engine::lora::LoraError::NameTaken(req.lora_name).into());
    }
    let shared = state.clone();
    let name = req.lora_name.clone();
    // Reading the factors is file work: off the async workers. The base is the served model
    // the adapter's recorded base names, by any of its names (aliases, the id it was given
    // as), not just the engine's.
    let base = tokio::task::spawn_blocking(move || {
        let other_names = |served: &str| {
            shared
                .served
                .model(served)
                .map(|m| m.names.iter().chain([&m.given]).cloned().collect())
                .unwrap_or_default()
        };
        shared
            .engine
            .load_lora_matching(&name, &PathBuf::from(&req.lora_path), &other_names)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("the adapter load did not finish: {e}")))??;
    tracing::info!(lora = %req.lora_name, base = %base, "LoRA adapter attached");
    Ok(format!(
        "Success: LoRA adapter '{}' added successfully.",
        req.lora_name
    ))
}

pub async fn unload(
    State(state): State<Arc<AppState>>,
    ValidJson(req): ValidJson<UnloadRequest>,
) -> ApiResult<String> {
    if req.lora_name.is_empty() {
        return Err(ApiError::bad_request(
            "'lora_name' needs to be provided to unload a LoRA adapter.",
            None,
        ));
    }
    state.engine.unload_lora(&req.lora_name)?;
    Ok(format!(
        "Success: LoRA adapter '{}' removed successfully.",
        req.lora_name
    ))
}

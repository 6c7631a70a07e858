//! `/v1/models`, `/health`, `/ping`, `/version`, `/metrics`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{task_name, AppStateRef};
use crate::protocol::now_secs;

pub async fn models(State(state): AppStateRef) -> Json<Value> {
    let created = now_secs();
    let data: Vec<Value> = state
        .engine
        .models()
        .iter()
        .flat_map(|card| {
            let served = state.served.model(&card.name);
            let root = served.map_or(card.root.as_str(), |m| m.given.as_str());
            let names = served.map_or_else(|| vec![card.name.clone()], |m| m.names.clone());
            names.into_iter().map(move |name| (card, name, root))
        })
        .map(|(card, name, root)| {
            let limits: serde_json::Map<String, Value> = card
                .input_modalities
                .iter()
                .filter(|m| m.as_str() != "text")
                .map(|m| (m.clone(), json!(state.limits.limit_for(m))))
                .collect();
            json!({
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": null,
                "max_model_len": card.max_model_len,
                "permission": [],
                "device": card.device,
                "input_modalities": card.input_modalities,
                "tasks": card.tasks.iter().map(|t| task_name(*t)).collect::<Vec<_>>(),
                "limit_mm_per_prompt": limits,
                // Ours, for `gateway upgrade-check`: what the deployment applies to every
                // request (CONTRACT section 3) and the width of the vectors it embeds.
                "mm_processor_kwargs": state.defaults.mm_processor_kwargs,
                "media_io_kwargs": state.defaults.media_io_kwargs,
                "embedding_size": state.engine.model(&card.name).and_then(|m| m.hidden_size()),
            })
        })
        .chain(state.engine.adapter_cards().into_iter().map(|a| {
            // As vLLM lists an adapter: its folder as `root`, its base as `parent`.
            json!({
                "id": a.name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": a.root,
                "parent": a.parent,
                "max_model_len": a.max_model_len,
                "permission": [],
            })
        }))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

pub async fn health(State(state): AppStateRef) -> StatusCode {
    let draining = state.draining.load(std::sync::atomic::Ordering::SeqCst);
    if state.engine.is_healthy() && !draining {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

pub async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

pub async fn metrics(State(state): AppStateRef) -> Response {
    // The budgets are atomics the requests update; they are read as the scrape comes.
    let budgets = [
        ("requests", Some(&state.request_memory)),
        (
            "fetched_media",
            state.media.as_ref().map(|m| m.fetcher().fetched_bytes()),
        ),
        (
            "decoded_media",
            state.media.as_ref().map(|m| m.decoded_bytes()),
        ),
    ];
    for (budget, held) in budgets {
        if let Some(held) = held {
            let labels = [("budget", budget)];
            metrics::gauge!("gateway_memory_budget_in_use_bytes", &labels)
                .set(held.in_use() as f64);
            metrics::gauge!("gateway_memory_budget_capacity_bytes", &labels)
                .set(held.capacity() as f64);
        }
    }
    match &state.metrics {
        Some(handle) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            handle.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

//! The weight cache: the `preload` daemon's health endpoint, and the deployment's word that its
//! generating models' weights came from `ipc_cache` rather than disk. This server says so in
//! the series `gateway:weights_source{model_name, source}` of `/metrics` (1 for the path that
//! loaded each model: `disk` or `ipc_cache`); embedding models always load from disk.

use std::time::Duration;

use contract::cases::metrics::parse_exposition;
use contract::http::{Client, RequestSpec};
use contract::models::Models;

use super::rows::{Row, Status};

const SECTION: &str = "weight-cache";
const WEIGHTS_SOURCE: &str = "gateway:weights_source";

/// `GET` the daemon's health URL: 200 once every part is ready, 503 otherwise.
pub async fn health_row(url: &str, timeout: Duration) -> Row {
    let check = "daemon health";
    let outcome = async {
        let http = Client::new(url, None, timeout).map_err(|e| e.to_string())?;
        let reply = http
            .send(&RequestSpec::get(""))
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        match reply.status {
            200 => Ok(format!("GET {url} answered 200: every part ready")),
            status => Err(format!("GET {url} answered {status}: not ready")),
        }
    }
    .await;
    Row::judged(SECTION, check, outcome)
}

/// A row per generating model: its weights came from `ipc_cache`.
pub async fn source_rows(client: &Client, models: &Models) -> Vec<Row> {
    let generating: Vec<&str> = models
        .cards
        .iter()
        .filter(|card| card.generates())
        .map(|card| card.id.as_str())
        .collect();
    if generating.is_empty() {
        return vec![Row::new(
            SECTION,
            "weights from ipc_cache",
            Status::Fail,
            "the deployment lists no generating model",
        )];
    }
    let samples = match client.send(&RequestSpec::get("/metrics")).await {
        Ok(reply) if reply.status == 200 => parse_exposition(&reply.text()),
        Ok(reply) => Err(format!("GET /metrics answered {}", reply.status)),
        Err(err) => Err(err.to_string()),
    };
    generating
        .into_iter()
        .map(|model| {
            let check = format!("{model} weights from ipc_cache");
            let outcome = samples.as_ref().map_err(Clone::clone).and_then(|samples| {
                let sources: Vec<&str> = samples
                    .iter()
                    .filter(|s| s.name == WEIGHTS_SOURCE && s.value == 1.0)
                    .filter(|s| s.labels.get("model_name").map(String::as_str) == Some(model))
                    .filter_map(|s| s.labels.get("source").map(String::as_str))
                    .collect();
                match sources.as_slice() {
                    ["ipc_cache"] => Ok(format!("{WEIGHTS_SOURCE} says source=\"ipc_cache\"")),
                    [] => Err(format!(
                        "/metrics has no {WEIGHTS_SOURCE} series for it: the deployment does \
                         not say where its weights came from"
                    )),
                    other => Err(format!(
                        "loaded from {}, not from the daemon",
                        other.join(", ")
                    )),
                }
            });
            Row::judged(SECTION, check, outcome)
        })
        .collect()
}

/// The row when no weight cache is configured.
pub fn not_configured() -> Row {
    Row::new(
        SECTION,
        "weight cache",
        Status::Skip,
        "not configured (no --weight-cache-health, no --load-format ipc_cache)",
    )
}

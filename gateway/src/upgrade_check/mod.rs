//! `gateway upgrade-check`: the upgrade's acceptance checks against one deployment (this
//! server or vLLM 0.31), as one pass/fail table with a row per condition:
//!
//! - `config` ([`review`]): the deployment's `vllm serve` arguments and `--config` YAML judged
//!   by the flag table, a row per removed, renamed, refused, no-effect or deprecated flag;
//! - `contract` ([`trust`]): the gate matrix per route the deployment serves;
//! - `trust` ([`trust`]): whether it trusts request kwargs, against its configuration, and
//!   the deployment-level kwargs its model cards say it applies;
//! - `weight-cache` ([`weights`]): the daemon's health and the deployment's word that its
//!   weights came from `ipc_cache`;
//! - `router`: the gauges Kubernetes inference routers scrape ([`contract::cases::router`]);
//! - `output` ([`output`]): a real request per served model, its answer checked.
//!
//! Exit 0 only when no row failed; `--json FILE` writes the rows for CI.

pub mod output;
pub mod review;
pub mod rows;
pub mod trust;
pub mod weights;

use std::process::ExitCode;
use std::time::Duration;

use contract::cases::{router, Ctx};
use contract::expect::summarize;
use contract::http::{Client, RequestSpec};
use contract::models::Models;
use contract::SuiteConfig;
use serde_json::Value;

use crate::cli::UpgradeCheckArgs;
use rows::{Row, Status, Table};
use trust::Expected;

/// Runs the check, prints the table, writes `--json`; exit 0 only when every row passed
/// (warnings and skips included), 1 when one failed, 2 when the JSON cannot be written.
pub async fn run(args: UpgradeCheckArgs) -> ExitCode {
    let table = check(&args).await;
    print!("{}", table.render());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&table.to_json()).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if table.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Every row, in the table's order.
pub async fn check(args: &UpgradeCheckArgs) -> Table {
    let mut rows = Vec::new();
    let tokens = match review::tokens(args.config.as_deref(), &args.serve_args) {
        Ok(tokens) => {
            rows.extend(review::review(&tokens));
            tokens
        }
        Err(why) => {
            rows.push(Row::new("config", "--config", Status::Fail, why));
            Vec::new()
        }
    };
    let mut cfg = SuiteConfig::new(args.base_url.clone());
    cfg.api_key = args
        .api_key
        .clone()
        .or_else(|| review::last_value(&tokens, "api-key"));
    let timeout = Duration::from_secs(args.timeout_s.max(1));
    cfg.request_timeout = timeout;
    let client = match Client::new(&cfg.normalized_base_url(), cfg.effective_api_key(), timeout) {
        Ok(client) => client,
        Err(err) => {
            rows.push(Row::new(
                "deployment",
                "HTTP client",
                Status::Fail,
                err.to_string(),
            ));
            return Table { rows };
        }
    };
    let listing = match list_models(&client).await {
        Ok(listing) => listing,
        Err(why) => {
            rows.push(Row::new("deployment", "GET /v1/models", Status::Fail, why));
            return Table { rows };
        }
    };
    let models = Models::from_listing(&listing, &cfg);
    if let Some(why) = &models.error {
        rows.push(Row::new(
            "deployment",
            "GET /v1/models",
            Status::Fail,
            why.clone(),
        ));
        return Table { rows };
    }
    deployment_rows(
        &mut rows, args, &tokens, &cfg, &client, &models, &listing, timeout,
    )
    .await;
    Table { rows }
}

#[allow(clippy::too_many_arguments)] // the sections share what discovery found
async fn deployment_rows(
    rows: &mut Vec<Row>,
    args: &UpgradeCheckArgs,
    tokens: &[String],
    cfg: &SuiteConfig,
    client: &Client,
    models: &Models,
    listing: &Value,
    timeout: Duration,
) {
    let ctx = Ctx::new(cfg.clone(), models.clone());
    let observed = trust::observe(client, &ctx).await;
    rows.extend(trust::contract_rows(client, cfg, models, observed.clone().ok()).await);
    rows.push(trust::trust_row(&observed, &expected_trust(tokens)));
    rows.push(trust::kwargs_row(
        models,
        listing,
        &json_flag(tokens, "mm-processor-kwargs"),
        &json_flag(tokens, "media-io-kwargs"),
    ));

    let ipc_cache = review::last_value(tokens, "load-format").as_deref() == Some("ipc_cache");
    if let Some(url) = &args.weight_cache_health {
        rows.push(weights::health_row(url, timeout).await);
    }
    if ipc_cache || args.weight_cache_health.is_some() {
        rows.extend(weights::source_rows(client, models).await);
    } else {
        rows.push(weights::not_configured());
    }

    let outcome = router::check(client, models.chat.as_deref()).await;
    rows.push(Row::judged(
        "router",
        "GET /metrics router gauges",
        match outcome.failures.first() {
            None => Ok(outcome.got),
            Some(first) => Err(first.clone()),
        },
    ));

    rows.extend(output::rows(client, models, listing).await);
}

async fn list_models(client: &Client) -> Result<Value, String> {
    let reply = client
        .send(&RequestSpec::get("/v1/models"))
        .await
        .map_err(|e| e.to_string())?;
    match (&reply.json, reply.status) {
        (Some(listing), 200) => Ok(listing.clone()),
        _ => Err(format!("answered {}", summarize(&reply))),
    }
}

/// What the configuration says of request kwargs.
fn expected_trust(tokens: &[String]) -> Expected {
    let on = |name: &str| {
        review::last_value(tokens, name).is_some_and(|v| !matches!(v.as_str(), "false" | ""))
    };
    if review::last_value(tokens, "trusted-client-policy").is_some() {
        Expected::PerKey
    } else if on("trust-request-mm-kwargs") {
        Expected::Trusted
    } else {
        Expected::Refused
    }
}

/// A JSON flag's value (`null` when absent; the text itself when it is not JSON, so that the
/// comparison shows it).
fn json_flag(tokens: &[String], name: &str) -> Value {
    match review::last_value(tokens, name) {
        None => Value::Null,
        Some(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn an_unreachable_deployment_and_a_missing_config_are_failing_rows() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(9);
        let args = UpgradeCheckArgs {
            base_url: format!("http://127.0.0.1:{port}"),
            api_key: None,
            config: Some("no-such-deployment.yaml".into()),
            weight_cache_health: None,
            json: None,
            timeout_s: 5,
            serve_args: Vec::new(),
        };
        let table = check(&args).await;
        let failed: Vec<(&str, &str)> = table
            .rows
            .iter()
            .filter(|r| r.status == Status::Fail)
            .map(|r| (r.section, r.check.as_str()))
            .collect();
        assert_eq!(
            failed,
            [("config", "--config"), ("deployment", "GET /v1/models")],
            "{}",
            table.render()
        );
        assert!(!table.passed());
        assert!(table.rows[0].detail.contains("no-such-deployment.yaml"));
    }

    #[test]
    fn trust_and_kwargs_are_read_from_the_command_line() {
        assert_eq!(expected_trust(&[]), Expected::Refused);
        let trusted = strings(&["--trust_request_mm_kwargs"]);
        assert_eq!(expected_trust(&trusted), Expected::Trusted);
        let off = strings(&["--trust-request-mm-kwargs", "--no-trust-request-mm-kwargs"]);
        assert_eq!(expected_trust(&off), Expected::Refused);
        let policy = strings(&["--trusted-client-policy", "p.yaml"]);
        assert_eq!(expected_trust(&policy), Expected::PerKey);
        let media = strings(&["--media-io-kwargs", r#"{"video": {"num_frames": 40}}"#]);
        assert_eq!(
            json_flag(&media, "media-io-kwargs"),
            serde_json::json!({"video": {"num_frames": 40}})
        );
        assert_eq!(json_flag(&media, "mm-processor-kwargs"), Value::Null);
    }
}

//! Runs the cases concurrently (bounded) and collects the report.

use futures::stream::{self, StreamExt};

use crate::cases::{self, Case, CaseKind, Ctx};
use crate::config::SuiteConfig;
use crate::expect::summarize;
use crate::http::Client;
use crate::models;
use crate::report::{CaseResult, Report};

/// Runs the whole suite against `cfg.base_url`.
pub async fn run(cfg: &SuiteConfig) -> Report {
    let client = match Client::new(
        &cfg.normalized_base_url(),
        cfg.effective_api_key(),
        cfg.request_timeout,
    ) {
        Ok(client) => client,
        Err(err) => {
            return Report {
                cases: vec![CaseResult {
                    name: "suite setup".into(),
                    route: "-".into(),
                    passed: false,
                    expected: "an HTTP client".into(),
                    got: err.to_string(),
                    detail: err.to_string(),
                }],
            }
        }
    };
    let models = models::discover(&client, cfg).await;
    tracing::info!(
        chat = ?models.chat,
        embedding = ?models.embedding,
        classifier = ?models.classifier,
        "contract suite: models"
    );
    let ctx = Ctx::new(cfg.clone(), models);
    run_cases(&client, cases::all(&ctx), cfg.concurrency).await
}

/// Runs `cases` with at most `concurrency` in flight; results keep the cases' order.
pub async fn run_cases(client: &Client, cases: Vec<Case>, concurrency: usize) -> Report {
    let mut results: Vec<(usize, CaseResult)> =
        stream::iter(cases.into_iter().enumerate().map(|(index, case)| {
            let client = client.clone();
            async move { (index, execute(client, case).await) }
        }))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    results.sort_by_key(|(index, _)| *index);
    Report {
        cases: results.into_iter().map(|(_, result)| result).collect(),
    }
}

/// Runs one case.
pub async fn execute(client: Client, case: Case) -> CaseResult {
    let Case { name, route, kind } = case;
    let (expected, got, failures) = match kind {
        CaseKind::Single { request, expect } => match client.send(&request).await {
            Ok(reply) => (
                expect.summary.clone(),
                summarize(&reply),
                expect.evaluate(&reply),
            ),
            Err(err) => (
                expect.summary.clone(),
                err.to_string(),
                vec![err.to_string()],
            ),
        },
        CaseKind::Flow { expected, run } => {
            let outcome = run(client).await;
            (expected, outcome.got, outcome.failures)
        }
        CaseKind::Decided { expected, outcome } => (expected, outcome.got, outcome.failures),
    };
    tracing::debug!(case = %name, passed = failures.is_empty(), "contract case");
    CaseResult {
        name,
        route,
        passed: failures.is_empty(),
        expected,
        got,
        detail: failures.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::expect::{status_is, Expect};
    use crate::http::RequestSpec;

    #[tokio::test]
    async fn transport_failures_are_recorded_and_order_is_kept() {
        let port = match std::net::TcpListener::bind("127.0.0.1:0") {
            Ok(listener) => listener.local_addr().map(|a| a.port()).unwrap_or(9),
            Err(err) => panic!("bind: {err}"),
        };
        let client = match Client::new(
            &format!("http://127.0.0.1:{port}"),
            None,
            Duration::from_secs(5),
        ) {
            Ok(client) => client,
            Err(err) => panic!("client: {err}"),
        };
        let cases = vec![
            Case::single(
                "unreachable",
                RequestSpec::get("/health"),
                Expect::new("200").with(status_is(200)),
            ),
            Case::decided("known good", "-", "nothing", Ok("fine".into())),
            Case::decided("known bad", "-", "a model", Err("no model".into())),
        ];
        let report = run_cases(&client, cases, 2).await;
        let names: Vec<&str> = report.cases.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["unreachable", "known good", "known bad"]);
        assert!(!report.cases[0].passed);
        assert!(
            report.cases[0].got.contains("request failed"),
            "{:?}",
            report.cases[0]
        );
        assert_eq!(report.cases[0].route, "GET /health");
        assert!(report.cases[1].passed);
        assert!(!report.cases[2].passed);
        assert_eq!(report.cases[2].detail, "no model");
        assert!(!report.all_passed());
    }
}

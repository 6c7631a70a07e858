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
    let results = stream::iter(cases.into_iter().map(|case| execute(client.clone(), case)))
        .buffered(concurrency.max(1))
        .collect()
        .await;
    Report { cases: results }
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

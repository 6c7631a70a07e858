//! The deployment's trust in request kwargs, observed and compared with its configuration, and
//! the client contract per route it serves, run in the mode observed (so that a deployment
//! trusting everyone fails the trust row, not every route's row).

use std::collections::BTreeMap;

use contract::cases::{gate, Ctx};
use contract::expect::{summarize, Expect, GateField};
use contract::http::{Client, RequestSpec};
use contract::models::Models;
use contract::routes::Route;
use contract::{ServerMode, SuiteConfig};
use serde_json::{json, Value};

use super::rows::{Row, Status};

/// What a request carrying benign non-empty `mm_processor_kwargs` got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Refused with the gate's 400: vLLM 0.31's default.
    Refused,
    /// Served.
    Trusted,
}

/// What the configuration asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    Refused,
    Trusted,
    /// `--trusted-client-policy`: it depends on the key.
    PerKey,
}

/// The route the probe uses: the first gated route with a model to name.
fn probe_route(ctx: &Ctx) -> Option<(Route, String)> {
    Route::GATED
        .into_iter()
        .find_map(|route| route.model(ctx).ok().map(|model| (route, model)))
}

/// Sends one request with benign non-empty kwargs and reads whether the gate refused it.
pub async fn observe(client: &Client, ctx: &Ctx) -> Result<Observed, String> {
    let (route, model) = probe_route(ctx).ok_or("no model to send a request to")?;
    let field = GateField::MmProcessorKwargs;
    let body = gate::with_kwargs(route.body(&model), Some(&gate::benign(field)), None);
    let reply = client
        .send(&RequestSpec::post_json(route.path(), body))
        .await
        .map_err(|e| e.to_string())?;
    if Expect::gate_rejection(field).evaluate(&reply).is_empty() {
        Ok(Observed::Refused)
    } else if reply.status == 200 {
        Ok(Observed::Trusted)
    } else {
        Err(format!(
            "{} with mm_processor_kwargs answered {}: neither the gate's refusal nor a success",
            route.route(),
            summarize(&reply)
        ))
    }
}

/// The trust row: observed against expected.
pub fn trust_row(observed: &Result<Observed, String>, expected: &Expected) -> Row {
    let check = "per-request mm_processor_kwargs / media_io_kwargs";
    let outcome = match (observed, expected) {
        (Err(why), _) => Err(why.clone()),
        (Ok(Observed::Refused), Expected::Refused) => {
            Ok("refused with the gate's 400, vLLM 0.31's default".to_string())
        }
        (Ok(Observed::Trusted), Expected::Trusted) => {
            Ok("trusted, as --trust-request-mm-kwargs asks".to_string())
        }
        (Ok(seen), Expected::PerKey) => Ok(format!(
            "{} for this key; --trusted-client-policy decides per key",
            if *seen == Observed::Trusted {
                "trusted"
            } else {
                "refused"
            }
        )),
        (Ok(Observed::Trusted), Expected::Refused) => Err(
            "the deployment trusts request kwargs, but its configuration does not say \
             --trust-request-mm-kwargs (vLLM 0.31 refuses them by default)"
                .to_string(),
        ),
        (Ok(Observed::Refused), Expected::Trusted) => Err(
            "the configuration says --trust-request-mm-kwargs, but the deployment refuses \
             request kwargs"
                .to_string(),
        ),
    };
    Row::judged("trust", check, outcome)
}

/// The deployment-level kwargs row: what the model cards list against the configuration.
/// vLLM lists none, so there the row can only warn.
pub fn kwargs_row(models: &Models, listing: &Value, mm: &Value, media: &Value) -> Row {
    let check = "deployment mm_processor_kwargs / media_io_kwargs";
    let configured = format!("mm_processor_kwargs={mm} media_io_kwargs={media}");
    let cards: Vec<&Value> = listing
        .get("data")
        .and_then(Value::as_array)
        .map(|cards| cards.iter().collect())
        .unwrap_or_default();
    let listed: Vec<(&str, &Value, &Value)> = cards
        .iter()
        .filter_map(|card| {
            Some((
                card.get("id")?.as_str()?,
                card.get("mm_processor_kwargs")?,
                card.get("media_io_kwargs")?,
            ))
        })
        .collect();
    if listed.is_empty() || listed.len() != models.cards.len() {
        return Row::new(
            "trust",
            check,
            Status::Warn,
            format!(
                "the model cards do not list them (vLLM's do not), so they cannot be checked; \
                 configured: {configured}"
            ),
        );
    }
    let wrong: Vec<String> = listed
        .iter()
        .filter(|(_, card_mm, card_media)| {
            !same_object(card_mm, mm) || !same_object(card_media, media)
        })
        .map(|(id, card_mm, card_media)| {
            format!("{id} applies mm_processor_kwargs={card_mm} media_io_kwargs={card_media}")
        })
        .collect();
    let outcome = if wrong.is_empty() {
        Ok(format!("every model applies {configured}"))
    } else {
        Err(format!("{}; configured: {configured}", wrong.join("; ")))
    };
    Row::judged("trust", check, outcome)
}

/// JSON objects equal, `null` counting as `{}`.
fn same_object(a: &Value, b: &Value) -> bool {
    let empty = json!({});
    let a = if a.is_null() { &empty } else { a };
    let b = if b.is_null() { &empty } else { b };
    a == b
}

/// The gate matrix (each gated field alone and together, `null` and `{}` allowed, the error
/// it answers) run in the observed mode, a row per route the deployment serves.
pub async fn contract_rows(
    client: &Client,
    cfg: &SuiteConfig,
    models: &Models,
    observed: Option<Observed>,
) -> Vec<Row> {
    let mut cfg = cfg.clone();
    cfg.mode = match observed {
        Some(Observed::Trusted) => ServerMode::Trusted,
        _ => ServerMode::Default,
    };
    let ctx = Ctx::new(cfg.clone(), models.clone());
    let served: Vec<Route> = Route::GATED
        .into_iter()
        .filter(|route| route.model(&ctx).is_ok())
        .collect();
    let cases: Vec<_> = gate::cases(&ctx)
        .into_iter()
        .filter(|case| served.iter().any(|route| route.route() == case.route))
        .collect();
    let report = contract::runner::run_cases(client, cases, cfg.concurrency).await;
    let mut by_route: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    for case in &report.cases {
        let entry = by_route.entry(case.route.clone()).or_default();
        entry.0 += 1;
        if !case.passed {
            entry.1.push(format!("{}: {}", case.name, case.detail));
        }
    }
    let mode = match cfg.mode {
        ServerMode::Trusted => "trusted",
        _ => "untrusted",
    };
    served
        .iter()
        .map(|route| {
            let (total, failed) = by_route.remove(&route.route()).unwrap_or_default();
            let outcome = match failed.first() {
                None => Ok(format!("{total} gate cases ({mode}) pass")),
                Some(first) => Err(format!(
                    "{} of {total} gate cases fail; first: {first}",
                    failed.len()
                )),
            };
            Row::judged("contract", route.route(), outcome)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_fails_only_when_observed_and_configured_disagree() {
        let pass = |o, e| trust_row(&Ok(o), &e).status == Status::Pass;
        assert!(pass(Observed::Refused, Expected::Refused));
        assert!(pass(Observed::Trusted, Expected::Trusted));
        assert!(pass(Observed::Trusted, Expected::PerKey));
        assert!(!pass(Observed::Trusted, Expected::Refused));
        assert!(!pass(Observed::Refused, Expected::Trusted));
        let unknown = trust_row(&Err("500".into()), &Expected::Refused);
        assert_eq!(unknown.status, Status::Fail);
    }

    #[test]
    fn listed_kwargs_are_compared_and_unlisted_ones_warn() {
        let listing = json!({"data": [
            {"id": "a", "mm_processor_kwargs": {}, "media_io_kwargs": {"video": {"num_frames": 40}}}
        ]});
        let models = Models::from_listing(&listing, &SuiteConfig::new("http://x"));
        let want = json!({"video": {"num_frames": 40}});
        assert_eq!(
            kwargs_row(&models, &listing, &Value::Null, &want).status,
            Status::Pass
        );
        let row = kwargs_row(&models, &listing, &Value::Null, &json!({}));
        assert_eq!(row.status, Status::Fail);
        assert!(row.detail.contains("num_frames"), "{row:?}");
        let bare = json!({"data": [{"id": "a"}]});
        let models = Models::from_listing(&bare, &SuiteConfig::new("http://x"));
        assert_eq!(
            kwargs_row(&models, &bare, &Value::Null, &want).status,
            Status::Warn
        );
    }
}

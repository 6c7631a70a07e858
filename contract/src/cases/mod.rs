//! The cases, one module per concern, and the context they are built from.

pub mod auth;
pub mod effects;
pub mod errors;
pub mod features;
pub mod gate;
pub mod ids;
pub mod media;
pub mod meta;
pub mod metrics;
pub mod ordering;
pub mod router;
pub mod streaming;
pub mod validation;

use futures::future::BoxFuture;

use crate::config::{ServerMode, SuiteConfig};
use crate::expect::Expect;
use crate::http::{Auth, Client, RequestSpec};
use crate::models::Models;

/// What cases are built from: the configuration and the discovered models.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub cfg: SuiteConfig,
    pub models: Models,
}

/// One way of calling the gated routes: which key, and whether the server trusts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    pub label: &'static str,
    pub auth: Auth,
    pub trusted: bool,
}

impl Ctx {
    pub fn new(cfg: SuiteConfig, models: Models) -> Self {
        Self { cfg, models }
    }

    fn missing(&self, what: &str, flag: &str) -> String {
        let why = self
            .models
            .error
            .clone()
            .unwrap_or_else(|| "GET /v1/models listed none".into());
        format!("no {what} model known ({why}); pass {flag}")
    }

    pub fn chat_model(&self) -> Result<String, String> {
        self.models
            .chat
            .clone()
            .ok_or_else(|| self.missing("generation", "--model"))
    }

    pub fn embedding_model(&self) -> Result<String, String> {
        self.models
            .embedding
            .clone()
            .ok_or_else(|| self.missing("embedding", "--embedding-model"))
    }

    pub fn unknown_model(&self) -> String {
        self.models.unknown_model_name()
    }

    /// The ways the gate matrix is run in this mode.
    pub fn variants(&self) -> Vec<Variant> {
        match &self.cfg.mode {
            ServerMode::Default => vec![Variant {
                label: "default",
                auth: Auth::Configured,
                trusted: false,
            }],
            ServerMode::Trusted => vec![Variant {
                label: "trusted",
                auth: Auth::Configured,
                trusted: true,
            }],
            ServerMode::Profile {
                trusted_key,
                untrusted_key,
            } => vec![
                Variant {
                    label: "untrusted-key",
                    auth: Auth::Key(untrusted_key.clone()),
                    trusted: false,
                },
                Variant {
                    label: "trusted-key",
                    auth: Auth::Key(trusted_key.clone()),
                    trusted: true,
                },
            ],
        }
    }

    /// The variants the gate refuses.
    pub fn refused_variants(&self) -> Vec<Variant> {
        self.variants().into_iter().filter(|v| !v.trusted).collect()
    }

    /// Whether the server checks API keys.
    pub fn auth_enabled(&self) -> bool {
        self.cfg.effective_api_key().is_some()
    }
}

/// The result of a multi-request case.
#[derive(Debug, Clone, Default)]
pub struct FlowOutcome {
    pub got: String,
    pub failures: Vec<String>,
}

/// A multi-request case.
pub type Flow = Box<dyn FnOnce(Client) -> BoxFuture<'static, FlowOutcome> + Send>;

/// How a case runs.
pub enum CaseKind {
    /// One request, one expectation.
    Single {
        request: RequestSpec,
        expect: Expect,
    },
    /// Several requests, checked by the flow itself.
    Flow { expected: String, run: Flow },
    /// Decided without a request (e.g. a precondition failed).
    Decided {
        expected: String,
        outcome: FlowOutcome,
    },
}

/// A named case.
pub struct Case {
    pub name: String,
    pub route: String,
    pub kind: CaseKind,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("route", &self.route)
            .finish_non_exhaustive()
    }
}

impl Case {
    pub fn single(name: impl Into<String>, request: RequestSpec, expect: Expect) -> Self {
        Self {
            name: name.into(),
            route: request.route(),
            kind: CaseKind::Single { request, expect },
        }
    }

    pub fn flow(
        name: impl Into<String>,
        route: impl Into<String>,
        expected: impl Into<String>,
        run: Flow,
    ) -> Self {
        Self {
            name: name.into(),
            route: route.into(),
            kind: CaseKind::Flow {
                expected: expected.into(),
                run,
            },
        }
    }

    /// A single-request case that needs a model: `build` gets the model name; without
    /// one the case is recorded as unrunnable.
    pub fn with_model(
        name: impl Into<String>,
        route: impl Into<String>,
        model: Result<String, String>,
        build: impl FnOnce(&str) -> (RequestSpec, Expect),
    ) -> Self {
        match model {
            Ok(model) => {
                let (request, expect) = build(&model);
                Self::single(name, request, expect)
            }
            Err(reason) => Self::decided(name, route, "a model to run against", Err(reason)),
        }
    }

    /// A case whose outcome is already known: `Ok(got)` passes, `Err(why)` fails.
    pub fn decided(
        name: impl Into<String>,
        route: impl Into<String>,
        expected: impl Into<String>,
        outcome: Result<String, String>,
    ) -> Self {
        let outcome = match outcome {
            Ok(got) => FlowOutcome {
                got,
                failures: Vec::new(),
            },
            Err(why) => FlowOutcome {
                got: "not run".into(),
                failures: vec![why],
            },
        };
        Self {
            name: name.into(),
            route: route.into(),
            kind: CaseKind::Decided {
                expected: expected.into(),
                outcome,
            },
        }
    }
}

/// Every case for `ctx`, in report order.
pub fn all(ctx: &Ctx) -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(meta::cases(ctx));
    cases.extend(metrics::cases(ctx));
    cases.extend(router::cases(ctx));
    cases.extend(auth::cases(ctx));
    cases.extend(gate::cases(ctx));
    cases.extend(ordering::cases(ctx));
    cases.extend(media::cases(ctx));
    cases.extend(validation::cases(ctx));
    cases.extend(errors::cases(ctx));
    cases.extend(features::cases(ctx));
    cases.extend(effects::cases(ctx));
    cases.extend(streaming::cases(ctx));
    cases.extend(ids::cases(ctx));
    cases
}

/// Sets `key` in a JSON object body (no-op on non-objects).
pub fn set(mut body: serde_json::Value, key: &str, value: serde_json::Value) -> serde_json::Value {
    if let Some(map) = body.as_object_mut() {
        map.insert(key.to_string(), value);
    }
    body
}

/// Removes `key` from a JSON object body.
pub fn unset(mut body: serde_json::Value, key: &str) -> serde_json::Value {
    if let Some(map) = body.as_object_mut() {
        map.remove(key);
    }
    body
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use crate::routes::Route;

    use super::*;

    fn ctx(mode: ServerMode, api_key: Option<&str>, media: bool) -> Ctx {
        let mut cfg = SuiteConfig::new("http://127.0.0.1:1");
        cfg.mode = mode;
        cfg.api_key = api_key.map(str::to_string);
        if media {
            cfg.media_base_url = Some("http://127.0.0.1:2".into());
        }
        let listing = serde_json::json!({"data": [
            {"id": "gen", "tasks": ["generate"], "max_model_len": 8192},
            {"id": "emb", "tasks": ["embed", "score"], "max_model_len": 256},
        ]});
        let models = Models::from_listing(&listing, &cfg);
        Ctx::new(cfg, models)
    }

    fn profile() -> ServerMode {
        ServerMode::Profile {
            trusted_key: "t".into(),
            untrusted_key: "u".into(),
        }
    }

    #[test]
    fn case_names_are_unique_in_every_mode() {
        for ctx in [
            ctx(ServerMode::Default, None, true),
            ctx(ServerMode::Trusted, Some("k"), false),
            ctx(profile(), None, true),
        ] {
            let cases = all(&ctx);
            let mut seen = HashSet::new();
            for case in &cases {
                assert!(
                    seen.insert(case.name.clone()),
                    "duplicate case {:?}",
                    case.name
                );
                assert!(
                    !matches!(&case.kind, CaseKind::Decided { outcome, .. } if !outcome.failures.is_empty()),
                    "{} cannot run although both models are known",
                    case.name
                );
            }
        }
    }

    #[test]
    fn the_gate_matrix_covers_every_route_field_and_value() {
        // Per variant and route: no kwargs, 3 fields x 4 values, 3 mixed; plus 3 chat-style
        // forms each for tokenize and embeddings.
        let per_variant = Route::GATED.len() * (1 + 3 * 4 + 3) + 2 * 3;
        let default = gate::cases(&ctx(ServerMode::Default, None, false));
        assert_eq!(default.len(), per_variant);
        let profiled = gate::cases(&ctx(profile(), None, false));
        assert_eq!(profiled.len(), 2 * per_variant);
        assert!(profiled
            .iter()
            .any(|c| c.name.starts_with("gate[trusted-key]")));
        assert!(profiled
            .iter()
            .any(|c| c.name.starts_with("gate[untrusted-key]")));
    }

    #[test]
    fn auth_and_media_cases_follow_the_config() {
        assert!(auth::cases(&ctx(ServerMode::Default, None, false)).is_empty());
        assert!(!auth::cases(&ctx(ServerMode::Default, Some("k"), false)).is_empty());
        assert!(!auth::cases(&ctx(profile(), None, false)).is_empty());
        assert!(media::cases(&ctx(ServerMode::Default, None, false)).is_empty());
        assert!(!media::cases(&ctx(ServerMode::Default, None, true)).is_empty());
        // Trusted servers fetch media: no refusal cases there.
        assert!(media::cases(&ctx(ServerMode::Trusted, None, true)).is_empty());
    }

    #[test]
    fn missing_models_make_cases_fail_not_vanish() {
        let cfg = SuiteConfig::new("http://127.0.0.1:1");
        let ctx = Ctx::new(
            cfg.clone(),
            Models::configured_only(&cfg, "unreachable".into()),
        );
        let cases = gate::cases(&ctx);
        assert!(!cases.is_empty());
        assert!(cases.iter().all(|case| matches!(
            &case.kind,
            CaseKind::Decided { outcome, .. } if outcome.failures[0].contains("unreachable")
        )));
    }
}

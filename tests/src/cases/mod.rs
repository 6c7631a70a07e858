//! The cases, one module per concern, and the context they are built from.

pub mod auth;
pub mod errors;
pub mod gate;
pub mod ids;
pub mod media;
pub mod meta;
pub mod ordering;
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
    cases.extend(auth::cases(ctx));
    cases.extend(gate::cases(ctx));
    cases.extend(ordering::cases(ctx));
    cases.extend(media::cases(ctx));
    cases.extend(validation::cases(ctx));
    cases.extend(errors::cases(ctx));
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

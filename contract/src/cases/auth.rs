//! API keys (CONTRACT section 5): `--api-key` guards the API paths, leaves health,
//! version and metrics open, and is checked before anything else, the gate included.

use reqwest::Method;
use serde_json::json;

use super::gate::benign;
use super::Case;
use super::Ctx;
use crate::expect::{status_is, Expect, GateField};
use crate::http::{Auth, Body, RequestSpec};
use crate::routes::Route;

/// The guarded paths, with a body each would otherwise accept.
fn guarded(ctx: &Ctx) -> Vec<RequestSpec> {
    let chat = ctx.chat_model().unwrap_or_else(|_| "m".into());
    let embed = ctx.embedding_model().unwrap_or_else(|_| "m".into());
    let mut specs: Vec<RequestSpec> = Route::GATED
        .iter()
        .map(|route| {
            let model = if route.pooling_family() {
                &embed
            } else {
                &chat
            };
            RequestSpec::post_json(route.path(), route.body(model))
        })
        .collect();
    let score = Route::Score.body(&embed);
    let rerank = Route::Rerank.body(&embed);
    specs.extend([
        RequestSpec::post_json("/v1/score", score),
        RequestSpec::post_json("/v1/rerank", rerank.clone()),
        RequestSpec::post_json("/v2/rerank", rerank),
        RequestSpec::post_json("/detokenize", json!({"model": chat, "tokens": [1, 2]})),
        RequestSpec::get("/v1/models"),
    ]);
    specs
}

fn unauthorized() -> Expect {
    Expect::new("401").with(status_is(401))
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    if !ctx.auth_enabled() {
        return Vec::new();
    }
    let mut cases = Vec::new();
    for spec in guarded(ctx) {
        let path = spec.path.clone();
        let method = spec.method.clone();
        cases.push(Case::single(
            format!("auth {method} {path} without a key: 401"),
            spec.clone().with_auth(Auth::Without),
            unauthorized(),
        ));
        cases.push(Case::single(
            format!("auth {method} {path} with a wrong key: 401"),
            spec.with_auth(Auth::Key("contract-wrong-key".into())),
            unauthorized(),
        ));
    }
    for path in ["/health", "/ping", "/version", "/metrics"] {
        cases.push(Case::single(
            format!("auth GET {path} stays open without a key: 200"),
            RequestSpec::get(path).with_auth(Auth::Without),
            Expect::new("200").with(status_is(200)),
        ));
    }
    cases.push(Case::single(
        "auth GET /v1/models with the configured key: 200",
        RequestSpec::get("/v1/models"),
        Expect::new("200").with(status_is(200)),
    ));
    if let crate::config::ServerMode::Profile {
        trusted_key,
        untrusted_key,
    } = &ctx.cfg.mode
    {
        for (which, key) in [("trusted", trusted_key), ("untrusted", untrusted_key)] {
            cases.push(Case::single(
                format!("auth GET /v1/models with the profile's {which} key: 200"),
                RequestSpec::get("/v1/models").with_auth(Auth::Key(key.clone())),
                Expect::new("200").with(status_is(200)),
            ));
        }
    }
    // 401 beats the gate and every validation.
    let chat = ctx.chat_model().unwrap_or_else(|_| "m".into());
    let embed = ctx.embedding_model().unwrap_or_else(|_| "m".into());
    let gated_chat = super::set(
        Route::Chat.body(&chat),
        GateField::MmProcessorKwargs.name(),
        benign(GateField::MmProcessorKwargs),
    );
    let gated_embed = super::set(
        Route::Embeddings.body(&embed),
        GateField::MediaIoKwargs.name(),
        benign(GateField::MediaIoKwargs),
    );
    cases.push(Case::single(
        "auth /v1/chat/completions without a key + mm_processor_kwargs: 401 beats the gate",
        RequestSpec::post_json(Route::Chat.path(), gated_chat).with_auth(Auth::Without),
        unauthorized(),
    ));
    cases.push(Case::single(
        "auth /v1/embeddings with a wrong key + media_io_kwargs: 401 beats the gate",
        RequestSpec::post_json(Route::Embeddings.path(), gated_embed)
            .with_auth(Auth::Key("contract-wrong-key".into())),
        unauthorized(),
    ));
    cases.push(Case::single(
        "auth /v1/chat/completions without a key + malformed JSON: 401 first",
        RequestSpec {
            method: Method::POST,
            path: Route::Chat.path().into(),
            body: Body::Raw {
                content_type: Some("application/json".into()),
                bytes: b"{\"model\": ".to_vec(),
            },
            auth: Auth::Without,
            headers: Vec::new(),
        },
        unauthorized(),
    ));
    cases.push(Case::single(
        "auth /v1/chat/completions without a key + unknown model: 401 first",
        RequestSpec::post_json(Route::Chat.path(), Route::Chat.body(&ctx.unknown_model()))
            .with_auth(Auth::Without),
        unauthorized(),
    ));
    cases
}

//! Response ids (CONTRACT section 1): a prefix per route plus the request id, which is
//! the `X-Request-Id` header when the client sends one.

use super::{Case, Ctx};
use crate::expect::Expect;
use crate::http::{Reply, RequestSpec};
use crate::routes::Route;

/// The id prefix of each route that has one.
pub fn prefix(route: Route) -> Option<&'static str> {
    match route {
        Route::Chat => Some("chatcmpl-"),
        Route::Completions => Some("cmpl-"),
        Route::Embeddings => Some("embd-"),
        Route::Pooling => Some("pool-"),
        Route::Score => Some("score-"),
        Route::Classify => Some("classify-"),
        Route::Tokenize | Route::Rerank => None,
    }
}

fn echoes(reply: &Reply, sent: &str) -> Result<(), String> {
    match reply.header("x-request-id") {
        None => Ok(()),
        Some(got) if got == sent => Ok(()),
        Some(got) => Err(format!("X-Request-Id header {got:?} != sent {sent:?}")),
    }
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let mut cases = Vec::new();
    for route in [
        Route::Chat,
        Route::Completions,
        Route::Embeddings,
        Route::Pooling,
        Route::Score,
    ] {
        let Some(prefix) = prefix(route) else {
            continue;
        };
        let path = route.path();
        let request_id = format!(
            "contract-rid-{}",
            path.trim_start_matches('/').replace('/', "-")
        );
        let expected_id = format!("{prefix}{request_id}");
        cases.push(Case::with_model(
            format!("ids {path} with X-Request-Id: id {prefix}<request id>, header echoed if any"),
            route.route(),
            route.model(ctx),
            |model| {
                let sent = request_id.clone();
                let expect = Expect::ok_json(&format!("id {expected_id:?}"))
                    .with(move |reply| {
                        let got = reply
                            .json
                            .as_ref()
                            .and_then(|json| json.get("id"))
                            .and_then(serde_json::Value::as_str);
                        if got == Some(expected_id.as_str()) {
                            Ok(())
                        } else {
                            Err(format!("id {got:?} != {expected_id:?}"))
                        }
                    })
                    .with(move |reply| echoes(reply, &sent));
                (
                    RequestSpec::post_json(path, route.body(model))
                        .with_header("X-Request-Id", &request_id),
                    expect,
                )
            },
        ));
        cases.push(Case::with_model(
            format!("ids {path} without X-Request-Id: fresh ids"),
            route.route(),
            route.model(ctx),
            |model| {
                (
                    RequestSpec::post_json(path, route.body(model)),
                    Expect::ok_json(&format!("id {prefix}<uuid>"))
                        .with(crate::expect::string_prefix("/id", prefix))
                        .with(move |reply| {
                            let id = reply
                                .json
                                .as_ref()
                                .and_then(|json| json.get("id"))
                                .and_then(serde_json::Value::as_str)
                                .unwrap_or("");
                            if id.len() > prefix.len() + 8 {
                                Ok(())
                            } else {
                                Err(format!("id {id:?} has no real request id after {prefix:?}"))
                            }
                        }),
                )
            },
        ));
    }
    cases
}

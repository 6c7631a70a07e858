//! Error shapes (CONTRACT section 5): bad bodies are 400s, never 500s; unknown models are
//! 404s; unknown fields are ignored.

use serde_json::json;

use super::{set, Case, Ctx};
use crate::expect::{not_gate, Expect, Message, Param};
use crate::http::RequestSpec;
use crate::routes::{self, Route};

fn bad_body(route: Route, what: &str, content_type: Option<&str>, body: &str) -> Case {
    Case::single(
        format!("error {} {what}: 400", route.path()),
        RequestSpec::post_raw(route.path(), content_type, body.as_bytes().to_vec()),
        Expect::error(400, "BadRequestError", Param::Any, Message::NonEmpty).with(not_gate()),
    )
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let json_type = Some("application/json");
    let mut cases = Vec::new();
    for route in [
        Route::Chat,
        Route::Completions,
        Route::Embeddings,
        Route::Score,
    ] {
        cases.push(bad_body(
            route,
            "malformed JSON",
            json_type,
            r#"{"model": "m", "#,
        ));
        for (what, body) in [
            ("string body", r#""hello""#),
            ("list body", "[1, 2]"),
            ("number body", "42"),
            ("null body", "null"),
            ("empty body", ""),
        ] {
            cases.push(bad_body(route, what, json_type, body));
        }
    }
    for route in [Route::Chat, Route::Embeddings] {
        let model = route.model(ctx).unwrap_or_else(|_| "m".into());
        let body = route.body(&model).to_string();
        cases.push(bad_body(
            route,
            "Content-Type text/plain",
            Some("text/plain"),
            &body,
        ));
        cases.push(bad_body(
            route,
            "Content-Type application/x-www-form-urlencoded",
            Some("application/x-www-form-urlencoded"),
            &body,
        ));
    }

    // Wrong field types name the field.
    let wrong_types = [
        (Route::Chat, "messages", json!("hello")),
        (Route::Chat, "max_tokens", json!("ten")),
        (Route::Chat, "temperature", json!("hot")),
        (Route::Chat, "stream", json!({"yes": 1})),
        (Route::Completions, "max_tokens", json!([1])),
        (Route::Embeddings, "input", json!({"text": 1})),
        (Route::Score, "documents", json!(42)),
        (Route::Rerank, "top_n", json!("all")),
    ];
    for (route, field, value) in wrong_types {
        cases.push(Case::with_model(
            format!("error {} wrong type {field}={value}: 400", route.path()),
            route.route(),
            route.model(ctx),
            |model| {
                (
                    RequestSpec::post_json(route.path(), set(route.body(model), field, value)),
                    Expect::bad_request(field),
                )
            },
        ));
    }

    // Unknown models.
    let unknown = ctx.unknown_model();
    for route in Route::GATED {
        cases.push(Case::single(
            format!("error {} unknown model: 404", route.path()),
            RequestSpec::post_json(route.path(), route.body(&unknown)),
            Expect::unknown_model(&unknown),
        ));
    }
    cases.push(Case::single(
        "error /detokenize unknown model: 404",
        RequestSpec::post_json("/detokenize", json!({"model": unknown, "tokens": [1, 2]})),
        Expect::unknown_model(&unknown),
    ));

    // Unknown fields are accepted; JSON content types with parameters too.
    cases.push(Case::with_model(
        "error /v1/chat/completions unknown fields are ignored: 200",
        Route::Chat.route(),
        ctx.chat_model(),
        |model| {
            let body = set(
                set(
                    Route::Chat.body(model),
                    "contract_unknown_field",
                    json!({"x": [1]}),
                ),
                "another_unknown",
                json!(null),
            );
            (
                RequestSpec::post_json(Route::Chat.path(), body),
                routes::chat_completion(),
            )
        },
    ));
    cases.push(Case::with_model(
        "error /v1/embeddings unknown fields are ignored: 200",
        Route::Embeddings.route(),
        ctx.embedding_model(),
        |model| {
            let body = set(
                Route::Embeddings.body(model),
                "contract_unknown_field",
                json!(1),
            );
            (
                RequestSpec::post_json(Route::Embeddings.path(), body),
                routes::embeddings(),
            )
        },
    ));
    cases.push(Case::with_model(
        "error /v1/chat/completions Content-Type application/json; charset=utf-8: 200",
        Route::Chat.route(),
        ctx.chat_model(),
        |model| {
            (
                RequestSpec::post_raw(
                    Route::Chat.path(),
                    Some("application/json; charset=utf-8"),
                    Route::Chat.body(model).to_string(),
                ),
                routes::chat_completion(),
            )
        },
    ));
    cases
}

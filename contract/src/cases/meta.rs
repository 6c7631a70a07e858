//! Health, version, model cards, metrics, tokenize/detokenize (CONTRACT sections 1 and 5).

use serde_json::{json, Value};

use super::{Case, Ctx, FlowOutcome};
use crate::expect::{json_at, status_is, summarize, Expect};
use crate::http::{Client, RequestSpec};
use crate::routes::non_empty_array;

fn empty_200(path: &str) -> Case {
    Case::single(
        format!("meta GET {path}: 200, empty body"),
        RequestSpec::get(path),
        Expect::new("200, empty body")
            .with(status_is(200))
            .with(|reply| {
                if reply.body.is_empty() {
                    Ok(())
                } else {
                    Err(format!("body is not empty: {:?}", reply.text()))
                }
            }),
    )
}

/// Each card: `object: "model"`, `owned_by`, `root`, `max_model_len`; our extensions
/// checked when present.
fn check_cards(listing: &Value) -> Result<(), String> {
    let Some(cards) = listing.get("data").and_then(Value::as_array) else {
        return Err("`data` is not a list".into());
    };
    if cards.is_empty() {
        return Err("no models listed".into());
    }
    let mut problems = Vec::new();
    for card in cards {
        let id = card.get("id").and_then(Value::as_str).unwrap_or("<no id>");
        let mut require = |ok: bool, what: &str| {
            if !ok {
                problems.push(format!("{id}: {what}"));
            }
        };
        require(
            card.get("id").is_some_and(Value::is_string),
            "id is not a string",
        );
        require(
            card.get("object") == Some(&json!("model")),
            "object != \"model\"",
        );
        require(
            card.get("owned_by").is_some_and(Value::is_string),
            "owned_by is not a string",
        );
        require(
            card.get("root").is_some_and(Value::is_string),
            "root is not a string",
        );
        require(
            card.get("max_model_len").is_some_and(Value::is_u64),
            "max_model_len is not an integer",
        );
        if let Some(modalities) = card.get("input_modalities") {
            require(
                modalities
                    .as_array()
                    .is_some_and(|m| m.iter().all(Value::is_string) && m.contains(&json!("text"))),
                "input_modalities is not a list of strings containing \"text\"",
            );
        }
        if let Some(tasks) = card.get("tasks") {
            require(
                tasks
                    .as_array()
                    .is_some_and(|t| !t.is_empty() && t.iter().all(Value::is_string)),
                "tasks is not a non-empty list of strings",
            );
        }
        if let Some(limits) = card.get("limit_mm_per_prompt") {
            require(
                limits
                    .as_object()
                    .is_some_and(|l| l.values().all(Value::is_u64)),
                "limit_mm_per_prompt is not an object of integers",
            );
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let mut cases = vec![
        empty_200("/health"),
        empty_200("/ping"),
        Case::single(
            "meta GET /version: {\"version\": string}",
            RequestSpec::get("/version"),
            Expect::ok_json("{\"version\": ...}").with(json_at(
                "/version",
                "a non-empty string",
                |v| v.as_str().is_some_and(|s| !s.is_empty()),
            )),
        ),
        Case::single(
            "meta GET /v1/models: model cards",
            RequestSpec::get("/v1/models"),
            Expect::ok_json("object list of model cards")
                .with(json_at("/object", "\"list\"", |v| v == "list"))
                .with(|reply| {
                    reply
                        .json
                        .as_ref()
                        .map_or(Err("no JSON".into()), check_cards)
                }),
        ),
        Case::single(
            "meta GET /metrics: Prometheus text with vLLM names",
            RequestSpec::get("/metrics"),
            Expect::new("200 text/plain containing vllm:num_requests_running")
                .with(status_is(200))
                .with(|reply| {
                    let text = reply.text();
                    if text.contains("vllm:num_requests_running") {
                        Ok(())
                    } else {
                        Err("no vllm:num_requests_running metric".into())
                    }
                }),
        ),
    ];
    // Discovery found what the suite needs.
    let found = ctx.chat_model().and_then(|chat| {
        ctx.embedding_model()
            .map(|embed| format!("chat {chat}, embedding {embed}"))
    });
    cases.push(Case::decided(
        "meta models discovered (generation and embedding)",
        "GET /v1/models",
        "a generation and an embedding model",
        found,
    ));
    if let Ok(model) = ctx.chat_model() {
        cases.push(Case::flow(
            "meta tokenize then detokenize round-trips the text",
            "POST /tokenize, /detokenize",
            "tokenize ids detokenize back to \"Hello world\"",
            Box::new(move |client| Box::pin(round_trip(client, model))),
        ));
    }
    if let Ok(model) = ctx.chat_model() {
        cases.push(Case::single(
            "meta POST /tokenize chat messages",
            RequestSpec::post_json(
                "/tokenize",
                json!({"model": model, "messages": [{"role": "user", "content": "Hi"}]}),
            ),
            Expect::ok_json("tokens of the rendered chat prompt").with(json_at(
                "/tokens",
                "a non-empty list",
                non_empty_array,
            )),
        ));
    }
    cases
}

async fn round_trip(client: Client, model: String) -> FlowOutcome {
    let text = "Hello world";
    let tokenize = RequestSpec::post_json("/tokenize", json!({"model": model, "prompt": text}));
    let reply = match client.send(&tokenize).await {
        Ok(reply) => reply,
        Err(err) => return failed(format!("tokenize: {err}")),
    };
    let tokens = reply
        .json
        .as_ref()
        .and_then(|json| json.get("tokens"))
        .cloned();
    let Some(tokens) = tokens.filter(|t| t.is_array()) else {
        return failed(format!("tokenize answered {}", summarize(&reply)));
    };
    let detokenize =
        RequestSpec::post_json("/detokenize", json!({"model": model, "tokens": tokens}));
    let reply = match client.send(&detokenize).await {
        Ok(reply) => reply,
        Err(err) => return failed(format!("detokenize: {err}")),
    };
    let got = summarize(&reply);
    let prompt = reply
        .json
        .as_ref()
        .and_then(|json| json.get("prompt"))
        .and_then(Value::as_str);
    let failures = match prompt {
        Some(prompt) if prompt.trim_start() == text => Vec::new(),
        other => vec![format!("detokenized prompt {other:?} != {text:?}")],
    };
    FlowOutcome { got, failures }
}

fn failed(why: String) -> FlowOutcome {
    FlowOutcome {
        got: why.clone(),
        failures: vec![why],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_need_the_openai_fields() {
        let good = json!({"data": [{"id": "m", "object": "model", "owned_by": "vllm",
            "root": "m", "max_model_len": 8, "tasks": ["generate"],
            "input_modalities": ["text"], "limit_mm_per_prompt": {"image": 0}}]});
        assert_eq!(check_cards(&good), Ok(()));
        let bad = json!({"data": [{"id": "m", "object": "model", "root": "m",
            "max_model_len": 8, "tasks": []}]});
        let err = check_cards(&bad).err().unwrap_or_default();
        assert!(err.contains("owned_by") && err.contains("tasks"), "{err}");
        assert!(check_cards(&json!({"data": []})).is_err());
    }
}

//! Streaming (CONTRACT sections 1, 5, 6): SSE chunks ending in `data: [DONE]`, the usage
//! chunk, and plain JSON errors for requests refused before the stream starts.

use serde_json::{json, Value};

use super::gate::benign;
use super::{set, Case, Ctx};
use crate::expect::{status_is, Expect, GateField};
use crate::http::{Reply, RequestSpec};
use crate::routes::Route;
use crate::sse::{self, Event};

/// The JSON chunks of an SSE reply, checked to end with `[DONE]` and contain nothing else.
fn chunks(reply: &Reply) -> Result<Vec<Value>, String> {
    if reply.media_type().as_deref() != Some("text/event-stream") {
        return Err(format!(
            "content-type {:?} is not text/event-stream",
            reply.header("content-type")
        ));
    }
    let events = sse::parse(&reply.text());
    match events.last() {
        Some(Event::Done) => {}
        other => return Err(format!("last event {other:?} is not [DONE]")),
    }
    let mut chunks = Vec::new();
    for event in &events[..events.len() - 1] {
        match event {
            Event::Json(value) => chunks.push(value.clone()),
            Event::Done => return Err("[DONE] before the last event".into()),
            Event::Other(text) => return Err(format!("non-JSON event {text:?}")),
        }
    }
    if chunks.is_empty() {
        return Err("no chunks before [DONE]".into());
    }
    Ok(chunks)
}

/// Every chunk has `object`, an id with `prefix`, the same id throughout; some chunk
/// finishes.
fn stream_of(object: &'static str, prefix: &'static str, usage_last: bool) -> Expect {
    let mut summary = format!("200 SSE {object} chunks (id {prefix}...), then data: [DONE]");
    if usage_last {
        summary.push_str(", last chunk choices [] with usage");
    }
    Expect::new(summary)
        .with(status_is(200))
        .with(move |reply| {
            let chunks = chunks(reply)?;
            let first_id = chunks[0].get("id").and_then(Value::as_str).unwrap_or("");
            if !first_id.starts_with(prefix) {
                return Err(format!("id {first_id:?} does not start with {prefix:?}"));
            }
            for chunk in &chunks {
                if chunk.get("object").and_then(Value::as_str) != Some(object) {
                    return Err(format!("chunk object is not {object:?}: {chunk}"));
                }
                if chunk.get("id").and_then(Value::as_str) != Some(first_id) {
                    return Err(format!("chunk id differs from {first_id:?}: {chunk}"));
                }
            }
            let finished = chunks.iter().any(|chunk| {
                chunk
                    .pointer("/choices/0/finish_reason")
                    .is_some_and(Value::is_string)
            });
            if !finished {
                return Err("no chunk carries a finish_reason".into());
            }
            if usage_last {
                let last = &chunks[chunks.len() - 1];
                if last.get("choices") != Some(&json!([])) {
                    return Err(format!("last chunk's choices are not []: {last}"));
                }
                let usage = last.get("usage");
                let field = |name: &str| usage.and_then(|u| u.get(name)).and_then(Value::as_u64);
                match (
                    field("prompt_tokens"),
                    field("completion_tokens"),
                    field("total_tokens"),
                ) {
                    (Some(prompt), Some(completion), Some(total))
                        if prompt + completion == total => {}
                    _ => return Err(format!("last chunk's usage is incomplete: {last}")),
                }
            }
            Ok(())
        })
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let mut cases = Vec::new();
    for (route, object, prefix) in [
        (Route::Chat, "chat.completion.chunk", "chatcmpl-"),
        (Route::Completions, "text_completion", "cmpl-"),
    ] {
        let path = route.path();
        cases.push(Case::with_model(
            format!("stream {path}: SSE chunks then [DONE]"),
            route.route(),
            ctx.chat_model(),
            |model| {
                (
                    RequestSpec::post_json(path, set(route.body(model), "stream", json!(true))),
                    stream_of(object, prefix, false),
                )
            },
        ));
        cases.push(Case::with_model(
            format!("stream {path} include_usage: last chunk choices [] with usage"),
            route.route(),
            ctx.chat_model(),
            |model| {
                let body = set(
                    set(route.body(model), "stream", json!(true)),
                    "stream_options",
                    json!({"include_usage": true}),
                );
                (
                    RequestSpec::post_json(path, body),
                    stream_of(object, prefix, true),
                )
            },
        ));
        // Errors before the stream starts are plain JSON.
        cases.push(Case::single(
            format!("stream {path} unknown model: plain JSON 404"),
            RequestSpec::post_json(
                path,
                set(route.body(&ctx.unknown_model()), "stream", json!(true)),
            ),
            Expect::unknown_model(&ctx.unknown_model()),
        ));
        cases.push(Case::with_model(
            format!("stream {path} temperature=5: plain JSON 400"),
            route.route(),
            ctx.chat_model(),
            |model| {
                let body = set(
                    set(route.body(model), "stream", json!(true)),
                    "temperature",
                    json!(5),
                );
                (
                    RequestSpec::post_json(path, body),
                    Expect::bad_request("temperature"),
                )
            },
        ));
        for variant in ctx.refused_variants() {
            for field in [GateField::MmProcessorKwargs, GateField::MediaIoKwargs] {
                cases.push(Case::with_model(
                    format!(
                        "stream[{}] {path} {}: plain JSON gate 400",
                        variant.label,
                        field.name()
                    ),
                    route.route(),
                    ctx.chat_model(),
                    |model| {
                        let body = set(
                            set(route.body(model), "stream", json!(true)),
                            field.name(),
                            benign(field),
                        );
                        (
                            RequestSpec::post_json(path, body).with_auth(variant.auth.clone()),
                            Expect::gate_rejection(field),
                        )
                    },
                ));
            }
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE};

    fn sse_reply(body: &str) -> Reply {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        Reply::new(200, headers, body.as_bytes().to_vec())
    }

    #[test]
    fn usage_chunk_is_required_when_asked() {
        let body = concat!(
            "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"text\":\"a\",\"finish_reason\":\"length\"}]}\n\n",
            "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1,\"total_tokens\":3}}\n\n",
            "data: [DONE]\n\n"
        );
        let reply = sse_reply(body);
        assert!(stream_of("text_completion", "cmpl-", true)
            .evaluate(&reply)
            .is_empty());
        assert!(stream_of("text_completion", "cmpl-", false)
            .evaluate(&reply)
            .is_empty());
        let no_usage = concat!(
            "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"text\":\"a\",\"finish_reason\":\"length\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        assert!(!stream_of("text_completion", "cmpl-", true)
            .evaluate(&sse_reply(no_usage))
            .is_empty());
    }

    #[test]
    fn a_stream_must_end_with_done() {
        let body = "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"finish_reason\":\"stop\"}]}\n\n";
        let failures = stream_of("text_completion", "cmpl-", false).evaluate(&sse_reply(body));
        assert!(
            failures.iter().any(|f| f.contains("[DONE]")),
            "{failures:?}"
        );
    }
}

//! Structured outputs over HTTP on the default chat model: every constrained reply, whole or
//! assembled from its stream, parses and validates against its JSON Schema at temperature 0
//! and 1; `guided_choice` answers one of its choices; `guided_regex` matches; a schema the
//! engine cannot take is a 400 naming the field that carried it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{must, Gateway};
use serde_json::{json, Value};

const MODEL: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, String) {
    let reply = client.post(url).json(body).send().await.unwrap();
    (reply.status().as_u16(), reply.text().await.unwrap())
}

/// The message text and finish reason of a chat reply, whole or streamed.
fn chat_text(body: &str, streamed: bool) -> (String, String) {
    if !streamed {
        let v: Value = serde_json::from_str(body).unwrap();
        let choice = &v["choices"][0];
        return (
            choice["message"]["content"].as_str().unwrap().to_string(),
            choice["finish_reason"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    let (mut text, mut finish) = (String::new(), String::new());
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        let choice = &v["choices"][0];
        text.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}

fn schemas() -> [Value; 2] {
    [
        // Nested objects, required and optional properties, arrays, enums.
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "pet": {"type": "object", "properties": {
                    "kind": {"enum": ["cat", "dog", "fish"]},
                    "age": {"type": "integer", "minimum": 0, "maximum": 30}
                }, "required": ["kind"], "additionalProperties": false},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                         "maxItems": 3}
            },
            "required": ["name", "pet", "tags"],
            "additionalProperties": false
        }),
        // anyOf and a string pattern.
        json!({
            "type": "object",
            "properties": {
                "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99},
                                    {"type": "boolean"}]},
                "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}
            },
            "required": ["value", "code"],
            "additionalProperties": false
        }),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_replies_hold_over_http() {
    let gateway = must(Gateway::start(&[]).await);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let chat = format!("{}/v1/chat/completions", gateway.base_url);
    let messages = json!([{"role": "user", "content": "Describe a person and their pet as JSON."}]);
    let mut runs = Vec::new();
    for schema in schemas() {
        for temperature in [0.0, 1.0] {
            for stream in [false, true] {
                let body = json!({"model": MODEL, "messages": messages, "max_tokens": 200,
                    "temperature": temperature, "seed": 7, "stream": stream,
                    "response_format": {"type": "json_schema",
                        "json_schema": {"name": "reply", "schema": schema, "strict": true}}});
                let (client, chat, schema) = (client.clone(), chat.clone(), schema.clone());
                runs.push(tokio::spawn(async move {
                    let (status, text) = post(&client, &chat, &body).await;
                    (schema, temperature, stream, status, text)
                }));
            }
        }
    }
    for run in runs {
        let (schema, t, stream, status, body) = run.await.unwrap();
        assert_eq!(status, 200, "t={t} stream={stream}: {body}");
        let (text, finish) = chat_text(&body, stream);
        assert_eq!(finish, "stop", "t={t} stream={stream}: {text:?}");
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("t={t} stream={stream}: {e}: {text:?}"));
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert!(validator.is_valid(&value), "t={t} stream={stream}: {value}");
    }

    let choices = ["yes", "no", "maybe"];
    for stream in [false, true] {
        let body = json!({"model": MODEL, "max_tokens": 8, "stream": stream,
            "messages": [{"role": "user", "content": "Is the sky blue?"}],
            "guided_choice": choices});
        let (status, reply) = post(&client, &chat, &body).await;
        assert_eq!(status, 200, "{reply}");
        let (text, _) = chat_text(&reply, stream);
        assert!(
            choices.contains(&text.as_str()),
            "stream={stream}: {text:?}"
        );
    }

    let pattern = "[0-9]{3}-[0-9]{4}";
    let body = json!({"model": MODEL, "prompt": "My phone number is", "max_tokens": 20,
        "temperature": 1.0, "structured_outputs": {"regex": pattern}});
    let (status, reply) = post(
        &client,
        &format!("{}/v1/completions", gateway.base_url),
        &body,
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let text = serde_json::from_str::<Value>(&reply).unwrap()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let re = regex::Regex::new(&format!("^{pattern}$")).unwrap();
    assert!(re.is_match(&text), "{text:?}");

    // A schema keyword the engine does not implement: a 400 before any work, naming the field.
    let body = json!({"model": MODEL, "messages": messages, "max_tokens": 8,
        "guided_json": {"type": "array", "uniqueItems": true}});
    let (status, reply) = post(&client, &chat, &body).await;
    assert_eq!(status, 400, "{reply}");
    let error: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(error["error"]["param"], "guided_json", "{reply}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("uniqueItems"),
        "{reply}"
    );
}

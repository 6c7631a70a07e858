//! The gated routes: their paths, a minimal valid body for each, and what success looks like.

use serde_json::{json, Value};

use crate::cases::Ctx;
use crate::expect::{json_at, string_prefix, Expect, Message, Param};

/// Every route that renders a prompt or runs pooling (CONTRACT section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completions,
    Tokenize,
    Embeddings,
    Pooling,
    Score,
    Rerank,
    Classify,
}

/// The documents score and rerank requests carry.
pub const DOCUMENTS: [&str; 2] = [
    "Paris is the capital and largest city of France.",
    "Bananas are yellow when they are ripe.",
];
pub const QUERY: &str = "What is the capital of France?";

impl Route {
    pub const GATED: [Route; 8] = [
        Route::Chat,
        Route::Completions,
        Route::Tokenize,
        Route::Embeddings,
        Route::Pooling,
        Route::Score,
        Route::Rerank,
        Route::Classify,
    ];

    pub fn path(self) -> &'static str {
        match self {
            Route::Chat => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::Tokenize => "/tokenize",
            Route::Embeddings => "/v1/embeddings",
            Route::Pooling => "/pooling",
            Route::Score => "/score",
            Route::Rerank => "/rerank",
            Route::Classify => "/classify",
        }
    }

    pub fn route(self) -> String {
        format!("POST {}", self.path())
    }

    /// Embeddings, pooling, score, rerank and classify: the gate comes before the model
    /// check there.
    pub fn pooling_family(self) -> bool {
        !matches!(self, Route::Chat | Route::Completions | Route::Tokenize)
    }

    /// The model this route's requests name.
    pub fn model(self, ctx: &Ctx) -> Result<String, String> {
        match self {
            Route::Chat | Route::Completions | Route::Tokenize => ctx.chat_model(),
            Route::Classify => match &ctx.models.classifier {
                Some(model) => Ok(model.clone()),
                None => ctx.embedding_model(),
            },
            _ => ctx.embedding_model(),
        }
    }

    /// A minimal valid request for `model` (small `max_tokens` on generation).
    pub fn body(self, model: &str) -> Value {
        match self {
            Route::Chat => json!({
                "model": model,
                "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 2,
                "temperature": 0
            }),
            Route::Completions => json!({
                "model": model,
                "prompt": "The capital of France is",
                "max_tokens": 2,
                "temperature": 0
            }),
            Route::Tokenize => json!({"model": model, "prompt": "Hello world"}),
            Route::Embeddings => json!({"model": model, "input": "The quick brown fox"}),
            Route::Pooling => {
                json!({"model": model, "input": "The quick brown fox", "task": "embed"})
            }
            Route::Score => json!({"model": model, "queries": QUERY, "documents": DOCUMENTS}),
            Route::Rerank => json!({"model": model, "query": QUERY, "documents": DOCUMENTS}),
            Route::Classify => json!({"model": model, "input": "I love this!"}),
        }
    }

    /// What a successful answer to [`Route::body`] looks like; on `/classify` without a
    /// classifier model, the unsupported-task 400.
    pub fn success(self, ctx: &Ctx) -> Expect {
        match self {
            Route::Chat => chat_completion(),
            Route::Completions => text_completion(),
            Route::Tokenize => Expect::ok_json("tokenize {count, tokens, max_model_len}")
                .with(json_at("/count", "an integer", Value::is_u64))
                .with(json_at("/max_model_len", "an integer", Value::is_u64))
                .with(json_at("/tokens", "a non-empty list of token ids", |v| {
                    v.as_array()
                        .is_some_and(|ids| !ids.is_empty() && ids.iter().all(Value::is_u64))
                }))
                .with(|reply| {
                    let json = reply.json.as_ref();
                    let count = json.and_then(|j| j.get("count")).and_then(Value::as_u64);
                    let len = json
                        .and_then(|j| j.get("tokens"))
                        .and_then(Value::as_array)
                        .map(|ids| ids.len() as u64);
                    if count == len {
                        Ok(())
                    } else {
                        Err(format!("count {count:?} != tokens length {len:?}"))
                    }
                }),
            Route::Embeddings => embeddings(),
            Route::Pooling => Expect::ok_json("pooling list, id pool-...")
                .with(string_prefix("/id", "pool-"))
                .with(json_at("/data/0/data", "a non-empty list", non_empty_array)),
            Route::Score => Expect::ok_json("scores, id score-..., one per document")
                .with(string_prefix("/id", "score-"))
                .with(json_at("/data", "one entry per document", |v| {
                    v.as_array().is_some_and(|d| d.len() == DOCUMENTS.len())
                }))
                .with(json_at("/data/0/score", "a number", Value::is_number))
                .with(json_at("/data/1/score", "a number", Value::is_number)),
            Route::Rerank => Expect::ok_json("rerank results sorted by relevance_score desc").with(
                json_at("/results", "one result per document, sorted desc", |v| {
                    let Some(results) = v.as_array() else {
                        return false;
                    };
                    let scores: Vec<f64> = results
                        .iter()
                        .filter_map(|r| r.get("relevance_score").and_then(Value::as_f64))
                        .collect();
                    scores.len() == DOCUMENTS.len()
                        && scores.windows(2).all(|pair| pair[0] >= pair[1])
                        && results
                            .iter()
                            .all(|r| r.get("index").is_some_and(Value::is_u64))
                }),
            ),
            Route::Classify => match &ctx.models.classifier {
                Some(_) => Expect::ok_json("classification, id classify-...")
                    .with(string_prefix("/id", "classify-"))
                    .with(json_at(
                        "/data/0/probs",
                        "a non-empty list",
                        non_empty_array,
                    )),
                None => unsupported_task("classify"),
            },
        }
    }
}

/// 400 `Unsupported task: '<task>'`.
pub fn unsupported_task(task: &str) -> Expect {
    Expect::error(
        400,
        "BadRequestError",
        Param::Any,
        Message::Prefix(format!("Unsupported task: '{task}'")),
    )
}

pub fn chat_completion() -> Expect {
    Expect::ok_json("chat.completion, id chatcmpl-...")
        .with(json_at("/object", "\"chat.completion\"", |v| {
            v == "chat.completion"
        }))
        .with(string_prefix("/id", "chatcmpl-"))
        .with(json_at("/choices/0/message/role", "\"assistant\"", |v| {
            v == "assistant"
        }))
        .with(json_at("/usage/total_tokens", "an integer", Value::is_u64))
}

pub fn text_completion() -> Expect {
    Expect::ok_json("text_completion, id cmpl-...")
        .with(json_at("/object", "\"text_completion\"", |v| {
            v == "text_completion"
        }))
        .with(string_prefix("/id", "cmpl-"))
        .with(json_at("/choices/0/text", "a string", Value::is_string))
        .with(json_at("/usage/total_tokens", "an integer", Value::is_u64))
}

pub fn embeddings() -> Expect {
    Expect::ok_json("embedding list, id embd-...")
        .with(string_prefix("/id", "embd-"))
        .with(json_at("/object", "\"list\"", |v| v == "list"))
        .with(json_at("/data/0/object", "\"embedding\"", |v| {
            v == "embedding"
        }))
        .with(json_at(
            "/data/0/embedding",
            "a non-empty list of numbers",
            |v| {
                v.as_array()
                    .is_some_and(|xs| !xs.is_empty() && xs.iter().all(Value::is_number))
            },
        ))
}

pub fn non_empty_array(value: &Value) -> bool {
    value.as_array().is_some_and(|items| !items.is_empty())
}

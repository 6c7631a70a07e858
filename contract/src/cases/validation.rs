//! Request-field validation (CONTRACT section 6): each bad value is a 400 naming the
//! field; a few boundary values are accepted.

use serde_json::{json, Value};

use super::{set, Case, Ctx};
use crate::expect::{not_gate, Expect, Message, Param};
use crate::http::RequestSpec;
use crate::routes::{self, Route};

/// A bad value for `field` on `route`, and what the 400 must say.
struct Bad {
    route: Route,
    field: &'static str,
    value: Value,
    param: Param,
    message: Message,
}

fn bad(route: Route, field: &'static str, value: Value) -> Bad {
    Bad {
        route,
        field,
        value,
        param: Param::exact(field),
        message: Message::NonEmpty,
    }
}

impl Bad {
    fn param(mut self, param: Param) -> Self {
        self.param = param;
        self
    }

    fn message(mut self, message: &str) -> Self {
        self.message = Message::exact(message);
        self
    }

    fn message_prefix(mut self, prefix: &str) -> Self {
        self.message = Message::prefix(prefix);
        self
    }
}

/// Sampling ranges, checked on both generation routes.
fn sampling(route: Route) -> Vec<Bad> {
    vec![
        bad(route, "temperature", json!(5)),
        bad(route, "temperature", json!(-0.1)),
        bad(route, "top_p", json!(0)),
        bad(route, "top_p", json!(1.5)),
        bad(route, "top_k", json!(-2)),
        bad(route, "min_p", json!(-0.1)),
        bad(route, "min_p", json!(1.5)),
        bad(route, "repetition_penalty", json!(0)),
        bad(route, "repetition_penalty", json!(-1)),
        bad(route, "presence_penalty", json!(2.5)),
        bad(route, "presence_penalty", json!(-3)),
        bad(route, "frequency_penalty", json!(2.5)),
        bad(route, "frequency_penalty", json!(-3)),
        bad(route, "seed", json!(9_223_372_036_854_775_808_u64)),
        bad(route, "stop", json!(["a", "b", "c", "d", "e"])),
        bad(route, "stop", json!([""])),
        bad(route, "stop", json!("")),
        bad(route, "n", json!(0)),
        bad(route, "n", json!(16_385)),
        bad(route, "stream_options", json!({"include_usage": true})),
        bad(route, "cache_salt", json!("")),
        bad(route, "cache_salt", json!("a".repeat(129))),
        bad(route, "cache_salt", json!("tenant/a")),
        bad(route, "cache_salt", json!("tenant@a")),
        bad(route, "cache_salt", json!("tenant\\a")),
        bad(route, "cache_salt", json!("tenant\u{0}a")),
        bad(route, "response_format", json!({"type": "json_schema"})),
    ]
}

fn bad_values(ctx: &Ctx) -> Vec<Bad> {
    let too_long = |model: Option<String>| {
        model
            .and_then(|model| ctx.models.max_model_len(&model))
            .map_or(10_000_000, |len| len + 1)
    };
    let chat_len = too_long(ctx.models.chat.clone());
    let embed_len = too_long(ctx.models.embedding.clone());
    let mut all = sampling(Route::Chat);
    all.extend(sampling(Route::Completions));
    all.extend([
        bad(Route::Chat, "top_logprobs", json!(2.5)).message("`top_logprobs` must be an integer."),
        bad(Route::Chat, "top_logprobs", json!(21)),
        bad(Route::Chat, "chat_template", json!("{{ messages }}")),
        bad(Route::Completions, "logprobs", json!(-2)),
        bad(Route::Completions, "prompt", json!([1, 2, 100_000_000]))
            .param(Param::OneOf(vec![Some("prompt".into()), None])),
        bad(Route::Completions, "prompt", json!([1, -5, 2]))
            .param(Param::OneOf(vec![Some("prompt".into()), None])),
        bad(
            Route::Completions,
            "truncate_prompt_tokens",
            json!(chat_len),
        ),
        bad(
            Route::Embeddings,
            "truncate_prompt_tokens",
            json!(embed_len),
        )
        .message(
            "truncate_prompt_tokens value is greater than max_model_len. Please request a \
             smaller truncation size.",
        ),
        bad(Route::Chat, "prompt_logprobs", json!("2")),
        bad(Route::Chat, "prompt_logprobs", json!(-2))
            .message("`prompt_logprobs` must be a positive value or -1."),
        bad(Route::Completions, "prompt_logprobs", json!(-2))
            .message("`prompt_logprobs` must be a positive value or -1."),
        // More than --max-logprobs (20 by default; the count is vLLM's whatever the limit).
        bad(Route::Completions, "prompt_logprobs", json!(1_000_000))
            .message_prefix("Requested prompt logprobs of 1000000, which is greater than max allowed: "),
        bad(Route::Completions, "suffix", json!("!")).message("suffix is not currently supported"),
        bad(Route::Chat, "tool_choice", json!("auto")).message(
            "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
        ),
        bad(Route::Embeddings, "normalize", json!(true))
            .message("Parameter `normalize` was removed; use `use_activation` instead."),
        bad(Route::Pooling, "normalize", json!(false))
            .message("Parameter `normalize` was removed; use `use_activation` instead."),
        bad(Route::Embeddings, "encoding_format", json!("hex")),
        bad(Route::Pooling, "encoding_format", json!("hex")),
    ]);
    all
}

fn body_for(route: Route, model: &str, field: &str, value: &Value) -> Value {
    let body = route.body(model);
    match (route, field) {
        // `top_logprobs` is only meaningful with `logprobs`.
        (Route::Chat, "top_logprobs") => {
            set(set(body, "logprobs", json!(true)), field, value.clone())
        }
        _ => set(body, field, value.clone()),
    }
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let mut cases: Vec<Case> = bad_values(ctx)
        .into_iter()
        .map(|item| {
            let name = format!(
                "validate {} {}={}",
                item.route.path(),
                item.field,
                crate::expect::clip(&item.value.to_string(), 40)
            );
            let Bad {
                route,
                field,
                value,
                param,
                message,
            } = item;
            Case::with_model(name, route.route(), route.model(ctx), |model| {
                (
                    RequestSpec::post_json(route.path(), body_for(route, model, field, &value)),
                    Expect::error(400, "BadRequestError", param, message).with(not_gate()),
                )
            })
        })
        .collect();

    // Seed below int64 cannot be a serde_json number: send the text.
    cases.push(Case::with_model(
        "validate /v1/chat/completions seed=-9223372036854775809",
        Route::Chat.route(),
        ctx.chat_model(),
        |model| {
            let text = format!(
                r#"{{"model":{},"messages":[{{"role":"user","content":"hi"}}],"max_tokens":2,"seed":-9223372036854775809}}"#,
                json!(model)
            );
            (
                RequestSpec::post_raw(Route::Chat.path(), Some("application/json"), text),
                Expect::bad_request("seed"),
            )
        },
    ));

    // Field combinations.
    for route in [Route::Chat, Route::Completions] {
        cases.push(Case::with_model(
            format!(
                "validate {} prompt_logprobs=1 with stream=true",
                route.path()
            ),
            route.route(),
            route.model(ctx),
            |model| {
                let body = set(
                    set(route.body(model), "stream", json!(true)),
                    "prompt_logprobs",
                    json!(1),
                );
                (
                    RequestSpec::post_json(route.path(), body),
                    Expect::error(
                        400,
                        "BadRequestError",
                        Param::exact("prompt_logprobs"),
                        Message::exact("`prompt_logprobs` are not available when `stream=True`."),
                    )
                    .with(not_gate()),
                )
            },
        ));
    }
    cases.push(Case::with_model(
        "validate /v1/chat/completions add_generation_prompt and continue_final_message both true",
        Route::Chat.route(),
        ctx.chat_model(),
        |model| {
            let body = json!({
                "model": model,
                "messages": [
                    {"role": "user", "content": "Name a colour."},
                    {"role": "assistant", "content": "Blue and"}
                ],
                "max_tokens": 2,
                "add_generation_prompt": true,
                "continue_final_message": true
            });
            (
                RequestSpec::post_json(Route::Chat.path(), body),
                Expect::error(
                    400,
                    "BadRequestError",
                    Param::OneOf(vec![
                        Some("add_generation_prompt".into()),
                        Some("continue_final_message".into()),
                        None,
                    ]),
                    Message::NonEmpty,
                )
                .with(not_gate()),
            )
        },
    ));

    cases.extend(accepted(ctx));
    cases
}

/// Boundary and alternative values that must be accepted.
fn accepted(ctx: &Ctx) -> Vec<Case> {
    let mut cases = Vec::new();
    let chat_ok: [(&str, Value); 8] = [
        ("temperature", json!(2)),
        ("top_p", json!(1)),
        ("top_k", json!(-1)),
        ("top_k", json!(0)),
        ("min_p", json!(1)),
        ("seed", json!(i64::MAX)),
        ("stop", json!(["a", "b", "c", "d"])),
        ("cache_salt", json!("a".repeat(128))),
    ];
    for (field, value) in chat_ok {
        let name = format!(
            "accept /v1/chat/completions {field}={}",
            crate::expect::clip(&value.to_string(), 40)
        );
        cases.push(Case::with_model(
            name,
            Route::Chat.route(),
            ctx.chat_model(),
            |model| {
                (
                    RequestSpec::post_json(
                        Route::Chat.path(),
                        set(Route::Chat.body(model), field, value),
                    ),
                    routes::chat_completion(),
                )
            },
        ));
    }
    cases.push(Case::with_model(
        "accept /v1/chat/completions logprobs=true top_logprobs=20",
        Route::Chat.route(),
        ctx.chat_model(),
        |model| {
            let body = set(
                set(
                    set(Route::Chat.body(model), "logprobs", json!(true)),
                    "top_logprobs",
                    json!(20),
                ),
                "max_tokens",
                json!(1),
            );
            (
                RequestSpec::post_json(Route::Chat.path(), body),
                routes::chat_completion().with(crate::expect::json_at(
                    "/choices/0/logprobs/content/0/top_logprobs",
                    "20 alternatives",
                    |v| v.as_array().is_some_and(|alts| alts.len() == 20),
                )),
            )
        },
    ));
    cases.push(Case::with_model(
        "accept /v1/chat/completions max_completion_tokens=1 wins over max_tokens=8",
        Route::Chat.route(),
        ctx.chat_model(),
        |model| {
            let body = set(
                set(Route::Chat.body(model), "max_tokens", json!(8)),
                "max_completion_tokens",
                json!(1),
            );
            (
                RequestSpec::post_json(Route::Chat.path(), body),
                routes::chat_completion().with(crate::expect::json_at(
                    "/usage/completion_tokens",
                    "at most 1",
                    |v| v.as_u64().is_some_and(|n| n <= 1),
                )),
            )
        },
    ));
    cases.push(Case::with_model(
        "accept /v1/completions prompt as token ids",
        Route::Completions.route(),
        ctx.chat_model(),
        |model| {
            (
                RequestSpec::post_json(
                    Route::Completions.path(),
                    set(Route::Completions.body(model), "prompt", json!([1, 2, 3])),
                ),
                routes::text_completion(),
            )
        },
    ));
    for format in ["float", "base64"] {
        cases.push(Case::with_model(
            format!("accept /v1/embeddings encoding_format={format}"),
            Route::Embeddings.route(),
            ctx.embedding_model(),
            |model| {
                let expect = Expect::ok_json(&format!("embedding encoded as {format}"))
                    .with(crate::expect::string_prefix("/id", "embd-"))
                    .with(crate::expect::json_at(
                        "/data/0/embedding",
                        if format == "float" {
                            "a list of numbers"
                        } else {
                            "a base64 string"
                        },
                        move |v| {
                            if format == "float" {
                                v.is_array()
                            } else {
                                v.is_string()
                            }
                        },
                    ));
                (
                    RequestSpec::post_json(
                        Route::Embeddings.path(),
                        set(
                            Route::Embeddings.body(model),
                            "encoding_format",
                            json!(format),
                        ),
                    ),
                    expect,
                )
            },
        ));
    }
    cases
}

//! Route forms and request options that must work (CONTRACT sections 1, 4-6): score and
//! rerank forms and aliases, batch inputs, content-part shapes, and generation options
//! whose effect is visible in the response.

use serde_json::{json, Value};

use super::{set, Case, Ctx};
use crate::expect::{json_at, not_gate, Expect, Message, Param};
use crate::http::RequestSpec;
use crate::routes::{self, unsupported_task, Route, DOCUMENTS, QUERY};

fn scores(count: usize) -> Expect {
    Expect::ok_json(&format!("{count} score(s), id score-..."))
        .with(crate::expect::string_prefix("/id", "score-"))
        .with(json_at(
            "/data",
            "the expected number of scores",
            move |v| {
                v.as_array().is_some_and(|d| {
                    d.len() == count
                        && d.iter()
                            .all(|item| item.get("score").is_some_and(Value::is_number))
                })
            },
        ))
}

fn rerank_results(count: usize) -> Expect {
    Expect::ok_json(&format!("{count} rerank result(s)")).with(json_at(
        "/results",
        "the expected number of results",
        move |v| v.as_array().is_some_and(|r| r.len() == count),
    ))
}

fn pooling_cases(ctx: &Ctx) -> Vec<Case> {
    let Ok(embed) = ctx.embedding_model() else {
        return vec![Case::decided(
            "features pooling routes",
            "POST /score",
            "an embedding model",
            ctx.embedding_model().map(|_| String::new()),
        )];
    };
    let two = json!(["What is the capital of France?", "Which fruit is yellow?"]);
    let mut cases = vec![
        Case::single(
            "features /score text_1 + text_2 (1:1)",
            RequestSpec::post_json(
                "/score",
                json!({"model": embed, "text_1": QUERY, "text_2": DOCUMENTS[0]}),
            ),
            scores(1),
        ),
        Case::single(
            "features /score data_1 + data_2 (1:N)",
            RequestSpec::post_json(
                "/score",
                json!({"model": embed, "data_1": QUERY, "data_2": DOCUMENTS}),
            ),
            scores(2),
        ),
        Case::single(
            "features /score queries + items (N:N)",
            RequestSpec::post_json(
                "/score",
                json!({"model": embed, "queries": two, "items": DOCUMENTS}),
            ),
            scores(2),
        ),
        Case::single(
            "features /v1/score alias",
            RequestSpec::post_json("/v1/score", Route::Score.body(&embed)),
            scores(2),
        ),
        Case::single(
            "features /v1/rerank alias",
            RequestSpec::post_json("/v1/rerank", Route::Rerank.body(&embed)),
            rerank_results(2),
        ),
        Case::single(
            "features /v2/rerank alias",
            RequestSpec::post_json("/v2/rerank", Route::Rerank.body(&embed)),
            rerank_results(2),
        ),
        Case::single(
            "features /rerank top_n=1 keeps the best document only",
            RequestSpec::post_json(
                "/rerank",
                set(Route::Rerank.body(&embed), "top_n", json!(1)),
            ),
            rerank_results(1).with(json_at("/results/0/index", "document 0", |v| v == 0)),
        ),
        Case::single(
            "features /rerank top_n=0 returns all",
            RequestSpec::post_json(
                "/rerank",
                set(Route::Rerank.body(&embed), "top_n", json!(0)),
            ),
            rerank_results(2),
        ),
        Case::single(
            "features /v1/embeddings batch input keeps order",
            RequestSpec::post_json(
                "/v1/embeddings",
                json!({"model": embed, "input": ["first text", "second text"]}),
            ),
            routes::embeddings()
                .with(json_at("/data/0/index", "0", |v| v == 0))
                .with(json_at("/data/1/index", "1", |v| v == 1)),
        ),
        Case::single(
            "features /pooling task=classify on an embedding model: unsupported",
            RequestSpec::post_json(
                "/pooling",
                set(Route::Pooling.body(&embed), "task", json!("classify")),
            ),
            unsupported_task("classify"),
        ),
    ];
    if ctx.models.classifier.is_none() {
        cases.push(Case::single(
            "features /classify on an embedding model: unsupported",
            RequestSpec::post_json("/classify", Route::Classify.body(&embed)),
            unsupported_task("classify"),
        ));
    }
    cases
}

fn chat_case(ctx: &Ctx, name: &str, edit: impl FnOnce(Value) -> Value, expect: Expect) -> Case {
    Case::with_model(name, Route::Chat.route(), ctx.chat_model(), |model| {
        (
            RequestSpec::post_json(Route::Chat.path(), edit(Route::Chat.body(model))),
            expect,
        )
    })
}

fn completion_case(
    ctx: &Ctx,
    name: &str,
    edit: impl FnOnce(Value) -> Value,
    expect: Expect,
) -> Case {
    Case::with_model(
        name,
        Route::Completions.route(),
        ctx.chat_model(),
        |model| {
            (
                RequestSpec::post_json(
                    Route::Completions.path(),
                    edit(Route::Completions.body(model)),
                ),
                expect,
            )
        },
    )
}

/// vLLM's prompt logprobs at `path`: one entry per prompt token, the first `null`, each other
/// a map from token id to `{logprob, rank, decoded_token}` with the top `k` (ranks 1..=k) and
/// the prompt token (one more entry when it is not among them).
fn prompt_logprobs_shape(reply: &crate::http::Reply, path: &str, k: u64) -> Result<(), String> {
    let json = reply.json.as_ref();
    let entries = json
        .and_then(|j| j.pointer(path))
        .and_then(Value::as_array)
        .ok_or_else(|| format!("no list at {path}"))?;
    let prompt = json
        .and_then(|j| j.pointer("/usage/prompt_tokens"))
        .and_then(Value::as_u64);
    if prompt != Some(entries.len() as u64) {
        return Err(format!(
            "{} entries for usage.prompt_tokens {prompt:?}",
            entries.len()
        ));
    }
    if entries.first() != Some(&Value::Null) {
        return Err("the first entry must be null".into());
    }
    for (i, e) in entries.iter().enumerate().skip(1) {
        let map = e
            .as_object()
            .ok_or_else(|| format!("entry {i} is not an object"))?;
        let mut ranks: Vec<u64> = Vec::new();
        for (id, lp) in map {
            if id.parse::<u32>().is_err()
                || !lp["logprob"].as_f64().is_some_and(|l| l <= 0.0)
                || !lp["decoded_token"].is_string()
            {
                return Err(format!("entry {i}: {id}: {lp} is not a prompt logprob"));
            }
            ranks.push(lp["rank"].as_u64().unwrap_or(0));
        }
        let top = (1..=k).all(|r| ranks.contains(&r));
        if !top || !(k..=k + 1).contains(&(map.len() as u64)) || ranks.contains(&0) {
            return Err(format!(
                "entry {i} must hold ranks 1..={k} and the prompt token: {e}"
            ));
        }
    }
    Ok(())
}

fn generation_cases(ctx: &Ctx) -> Vec<Case> {
    vec![
        chat_case(
            ctx,
            "features chat content as typed text parts",
            |b| {
                set(
                    b,
                    "messages",
                    json!([{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}]),
                )
            },
            routes::chat_completion(),
        ),
        chat_case(
            ctx,
            "features chat unknown content part type: 400 param type",
            |b| {
                set(
                    b,
                    "messages",
                    json!([{"role": "user", "content": [{"type": "contract_bogus", "x": 1}]}]),
                )
            },
            Expect::bad_request("type"),
        ),
        chat_case(
            ctx,
            "features chat video_url as a bare string inside a typed part: 400",
            |b| {
                set(
                    b,
                    "messages",
                    json!([{"role": "user", "content": [
                        {"type": "video_url", "video_url": "http://example.com/v.mp4"}
                    ]}]),
                )
            },
            Expect::error(400, "BadRequestError", Param::Any, Message::NonEmpty).with(not_gate()),
        ),
        chat_case(
            ctx,
            "features chat n=2 gives two choices",
            |b| set(b, "n", json!(2)),
            routes::chat_completion().with(json_at("/choices", "two choices", |v| {
                v.as_array().is_some_and(|c| c.len() == 2)
            })),
        ),
        chat_case(
            ctx,
            "features chat logprobs=true gives token logprobs",
            |b| set(b, "logprobs", json!(true)),
            routes::chat_completion().with(json_at(
                "/choices/0/logprobs/content/0/logprob",
                "a number",
                Value::is_number,
            )),
        ),
        chat_case(
            ctx,
            "features chat chat_template_kwargs accepted (their effect: gateway router tests)",
            |b| set(b, "chat_template_kwargs", json!({"contract_flag": true})),
            routes::chat_completion(),
        ),
        completion_case(
            ctx,
            "features completions echo=true starts with the prompt",
            |b| set(b, "echo", json!(true)),
            routes::text_completion().with(json_at(
                "/choices/0/text",
                "text starting with the prompt",
                |v| {
                    v.as_str()
                        .is_some_and(|t| t.starts_with("The capital of France is"))
                },
            )),
        ),
        completion_case(
            ctx,
            "features completions logprobs=2 gives the top 2 alternatives per token",
            |b| set(b, "logprobs", json!(2)),
            routes::text_completion()
                .with(json_at(
                    "/choices/0/logprobs/top_logprobs",
                    "one object per token, each with 2 or 3 entries (the top 2 and the sampled)",
                    |v| {
                        v.as_array().is_some_and(|steps| {
                            !steps.is_empty()
                                && steps.iter().all(|step| {
                                    step.as_object().is_some_and(|m| (2..=3).contains(&m.len()))
                                })
                        })
                    },
                ))
                .with(|reply| {
                    let json = reply.json.as_ref();
                    let count = |path: &str| {
                        json.and_then(|j| j.pointer(path))
                            .and_then(Value::as_array)
                            .map(Vec::len)
                    };
                    let tokens = json
                        .and_then(|j| j.pointer("/usage/completion_tokens"))
                        .and_then(Value::as_u64)
                        .map(|n| n as usize);
                    let lists = [
                        count("/choices/0/logprobs/tokens"),
                        count("/choices/0/logprobs/token_logprobs"),
                        count("/choices/0/logprobs/top_logprobs"),
                    ];
                    if lists.iter().all(|n| *n == tokens && tokens.is_some()) {
                        Ok(())
                    } else {
                        Err(format!(
                            "tokens/token_logprobs/top_logprobs lengths {lists:?} must all equal \
                             usage.completion_tokens {tokens:?}"
                        ))
                    }
                }),
        ),
        completion_case(
            ctx,
            "features completions prompt_logprobs=2 gives a choice's prompt entries",
            |b| set(b, "prompt_logprobs", json!(2)),
            routes::text_completion()
                .with(|reply| prompt_logprobs_shape(reply, "/choices/0/prompt_logprobs", 2)),
        ),
        chat_case(
            ctx,
            "features chat prompt_logprobs=1 gives the response's prompt entries",
            |b| set(b, "prompt_logprobs", json!(1)),
            routes::chat_completion()
                .with(|reply| prompt_logprobs_shape(reply, "/prompt_logprobs", 1)),
        ),
        completion_case(
            ctx,
            "features completions batch of prompts gives a choice each",
            |b| set(b, "prompt", json!(["One", "Two"])),
            routes::text_completion().with(json_at("/choices", "two choices", |v| {
                v.as_array().is_some_and(|c| c.len() == 2)
            })),
        ),
    ]
}

pub fn cases(ctx: &Ctx) -> Vec<Case> {
    let mut cases = pooling_cases(ctx);
    cases.extend(generation_cases(ctx));
    cases
}

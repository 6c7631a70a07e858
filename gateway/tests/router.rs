//! Router-level tests: the whole app (front service, dispatch, handlers, policy layers) driven
//! with `oneshot` requests, no socket and no built binary, over a real engine serving the tiny
//! committed checkpoint (`tests/data/tiny-llama`), which starts in milliseconds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use clap::Parser;
use gateway::app::{app, HttpLimits};
use gateway::cli::{Cli, Command};
use gateway::state::{AppState, Settings};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

const MODEL: &str = "tiny";

type App = gateway::http::front::Front<gateway::app::Dispatch>;

/// The app as `gateway serve --model tests/data/tiny-llama --served-model-name tiny <extra>`
/// builds it.
fn server(extra: &[&str]) -> App {
    server_and_state(extra).0
}

fn server_and_state(extra: &[&str]) -> (App, Arc<AppState>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-llama");
    let mut argv = vec![
        "gateway".to_string(),
        "serve".into(),
        "--model".into(),
        dir.display().to_string(),
        "--served-model-name".into(),
        MODEL.into(),
        "--device".into(),
        "cpu".into(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not a serve command");
    };
    let settings = Settings::from_args(&args).unwrap();
    let engine = engine::handle::EngineHandle::start(&settings.models, &settings.engine).unwrap();
    let options = settings.front.clone();
    let state = Arc::new(AppState::new(&args, settings, engine, None).unwrap());
    let app = app(
        state.clone(),
        HttpLimits {
            max_concurrent: args.max_concurrent_requests,
            timeout: Duration::from_secs(args.request_timeout),
            options,
        },
    );
    (app, state)
}

async fn call(app: &App, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_completion_has_the_openai_shape() {
    let app = server(&[]);
    let (status, body) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": MODEL, "max_tokens": 5, "temperature": 0,
                    "messages": [{"role": "user", "content": "Hi"}]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["usage"]["completion_tokens"], 5);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_card_names_the_device() {
    let app = server(&[]);
    let (status, body) = call(&app, "GET", "/v1/models", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"][0]["id"], MODEL);
    assert_eq!(body["data"][0]["device"], "cpu");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_field_is_a_400_naming_it() {
    let app = server(&[]);
    let (status, body) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": "Hi", "temperature": -1})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "temperature", "{body}");
    assert_eq!(body["error"]["code"], 400, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_processor_kwargs_are_refused_at_the_gate() {
    let app = server(&[]);
    let (status, body) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(
            json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                    "mm_processor_kwargs": {"num_crops": 4}}),
        ),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "mm_processor_kwargs", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_sequences_than_max_num_seqs_is_a_400() {
    let app = server(&["--max-num-seqs", "2"]);
    let (status, body) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": "Hi", "n": 3, "max_tokens": 2})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "n", "{body}");
    let (status, body) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": "Hi", "n": 2, "max_tokens": 2})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_holding_every_slot_leaves_a_newcomer_its_share() {
    let app = server(&["--max-num-seqs", "2"]);
    // A stream of n = 2 takes both slots; its first event shows it is running.
    let req = Request::builder()
        .method("POST")
        .uri("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"model": MODEL, "prompt": "Hi", "n": 2, "max_tokens": 1500,
                   "ignore_eos": true, "stream": true})
            .to_string(),
        ))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some_and(|d| d.starts_with(b"data: ")));
    // Another request gets its share (1 of 2) and runs while the stream is open...
    let (status, reply) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2})),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 2, "{reply}");
    // ...but not more than its share: that is overload, not a 400.
    let (status, reply) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": "Hi", "n": 2, "max_tokens": 2})),
    )
    .await;
    assert_eq!(status, 503, "{reply}");
    // The stream is still going.
    let next = body.frame().await.unwrap().unwrap();
    assert!(next
        .data_ref()
        .is_some_and(|d| !d.starts_with(b"data: [DONE]")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_once_draining() {
    let (app, state) = server_and_state(&[]);
    assert_eq!(call(&app, "GET", "/health", None).await.0, 200);
    state
        .draining
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(call(&app, "GET", "/health", None).await.0, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_too_long_by_its_bytes_is_refused_before_tokenising() {
    let app = server(&[]);
    // 4 MB of text: at least ~100k tokens for a 2048-token model, whatever they are.
    let huge = "lorem ipsum ".repeat(350_000);
    let (status, body) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": huge, "max_tokens": 2})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "prompt");
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    // "at least N tokens" is the byte bound's message: the tokenizer never ran.
    assert!(msg.contains("at least"), "{msg}");
    // The same prompt with truncate_prompt_tokens is cut to fit, not refused.
    let (status, body) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(
            json!({"model": MODEL, "prompt": "lorem ipsum ".repeat(20_000),
                    "max_tokens": 2, "truncate_prompt_tokens": 100}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // And chat.
    let (status, body) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": MODEL, "max_tokens": 2,
                    "messages": [{"role": "user", "content": huge}]})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "messages");
}

/// `chat_template_kwargs` reach the template, over the deployment's defaults: the template
/// prints a kwarg, and the prompt's token count shows which value it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_kwargs_reach_the_template_over_the_defaults() {
    let app = server(&[
        "--trust-request-chat-template",
        "--default-chat-template-kwargs",
        r#"{"suffix": " from the deployment"}"#,
    ]);
    let template = "{% for m in messages %}{{ m.content }}{% endfor %}{{ suffix | default('') }}";
    let prompt_tokens = |kwargs: Option<Value>| {
        let app = app.clone();
        async move {
            let mut body = json!({"model": MODEL, "max_tokens": 1, "chat_template": template,
                "messages": [{"role": "user", "content": "Hi"}]});
            if let Some(kwargs) = kwargs {
                body["chat_template_kwargs"] = kwargs;
            }
            let (status, reply) = call(&app, "POST", "/v1/chat/completions", Some(body)).await;
            assert_eq!(status, 200, "{reply}");
            reply["usage"]["prompt_tokens"].as_u64().unwrap()
        }
    };
    let default = prompt_tokens(None).await;
    let cleared = prompt_tokens(Some(json!({"suffix": ""}))).await;
    let longer = prompt_tokens(Some(json!({"suffix": " set by this request, and longer"}))).await;
    assert!(cleared < default, "cleared {cleared}, default {default}");
    assert!(longer > default, "request {longer}, default {default}");
}

/// Chat `echo` prefixes the reply with a continued assistant message, streamed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_echo_prefixes_the_continued_assistant_message() {
    let app = server(&[]);
    let body = |echo: bool| {
        json!({"model": MODEL, "max_tokens": 3, "temperature": 0, "echo": echo,
            "continue_final_message": true, "add_generation_prompt": false,
            "messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello there"}]})
    };
    let (status, plain) = call(&app, "POST", "/v1/chat/completions", Some(body(false))).await;
    assert_eq!(status, 200, "{plain}");
    let (status, echoed) = call(&app, "POST", "/v1/chat/completions", Some(body(true))).await;
    assert_eq!(status, 200, "{echoed}");
    let text = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(text(&echoed), format!("Hello there{}", text(&plain)));
    // Without a final assistant message there is nothing to echo.
    let (_, user_last) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(
            json!({"model": MODEL, "max_tokens": 3, "temperature": 0, "echo": true,
            "messages": [{"role": "user", "content": "Hi"}]}),
        ),
    )
    .await;
    assert!(!text(&user_last).starts_with("Hi"), "{user_last}");
}

/// Fields the server cannot honour are 400s naming them, never silently ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_fields_are_400s_naming_them() {
    let app = server(&[]);
    let chat = |extra: Value| {
        let mut body = json!({"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    for (extra, param) in [
        (json!({"prompt_logprobs": "2"}), "prompt_logprobs"),
        (json!({"prompt_logprobs": 2.5}), "prompt_logprobs"),
        (json!({"use_beam_search": true}), "use_beam_search"),
        (json!({"priority": 3}), "priority"),
        (json!({"tool_choice": "auto"}), "tool_choice"),
        (json!({"vllm_xargs": {"k": 1}}), "vllm_xargs"),
    ] {
        let (status, body) = call(&app, "POST", "/v1/chat/completions", Some(chat(extra))).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["param"], param, "{body}");
    }
    // Neutral values and fields ignored on purpose are fine.
    let (status, body) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(chat(
            json!({"use_beam_search": false, "priority": 0, "best_of": 1,
            "request_id": "mine", "tool_choice": "none"}),
        )),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": "Hi", "suffix": "!"})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"]["message"],
        "suffix is not currently supported"
    );
}

/// The body of a reply as text (for SSE).
async fn call_text(app: &App, body: Value) -> (u16, String) {
    let req = Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Tool calls from a stream, assembled as the OpenAI SDK does: by `index`, names and ids
/// taken once, arguments concatenated.
fn assemble_calls(sse: &str) -> (Vec<(String, String)>, String) {
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut finish = String::new();
    for data in sse.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        let choice = &chunk["choices"][0];
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
        for delta in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = delta["index"].as_u64().unwrap() as usize;
            if calls.len() <= i {
                calls.resize(i + 1, (String::new(), String::new()));
            }
            if let Some(name) = delta["function"]["name"].as_str() {
                calls[i].0 = name.to_string();
            }
            calls[i].1 += delta["function"]["arguments"].as_str().unwrap_or_default();
        }
    }
    (calls, finish)
}

/// A named or required `tool_choice` constrains the reply to the function's parameters, so
/// the arguments always parse and carry the required keys, whole and streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_and_required_tool_choice_give_calls_that_validate() {
    let app = server(&["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "additionalProperties": false,
            "properties": {"city": {"type": "string", "maxLength": 12},
                           "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"]}}}]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let valid = |args: &str| {
        let v: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{e}: {args}"));
        assert!(v["city"].is_string(), "{v}");
        assert!(v["unit"] == "c" || v["unit"] == "f", "{v}");
    };
    for (choice, want_finish) in [(named, "stop"), (json!("required"), "tool_calls")] {
        for temperature in [0.0, 1.0] {
            let body = json!({"model": MODEL, "max_tokens": 200, "temperature": temperature,
                "seed": 3, "tools": tools, "tool_choice": choice,
                "messages": [{"role": "user", "content": "Weather in Oslo?"}]});
            let (status, reply) =
                call(&app, "POST", "/v1/chat/completions", Some(body.clone())).await;
            assert_eq!(status, 200, "{reply}");
            let message = &reply["choices"][0]["message"];
            // `required` may make several calls; each must validate.
            let calls = message["tool_calls"].as_array().unwrap();
            assert!(!calls.is_empty(), "{reply}");
            for call in calls {
                assert_eq!(call["function"]["name"], "get_weather");
                valid(call["function"]["arguments"].as_str().unwrap());
            }
            assert_eq!(reply["choices"][0]["finish_reason"], want_finish, "{reply}");
            let mut streamed = body;
            streamed["stream"] = json!(true);
            let (status, sse) = call_text(&app, streamed).await;
            assert_eq!(status, 200, "{sse}");
            let (calls, finish) = assemble_calls(&sse);
            assert!(!calls.is_empty(), "{sse}");
            for (name, arguments) in &calls {
                assert_eq!(name, "get_weather");
                valid(arguments);
            }
            assert_eq!(finish, want_finish, "{sse}");
        }
    }
    // A function that is not in `tools`, and `required` without tools: 400s naming tool_choice.
    for (tool_choice, tools) in [
        (
            json!({"type": "function", "function": {"name": "nope"}}),
            tools.clone(),
        ),
        (json!("required"), json!([])),
    ] {
        let body = json!({"model": MODEL, "tools": tools, "tool_choice": tool_choice,
            "messages": [{"role": "user", "content": "Hi"}]});
        let (status, reply) = call(&app, "POST", "/v1/chat/completions", Some(body)).await;
        assert_eq!(status, 400, "{reply}");
        assert_eq!(reply["error"]["param"], "tool_choice", "{reply}");
    }
}

/// `--reasoning-parser qwen3` splits `<think>` reasoning from the answer, whole and streamed
/// (the reply is forced to a known text through `guided_choice`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reasoning_parser_splits_think_from_the_answer() {
    let app = server(&["--reasoning-parser", "qwen3"]);
    let body = json!({"model": MODEL, "max_tokens": 60,
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "guided_choice": ["<think>the capital is Paris</think>Paris"]});
    let (status, reply) = call(&app, "POST", "/v1/chat/completions", Some(body.clone())).await;
    assert_eq!(status, 200, "{reply}");
    let message = &reply["choices"][0]["message"];
    assert_eq!(
        message["reasoning_content"], "the capital is Paris",
        "{reply}"
    );
    assert_eq!(message["content"], "Paris", "{reply}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, sse) = call_text(&app, streamed).await;
    assert_eq!(status, 200, "{sse}");
    let (mut reasoning, mut content) = (String::new(), String::new());
    for data in sse.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        let delta = &chunk["choices"][0]["delta"];
        reasoning += delta["reasoning_content"].as_str().unwrap_or_default();
        content += delta["content"].as_str().unwrap_or_default();
    }
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        ("the capital is Paris", "Paris")
    );
    let mut hidden = body.clone();
    hidden["include_reasoning"] = json!(false);
    hidden["stream"] = json!(false);
    let (_, reply) = call(&app, "POST", "/v1/chat/completions", Some(hidden)).await;
    assert!(
        reply["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{reply}"
    );
    assert_eq!(
        reply["choices"][0]["message"]["content"], "Paris",
        "{reply}"
    );
    // Without the tags the reply is all content.
    let (_, plain) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": MODEL, "max_tokens": 10,
            "messages": [{"role": "user", "content": "Hi"}], "guided_choice": ["Hello"]})),
    )
    .await;
    assert_eq!(
        plain["choices"][0]["message"]["content"], "Hello",
        "{plain}"
    );
    assert!(
        plain["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{plain}"
    );
}

/// Checks vLLM's prompt logprobs: one entry per prompt token (`len`), the first `null`, each
/// other a map holding the prompt token (with its rank; checked when `prompt` is known) and the
/// top `k` (ranks 1..=k).
fn check_prompt_logprobs(entries: &Value, len: usize, prompt: Option<&[u32]>, k: usize) {
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), len);
    assert_eq!(entries[0], Value::Null);
    for (i, e) in entries.iter().enumerate().skip(1) {
        let map = e.as_object().unwrap();
        for v in map.values() {
            assert!(v["rank"].as_u64().unwrap() >= 1, "{e}");
            assert!(v["logprob"].as_f64().unwrap() <= 0.0, "{e}");
            assert!(v["decoded_token"].is_string(), "{e}");
        }
        let mut ranks: Vec<u64> = map.values().map(|v| v["rank"].as_u64().unwrap()).collect();
        ranks.sort_unstable();
        for r in 1..=k as u64 {
            assert!(ranks.contains(&r), "rank {r} missing in {e}");
        }
        assert!((k..=k + 1).contains(&map.len()), "{e}");
        if let Some(prompt) = prompt {
            let own = &map[&prompt[i].to_string()];
            let in_top = own["rank"].as_u64().unwrap() <= k as u64;
            assert_eq!(map.len(), if in_top { k } else { k + 1 }, "{e}");
        }
        // The alternatives are ordered by rank and their logprobs fall with it.
        let mut by_rank: Vec<(u64, f64)> = map
            .values()
            .map(|v| (v["rank"].as_u64().unwrap(), v["logprob"].as_f64().unwrap()))
            .collect();
        by_rank.sort_by_key(|p| p.0);
        assert!(by_rank.windows(2).all(|w| w[0].1 >= w[1].1), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_have_vllms_shape() {
    let app = server(&[]);
    let prompt: Vec<u32> = vec![5, 17, 300, 42, 9, 811];
    let (status, body) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": prompt, "max_tokens": 2, "prompt_logprobs": 3})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    check_prompt_logprobs(
        &body["choices"][0]["prompt_logprobs"],
        prompt.len(),
        Some(&prompt),
        3,
    );
    // Without the field there is none.
    let (_, plain) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": prompt, "max_tokens": 2})),
    )
    .await;
    assert!(
        plain["choices"][0].get("prompt_logprobs").is_none(),
        "{plain}"
    );
    // k = 0: the prompt token alone.
    let (status, zero) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0})),
    )
    .await;
    assert_eq!(status, 200, "{zero}");
    for (i, e) in zero["choices"][0]["prompt_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .skip(1)
    {
        assert_eq!(e.as_object().unwrap().len(), 1, "{e}");
        assert_eq!(
            e[prompt[i].to_string()]["logprob"],
            body["choices"][0]["prompt_logprobs"][i][prompt[i].to_string()]["logprob"]
        );
    }

    // Chat: on the response (the choices share the prompt), as vLLM.
    let (status, chat) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(
            json!({"model": MODEL, "max_tokens": 2, "n": 2, "prompt_logprobs": 2,
            "messages": [{"role": "user", "content": "Hi there"}]}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{chat}");
    let n = chat["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    check_prompt_logprobs(&chat["prompt_logprobs"], n, None, 2);
    assert!(chat["choices"][0].get("prompt_logprobs").is_none());

    // Streams carry none: vLLM refuses a positive count (and -1), accepts 0.
    let stream = |k: i64| {
        json!({"model": MODEL, "prompt": "Hello", "max_tokens": 2, "stream": true,
            "prompt_logprobs": k})
    };
    for k in [1, -1] {
        let (status, err) = call(&app, "POST", "/v1/completions", Some(stream(k))).await;
        assert_eq!(status, 400, "{err}");
        assert_eq!(
            err["error"]["message"],
            "`prompt_logprobs` are not available when `stream=True`."
        );
        assert_eq!(err["error"]["param"], "prompt_logprobs");
    }
    let (status, sse) = call_text(
        &app,
        json!({"model": MODEL, "max_tokens": 2, "stream": true, "prompt_logprobs": 0,
            "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{sse}");
    assert!(!sse.contains("prompt_logprobs"), "{sse}");

    // Out of range, with vLLM's messages.
    for (k, message) in [
        (
            -2,
            "`prompt_logprobs` must be a positive value or -1.".to_string(),
        ),
        (
            21,
            "Requested prompt logprobs of 21, which is greater than max allowed: 20".into(),
        ),
        (
            -1,
            "Requested prompt logprobs of 1024, which is greater than max allowed: 20".into(),
        ),
    ] {
        for (path, body) in [
            (
                "/v1/completions",
                json!({"model": MODEL, "prompt": "Hello", "max_tokens": 2}),
            ),
            (
                "/v1/chat/completions",
                json!({"model": MODEL, "max_tokens": 2,
                    "messages": [{"role": "user", "content": "Hi"}]}),
            ),
        ] {
            let mut body = body;
            body["prompt_logprobs"] = json!(k);
            let (status, err) = call(&app, "POST", path, Some(body)).await;
            assert_eq!(status, 400, "{path} {k}: {err}");
            assert_eq!(err["error"]["message"], message, "{path} {k}");
            assert_eq!(err["error"]["param"], "prompt_logprobs");
        }
    }
}

/// `-1` is the whole vocabulary when `--max-logprobs` allows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_minus_one_is_the_whole_vocabulary() {
    let app = server(&["--max-logprobs", "1024"]);
    let (status, body) = call(
        &app,
        "POST",
        "/v1/completions",
        Some(
            json!({"model": MODEL, "prompt": [5, 17, 300], "max_tokens": 1,
            "prompt_logprobs": -1}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let entries = body["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(entries[1].as_object().unwrap().len(), 1024);
    let total: f64 = entries[1]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v["logprob"].as_f64().unwrap().exp())
        .sum();
    assert!((total - 1.0).abs() < 1e-3, "{total}");
}

/// `echo` with `logprobs`: the prompt's tokens lead the logprobs (the first without one), with
/// the prompt logprobs' values, then the generated tokens, whole and streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_with_logprobs_covers_the_prompt() {
    let app = server(&[]);
    let prompt: Vec<u32> = vec![5, 17, 300, 42, 9];
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 3, "echo": true,
                      "logprobs": 2, "ignore_eos": true, "temperature": 0});
    let (status, reply) = call(&app, "POST", "/v1/completions", Some(body.clone())).await;
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    let lp = &choice["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), prompt.len() + 3, "{lp}");
    let token_lps = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(token_lps[0], Value::Null);
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    // The prompt positions carry the same values as vLLM's `prompt_logprobs`.
    let entries = &choice["prompt_logprobs"];
    for (i, id) in prompt.iter().enumerate().skip(1) {
        let want = entries[i][id.to_string()]["logprob"].as_f64().unwrap();
        let got = token_lps[i].as_f64().unwrap();
        assert!((want - got).abs() < 1e-6, "position {i}: {got} vs {want}");
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!((2..=3).contains(&top.len()), "{top:?}");
    }
    for v in &token_lps[1..] {
        assert!(v.as_f64().unwrap() <= 0.0);
    }
    // Offsets rise through the prompt into the reply, which starts after the echoed text.
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    assert_eq!(offsets[0], 0);
    let text = choice["text"].as_str().unwrap();
    let reply_start = offsets[prompt.len()] as usize;
    assert!(reply_start <= text.len());

    // Streamed: the same tokens over the chunks, the prompt's in the first.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let req = Request::builder()
        .method("POST")
        .uri("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(streamed.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let sse =
        String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).into_owned();
    let chunks: Vec<Value> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let all: Vec<Value> = chunks
        .iter()
        .flat_map(|c| {
            c["choices"][0]["logprobs"]["tokens"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(&all, tokens, "{sse}");
    let first = &chunks[0]["choices"][0]["logprobs"];
    assert_eq!(first["token_logprobs"][0], Value::Null, "{sse}");
    assert!(first["tokens"].as_array().unwrap().len() > prompt.len());
}

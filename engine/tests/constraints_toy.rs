//! Structured outputs and token rules through the scheduler on the toy model: a grammar's end
//! stops the sequence, and preemption with recompute keeps each matcher in step (the matcher
//! is advanced once per generated token, not again for recomputed ones).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod toy;

use engine::api::{Constraint, FinishReason, SamplingParams};
use engine::handle::{EngineConfig, EngineHandle, GenerationStream, LoadedModel, ModelSpec};
use engine::load::LoadedDecoder;
use engine::EngineError;
use toy::{byte_tokenizer, request, ToyModel, EOS};

fn start(cfg: &EngineConfig) -> (EngineHandle, engine::handle::ModelHandle) {
    // Slow enough steps that requests submitted one after another (each compiling its
    // grammar first) still run together.
    let mut toy = ToyModel::new(512);
    toy.delay = std::time::Duration::from_millis(2);
    let model = LoadedModel::Decoder(LoadedDecoder {
        model: Box::new(toy),
        tokenizer: byte_tokenizer(),
        chat_template: None,
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
        architecture: "toy".into(),
        media: None,
    });
    let spec = ModelSpec {
        path: "toy".into(),
        served_name: "toy".into(),
    };
    let engine = EngineHandle::from_loaded(vec![(spec, model)], cfg).unwrap();
    let m = engine.model("toy").unwrap();
    (engine, m)
}

fn config() -> EngineConfig {
    EngineConfig {
        max_model_len: Some(128),
        max_num_seqs: 32,
        max_num_batched_tokens: 64,
        kv_cache_tokens: Some(1024),
        block_size: 4,
        ..EngineConfig::default()
    }
}

async fn collect(mut s: GenerationStream) -> (String, Vec<u32>, FinishReason) {
    let (mut text, mut ids, mut reason) = (String::new(), Vec::new(), FinishReason::Abort);
    while let Some(d) = s.next().await {
        let d = d.unwrap();
        text.push_str(&d.text);
        ids.extend(d.token_ids);
        if let Some(f) = d.finish {
            reason = f.reason;
        }
    }
    (text, ids, reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choice_ends_the_sequence_when_the_grammar_is_complete() {
    let (_e, m) = start(&config());
    // The toy model wants "KL..." after this prompt; the grammar wins, and its end stops the
    // sequence without an EOS token even with ignore_eos.
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 20,
        ignore_eos: true,
        constraint: Some(Constraint::Choice(vec!["xyz".into(), "xy!".into()])),
        ..Default::default()
    };
    let (text, ids, reason) = collect(m.generate(request("ABCDEFGHIJ", params)).unwrap()).await;
    assert!(text == "xyz" || text == "xy!", "{text:?} {ids:?}");
    assert_eq!(ids.len(), 3);
    assert!(!ids.contains(&EOS));
    assert_eq!(reason, FinishReason::Stop);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_rules_on_the_toy_model() {
    let (_e, m) = start(&config());
    let greedy = |extra: SamplingParams| SamplingParams {
        temperature: 0.0,
        max_tokens: 4,
        ignore_eos: true,
        ..extra
    };
    // The toy's greedy continuation of "AB" starts with 'D' (0x44).
    let (_, ids, _) = collect(
        m.generate(request("AB", greedy(Default::default())))
            .unwrap(),
    )
    .await;
    assert_eq!(ids[0], u32::from(b'D'));
    let (_, ids, _) = collect(
        m.generate(request(
            "AB",
            greedy(SamplingParams {
                logit_bias: vec![(u32::from(b'D'), -100.0), (u32::from(b'z'), 100.0)],
                ..Default::default()
            }),
        ))
        .unwrap(),
    )
    .await;
    assert_eq!(ids, vec![u32::from(b'z'); 4]);
    let allowed = vec![u32::from(b'a'), u32::from(b'b')];
    let (_, ids, _) = collect(
        m.generate(request(
            "AB",
            greedy(SamplingParams {
                allowed_token_ids: Some(allowed.clone()),
                ..Default::default()
            }),
        ))
        .unwrap(),
    )
    .await;
    assert!(ids.iter().all(|t| allowed.contains(t)), "{ids:?}");
    let bad = vec![(u32::from(b'z'), 100.0)];
    let err = m
        .generate(request(
            "AB",
            greedy(SamplingParams {
                logit_bias: vec![(9999, 1.0)],
                ..Default::default()
            }),
        ))
        .err()
        .unwrap();
    assert!(
        matches!(&err, EngineError::InvalidRequest { param: Some(p), .. } if p == "logit_bias"),
        "{err:?}"
    );
    // A bad word of several tokens: its last token is banned only after the rest.
    let (text, _, _) = collect(
        m.generate(request(
            "AB",
            greedy(SamplingParams {
                logit_bias: bad,
                bad_words: vec!["zz".into()],
                ..Default::default()
            }),
        ))
        .unwrap(),
    )
    .await;
    assert!(!text.contains("zz"), "{text:?}");
    assert!(text.starts_with('z'), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_keeps_the_matcher_in_step() {
    let prompts = ["ABCDEFGHIJ", "BCDEFGHIJK", "CDEFGHIJKL", "DEFGHIJKLM"];
    let params = SamplingParams {
        temperature: 0.8,
        seed: Some(5),
        max_tokens: 40,
        constraint: Some(Constraint::Regex("[a-z]{30}".into())),
        ..Default::default()
    };
    async fn run(
        m: &engine::handle::ModelHandle,
        prompts: &[&str],
        params: &SamplingParams,
    ) -> Vec<String> {
        let tasks: Vec<_> = prompts
            .iter()
            .map(|p| tokio::spawn(collect(m.generate(request(p, params.clone())).unwrap())))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            let (text, ids, reason) = t.await.unwrap();
            assert_eq!(reason, FinishReason::Stop, "{text:?}");
            assert_eq!(ids.len(), 30);
            assert!(text.bytes().all(|b| b.is_ascii_lowercase()), "{text:?}");
            out.push(text);
        }
        out
    }
    let (_e1, roomy) = start(&config());
    let reference = run(&roomy, &prompts, &params).await;
    // 16 blocks of 4 tokens; each sequence grows to 40 tokens (10 blocks).
    let tight = EngineConfig {
        kv_cache_tokens: Some(64),
        max_model_len: Some(64),
        enable_prefix_caching: false,
        ..config()
    };
    let (_e2, small) = start(&tight);
    let got = run(&small, &prompts, &params).await;
    assert!(small.engine_stats().unwrap().preemptions > 0);
    assert_eq!(got, reference);
}

/// The longest run of whitespace between JSON tokens in `text` (string contents excluded).
fn longest_whitespace_run(text: &str) -> usize {
    let (mut in_string, mut escaped) = (false, false);
    let (mut run, mut longest) = (0, 0);
    for c in text.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if matches!(c, ' ' | '\n' | '\r' | '\t') {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
            in_string = c == '"';
        }
    }
    longest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_whitespace_is_bounded_unless_the_request_says_otherwise() {
    let (_e, m) = start(&config());
    // A model that would rather write whitespace than anything else (as a weak model stuck in
    // a run of spaces and newlines does).
    let params = |constraint| SamplingParams {
        temperature: 0.0,
        max_tokens: 60,
        ignore_eos: true,
        logit_bias: vec![(u32::from(b' '), 50.0), (u32::from(b'\n'), 49.0)],
        constraint: Some(constraint),
        ..Default::default()
    };
    let run = |c| {
        let m = m.clone();
        async move { collect(m.generate(request("AB", params(c))).unwrap()).await }
    };
    let schema = serde_json::json!({"type": "object", "additionalProperties": false,
        "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    // By default: a space, or a newline and at most 20 spaces or tabs, between tokens.
    for c in [
        Constraint::JsonObject,
        Constraint::JsonSchema(schema.clone()),
    ] {
        let (text, _, _) = run(c).await;
        assert!(longest_whitespace_run(&text) <= 21, "{text:?}");
        assert!(text.trim_start().starts_with('{'), "{text:?}");
    }
    // Compact JSON: no whitespace at all outside strings.
    let mut compact = schema.clone();
    compact["x-guidance"] = serde_json::json!({"whitespace_flexible": false});
    let (text, _, _) = run(Constraint::JsonSchema(compact)).await;
    assert_eq!(longest_whitespace_run(&text), 0, "{text:?}");
    // llguidance's own default (any whitespace), asked for explicitly: the model spends its
    // whole budget on it, which the default above prevents.
    let mut flexible = schema;
    flexible["x-guidance"] = serde_json::json!({"whitespace_flexible": true});
    let (text, _, reason) = run(Constraint::JsonSchema(flexible)).await;
    assert!(longest_whitespace_run(&text) > 21, "{text:?}");
    assert_eq!(reason, FinishReason::Length);
}

//! The serving core end to end on a toy model: continuous batching, cancellation, seeded
//! sampling, preemption, prefix caching, admission limits, stop conditions, embeddings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod toy;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use engine::api::{Delta, Finish, FinishReason, GenerateRequest, SamplingParams, StopReason, Task};
use engine::handle::{
    EngineConfig, EngineHandle, GenerationStream, LoadedModel, ModelHandle, ModelKind, ModelSpec,
};
use engine::load::LoadedDecoder;
use engine::model::LoadedEncoder;
use engine::EngineError;
use toy::{byte_tokenizer, expected, request, ToyEmbedder, ToyModel, EOS};

const NAME: &str = "toy";

fn decoder(model: ToyModel) -> LoadedModel {
    LoadedModel::Decoder(LoadedDecoder {
        model: Box::new(model),
        tokenizer: byte_tokenizer(),
        chat_template: Some(
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}".into(),
        ),
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
        architecture: "toy".into(),
        media: None,
    })
}

fn spec(name: &str) -> ModelSpec {
    ModelSpec {
        path: format!("/models/{name}"),
        served_name: name.into(),
    }
}

fn config() -> EngineConfig {
    EngineConfig {
        max_model_len: Some(128),
        max_num_seqs: 32,
        max_num_active_seqs: None,
        max_num_batched_tokens: 64,
        kv_cache_tokens: Some(1024),
        block_size: 4,
        enable_prefix_caching: true,
        threads: None,
        ..EngineConfig::default()
    }
}

fn start(model: ToyModel, cfg: &EngineConfig) -> (EngineHandle, ModelHandle) {
    let engine = EngineHandle::from_loaded(vec![(spec(NAME), decoder(model))], cfg).unwrap();
    let m = engine.model(NAME).unwrap();
    (engine, m)
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..Default::default()
    }
}

struct Output {
    text: String,
    ids: Vec<u32>,
    deltas: Vec<Delta>,
    finish: Finish,
}

async fn collect(mut s: GenerationStream) -> Output {
    let mut out = Output {
        text: String::new(),
        ids: Vec::new(),
        deltas: Vec::new(),
        finish: Finish {
            reason: FinishReason::Abort,
            stop_reason: None,
            prompt_tokens: 0,
            completion_tokens: 0,
            cached_tokens: 0,
        },
    };
    let mut finished = false;
    while let Some(d) = s.next().await {
        let d = d.unwrap();
        assert!(!finished, "delta after finish");
        out.text.push_str(&d.text);
        out.ids.extend(&d.token_ids);
        if let Some(f) = &d.finish {
            out.finish = f.clone();
            finished = true;
        }
        out.deltas.push(d);
    }
    assert!(finished, "stream ended without finish");
    out
}

fn ids(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

async fn wait_for(
    m: &ModelHandle,
    what: &str,
    cond: impl Fn(&engine::scheduler::EngineStats) -> bool,
) {
    let t0 = Instant::now();
    loop {
        let s = m.engine_stats().unwrap();
        if cond(&s) {
            return;
        }
        // A minute: what the toy engine does in milliseconds, and a loaded machine cannot
        // stretch past it, while a condition that never comes still fails the test.
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_streams_complete_with_correct_text() {
    let (engine, m) = start(ToyModel::new(512), &config());
    assert!(engine.is_healthy());
    let card = &engine.models()[0];
    assert_eq!(card.tasks, vec![Task::Generate]);
    assert_eq!(card.max_model_len, 128);
    assert_eq!(m.kind(), ModelKind::Decoder);
    let tok = byte_tokenizer();
    let mut tasks = Vec::new();
    for i in 0..16u8 {
        let prompt = format!(
            "{}{}",
            (b'A' + i) as char,
            "BCDEFGHIJKLMNOPQRST".split_at(i as usize).0
        );
        let s = m.generate(request(&prompt, greedy(10))).unwrap();
        tasks.push(tokio::spawn(async move { (prompt, collect(s).await) }));
    }
    for t in tasks {
        let (prompt, out) = t.await.unwrap();
        let want = expected(&ids(&prompt), 10);
        assert_eq!(out.ids, want, "prompt {prompt}");
        assert_eq!(out.text, tok.decode(&want, true).unwrap());
        assert_eq!(out.finish.reason, FinishReason::Length);
        assert_eq!(out.finish.completion_tokens, 10);
        assert_eq!(out.finish.prompt_tokens, prompt.len());
    }
    wait_for(&m, "all blocks freed", |s| {
        s.blocks.used == 0 && s.running == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_stream_frees_its_blocks_long_before_it_would_end() {
    let mut model = ToyModel::new(512);
    model.delay = Duration::from_millis(10);
    let (_engine, m) = start(model, &config());
    let mut s = m.generate(request("ABC", greedy(100))).unwrap();
    for _ in 0..3 {
        s.next().await.unwrap().unwrap();
    }
    let before = m.engine_stats().unwrap();
    assert!(before.blocks.used > 0);
    drop(s);
    wait_for(&m, "blocks freed", |s| s.blocks.used == 0 && s.running == 0).await;
    // The engine checks for cancellation at every step; how many steps pass before this
    // thread looks again depends on the machine's load, so the bound is the request's own
    // length: uncancelled, it would run 97 more steps.
    let after = m.engine_stats().unwrap();
    assert!(
        after.steps < before.steps + 50,
        "freed after {} steps",
        after.steps - before.steps
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_request_is_the_same_alone_and_in_a_full_batch() {
    let seeded = SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        seed: Some(1234),
        max_tokens: 24,
        ignore_eos: true,
        ..Default::default()
    };
    let (_e, m) = start(ToyModel::new(512), &config());
    let alone = collect(m.generate(request("HELLO", seeded.clone())).unwrap()).await;
    let mut mates = Vec::new();
    for i in 0..15 {
        let p = SamplingParams {
            temperature: 1.0,
            max_tokens: 24,
            ignore_eos: true,
            ..Default::default()
        };
        let s = m.generate(request(&format!("MATE{i}"), p)).unwrap();
        mates.push(tokio::spawn(collect(s)));
    }
    let batched = collect(m.generate(request("HELLO", seeded.clone())).unwrap()).await;
    for t in mates {
        t.await.unwrap();
    }
    assert_eq!(alone.ids.len(), 24);
    assert_eq!(alone.ids, batched.ids);
    let other = collect(
        m.generate(request(
            "HELLO",
            SamplingParams {
                seed: Some(99),
                ..seeded
            },
        ))
        .unwrap(),
    )
    .await;
    assert_ne!(
        other.ids, alone.ids,
        "a different seed should change a 24-token sample"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_and_recompute_give_the_same_output() {
    let prompts = ["ABCDEFGHIJ", "BCDEFGHIJK", "CDEFGHIJKL", "DEFGHIJKLM"];
    let params = SamplingParams {
        temperature: 0.8,
        seed: Some(5),
        max_tokens: 30,
        ignore_eos: true,
        ..Default::default()
    };
    async fn run(m: &ModelHandle, prompts: &[&str], params: &SamplingParams) -> Vec<Vec<u32>> {
        let tasks: Vec<_> = prompts
            .iter()
            .map(|p| tokio::spawn(collect(m.generate(request(p, params.clone())).unwrap())))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            let o = t.await.unwrap();
            assert_eq!(o.finish.reason, FinishReason::Length);
            out.push(o.ids);
        }
        out
    }
    let (_e1, roomy) = start(ToyModel::new(512), &config());
    let reference = run(&roomy, &prompts, &params).await;
    assert_eq!(roomy.engine_stats().unwrap().preemptions, 0);

    // 16 blocks of 4 tokens; each sequence grows to 40 tokens (10 blocks).
    let tight = EngineConfig {
        kv_cache_tokens: Some(64),
        max_model_len: Some(64),
        enable_prefix_caching: false,
        ..config()
    };
    let (_e2, small) = start(ToyModel::new(512), &tight);
    let got = run(&small, &prompts, &params).await;
    assert!(
        small.engine_stats().unwrap().preemptions > 0,
        "the test must preempt"
    );
    assert_eq!(got, reference);
    wait_for(&small, "all blocks freed", |s| s.blocks.used == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_cache_hits_for_repeated_prompt_and_not_across_salts() {
    let (_e, m) = start(ToyModel::new(512), &config());
    let prompt = "ABCDEFGHIJKLMNOPQRSTU"; // 21 tokens: 5 full blocks of 4
    let salted = |salt: Option<&str>| GenerateRequest {
        cache_salt: salt.map(str::to_string),
        ..request(prompt, greedy(5))
    };
    let first = collect(m.generate(salted(Some("a"))).unwrap()).await;
    assert_eq!(first.finish.cached_tokens, 0);
    let again = collect(m.generate(salted(Some("a"))).unwrap()).await;
    assert_eq!(again.finish.cached_tokens, 20);
    assert_eq!(again.ids, first.ids);
    assert_eq!(again.ids, expected(&ids(prompt), 5));
    let other_salt = collect(m.generate(salted(Some("b"))).unwrap()).await;
    assert_eq!(other_salt.finish.cached_tokens, 0);
    let no_salt = collect(m.generate(salted(None)).unwrap()).await;
    assert_eq!(no_salt.finish.cached_tokens, 0);
    let stats = m.engine_stats().unwrap();
    assert_eq!(stats.prefix_cache_queries, 4 * 21);
    assert_eq!(stats.prefix_cache_hits, 20);
    // Exactly the last prompt token is recomputed when the whole prompt is cached.
    let exact = "ABCDEFGHIJKLMNOP"; // 16 tokens = 4 full blocks
    let _ = collect(m.generate(request(exact, greedy(2))).unwrap()).await;
    let hit = collect(m.generate(request(exact, greedy(2))).unwrap()).await;
    assert_eq!(hit.finish.cached_tokens, 12);
    assert_eq!(hit.ids, expected(&ids(exact), 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_max_num_seqs_is_overloaded() {
    let mut model = ToyModel::new(512);
    model.delay = Duration::from_millis(5);
    let cfg = EngineConfig {
        max_num_seqs: 2,
        ..config()
    };
    let (_e, m) = start(model, &cfg);
    let a = m.generate(request("AB", greedy(50))).unwrap();
    let b = m.generate(request("BC", greedy(50))).unwrap();
    match m.generate(request("CD", greedy(5))) {
        Err(EngineError::Overloaded(_)) => {}
        Err(e) => panic!("expected Overloaded, got {e:?}"),
        Ok(_) => panic!("expected Overloaded, got a stream"),
    }
    drop(a);
    wait_for(&m, "a slot", |s| s.running + s.waiting <= 1).await;
    let t0 = Instant::now();
    let c = loop {
        match m.generate(request("CD", greedy(3))) {
            Ok(s) => break s,
            Err(EngineError::Overloaded(_)) if t0.elapsed() < Duration::from_secs(60) => {
                tokio::time::sleep(Duration::from_millis(2)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    assert_eq!(collect(c).await.ids, expected(&ids("CD"), 3));
    drop(b);
    // Active limit above the held limit is a start-up error.
    let bad = EngineConfig {
        max_num_seqs: 2,
        max_num_active_seqs: Some(3),
        ..config()
    };
    assert!(
        EngineHandle::from_loaded(vec![(spec(NAME), decoder(ToyModel::new(64)))], &bad).is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_num_active_seqs_limits_the_running_batch() {
    let mut model = ToyModel::new(512);
    model.delay = Duration::from_millis(2);
    let cfg = EngineConfig {
        max_num_seqs: 8,
        max_num_active_seqs: Some(2),
        ..config()
    };
    let (_e, m) = start(model, &cfg);
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let s = m.generate(request(&format!("P{i}"), greedy(8))).unwrap();
            tokio::spawn(collect(s))
        })
        .collect();
    let mut max_running = 0;
    while tasks.iter().any(|t| !t.is_finished()) {
        max_running = max_running.max(m.engine_stats().unwrap().running);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap().ids, expected(&ids(&format!("P{i}")), 8));
    }
    assert!(max_running <= 2, "running batch reached {max_running}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_across_token_boundaries() {
    let (_e, m) = start(ToyModel::new(512), &config());
    let prompt = "ABC";
    let full = expected(&ids(prompt), 12);
    let text = byte_tokenizer().decode(&full, true).unwrap();
    // A stop string spanning the 4th and 5th generated tokens.
    let stop = text[3..5].to_string();
    let params = SamplingParams {
        stop: vec![stop.clone()],
        ..greedy(12)
    };
    let out = collect(m.generate(request(prompt, params.clone())).unwrap()).await;
    assert_eq!(out.text, text[..3]);
    assert_eq!(out.finish.reason, FinishReason::Stop);
    assert_eq!(
        out.finish.stop_reason,
        Some(StopReason::String(stop.clone()))
    );
    assert_eq!(out.finish.completion_tokens, 5);
    // The text before the stop string's first character was streamed before it was complete.
    assert!(out.deltas.iter().all(|d| !d.text.contains(&stop)));
    let incl = collect(
        m.generate(request(
            prompt,
            SamplingParams {
                include_stop_str_in_output: true,
                ..params
            },
        ))
        .unwrap(),
    )
    .await;
    assert_eq!(incl.text, text[..5]);
    wait_for(&m, "cancelled sequences gone", |s| {
        s.blocks.used == 0 && s.running == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eos_min_tokens_and_stop_token_ids() {
    let (_e, m) = start(ToyModel::new(512), &config());
    // A '.' in the context makes EOS the top token.
    let eos = collect(m.generate(request("AB.", greedy(10))).unwrap()).await;
    assert_eq!(eos.ids, vec![EOS]);
    assert_eq!(eos.text, "");
    assert_eq!(eos.finish.reason, FinishReason::Stop);
    assert_eq!(eos.finish.stop_reason, Some(StopReason::Eos));
    assert_eq!(eos.finish.completion_tokens, 1);

    let min = collect(
        m.generate(request(
            "AB.",
            SamplingParams {
                min_tokens: 3,
                ..greedy(10)
            },
        ))
        .unwrap(),
    )
    .await;
    assert_eq!(min.ids.len(), 4, "{:?}", min.ids);
    assert!(!min.ids[..3].contains(&EOS));
    assert_eq!(min.ids[3], EOS);
    assert_eq!(min.finish.stop_reason, Some(StopReason::Eos));

    let ignore = collect(
        m.generate(request(
            "AB.",
            SamplingParams {
                ignore_eos: true,
                ..greedy(4)
            },
        ))
        .unwrap(),
    )
    .await;
    assert_eq!(ignore.ids, vec![EOS; 4]);
    assert_eq!(ignore.finish.reason, FinishReason::Length);

    let want = expected(&ids("AB"), 6);
    let stop_id = want[3];
    let by_id = collect(
        m.generate(request(
            "AB",
            SamplingParams {
                stop_token_ids: vec![stop_id],
                ..greedy(10)
            },
        ))
        .unwrap(),
    )
    .await;
    assert_eq!(by_id.ids, want[..4]);
    assert_eq!(by_id.finish.stop_reason, Some(StopReason::TokenId(stop_id)));
    // The stop token itself is not in the text.
    assert_eq!(
        by_id.text,
        byte_tokenizer().decode(&want[..3], true).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_and_context_length_finish_with_length() {
    let cfg = EngineConfig {
        max_model_len: Some(12),
        ..config()
    };
    let (_e, m) = start(ToyModel::new(512), &cfg);
    let out = collect(m.generate(request("ABCD", greedy(3))).unwrap()).await;
    assert_eq!(out.finish.reason, FinishReason::Length);
    assert_eq!(out.finish.completion_tokens, 3);
    assert_eq!(out.finish.stop_reason, None);
    // Context length caps a larger max_tokens.
    let capped = collect(m.generate(request("ABCD", greedy(100))).unwrap()).await;
    assert_eq!(capped.finish.reason, FinishReason::Length);
    assert_eq!(capped.finish.completion_tokens, 8);
    match m.generate(request("ABCDEFGHIJKL", greedy(1))) {
        Err(EngineError::InvalidRequest { .. }) => {}
        other => panic!("expected InvalidRequest, got {:?}", other.err()),
    }
    match m.generate(request("", greedy(1))) {
        Err(EngineError::InvalidRequest { .. }) => {}
        other => panic!("expected InvalidRequest, got {:?}", other.err()),
    }
    let bad = GenerateRequest {
        prompt_ids: vec![1, 9999],
        ..request("x", greedy(1))
    };
    assert!(matches!(
        m.generate(bad),
        Err(EngineError::InvalidRequest { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_are_reported_per_token() {
    let (_e, m) = start(ToyModel::new(512), &config());
    let out = collect(
        m.generate(request(
            "AB",
            SamplingParams {
                logprobs: Some(3),
                ..greedy(4)
            },
        ))
        .unwrap(),
    )
    .await;
    let lps: Vec<_> = out.deltas.iter().flat_map(|d| d.logprobs.clone()).collect();
    assert_eq!(lps.len(), 4);
    for (lp, id) in lps.iter().zip(&out.ids) {
        assert_eq!(lp.token_id, *id);
        assert_eq!(lp.top.len(), 3);
        assert_eq!(lp.top[0].id, *id);
        assert!(lp.logprob < 0.0 && lp.logprob > -2.0);
        assert!(lp.top[0].logprob >= lp.top[1].logprob);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_panic_fails_the_request_not_the_engine() {
    let mut model = ToyModel::new(512);
    model.panic_on = Some(b'!' as u32);
    let (engine, m) = start(model, &config());
    let mut s = m.generate(request("boom!", greedy(3))).unwrap();
    match s.next().await {
        Some(Err(EngineError::Internal(msg))) => assert!(msg.contains("panicked"), "{msg}"),
        other => panic!("expected an internal error, got {other:?}"),
    }
    assert!(s.next().await.is_none());
    assert!(engine.is_healthy());
    let ok = collect(m.generate(request("AB", greedy(3))).unwrap()).await;
    assert_eq!(ok.ids, expected(&ids("AB"), 3));
    wait_for(&m, "blocks freed", |s| s.blocks.used == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_and_tokenizer_access() {
    let (_e, m) = start(ToyModel::new(512), &config());
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    let opts = engine::api::ChatTemplateOptions::default();
    assert_eq!(m.render_chat(&msgs, &opts).unwrap(), "user: hi\n");
    let custom = engine::api::ChatTemplateOptions {
        chat_template: Some("{{ bos_token }}{{ messages[0].content }}".into()),
        ..Default::default()
    };
    assert_eq!(m.render_chat(&msgs, &custom).unwrap(), "<s>hi");
    assert_eq!(m.encode("hé", false).unwrap(), vec![104, 0xC3, 0xA9]);
    assert_eq!(m.decode(&[104, 0xC3, 0xA9, EOS], true).unwrap(), "hé");
    assert_eq!(m.decode(&[104, EOS], false).unwrap(), "h</s>");
    assert!(m.decode(&[100_000], true).is_err());
    assert_eq!(m.token_str(b' ' as u32).as_deref(), Some("Ġ"));
    assert_eq!(m.token_text(b' ' as u32).as_deref(), Some(" "));
    assert_eq!(m.vocab_size(), 258);

    let no_template = LoadedModel::Decoder(LoadedDecoder {
        model: Box::new(ToyModel::new(64)),
        tokenizer: byte_tokenizer(),
        chat_template: None,
        bos_token: None,
        eos_token: None,
        architecture: "toy".into(),
        media: None,
    });
    let e = EngineHandle::from_loaded(vec![(spec("bare"), no_template)], &config()).unwrap();
    match e.model("bare").unwrap().render_chat(&msgs, &opts) {
        Err(EngineError::InvalidRequest { message, .. }) => {
            assert!(message.starts_with("As of transformers v4.44"), "{message}")
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_cache_must_hold_one_max_len_sequence() {
    let cfg = EngineConfig {
        kv_cache_tokens: Some(64),
        max_model_len: Some(128),
        ..config()
    };
    match EngineHandle::from_loaded(vec![(spec(NAME), decoder(ToyModel::new(512)))], &cfg) {
        Err(EngineError::Load { reason, .. }) => {
            assert!(reason.contains("max_model_len"), "{reason}")
        }
        other => panic!("expected a load error, got {:?}", other.err()),
    }
    // max_model_len is capped by the model's own limit.
    let cfg = EngineConfig {
        max_model_len: None,
        ..config()
    };
    let (e, _m) = start(ToyModel::new(100), &cfg);
    assert_eq!(e.models()[0].max_model_len, 100);
}

fn encoder(delay: Duration) -> (LoadedModel, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let model = ToyEmbedder::new(delay);
    let batches = model.batches.clone();
    (
        LoadedModel::Encoder {
            encoder: LoadedEncoder {
                model: Box::new(model),
                tokenizer: byte_tokenizer(),
                architecture: "toy-bert".into(),
            },
            chat_template: None,
        },
        batches,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_are_batched_and_bounded() {
    let (enc, batches) = encoder(Duration::from_millis(30));
    let cfg = EngineConfig {
        max_num_seqs: 64,
        ..config()
    };
    let e = EngineHandle::from_loaded(vec![(spec("emb"), enc)], &cfg).unwrap();
    let m = e.model("emb").unwrap();
    assert_eq!(m.kind(), ModelKind::Encoder);
    assert_eq!(m.card().tasks, vec![Task::Embed, Task::Score]);
    assert_eq!(m.card().max_model_len, 16);
    assert!(m.generate(request("x", greedy(1))).is_err());
    let tasks: Vec<_> = (0..8u32)
        .map(|i| {
            let m = m.clone();
            tokio::spawn(async move { (i, m.embed(vec![vec![i, 1], vec![i; 3]]).await.unwrap()) })
        })
        .collect();
    for t in tasks {
        let (i, v) = t.await.unwrap();
        assert_eq!(
            v,
            vec![vec![2.0, (i + 1) as f32], vec![3.0, (3 * i) as f32]]
        );
    }
    assert!(
        batches.load(Ordering::SeqCst) < 8,
        "concurrent requests were not batched"
    );
    assert!(matches!(
        m.embed(vec![vec![1; 17]]).await,
        Err(EngineError::InvalidRequest { .. })
    ));
    assert!(matches!(
        m.embed(vec![vec![]]).await,
        Err(EngineError::InvalidRequest { .. })
    ));

    // A full queue is Overloaded.
    let (enc, _) = encoder(Duration::from_millis(300));
    let cfg = EngineConfig {
        max_num_seqs: 1,
        ..config()
    };
    let e = EngineHandle::from_loaded(vec![(spec("slow"), enc)], &cfg).unwrap();
    let m = e.model("slow").unwrap();
    let m1 = m.clone();
    let first = tokio::spawn(async move { m1.embed(vec![vec![1]]).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let m2 = m.clone();
    let second = tokio::spawn(async move { m2.embed(vec![vec![2]]).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(matches!(
        m.embed(vec![vec![3]]).await,
        Err(EngineError::Overloaded(_))
    ));
    assert!(first.await.unwrap().is_ok());
    assert!(second.await.unwrap().is_ok());
    assert!(e.is_healthy());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_are_prefilled_in_chunks() {
    let cfg = EngineConfig {
        max_num_batched_tokens: 7,
        ..config()
    };
    let (_e, m) = start(ToyModel::new(512), &cfg);
    let long: String = (0..50).map(|i| (b'A' + (i % 26) as u8) as char).collect();
    let short = collect(m.generate(request("AB", greedy(20))).unwrap());
    let long_out = collect(m.generate(request(&long, greedy(6))).unwrap());
    let (short, long_out) = tokio::join!(short, long_out);
    assert_eq!(long_out.ids, expected(&ids(&long), 6));
    assert_eq!(short.ids, expected(&ids("AB"), 20));
    // 50 prompt tokens in chunks of at most 7 need at least 8 steps.
    assert!(m.engine_stats().unwrap().steps >= 8);
}

/// A huge embedding request is worked through a batch at a time, in turn with the others: a
/// small request sent after it is answered first, and once its client has gone the rest of
/// its inputs are dropped at the next batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_share_batches_and_drop_abandoned_work() {
    let (enc, batches) = encoder(Duration::from_millis(5));
    let cfg = EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 16,
        ..config()
    };
    let e = EngineHandle::from_loaded(vec![(spec("emb"), enc)], &cfg).unwrap();
    let m = e.model("emb").unwrap();
    let huge: Vec<Vec<u32>> = (0..200u32).map(|i| vec![i; 8]).collect();
    let big = {
        let (m, huge) = (m.clone(), huge.clone());
        tokio::spawn(async move { m.embed(huge).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    let small = m.embed(vec![vec![7, 7]]).await.unwrap();
    assert_eq!(small, vec![vec![2.0, 14.0]]);
    assert!(
        !big.is_finished(),
        "the small request waited for the huge one"
    );
    let done = big.await.unwrap().unwrap();
    assert_eq!(done.len(), 200);
    assert_eq!(
        done[199],
        vec![8.0, 8.0 * 199.0],
        "outputs stay in input order"
    );

    // Abandoned: the client goes away after a few batches.
    let abandoned = {
        let m = m.clone();
        tokio::spawn(async move { m.embed(huge).await })
    };
    tokio::time::sleep(Duration::from_millis(40)).await;
    abandoned.abort();
    let _ = abandoned.await;
    let at_abort = batches.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = batches.load(Ordering::SeqCst);
    // 200 inputs at 2 per batch would be 100 batches; dropping it stops within a batch or two.
    assert!(
        after <= at_abort + 2,
        "{} batches ran after the client left",
        after - at_abort
    );
}

/// The front door: chat messages and token ids become prompts, truncation keeps the tail, and
/// every context check is a 400 naming its field before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_door_checks_before_it_starts() {
    use engine::handle::{PromptOptions, PromptSource, SubmitOptions};
    let (_engine, m) = start(ToyModel::new(256), &config());
    let opts = |truncate| PromptOptions {
        add_special_tokens: false,
        truncate_prompt_tokens: truncate,
        field: "prompt",
    };
    let submit = |max_tokens, n| SubmitOptions {
        request_id: "fd".into(),
        params: greedy(0),
        max_tokens,
        max_tokens_field: "max_completion_tokens",
        default_max_tokens: None,
        max_tokens_cap: None,
        n,
        cache_salt: None,
    };
    let param = |e: EngineError| match e {
        EngineError::InvalidRequest { param, message } => (param, message),
        other => panic!("expected a 400, got {other:?}"),
    };

    // Chat messages are rendered with the model's template, then tokenised.
    let chat = m
        .prompt(
            PromptSource::Chat {
                messages: serde_json::json!([{"role": "user", "content": "hi"}]),
                template: Box::default(),
            },
            opts(None),
        )
        .unwrap();
    assert_eq!(chat.ids(), ids("user: hi\n"));
    // Truncation keeps the last k tokens; past the context it is vLLM's message.
    let cut = m
        .prompt(PromptSource::Text("abcdef".into()), opts(Some(2)))
        .unwrap();
    assert_eq!(cut.ids(), ids("ef"));
    let (p, msg) = param(
        m.prompt(PromptSource::Text("abc".into()), opts(Some(129)))
            .unwrap_err(),
    );
    assert_eq!(p.as_deref(), Some("truncate_prompt_tokens"));
    assert!(msg.starts_with("truncate_prompt_tokens value is greater than max_model_len"));
    // Ids are checked against the vocabulary and name the field that carried them.
    let (p, msg) = param(
        m.prompt(PromptSource::Ids(vec![1, 100_000]), opts(None))
            .unwrap_err(),
    );
    assert_eq!(
        (p.as_deref(), msg.as_str()),
        (Some("prompt"), "Token id 100000 is out of vocabulary")
    );
    assert!(m.prompt(PromptSource::Ids(vec![-1]), opts(None)).is_err());

    // max_tokens past what the prompt leaves names the field that carried it.
    let (p, msg) = param(
        m.submit(vec![cut.clone()], Vec::new(), submit(Some(127), 1))
            .await
            .err()
            .unwrap(),
    );
    assert_eq!(p.as_deref(), Some("max_completion_tokens"));
    assert!(msg.contains("(127 > 128 - 2)"), "{msg}");
    // More sequences than the engine can ever hold: a 400 naming n.
    let (p, _) = param(
        m.submit(vec![cut.clone()], Vec::new(), submit(None, 33))
            .await
            .err()
            .unwrap(),
    );
    assert_eq!(p.as_deref(), Some("n"));
    // Within bounds: n choices per prompt, prompt-major, each with the fitted budget.
    let started = m
        .submit(vec![cut.clone(), chat], Vec::new(), submit(Some(3), 2))
        .await
        .unwrap();
    assert_eq!(started.prompt_tokens, vec![2, ids("user: hi\n").len()]);
    let indices: Vec<(usize, usize)> = started
        .choices
        .iter()
        .map(|c| (c.index, c.prompt_idx))
        .collect();
    assert_eq!(indices, vec![(0, 0), (1, 0), (2, 1), (3, 1)]);
    for c in started.choices {
        let out = collect(c.stream).await;
        assert_eq!(out.finish.completion_tokens, 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_cannot_take_every_slot() {
    use engine::handle::{PromptOptions, PromptSource, SubmitOptions};
    let mut model = ToyModel::new(512);
    model.delay = Duration::from_millis(2);
    let cfg = EngineConfig {
        max_num_seqs: 4,
        ..config()
    };
    let (_e, m) = start(model, &cfg);
    let prompt = |text: &str| {
        m.prompt(
            PromptSource::Text(text.into()),
            PromptOptions {
                add_special_tokens: false,
                truncate_prompt_tokens: None,
                field: "prompt",
            },
        )
        .unwrap()
    };
    let opts = |id: &str, max_tokens, n| SubmitOptions {
        request_id: id.into(),
        params: greedy(0),
        max_tokens: Some(max_tokens),
        max_tokens_field: "max_tokens",
        default_max_tokens: None,
        max_tokens_cap: None,
        n,
        cache_salt: None,
    };
    // A lone request runs all its choices at once.
    let big = m
        .submit(vec![prompt("AB")], Vec::new(), opts("big", 100, 4))
        .await
        .unwrap();
    wait_for(&m, "the big request running", |s| s.running == 4).await;
    // A newcomer gets its fair share of the slots (2 of 4), not a 503; more than its share
    // is refused as overload.
    match m
        .submit(vec![prompt("CD")], Vec::new(), opts("greedy", 5, 3))
        .await
    {
        Err(EngineError::Overloaded(_)) => {}
        Err(e) => panic!("expected Overloaded, got {e:?}"),
        Ok(_) => panic!("expected Overloaded, got streams"),
    }
    let small = m
        .submit(vec![prompt("CD")], Vec::new(), opts("small", 5, 2))
        .await
        .unwrap();
    for c in small.choices {
        assert_eq!(collect(c.stream).await.ids, expected(&ids("CD"), 5));
    }
    // The newcomer finished while every choice of the big request was still in the engine:
    // it took slots from the big request, which gave two up (preempted, recomputed later).
    // The engine drops a finished sequence after sending its last token, so wait for that.
    wait_for(&m, "the small request dropped", |s| {
        s.running + s.waiting <= 4
    })
    .await;
    let stats = m.engine_stats().unwrap();
    assert_eq!(stats.running + stats.waiting, 4, "{stats:?}");
    assert!(stats.preemptions >= 2, "{stats:?}");
    for c in big.choices {
        assert_eq!(collect(c.stream).await.ids, expected(&ids("AB"), 100));
    }
}

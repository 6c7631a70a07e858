//! A served model's card states its host memory (the terms of the deployment's memory bound):
//! the KV cache at its allocated size, the weights at least as large as their files, a step's
//! scratch that grows with the step's size, a sequence's ids.

use std::path::PathBuf;

use engine::device::DeviceRequest;
use engine::handle::{EngineConfig, EngineHandle, ModelSpec};
use engine::model::KvDtype;

fn tiny_llama() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-llama")
}

fn memory(cfg: &EngineConfig) -> engine::api::ModelMemory {
    let spec = ModelSpec {
        path: tiny_llama().display().to_string(),
        served_name: "tiny".into(),
    };
    let engine = EngineHandle::start(&[spec], cfg).unwrap_or_else(|e| panic!("{e}"));
    engine.models()[0].memory
}

#[test]
fn the_card_states_the_weights_the_cache_and_a_step() {
    let cfg = EngineConfig {
        max_model_len: Some(512),
        kv_cache_tokens: Some(1024),
        max_num_batched_tokens: 256,
        device: DeviceRequest::Cpu,
        threads: Some(1),
        ..Default::default()
    };
    let m = memory(&cfg);
    // config.json: 2 layers, 2 KV heads of 16; K and V in f32.
    assert_eq!(m.kv_cache, 1024 * 2 * 2 * 16 * 2 * 4);
    let file = std::fs::metadata(tiny_llama().join("model.safetensors"))
        .map(|f| f.len())
        .unwrap_or(0);
    assert!(file > 0);
    assert!(m.weights >= file, "weights {} < file {file}", m.weights);
    // Per token: its ids and block table entry (16 bytes) and its text twice, each token's
    // at most the longest vocabulary entry.
    assert!(m.max_token_bytes > 0);
    assert_eq!(m.per_sequence, 512 * (16 + 2 * m.max_token_bytes));

    let half = memory(&EngineConfig {
        kv_cache_dtype: KvDtype::Float16,
        ..cfg.clone()
    });
    assert_eq!(half.kv_cache, m.kv_cache / 2);

    let bigger = memory(&EngineConfig {
        max_num_batched_tokens: 512,
        ..cfg
    });
    // config.json: hidden 64, 4 heads and 2 KV heads of 16, MLP 160: 2 x 64 + 2 x 64 +
    // 2 x 32 + 2 x 160 floats a row, and the row quantised for the integer kernels (the wider
    // of hidden and MLP at 2 bytes a value: 160 / 2 floats).
    assert_eq!(bigger.step - m.step, 256 * (128 + 128 + 64 + 320 + 80) * 4);
}

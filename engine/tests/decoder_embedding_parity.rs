//! A decoder served as an embedding model against sentence-transformers
//! (`tests/data/tiny-qwen3-embedding`, the Qwen3-Embedding layout, made by
//! `scripts/make_tiny_qwen3_embedding.py`): every vector within cosine 0.9999 (and 1e-4 per
//! value) of `SentenceTransformer.encode`, alone and in a batch of different lengths, with
//! last-token and mean pooling, with and without the Normalize module; the vector of an input
//! the same whatever its batch; and how `--runner` / `--convert` decide what a folder is.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use engine::api::Task;
use engine::handle::{EngineConfig, EngineHandle, ModelSpec, PoolInput, PoolOptions, PoolTask};
use engine::load::{
    detect, load_decoder_embedder, served_kind, CheckpointKind, Convert, RunAs, Runner,
};
use engine::model::{EncoderInput, LoadedEncoder, Pooling};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    texts: Vec<String>,
    input_ids: Vec<Vec<u32>>,
    lasttoken_alone: Vec<Vec<f32>>,
    lasttoken_batch: Vec<Vec<f32>>,
    mean_alone: Vec<Vec<f32>>,
    mean_batch: Vec<Vec<f32>>,
    unnormalised_batch: Vec<Vec<f32>>,
}

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-qwen3-embedding")
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(data().join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A copy of the folder with `edit` applied to it (another pooling, no Normalize, another
/// architecture).
fn variant(tag: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("decoder-embedding-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    for entry in std::fs::read_dir(data()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy(
        data().join("1_Pooling/config.json"),
        dir.join("1_Pooling/config.json"),
    )
    .unwrap();
    edit(&dir);
    dir
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// Each vector within cosine 0.9999 of its reference and within `tol` per value.
fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: one vector per input");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what} {i}: dimension");
        let c = cosine(g, w);
        assert!(c > 0.9999, "{what} {i}: cosine {c}");
        let worst = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst <= tol, "{what} {i}: max |diff| {worst}");
    }
}

fn inputs(r: &Reference) -> Vec<EncoderInput<'_>> {
    r.input_ids
        .iter()
        .map(|ids| EncoderInput {
            ids,
            type_ids: None,
        })
        .collect()
}

/// `embed` on the reference's ids, in one batch, and each input alone: the same numbers.
fn embed_every_way(enc: &LoadedEncoder, r: &Reference) -> Vec<Vec<f32>> {
    let batch: Vec<Vec<u32>> = r.input_ids.clone();
    let together = enc.model.embed(&batch).unwrap();
    for (ids, v) in batch.iter().zip(&together) {
        let alone = enc.model.embed(std::slice::from_ref(ids)).unwrap();
        assert_eq!(
            &alone[0], v,
            "an input's vector does not depend on its batch"
        );
    }
    together
}

#[test]
fn last_token_vectors_match_sentence_transformers() {
    let r = reference();
    assert_eq!(detect(&data()), CheckpointKind::Decoder);
    assert_eq!(
        served_kind(&data(), RunAs::default()).unwrap(),
        CheckpointKind::DecoderEmbedder,
        "a Pooling module in modules.json makes a *ForCausalLM folder an embedding model"
    );
    let enc = load_decoder_embedder(&data()).unwrap();
    let info = enc.model.info();
    assert_eq!(
        (
            info.pooling,
            info.normalize,
            info.hidden_size,
            info.max_seq_len
        ),
        (Pooling::LastToken, true, 64, 256)
    );
    assert_eq!(enc.architecture, "Qwen3ForCausalLM");
    for (text, ids) in r.texts.iter().zip(&r.input_ids) {
        let got = enc.tokenizer.encode(text.as_str(), true).unwrap();
        assert_eq!(got.get_ids(), ids.as_slice(), "{text:?}");
    }
    let lengths: std::collections::BTreeSet<usize> = r.input_ids.iter().map(Vec::len).collect();
    assert!(lengths.len() >= 4, "a batch of different lengths");
    let got = embed_every_way(&enc, &r);
    assert_close(&got, &r.lasttoken_batch, 1e-4, "last token, batched");
    assert_close(&got, &r.lasttoken_alone, 1e-4, "last token, alone");
}

#[test]
fn mean_pooling_and_no_normalize_follow_the_files() {
    let r = reference();
    let mean = variant("mean", |d| {
        std::fs::write(
            d.join("1_Pooling/config.json"),
            r#"{"word_embedding_dimension": 64, "pooling_mode_mean_tokens": true}"#,
        )
        .unwrap();
    });
    let enc = load_decoder_embedder(&mean).unwrap();
    assert_eq!(enc.model.info().pooling, Pooling::Mean);
    let got = embed_every_way(&enc, &r);
    assert_close(&got, &r.mean_batch, 1e-4, "mean, batched");
    assert_close(&got, &r.mean_alone, 1e-4, "mean, alone");

    let plain = variant("plain", |d| {
        let modules: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("modules.json")).unwrap())
                .unwrap();
        let kept: Vec<&serde_json::Value> = modules
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| !m["type"].as_str().unwrap().ends_with("Normalize"))
            .collect();
        std::fs::write(
            d.join("modules.json"),
            serde_json::to_string(&kept).unwrap(),
        )
        .unwrap();
    });
    let enc = load_decoder_embedder(&plain).unwrap();
    assert!(!enc.model.info().normalize);
    let got = enc.model.forward(&inputs(&r)).unwrap();
    // Vectors of norm about 8: the same relative tolerance.
    assert_close(&got, &r.unnormalised_batch, 1e-3, "without Normalize");
    for dir in [mean, plain] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn a_bare_model_architecture_embeds_and_refuses_to_generate() {
    let r = reference();
    // `Qwen3Model` without sentence-transformers files: vLLM's defaults, the last token's
    // state normalised.
    let bare = variant("bare", |d| {
        let path = d.join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("Qwen3ForCausalLM", "Qwen3Model")).unwrap();
        std::fs::remove_file(d.join("modules.json")).unwrap();
    });
    assert_eq!(detect(&bare), CheckpointKind::DecoderEmbedder);
    let enc = load_decoder_embedder(&bare).unwrap();
    let info = enc.model.info();
    assert_eq!((info.pooling, info.normalize), (Pooling::LastToken, true));
    assert_close(
        &embed_every_way(&enc, &r),
        &r.lasttoken_batch,
        1e-4,
        "bare model",
    );
    let generate = RunAs {
        runner: Runner::Generate,
        convert: Convert::Auto,
    };
    let err = served_kind(&bare, generate).unwrap_err().to_string();
    assert!(
        err.contains("Embedding models do not support `--runner generate`"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(bare);
}

fn spec() -> ModelSpec {
    ModelSpec {
        path: data().display().to_string(),
        served_name: "qwen3-embedding".into(),
    }
}

fn opts(task: PoolTask) -> PoolOptions {
    PoolOptions::new(task, "input")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_door_embeds_and_scores_from_text() {
    let r = reference();
    let engine = EngineHandle::start(&[spec()], &EngineConfig::default()).unwrap();
    let m = engine.model("qwen3-embedding").unwrap();
    assert_eq!(m.card().tasks, vec![Task::Embed, Task::Score]);
    assert_eq!(m.card().max_model_len, 256);
    let pooled = m
        .pool(PoolInput::Texts(r.texts.clone()), opts(PoolTask::Embed))
        .await
        .unwrap();
    assert_close(&pooled.rows, &r.lasttoken_batch, 1e-4, "front door");
    assert_eq!(
        pooled.prompt_tokens,
        r.input_ids.iter().map(Vec::len).sum::<usize>()
    );
    // Scores are the cosine of the two sides' vectors.
    let scored = m
        .pool(
            PoolInput::Pairs {
                queries: vec![r.texts[1].clone()],
                documents: r.texts[2..].to_vec(),
            },
            opts(PoolTask::Score),
        )
        .await
        .unwrap();
    for (row, doc) in scored.rows.iter().zip(&r.lasttoken_batch[2..]) {
        let want = cosine(&r.lasttoken_batch[1], doc) as f32;
        assert!((row[0] - want).abs() < 1e-4, "{} vs {want}", row[0]);
    }
    // An embedding model does not classify.
    let err = m
        .pool(PoolInput::Texts(vec!["x".into()]), opts(PoolTask::Classify))
        .await
        .unwrap_err();
    assert!(
        err.to_string().starts_with("Unsupported task: 'classify'"),
        "{err}"
    );
}

#[test]
fn the_runner_decides_what_the_folder_serves() {
    // `--runner generate` serves the same folder as the decoder it is (its head is tied).
    let generate = EngineConfig {
        run_as: RunAs {
            runner: Runner::Generate,
            convert: Convert::Auto,
        },
        kv_cache_tokens: Some(1024),
        ..EngineConfig::default()
    };
    let engine = EngineHandle::start(&[spec()], &generate).unwrap();
    assert_eq!(
        engine.model("qwen3-embedding").unwrap().card().tasks,
        vec![Task::Generate]
    );
    // `--runner pooling --convert none` on a generative architecture is refused by name.
    let none = EngineConfig {
        run_as: RunAs {
            runner: Runner::Pooling,
            convert: Convert::None,
        },
        ..EngineConfig::default()
    };
    let err = EngineHandle::start(&[spec()], &none)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("--convert none") && err.contains("Qwen3ForCausalLM"),
        "{err}"
    );
}

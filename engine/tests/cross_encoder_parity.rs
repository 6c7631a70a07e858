//! Sequence-classification encoders against their references (`tests/data/tiny-cross-encoder`,
//! `tiny-reranker`, `tiny-classifier`, made by `scripts/make_tiny_cross_encoders.py`, and
//! `tiny-modernbert-reranker`, `tiny-modernbert-classifier`, made by
//! `scripts/make_tiny_modernbert.py`): sentence-transformers' `CrossEncoder` scores and
//! transformers' logits and probabilities, within 1e-4. Checked at two levels: the model on the reference's own token ids (and token
//! type ids), and the pooling front door from the texts (pair encoding, truncation,
//! `use_activation`, batching, the tasks each model refuses).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use engine::api::Task;
use engine::handle::{
    EngineConfig, EngineHandle, ModelHandle, ModelSpec, PoolInput, PoolOptions, PoolTask,
};
use engine::load::{detect, load_encoder, CheckpointKind};
use engine::model::{ClassActivation, EncoderHead, EncoderInput, LoadedEncoder, Pooling};
use engine::EngineError;
use serde::Deserialize;

const TOL: f32 = 1e-4;

#[derive(Deserialize)]
struct PairRef {
    query: String,
    document: String,
    input_ids: Vec<u32>,
    token_type_ids: Option<Vec<u32>>,
    logit: f32,
    score: f32,
    max_length: Option<usize>,
}

#[derive(Deserialize)]
struct CrossRef {
    pairs: Vec<PairRef>,
    truncated: Vec<PairRef>,
}

#[derive(Deserialize)]
struct TextRef {
    text: String,
    input_ids: Vec<u32>,
    logits: Vec<f32>,
    probs: Vec<f32>,
    label: String,
}

#[derive(Deserialize)]
struct ClassifierRef {
    texts: Vec<TextRef>,
}

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(name)
}

fn reference<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let text = std::fs::read_to_string(dir(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn close(got: f32, want: f32, what: &str) {
    assert!(
        (got - want).abs() <= TOL,
        "{what}: {got} vs the reference {want}"
    );
}

/// The model alone on the reference's token ids: logits, and the same logits whatever the
/// batch.
fn check_model_on_reference_ids(enc: &LoadedEncoder, r: &CrossRef) {
    let cases: Vec<&PairRef> = r.pairs.iter().chain(&r.truncated).collect();
    let inputs: Vec<EncoderInput<'_>> = cases
        .iter()
        .map(|p| EncoderInput {
            ids: &p.input_ids,
            type_ids: p.token_type_ids.as_deref(),
        })
        .collect();
    let batched = enc.model.forward(&inputs).unwrap();
    for (p, (input, logits)) in cases.iter().zip(inputs.iter().zip(&batched)) {
        assert_eq!(logits.len(), 1);
        close(
            logits[0],
            p.logit,
            &format!("logit of ({:?}, {:?})", p.query, p.document),
        );
        let alone = enc.model.forward(std::slice::from_ref(input)).unwrap();
        assert_eq!(
            alone[0], *logits,
            "a pair's logit does not depend on its batch"
        );
    }
}

/// The checkpoint's tokenizer encodes every untruncated pair as the reference did.
fn check_pair_tokens(enc: &LoadedEncoder, r: &CrossRef) {
    for p in &r.pairs {
        let e = enc
            .tokenizer
            .encode((p.query.as_str(), p.document.as_str()), true)
            .unwrap();
        assert_eq!(e.get_ids(), p.input_ids.as_slice(), "{:?}", p.document);
        if let Some(types) = &p.token_type_ids {
            assert_eq!(e.get_type_ids(), types.as_slice(), "{:?}", p.document);
        }
    }
}

#[test]
fn bert_cross_encoder_matches_sentence_transformers() {
    let d = dir("tiny-cross-encoder");
    assert_eq!(detect(&d), CheckpointKind::Encoder);
    let enc = load_encoder(&d).unwrap();
    assert_eq!(enc.architecture, "BertForSequenceClassification");
    let EncoderHead::Classify(c) = &enc.model.info().head else {
        panic!("a classification head")
    };
    assert_eq!(c.labels, ["LABEL_0"]);
    assert_eq!(c.score, ClassActivation::Sigmoid);
    assert_eq!(enc.model.info().max_seq_len, 128);
    let r: CrossRef = reference("tiny-cross-encoder");
    assert!(
        r.pairs
            .iter()
            .all(|p| p.token_type_ids.as_ref().is_some_and(|t| t.contains(&1))),
        "BERT pairs carry segment 1 for the document"
    );
    check_pair_tokens(&enc, &r);
    check_model_on_reference_ids(&enc, &r);
}

#[test]
fn xlm_roberta_reranker_matches_sentence_transformers() {
    let d = dir("tiny-reranker");
    let enc = load_encoder(&d).unwrap();
    assert_eq!(enc.architecture, "XLMRobertaForSequenceClassification");
    // 130 positions, counted from pad_token_id + 1 = 2.
    assert_eq!(enc.model.info().max_seq_len, 128);
    let r: CrossRef = reference("tiny-reranker");
    assert!(r.pairs.iter().all(|p| p.token_type_ids.is_none()));
    check_pair_tokens(&enc, &r);
    check_model_on_reference_ids(&enc, &r);
}

#[test]
fn modernbert_reranker_matches_transformers() {
    let enc = load_encoder(&dir("tiny-modernbert-reranker")).unwrap();
    assert_eq!(enc.architecture, "ModernBertForSequenceClassification");
    assert_eq!(enc.model.info().max_seq_len, 128);
    assert_eq!(enc.model.info().pooling, Pooling::Cls);
    let r: CrossRef = reference("tiny-modernbert-reranker");
    // Every pair is longer than the local layers' window (4 tokens either side).
    assert!(r.pairs.iter().all(|p| p.input_ids.len() > 9));
    check_pair_tokens(&enc, &r);
    check_model_on_reference_ids(&enc, &r);
}

#[test]
fn modernbert_classifier_matches_transformers() {
    check_classifier("tiny-modernbert-classifier");
}

#[test]
fn classifier_matches_transformers() {
    check_classifier("tiny-classifier");
}

fn check_classifier(name: &str) {
    let enc = load_encoder(&dir(name)).unwrap();
    let EncoderHead::Classify(c) = &enc.model.info().head else {
        panic!("a classification head")
    };
    assert_eq!(c.labels, ["negative", "neutral", "positive"]);
    assert_eq!(c.classify, ClassActivation::Softmax);
    let r: ClassifierRef = reference(name);
    let batch: Vec<Vec<u32>> = r.texts.iter().map(|t| t.input_ids.clone()).collect();
    // `embed` on a classifier is the raw logits (no normalisation).
    let logits = enc.model.embed(&batch).unwrap();
    for (t, got) in r.texts.iter().zip(&logits) {
        let ids = enc.tokenizer.encode(t.text.as_str(), true).unwrap();
        assert_eq!(ids.get_ids(), t.input_ids.as_slice(), "{:?}", t.text);
        for (g, w) in got.iter().zip(&t.logits) {
            close(*g, *w, &format!("logit of {:?}", t.text));
        }
    }
}

fn serve() -> EngineHandle {
    let specs: Vec<ModelSpec> = [
        "tiny-cross-encoder",
        "tiny-reranker",
        "tiny-classifier",
        "tiny-modernbert-reranker",
    ]
    .iter()
    .map(|name| ModelSpec {
        path: dir(name).display().to_string(),
        served_name: name.to_string(),
    })
    .collect();
    EngineHandle::start(&specs, &EngineConfig::default()).unwrap()
}

fn opts(task: PoolTask) -> PoolOptions {
    PoolOptions::new(task, "input")
}

fn pairs_of(cases: &[&PairRef]) -> PoolInput {
    PoolInput::Pairs {
        queries: cases.iter().map(|p| p.query.clone()).collect(),
        documents: cases.iter().map(|p| p.document.clone()).collect(),
    }
}

async fn check_scores(m: &ModelHandle, r: &CrossRef) {
    // Every reference pair in one request (N:N), scores and raw logits.
    let all: Vec<&PairRef> = r.pairs.iter().collect();
    let scored = m.pool(pairs_of(&all), opts(PoolTask::Score)).await.unwrap();
    let raw = m
        .pool(
            pairs_of(&all),
            PoolOptions {
                use_activation: Some(false),
                ..opts(PoolTask::Score)
            },
        )
        .await
        .unwrap();
    assert_eq!(
        scored.prompt_tokens,
        all.iter().map(|p| p.input_ids.len()).sum::<usize>()
    );
    for (p, (s, l)) in all.iter().zip(scored.rows.iter().zip(&raw.rows)) {
        assert_eq!((s.len(), l.len()), (1, 1));
        close(s[0], p.score, &format!("score of {:?}", p.document));
        close(l[0], p.logit, &format!("logit of {:?}", p.document));
    }
    // Truncated longest-first as the tokenizer does it.
    for p in &r.truncated {
        let k = p.max_length.unwrap();
        let got = m
            .pool(
                pairs_of(&[p]),
                PoolOptions {
                    truncate_prompt_tokens: Some(k as i64),
                    ..opts(PoolTask::Score)
                },
            )
            .await
            .unwrap();
        assert_eq!(got.prompt_tokens, p.input_ids.len(), "truncated to {k}");
        close(got.rows[0][0], p.score, &format!("score truncated to {k}"));
    }
    // A limit below the pair's special tokens is refused, naming the field.
    match m
        .pool(
            pairs_of(&[&r.pairs[0]]),
            PoolOptions {
                truncate_prompt_tokens: Some(2),
                ..opts(PoolTask::Score)
            },
        )
        .await
    {
        Err(EngineError::InvalidRequest { param, .. }) => {
            assert_eq!(param.as_deref(), Some("truncate_prompt_tokens"))
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_door_scores_and_classifies_from_text() {
    let engine = serve();
    let ce = engine.model("tiny-cross-encoder").unwrap();
    assert_eq!(ce.card().tasks, vec![Task::Classify, Task::Score]);
    check_scores(&ce, &reference("tiny-cross-encoder")).await;
    let rr = engine.model("tiny-reranker").unwrap();
    check_scores(&rr, &reference("tiny-reranker")).await;
    let mb = engine.model("tiny-modernbert-reranker").unwrap();
    assert_eq!(mb.card().tasks, vec![Task::Classify, Task::Score]);
    check_scores(&mb, &reference("tiny-modernbert-reranker")).await;

    // One query against every document (1:N) gives the same scores as the zipped pairs.
    let r: CrossRef = reference("tiny-cross-encoder");
    let firsts: Vec<&PairRef> = r
        .pairs
        .iter()
        .filter(|p| p.query == r.pairs[0].query)
        .collect();
    let one_to_n = ce
        .pool(
            PoolInput::Pairs {
                queries: vec![firsts[0].query.clone()],
                documents: firsts.iter().map(|p| p.document.clone()).collect(),
            },
            opts(PoolTask::Score),
        )
        .await
        .unwrap();
    for (p, s) in firsts.iter().zip(&one_to_n.rows) {
        close(s[0], p.score, "1:N score");
    }

    let cls = engine.model("tiny-classifier").unwrap();
    assert_eq!(cls.card().tasks, vec![Task::Classify]);
    assert_eq!(
        cls.labels().unwrap(),
        ["negative", "neutral", "positive"].map(String::from)
    );
    let r: ClassifierRef = reference("tiny-classifier");
    let texts: Vec<String> = r.texts.iter().map(|t| t.text.clone()).collect();
    let probs = cls
        .pool(PoolInput::Texts(texts.clone()), opts(PoolTask::Classify))
        .await
        .unwrap();
    let logits = cls
        .pool(
            PoolInput::Texts(texts),
            PoolOptions {
                use_activation: Some(false),
                ..opts(PoolTask::Classify)
            },
        )
        .await
        .unwrap();
    for (t, (p, l)) in r.texts.iter().zip(probs.rows.iter().zip(&logits.rows)) {
        for i in 0..3 {
            close(
                p[i],
                t.probs[i],
                &format!("probability {i} of {:?}", t.text),
            );
            close(l[i], t.logits[i], &format!("logit {i} of {:?}", t.text));
        }
        let best = (0..3).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
        assert_eq!(cls.labels().unwrap()[best], t.label);
    }

    // What each model cannot do.
    for (m, task, input) in [
        (
            &cls,
            PoolTask::Score,
            pairs_of(&[&reference::<CrossRef>("tiny-cross-encoder").pairs[0]]),
        ),
        (&cls, PoolTask::Embed, PoolInput::Texts(vec!["hi".into()])),
        (&ce, PoolTask::Embed, PoolInput::Texts(vec!["hi".into()])),
    ] {
        match m.pool(input, opts(task)).await {
            Err(EngineError::UnsupportedTask { task: t }) => assert_eq!(t, task.as_str()),
            other => panic!("{task:?}: {other:?}"),
        }
    }
}

#[test]
fn a_head_that_does_not_fit_its_labels_is_a_load_error_naming_the_tensor() {
    let src = dir("tiny-classifier");
    let tmp = std::env::temp_dir().join(format!("engine-ce-labels-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    for name in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(name), tmp.join(name)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["id2label"] = serde_json::json!({"0": "no", "1": "yes"});
    cfg.as_object_mut().unwrap().remove("label2id");
    std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
    let err = load_encoder(&tmp)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("classifier.weight"), "{err}");
    let _ = std::fs::remove_dir_all(&tmp);
}

//! RoPE scaling read from `config.json` (`llama3`, `yarn`, `linear`) against transformers: the committed
//! tiny Llama under each variant's `rope_scaling`, our f32 logprobs at every position of a fixed
//! prompt against the top-5 that transformers computed in float32
//! (`tests/data/tiny-llama/rope_reference.json`, from `scripts/tiny_rope_reference.py`). The
//! variants move those logprobs by 0.03 to 0.05 from the unscaled model's, so a scaling read
//! wrongly (or ignored) fails the 1e-3 bound.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use engine::model::ActivationMode;
use serde_json::Value;

mod reference;

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-llama")
}

/// The tiny Llama in a folder of its own, with `rope_scaling` set to `scaling`.
fn variant(name: &str, scaling: &Value) -> PathBuf {
    edited(
        "tiny-llama",
        &format!("rope-{name}"),
        &serde_json::json!({"rope_theta": 10000.0, "rope_scaling": scaling}),
    )
}

/// Our logprobs at every position of `prompt`, in f32.
fn logprobs(dir: &Path, prompt: &[u32]) -> Vec<Vec<f64>> {
    let mut m = engine::load::load_hf_decoder(dir).unwrap().model;
    m.set_activation_mode(ActivationMode::F32);
    reference::logits_by_chunks(m.as_mut(), prompt, prompt.len())
        .iter()
        .map(|r| reference::log_softmax(r))
        .collect()
}

#[test]
fn rope_scaling_matches_transformers() {
    let reference = reference::load(&tiny().join("rope_reference.json"));
    let prompt = reference::prompt(&reference);
    let variants = reference["variants"].as_object().unwrap();
    for name in ["llama3", "yarn", "yarn-mscale", "linear"] {
        let v = &variants[name];
        let dir = variant(name, &v["rope_scaling"]);
        let ours = logprobs(&dir, &prompt);
        let worst = reference::largest_difference(&ours, &v["top5"]);
        // The same logprobs against the unscaled model's: how far ignoring the scaling lands.
        let unscaled = reference::largest_difference(&ours, &variants["default"]["top5"]);
        eprintln!(
            "{name}: largest top-5 logprob difference {worst:.2e} (from the unscaled model: {unscaled:.2e})"
        );
        assert!(worst < 1e-3, "{name}: top-5 logprobs differ by {worst}");
        assert!(
            unscaled > 1e-2,
            "{name}: the scaling changes nothing here ({unscaled})"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn an_incomplete_llama3_scaling_is_refused_naming_the_key() {
    let scaling = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
    let dir = variant("llama3-missing", &scaling);
    let err = engine::load::load_hf_decoder(&dir)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("low_freq_factor"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `folder`'s checkpoint in a folder of its own with `edit`'s keys in its config.json (its own
/// RoPE keys removed first).
fn edited(folder: &str, name: &str, edit: &Value) -> PathBuf {
    let src = tiny().join("..").join(folder);
    let dir = std::env::temp_dir().join(format!("ctx-rope-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut config = reference::load(&src.join("config.json"));
    let obj = config.as_object_mut().unwrap();
    for key in ["rope_scaling", "rope_theta", "rope_parameters"] {
        obj.remove(key);
    }
    for (k, v) in edit.as_object().unwrap() {
        obj.insert(k.clone(), v.clone());
    }
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    dir
}

#[test]
fn context_dependent_rope_is_fitted_to_the_served_context() {
    let reference = reference::load(&tiny().join("../context_rope_reference.json"));
    let prompt = reference::prompt(&reference);
    for (name, v) in reference["variants"].as_object().unwrap() {
        let dir = edited(v["folder"].as_str().unwrap(), name, &v["config"]);
        // Serving 48 tokens: LongRoPE's long factors, dynamic NTK's base grown for 48; served
        // no longer than the pretrained 32: the short factors and the plain base.
        for (context, tokens, key) in [(48, &prompt[..], "long"), (32, &prompt[..24], "short")] {
            let mut m = engine::load::load_hf_decoder(&dir).unwrap().model;
            m.set_activation_mode(ActivationMode::F32);
            m.fit_context(context);
            let ours: Vec<Vec<f64>> = reference::logits_by_chunks(m.as_mut(), tokens, tokens.len())
                .iter()
                .map(|r| reference::log_softmax(r))
                .collect();
            let worst = reference::largest_difference(&ours, &v[key]);
            eprintln!("{name}, context {context}: largest top-5 logprob difference {worst:.2e}");
            assert!(worst < 1e-3, "{name}, context {context}: {worst}");
        }
        // The long and the short settings differ here, so the choice is tested.
        let long_first = &v["long"][20][0][1];
        assert_ne!(long_first, &v["short"][20][0][1], "{name}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn an_incomplete_longrope_is_refused_naming_the_key() {
    let dir = edited(
        "tiny-phi3",
        "longrope-missing",
        &serde_json::json!({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
            "rope_theta": 10000.0}, "original_max_position_embeddings": 32}),
    );
    let err = engine::load::load_hf_decoder(&dir)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("long_factor"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

//! The families whose layers differ from Llama's, against transformers: Gemma 2 (scaled
//! embeddings, `1 + w` norms before and after the attention and the MLP, GeGLU, soft-capped
//! scores and logits, `query_pre_attn_scalar`, alternating sliding windows), Gemma 3 text
//! (per-head Q/K norms, sliding layers with their own RoPE base, linear scaling on the global
//! ones) and Mistral with a sliding window. Committed tiny random checkpoints
//! (`tests/data/tiny-{gemma2,gemma3,mistral-swa}`, from `scripts/make_tiny_families.py`) with
//! a 12-token window under a 48-token prompt; our logprobs at every position against
//! transformers' float32 top-5, through each attention path: decode one token at a time,
//! the whole prompt as one chunk, and chunked prefill (chunks of 5 and of 20 tokens, so a
//! window straddles chunks). Then each field that changes the numbers, changed: the output
//! moves or the load refuses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use engine::device::DTypeRequest;
use engine::model::ActivationMode;
use serde_json::{json, Value};

mod reference;

const FAMILIES: &[&str] = &["tiny-gemma2", "tiny-gemma3", "tiny-mistral-swa"];

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(name)
}

fn logprobs(rows: &[Vec<f32>]) -> Vec<Vec<f64>> {
    rows.iter().map(|r| reference::log_softmax(r)).collect()
}

#[test]
fn each_family_matches_transformers_through_every_attention_path() {
    for name in FAMILIES {
        let reference = reference::load(&dir(name).join("reference.json"));
        let prompt = reference::prompt(&reference);
        let mut m = engine::load::load_hf_decoder(&dir(name)).unwrap().model;
        m.set_activation_mode(ActivationMode::F32);
        for chunk in [1, 5, 20, prompt.len()] {
            let ours = logprobs(&reference::logits_by_chunks(m.as_mut(), &prompt, chunk));
            let worst = reference::largest_difference(&ours, &reference["top5"]);
            eprintln!("{name}, chunks of {chunk}: largest top-5 logprob difference {worst:.2e}");
            assert!(worst < 1e-3, "{name}, chunks of {chunk}: {worst}");
        }
        m.set_activation_mode(ActivationMode::Q8);
        let ours = logprobs(&reference::logits_by_chunks(m.as_mut(), &prompt, 1));
        let worst = reference::largest_difference(&ours, &reference["top5"]);
        eprintln!("{name}, q8 activations: largest top-5 logprob difference {worst:.2e}");
        assert!(worst < 2e-2, "{name}, q8: {worst}");
    }
}

/// Every family here runs on the GPU decoder (its parity is in `gpu_decoder.rs`); what it
/// lacks is refused by name, and the bring-up falls back to the CPU.
#[test]
fn the_gpu_decoder_refuses_what_it_does_not_implement_by_name() {
    let gpu = kernels::gpu::Gpu::emulator();
    for name in FAMILIES {
        let m = engine::load::load_hf_decoder(&dir(name)).unwrap().model;
        if let Err(e) = m.to_gpu(&gpu, DTypeRequest::Float32) {
            panic!("{name}: {e}");
        }
    }
    // Gemma 3's local RoPE base beside M-RoPE positions: the CPU decoder turns the local layers
    // by plain positions, which the GPU step does not have.
    let path = variant("tiny-gemma3", "mrope", |c| {
        c["rope_parameters"]["full_attention"]["mrope_section"] = json!([4, 2, 2]);
    });
    let m = engine::load::load_hf_decoder(&path).unwrap().model;
    let err = m
        .to_gpu(&gpu, DTypeRequest::Float32)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("rope_local_base_freq with mrope_section") && err.contains("GPU"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&path);
}

/// `name`'s checkpoint in a folder of its own with `edit` applied to its `config.json`.
fn variant(name: &str, tag: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let out = std::env::temp_dir().join(format!("family-{name}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(dir(name).join(f), out.join(f)).unwrap();
    }
    let mut config = reference::load(&dir(name).join("config.json"));
    edit(&mut config);
    std::fs::write(
        out.join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    out
}

fn run(path: &Path, prompt: &[u32]) -> Result<Vec<Vec<f32>>, String> {
    let mut m = engine::load::load_hf_decoder(path)
        .map_err(|e| e.to_string())?
        .model;
    m.set_activation_mode(ActivationMode::F32);
    Ok(reference::logits_by_chunks(
        m.as_mut(),
        prompt,
        prompt.len(),
    ))
}

#[test]
fn every_field_that_changes_the_numbers_is_honoured_or_refused() {
    let set = |path: &'static [&'static str], v: Value| {
        move |c: &mut Value| {
            let mut at = c;
            for key in &path[..path.len() - 1] {
                at = &mut at[*key];
            }
            at[path[path.len() - 1]] = v.clone();
        }
    };
    type Edit = Box<dyn Fn(&mut Value)>;
    type Edits = Vec<(&'static str, Edit)>;
    let common: Edits = vec![
        (
            "rms_norm_eps",
            Box::new(set(&["rms_norm_eps"], json!(0.05))),
        ),
        (
            "sliding_window",
            Box::new(set(&["sliding_window"], json!(5))),
        ),
        (
            "hidden_act",
            Box::new(set(&["hidden_act"], json!("gelu_pytorch_tanh"))),
        ),
        (
            "hidden_activation",
            Box::new(set(&["hidden_activation"], json!("silu"))),
        ),
        ("head_dim", Box::new(set(&["head_dim"], json!(8)))),
        (
            "tie_word_embeddings",
            Box::new(|c: &mut Value| {
                let tied = c["tie_word_embeddings"].as_bool().unwrap_or(false);
                c["tie_word_embeddings"] = json!(!tied);
            }),
        ),
        (
            "num_key_value_heads",
            Box::new(set(&["num_key_value_heads"], json!(4))),
        ),
        ("vocab_size", Box::new(set(&["vocab_size"], json!(1000)))),
    ];
    let gemma: Edits = vec![
        (
            "query_pre_attn_scalar",
            Box::new(set(&["query_pre_attn_scalar"], json!(64))),
        ),
        (
            "attn_logit_softcapping",
            Box::new(set(&["attn_logit_softcapping"], json!(1.0))),
        ),
        (
            "final_logit_softcapping",
            Box::new(set(&["final_logit_softcapping"], json!(1.5))),
        ),
        (
            "layer_types",
            Box::new(|c: &mut Value| {
                let n = c["num_hidden_layers"].as_u64().unwrap() as usize;
                c["layer_types"] = json!(vec!["full_attention"; n]);
            }),
        ),
        (
            "use_bidirectional_attention",
            Box::new(set(&["use_bidirectional_attention"], json!(true))),
        ),
    ];
    let rope_theta: Edits = vec![(
        "rope_parameters.rope_theta",
        Box::new(set(&["rope_parameters", "rope_theta"], json!(77.0))),
    )];
    let gemma3_rope: Edits = vec![
        (
            "rope_parameters.sliding_attention.rope_theta",
            Box::new(set(
                &["rope_parameters", "sliding_attention", "rope_theta"],
                json!(5000.0),
            )),
        ),
        (
            "rope_parameters.full_attention.factor",
            Box::new(set(
                &["rope_parameters", "full_attention", "factor"],
                json!(1.0),
            )),
        ),
        (
            "rope_parameters.full_attention.rope_theta",
            Box::new(set(
                &["rope_parameters", "full_attention", "rope_theta"],
                json!(50.0),
            )),
        ),
    ];
    let cases: [(&str, Vec<&Edits>); 3] = [
        ("tiny-gemma2", vec![&common, &gemma, &rope_theta]),
        ("tiny-gemma3", vec![&common, &gemma, &gemma3_rope]),
        ("tiny-mistral-swa", vec![&common, &rope_theta]),
    ];
    for (name, groups) in cases {
        let reference = reference::load(&dir(name).join("reference.json"));
        let prompt = reference::prompt(&reference);
        let base = run(&dir(name), &prompt).unwrap();
        for (field, edit) in groups.into_iter().flatten() {
            // Only the fields the family's config has (Gemma names its activation
            // `hidden_activation`, Mistral `hidden_act`).
            let config = reference::load(&dir(name).join("config.json"));
            if config.get(field.split('.').next().unwrap()).is_none() {
                continue;
            }
            let path = variant(name, &field.replace('.', "-"), |c| edit(c));
            match run(&path, &prompt) {
                Err(e) => eprintln!("{name}: {field} changed: refused: {e}"),
                Ok(rows) => {
                    let moved = rows
                        .iter()
                        .flatten()
                        .zip(base.iter().flatten())
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    eprintln!("{name}: {field} changed: logits move by up to {moved:.2e}");
                    assert!(
                        moved > 1e-3 || rows.len() != base.len(),
                        "{name}: {field} changed and nothing moved ({moved})"
                    );
                }
            }
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

//! The SmolLM2 chat template rendered by our minijinja setup must give exactly the prompts
//! transformers' `apply_chat_template(add_generation_prompt=True)` gave for the reference cases.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use engine::api::ChatTemplateOptions;
use engine::chat_template::ChatTemplate;
use serde_json::Value;

fn reference() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("REFERENCE_DIR") {
        candidates.push(PathBuf::from(d));
    }
    candidates.push(root.join("shared/reference"));
    candidates.push(root.join("../shared/reference"));
    let path = candidates
        .iter()
        .map(|d| d.join("smollm2_greedy.json"))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("smollm2_greedy.json not found in {candidates:?}; set REFERENCE_DIR")
        });
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn smollm2_template_matches_transformers_for_every_chat_case() {
    let r = reference();
    let source = r["chat_template"].as_str().unwrap();
    let template = ChatTemplate::new(
        source,
        Some("<|im_start|>".into()),
        Some("<|im_end|>".into()),
    )
    .unwrap();
    let opts = ChatTemplateOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let cases = r["chat"].as_array().unwrap();
    assert_eq!(cases.len(), 8);
    for case in cases {
        let rendered = template.render(&case["messages"], &opts).unwrap();
        assert_eq!(
            rendered,
            case["prompt"].as_str().unwrap(),
            "case {}",
            case["id"]
        );
    }
}

#[test]
fn smollm2_template_without_generation_prompt_and_continuing() {
    let r = reference();
    let template = ChatTemplate::new(r["chat_template"].as_str().unwrap(), None, None).unwrap();
    let case = &r["chat"][0];
    let with = template
        .render(
            &case["messages"],
            &ChatTemplateOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .unwrap();
    let without = template
        .render(&case["messages"], &ChatTemplateOptions::default())
        .unwrap();
    assert_eq!(format!("{without}<|im_start|>assistant\n"), with);

    let mut messages = case["messages"].as_array().unwrap().clone();
    messages.push(serde_json::json!({"role": "assistant", "content": "The capital is"}));
    let continued = template
        .render(
            &Value::Array(messages),
            &ChatTemplateOptions {
                add_generation_prompt: true,
                continue_final_message: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        continued,
        format!("{without}<|im_start|>assistant\nThe capital is")
    );
}

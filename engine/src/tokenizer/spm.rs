//! SentencePiece-style vocabularies (`tokenizer.ggml.model = llama`: Llama 2, Gemma, Phi-3)
//! as a `tokenizers` BPE.
//!
//! llama.cpp tokenises these by splitting the text into UTF-8 characters and repeatedly
//! merging the adjacent pair whose concatenation is a token with the highest score (the
//! leftmost on a tie); a character that is no token becomes its bytes' `<0xXX>` tokens. A BPE
//! whose merges are every pair `(a, b)` with `a`, `b` and `ab` in the vocabulary, ranked by
//! the score of `ab`, makes the same choices: `tokenizers` also merges the lowest rank first
//! and the leftmost on a tie, and falls back to byte tokens. Spaces are `▁`, with one
//! prepended to each run of text between special tokens when `add_space_prefix` is set.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Merges, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::NormalizerWrapper;

use crate::error::Result;
use crate::gguf::GgufFile;

/// SentencePiece's word boundary.
const SPACE: &str = "\u{2581}";

/// What the tokenizer needs besides its added tokens and post-processor.
pub(super) struct SpmParts {
    pub model: BPE,
    pub normalizer: NormalizerWrapper,
    pub decoder: DecoderWrapper,
    pub merges: usize,
}

/// The merges that reproduce score-ordered merging: for each token `ab`, every split into
/// two tokens `a` and `b` (ordered by their ids), all ranked by the score of `ab`, highest
/// first (a stable sort, so equal scores keep token order).
fn merges_by_score(tokens: &[String], scores: &[f32], ids: &HashMap<&str, u32>) -> Merges {
    let mut ranked: Vec<(f32, String, String)> = Vec::new();
    for (merged, &score) in tokens.iter().zip(scores) {
        let mut splits: Vec<(u32, u32, &str, &str)> = merged
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (a, b) = merged.split_at(at);
                Some((*ids.get(a)?, *ids.get(b)?, a, b))
            })
            .collect();
        splits.sort_by_key(|&(ia, ib, _, _)| (ia, ib));
        ranked.extend(
            splits
                .into_iter()
                .map(|(_, _, a, b)| (score, a.to_string(), b.to_string())),
        );
    }
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0));
    ranked.into_iter().map(|(_, a, b)| (a, b)).collect()
}

/// The BPE, normaliser and decoder for `tokens` with their `scores`; `unk`: the unknown
/// token's id, for characters with neither a token nor byte tokens.
pub(super) fn build(
    g: &GgufFile,
    tokens: &[String],
    scores: &[f32],
    unk: Option<u32>,
) -> Result<SpmParts> {
    let mut ids: HashMap<&str, u32> = HashMap::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        ids.entry(t.as_str()).or_insert(id as u32);
    }
    let merges = merges_by_score(tokens, scores, &ids);
    let n_merges = merges.len();
    let vocab: tokenizers::models::bpe::Vocab =
        ids.iter().map(|(t, &id)| (t.to_string(), id)).collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(id) = unk {
        builder = builder.unk_token(tokens[id as usize].clone());
    }
    let model = builder
        .build()
        .map_err(|e| g.error(format!("building the SentencePiece model: {e}")))?;
    let space_prefix = g
        .get_bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);
    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| g.error(format!("SentencePiece normaliser: {e}")))
    };
    let mut normalizers = Vec::new();
    if space_prefix {
        normalizers.push(NormalizerWrapper::Prepend(Prepend::new(SPACE.to_string())));
    }
    normalizers.push(NormalizerWrapper::Replace(replace(" ", SPACE)?));
    let mut decoders = vec![
        DecoderWrapper::Replace(replace(SPACE, " ")?),
        DecoderWrapper::ByteFallback(ByteFallback::default()),
        DecoderWrapper::Fuse(Fuse::default()),
    ];
    if space_prefix {
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    Ok(SpmParts {
        model,
        normalizer: NormalizerWrapper::Sequence(NormalizerSequence::new(normalizers)),
        decoder: DecoderWrapper::Sequence(DecoderSequence::new(decoders)),
        merges: n_merges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_are_every_split_ranked_by_the_merged_score() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -1.0, -0.5, -2.0];
        let ids: HashMap<&str, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_str(), i as u32))
            .collect();
        let m = merges_by_score(&tokens, &scores, &ids);
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            m,
            vec![
                pair("b", "c"),
                pair("a", "b"),
                pair("a", "bc"),
                pair("ab", "c")
            ]
        );
    }
}

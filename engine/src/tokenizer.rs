//! GGUF vocabularies as `tokenizers` tokenizers.
//!
//! `tokenizer.ggml.model = llama` (SentencePiece-style: Llama 2, Gemma, Phi-3) is built by
//! [`spm`]; the rest of this module is shared with, or specific to, `gpt2`.
//!
//! A GGUF with `tokenizer.ggml.model = gpt2` carries the byte-level BPE vocab
//! (`tokenizer.ggml.tokens`), its merges, per-token types and the pre-tokenizer name
//! (`tokenizer.ggml.pre`). This module rebuilds what llama.cpp does with them:
//! - the BPE model over the vocab and merges;
//! - the pre-tokenizer for the named split (`smollm`: individual digits, then the GPT-2
//!   regex; `llama-bpe` / `qwen2` and friends: their split regexes; otherwise GPT-2);
//! - a ByteLevel decoder;
//! - control tokens (type 3) as special added tokens, user-defined tokens (type 4) as added
//!   tokens, so they match in text and are skipped when decoding with `skip_special_tokens`;
//! - a BOS (or EOS) post-processor only when `tokenizer.ggml.add_bos_token`
//!   (`add_eos_token`) says so.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::error::Result;
use crate::gguf::GgufFile;

mod spm;

/// llama.cpp token types.
const TOKEN_TYPE_UNKNOWN: i64 = 2;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Token texts that end a turn (llama.cpp's list of end-of-generation tokens, less those of
/// models this engine does not run).
const END_OF_TURN: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
];

/// `tokenizer.ggml.pre` names llama.cpp treats as Llama 3's: its split, merges that may be
/// skipped for a word in the vocabulary, and a BOS by default.
const LLAMA3_PRE: &[&str] = &["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"];

/// The Llama 3 split regex (llama.cpp `llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen2 split regex: as Llama 3 but single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A tokenizer built from GGUF metadata, with the special tokens the model needs.
pub struct GgufTokenizer {
    pub tokenizer: Tokenizer,
    pub bos_token_id: Option<u32>,
    pub bos_token: Option<String>,
    /// The EOS id first, then an end-of-turn id if the file names a different one.
    pub eos_token_ids: Vec<u32>,
    pub eos_token: Option<String>,
    /// Number of entries in `tokenizer.ggml.tokens`.
    pub vocab_size: usize,
}

impl std::fmt::Debug for GgufTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

fn string_array(g: &GgufFile, key: &str) -> Result<Vec<String>> {
    let arr = g
        .get_array(key)?
        .ok_or_else(|| g.error(format!("missing metadata '{key}'")))?;
    arr.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| g.error(format!("metadata '{key}'[{i}] is not a string")))
        })
        .collect()
}

fn token_id(g: &GgufFile, key: &str, vocab_size: usize) -> Result<Option<u32>> {
    match g.get_u64(key)? {
        None => Ok(None),
        Some(id) if (id as usize) < vocab_size => Ok(Some(id as u32)),
        Some(id) => Err(g.error(format!(
            "metadata '{key}' = {id} is outside the vocabulary of {vocab_size} tokens"
        ))),
    }
}

fn pre_tokenizer(g: &GgufFile, pre: &str) -> Result<PreTokenizerWrapper> {
    let split = |re: &str| -> Result<PreTokenizerWrapper> {
        let s = Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| g.error(format!("pre-tokenizer regex for '{pre}': {e}")))?;
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Split(s),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
        ])))
    };
    let gpt2 = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
    Ok(match pre {
        // llama.cpp: `\p{N}` runs split into single digits, then the GPT-2 regex.
        "smollm" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            gpt2(),
        ])),
        p if LLAMA3_PRE.contains(&p) || p == "smaug-bpe" => split(LLAMA3_SPLIT)?,
        "qwen2" | "qwen" | "deepseek-r1-qwen" | "megrez" => split(QWEN2_SPLIT)?,
        "gpt2" | "default" | "gpt-2" | "" => gpt2(),
        other => {
            tracing::warn!(
                file = %g.path(),
                pre = other,
                "unknown tokenizer.ggml.pre; using the GPT-2 byte-level split"
            );
            gpt2()
        }
    })
}

/// Build the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
pub fn from_gguf(g: &GgufFile) -> Result<GgufTokenizer> {
    let model = g.get_str("tokenizer.ggml.model")?.unwrap_or("").to_string();
    if !matches!(model.as_str(), "gpt2" | "llama") {
        return Err(g.error(format!(
            "unsupported tokenizer.ggml.model '{model}' (supported: gpt2 byte-level BPE, llama SentencePiece)"
        )));
    }
    let tokens = string_array(g, "tokenizer.ggml.tokens")?;
    let mut types: Vec<i64> = match g.get_array("tokenizer.ggml.token_type")? {
        None => vec![1; tokens.len()],
        Some(a) => {
            if a.len() != tokens.len() {
                return Err(g.error(format!(
                    "tokenizer.ggml.token_type has {} entries for {} tokens",
                    a.len(),
                    tokens.len()
                )));
            }
            a.iter()
                .map(|v| v.as_i64().unwrap_or(1))
                .collect::<Vec<_>>()
        }
    };
    let vocab_size = tokens.len();
    if vocab_size == 0 || vocab_size > u32::MAX as usize {
        return Err(g.error(format!("invalid vocabulary size {vocab_size}")));
    }
    // As llama.cpp: end-of-turn tokens are control tokens whatever type the file gives them.
    let end_of_turn: Vec<u32> = (0..vocab_size)
        .filter(|&i| END_OF_TURN.contains(&tokens[i].as_str()))
        .map(|i| i as u32)
        .collect();
    for &i in &end_of_turn {
        types[i as usize] = TOKEN_TYPE_CONTROL;
    }
    let (mut tokenizer, merges, pre) = if model == "llama" {
        let scores = scores(g, vocab_size)?;
        let unk = types
            .iter()
            .position(|&t| t == TOKEN_TYPE_UNKNOWN)
            .map(|i| i as u32);
        let parts = spm::build(g, &tokens, &scores, unk)?;
        let mut tokenizer = Tokenizer::new(parts.model);
        tokenizer
            .with_normalizer(Some(parts.normalizer))
            .map_err(|e| g.error(format!("SentencePiece normaliser: {e}")))?;
        tokenizer.with_decoder(Some(parts.decoder));
        (tokenizer, parts.merges, "spm".to_string())
    } else {
        byte_level_bpe(g, &tokens)?
    };

    let rstrip = phi3_rstrip(g)?;
    let specials: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL)
        .map(|(s, _)| AddedToken::from(s.clone(), true).rstrip(rstrip(s)))
        .collect();
    let user: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, &t)| t == TOKEN_TYPE_USER_DEFINED)
        .map(|(s, _)| {
            AddedToken::from(s.clone(), false)
                .normalized(false)
                .rstrip(rstrip(s))
        })
        .collect();
    let n_special = specials.len();
    tokenizer
        .add_special_tokens(specials)
        .map_err(|e| g.error(format!("registering control tokens: {e}")))?;
    tokenizer
        .add_tokens(user)
        .map_err(|e| g.error(format!("registering user-defined tokens: {e}")))?;

    let bos_token_id = token_id(g, "tokenizer.ggml.bos_token_id", vocab_size)?;
    let eos_id = token_id(g, "tokenizer.ggml.eos_token_id", vocab_size)?;
    let eot_id = token_id(g, "tokenizer.ggml.eot_token_id", vocab_size)?;
    let mut eos_token_ids: Vec<u32> = eos_id.into_iter().collect();
    // Without `eot_token_id`, generation also ends at the end-of-turn tokens the chat
    // template writes (llama.cpp ends at every one in the vocabulary; this keeps, say,
    // SmolLM2's `<|endoftext|>` out of a chat model's stops, as its HF files do).
    let template = g.get_str("tokenizer.chat_template")?.unwrap_or("");
    let turn_ends = match eot_id {
        Some(e) => vec![e],
        None => end_of_turn
            .into_iter()
            .filter(|&i| template.contains(tokens[i as usize].as_str()))
            .collect(),
    };
    for e in turn_ends {
        if !eos_token_ids.contains(&e) {
            eos_token_ids.push(e);
        }
    }
    let name = |id: Option<u32>| id.map(|i| tokens[i as usize].clone());
    let bos_token = name(bos_token_id);
    let eos_token = name(eos_id);

    // Where the file does not say, llama.cpp's default: a BOS for SentencePiece vocabularies
    // and Llama 3's split, none for the rest.
    let add_bos = g
        .get_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(pre == "spm" || LLAMA3_PRE.contains(&pre.as_str()));
    let add_eos = g.get_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let mut special_tokens = Vec::new();
    let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
    if add_bos {
        let (id, tok) = bos_token_id
            .zip(bos_token.clone())
            .ok_or_else(|| g.error("add_bos_token is set but there is no bos_token_id"))?;
        prefix.push("BOS".to_string());
        special_tokens.push(special_token(g, "BOS", id, tok)?);
    }
    if add_eos {
        let (id, tok) = eos_id
            .zip(eos_token.clone())
            .ok_or_else(|| g.error("add_eos_token is set but there is no eos_token_id"))?;
        suffix.push("EOS".to_string());
        special_tokens.push(special_token(g, "EOS", id, tok)?);
    }
    if add_bos || add_eos {
        let wrap = |seq: &str| {
            let mut v = prefix.clone();
            v.push(seq.to_string());
            v.extend(suffix.iter().cloned());
            v
        };
        let single = wrap("$A");
        let mut pair = single.clone();
        pair.extend(wrap("$B:1"));
        let post = TemplateProcessing::builder()
            .try_single(single)
            .and_then(|b| b.try_pair(pair))
            .map_err(|e| g.error(format!("post-processor template: {e}")))?
            .special_tokens(special_tokens)
            .build()
            .map_err(|e| g.error(format!("post-processor: {e}")))?;
        tokenizer.with_post_processor(Some(post));
    }

    tracing::info!(
        file = %g.path(),
        vocab = vocab_size,
        merges,
        pre = %pre,
        control_tokens = n_special,
        add_bos,
        "built GGUF tokenizer"
    );
    Ok(GgufTokenizer {
        tokenizer,
        bos_token_id,
        bos_token,
        eos_token_ids,
        eos_token,
        vocab_size,
    })
}

/// Whether a special token swallows the whitespace after it. llama.cpp sets this for Phi-3
/// vocabularies (by `general.name`): every control and user-defined token but `<unk>`, `<s>`
/// and `<|endoftext|>`; for every other model, none.
fn phi3_rstrip(g: &GgufFile) -> Result<impl Fn(&str) -> bool> {
    let name = g.get_str("general.name")?.unwrap_or("").to_lowercase();
    let phi3 = name.contains("phi3") || name.contains("phi-3");
    Ok(move |token: &str| phi3 && !matches!(token, "<unk>" | "<s>" | "<|endoftext|>"))
}

/// `tokenizer.ggml.scores`, one per token.
fn scores(g: &GgufFile, vocab_size: usize) -> Result<Vec<f32>> {
    let arr = g
        .get_array("tokenizer.ggml.scores")?
        .ok_or_else(|| g.error("missing metadata 'tokenizer.ggml.scores'"))?;
    if arr.len() != vocab_size {
        return Err(g.error(format!(
            "tokenizer.ggml.scores has {} entries for {vocab_size} tokens",
            arr.len()
        )));
    }
    arr.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_f64()
                .map(|s| s as f32)
                .ok_or_else(|| g.error(format!("tokenizer.ggml.scores[{i}] is not a number")))
        })
        .collect()
}

/// The byte-level BPE of a `gpt2` vocabulary: the model over its merges, the pre-tokenizer
/// `tokenizer.ggml.pre` names, and the byte-level decoder.
fn byte_level_bpe(g: &GgufFile, tokens: &[String]) -> Result<(Tokenizer, usize, String)> {
    let mut vocab = Vocab::default();
    let mut duplicates = 0usize;
    for (id, t) in tokens.iter().enumerate() {
        if vocab.contains_key(t) {
            duplicates += 1;
        } else {
            vocab.insert(t.clone(), id as u32);
        }
    }
    if duplicates > 0 {
        tracing::warn!(file = %g.path(), duplicates, "vocabulary has duplicate token strings; keeping the first id of each");
    }
    let merges_raw = match g.get_array("tokenizer.ggml.merges")? {
        Some(_) => string_array(g, "tokenizer.ggml.merges")?,
        None => Vec::new(),
    };
    let mut merges: Merges = Vec::with_capacity(merges_raw.len());
    for (i, m) in merges_raw.iter().enumerate() {
        let (a, b) = m
            .split_once(' ')
            .ok_or_else(|| g.error(format!("tokenizer.ggml.merges[{i}] '{m}' is not a pair")))?;
        merges.push((a.to_string(), b.to_string()));
    }

    let pre = g
        .get_str("tokenizer.ggml.pre")?
        .unwrap_or("default")
        .to_string();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(LLAMA3_PRE.contains(&pre.as_str()))
        .build()
        .map_err(|e| g.error(format!("building the BPE model: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer(g, &pre)?));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    Ok((tokenizer, merges_raw.len(), pre))
}

fn special_token(g: &GgufFile, alias: &str, id: u32, tok: String) -> Result<SpecialToken> {
    SpecialToken::new(alias.to_string(), vec![id], vec![tok])
        .map_err(|e| g.error(format!("special token {alias}: {e}")))
}

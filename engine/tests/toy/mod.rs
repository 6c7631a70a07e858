//! Shared fixtures of the `core_*` tests: a byte-level BPE tokenizer and toy models.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine::error::{EngineError, Result};
use engine::model::{
    host_kv_blocks, CausalLm, DecoderInfo, EmbeddingModel, EncoderHead, EncoderInfo, EncoderInput,
    KvBudget, PagedKvCache, Pooling, SeqChunk,
};

/// `<s>` and `</s>` follow the 256 byte tokens.
pub const BOS: u32 = 256;
pub const EOS: u32 = 257;
pub const VOCAB: usize = 258;

/// GPT-2's byte-to-unicode table.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = vec!['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        if let Some(pos) = printable.iter().position(|&p| p == b) {
            printable.remove(pos);
            chars[b as usize] = char::from_u32(b).unwrap();
        } else {
            chars[b as usize] = char::from_u32(256 + extra).unwrap();
            extra += 1;
        }
    }
    chars
}

/// A byte-level BPE tokenizer without merges: token id = byte value, plus two specials.
pub fn byte_tokenizer() -> tokenizers::Tokenizer {
    let chars = byte_chars();
    let vocab: serde_json::Map<String, serde_json::Value> = chars
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), serde_json::json!(i)))
        .collect();
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            {"id": BOS, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": EOS, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": []}
    });
    json.to_string().parse().unwrap()
}

/// The toy model's rule: after a `.` anywhere in the context comes EOS; otherwise the last
/// token plus one or two (by the parity of the context's sum), within the byte range. Depending
/// on the whole context makes a wrong KV cache (prefix reuse, recompute) change the output.
pub fn toy_next(context: &[u32]) -> u32 {
    if context.contains(&(b'.' as u32)) {
        return EOS;
    }
    let last = *context.last().unwrap();
    let sum: u64 = context.iter().map(|&t| t as u64).sum();
    (last + 1 + (sum % 2) as u32) % 256
}

/// Logits peaked at `next`, decreasing over the following ids (so sampling has a spread).
pub fn toy_logits(next: u32) -> Vec<f32> {
    let mut l = vec![-5.0; VOCAB];
    for d in 0..8u32 {
        l[((next + d) as usize) % VOCAB] = 4.0 - d as f32 * 0.5;
    }
    l
}

/// Greedy continuation by the toy rule.
pub fn expected(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = toy_next(&ctx);
        out.push(t);
        ctx.push(t);
        if t == EOS {
            break;
        }
    }
    out
}

/// A causal LM that stores each token (and its position) in the paged KV cache and reads the
/// whole context back from it, so block-table mistakes show up as errors or wrong tokens.
pub struct ToyModel {
    info: DecoderInfo,
    pub delay: Duration,
    /// Panic when this token is in a chunk.
    pub panic_on: Option<u32>,
    pub forwards: Arc<AtomicUsize>,
    kv: Option<PagedKvCache>,
}

impl ToyModel {
    pub fn new(max_position: usize) -> Self {
        ToyModel {
            info: DecoderInfo {
                vocab_size: VOCAB,
                n_layers: 1,
                n_kv_heads: 1,
                head_dim: 2,
                max_position,
                bos_token_id: Some(BOS),
                eos_token_ids: vec![EOS],
            },
            delay: Duration::ZERO,
            panic_on: None,
            forwards: Arc::new(AtomicUsize::new(0)),
            kv: None,
        }
    }
}

impl CausalLm for ToyModel {
    fn info(&self) -> &DecoderInfo {
        &self.info
    }

    fn allocate_kv(&mut self, block_size: usize, budget: &KvBudget) -> Result<usize> {
        let blocks = host_kv_blocks(block_size, budget);
        self.kv = Some(PagedKvCache::new(&self.info, block_size, blocks));
        Ok(blocks)
    }

    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        self.forwards.fetch_add(1, Ordering::SeqCst);
        let kv = self
            .kv
            .as_mut()
            .ok_or_else(|| EngineError::Internal("no KV cache".into()))?;
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let mut out = Vec::with_capacity(batch.len());
        for chunk in batch {
            if let Some(p) = self.panic_on {
                if chunk.tokens.contains(&p) {
                    panic!("toy model asked to panic on token {p}");
                }
            }
            let end = chunk.start_pos + chunk.tokens.len();
            if chunk.block_table.len() * kv.block_size < end {
                return Err(EngineError::Internal("block table too short".into()));
            }
            let mut context = Vec::with_capacity(end);
            let offsets: Vec<usize> = (0..end)
                .map(|pos| kv.offset(chunk.block_table, pos))
                .collect();
            let k0 = kv.k[0]
                .as_f32_mut()
                .ok_or_else(|| EngineError::Internal("the toy keeps an f32 cache".into()))?;
            for (pos, &off) in offsets[..chunk.start_pos].iter().enumerate() {
                let (tok, stored_pos) = (k0[off], k0[off + 1]);
                if stored_pos != pos as f32 + 1.0 {
                    return Err(EngineError::Internal(format!(
                        "KV cache has no token at position {pos}"
                    )));
                }
                context.push(tok as u32);
            }
            for (i, &t) in chunk.tokens.iter().enumerate() {
                let off = offsets[chunk.start_pos + i];
                k0[off] = t as f32;
                k0[off + 1] = (chunk.start_pos + i) as f32 + 1.0;
                context.push(t);
            }
            out.push(chunk.want_logits.then(|| toy_logits(toy_next(&context))));
        }
        Ok(out)
    }
}

/// An embedding model whose vector is `[len, sum of ids]`, optionally slow.
pub struct ToyEmbedder {
    info: EncoderInfo,
    pub delay: Duration,
    pub batches: Arc<AtomicUsize>,
}

impl ToyEmbedder {
    pub fn new(delay: Duration) -> Self {
        ToyEmbedder {
            info: EncoderInfo {
                hidden_size: 2,
                max_seq_len: 16,
                pooling: Pooling::Mean,
                normalize: false,
                head: EncoderHead::Embed,
            },
            delay,
            batches: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl EmbeddingModel for ToyEmbedder {
    fn info(&self) -> &EncoderInfo {
        &self.info
    }

    fn forward(&self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        Ok(batch
            .iter()
            .map(|input| {
                let ids = input.ids;
                vec![ids.len() as f32, ids.iter().map(|&i| i as f32).sum()]
            })
            .collect())
    }
}

/// A request for the toy models: the prompt's bytes as token ids.
pub fn request(prompt: &str, params: engine::api::SamplingParams) -> engine::api::GenerateRequest {
    engine::api::GenerateRequest {
        request_id: format!("req-{prompt}"),
        prompt_ids: prompt.bytes().map(u32::from).collect(),
        params,
        cache_salt: None,
        media: None,
    }
}

//! What a served model holds in host memory, for the deployment's memory bound: the weights as
//! loaded (measured around the load), the KV cache, one step's scratch, one sequence's share.

use std::path::Path;

use crate::api::ModelMemory;
use crate::load::LoadedDecoder;
use crate::model::{DecoderInfo, KvDtype, LoadedEncoder, PagedKvCache, StepShape};

/// The process's anonymous resident memory (`RssAnon` in `/proc/self/status`), in bytes;
/// `None` off Linux or when it cannot be read.
pub(super) fn rss_anon() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes of a checkpoint's weight files: the file itself, or a folder's `*.safetensors` and
/// `*.gguf` files (links followed, as the loaders map them).
pub(super) fn weight_file_bytes(path: &Path) -> u64 {
    if path.is_file() {
        return std::fs::metadata(path).map_or(0, |m| m.len());
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "safetensors" || x == "gguf")
        })
        .map(|p| std::fs::metadata(&p).map_or(0, |m| m.len()))
        .sum()
}

/// The weights term of a model loaded from `path`: its files plus the anonymous memory the
/// load kept (`before` and `after` from [`rss_anon`]).
pub(super) fn weights(path: &Path, before: Option<u64>, after: Option<u64>) -> u64 {
    let kept = match (before, after) {
        (Some(b), Some(a)) => a.saturating_sub(b),
        _ => 0,
    };
    weight_file_bytes(path).saturating_add(kept)
}

/// Compute threads the engine's pools run (`--threads`, else every core).
pub(super) fn threads(configured: Option<usize>) -> usize {
    configured.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    })
}

/// A decoder's sizes that its terms follow from.
pub(super) struct DecoderShape {
    pub weights: u64,
    pub max_batched_tokens: usize,
    pub active: usize,
    pub max_model_len: usize,
    pub threads: usize,
    pub max_token_bytes: usize,
}

/// A decoder's terms before its KV cache is allocated ([`kv_bytes`] fills that one in).
pub(super) fn decoder(d: &LoadedDecoder, s: &DecoderShape) -> ModelMemory {
    let logit_rows = s.active.max(crate::scheduler::PROMPT_LOGPROB_ROWS);
    let model_step = d.model.step_host_bytes(&StepShape {
        rows: s.max_batched_tokens,
        logit_rows,
        max_len: s.max_model_len,
        threads: s.threads,
    });
    let media_step = d
        .media
        .as_ref()
        .map_or(0, |m| m.work_bytes(s.max_model_len));
    ModelMemory {
        weights: s.weights,
        kv_cache: 0,
        step: model_step.saturating_add(media_step),
        // A sequence's prompt and output ids, its block table and its text, as detokenised
        // and as sent (its media tensors are the gateway's to count: the preprocessing makes
        // them).
        per_sequence: s.max_model_len as u64 * (16 + 2 * s.max_token_bytes as u64),
        max_token_bytes: s.max_token_bytes as u64,
    }
}

/// A host KV cache of `blocks` blocks of `block_size` tokens (`Auto` is f32 on the host).
pub(super) fn kv_bytes(
    info: &DecoderInfo,
    blocks: usize,
    block_size: usize,
    dtype: KvDtype,
) -> u64 {
    let dtype = match dtype {
        KvDtype::Auto => KvDtype::Float32,
        t => t,
    };
    (blocks as u64 * block_size as u64)
        .saturating_mul(PagedKvCache::bytes_per_token(info, dtype) as u64)
}

/// An encoder's terms: its batches of up to `batch_tokens` tokens on `threads` threads; each
/// input holds its output vector and its buffers' headers (its ids are as many as its text's
/// bytes at most: the gateway counts them with the body).
pub(super) fn encoder(
    e: &LoadedEncoder,
    weights: u64,
    batch_tokens: usize,
    threads: usize,
    max_token_bytes: usize,
) -> ModelMemory {
    let info = e.model.info();
    ModelMemory {
        weights,
        kv_cache: 0,
        step: e.model.step_host_bytes(batch_tokens, threads),
        per_sequence: info.hidden_size as u64 * 4 + 96,
        max_token_bytes: max_token_bytes as u64,
    }
}

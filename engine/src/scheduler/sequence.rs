//! One sequence as the engine thread holds it: its tokens, KV blocks, sampler and the prompt
//! logprobs it still owes its client.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::SeqEvent;
use crate::api::PromptLogprob;
use crate::block_manager::{BlockHash, BlockId, HashContext};
use crate::error::{EngineError, Result};
use crate::sampling::SequenceSampler;

pub(super) struct Sequence {
    pub(super) id: u64,
    pub(super) group: u64,
    pub(super) request_id: String,
    /// Prompt followed by the generated tokens.
    pub(super) tokens: Vec<u32>,
    pub(super) prompt_len: usize,
    pub(super) max_tokens: usize,
    /// Tokens whose K/V are in the cache.
    pub(super) computed: usize,
    pub(super) table: Vec<BlockId>,
    pub(super) hashes: Vec<BlockHash>,
    /// Leading blocks already registered in the prefix cache.
    pub(super) registered: usize,
    pub(super) hash_ctx: HashContext,
    pub(super) media: Option<std::sync::Arc<crate::api::PromptMedia>>,
    /// The adapter the sequence runs with, and its factors while it is in the running batch
    /// (given back when it leaves, so that only running sequences pin an adapter in memory).
    pub(super) lora: Option<std::sync::Arc<crate::lora::LoraRef>>,
    pub(super) weights: Option<std::sync::Arc<crate::lora::LoraAdapter>>,
    pub(super) sampler: SequenceSampler,
    pub(super) events: UnboundedSender<SeqEvent>,
    pub(super) admitted_once: bool,
    pub(super) cached_tokens: usize,
    pub(super) arrived: Instant,
    pub(super) last_token_at: Option<Instant>,
    /// Prompt logprobs asked for and not yet sent: the entries so far (the first is the
    /// prompt's first token, which has none) and the alternatives each reports.
    pub(super) prompt_lp: Option<(Vec<Option<PromptLogprob>>, usize)>,
}

/// Prompt tokens a sequence with prompt logprobs runs per step: each needs a row of logits
/// (vocabulary-sized), so its prefill goes in chunks of this size to bound that memory.
pub(crate) const PROMPT_LOGPROB_ROWS: usize = 512;

impl Sequence {
    /// The name of the LoRA adapter the sequence runs with.
    pub(super) fn lora_name(&self) -> Option<&str> {
        self.lora.as_deref().map(|a| a.name.as_str())
    }

    /// The registration the sequence runs with (`--max-loras` counts registrations: a name
    /// loaded again is another adapter).
    pub(super) fn lora_id(&self) -> Option<u64> {
        self.lora.as_deref().map(|a| a.id)
    }

    pub(super) fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Whether prompt logprob entries are still to be computed.
    pub(super) fn wants_prompt_rows(&self) -> bool {
        self.prompt_lp
            .as_ref()
            .is_some_and(|(e, _)| e.len() < self.prompt_len)
    }

    /// Whether the chunk of `n` tokens from `computed` covers missing prompt logprob entries
    /// (the logits at position `p` give entry `p + 1`).
    pub(super) fn chunk_wants_rows(&self, n: usize) -> bool {
        self.prompt_lp
            .as_ref()
            .is_some_and(|(e, _)| e.len() < self.prompt_len && self.computed + n >= e.len())
    }

    /// Record the entries that the logits of the `n` tokens from `computed` give.
    pub(super) fn add_prompt_rows(&mut self, rows: &[f32], n: usize, vocab: usize) -> Result<()> {
        let Some((entries, k)) = self.prompt_lp.as_mut() else {
            return Ok(());
        };
        if rows.len() != n * vocab {
            return Err(EngineError::Internal(format!(
                "the model returned {} logits for {n} prompt rows",
                rows.len()
            )));
        }
        for (j, row) in rows.chunks_exact(vocab).enumerate() {
            let idx = self.computed + j + 1;
            if idx >= self.prompt_len {
                break;
            }
            if idx < entries.len() {
                // Already computed before a preemption.
                continue;
            }
            entries.push(Some(crate::sampling::prompt_logprob(
                row,
                self.tokens[idx],
                *k,
            )?));
        }
        Ok(())
    }
}

//! What the handle and the engine thread exchange: the limits, the commands and submissions
//! sent in, the events sent back per sequence, and the state both sides read.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::api::{Finish, PromptLogprob, SamplingParams, StepLogprobs};
use crate::block_manager::{BlockStats, HashContext};
use crate::constraint::GuideFactory;
use crate::error::EngineError;
use crate::model::KvBudget;
use crate::share::SlotBook;

/// Limits the scheduler works within.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_active_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    /// What the model's KV cache may take; the model turns it into a block count.
    pub kv_budget: KvBudget,
    /// The block count of a cache the model already holds (a GPU model's, allocated by its
    /// bring-up in blocks of `block_size`); `None`: the engine allocates it from `kv_budget`.
    pub kv_allocated: Option<usize>,
    pub max_model_len: usize,
    pub enable_prefix_caching: bool,
    /// Threads for the model's parallel work (`None`: rayon's global pool).
    pub threads: Option<usize>,
    /// Seed of the sampler of requests without their own (`None`: a fresh one).
    pub seed: Option<u64>,
    /// The decoder's LoRA adapters (`None`: LoRA is off): `--max-loras` per step, and the
    /// factors a sequence gets as it is admitted.
    pub lora: Option<Arc<crate::lora::LoraRegistry>>,
}

/// What the engine sends back for one sequence.
#[derive(Debug)]
pub enum SeqEvent {
    /// A generated token; `finish` is set on the last one.
    Token {
        id: u32,
        logprobs: Option<StepLogprobs>,
        /// On the first token of a sequence that asked for them: the prompt's logprobs.
        prompt_logprobs: Option<Vec<Option<PromptLogprob>>>,
        /// Prompt tokens that were served from the prefix cache.
        cached_tokens: usize,
        finish: Option<Finish>,
    },
    /// The sequence ended without producing a further token.
    Finished(Finish),
    /// The sequence failed.
    Failed(EngineError),
}

/// A sequence handed to the engine.
#[derive(Debug)]
pub struct Submission {
    pub seq_id: u64,
    /// The request the sequence is a choice of (the unit of the fair share).
    pub group: u64,
    pub request_id: String,
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    pub hash_ctx: HashContext,
    pub media: Option<std::sync::Arc<crate::api::PromptMedia>>,
    /// The LoRA adapter the sequence runs with (its factors are taken when it is admitted,
    /// and held while it runs, even if the adapter is unloaded).
    pub lora: Option<Arc<crate::lora::LoraRef>>,
    /// The request's compiled token rules ([`crate::constraint::prepare`]).
    pub rules: Option<Box<crate::constraint::TokenRules>>,
    pub events: UnboundedSender<SeqEvent>,
    pub arrived: Instant,
}

/// Messages to the engine thread.
#[derive(Debug)]
pub enum Command {
    Submit(Box<Submission>),
    Cancel(u64),
    Shutdown,
}

/// A snapshot of the engine's state, refreshed every step (for tests and health).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    pub steps: u64,
    pub running: usize,
    pub waiting: usize,
    pub blocks: BlockStats,
    /// Prompt tokens looked up in the prefix cache, and of those, found.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    /// Tokens computed by the model (prefill and decode) over the engine's life.
    pub computed_tokens: u64,
}

/// State shared between the engine thread and its handle.
#[derive(Debug, Default)]
pub struct Shared {
    pub alive: AtomicBool,
    /// Sequences submitted and not yet finished, per request (the `max_num_seqs` bound).
    pub slots: SlotBook,
    pub stats: Mutex<EngineStats>,
    /// The model's grammar compiler, built by the handle on the first constrained request (an
    /// error is kept: it would fail the same way again).
    pub guides: std::sync::OnceLock<std::result::Result<Arc<GuideFactory>, String>>,
}

impl Shared {
    pub fn stats(&self) -> EngineStats {
        match self.stats.lock() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

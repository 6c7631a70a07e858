//! The engine thread: continuous batching with chunked prefill over a paged KV cache.
//!
//! One thread per decoder owns the model (with its KV cache, on the model's device) and the
//! [`BlockManager`], which decides on the host which cache blocks each sequence owns. Each
//! step it:
//! 1. takes new commands (blocking only when it has nothing to do);
//! 2. drops sequences whose client went away (their stream was dropped), and shares the
//!    `max_num_seqs` slots between requests: new sequences arrive parked and get a slot as
//!    [`crate::share`] decides, which may park (preempt) a sequence of a request above its
//!    share;
//! 3. schedules: running sequences first, in admission order (a decode token each, or the next
//!    chunk of an unfinished prefill), then waiting sequences while there is token budget
//!    (`max_num_batched_tokens`), room in the running batch (`max_num_active_seqs`) and KV
//!    blocks. A new sequence first takes the cached blocks of its longest cached prompt prefix
//!    (at least its last prompt token is always computed, to get logits; a sequence that asks
//!    for prompt logprobs takes none, as it needs every prompt position's logits, and runs its
//!    prefill in chunks of at most `PROMPT_LOGPROB_ROWS` tokens). When a running
//!    sequence needs a block and none is free, the youngest running sequence is preempted: its
//!    blocks are freed and it goes back to the front of the queue, to be recomputed later with
//!    its generated tokens as part of its prompt (its output then continues where it left off);
//! 4. runs the model and samples the sequences whose prompt is complete, through
//!    [`CausalLm::step`] (a panic there fails the batch's sequences, not the thread);
//! 5. registers newly filled blocks in the prefix cache and streams tokens out.
//!
//! Stop strings are matched on the async side (see [`crate::handle`]), which cancels the
//! sequence when one is found.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::api::{Finish, FinishReason};
use crate::block_manager::{extend_block_hashes, BlockManager};
use crate::error::{EngineError, Result};
use crate::metrics::ModelMetrics;
use crate::model::CausalLm;
use crate::sampling::SequenceSampler;

mod loras;
mod protocol;
mod sequence;
mod slots;
mod step;

use loras::LoraSet;
pub use protocol::{Command, EngineStats, SchedulerConfig, SeqEvent, Shared, Submission};
use sequence::Sequence;
pub(crate) use sequence::PROMPT_LOGPROB_ROWS;

/// Marks the engine dead when its thread ends, however it ends.
struct AliveGuard(Arc<Shared>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::SeqCst);
        if std::thread::panicking() {
            tracing::error!("engine thread panicked; the model is unhealthy");
        }
    }
}

/// The engine loop. Construct with [`Engine::new`] and run with [`Engine::run`] on its thread.
pub struct Engine {
    model: Box<dyn CausalLm>,
    blocks: BlockManager,
    cfg: SchedulerConfig,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    /// Admitted sequences that hold no slot for now ([`crate::share`]).
    parked: VecDeque<Sequence>,
    rx: Receiver<Command>,
    rng: StdRng,
    shared: Arc<Shared>,
    metrics: Arc<ModelMetrics>,
    eos: Vec<u32>,
    stats: EngineStats,
    pool: Option<rayon::ThreadPool>,
    /// This step held a sequence back because its adapter's factors could not be had yet.
    lora_busy: bool,
}

/// Why a sequence leaves the engine.
enum Exit {
    Finished,
    Cancelled,
    Failed(EngineError),
}

impl Engine {
    /// Allocates the model's KV cache within `cfg.kv_budget` and sets up the block manager
    /// over it. Returns the engine and the number of KV blocks.
    pub fn new(
        mut model: Box<dyn CausalLm>,
        cfg: SchedulerConfig,
        rx: Receiver<Command>,
        shared: Arc<Shared>,
        metrics: Arc<ModelMetrics>,
    ) -> Result<(Self, usize)> {
        if cfg.max_num_batched_tokens == 0 || cfg.max_num_seqs == 0 || cfg.max_num_active_seqs == 0
        {
            return Err(EngineError::invalid(
                "max_num_seqs, max_num_active_seqs and max_num_batched_tokens must be at least 1",
                None,
            ));
        }
        let num_blocks = match cfg.kv_allocated {
            Some(blocks) => blocks,
            None => model.allocate_kv(cfg.block_size, &cfg.kv_budget)?,
        };
        if num_blocks * cfg.block_size < cfg.max_model_len {
            return Err(EngineError::invalid(
                format!(
                    "the KV cache ({num_blocks} blocks of {} tokens on {}) cannot hold one sequence of max_model_len {}; raise the KV cache size (--kv-cache-tokens, or --gpu-memory-utilization on a GPU) or lower --max-model-len",
                    cfg.block_size,
                    model.device(),
                    cfg.max_model_len
                ),
                Some("kv_cache_tokens"),
            ));
        }
        let info = model.info().clone();
        let engine_seed = cfg.seed;
        let blocks = BlockManager::new(num_blocks, cfg.block_size, cfg.enable_prefix_caching)?;
        let pool = match cfg.threads {
            Some(n) => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .map_err(|e| {
                        EngineError::Internal(format!("cannot build the engine thread pool: {e}"))
                    })?,
            ),
            None => None,
        };
        shared.alive.store(true, Ordering::SeqCst);
        let engine = Engine {
            model,
            blocks,
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            parked: VecDeque::new(),
            rx,
            rng: match engine_seed {
                Some(seed) => StdRng::seed_from_u64(seed),
                None => StdRng::from_rng(&mut rand::rng()),
            },
            shared,
            metrics,
            eos: info.eos_token_ids,
            stats: EngineStats::default(),
            pool,
            lora_busy: false,
        };
        Ok((engine, num_blocks))
    }

    /// Run until every sender is gone or a shutdown arrives. With a thread count configured,
    /// the loop runs inside its own rayon pool so the model's parallel work uses that pool.
    pub fn run(mut self) {
        match self.pool.take() {
            Some(pool) => pool.install(move || self.run_loop()),
            None => self.run_loop(),
        }
    }

    fn run_loop(mut self) {
        let _guard = AliveGuard(self.shared.clone());
        self.publish();
        loop {
            if self.is_idle() {
                match self.rx.recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            let mut stop = false;
            loop {
                match self.rx.try_recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            stop = true;
                            break;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        // Only streams' own senders can be left; keep serving them.
                        break;
                    }
                }
            }
            if stop {
                break;
            }
            self.drop_closed();
            if !self.is_idle() {
                self.step();
            }
            self.publish();
        }
        let all: Vec<Sequence> = self
            .running
            .drain(..)
            .chain(self.waiting.drain(..))
            .chain(self.parked.drain(..))
            .collect();
        for seq in all {
            let _ = seq.events.send(SeqEvent::Failed(EngineError::Stopped));
            self.blocks.free_table(&seq.table);
            self.shared.slots.release(seq.group, 1);
        }
        self.publish();
    }

    /// Apply one command; false to stop the engine.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit(sub) => self.submit(*sub),
            Command::Cancel(id) => {
                if let Some(i) = self.running.iter().position(|s| s.id == id) {
                    let seq = self.running.remove(i);
                    self.exit(seq, Exit::Cancelled);
                } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
                    if let Some(seq) = self.waiting.remove(i) {
                        self.exit(seq, Exit::Cancelled);
                    }
                } else if let Some(i) = self.parked.iter().position(|s| s.id == id) {
                    if let Some(seq) = self.parked.remove(i) {
                        self.exit(seq, Exit::Cancelled);
                    }
                }
            }
            Command::Shutdown => return false,
        }
        true
    }

    fn submit(&mut self, sub: Submission) {
        let prompt_len = sub.prompt_ids.len();
        let room = self.cfg.max_model_len.saturating_sub(prompt_len);
        let max_tokens = sub.params.max_tokens.min(room);
        let sampler = SequenceSampler::new(&sub.params, &sub.prompt_ids)
            .with_rules(sub.rules)
            .with_budget(max_tokens);
        let prompt_lp = sub.params.prompt_logprobs.map(|k| (vec![None], k));
        let seq = Sequence {
            id: sub.seq_id,
            group: sub.group,
            request_id: sub.request_id,
            tokens: sub.prompt_ids,
            prompt_len,
            max_tokens,
            computed: 0,
            table: Vec::new(),
            hashes: Vec::new(),
            registered: 0,
            hash_ctx: sub.hash_ctx,
            media: sub.media,
            lora: sub.lora,
            weights: None,
            sampler,
            events: sub.events,
            admitted_once: false,
            cached_tokens: 0,
            arrived: sub.arrived,
            last_token_at: None,
            prompt_lp,
        };
        if max_tokens == 0 {
            let finish = Finish {
                reason: FinishReason::Length,
                stop_reason: None,
                prompt_tokens: prompt_len,
                completion_tokens: 0,
                cached_tokens: 0,
            };
            let _ = seq.events.send(SeqEvent::Finished(finish));
            self.exit(seq, Exit::Finished);
            return;
        }
        tracing::debug!(request_id = %seq.request_id, prompt_len, max_tokens, "sequence queued");
        // Every new sequence starts parked; `rebalance` gives it a slot.
        self.parked.push_back(seq);
    }

    /// Release a sequence that leaves the engine.
    fn exit(&mut self, seq: Sequence, why: Exit) {
        self.blocks.free_table(&seq.table);
        self.shared.slots.release(seq.group, 1);
        match why {
            Exit::Finished => {}
            Exit::Cancelled => {
                tracing::debug!(request_id = %seq.request_id, "sequence cancelled");
            }
            Exit::Failed(err) => {
                tracing::error!(request_id = %seq.request_id, "sequence failed: {err}");
                let _ = seq.events.send(SeqEvent::Failed(err));
            }
        }
    }

    /// Grow `seq`'s block table to cover `upto` tokens; false when blocks ran out.
    fn grow(blocks: &mut BlockManager, seq: &mut Sequence, upto: usize) -> bool {
        let need = blocks.blocks_for(upto).saturating_sub(seq.table.len());
        if need == 0 {
            return true;
        }
        match blocks.allocate_n(need) {
            Some(new) => {
                seq.table.extend(new);
                true
            }
            None => false,
        }
    }

    /// Decide this step's chunks: `(index in running, tokens)`.
    fn schedule(&mut self) -> Vec<(usize, usize)> {
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut plan: Vec<(usize, usize)> = Vec::new();
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let mut n = (seq.tokens.len() - seq.computed).min(budget);
            if seq.wants_prompt_rows() {
                n = n.min(PROMPT_LOGPROB_ROWS);
            }
            let upto = seq.computed + n;
            let mut scheduled = true;
            while !Self::grow(&mut self.blocks, &mut self.running[i], upto) {
                let victim = self.running.len() - 1;
                preempted = true;
                self.preempt(victim);
                if victim == i {
                    scheduled = false;
                    break;
                }
            }
            if !scheduled {
                break;
            }
            plan.push((i, n));
            budget -= n;
            i += 1;
        }
        if preempted {
            return plan;
        }
        let bs = self.cfg.block_size;
        // `--max-loras`: a waiting sequence whose adapter would make one too many in the
        // batch is held back (in order, ahead of the queue) while later ones may go; so is one
        // whose adapter's factors cannot be had this step (`--max-cpu-loras`, see
        // `lora::registry`).
        let max_loras = self.cfg.lora.as_ref().map(|l| l.settings().max_loras);
        let mut batch_loras = LoraSet::new(max_loras, &self.running);
        let mut held_back: Vec<Sequence> = Vec::new();
        self.lora_busy = false;
        while budget > 0 && self.running.len() < self.cfg.max_num_active_seqs {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            if !batch_loras.admits(seq.lora_id()) {
                held_back.push(seq);
                continue;
            }
            match self.take_lora_weights(&mut seq) {
                Ok(true) => {}
                Ok(false) => {
                    self.lora_busy = true;
                    held_back.push(seq);
                    continue;
                }
                Err(e) => {
                    self.exit(seq, Exit::Failed(e));
                    continue;
                }
            }
            if self.blocks.caching_enabled() {
                extend_block_hashes(&mut seq.hashes, &seq.tokens, bs, &seq.hash_ctx);
            }
            // Prompt logprobs need the logits of every prompt position: nothing is reused.
            let max_hit = if seq.wants_prompt_rows() {
                0
            } else {
                (seq.tokens.len() - 1) / bs
            };
            let hit_blocks = self
                .blocks
                .acquire_cached(&seq.hashes[..max_hit.min(seq.hashes.len())]);
            let hit = hit_blocks.len() * bs;
            let mut n = (seq.tokens.len() - hit).min(budget);
            if seq.wants_prompt_rows() {
                n = n.min(PROMPT_LOGPROB_ROWS);
            }
            seq.table = hit_blocks;
            if !Self::grow(&mut self.blocks, &mut seq, hit + n) {
                self.blocks.free_table(&seq.table);
                seq.table.clear();
                seq.weights = None;
                self.waiting.push_front(seq);
                break;
            }
            seq.computed = hit;
            seq.registered = hit / bs;
            if !seq.admitted_once {
                seq.admitted_once = true;
                seq.cached_tokens = hit;
                self.stats.prefix_cache_queries += seq.prompt_len as u64;
                self.stats.prefix_cache_hits += hit as u64;
                self.metrics.prefix_cache(seq.prompt_len, hit);
                self.metrics.prompt_tokens(seq.prompt_len);
                self.metrics.queued(seq.arrived.elapsed());
            }
            batch_loras.add(seq.lora_id());
            self.running.push(seq);
            plan.push((self.running.len() - 1, n));
            budget -= n;
        }
        for seq in held_back.into_iter().rev() {
            self.waiting.push_front(seq);
        }
        plan
    }

    fn publish(&mut self) {
        self.stats.running = self.running.len();
        self.stats.waiting = self.waiting.len() + self.parked.len();
        self.stats.blocks = self.blocks.stats();
        self.metrics.queue(
            self.running.len(),
            self.waiting.len() + self.parked.len(),
            self.blocks.usage(),
        );
        if let Some(lora) = &self.cfg.lora {
            self.metrics.lora_requests(
                lora.settings().max_loras,
                loras::joined_names(self.running.iter()),
                loras::joined_names(self.waiting.iter().chain(&self.parked)),
            );
        }
        match self.shared.stats.lock() {
            Ok(mut s) => *s = self.stats.clone(),
            Err(p) => *p.into_inner() = self.stats.clone(),
        }
    }
}

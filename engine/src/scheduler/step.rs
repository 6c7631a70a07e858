//! One step of the engine thread: the planned chunks through the model (a panic there fails
//! the batch's sequences, not the thread), then each sequence's computed tokens, prefix-cache
//! blocks, sampled token and finish check, and the sequences that leave.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use super::sequence::Sequence;
use super::{Engine, Exit, SeqEvent};
use crate::api::{Finish, FinishReason, StopReason};
use crate::block_manager::extend_block_hashes;
use crate::error::{EngineError, Result};
use crate::model::{SampleRequest, SeqChunk};

impl Engine {
    pub(super) fn step(&mut self) {
        if crate::fault::scheduler_panic() {
            panic!("injected scheduler fault (ENGINE_FAULT_INJECT)");
        }
        self.rebalance();
        let plan = self.schedule();
        if plan.is_empty() {
            if self.lora_busy {
                // An adapter's files are being read for a runtime load: the next step
                // admits the sequence.
                std::thread::sleep(std::time::Duration::from_millis(1));
                return;
            }
            if !self.waiting.is_empty() && self.running.is_empty() {
                // Cannot happen with a cache that holds one max_model_len sequence; fail the
                // head rather than spin.
                if let Some(seq) = self.waiting.pop_front() {
                    self.exit(
                        seq,
                        Exit::Failed(EngineError::Internal(
                            "no KV blocks for the sequence".into(),
                        )),
                    );
                }
            }
            return;
        }
        debug_assert!(plan.windows(2).all(|w| w[0].0 < w[1].0));
        // Which plan entries sample this step, and what they got.
        let mut sampled: Vec<Option<Result<crate::sampling::Sampled>>> =
            (0..plan.len()).map(|_| None).collect();
        let result = {
            // Per chunk, the media rows and positions it covers (buffers outlive the step).
            let mut bufs: Vec<(Vec<u32>, Vec<[u32; 3]>)> = vec![Default::default(); plan.len()];
            let mut chunks: Vec<SeqChunk<'_>> = Vec::with_capacity(plan.len());
            let mut requests: Vec<SampleRequest<'_>> = Vec::new();
            let mut samplers: Vec<usize> = Vec::new();
            let mut all_rows: Vec<bool> = Vec::with_capacity(plan.len());
            let mut next = plan.iter().zip(bufs.iter_mut()).enumerate().peekable();
            for (idx, seq) in self.running.iter_mut().enumerate() {
                let Some((pi, (&(i, n), (rows, pos)))) = next.next_if(|(_, (p, _))| p.0 == idx)
                else {
                    continue;
                };
                debug_assert_eq!(i, idx);
                all_rows.push(seq.chunk_wants_rows(n));
                let Sequence {
                    tokens,
                    computed,
                    table,
                    media,
                    prompt_len,
                    sampler,
                    weights,
                    ..
                } = seq;
                let want = *computed + n == tokens.len();
                chunks.push(SeqChunk {
                    tokens: &tokens[*computed..*computed + n],
                    start_pos: *computed,
                    block_table: table,
                    want_logits: want,
                    media: media
                        .as_deref()
                        .map(|m| m.chunk(*computed, n, *prompt_len, rows, pos)),
                    lora: weights.as_deref(),
                });
                if want {
                    requests.push(SampleRequest { chunk: pi, sampler });
                    samplers.push(pi);
                }
            }
            let model = &mut self.model;
            let eos = &self.eos;
            let rng = &mut self.rng;
            catch_unwind(AssertUnwindSafe(|| {
                if all_rows.contains(&true) {
                    model
                        .step_with_rows(&chunks, &all_rows, &mut requests, eos, rng)
                        .map(|(out, rows)| (out, samplers, rows))
                } else {
                    model
                        .step(&chunks, &mut requests, eos, rng)
                        .map(|out| (out, samplers, Vec::new()))
                }
            }))
        };
        self.stats.steps += 1;
        let mut prompt_rows: Vec<Option<Vec<f32>>>;
        match result {
            Ok(Ok((out, samplers, rows))) if out.len() == samplers.len() => {
                for (pi, r) in samplers.into_iter().zip(out) {
                    sampled[pi] = Some(r);
                }
                prompt_rows = rows;
            }
            Ok(Ok((out, samplers, _))) => {
                let msg = format!(
                    "model returned {} samples for {} sequences",
                    out.len(),
                    samplers.len()
                );
                self.fail_plan(&plan, &msg);
                return;
            }
            Ok(Err(e)) => {
                self.fail_plan(&plan, &format!("model forward failed: {e}"));
                return;
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                self.fail_plan(&plan, &format!("model forward panicked: {what}"));
                return;
            }
        }
        let now = Instant::now();
        let mut finished: Vec<usize> = Vec::new();
        let mut failed: Vec<(usize, EngineError)> = Vec::new();
        let bs = self.cfg.block_size;
        let vocab = self.model.info().vocab_size;
        for (pi, &(i, n)) in plan.iter().enumerate() {
            self.stats.computed_tokens += n as u64;
            let seq = &mut self.running[i];
            if let Some(rows) = prompt_rows.get_mut(pi).and_then(Option::take) {
                if let Err(e) = seq.add_prompt_rows(&rows, n, vocab) {
                    failed.push((i, e));
                    continue;
                }
            }
            seq.computed += n;
            if self.blocks.caching_enabled() {
                let full = seq.computed / bs;
                if full > seq.registered {
                    extend_block_hashes(
                        &mut seq.hashes,
                        &seq.tokens[..full * bs],
                        bs,
                        &seq.hash_ctx,
                    );
                    for b in seq.registered..full {
                        self.blocks.register(seq.table[b], seq.hashes[b]);
                    }
                    seq.registered = full;
                }
            }
            if seq.computed < seq.tokens.len() {
                continue;
            }
            let sampled = match sampled[pi].take() {
                Some(Ok(s)) => s,
                Some(Err(e)) => {
                    failed.push((i, e));
                    continue;
                }
                None => {
                    failed.push((i, EngineError::Internal("the step sampled no token".into())));
                    continue;
                }
            };
            let token = sampled.token;
            if let Err(e) = seq.sampler.record(token, &self.eos) {
                failed.push((i, e));
                continue;
            }
            seq.tokens.push(token);
            match seq.last_token_at {
                None => self.metrics.first_token(now.duration_since(seq.arrived)),
                Some(prev) => self.metrics.inter_token(now.duration_since(prev)),
            }
            seq.last_token_at = Some(now);
            self.metrics.generation_tokens(1);
            let finish = Self::check_finish(seq, &self.eos, self.cfg.max_model_len, token);
            let done = finish.is_some();
            if done && seq.sampler.was_closed_by_budget() {
                self.metrics.forced_closing();
            }
            let _ = seq.events.send(SeqEvent::Token {
                id: token,
                logprobs: sampled.logprobs,
                prompt_logprobs: seq.prompt_lp.take().map(|(entries, _)| entries),
                cached_tokens: seq.cached_tokens,
                finish,
            });
            if done {
                finished.push(i);
            }
        }
        let mut leaving: Vec<(usize, Exit)> =
            finished.into_iter().map(|i| (i, Exit::Finished)).collect();
        leaving.extend(failed.into_iter().map(|(i, e)| (i, Exit::Failed(e))));
        leaving.sort_by_key(|l| std::cmp::Reverse(l.0));
        for (i, why) in leaving {
            let seq = self.running.remove(i);
            self.exit(seq, why);
        }
    }

    /// vLLM's stop check order: length, then (past min_tokens) EOS, then stop token ids; a
    /// complete structured output stops after length.
    fn check_finish(
        seq: &Sequence,
        eos: &[u32],
        max_model_len: usize,
        token: u32,
    ) -> Option<Finish> {
        let generated = seq.generated();
        let params = seq.sampler.params();
        let (reason, stop_reason) =
            if seq.tokens.len() >= max_model_len || generated >= seq.max_tokens {
                (FinishReason::Length, None)
            } else if seq.sampler.is_complete() {
                // The grammar takes nothing more (its mask would allow only EOS), whatever
                // min_tokens or ignore_eos say. Ending here saves the EOS step; as for an EOS
                // stop, the stop reason is null (an EOS token itself stays out of the text).
                // A reply the budget closed early is still one that ran out of tokens.
                if seq.sampler.was_closed_by_budget() {
                    (FinishReason::Length, None)
                } else {
                    let eos_token = eos.contains(&token).then_some(StopReason::Eos);
                    (FinishReason::Stop, eos_token)
                }
            } else if generated < params.min_tokens {
                return None;
            } else if !params.ignore_eos && eos.contains(&token) {
                (FinishReason::Stop, Some(StopReason::Eos))
            } else if params.stop_token_ids.contains(&token) {
                (FinishReason::Stop, Some(StopReason::TokenId(token)))
            } else {
                return None;
            };
        Some(Finish {
            reason,
            stop_reason,
            prompt_tokens: seq.prompt_len,
            completion_tokens: generated,
            cached_tokens: seq.cached_tokens,
        })
    }

    fn fail_plan(&mut self, plan: &[(usize, usize)], msg: &str) {
        tracing::error!("{msg}");
        let mut idx: Vec<usize> = plan.iter().map(|p| p.0).collect();
        idx.sort_unstable_by(|a, b| b.cmp(a));
        for i in idx {
            let seq = self.running.remove(i);
            self.exit(seq, Exit::Failed(EngineError::Internal(msg.to_string())));
        }
    }
}

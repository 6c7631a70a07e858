//! The output side of one generation: the engine's token events turned into text deltas
//! (incremental detokenisation and stop strings run here, on the async side), cancelling the
//! sequence when dropped.

use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::{Delta, Finish, FinishReason, StopReason};
use crate::detok::{IncrementalDetokenizer, StopMatcher};
use crate::error::{EngineError, Result};
use crate::metrics::ModelMetrics;
use crate::scheduler::{Command, SeqEvent};

/// Output of one sequence. Dropping it cancels the sequence and frees its KV blocks.
pub struct GenerationStream {
    pub(super) events: UnboundedReceiver<SeqEvent>,
    pub(super) cancel: Option<(Sender<Command>, u64)>,
    pub(super) detok: IncrementalDetokenizer,
    pub(super) stops: StopMatcher,
    pub(super) include_stop_str_in_output: bool,
    pub(super) min_tokens: usize,
    pub(super) prompt_tokens: usize,
    pub(super) completion_tokens: usize,
    pub(super) cached_tokens: usize,
    pub(super) done: bool,
    pub(super) metrics: Arc<ModelMetrics>,
    pub(super) started: Instant,
}

impl GenerationStream {
    /// The next increment; `None` after the delta that carries `finish`.
    pub async fn next(&mut self) -> Option<Result<Delta>> {
        if self.done {
            return None;
        }
        let Some(first) = self.events.recv().await else {
            self.done = true;
            self.cancel = None;
            return Some(Err(EngineError::Internal(
                "the engine stopped before the sequence finished".into(),
            )));
        };
        let mut delta = Delta::default();
        if let Err(e) = self.apply(first, &mut delta) {
            self.abort();
            return Some(Err(e));
        }
        while delta.finish.is_none() {
            match self.events.try_recv() {
                Ok(ev) => {
                    if let Err(e) = self.apply(ev, &mut delta) {
                        self.abort();
                        return Some(Err(e));
                    }
                }
                Err(_) => break,
            }
        }
        Some(Ok(delta))
    }

    /// End the stream after an error: no more deltas, and the engine drops the sequence.
    fn abort(&mut self) {
        self.done = true;
        if let Some((tx, id)) = self.cancel.take() {
            let _ = tx.send(Command::Cancel(id));
        }
    }

    fn apply(&mut self, ev: SeqEvent, delta: &mut Delta) -> Result<()> {
        match ev {
            SeqEvent::Failed(e) => {
                self.done = true;
                self.cancel = None;
                Err(e)
            }
            SeqEvent::Finished(finish) => {
                self.finish(finish, delta);
                Ok(())
            }
            SeqEvent::Token {
                id,
                logprobs,
                prompt_logprobs,
                cached_tokens,
                finish,
            } => {
                if prompt_logprobs.is_some() {
                    delta.prompt_logprobs = prompt_logprobs;
                }
                self.completion_tokens += 1;
                self.cached_tokens = cached_tokens;
                delta.token_ids.push(id);
                if let Some(lp) = logprobs {
                    delta.logprobs.push(lp);
                }
                let stop_token = finish.as_ref().is_some_and(|f| {
                    matches!(
                        f.stop_reason,
                        Some(StopReason::Eos) | Some(StopReason::TokenId(_))
                    )
                });
                let piece = if stop_token && !self.include_stop_str_in_output {
                    String::new()
                } else {
                    self.detok.push(id)?
                };
                let allow = self.completion_tokens > self.min_tokens;
                let check = self.stops.push(&piece, allow);
                delta.text.push_str(&check.text);
                if let Some(stop) = check.stopped {
                    let finish = Finish {
                        reason: FinishReason::Stop,
                        stop_reason: Some(StopReason::String(stop)),
                        prompt_tokens: self.prompt_tokens,
                        completion_tokens: self.completion_tokens,
                        cached_tokens: self.cached_tokens,
                    };
                    // The engine may still be generating: cancel it now.
                    if let Some((tx, id)) = self.cancel.take() {
                        let _ = tx.send(Command::Cancel(id));
                    }
                    self.record(FinishReason::Stop);
                    self.done = true;
                    delta.finish = Some(finish);
                    return Ok(());
                }
                if let Some(f) = finish {
                    let tail = self.detok.flush()?;
                    let check = self.stops.push(&tail, allow);
                    delta.text.push_str(&check.text);
                    // The flushed tail (an incomplete character) may still complete a stop string.
                    let f = match check.stopped {
                        Some(stop) => Finish {
                            reason: FinishReason::Stop,
                            stop_reason: Some(StopReason::String(stop)),
                            ..f
                        },
                        None => f,
                    };
                    self.finish(f, delta);
                }
                Ok(())
            }
        }
    }

    fn finish(&mut self, finish: Finish, delta: &mut Delta) {
        delta.text.push_str(&self.stops.flush());
        self.record(finish.reason);
        self.done = true;
        self.cancel = None;
        delta.finish = Some(finish);
    }

    fn record(&self, reason: FinishReason) {
        self.metrics
            .request_finished(reason, self.started.elapsed());
    }
}

impl Drop for GenerationStream {
    fn drop(&mut self) {
        if let Some((tx, id)) = self.cancel.take() {
            let _ = tx.send(Command::Cancel(id));
            if !self.done {
                self.record(FinishReason::Abort);
            }
        }
    }
}

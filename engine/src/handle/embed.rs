//! The embedding worker: one thread per embedding model that batches queued requests up to a
//! token budget and runs them together.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::error::{EngineError, Result};
use crate::metrics::ModelMetrics;
use crate::model::{EmbeddingModel, EncoderInput};

/// One tokenised input: ids and, for a pair, each token's segment.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct EncodedInput {
    pub(super) ids: Vec<u32>,
    pub(super) type_ids: Option<Vec<u32>>,
}

impl EncodedInput {
    fn view(&self) -> EncoderInput<'_> {
        EncoderInput {
            ids: &self.ids,
            type_ids: self.type_ids.as_deref(),
        }
    }
}

/// A request's inputs; the reply holds the head's raw output for each, in order.
pub(super) struct EmbedJob {
    pub(super) inputs: Vec<EncodedInput>,
    pub(super) reply: oneshot::Sender<Result<Vec<Vec<f32>>>>,
}

pub(super) struct AliveFlag(pub(super) Arc<AtomicBool>);

impl Drop for AliveFlag {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// A job being worked through: its inputs are embedded a batch at a time.
struct Active {
    job: EmbedJob,
    next: usize,
    done: Vec<Vec<f32>>,
}

/// Embed queued jobs a batch of at most `batch_tokens` tokens at a time. A batch takes inputs
/// from every job in turn, so a small request is not stuck behind a huge one, and the decoder
/// sharing the CPU waits at most one batch; a job whose client has gone is dropped at the next
/// batch instead of being worked through to its end. The jobs in hand are the model's
/// `vllm:num_requests_running` (none wait: every queued job joins the round-robin at once).
pub(super) fn embed_worker(
    model: Box<dyn EmbeddingModel>,
    rx: Receiver<EmbedJob>,
    batch_tokens: usize,
    metrics: Arc<ModelMetrics>,
) {
    let mut active: Vec<Active> = Vec::new();
    loop {
        metrics.queue(active.len(), 0, 0.0);
        // Wait for work only when there is none in hand.
        if active.is_empty() {
            match rx.recv() {
                Ok(job) => active.push(Active::new(job)),
                Err(_) => return,
            }
        }
        while let Ok(job) = rx.try_recv() {
            active.push(Active::new(job));
        }
        active.retain(|a| !a.job.reply.is_closed());
        if active.is_empty() {
            continue;
        }
        metrics.queue(active.len(), 0, 0.0);
        // Round-robin over the jobs, one input each per turn, up to the token budget (a batch
        // always has at least one input).
        let mut picks: Vec<(usize, usize)> = Vec::new();
        let mut tokens = 0usize;
        'fill: loop {
            let mut took = false;
            for (k, a) in active.iter_mut().enumerate() {
                let Some(input) = a.job.inputs.get(a.next) else {
                    continue;
                };
                if !picks.is_empty() && tokens + input.ids.len() > batch_tokens {
                    break 'fill;
                }
                tokens += input.ids.len();
                picks.push((k, a.next));
                a.next += 1;
                took = true;
            }
            if !took {
                break;
            }
        }
        let batch: Vec<EncoderInput<'_>> = picks
            .iter()
            .map(|&(k, i)| active[k].job.inputs[i].view())
            .collect();
        let result = catch_unwind(AssertUnwindSafe(|| model.forward(&batch)));
        let batch_len = batch.len();
        drop(batch);
        let owners: Vec<usize> = picks.iter().map(|&(k, _)| k).collect();
        match result {
            Ok(Ok(vectors)) if vectors.len() == batch_len => {
                for (vector, k) in vectors.into_iter().zip(owners) {
                    active[k].done.push(vector);
                }
            }
            other => {
                let msg = match other {
                    Ok(Ok(v)) => format!(
                        "embedding model returned {} vectors for {} inputs",
                        v.len(),
                        batch_len
                    ),
                    Ok(Err(e)) => format!("embedding failed: {e}"),
                    Err(_) => "embedding model panicked".to_string(),
                };
                tracing::error!("{msg}");
                // Every job with an input in the failed batch fails.
                let mut failed = vec![false; active.len()];
                owners.iter().for_each(|&k| failed[k] = true);
                let mut k = 0;
                active.retain_mut(|a| {
                    let keep = !failed[k];
                    k += 1;
                    if !keep {
                        let reply = std::mem::replace(&mut a.job.reply, oneshot::channel().0);
                        let _ = reply.send(Err(EngineError::Internal(msg.clone())));
                    }
                    keep
                });
                continue;
            }
        }
        // Jobs with every input embedded are answered.
        let mut still = Vec::with_capacity(active.len());
        for a in active.drain(..) {
            if a.done.len() == a.job.inputs.len() {
                let _ = a.job.reply.send(Ok(a.done));
            } else {
                still.push(a);
            }
        }
        active = still;
    }
}

impl Active {
    fn new(job: EmbedJob) -> Self {
        let done = Vec::with_capacity(job.inputs.len());
        Active { job, next: 0, done }
    }
}

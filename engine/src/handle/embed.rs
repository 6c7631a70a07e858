//! The embedding worker: one thread per embedding model that batches queued requests up to a
//! token budget and runs them together.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::error::{EngineError, Result};
use crate::model::EmbeddingModel;

pub(super) struct EmbedJob {
    pub(super) inputs: Vec<Vec<u32>>,
    pub(super) reply: oneshot::Sender<Result<Vec<Vec<f32>>>>,
}

pub(super) struct AliveFlag(pub(super) Arc<AtomicBool>);

impl Drop for AliveFlag {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Batch queued embedding jobs up to `batch_tokens` tokens and run them together.
pub(super) fn embed_worker(
    model: Box<dyn EmbeddingModel>,
    rx: Receiver<EmbedJob>,
    batch_tokens: usize,
) {
    let mut pending: Option<EmbedJob> = None;
    loop {
        let first = match pending.take() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            },
        };
        let mut tokens: usize = first.inputs.iter().map(Vec::len).sum();
        let mut jobs = vec![first];
        while tokens < batch_tokens {
            match rx.try_recv() {
                Ok(j) => {
                    let t: usize = j.inputs.iter().map(Vec::len).sum();
                    if tokens + t > batch_tokens {
                        pending = Some(j);
                        break;
                    }
                    tokens += t;
                    jobs.push(j);
                }
                Err(_) => break,
            }
        }
        jobs.retain(|j| !j.reply.is_closed());
        if jobs.is_empty() {
            continue;
        }
        let batch: Vec<Vec<u32>> = jobs.iter().flat_map(|j| j.inputs.iter().cloned()).collect();
        let result = catch_unwind(AssertUnwindSafe(|| model.embed(&batch)));
        match result {
            Ok(Ok(vectors)) if vectors.len() == batch.len() => {
                let mut it = vectors.into_iter();
                for job in jobs {
                    let mine: Vec<Vec<f32>> = it.by_ref().take(job.inputs.len()).collect();
                    let _ = job.reply.send(Ok(mine));
                }
            }
            other => {
                let msg = match other {
                    Ok(Ok(v)) => format!(
                        "embedding model returned {} vectors for {} inputs",
                        v.len(),
                        batch.len()
                    ),
                    Ok(Err(e)) => format!("embedding failed: {e}"),
                    Err(_) => "embedding model panicked".to_string(),
                };
                tracing::error!("{msg}");
                for job in jobs {
                    let _ = job.reply.send(Err(EngineError::Internal(msg.clone())));
                }
            }
        }
    }
}

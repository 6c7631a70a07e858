//! The media worker: one thread per model with encoders, owned by the engine. It expands a
//! prompt's placeholders and runs the vision or audio tower, so encoders never run on the
//! async runtime's threads and a flood of media waits in a bounded queue (past it: 503).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use media::ProcessedMedia;
use tokio::sync::oneshot;

use crate::api::PromptMedia;
use crate::error::{EngineError, Result};
use crate::models::media::MediaEncoders;

type Prepared = (Vec<u32>, Arc<PromptMedia>);

struct MediaJob {
    ids: Vec<u32>,
    items: Vec<Arc<ProcessedMedia>>,
    reply: oneshot::Sender<Result<Prepared>>,
}

pub(super) struct MediaWorker {
    jobs: SyncSender<MediaJob>,
    modalities: Vec<media::Modality>,
    spec: Arc<media::spec::ModelMediaSpec>,
}

impl MediaWorker {
    /// Starts the worker thread for `model`'s encoders with room for `queue` waiting requests.
    pub(super) fn start(model: &str, encoders: MediaEncoders, queue: usize) -> Result<Self> {
        let modalities = encoders.modalities();
        let spec = encoders.spec().clone();
        let (jobs, rx) = mpsc::sync_channel(queue.max(1));
        std::thread::Builder::new()
            .name(format!("media-{model}"))
            .spawn(move || run(&encoders, &rx))
            .map_err(|e| EngineError::Internal(format!("cannot start the media worker: {e}")))?;
        Ok(MediaWorker {
            jobs,
            modalities,
            spec,
        })
    }

    pub(super) fn modalities(&self) -> Vec<media::Modality> {
        self.modalities.clone()
    }

    pub(super) fn spec(&self) -> &media::spec::ModelMediaSpec {
        &self.spec
    }

    /// Expands `ids`' placeholders for `items` and encodes them on the worker.
    pub(super) async fn prepare(
        &self,
        ids: Vec<u32>,
        items: Vec<Arc<ProcessedMedia>>,
    ) -> Result<Prepared> {
        let (reply, answer) = oneshot::channel();
        match self.jobs.try_send(MediaJob { ids, items, reply }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(EngineError::Overloaded(
                    "the media encoders' queue is full".into(),
                ))
            }
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::Stopped),
        }
        answer.await.map_err(|_| EngineError::Stopped)?
    }
}

fn run(encoders: &MediaEncoders, rx: &Receiver<MediaJob>) {
    while let Ok(job) = rx.recv() {
        // The client left while the job waited: its encoding would be thrown away.
        if job.reply.is_closed() {
            continue;
        }
        let result = catch_unwind(AssertUnwindSafe(|| encoders.prepare(&job.ids, &job.items)))
            .unwrap_or_else(|_| {
                tracing::error!("a media encoder panicked");
                Err(EngineError::Internal("a media encoder panicked".into()))
            })
            .map(|(ids, media)| (ids, Arc::new(media)));
        let _ = job.reply.send(result);
    }
}

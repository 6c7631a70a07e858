//! One file's download as hf-hub reports it: a bar on a terminal, a log line otherwise, and the
//! bytes counted, which serve both as the stall watchdog's heartbeat and as the check that the
//! file came whole.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget};

/// Shared by the clones hf-hub hands to each chunk of one file.
#[derive(Clone)]
pub struct FileProgress {
    inner: Arc<Inner>,
}

struct Inner {
    file: String,
    started: Instant,
    /// Milliseconds after `started` of the last sign of life.
    last_ms: AtomicU64,
    size: AtomicU64,
    received: AtomicU64,
    bar: Option<ProgressBar>,
}

impl FileProgress {
    /// `bar`: draw a bar (stderr is a terminal).
    pub fn new(file: &str, bar: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                file: file.to_string(),
                started: Instant::now(),
                last_ms: AtomicU64::new(0),
                size: AtomicU64::new(0),
                received: AtomicU64::new(0),
                // Hidden until hf-hub's style is set, so no bar in the default style flashes.
                bar: bar.then(|| ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())),
            }),
        }
    }

    fn alive(&self) {
        let ms = self.inner.started.elapsed().as_millis() as u64;
        self.inner.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once nothing has moved for `limit`: the download's read timeout.
    pub async fn stalled(&self, limit: Duration) {
        let tick = (limit / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            tokio::time::sleep(tick).await;
            let last = Duration::from_millis(self.inner.last_ms.load(Ordering::Relaxed));
            if self.inner.started.elapsed().saturating_sub(last) >= limit {
                return;
            }
        }
    }

    /// The file's size as the hub announced it, and the bytes that arrived.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.inner.size.load(Ordering::Relaxed),
            self.inner.received.load(Ordering::Relaxed),
        )
    }

    /// Stops drawing (a failed download leaves no half bar behind).
    pub fn abandon(&self) {
        if let Some(bar) = &self.inner.bar {
            bar.abandon();
            end_line();
        }
    }

    /// The line logged when the file is in the cache, where no bar showed it.
    pub fn done(&self) {
        if self.inner.bar.is_some() {
            return;
        }
        let (size, _) = self.counts();
        tracing::info!(
            file = %self.inner.file,
            bytes = size,
            seconds = format!("{:.2}", self.inner.started.elapsed().as_secs_f64()),
            "downloaded"
        );
    }
}

impl hf_hub::api::tokio::Progress for FileProgress {
    async fn init(&mut self, size: usize, filename: &str) {
        self.alive();
        self.inner.size.store(size as u64, Ordering::Relaxed);
        match &self.inner.bar {
            Some(bar) => {
                let mut bar = bar.clone();
                <ProgressBar as hf_hub::api::Progress>::init(&mut bar, size, filename);
                bar.set_draw_target(ProgressDrawTarget::stderr());
            }
            None => tracing::info!(file = filename, bytes = size, "downloading"),
        }
    }

    async fn update(&mut self, size: usize) {
        self.alive();
        self.inner
            .received
            .fetch_add(size as u64, Ordering::Relaxed);
        if let Some(bar) = &self.inner.bar {
            bar.inc(size as u64);
        }
    }

    async fn finish(&mut self) {
        self.alive();
        if let Some(bar) = &self.inner.bar {
            bar.finish();
            end_line();
        }
    }
}

/// A finished bar keeps its line: what comes next (the next file's bar, a log line) starts
/// below it rather than on it.
fn end_line() {
    use std::io::Write;
    let _ = writeln!(std::io::stderr());
}

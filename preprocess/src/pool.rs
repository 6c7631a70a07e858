//! The bounded blocking pool all media decoding runs on.
//!
//! At most `threads` jobs run at once (each on tokio's blocking threads, never
//! on the reactor), and at most `queue` more wait for a slot. A job submitted
//! when both are full is refused at once with [`PreprocessError::Overloaded`]
//! (a 503), so a flood of media requests cannot queue without bound or hold
//! unbounded decoded memory.
//!
//! A job whose caller goes away (client disconnect) still runs to the end
//! (decoding cannot be interrupted), holding its slot: the decoders' own time
//! budgets bound how long.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::error::PreprocessError;

/// The pool's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Jobs running at once.
    pub threads: usize,
    /// Jobs waiting for a slot, at most.
    pub queue: usize,
}

impl Default for PoolConfig {
    /// Two decoders at a time, 64 waiting.
    fn default() -> Self {
        PoolConfig {
            threads: 2,
            queue: 64,
        }
    }
}

#[derive(Debug)]
struct Inner {
    running: Semaphore,
    admitted: AtomicUsize,
    capacity: usize,
}

/// A cheap-to-clone handle to the pool.
#[derive(Debug, Clone)]
pub struct DecodePool {
    inner: Arc<Inner>,
}

/// Releases an admission slot when dropped (also when the caller's future is
/// dropped while waiting).
struct Admission(Arc<Inner>);

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

impl DecodePool {
    pub fn new(config: PoolConfig) -> DecodePool {
        let threads = config.threads.max(1);
        DecodePool {
            inner: Arc::new(Inner {
                running: Semaphore::new(threads),
                admitted: AtomicUsize::new(0),
                capacity: threads.saturating_add(config.queue),
            }),
        }
    }

    /// Jobs admitted (running or waiting) right now.
    pub fn admitted(&self) -> usize {
        self.inner.admitted.load(Ordering::Acquire)
    }

    /// Runs `job` on a blocking thread once a slot is free; refuses at once
    /// when the queue is full. A panicking job is reported as an error, not
    /// propagated.
    pub async fn run<T, F>(&self, job: F) -> Result<T, PreprocessError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let admitted = self.inner.admitted.fetch_add(1, Ordering::AcqRel);
        let admission = Admission(self.inner.clone());
        if admitted >= self.inner.capacity {
            return Err(PreprocessError::Overloaded);
        }
        let permit = self
            .inner
            .running
            .acquire()
            .await
            .map_err(|_| PreprocessError::Overloaded)?;
        let handle = tokio::task::spawn_blocking(move || {
            let out = job();
            drop(admission);
            out
        });
        // The slot is held until the job ends, even if this future is dropped.
        let result = handle.await;
        drop(permit);
        result.map_err(|e| {
            tracing::error!(error = %e, "a media decoding job failed");
            PreprocessError::DecoderFailed
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_jobs_and_refuses_when_full() {
        let pool = DecodePool::new(PoolConfig {
            threads: 1,
            queue: 1,
        });
        assert_eq!(pool.run(|| 2 + 2).await.unwrap(), 4);

        // Block the one thread, fill the one queue slot, then a third job is refused.
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let p1 = pool.clone();
        let first = tokio::spawn(async move {
            p1.run(move || {
                let _ = release_rx.recv_timeout(Duration::from_secs(10));
                1
            })
            .await
        });
        while pool.admitted() < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let p2 = pool.clone();
        let second = tokio::spawn(async move { p2.run(|| 2).await });
        while pool.admitted() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let third = pool.run(|| 3).await;
        assert!(
            matches!(third, Err(PreprocessError::Overloaded)),
            "{third:?}"
        );
        assert_eq!(
            third.unwrap_err().kind(),
            crate::error::ErrorKind::Overloaded
        );
        release_tx.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        assert_eq!(second.await.unwrap().unwrap(), 2);
        // Slots are given back.
        assert_eq!(pool.admitted(), 0);
        assert_eq!(pool.run(|| 5).await.unwrap(), 5);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_job_is_an_error() {
        let pool = DecodePool::new(PoolConfig::default());
        let r: Result<(), _> = pool.run(|| panic!("decoder bug")).await;
        assert!(matches!(r, Err(PreprocessError::DecoderFailed)), "{r:?}");
        assert_eq!(pool.admitted(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_caller_frees_its_queue_slot() {
        let pool = DecodePool::new(PoolConfig {
            threads: 1,
            queue: 0,
        });
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let p1 = pool.clone();
        let running = tokio::spawn(async move {
            p1.run(move || {
                let _ = release_rx.recv_timeout(Duration::from_secs(10));
            })
            .await
        });
        while pool.admitted() < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Full: refused.
        assert!(pool.run(|| ()).await.is_err());
        release_tx.send(()).unwrap();
        running.await.unwrap().unwrap();
        assert_eq!(pool.admitted(), 0);
    }
}

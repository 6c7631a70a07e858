//! What the engine logs while a closure runs on this thread, as text: for tests that check a
//! log line an operator relies on.

use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Run `f` with a subscriber that records every event at INFO and above, and return its
/// result with the recorded lines.
pub(crate) fn capture<T>(f: impl FnOnce() -> T) -> (T, String) {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, || {
        // A callsite another test's thread registered while this subscriber did not exist yet
        // may have cached "nobody listens": ask every callsite again now that it does.
        tracing::callsite::rebuild_interest_cache();
        f()
    });
    let text =
        String::from_utf8_lossy(&buffer.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    (out, text)
}

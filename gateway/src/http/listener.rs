//! The accept loop: connections under a cap, each served by hyper (HTTP/1.1 and HTTP/2) with a
//! header-read timeout that also bounds how long a keep-alive connection may sit idle, and a
//! graceful stop when shutdown begins.
//!
//! Without these a server is taken down by clients that never finish a request (slowloris),
//! by idle keep-alive connections that pile up, and by enough connections to exhaust the file
//! limit, at which point it cannot even accept its own health checks.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

use crate::app::Dispatch;
use crate::http::front::Front;
use crate::http::tls::Tls;

/// How connections are held to account.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Time to receive a request's headers, counted from when the connection is ready for
    /// the next request: a client sending them a byte at a time, or a keep-alive connection
    /// left idle, is closed after it.
    pub header_read_timeout: Duration,
    /// Open connections at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

/// File descriptors kept back from the connection cap for everything else the process opens
/// (model files, media fetches, the engine's threads, logs).
const RESERVED_FDS: u64 = 256;

/// Raise the soft limit on open files to the hard one, and return the connection cap that
/// keeps safely under it. Logs both.
pub fn raise_file_limit() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls on a local struct.
    let (before, after) = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            tracing::warn!("cannot read the open-file limit; assuming 1024");
            return (1024 - RESERVED_FDS) as usize;
        }
        let before = lim.rlim_cur;
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
        (before, lim.rlim_cur)
    };
    // An unlimited (or huge) limit still gets a finite cap.
    let usable = after.min(1 << 20).saturating_sub(RESERVED_FDS).max(64);
    let cap = (usable as f64 * 0.9) as usize;
    tracing::info!(
        soft_limit_before = before,
        soft_limit = after,
        max_connections = cap,
        "open-file limit"
    );
    cap
}

/// Serve `app` on `listener` (over TLS when `tls` is given) until `shutdown` completes; then stop accepting, ask every
/// connection to finish its requests and close, and return once they have.
pub async fn serve(
    listener: TcpListener,
    app: Front<Dispatch>,
    limits: ConnLimits,
    tls: Option<Arc<Tls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    // Each connection task holds a clone; the loop waits for all of them to drop it.
    let (done_tx, done_rx) = watch::channel(());
    let mut refused: u64 = 0;
    // When a warning was last logged: at most one every 5 s, whatever the flood.
    let mut last_report: Option<Instant> = None;
    let due = |last: Option<Instant>| last.is_none_or(|t| t.elapsed() > Duration::from_secs(5));
    let mut stopping = stop_rx.clone();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopping.wait_for(|s| *s) => break,
        };
        let (stream, _peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors or a transient error: back off instead of spinning.
                if due(last_report) {
                    tracing::warn!("accept error: {e}");
                    last_report = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            metrics::counter!("gateway_connections_refused_total").increment(1);
            refused += 1;
            if due(last_report) {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    refused_so_far = refused,
                    "connection limit reached: closing new connections"
                );
                last_report = Some(Instant::now());
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let to_body: fn(hyper::Request<Incoming>) -> hyper::Request<Body> =
            |req| req.map(Body::new);
        let hyper_service = TowerToHyperService::new(app.clone().map_request(to_body));
        let mut stop = stop_rx.clone();
        let done = done_rx.clone();
        let timeout = limits.header_read_timeout;
        let acceptor = tls.as_ref().map(|tls| tls.acceptor());
        tokio::spawn(async move {
            match acceptor {
                None => serve_connection(TokioIo::new(stream), hyper_service, timeout, stop).await,
                Some(acceptor) => {
                    // The handshake has the header timeout too: a client that opens a
                    // connection and sends nothing (or a byte at a time) cannot hold it.
                    let handshake = tokio::time::timeout(timeout, acceptor.accept(stream));
                    let tls_stream = tokio::select! {
                        shaken = handshake => match shaken {
                            Ok(Ok(tls_stream)) => Some(tls_stream),
                            Ok(Err(e)) => {
                                metrics::counter!("gateway_tls_handshake_failures_total", "reason" => "error").increment(1);
                                tracing::debug!("TLS handshake failed: {e}");
                                None
                            }
                            Err(_) => {
                                metrics::counter!("gateway_tls_handshake_failures_total", "reason" => "timeout").increment(1);
                                tracing::debug!("TLS handshake timed out");
                                None
                            }
                        },
                        _ = stop.wait_for(|s| *s) => None,
                    };
                    if let Some(tls_stream) = tls_stream {
                        serve_connection(TokioIo::new(tls_stream), hyper_service, timeout, stop)
                            .await;
                    }
                }
            }
            drop(permit);
            drop(done);
        });
    }
    drop(listener);
    drop(done_rx);
    done_tx.closed().await;
}

/// The app as hyper serves it on a connection.
type ConnService = TowerToHyperService<
    tower::util::MapRequest<Front<Dispatch>, fn(hyper::Request<Incoming>) -> hyper::Request<Body>>,
>;

/// One connection, HTTP/1.1 or HTTP/2, until it closes; asked to finish its requests and
/// close when `stop` turns true.
async fn serve_connection<I>(
    io: I,
    service: ConnService,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout);
    // HTTP/2 has no header timeout in hyper: keep-alive pings close dead peers.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(timeout))
        .keep_alive_timeout(timeout);
    let mut conn = pin!(builder.serve_connection(io, service));
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

//! `gateway serve`: validate the flags, start the engine, bind, serve until a signal.

use std::sync::Arc;
use std::time::Duration;

use engine::handle::EngineHandle;
use metrics_exporter_prometheus::PrometheusBuilder;

use crate::cli::ServeArgs;
use crate::server::{app, HttpLimits};
use crate::state::{AppState, Settings, StartupError};

pub async fn run(args: ServeArgs) -> Result<(), StartupError> {
    let settings = Settings::from_args(&args)?;
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| StartupError(format!("cannot install the metrics recorder: {e}")))?;
    engine::metrics::describe();
    let started = std::time::Instant::now();
    let models = settings.models.clone();
    let engine_cfg = settings.engine.clone();
    let engine = tokio::task::spawn_blocking(move || EngineHandle::start(&models, &engine_cfg))
        .await
        .map_err(|e| StartupError(format!("engine start-up failed: {e}")))?
        .map_err(|e| StartupError(e.to_string()))?;
    for card in engine.models() {
        tracing::info!(
            model = %card.name,
            root = %card.root,
            max_model_len = card.max_model_len,
            tasks = ?card.tasks,
            "serving model"
        );
    }
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "engine ready"
    );
    let state = Arc::new(AppState::new(&args, settings, engine, Some(metrics))?);
    let app = app(
        state,
        HttpLimits {
            max_concurrent: args.max_concurrent_requests,
            timeout: Duration::from_secs(args.request_timeout),
        },
    );
    keep_timer_armed();
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| StartupError(format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
    tracing::info!(address = %local, "listening");
    axum::serve(listener, axum::ServiceExt::into_make_service(app))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| StartupError(format!("server error: {e}")))
}

/// Keep one short timer always pending in the runtime. Every request arms a timeout; when no
/// other timer is pending, the timer driver is parked without a deadline and each new timer
/// must wake it (an eventfd write and a futex wake per request). With this tick pending, a new
/// (later) deadline needs no wake-up.
fn keep_timer_armed() {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
        }
    });
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}

//! `gateway serve`: validate the flags, start the engine, bind, serve until a signal.

use std::sync::Arc;
use std::time::Duration;

use engine::handle::EngineHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::app::{app, HttpLimits};
use crate::cli::ServeArgs;
use crate::state::{AppState, Settings, StartupError};

pub async fn run(args: ServeArgs) -> Result<(), StartupError> {
    let settings = Settings::from_args(&args)?;
    let mut exporter = PrometheusBuilder::new();
    for (name, buckets) in engine::metrics::histogram_buckets() {
        exporter = exporter
            .set_buckets_for_metric(Matcher::Full(name.to_string()), buckets)
            .map_err(|e| StartupError(format!("bad buckets for {name}: {e}")))?;
    }
    let metrics = exporter
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
            weights = ?weights_field(&card),
            "serving model"
        );
    }
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "engine ready"
    );
    check_runner(&args.runner, &engine)?;
    if args.trust_remote_code {
        tracing::info!(
            "--trust-remote-code has no effect here: no code from a checkpoint runs, and every architecture served is built in"
        );
    }
    for (spec, defaults) in settings.models.iter().zip(&settings.generation) {
        if engine
            .model(&spec.served_name)
            .is_some_and(|m| m.card().tasks.contains(&engine::api::Task::Generate))
        {
            tracing::info!(
                model = %spec.served_name,
                generation_config = %args.generation_config,
                stop_token_ids = ?defaults.stop_token_ids,
                "request defaults: {defaults}"
            );
        }
    }
    let front = settings.front.clone();
    let tls = settings.tls.clone();
    let state = Arc::new(AppState::new(&args, settings, engine, Some(metrics))?);
    let cap = crate::http::listener::raise_file_limit();
    if let Some(asked) = args.max_connections.filter(|&m| m > cap) {
        tracing::warn!(
            asked,
            max_connections = cap,
            "--max-connections is above what the open-file limit allows: using the limit's cap"
        );
    }
    let max_connections = args.max_connections.map_or(cap, |m| m.min(cap));
    log_memory_bound(&args, &state, max_connections);
    let drain_state = state.clone();
    watch_engine_health(state.clone());
    let app = app(
        state,
        HttpLimits {
            max_concurrent: args.max_concurrent_requests,
            timeout: Duration::from_secs(args.request_timeout),
            options: front,
        },
    );
    keep_timer_armed();
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| StartupError(format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(address = %local, scheme, "listening");
    if let Some(tls) = &tls {
        tls.clone().watch(Duration::from_secs(1));
    }
    let (drain_tx, mut drain_rx) = tokio::sync::watch::channel(false);
    let drain_timeout = Duration::from_secs(args.shutdown_timeout);
    let signalled = async move {
        shutdown_signal().await;
        drain_state
            .draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(
            timeout_s = drain_timeout.as_secs(),
            "shutting down: no new connections, /health answers 503, draining requests in flight"
        );
        let _ = drain_tx.send(true);
    };
    let limits = crate::http::listener::ConnLimits {
        header_read_timeout: Duration::from_secs(args.header_read_timeout),
        max_connections,
    };
    let served = crate::http::listener::serve(listener, app, limits, tls, signalled);
    // The drain is bounded: a stream that would run for minutes, or a client that never
    // finishes sending its request, does not hold the process past the timeout.
    let deadline = async move {
        while !*drain_rx.borrow_and_update() {
            if drain_rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        tokio::time::sleep(drain_timeout).await;
    };
    let (cut_tx, cut_rx) = tokio::sync::watch::channel(false);
    crate::http::sse::install_shutdown(cut_rx);
    tokio::select! {
        () = served => {}
        () = deadline => {
            tracing::warn!("drain timeout passed with requests still open: ending them, then exiting");
            // Streams still open end with an error event; give them a moment to go out.
            let _ = cut_tx.send(true);
            crate::http::sse::fire_drain_cut();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// Logs the deployment's memory bound with its terms (one line; `bound_bytes` is the figure).
fn log_memory_bound(args: &ServeArgs, state: &AppState, max_connections: usize) {
    let cards = state.engine.models();
    let media_specs: Vec<_> = cards
        .iter()
        .filter_map(|c| state.engine.model(&c.name)?.media_spec().cloned())
        .collect();
    let program_bytes = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map_or(0, |m| m.len());
    let bound = crate::memory::MemoryBound::of(&crate::memory::Inputs {
        cards: &cards,
        media_specs: &media_specs,
        pipeline: state.media.as_ref().map(|m| m.config()),
        limits: &state.limits,
        max_concurrent_requests: args.max_concurrent_requests,
        max_request_memory: args.max_request_memory,
        max_request_body_bytes: args.max_request_body_bytes,
        max_num_seqs: args.max_num_seqs,
        max_logprobs: args.max_logprobs,
        max_connections,
        threads: args.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }),
        program_bytes,
    });
    tracing::info!(
        bound_bytes = bound.total(),
        "memory bound {bound} (README: Operating it)"
    );
}

/// `--runner generate` / `pooling`: every served model must be one. The engine loads each
/// checkpoint as the flags say (or refuses); this checks what came up.
fn check_runner(runner: &str, engine: &EngineHandle) -> Result<(), StartupError> {
    use engine::api::Task;
    let (wanted, what): (&[Task], &str) = match runner {
        "generate" => (&[Task::Generate], "a generative model"),
        "pooling" => (
            &[Task::Embed, Task::Score, Task::Classify],
            "a pooling model",
        ),
        _ => return Ok(()),
    };
    for card in engine.models() {
        if !card.tasks.iter().any(|t| wanted.contains(t)) {
            return Err(StartupError(format!(
                "--runner {runner}: {} is not {what} (it serves {:?})",
                card.name, card.tasks
            )));
        }
    }
    Ok(())
}

/// Exit status when an engine thread has died.
const ENGINE_DIED: i32 = 70;

/// An engine thread that died (a bug: a panic outside the model's guard) leaves its model
/// unservable while the process looks alive. Its waiters get their errors as its channels
/// close; then the process exits non-zero so that a supervisor restarts it.
fn watch_engine_health(state: Arc<AppState>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tick.tick().await;
            if !state.engine.is_healthy() {
                tracing::error!(
                    status = ENGINE_DIED,
                    "an engine thread stopped: exiting so that a supervisor restarts the server"
                );
                // Let the failed requests' error responses go out first.
                tokio::time::sleep(Duration::from_millis(500)).await;
                std::process::exit(ENGINE_DIED);
            }
        }
    });
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
}

/// Issue 26: per model, the stored tensor types with their bytes and share, then the weights
/// term of the memory bound (`Q4_1 60.1 MiB (86%), F32 9.8 MiB (14%), resident 98.0 MiB`).
fn weights_field(card: &engine::api::ModelCard) -> String {
    let resident = format!(
        "resident {}",
        engine::model::human_bytes(card.memory.weights)
    );
    if card.weight_types.total() == 0 {
        return resident;
    }
    format!("{}, {resident}", card.weight_types)
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::api::{ModelCard, ModelMemory, Task};

    #[test]
    fn the_weights_field_lists_types_then_what_is_resident() {
        let mut card = ModelCard {
            name: "m".into(),
            root: "m.gguf".into(),
            max_model_len: 8,
            device: "cpu".into(),
            tasks: vec![Task::Generate],
            input_modalities: vec!["text".into()],
            memory: ModelMemory {
                weights: 98_362_432,
                ..Default::default()
            },
            weight_types: Default::default(),
        };
        assert_eq!(weights_field(&card), "resident 93.8 MiB");
        card.weight_types.add("Q8_0", 30_081_024);
        card.weight_types.add("Q4_1", 66_355_200);
        assert_eq!(
            weights_field(&card),
            "Q4_1 63.3 MiB (69%), Q8_0 28.7 MiB (31%), resident 93.8 MiB"
        );
    }
}

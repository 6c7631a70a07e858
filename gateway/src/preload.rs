//! `gateway preload`: hold one model's weights for engines started with
//! `serve --load-format ipc_cache`, with an optional health server, until SIGTERM. With
//! `--device cuda[:N]` the daemon also holds the converted device weights on that GPU, which
//! engines on the same device map instead of uploading.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use engine::device::{Device, DeviceRequest};
use engine::weight_cache::daemon::{Daemon, Status};
use engine::weight_cache::hold::{hold_checkpoint, hold_on_gpu};
use engine::weight_cache::protocol::default_socket_dir;

use crate::cli::PreloadArgs;
use crate::state::{default_models, StartupError};

pub async fn run(args: PreloadArgs) -> Result<(), StartupError> {
    // A GPU daemon opens its device before anything else, so a wrong flag fails at once.
    let device = match args.device {
        DeviceRequest::Cuda(_) => {
            let request = args.device;
            tokio::task::spawn_blocking(move || engine::device::resolve(request))
                .await
                .map_err(|e| StartupError(format!("opening the device stopped: {e}")))?
                .map_err(|e| StartupError(e.to_string()))?
        }
        DeviceRequest::Cpu | DeviceRequest::Auto => Device::Cpu,
    };
    let force = match args.force {
        Some(s) if !(s.is_finite() && s >= 0.0) => {
            return Err(StartupError(format!(
                "--force {s}: expected seconds (0 or more)"
            )))
        }
        other => other.map(Duration::from_secs_f64),
    };
    let (path, name) = model_and_name(&args)?;
    let dir = args.socket_dir.clone().unwrap_or_else(default_socket_dir);
    let daemon = Arc::new(Daemon::bind(&dir, &name).map_err(|e| {
        StartupError(format!(
            "cannot open the weight-cache socket in {}: {e}",
            dir.display()
        ))
    })?);
    if let Some(port) = args.health_port {
        let addr = format!("{}:{port}", args.health_host);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| StartupError(format!("cannot listen on {addr}: {e}")))?;
        let router = axum::Router::new()
            .route("/health", get(health))
            .with_state(daemon.clone());
        tracing::info!(address = %addr, "weight-cache health server listening");
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!("weight-cache health server stopped: {e}");
            }
        });
    }
    let dtype = args.dtype;
    let load_path = path.clone();
    let held = tokio::task::spawn_blocking(move || match &device {
        Device::Gpu(gpu) => hold_on_gpu(&load_path, dtype, gpu),
        Device::Cpu => hold_checkpoint(&load_path, dtype, "cpu"),
    })
    .await
    .map_err(|e| StartupError(format!("the load stopped: {e}")))?;
    match held {
        Ok(h) => {
            tracing::info!(
                model = %name,
                bytes = h.bytes(),
                device_bytes = h.device_bytes(),
                identity = %h.identity,
                socket = %daemon.socket().display(),
                "weight cache ready"
            );
            daemon.set_ready(h);
        }
        Err(e) => {
            daemon.set_failed(e.to_string());
            daemon.shutdown(Some(Duration::ZERO));
            return Err(StartupError(e.to_string()));
        }
    }
    shutdown_signal().await;
    tracing::info!("shutting down the weight cache");
    let d = daemon.clone();
    tokio::task::spawn_blocking(move || d.shutdown(force))
        .await
        .map_err(|e| StartupError(format!("the shutdown stopped: {e}")))?;
    Ok(())
}

async fn health(State(daemon): State<Arc<Daemon>>) -> StatusCode {
    match daemon.status() {
        Status::Ready => StatusCode::OK,
        Status::Loading | Status::Reloading(_) | Status::Exited(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

/// The checkpoint and the name `serve` will give it (the daemon's socket is found by name).
fn model_and_name(args: &PreloadArgs) -> Result<(PathBuf, String), StartupError> {
    match &args.model {
        Some(m) => {
            // A hub id resolves as `serve` resolves it, so both find the same snapshot.
            let path = if Path::new(m).exists() {
                PathBuf::from(m)
            } else if let Some(spec) = crate::hub::HubSpec::parse(m) {
                crate::hub::resolve(
                    &spec,
                    args.hub.revision.as_deref(),
                    args.hub.download_dir.as_deref(),
                    &crate::hub::Hub::from_env(args.hub.hf_token.clone()),
                )
                .map_err(|e| StartupError(e.to_string()))?
            } else {
                return Err(StartupError(format!(
                    "--model {m}: no such file or directory"
                )));
            };
            Ok((
                path,
                args.served_model_name.clone().unwrap_or_else(|| m.clone()),
            ))
        }
        None => {
            let first = default_models(&args.models_cache)?
                .into_iter()
                .next()
                .ok_or_else(|| StartupError("no default model".into()))?;
            Ok((
                PathBuf::from(first.path),
                args.served_model_name.clone().unwrap_or(first.served_name),
            ))
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

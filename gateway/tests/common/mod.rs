//! What the router-level test files share: the app as `gateway serve` builds it from its
//! arguments, and one request through it.
#![allow(clippy::unwrap_used, dead_code)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use clap::Parser;
use gateway::app::{app, HttpLimits};
use gateway::cli::{Cli, Command};
use gateway::state::{AppState, Settings};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

pub type App = gateway::http::front::Front<gateway::app::Dispatch>;

/// The app and its state as `gateway <argv...>` (a `serve` command) builds them, with a real
/// engine.
pub fn app_from_args(argv: Vec<String>) -> (App, Arc<AppState>) {
    let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not a serve command");
    };
    let settings = Settings::from_args(&args).unwrap();
    let engine = engine::handle::EngineHandle::start(&settings.models, &settings.engine).unwrap();
    let options = settings.front.clone();
    let state = Arc::new(AppState::new(&args, settings, engine, None).unwrap());
    let app = app(
        state.clone(),
        HttpLimits {
            max_concurrent: args.max_concurrent_requests,
            timeout: Duration::from_secs(args.request_timeout),
            options,
        },
    );
    (app, state)
}

/// One request; the status and the JSON body (`null` when the body is not JSON).
pub async fn call(app: &App, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

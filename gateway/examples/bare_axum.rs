//! The baseline for the gate benchmark: a bare axum handler on the same runtime settings that
//! takes the same request body and answers a fixed JSON 400. Run:
//! `cargo run --release -p gateway --example bare_axum -- 127.0.0.1:8101`

use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;

const BODY: &str =
    r#"{"error":{"message":"bare","type":"BadRequestError","param":null,"code":400}}"#;

async fn handler(_body: Bytes) -> impl IntoResponse {
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "application/json")],
        BODY,
    )
}

fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8101".to_string());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let app = Router::new()
            .route("/v1/chat/completions", post(handler))
            .route("/tokenize", post(handler));
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        axum::serve(listener, app).await
    })
}

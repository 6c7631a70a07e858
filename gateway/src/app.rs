//! The service every connection runs: the front stack ([`crate::http::front`]) around a
//! dispatcher that sends the POST routes straight to their handlers and everything else
//! through the axum router (GET routes, 404, 405).
//!
//! Why the POST routes skip the router: axum's router costs about 2,200 instructions per
//! request (a path-tree walk, a `MatchedPath` and a URL-params extension inserted into the
//! request, a boxed route service and its boxed future), a tenth of what the gate's whole
//! rejection path costs. An exact match on the path of one of a dozen fixed routes costs a
//! few dozen. The router still registers the same routes, so a GET on a POST route is its 405.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::handler::Handler;
use axum::http::Method;
use axum::response::Response;
use axum::routing::future::RouteFuture;
use axum::routing::{get, post};
use axum::Router;
use tower::{Layer, Service};

use crate::error::ApiError;
use crate::http::auth::AuthConfig;
use crate::http::front::Front;
use crate::http::stack::{self, StackConfig};
use crate::routes;
use crate::state::AppState;

pub struct HttpLimits {
    pub max_concurrent: usize,
    pub timeout: Duration,
    /// CORS, the root path, the access log.
    pub options: crate::http::options::FrontOptions,
}

/// Declares the POST routes once, for the router and for the dispatcher's exact match.
macro_rules! post_routes {
    ($($path:literal => $handler:path,)*) => {
        fn with_post_routes(router: Router<Arc<AppState>>) -> Router<Arc<AppState>> {
            router $(.route($path, post($handler)))*
        }

        /// The handler of a POST route, called as the router would call it.
        fn post_handler(path: &str) -> Option<CallHandler> {
            match path {
                $($path => Some(|req, state| Handler::call($handler, req, state)),)*
                _ => None,
            }
        }
    };
}

post_routes! {
    "/v1/chat/completions" => routes::chat::handler,
    "/v1/completions" => routes::completions::handler,
    "/v1/embeddings" => routes::embeddings::handler,
    "/pooling" => routes::pooling::handler,
    "/score" => routes::score::handler,
    "/v1/score" => routes::score::handler,
    "/rerank" => routes::rerank::handler,
    "/v1/rerank" => routes::rerank::handler,
    "/v2/rerank" => routes::rerank::handler,
    "/classify" => routes::classify::handler,
    "/tokenize" => routes::tokenize::tokenize_handler,
    "/detokenize" => routes::tokenize::detokenize_handler,
}

/// What an `async fn` handler returns when called (axum boxes it).
type HandlerFuture = Pin<Box<dyn Future<Output = Response> + Send>>;

type CallHandler = fn(Request, Arc<AppState>) -> HandlerFuture;

/// The routes under the front stack.
#[derive(Clone)]
pub struct Dispatch {
    state: Arc<AppState>,
    router: Router,
}

impl Service<Request> for Dispatch {
    type Response = Response;
    type Error = Infallible;
    type Future = DispatchFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> DispatchFuture {
        if req.method() == Method::POST {
            if let Some(call) = post_handler(req.uri().path()) {
                return DispatchFuture::Handler(call(req, self.state.clone()));
            }
        }
        DispatchFuture::Router(Box::new(self.router.call(req)))
    }
}

pub enum DispatchFuture {
    Handler(HandlerFuture),
    /// Boxed: axum's route future is 320 bytes, and only the GET routes, 404 and 405 take it.
    Router(Box<RouteFuture<Infallible>>),
}

impl Future for DispatchFuture {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Both variants are `Unpin` (a boxed future; axum's route future).
        match self.get_mut() {
            DispatchFuture::Handler(fut) => fut.as_mut().poll(cx).map(Ok),
            DispatchFuture::Router(fut) => Pin::new(fut.as_mut()).poll(cx),
        }
    }
}

/// The service for `axum::serve`: the front stack around the dispatcher.
pub fn app(state: Arc<AppState>, limits: HttpLimits) -> Front<Dispatch> {
    let keys: Vec<Vec<u8>> = state
        .api_keys
        .iter()
        .map(|k| k.as_bytes().to_vec())
        .collect();
    // Clients the trusted-client profile names are valid clients too.
    let also_accept = state.profile.as_ref().map(|_| {
        let s = state.clone();
        Box::new(move |k: &str| s.profile.as_ref().is_some_and(|p| p.is_trusted(Some(k))))
            as crate::http::auth::KeyCheck
    });
    let auth = Arc::new(AuthConfig { keys, also_accept });
    let mut router = with_post_routes(Router::new());
    if state.runtime_lora_updating {
        router = router
            .route("/v1/load_lora_adapter", post(routes::lora::load))
            .route("/v1/unload_lora_adapter", post(routes::lora::unload));
    }
    let router = router
        .route("/v1/models", get(routes::info::models))
        .route("/health", get(routes::info::health))
        .route(
            "/ping",
            get(routes::info::health).post(routes::info::health),
        )
        .route("/version", get(routes::info::version))
        .route("/metrics", get(routes::info::metrics))
        .fallback(|| async { ApiError::NotFound("Not Found".into()) })
        .method_not_allowed_fallback(|| async {
            ApiError::bad_request("Method Not Allowed for this route.", None)
        })
        .with_state(state.clone());
    stack::front_layer(StackConfig {
        auth,
        max_concurrent: limits.max_concurrent,
        request_memory: state.request_memory.clone(),
        timeout: limits.timeout,
        options: limits.options,
    })
    .layer(Dispatch { state, router })
}

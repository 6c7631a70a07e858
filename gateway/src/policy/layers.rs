//! The four policy layers as tower services.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{ready, Ready};
use policies::{KwargsField, MergedKwargs};
use serde_json::Value;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

use super::media::MediaCounts;
use crate::error::ApiError;
use crate::state::AppState;

/// What the policy layers need to see of a request.
pub trait PolicyRequest {
    fn mm_processor_kwargs(&self) -> Option<&Value>;
    fn media_io_kwargs(&self) -> Option<&Value>;
    /// Media items per modality (empty for routes without media).
    fn media_counts(&self) -> MediaCounts {
        MediaCounts::new()
    }
}

/// A typed request on its way through the policy layers.
pub struct Policed<R> {
    pub req: R,
    /// The presented API key, if any (already authenticated by the HTTP stack).
    pub api_key: Option<String>,
    /// Set by the gate: the client may vary preprocessing.
    pub trusted: bool,
    /// Set by the merge layer: what preprocessing will use.
    pub merged: MergedKwargs,
}

/// Run the request through `TrustGate -> Merge -> Bounds -> Limits`.
pub async fn run_policies<R: PolicyRequest + Send + 'static>(
    state: &Arc<AppState>,
    req: R,
    api_key: Option<String>,
) -> Result<Policed<R>, ApiError> {
    let svc = ServiceBuilder::new()
        .layer(TrustGateLayer(state.clone()))
        .layer(MergeLayer(state.clone()))
        .layer(BoundsLayer(state.clone()))
        .layer(LimitsLayer(state.clone()))
        .service(tower::service_fn(|p: Policed<R>| {
            ready(Ok::<_, ApiError>(p))
        }));
    svc.oneshot(Policed {
        req,
        api_key,
        trusted: false,
        merged: MergedKwargs::default(),
    })
    .await
}

/// Declares a layer whose service runs `check` and then its inner service.
macro_rules! policy_layer {
    ($layer:ident, $svc:ident, $check:path) => {
        #[derive(Clone)]
        pub struct $layer(Arc<AppState>);

        impl<S> Layer<S> for $layer {
            type Service = $svc<S>;
            fn layer(&self, inner: S) -> Self::Service {
                $svc {
                    state: self.0.clone(),
                    inner,
                }
            }
        }

        #[derive(Clone)]
        pub struct $svc<S> {
            state: Arc<AppState>,
            inner: S,
        }

        impl<R, S> Service<Policed<R>> for $svc<S>
        where
            R: PolicyRequest,
            S: Service<Policed<R>, Response = Policed<R>, Error = ApiError>,
        {
            type Response = Policed<R>;
            type Error = ApiError;
            type Future = futures::future::Either<Ready<Result<Policed<R>, ApiError>>, S::Future>;

            fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
                self.inner.poll_ready(cx)
            }

            fn call(&mut self, mut p: Policed<R>) -> Self::Future {
                match $check(&self.state, &mut p) {
                    Ok(()) => futures::future::Either::Right(self.inner.call(p)),
                    Err(e) => futures::future::Either::Left(ready(Err(e))),
                }
            }
        }
    };
}

policy_layer!(TrustGateLayer, TrustGate, gate);
policy_layer!(MergeLayer, Merge, merge);
policy_layer!(BoundsLayer, Bounds, bounds);
policy_layer!(LimitsLayer, Limits, limits);

/// CONTRACT section 2: shape, then refusal of non-empty kwargs from untrusted clients.
fn gate<R: PolicyRequest>(state: &AppState, p: &mut Policed<R>) -> Result<(), ApiError> {
    p.trusted = state.is_trusted(p.api_key.as_deref());
    policies::check_trust_gate(
        p.req.mm_processor_kwargs(),
        p.req.media_io_kwargs(),
        p.trusted,
    )?;
    Ok(())
}

/// CONTRACT section 3: deployment defaults, and for trusted clients the request's values.
fn merge<R: PolicyRequest>(state: &AppState, p: &mut Policed<R>) -> Result<(), ApiError> {
    let mm = policies::validate_kwargs_shape(
        KwargsField::MmProcessorKwargs,
        p.req.mm_processor_kwargs(),
    )?;
    let media =
        policies::validate_kwargs_shape(KwargsField::MediaIoKwargs, p.req.media_io_kwargs())?;
    p.merged = policies::merge(&state.defaults, mm, media, p.trusted)?;
    if !p.merged.ignored_request_keys().is_empty() {
        tracing::debug!(keys = ?p.merged.ignored_request_keys(), "startup-only kwargs keys ignored");
    }
    Ok(())
}

/// CONTRACT section 8: a trusted-client profile bounds what its trusted clients may ask for.
fn bounds<R: PolicyRequest>(state: &AppState, p: &mut Policed<R>) -> Result<(), ApiError> {
    if let Some(profile) = &state.profile {
        if p.trusted && !state.trust_all {
            profile.check_bounds(&p.merged)?;
        }
    }
    Ok(())
}

/// CONTRACT section 4: `--limit-mm-per-prompt`.
fn limits<R: PolicyRequest>(state: &AppState, p: &mut Policed<R>) -> Result<(), ApiError> {
    let counts = p.req.media_counts();
    if !counts.is_empty() {
        state.limits.check_counts(&counts)?;
    }
    Ok(())
}

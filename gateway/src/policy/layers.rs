//! The four policy layers as tower services.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{ready, Ready};
use policies::{KwargsField, MergedKwargs};
use serde_json::value::RawValue;
use serde_json::Value;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

/// Media items per modality name (`image`, `audio`, `video`), for `--limit-mm-per-prompt`.
pub type MediaCounts = std::collections::BTreeMap<String, usize>;
use crate::error::ApiError;
use crate::state::AppState;

/// A kwargs field of a request: the raw JSON text (chat, completions, tokenize), or a value
/// (the pooling family, whose flattened fields serde cannot hand over as raw text).
#[derive(Clone, Copy)]
pub enum RequestKwargs<'a> {
    Raw(&'a RawValue),
    Value(&'a Value),
}

impl<'a> RequestKwargs<'a> {
    /// A raw field of a request, as the policy layers see it.
    pub fn raw(field: &'a Option<crate::protocol::RawKwargs>) -> Option<Self> {
        field.as_deref().map(RequestKwargs::Raw)
    }

    fn is_non_empty_object(self) -> bool {
        match self {
            RequestKwargs::Raw(raw) => crate::protocol::is_non_empty_object(raw),
            RequestKwargs::Value(v) => policies::is_non_empty_kwargs(Some(v)),
        }
    }

    /// The value; `None` for JSON `null` (the same as the field left out).
    fn to_value(self) -> Result<Option<Value>, ApiError> {
        let value = match self {
            RequestKwargs::Raw(raw) => serde_json::from_str(raw.get()).map_err(|e| {
                ApiError::bad_request(format!("The request body is not valid JSON: {e}"), None)
            })?,
            RequestKwargs::Value(v) => v.clone(),
        };
        Ok((!value.is_null()).then_some(value))
    }
}

/// What the policy layers need to see of a request.
pub trait PolicyRequest {
    fn mm_processor_kwargs(&self) -> Option<RequestKwargs<'_>>;
    fn media_io_kwargs(&self) -> Option<RequestKwargs<'_>>;
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
    /// Set by the gate: the request's `mm_processor_kwargs` and `media_io_kwargs` as values.
    request_kwargs: (Option<Value>, Option<Value>),
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
        request_kwargs: (None, None),
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
    let (mm, media) = (p.req.mm_processor_kwargs(), p.req.media_io_kwargs());
    // The common refusal, read from the text: an untrusted client's `mm_processor_kwargs` is
    // an object with a key (an object is all its shape check asks for) and there is no
    // `media_io_kwargs` to check first. The full check below gives the same answer.
    if !p.trusted && media.is_none() && mm.is_some_and(RequestKwargs::is_non_empty_object) {
        return Err(ApiError::Gate(KwargsField::MmProcessorKwargs));
    }
    let mm = mm.map(RequestKwargs::to_value).transpose()?.flatten();
    let media = media.map(RequestKwargs::to_value).transpose()?.flatten();
    policies::check_trust_gate(mm.as_ref(), media.as_ref(), p.trusted)?;
    p.request_kwargs = (mm, media);
    Ok(())
}

/// CONTRACT section 3: deployment defaults, and for trusted clients the request's values.
fn merge<R: PolicyRequest>(state: &AppState, p: &mut Policed<R>) -> Result<(), ApiError> {
    let (mm, media) = &p.request_kwargs;
    let mm = policies::validate_kwargs_shape(KwargsField::MmProcessorKwargs, mm.as_ref())?;
    let media = policies::validate_kwargs_shape(KwargsField::MediaIoKwargs, media.as_ref())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The gate's reading of the raw text agrees with the value it would build, and the value
    /// it builds is the one the client sent (`null` as absent).
    #[test]
    fn raw_kwargs_read_as_their_values() {
        for text in [
            "{}",
            " { } ",
            "{\n}",
            "{\"num_crops\": 4}",
            " {\"video\": {}}",
            "{\"\": null}",
            "[]",
            "[1]",
            "\"{}\"",
            "\"x\"",
            "0",
            "true",
            "null",
        ] {
            let raw: Box<RawValue> = serde_json::from_str(text).unwrap();
            let value: Value = serde_json::from_str(text).unwrap();
            let (raw, parsed) = (RequestKwargs::Raw(&raw), RequestKwargs::Value(&value));
            assert_eq!(
                raw.is_non_empty_object(),
                parsed.is_non_empty_object(),
                "{text}"
            );
            assert_eq!(
                raw.is_non_empty_object(),
                value.as_object().is_some_and(|m| !m.is_empty()),
                "{text}"
            );
            let expect = (!value.is_null()).then(|| value.clone());
            assert_eq!(raw.to_value().unwrap(), expect, "{text}");
            assert_eq!(parsed.to_value().unwrap(), expect, "{text}");
        }
    }
}

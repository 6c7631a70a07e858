//! The server-wide budget of what requests in flight may hold (`--max-request-memory`), and
//! each request's account against it.
//!
//! The front of the stack opens an account for every request but the probes
//! ([`super::front`]) and keeps it until the response has been sent, streams included. What
//! the request will hold is added to it before the work that allocates it: its body as it is
//! read and parsed ([`super::extract`]), then, once the route knows the request's shape, its
//! sequences, logprobs, pooled outputs and media tensors (`crate::memory` sizes each from the
//! same terms as the deployment's memory bound). A request that does not fit beside the others
//! gets a 503 with Retry-After, one that could never fit a 400 naming the flag, so the
//! requests' share of the bound is the budget however many arrive at once.

use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use preprocess::budget::{ByteBudget, Refused, Reservation};

use crate::error::ApiError;

/// One request's account: cheap to clone, released when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct RequestMemory {
    held: Arc<Mutex<Reservation>>,
}

impl RequestMemory {
    /// An empty account on `budget`.
    pub fn open(budget: &ByteBudget) -> RequestMemory {
        RequestMemory {
            held: Arc::new(Mutex::new(budget.empty())),
        }
    }

    /// An account with no limit, for handlers reached without the front of the stack.
    pub fn unbounded() -> RequestMemory {
        RequestMemory::open(&ByteBudget::new(usize::MAX))
    }

    /// Bytes the request holds now.
    pub fn held(&self) -> u64 {
        self.lock().bytes() as u64
    }

    /// Holds `bytes` more, for `what` (named in the error).
    pub fn hold(&self, bytes: u64, what: &str) -> Result<(), ApiError> {
        let mut held = self.lock();
        let before = held.bytes() as u64;
        let more = usize::try_from(bytes).unwrap_or(usize::MAX);
        held.try_grow(more)
            .map_err(|refused| refusal(&refused, before.saturating_add(bytes), what))
    }

    /// Holds up to `total` bytes in all (no change when it holds that much already).
    pub fn hold_total(&self, total: u64, what: &str) -> Result<(), ApiError> {
        let more = total.saturating_sub(self.held());
        if more == 0 {
            return Ok(());
        }
        self.hold(more, what)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reservation> {
        // The guarded value is a counter that a panic cannot leave half-updated.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

/// A request that could never fit is the client's to change (400); one that does not fit
/// beside the others now is the server's load (503, retry).
fn refusal(refused: &Refused, total: u64, what: &str) -> ApiError {
    let capacity = refused.capacity as u64;
    if total > capacity {
        return ApiError::bad_request(
            format!(
                "This request would hold up to {} MiB ({what}), more than the server allows all requests together ({} MiB, --max-request-memory).",
                mib(total),
                mib(capacity)
            ),
            None,
        );
    }
    metrics::counter!("gateway_requests_shed_total").increment(1);
    tracing::warn!(
        needed = refused.needed,
        in_use = refused.in_use,
        capacity,
        what,
        "request memory budget full"
    );
    ApiError::Overloaded(format!(
        "The server holds too much request memory at once (this request needs {} MiB more for {what}, {} MiB of {} MiB are in use); retry shortly.",
        mib(refused.needed as u64),
        refused.in_use >> 20,
        capacity >> 20
    ))
}

impl<S: Send + Sync> FromRequestParts<S> for RequestMemory {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<RequestMemory>()
            .cloned()
            .unwrap_or_else(RequestMemory::unbounded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;

    #[test]
    fn an_account_holds_until_its_last_clone_goes_and_refuses_by_cause() {
        let budget = ByteBudget::new(100 << 20);
        let a = RequestMemory::open(&budget);
        a.hold(60 << 20, "its body")
            .unwrap_or_else(|e| panic!("{e:?}"));
        let clone = a.clone();
        assert_eq!(clone.held(), 60 << 20);

        let b = RequestMemory::open(&budget);
        let busy = b.hold(50 << 20, "its sequences");
        let busy = busy.err().map(|e| e.into_response().status().as_u16());
        assert_eq!(busy, Some(503), "does not fit beside the other: retry");
        let never = b.hold(101 << 20, "its sequences");
        let never = never.err().map(|e| e.into_response().status().as_u16());
        assert_eq!(never, Some(400), "can never fit");
        assert_eq!(b.held(), 0, "a refusal holds nothing more");

        b.hold_total(30 << 20, "x")
            .unwrap_or_else(|e| panic!("{e:?}"));
        b.hold_total(10 << 20, "x")
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(b.held(), 30 << 20, "hold_total never shrinks");
        drop(a);
        assert_eq!(budget.in_use(), 90 << 20, "a clone keeps the account");
        drop(clone);
        drop(b);
        assert_eq!(budget.in_use(), 0);
    }
}

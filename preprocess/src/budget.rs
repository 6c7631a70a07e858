//! Budgets an item is checked against before it is decoded.
//!
//! * [`TokenBudget`]: the prompt tokens left for a request's media (the model's context less
//!   the text), per request.
//! * [`ByteBudget`]: bytes in flight across the whole server (the pipeline holds one for
//!   fetched media and one for decoded media; the gateway one for requests). Each item reserves
//!   what its header says decoding will hold; a request that does not fit is refused at once
//!   (503, retry later) rather than queued, and the reservation is released when the item's
//!   tensor is produced or its decoding fails ([`Reservation`] is dropped).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Prompt tokens a request's media may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBudget {
    pub available: usize,
}

impl TokenBudget {
    /// No limit (callers that check the prompt's length some other way).
    pub const UNLIMITED: TokenBudget = TokenBudget {
        available: usize::MAX,
    };
}

/// The server-wide budget of decoded-media bytes; cheap to clone.
#[derive(Debug, Clone)]
pub struct ByteBudget {
    used: Arc<AtomicUsize>,
    capacity: usize,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub needed: usize,
    pub in_use: usize,
    pub capacity: usize,
}

impl Refused {
    /// The 503 for a media budget (`stage`: what the server is doing with the bytes), logged.
    pub fn media_busy(self, stage: &'static str) -> crate::PreprocessError {
        tracing::warn!(
            needed = self.needed,
            in_use = self.in_use,
            stage,
            "media budget full"
        );
        crate::PreprocessError::MediaBusy {
            stage,
            needed: self.needed,
            in_use: self.in_use,
            capacity: self.capacity,
        }
    }
}

/// Bytes held against a [`ByteBudget`] until dropped; it may grow as what it covers grows.
#[derive(Debug)]
pub struct Reservation {
    used: Arc<AtomicUsize>,
    capacity: usize,
    bytes: usize,
}

impl Reservation {
    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `more` bytes as well, if they fit beside what is reserved now; never waits. On a
    /// refusal it holds what it held before.
    pub fn try_grow(&mut self, more: usize) -> Result<(), Refused> {
        let capacity = self.capacity;
        match self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(more).filter(|n| *n <= capacity)
            }) {
            Ok(_) => {
                self.bytes += more;
                Ok(())
            }
            Err(in_use) => Err(Refused {
                needed: more,
                in_use,
                capacity,
            }),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl ByteBudget {
    pub fn new(capacity: usize) -> ByteBudget {
        ByteBudget {
            used: Arc::new(AtomicUsize::new(0)),
            capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes reserved right now.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// A reservation of nothing yet, to grow ([`Reservation::try_grow`]).
    pub fn empty(&self) -> Reservation {
        Reservation {
            used: self.used.clone(),
            capacity: self.capacity,
            bytes: 0,
        }
    }

    /// Reserves `bytes` if they fit beside what is reserved now; never waits.
    pub fn try_reserve(&self, bytes: usize) -> Result<Reservation, Refused> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|n| *n <= self.capacity)
            })
            .map(|_| Reservation {
                used: self.used.clone(),
                capacity: self.capacity,
                bytes,
            })
            .map_err(|in_use| Refused {
                needed: bytes,
                in_use,
                capacity: self.capacity,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_then_refuse_then_release() {
        let budget = ByteBudget::new(100);
        let a = budget.try_reserve(60).unwrap();
        assert_eq!(budget.in_use(), 60);
        let refused = budget.try_reserve(50).unwrap_err();
        assert_eq!(
            refused,
            Refused {
                needed: 50,
                in_use: 60,
                capacity: 100
            }
        );
        let b = budget.try_reserve(40).unwrap();
        assert_eq!(budget.in_use(), 100);
        drop(a);
        drop(b);
        assert_eq!(budget.in_use(), 0);
        assert!(budget.try_reserve(101).is_err());
    }

    #[test]
    fn a_reservation_grows_while_it_fits_and_releases_all_it_holds() {
        let budget = ByteBudget::new(100);
        let mut r = budget.try_reserve(10).unwrap();
        r.try_grow(50).unwrap();
        assert_eq!((r.bytes(), budget.in_use()), (60, 60));
        let other = budget.try_reserve(30).unwrap();
        let refused = r.try_grow(20).unwrap_err();
        assert_eq!((refused.needed, refused.in_use), (20, 90));
        assert_eq!((r.bytes(), budget.in_use()), (60, 90));
        drop(r);
        assert_eq!(budget.in_use(), 30);
        drop(other);
        assert_eq!(budget.in_use(), 0);
    }
}

//! The uuid cache of processed media (CONTRACT section 4).
//!
//! A content part may carry a `uuid`. When it also carries data, the processed
//! result is stored under `(modality, uuid)`; a later part with the same uuid
//! and no data reuses it. A part with a uuid, no data and no entry is the 400
//! `Cache miss for <modality> at index <i> but data is not provided`.
//!
//! The cache is bounded by the bytes its entries hold and evicts the least
//! recently used entry first; an entry larger than the whole budget is not
//! kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::Modality;

/// How many bytes a cached value holds (for the budget).
pub trait Weigh {
    fn weight_bytes(&self) -> usize;
}

/// The 400 for a uuid without data that is not cached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Cache miss for {modality} at index {index} but data is not provided")]
pub struct CacheMiss {
    pub modality: Modality,
    pub index: usize,
}

struct Entry<V> {
    value: Arc<V>,
    weight: usize,
    last_used: u64,
}

struct Inner<V> {
    entries: HashMap<(Modality, String), Entry<V>>,
    total: usize,
    clock: u64,
}

/// A byte-bounded LRU map from `(modality, uuid)` to processed media.
pub struct UuidCache<V> {
    budget: usize,
    inner: Mutex<Inner<V>>,
}

impl<V: Weigh> UuidCache<V> {
    /// A cache holding at most `budget_bytes` of values (0 disables it).
    pub fn new(budget_bytes: usize) -> Self {
        UuidCache {
            budget: budget_bytes,
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                total: 0,
                clock: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        // A poisoned lock only means another request panicked mid-update; the
        // map itself is still consistent enough to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached value for a part with a uuid and no data, or the contract's
    /// cache-miss error (`index` is the part's index among its modality's items).
    pub fn get(&self, modality: Modality, uuid: &str, index: usize) -> Result<Arc<V>, CacheMiss> {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        match inner.entries.get_mut(&(modality, uuid.to_owned())) {
            Some(entry) => {
                entry.last_used = now;
                Ok(entry.value.clone())
            }
            None => Err(CacheMiss { modality, index }),
        }
    }

    /// Stores a processed item under its uuid, evicting least recently used
    /// entries to stay within the budget.
    pub fn put(&self, modality: Modality, uuid: &str, value: Arc<V>) {
        let weight = value.weight_bytes();
        if weight > self.budget {
            return;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        if let Some(old) = inner.entries.remove(&(modality, uuid.to_owned())) {
            inner.total -= old.weight;
        }
        while inner.total + weight > self.budget {
            let Some(oldest) = inner
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = inner.entries.remove(&oldest) {
                inner.total -= e.weight;
            }
        }
        inner.total += weight;
        inner.entries.insert(
            (modality, uuid.to_owned()),
            Entry {
                value,
                weight,
                last_used: now,
            },
        );
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.lock().total
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Blob(usize);
    impl Weigh for Blob {
        fn weight_bytes(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn miss_message_is_the_contracts() {
        let cache: UuidCache<Blob> = UuidCache::new(100);
        let err = cache.get(Modality::Image, "u1", 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Cache miss for image at index 2 but data is not provided"
        );
    }

    #[test]
    fn hits_are_per_modality_and_lru_evicts_within_budget() {
        let cache = UuidCache::new(100);
        cache.put(Modality::Image, "a", Arc::new(Blob(40)));
        cache.put(Modality::Image, "b", Arc::new(Blob(40)));
        assert!(cache.get(Modality::Audio, "a", 0).is_err());
        // Touch "a" so "b" is the least recently used.
        assert_eq!(cache.get(Modality::Image, "a", 0).unwrap().0, 40);
        cache.put(Modality::Image, "c", Arc::new(Blob(40)));
        assert!(cache.get(Modality::Image, "b", 0).is_err());
        assert!(cache.get(Modality::Image, "a", 0).is_ok());
        assert!(cache.get(Modality::Image, "c", 0).is_ok());
        assert_eq!(cache.bytes(), 80);
        // Too big for the whole budget: not kept, nothing evicted.
        cache.put(Modality::Image, "huge", Arc::new(Blob(1000)));
        assert!(cache.get(Modality::Image, "huge", 0).is_err());
        assert_eq!(cache.len(), 2);
        // Replacing an entry re-weighs it.
        cache.put(Modality::Image, "a", Arc::new(Blob(10)));
        assert_eq!(cache.bytes(), 50);
    }
}

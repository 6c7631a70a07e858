//! The adapters one decoder serves, by name, and the weights it holds for them, as vLLM
//! splits the two: every adapter registered (`--lora-modules`, runtime loads) stays served by
//! name and folder, while at most `--max-cpu-loras` of them have their factors in memory.
//! A sequence that runs with an adapter whose factors are not held gets them when the
//! scheduler admits it ([`LoraRegistry::acquire`]): read again from the folder, after the
//! least recently used adapter that no running sequence holds is dropped.
//!
//! Memory: the factors alive are at most `--max-cpu-loras`, counting those an unloaded
//! adapter's running sequences still hold, plus one being read (the memory bound counts
//! that many). Reads take turns (`reading`), and an admission's read first makes room.

use super::{LORA_EVICTIONS, LORA_LOADS};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, TryLockError, Weak};

use super::{LoraAdapter, LoraError, LoraTargets};

/// The limits of `--enable-lora`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraSettings {
    /// `--max-loras`: the most adapters in one step.
    pub max_loras: usize,
    /// `--max-lora-rank`: the largest `r` an adapter may have.
    pub max_lora_rank: usize,
    /// `--max-cpu-loras`: the most adapters whose factors are held in memory.
    pub max_cpu_loras: usize,
}

impl Default for LoraSettings {
    /// vLLM's defaults.
    fn default() -> Self {
        LoraSettings {
            max_loras: 1,
            max_lora_rank: 16,
            max_cpu_loras: 1,
        }
    }
}

/// One registration of an adapter: a name loaded again after an unload is a new one (vLLM's
/// `lora_int_id`), so a sequence always runs the folder it was admitted for.
#[derive(Debug, PartialEq, Eq)]
pub struct LoraRef {
    pub id: u64,
    pub name: String,
    /// The folder, as given (the prefix-cache key and `/v1/models`' `root`).
    pub path: String,
}

/// What [`LoraRegistry::acquire`] gives a sequence being admitted.
#[derive(Debug)]
pub enum Acquired {
    Ready(Arc<LoraAdapter>),
    /// No room now (every adapter held is in use, or another read is under way): the
    /// sequence waits, as vLLM's scheduler keeps a request waiting.
    Busy,
    /// The folder no longer reads as the adapter (moved, changed): the sequence fails.
    Failed(LoraError),
}

/// Loads and evictions so far (`gateway:lora_adapter_loads_total`, `..._evictions_total`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LoraCounts {
    pub loads: u64,
    pub evictions: u64,
}

/// Factors in memory, by registration id, in least-recently-used order (front: oldest).
#[derive(Debug, Default)]
struct Held {
    cached: Vec<(u64, Arc<LoraAdapter>)>,
    /// Factors of unloaded adapters that running sequences still hold, by registration id.
    orphans: Vec<(u64, Weak<LoraAdapter>)>,
}

impl Held {
    fn alive(&mut self) -> usize {
        self.orphans.retain(|(_, w)| w.strong_count() > 0);
        self.cached.len() + self.orphans.len()
    }

    /// The factors of registration `id` if they are in memory (cached: now the most recently
    /// used; or still held by another sequence of an unloaded adapter).
    fn hit(&mut self, id: u64) -> Option<Arc<LoraAdapter>> {
        let Some(i) = self.cached.iter().position(|(have, _)| *have == id) else {
            return self
                .orphans
                .iter()
                .filter(|(have, _)| *have == id)
                .find_map(|(_, w)| w.upgrade());
        };
        let entry = self.cached.remove(i);
        let weights = entry.1.clone();
        self.cached.push(entry);
        Some(weights)
    }

    /// Drops least recently used factors no sequence holds until fewer than `max` are alive;
    /// false when every one left is in use.
    fn make_room(&mut self, max: usize, evicted: &mut Vec<String>) -> bool {
        while self.alive() >= max {
            // The registry's own reference is the only one: no sequence runs with it.
            let Some(i) = self
                .cached
                .iter()
                .position(|(_, w)| Arc::strong_count(w) == 1)
            else {
                return false;
            };
            let (_, weights) = self.cached.remove(i);
            evicted.push(weights.name.clone());
        }
        true
    }
}

/// The adapters of one decoder.
#[derive(Debug)]
pub struct LoraRegistry {
    targets: LoraTargets,
    settings: LoraSettings,
    names: RwLock<BTreeMap<String, Arc<LoraRef>>>,
    held: Mutex<Held>,
    /// Taken for the whole of a read and its insertion: one adapter read at a time.
    reading: Mutex<()>,
    next_id: AtomicU64,
    loads: AtomicU64,
    evictions: AtomicU64,
    /// The served name of the decoder, for the metric labels.
    model: String,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves whole maps: safe to keep using.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LoraRegistry {
    pub fn new(targets: LoraTargets, settings: LoraSettings, model: &str) -> Self {
        LoraRegistry {
            targets,
            settings,
            names: RwLock::new(BTreeMap::new()),
            held: Mutex::new(Held::default()),
            reading: Mutex::new(()),
            next_id: AtomicU64::new(1),
            loads: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            model: model.to_string(),
        }
    }

    pub fn settings(&self) -> LoraSettings {
        self.settings
    }

    fn names(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<LoraRef>>> {
        self.names.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the factors of `lora` (the caller holds `reading`).
    fn read(&self, lora: &LoraRef) -> Result<Arc<LoraAdapter>, LoraError> {
        let adapter = LoraAdapter::read(
            &lora.name,
            Path::new(&lora.path),
            &self.targets,
            self.settings.max_lora_rank,
        )
        .map_err(|reason| LoraError::Invalid {
            name: lora.name.clone(),
            path: lora.path.clone(),
            reason,
        })?;
        self.loads.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(LORA_LOADS, "model_name" => self.model.clone()).increment(1);
        Ok(Arc::new(adapter))
    }

    fn evicted(&self, names: Vec<String>) {
        for name in names {
            self.evictions.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(LORA_EVICTIONS, "model_name" => self.model.clone()).increment(1);
            tracing::info!(lora = %name, max_cpu_loras = self.settings.max_cpu_loras, "LoRA adapter evicted from memory (reloaded on its next request)");
        }
    }

    /// Reads the PEFT folder `path` and serves it as `name`, holding its factors when there
    /// is room (vLLM's preload). Refused: a name already loaded, or files that do not fit the
    /// base.
    pub fn load(&self, name: &str, path: &Path) -> Result<Arc<LoraRef>, LoraError> {
        if self.names().contains_key(name) {
            return Err(LoraError::Exists(name.to_string()));
        }
        let lora = Arc::new(LoraRef {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            path: path.display().to_string(),
        });
        let _turn = lock(&self.reading);
        let weights = self.read(&lora)?;
        let mut names = self.names.write().unwrap_or_else(|e| e.into_inner());
        // Checked again: another load may have taken the name while the files were read.
        if names.contains_key(name) {
            return Err(LoraError::Exists(name.to_string()));
        }
        let mut evicted = Vec::new();
        let kept = {
            let mut held = lock(&self.held);
            let room = held.make_room(self.settings.max_cpu_loras, &mut evicted);
            if room {
                held.cached.push((lora.id, weights.clone()));
            }
            room
        };
        names.insert(name.to_string(), lora.clone());
        drop(names);
        self.evicted(evicted);
        tracing::info!(
            lora = name,
            path = %path.display(),
            rank = weights.rank,
            scale = weights.scale,
            projections = weights.targeted(),
            bytes = weights.bytes(),
            held = kept,
            "LoRA adapter loaded"
        );
        Ok(lora)
    }

    /// Stops serving `name`; sequences running with it finish with the factors they hold.
    pub fn unload(&self, name: &str) -> Result<(), LoraError> {
        let mut names = self.names.write().unwrap_or_else(|e| e.into_inner());
        let lora = names
            .remove(name)
            .ok_or_else(|| LoraError::NotFound(name.to_string()))?;
        let mut held = lock(&self.held);
        if let Some(i) = held.cached.iter().position(|(id, _)| *id == lora.id) {
            let (_, weights) = held.cached.remove(i);
            if Arc::strong_count(&weights) > 1 {
                held.orphans.push((lora.id, Arc::downgrade(&weights)));
            }
        }
        tracing::info!(lora = name, "LoRA adapter unloaded");
        Ok(())
    }

    /// The factors `lora`'s sequence runs with, read again if they were evicted. Called by
    /// the scheduler as it admits the sequence; the sequence holds them while it runs.
    pub fn acquire(&self, lora: &LoraRef) -> Acquired {
        if let Some(w) = lock(&self.held).hit(lora.id) {
            return Acquired::Ready(w);
        }
        // A runtime load reading its files: wait for the next step rather than stall this one.
        let _turn = match self.reading.try_lock() {
            Ok(turn) => turn,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return Acquired::Busy,
        };
        let mut evicted = Vec::new();
        {
            let mut held = lock(&self.held);
            if let Some(w) = held.hit(lora.id) {
                return Acquired::Ready(w);
            }
            if !held.make_room(self.settings.max_cpu_loras, &mut evicted) {
                drop(held);
                self.evicted(evicted);
                return Acquired::Busy;
            }
        }
        self.evicted(evicted);
        let weights = match self.read(lora) {
            Ok(w) => w,
            Err(e) => return Acquired::Failed(e),
        };
        tracing::info!(lora = %lora.name, path = %lora.path, "LoRA adapter read again for a request");
        // A sequence of an unloaded adapter runs with what it reads, held as an orphan.
        let registered = self
            .names()
            .get(&lora.name)
            .is_some_and(|r| r.id == lora.id);
        let mut held = lock(&self.held);
        if registered {
            held.cached.push((lora.id, weights.clone()));
        } else {
            held.orphans.push((lora.id, Arc::downgrade(&weights)));
        }
        Acquired::Ready(weights)
    }

    pub fn get(&self, name: &str) -> Option<Arc<LoraRef>> {
        self.names().get(name).cloned()
    }

    /// Every adapter served, by name.
    pub fn list(&self) -> Vec<Arc<LoraRef>> {
        self.names().values().cloned().collect()
    }

    /// The names of the adapters whose factors are held, least recently used first.
    pub fn held(&self) -> Vec<String> {
        lock(&self.held)
            .cached
            .iter()
            .map(|(_, w)| w.name.clone())
            .collect()
    }

    pub fn counts(&self) -> LoraCounts {
        LoraCounts {
            loads: self.loads.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data")
            .join(name)
    }

    fn registry(max_cpu_loras: usize) -> LoraRegistry {
        let targets = crate::lora::tests::tiny_llama_targets();
        let settings = LoraSettings {
            max_loras: 1,
            max_lora_rank: 16,
            max_cpu_loras,
        };
        LoraRegistry::new(targets, settings, "tiny")
    }

    fn ready(a: Acquired) -> Arc<LoraAdapter> {
        match a {
            Acquired::Ready(w) => w,
            other => panic!("not ready: {other:?}"),
        }
    }

    #[test]
    fn factors_in_use_are_never_evicted_and_count_against_the_limit() {
        let reg = registry(1);
        let a = reg.load("a", &adapter("tiny-llama-lora-a")).expect("loads");
        let b = reg.load("b", &adapter("tiny-llama-lora-b")).expect("loads");
        assert_eq!(reg.held(), ["b"], "b's load evicted idle a");
        let running_b = ready(reg.acquire(&b));
        assert!(matches!(reg.acquire(&a), Acquired::Busy), "b runs: a waits");
        // Unloaded while running, b's factors still count: a still waits.
        reg.unload("b").expect("unloads");
        assert!(reg.held().is_empty());
        assert!(matches!(reg.acquire(&a), Acquired::Busy));
        // A sequence of b admitted later shares what the running one holds.
        assert!(Arc::ptr_eq(&ready(reg.acquire(&b)), &running_b));
        drop(running_b);
        let running_a = ready(reg.acquire(&a));
        assert_eq!(running_a.name, "a");
        assert_eq!(reg.held(), ["a"]);
        let counts = reg.counts();
        assert_eq!((counts.loads, counts.evictions), (3, 1));
    }

    #[test]
    fn a_load_with_every_held_adapter_in_use_registers_without_holding() {
        let reg = registry(1);
        let a = reg.load("a", &adapter("tiny-llama-lora-a")).expect("loads");
        let _running = ready(reg.acquire(&a));
        let b = reg.load("b", &adapter("tiny-llama-lora-b")).expect("loads");
        assert_eq!(reg.held(), ["a"]);
        assert_eq!(reg.get("b").map(|r| r.id), Some(b.id), "b is served");
        assert!(matches!(
            reg.load("b", &adapter("tiny-llama-lora-b")),
            Err(LoraError::Exists(_))
        ));
    }
}

//! The adapters one decoder serves, by name: those of `--lora-modules` and those loaded and
//! unloaded at run time. Each is held as an `Arc`: unloading drops the registry's reference
//! only, so sequences already running with it finish with the same weights.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use super::{LoraAdapter, LoraError, LoraTargets};

/// The limits of `--enable-lora`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraSettings {
    /// `--max-loras`: the most adapters in one step.
    pub max_loras: usize,
    /// `--max-lora-rank`: the largest `r` an adapter may have.
    pub max_lora_rank: usize,
    /// `--max-cpu-loras`: the most adapters held loaded.
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

/// The loaded adapters of one decoder.
#[derive(Debug)]
pub struct LoraRegistry {
    targets: LoraTargets,
    settings: LoraSettings,
    adapters: RwLock<BTreeMap<String, Arc<LoraAdapter>>>,
}

impl LoraRegistry {
    pub fn new(targets: LoraTargets, settings: LoraSettings) -> Self {
        LoraRegistry {
            targets,
            settings,
            adapters: RwLock::new(BTreeMap::new()),
        }
    }

    pub fn settings(&self) -> LoraSettings {
        self.settings
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<LoraAdapter>>> {
        // A panic while holding the lock leaves a whole map: safe to keep using.
        self.adapters.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the PEFT folder `path` and serves it as `name`. Refused: a name already loaded,
    /// `--max-cpu-loras` adapters already held, or files that do not fit the base.
    pub fn load(&self, name: &str, path: &Path) -> Result<Arc<LoraAdapter>, LoraError> {
        let check_room = |held: &BTreeMap<String, Arc<LoraAdapter>>| {
            if held.contains_key(name) {
                return Err(LoraError::Exists(name.to_string()));
            }
            if held.len() >= self.settings.max_cpu_loras {
                return Err(LoraError::Full {
                    name: name.to_string(),
                    max: self.settings.max_cpu_loras,
                });
            }
            Ok(())
        };
        check_room(&self.read())?;
        let adapter = LoraAdapter::read(name, path, &self.targets, self.settings.max_lora_rank)
            .map_err(|reason| LoraError::Invalid {
                name: name.to_string(),
                path: path.display().to_string(),
                reason,
            })?;
        let adapter = Arc::new(adapter);
        let mut held = self.adapters.write().unwrap_or_else(|e| e.into_inner());
        // Checked again: another load may have finished while the files were read.
        check_room(&held)?;
        held.insert(name.to_string(), adapter.clone());
        tracing::info!(
            lora = name,
            path = %path.display(),
            rank = adapter.rank,
            scale = adapter.scale,
            projections = adapter.targeted(),
            bytes = adapter.bytes(),
            "LoRA adapter loaded"
        );
        Ok(adapter)
    }

    /// Stops serving `name`; sequences running with it finish.
    pub fn unload(&self, name: &str) -> Result<(), LoraError> {
        let mut held = self.adapters.write().unwrap_or_else(|e| e.into_inner());
        match held.remove(name) {
            Some(_) => {
                tracing::info!(lora = name, "LoRA adapter unloaded");
                Ok(())
            }
            None => Err(LoraError::NotFound(name.to_string())),
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<LoraAdapter>> {
        self.read().get(name).cloned()
    }

    /// Every adapter served, by name.
    pub fn list(&self) -> Vec<Arc<LoraAdapter>> {
        self.read().values().cloned().collect()
    }
}

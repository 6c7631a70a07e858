//! LoRA adapters behind the handle: each decoder that runs them holds a
//! [`LoraRegistry`]; a request names an adapter as its `model` and gets a [`ModelHandle`] of
//! the base bound to that adapter, whose sequences carry it (and its prefix-cache key).

use std::path::Path;
use std::sync::Arc;

use super::{Backend, EngineHandle, ModelHandle};
use crate::api::ModelCard;
use crate::error::{EngineError, Result};
use crate::lora::base::{self, Choice};
use crate::lora::{BaseCandidate, LoraConfig, LoraCounts, LoraError, LoraRef, LoraRegistry};

/// A base model seen through one of its adapters.
pub(super) struct AdapterView {
    pub(super) adapter: Arc<LoraRef>,
    /// The base's card, named after the adapter, rooted at its folder.
    pub(super) card: ModelCard,
}

/// An adapter as `/v1/models` lists it.
#[derive(Debug, Clone)]
pub struct AdapterCard {
    pub name: String,
    /// The adapter's folder.
    pub root: String,
    /// The served name of its base model.
    pub parent: String,
    pub max_model_len: usize,
}

impl ModelHandle {
    /// The registry of the adapters this decoder runs (`None`: it runs none).
    fn registry(&self) -> Option<&Arc<LoraRegistry>> {
        match &self.inner.backend {
            Backend::Decoder(d) => d.lora.as_ref(),
            Backend::Encoder(_) => None,
        }
    }

    /// The served name of the base model (the card's name for a model without an adapter).
    pub fn base_name(&self) -> &str {
        &self.inner.card.name
    }

    /// The adapter requests through this handle run with.
    pub fn lora(&self) -> Option<&Arc<LoraRef>> {
        self.lora.as_ref().map(|v| &v.adapter)
    }

    /// How often this decoder read adapters' factors and evicted them (`None`: it runs no
    /// adapters).
    pub fn lora_counts(&self) -> Option<LoraCounts> {
        self.registry().map(|r| r.counts())
    }

    /// The adapters whose factors this decoder holds, least recently used first.
    pub fn lora_held(&self) -> Vec<String> {
        self.registry().map(|r| r.held()).unwrap_or_default()
    }

    fn with_adapter(&self, adapter: Arc<LoraRef>) -> ModelHandle {
        let mut card = self.inner.card.clone();
        card.name = adapter.name.clone();
        card.root = adapter.path.clone();
        ModelHandle {
            inner: self.inner.clone(),
            lora: Some(Arc::new(AdapterView { adapter, card })),
        }
    }
}

impl EngineHandle {
    /// The base model bound to the adapter served as `name`, if one is.
    pub fn adapter(&self, name: &str) -> Option<ModelHandle> {
        self.inner.iter().find_map(|m| {
            let adapter = m.registry()?.get(name)?;
            Some(m.with_adapter(adapter))
        })
    }

    /// Every adapter served, base by base.
    pub fn adapter_cards(&self) -> Vec<AdapterCard> {
        self.inner
            .iter()
            .filter_map(|m| Some((m, m.registry()?)))
            .flat_map(|(m, reg)| {
                reg.list().into_iter().map(|a| AdapterCard {
                    name: a.name.clone(),
                    root: a.path.clone(),
                    parent: m.inner.card.name.clone(),
                    max_model_len: m.inner.card.max_model_len,
                })
            })
            .collect()
    }

    /// Whether any served model runs adapters (`--enable-lora`).
    pub fn lora_enabled(&self) -> bool {
        self.inner.iter().any(|m| m.registry().is_some())
    }

    /// The decoder adapter `name` (folder `path`) attaches to: the one served as `base` when
    /// the load names it (`--lora-modules`' `base_model_name`), else the one the adapter's
    /// recorded `base_model_name_or_path` names ([`base::choose`]); `other_names` gives each
    /// served model's names besides its served name and checkpoint (aliases, the hub id it
    /// was given as).
    fn lora_base(
        &self,
        name: &str,
        path: &Path,
        base: Option<&str>,
        other_names: &dyn Fn(&str) -> Vec<String>,
    ) -> std::result::Result<&ModelHandle, LoraError> {
        if let Some(b) = base {
            let m = self
                .inner
                .iter()
                .find(|m| m.inner.card.name == b)
                .ok_or_else(|| {
                    LoraError::NotEnabled(format!("base_model_name {b} is not a served model"))
                })?;
            return m.registry().map(|_| m).ok_or_else(|| not_runnable(m));
        }
        let candidates: Vec<BaseCandidate> = self
            .inner
            .iter()
            .map(|m| {
                let card = &m.inner.card;
                let mut names = vec![card.name.clone(), card.root.clone()];
                names.extend(other_names(&card.name));
                BaseCandidate {
                    served: card.name.clone(),
                    names,
                    runs_adapters: m.registry().is_some(),
                }
            })
            .collect();
        let recorded = base::recorded_base(path);
        match base::choose(
            name,
            &path.display().to_string(),
            recorded.as_deref(),
            &candidates,
        ) {
            Ok(i) => Ok(&self.inner[i]),
            Err(Choice::CannotRun(i)) => Err(not_runnable(&self.inner[i])),
            Err(Choice::NoneRun) => Err(not_enabled()),
            Err(Choice::Refused(e)) => Err(e),
        }
    }

    /// Loads the PEFT folder `path` as adapter `name` on `base`, or, when `None`, on the
    /// decoder its recorded base names (the only one that runs adapters when it names none).
    /// Refused: a name taken by a served model or an adapter, an ambiguous base, files that
    /// do not fit. Past `--max-cpu-loras` the least recently used idle adapter's factors make
    /// room (it stays served). Returns the base's served name.
    pub fn load_lora(
        &self,
        name: &str,
        path: &Path,
        base: Option<&str>,
    ) -> std::result::Result<String, LoraError> {
        self.load_lora_on(name, path, base, &|_| Vec::new())
    }

    /// [`Self::load_lora`] with no base named, where `other_names(served name)` lists a
    /// model's further names (the gateway's aliases and the id each model was given as), so
    /// that an adapter recording a hub id finds the model served from it.
    pub fn load_lora_matching(
        &self,
        name: &str,
        path: &Path,
        other_names: &dyn Fn(&str) -> Vec<String>,
    ) -> std::result::Result<String, LoraError> {
        self.load_lora_on(name, path, None, other_names)
    }

    fn load_lora_on(
        &self,
        name: &str,
        path: &Path,
        base: Option<&str>,
        other_names: &dyn Fn(&str) -> Vec<String>,
    ) -> std::result::Result<String, LoraError> {
        if self.inner.iter().any(|m| m.inner.card.name == name) {
            return Err(LoraError::NameTaken(name.to_string()));
        }
        if self.adapter(name).is_some() {
            return Err(LoraError::Exists(name.to_string()));
        }
        let target = self.lora_base(name, path, base, other_names)?;
        let registry = target.registry().ok_or_else(|| not_runnable(target))?;
        registry.load(name, path)?;
        Ok(target.inner.card.name.clone())
    }

    /// Stops serving adapter `name`; its requests in flight finish.
    pub fn unload_lora(&self, name: &str) -> std::result::Result<(), LoraError> {
        for m in self.inner.iter() {
            if let Some(reg) = m.registry() {
                if reg.get(name).is_some() {
                    return reg.unload(name);
                }
            }
        }
        if !self.lora_enabled() {
            return Err(not_enabled());
        }
        Err(LoraError::NotFound(name.to_string()))
    }

    /// Loads `--lora-modules` at start-up; the first that fails stops the start, naming it.
    pub(super) fn load_static_loras(&self, config: &LoraConfig) -> Result<()> {
        for module in &config.modules {
            self.load_lora(
                &module.name,
                Path::new(&module.path),
                module.base_model_name.as_deref(),
            )
            .map_err(EngineError::Lora)?;
        }
        Ok(())
    }
}

fn not_enabled() -> LoraError {
    LoraError::NotEnabled(
        "LoRA adapters are not served: start the server with --enable-lora and a generation model"
            .into(),
    )
}

/// Why `m` runs no adapters.
fn not_runnable(m: &ModelHandle) -> LoraError {
    let card = &m.inner.card;
    let why = if card.device != "cpu" {
        format!(
            "the GPU decoder ({}) does not run LoRA adapters; serve it with --device cpu",
            card.device
        )
    } else if matches!(m.inner.backend, Backend::Encoder(_)) {
        "it is not a generation model".to_string()
    } else {
        "its architecture does not run LoRA adapters here (Llama-family text decoders do)"
            .to_string()
    };
    LoraError::NotEnabled(format!(
        "model {} cannot serve LoRA adapters: {why}",
        card.name
    ))
}

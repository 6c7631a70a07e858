//! LoRA adapters, as vLLM serves them: PEFT folders (`adapter_config.json`,
//! `adapter_model.safetensors`) applied to a decoder's q/k/v/o and gate/up/down projections.
//!
//! An adapter adds `scale · B·A·x` to a projection's output `W·x`, with `A` of `r × in`, `B` of
//! `out × r` and `scale = alpha / r` (`alpha / √r` with rsLoRA). The base weights are never
//! touched: a step runs the base projections over every row as before, then adds each row's
//! own adapter delta ([`delta`]), so sequences with different adapters and none share one
//! batch. A row's delta is computed on its own, in a fixed order, so its numbers do not depend
//! on what else is in the batch.
//!
//! Module map: [`config`] reads and checks `adapter_config.json`; [`adapter`] reads the
//! factors and fits them to the base's projections ([`LoraTargets`]); [`base`] picks the
//! served model an adapter attaches to when its load names none; [`registry`] holds the
//! adapters a decoder serves (start-up and runtime loads); [`delta`] applies them in a step.

pub mod adapter;
pub mod base;
pub mod config;
pub mod delta;
pub mod registry;

pub use crate::error::LoraError;
pub use adapter::{LoraAdapter, LoraPair};
pub use base::BaseCandidate;
pub use config::AdapterConfig;
pub use delta::StepLoras;

/// Reads of an adapter's factors from its folder: at its load, and again for a request after
/// `--max-cpu-loras` evicted them (ours: vLLM has none).
pub const LORA_LOADS: &str = "gateway:lora_adapter_loads_total";
/// Adapters whose factors were dropped from memory to make room under `--max-cpu-loras`
/// (still served: they are read again on their next request).
pub const LORA_EVICTIONS: &str = "gateway:lora_adapter_evictions_total";
pub use registry::{Acquired, LoraCounts, LoraRef, LoraRegistry, LoraSettings};

/// `--enable-lora` and its adapters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraConfig {
    pub settings: LoraSettings,
    /// `--lora-modules`, served from the start.
    pub modules: Vec<LoraModule>,
}

/// One `--lora-modules` entry: `name=path`, or its JSON form with `base_model_name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    pub name: String,
    pub path: String,
    /// The served model it applies to (default: the decoder its recorded
    /// `base_model_name_or_path` names, see [`base`]).
    pub base_model_name: Option<String>,
}

/// The projections an adapter may target, in a layer's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    pub const fn index(self) -> usize {
        self as usize
    }
}

/// What an adapter must fit: the base decoder's layer count and projection widths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraTargets {
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    /// The base's Q and K rows are stored permuted as llama.cpp's converter permutes Llama
    /// checkpoints (adjacent RoPE pairs); an adapter's `B` rows of q and k get the same
    /// permutation so that its delta lands on the rows the base computes.
    pub qk_permuted: bool,
}

impl LoraTargets {
    /// `(in, out)` of a projection.
    pub fn dims(&self, p: Proj) -> (usize, usize) {
        let q = self.n_heads * self.head_dim;
        let kv = self.n_kv_heads * self.head_dim;
        match p {
            Proj::Q => (self.hidden, q),
            Proj::K | Proj::V => (self.hidden, kv),
            Proj::O => (q, self.hidden),
            Proj::Gate | Proj::Up => (self.hidden, self.ffn),
            Proj::Down => (self.ffn, self.hidden),
        }
    }

    /// Bytes an adapter of rank `rank` holds at most: f32 `A` (`r x in`) and `Bᵀ` (`r x out`)
    /// on every projection of every layer.
    pub fn max_adapter_bytes(&self, rank: usize) -> u64 {
        let per_layer: usize = Proj::ALL
            .iter()
            .map(|&p| {
                let (i, o) = self.dims(p);
                i + o
            })
            .sum();
        (self.n_layers as u64)
            .saturating_mul(per_layer as u64)
            .saturating_mul(rank as u64)
            .saturating_mul(4)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The projections of `tests/data/tiny-llama`, which the test adapters fit.
    pub(crate) fn tiny_llama_targets() -> LoraTargets {
        LoraTargets {
            n_layers: 2,
            hidden: 64,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            ffn: 160,
            qk_permuted: false,
        }
    }

    #[test]
    fn an_adapter_at_most_covers_every_projection_of_every_layer() {
        let t = LoraTargets {
            n_layers: 2,
            hidden: 8,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            ffn: 16,
            qk_permuted: false,
        };
        // q 8+8, k 8+4, v 8+4, o 8+8, gate 8+16, up 8+16, down 16+8 = 128 per layer.
        assert_eq!(t.max_adapter_bytes(3), 2 * 128 * 3 * 4);
    }
}

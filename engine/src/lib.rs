//! Models and serving.
//!
//! The engine owns tokenizers, chat templates, the models themselves, the paged KV cache, the
//! scheduler and sampling. The async side (the gateway) talks to it only through [`handle`].
//!
//! Module map (one job each):
//! - [`error`]: the engine's error type.
//! - [`model`]: the traits a model implements ([`model::CausalLm`], [`model::EmbeddingModel`])
//!   and the paged KV cache storage the decoder writes into.
//! - [`gguf`], [`hf`]: file readers (GGUF, HF folders: config, safetensors, tokenizer files).
//! - [`families`]: the registry, one file per model family, by architecture name.
//! - [`load`]: from a path (or the weight cache's maps) to a model, through the registry.
//! - [`lora`]: LoRA adapters (PEFT folders), their registry and their deltas in a step.
//! - [`tokenizer`]: GGUF vocab conversion into a `tokenizers` tokenizer.
//! - [`detok`]: incremental detokenisation and stop strings.
//! - [`device`]: `--device` / `--dtype`, resolved into the CPU or an opened CUDA device.
//! - [`metrics`]: engine metrics (vLLM names) through the `metrics` facade.
//! - [`chat_template`]: HF chat templates with minijinja.
//! - [`models`]: the model code the families share (Llama-shaped decoder, BERT-shaped encoder,
//!   vision and audio towers).
//! - [`sampling`], [`block_manager`], [`scheduler`]: serving.
//! - [`constraint`]: structured outputs (llguidance) and the other per-request token rules.
//! - [`api`]: the request and output types the gateway uses.
//! - [`handle`]: the engine handle the gateway holds.
//! - [`weight_cache`]: the `preload` daemon and the `ipc_cache` loader.

pub mod api;
pub mod block_manager;
pub mod chat_template;
pub mod constraint;
pub mod detok;
pub mod device;
pub mod error;
pub mod families;
mod fault;
pub mod gguf;
pub mod handle;
pub mod hf;
mod json_close;
pub mod load;
pub mod lora;
pub mod metrics;
pub mod model;
pub mod models;
pub mod sampling;
pub mod scheduler;
pub mod share;
#[cfg(test)]
mod test_log;
pub mod tokenizer;
pub mod weight_cache;
pub mod weight_summary;

pub use error::EngineError;

//! The gateway: the OpenAI-compatible HTTP face of the server.
//!
//! - [`cli`]: flags (as `vllm serve` spells them) and `--config` YAML.
//! - [`state`]: start-up validation and the shared state.
//! - [`served`]: the names models are served under (aliases) and what each was given as.
//! - [`generation_config`]: each model's request defaults (`--generation-config`).
//! - [`hub`]: hub ids: found in the local Hugging Face cache, or downloaded into it.
//! - [`lora`]: the LoRA flags and the switch of the runtime adapter routes.
//! - [`http`]: our JSON extractor, the tower stack (request id, trace, catch-panic, auth,
//!   overload, body limit, timeout), SSE framing.
//! - [`policy`]: the policy layers over the typed request (trust gate, merge, bounds, limits).
//! - [`protocol`]: wire types.
//! - [`routes`]: one file per route, and the helpers they share.
//! - [`parsers`]: tool calls and reasoning read out of a reply.
//! - [`app`]: the service every connection runs (front stack and dispatcher); [`serve`] runs it.
//! - [`error`]: the one error type and its envelope.
//! - [`contract_cmd`], [`upgrade_check`]: checks of a running deployment.

pub mod app;
pub mod cli;
pub mod contract_cmd;
pub mod error;
pub mod generation_config;
pub mod http;
pub mod hub;
pub mod lora;
pub mod memory;
pub mod parsers;
pub mod policy;
pub mod preload;
pub mod protocol;
pub mod routes;
pub mod serve;
pub mod served;
pub mod state;
pub mod upgrade_check;

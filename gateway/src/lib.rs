//! The gateway: the OpenAI-compatible HTTP face of the server.
//!
//! - [`cli`]: flags (as `vllm serve` spells them) and `--config` YAML.
//! - [`state`]: start-up validation and the shared state.
//! - [`http`]: our JSON extractor, the tower stack (request id, trace, catch-panic, auth,
//!   overload, body limit, timeout), SSE framing.
//! - [`policy`]: the policy layers over the typed request (trust gate, merge, bounds, limits).
//! - [`protocol`]: wire types.
//! - [`routes`]: one file per route, and the helpers they share.
//! - [`parsers`]: tool calls and reasoning read out of a reply.
//! - [`app`]: the service every connection runs (front stack and dispatcher); [`serve`] runs it.
//! - [`error`]: the one error type and its envelope.

pub mod app;
pub mod cli;
pub mod contract_cmd;
pub mod error;
pub mod http;
pub mod memory;
pub mod parsers;
pub mod policy;
pub mod preload;
pub mod protocol;
pub mod routes;
pub mod serve;
pub mod state;

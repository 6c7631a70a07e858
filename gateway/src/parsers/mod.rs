//! What the gateway reads out of a model's reply: tool calls (`--tool-call-parser` and the
//! `tool_choice` modes) and reasoning (`--reasoning-parser`), as vLLM's parsers do.

pub mod pythonic;
pub mod reasoning;
pub mod tools;

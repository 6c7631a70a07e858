//! The HTTP face: our JSON extractor, the tower stack, SSE framing.

pub mod auth;
pub mod extract;
pub mod front;
pub mod listener;
pub mod options;
pub mod overload;
pub mod request_memory;
pub mod sse;
pub mod stack;
pub mod tls;

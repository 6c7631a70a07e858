//! The contract suite: checks a running server against CONTRACT.md over HTTP.
//!
//! [`run`] discovers the server's models, builds every case for the configured
//! [`ServerMode`], runs them concurrently and returns a [`Report`]. The gateway exposes it
//! as `gateway contract --base-url URL ...`; the integration tests in `tests/` start the
//! real binary and run it (plus start-up and media-fetch checks).
//!
//! Cases, one module per concern: [`cases::gate`] (the trust-gate matrix),
//! [`cases::ordering`] (validation, model check and gate order), [`cases::media`]
//! (refusals fetch nothing), [`cases::validation`], [`cases::errors`], [`cases::meta`],
//! [`cases::auth`], [`cases::streaming`], [`cases::ids`].

pub mod cases;
pub mod config;
pub mod expect;
pub mod http;
pub mod models;
pub mod report;
pub mod routes;
pub mod runner;
pub mod sse;

pub use config::{ServerMode, SuiteConfig};
pub use report::{CaseResult, Report};
pub use runner::run;

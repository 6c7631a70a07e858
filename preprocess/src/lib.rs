//! Media in, tensors out.
//!
//! Everything between a content part's URL and the tensor a model consumes:
//!
//! * [`fetch`]: `data:`, `http(s)` and `file:` URLs under the rules of
//!   CONTRACT section 4 (SSRF refusal, pinned addresses, hand-followed
//!   redirects, size caps while streaming, per-modality timeouts);
//! * [`image`], [`audio`], [`video`]: decoding with caps checked before the
//!   work they protect, and the model-side processors (CLIP/SigLIP resize and
//!   normalise, Qwen2-VL smart resize into patches, Whisper log-mel, uniform
//!   frame sampling);
//! * [`pool`]: the bounded blocking pool all decoding runs on, so the async
//!   reactor never decodes and a flood of media gets a 503, not unbounded
//!   memory;
//! * [`estimate`], [`budget`]: an item's tokens and decoded bytes from its header, checked
//!   against the context left and the server's decoded-media budget before decoding.

pub mod audio;
pub mod budget;
pub mod cache;
pub mod error;
pub mod estimate;
pub mod fetch;
pub mod image;
pub mod pipeline;
pub mod pool;
pub mod video;

pub use error::PreprocessError;
pub use media::{ContentHash, Modality};

//! Model code, one model family per file.

pub mod bert;
pub(crate) mod layers;
pub mod llama;
pub mod media;
pub mod qwen2_audio;
pub mod qwen2_vl;

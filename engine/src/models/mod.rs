//! Model code, one model family per file.

pub mod bert;
pub mod llama;
pub mod qwen2_vl;

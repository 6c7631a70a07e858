//! The model code the families of [`crate::families`] share: the Llama-shaped decoder, the
//! BERT-shaped encoders (BERT, ModernBERT), the vision and audio towers, and the layers those towers share.

pub mod bert;
pub(crate) mod layers;
pub mod llama;
pub mod media;
pub mod modernbert;
pub mod qwen2_audio;
pub mod qwen2_vl;

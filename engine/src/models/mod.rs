//! The model code the families of [`crate::families`] share: the Llama-shaped decoder, the
//! BERT-shaped encoder, the vision and audio towers, and the layers those towers share.

pub mod bert;
pub(crate) mod layers;
pub mod llama;
pub mod media;
pub mod qwen2_audio;
pub mod qwen2_vl;

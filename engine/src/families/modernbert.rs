//! ModernBERT sequence classifiers (the mxbai-rerank-v2 / gte-reranker-modernbert shape):
//! RoPE, alternating global and sliding-window attention, GeGLU, on
//! [`crate::models::modernbert`].

use super::{Build, EncoderHeadKind, Family};

pub static MODERNBERT_CLASSIFIER: Family = Family {
    name: "ModernBERT classifier",
    hf_architectures: &["ModernBertForSequenceClassification"],
    gguf_architectures: &[],
    build: Build::Encoder(EncoderHeadKind::ModernBertClassifier),
};

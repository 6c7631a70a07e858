//! RoBERTa and XLM-RoBERTa sequence classifiers (the bge-reranker shape): BERT's encoder with
//! RoBERTa's position offset and a dense + out-projection head on the first token.

use super::{Build, EncoderHeadKind, Family};
use crate::models::bert::ClassifierLayout;

pub static ROBERTA_CLASSIFIER: Family = Family {
    name: "RoBERTa classifier",
    hf_architectures: &[
        "XLMRobertaForSequenceClassification",
        "RobertaForSequenceClassification",
    ],
    gguf_architectures: &[],
    build: Build::Encoder(EncoderHeadKind::Classifier(ClassifierLayout::Roberta)),
};

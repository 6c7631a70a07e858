//! BERT: embedding models (pooling and normalisation from the sentence-transformers files)
//! and sequence classifiers (pooler + classifier on [CLS]), both on
//! [`crate::models::bert`].

use super::{Build, EncoderHeadKind, Family};
use crate::models::bert::ClassifierLayout;

pub static BERT: Family = Family {
    name: "BERT",
    hf_architectures: &["BertModel", "BertForMaskedLM", "BertForPreTraining"],
    gguf_architectures: &[],
    build: Build::Encoder(EncoderHeadKind::Embedding),
};

pub static BERT_CLASSIFIER: Family = Family {
    name: "BERT classifier",
    hf_architectures: &["BertForSequenceClassification"],
    gguf_architectures: &[],
    build: Build::Encoder(EncoderHeadKind::Classifier(ClassifierLayout::Bert)),
};

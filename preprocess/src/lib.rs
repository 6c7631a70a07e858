//! preprocess

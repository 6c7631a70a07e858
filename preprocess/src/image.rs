//! image: decoding and model-side processing (issue 4; being written).

/// Errors of image decoding and processing; every one is a 400 naming the problem.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("Invalid image: {0}")]
    Invalid(String),
}

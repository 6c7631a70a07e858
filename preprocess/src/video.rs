//! video: decoding and model-side processing (issue 4; being written).

/// Errors of video decoding and processing; every one is a 400 naming the problem.
#[derive(Debug, thiserror::Error)]
pub enum VideoError {
    #[error("Invalid video: {0}")]
    Invalid(String),
}

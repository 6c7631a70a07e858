//! audio: decoding and model-side processing (issue 4; being written).

/// Errors of audio decoding and processing; every one is a 400 naming the problem.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    #[error("Invalid audio: {0}")]
    Invalid(String),
}

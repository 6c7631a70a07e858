//! The engine's error type. The gateway maps each variant to an HTTP status once.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    /// A checkpoint file is missing, unsupported or corrupt. Names the file and, where known,
    /// the tensor.
    #[error("cannot load {file}: {reason}")]
    Load { file: String, reason: String },
    /// The client asked for something invalid that only the engine can see (e.g. a token id
    /// outside the vocabulary). Maps to 400; `param` names the field.
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
    },
    /// The model does not support the requested task (e.g. classify on an embedding model).
    #[error("Unsupported task: '{task}'")]
    UnsupportedTask { task: String },
    /// The engine cannot take more work now (queue full). Maps to 503 with Retry-After.
    #[error("engine is overloaded: {0}")]
    Overloaded(String),
    /// The engine thread is gone.
    #[error("engine is not running")]
    Stopped,
    /// A CUDA backend was requested but is not available in this build or on this machine.
    #[error("CUDA backend unavailable: {0}")]
    BackendUnavailable(String),
    /// Chat template rendering failed (a template error or a `raise_exception` call).
    #[error("chat template error: {0}")]
    Template(String),
    /// A LoRA adapter cannot be loaded, found or served ([`crate::lora::LoraError`]).
    #[error(transparent)]
    Lora(#[from] crate::lora::LoraError),
    /// A bug: an invariant did not hold. Maps to 500.
    #[error("internal engine error: {0}")]
    Internal(String),
}

impl EngineError {
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        EngineError::InvalidRequest {
            message: message.into(),
            param: param.map(str::to_string),
        }
    }
    pub fn load(file: impl Into<String>, reason: impl Into<String>) -> Self {
        EngineError::Load {
            file: file.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

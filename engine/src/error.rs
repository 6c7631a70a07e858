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
    /// A LoRA adapter cannot be loaded, found or served.
    #[error(transparent)]
    Lora(#[from] LoraError),
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

/// Why an adapter cannot be loaded or found. Every message names the adapter.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LoraError {
    /// Its files do not make an adapter this base can run (missing file, bad config, an
    /// unsupported PEFT type or DoRA, shapes or modules that do not fit, a rank over the
    /// limit).
    #[error("LoRA adapter '{name}' at {path}: {reason}")]
    Invalid {
        name: String,
        path: String,
        reason: String,
    },
    /// vLLM's answer to loading a name twice.
    #[error("The lora adapter '{0}' has already been loaded.")]
    Exists(String),
    /// Several served models could take the adapter, and the base its config records names
    /// none of them (or several). Names `lora_path`: the adapter's files decide.
    #[error("cannot choose the base model of LoRA adapter '{name}' at {path}: {why} ({candidates}); set base_model_name_or_path in its adapter_config.json to one of these served names")]
    NoBase {
        name: String,
        path: String,
        why: String,
        candidates: String,
    },
    /// The name is a served model's.
    #[error("cannot load LoRA adapter '{0}': a served model has that name")]
    NameTaken(String),
    /// vLLM's answer to unloading an unknown name.
    #[error("The lora adapter '{0}' cannot be found.")]
    NotFound(String),
    /// The deployment does not serve adapters.
    #[error("{0}")]
    NotEnabled(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

//! The crate's error type. Each variant says which HTTP class it belongs to
//! ([`PreprocessError::kind`]); the gateway maps kinds to statuses once.

use crate::Modality;

/// How the gateway should answer an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: the request's media is invalid, undecodable or over a limit.
    BadRequest,
    /// 422: fetching failed (upstream error, size cap while downloading, timeout).
    Unprocessable,
    /// 503: the decode pool is full.
    Overloaded,
}

#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    /// A URL policy decision (SSRF, domains, data URL syntax, `file:` rules).
    #[error(transparent)]
    Policy(#[from] policies::PolicyError),
    #[error(transparent)]
    Image(#[from] crate::image::ImageError),
    #[error(transparent)]
    Audio(#[from] crate::audio::AudioError),
    #[error(transparent)]
    Video(#[from] crate::video::VideoError),
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    /// A part with a uuid and no data whose uuid is not cached (CONTRACT section 4).
    #[error(transparent)]
    CacheMiss(#[from] crate::cache::CacheMiss),
    #[error("The media decoding queue is full; retry later.")]
    Overloaded,
    /// A decoder job failed unexpectedly (a bug, logged); the client sees a 400.
    #[error("The media could not be decoded (the decoder failed).")]
    DecoderFailed,
    /// The model has no processor for this modality (the gateway checks modalities first).
    #[error("The model does not accept {modality} input.")]
    NotAccepted { modality: Modality },
    /// A JPEG frame list (`data:video/jpeg;base64,<f1>,<f2>,...`) sent as something else.
    #[error("A list of JPEG frames can only be sent as video, not as {modality}.")]
    WrongPayload { modality: Modality },
    #[error("Decoding the {modality} took longer than {seconds} s.")]
    DecodeTimeout { modality: Modality, seconds: f64 },
    /// A model's processor files are unreadable or invalid (a start-up error).
    #[error("{0}")]
    Config(String),
}

impl PreprocessError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            PreprocessError::Fetch(e) => e.kind(),
            PreprocessError::Overloaded => ErrorKind::Overloaded,
            _ => ErrorKind::BadRequest,
        }
    }
}

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
    /// 503: the decode pool or the decoded-media byte budget is full.
    Overloaded,
}

#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    /// A URL policy decision (SSRF, domains, data URL syntax, `file:` rules).
    #[error(transparent)]
    Policy(#[from] policies::PolicyError),
    /// A request option the loader or processor of this item's modality cannot honour.
    #[error(transparent)]
    Options(#[from] policies::OptionError),
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
    /// The media's placeholder tokens, counted from their headers, do not fit in the context
    /// the text leaves (found before any decoding).
    #[error(
        "The {item} ({size}) needs {tokens} prompt tokens; this request's media need {total} \
         tokens in all, but only {available} tokens of the model's context are left for media \
         after the text. Send smaller media or lower max_pixels."
    )]
    OverTokenBudget {
        item: String,
        size: String,
        tokens: usize,
        total: usize,
        available: usize,
    },
    /// A server-wide media budget (`stage`: `downloading` for fetched bytes, `decoding` for
    /// decoded ones) is taken by other requests.
    #[error(
        "The server is {stage} too much media at once (this item needs {} MiB more, {} MiB of \
         {} MiB are in use); retry later.",
        .needed.div_ceil(1 << 20), .in_use >> 20, .capacity >> 20
    )]
    MediaBusy {
        stage: &'static str,
        needed: usize,
        in_use: usize,
        capacity: usize,
    },
    /// One item needs more decoded bytes than the whole server budget: a retry cannot help.
    #[error(
        "The {item} ({size}) would hold {} MiB while decoding, more than the server's {} MiB \
         budget for decoded media.",
        .needed.div_ceil(1 << 20), .capacity >> 20
    )]
    MediaTooLarge {
        item: String,
        size: String,
        needed: usize,
        capacity: usize,
    },
    /// A model's processor files are unreadable or invalid (a start-up error).
    #[error("{0}")]
    Config(String),
}

impl PreprocessError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            PreprocessError::Fetch(e) => e.kind(),
            PreprocessError::Overloaded | PreprocessError::MediaBusy { .. } => {
                ErrorKind::Overloaded
            }
            _ => ErrorKind::BadRequest,
        }
    }
}

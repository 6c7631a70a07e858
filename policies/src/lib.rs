//! Pure request-policy decisions. No network; the only filesystem access is
//! loading the trusted-client policy file at start-up and canonicalising the
//! paths of `file:` URLs.
//!
//! The gateway runs these in order over every typed request (CONTRACT sections
//! 2-5, 8):
//!
//! 1. [`gate`]: the multimodal trust gate (shape check of `mm_processor_kwargs` /
//!    `media_io_kwargs`, then refusal of non-empty ones from untrusted clients).
//! 2. [`merge`](mod@merge): deployment defaults merged with a trusted request's kwargs, then
//!    typed validation of known keys, giving the typed [`options`] the media pipeline takes.
//! 3. [`profile`]: the trusted-client profile's bounds on the merged kwargs.
//! 4. [`limits`]: per-prompt media item limits.
//! 5. [`media_url`]: media URL decisions (schemes, data URLs, allowed domains, local paths) and
//!    SSRF address classification ([`ip`]).
//!
//! Every refusal is a [`PolicyError`], which carries the message, `param`, HTTP
//! status and error type the HTTP layer puts in the OpenAI-shaped error body.

// Tests may unwrap; the library build keeps the workspace's unwrap/expect lints.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod error;
pub mod gate;
pub mod ip;
pub mod limits;
pub mod media_url;
pub mod merge;
pub mod options;
pub mod profile;

pub use error::{KwargsField, PolicyError};
pub use gate::{check_trust_gate, is_non_empty_kwargs, validate_kwargs_shape};
pub use ip::{classify_ip, IpClass};
pub use limits::{LimitMmPerPrompt, VLLM_DEFAULT_LIMIT_PER_MODALITY};
pub use media_url::{
    base64_encoded_len, check_ip_is_public, parse_media_url, DataUrl, MediaUrl, MediaUrlPolicy,
    DEFAULT_MAX_DATA_URL_BYTES, DEFAULT_MAX_MEDIA_BYTES, MAX_DATA_URL_HEADER_BYTES, MAX_REDIRECTS,
};
pub use merge::{
    is_startup_only_key, merge, DeploymentDefaults, KwargsMap, MergedKwargs, IMAGE_MODES,
    STARTUP_ONLY_KEYS,
};
pub use options::{
    AudioLoadOptions, ImageLoadOptions, ImageMode, MediaOptions, OptionError, ProcessorOptions,
    VideoLoadOptions,
};
pub use profile::TrustedClientPolicy;

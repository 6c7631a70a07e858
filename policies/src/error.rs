//! The one error type of the policy layer.
//!
//! Every variant carries what the HTTP layer needs to build the OpenAI-shaped
//! error body: [`PolicyError::message`] (the full message exactly as the client
//! sees it), [`PolicyError::param`], [`PolicyError::status`] and
//! [`PolicyError::error_type`]. The gateway maps it to a response in one place.
//!
//! Request-time variants are all `400 BadRequestError`. The start-up variants
//! (bad `--mm-processor-kwargs`, `--media-io-kwargs`, `--limit-mm-per-prompt`,
//! trusted-client policy file or schema) are meant to stop the server before it
//! listens; should one ever reach a client it is a server bug, so they report
//! `500 InternalServerError`.

use std::fmt;
use std::net::IpAddr;

use crate::ip::IpClass;

/// Which of the two per-request kwargs fields an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KwargsField {
    /// `mm_processor_kwargs`: arguments for the multimodal processor.
    MmProcessorKwargs,
    /// `media_io_kwargs`: arguments for media loading, keyed by modality.
    MediaIoKwargs,
}

impl KwargsField {
    /// The request field name, e.g. `"mm_processor_kwargs"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KwargsField::MmProcessorKwargs => "mm_processor_kwargs",
            KwargsField::MediaIoKwargs => "media_io_kwargs",
        }
    }

    /// The CLI flag that sets the deployment default for this field.
    pub fn cli_flag(self) -> &'static str {
        match self {
            KwargsField::MmProcessorKwargs => "--mm-processor-kwargs",
            KwargsField::MediaIoKwargs => "--media-io-kwargs",
        }
    }

    /// What the field influences, as worded in the trust-gate message.
    fn resource_kind(self) -> &'static str {
        match self {
            KwargsField::MmProcessorKwargs => "preprocessing",
            KwargsField::MediaIoKwargs => "media loading",
        }
    }
}

impl fmt::Display for KwargsField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy decision that refuses a request (or a start-up configuration).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// The trust gate: per-request kwargs sent to a server that does not trust
    /// this client (CONTRACT section 2). The message is vLLM's, including its
    /// ` (parameter=...)` suffix.
    #[error(
        "Per-request {field} are disabled by default because they can change multimodal {kind} \
         resource usage. Start the server with --trust-request-mm-kwargs only when clients are \
         trusted. (parameter={field})",
        kind = field.resource_kind()
    )]
    KwargsNotTrusted {
        /// The offending field.
        field: KwargsField,
    },

    /// A kwargs field (or a modality entry inside `media_io_kwargs`) that is not
    /// a JSON object. `path` is the full dotted path, e.g. `media_io_kwargs.video`.
    #[error("Invalid value for {path}: expected a JSON object, got {got}")]
    KwargsNotObject {
        /// The field the value belongs to.
        field: KwargsField,
        /// Dotted path of the value.
        path: String,
        /// A short description of what was sent (`a string`, `a list`, ...).
        got: String,
    },

    /// A known key with a value of the wrong type or out of range.
    /// `path` is e.g. `media_io_kwargs.video.num_frames`.
    #[error("Invalid value for {path}: expected {expected}, got {got}")]
    InvalidKwarg {
        /// The field the key belongs to.
        field: KwargsField,
        /// Dotted path of the key.
        path: String,
        /// What a valid value looks like.
        expected: String,
        /// The value sent, as compact JSON.
        got: String,
    },

    /// A combination of keys that contradict each other (e.g. `min_pixels` above
    /// `max_pixels`).
    #[error("Invalid {field}: {reason}")]
    InconsistentKwargs {
        /// The field the keys belong to.
        field: KwargsField,
        /// Which keys and why.
        reason: String,
    },

    /// The merged kwargs break a bound of the trusted-client profile.
    /// `detail` names the key and the bound, e.g.
    /// `media_io_kwargs.video.num_frames: 128 is greater than the maximum of 64`.
    #[error("{detail}")]
    KwargsOutOfBounds {
        /// The field whose schema was violated.
        field: KwargsField,
        /// The full message.
        detail: String,
    },

    /// More media items of one modality than `--limit-mm-per-prompt` allows.
    #[error("At most {limit} {modality}(s) may be provided in one prompt.")]
    TooManyMediaItems {
        /// The modality (`image`, `video`, `audio`, ...); also the `param`.
        modality: String,
        /// The configured limit.
        limit: usize,
    },

    /// A media URL whose scheme is not `data`, `http`, `https` or `file`.
    #[error(
        "The URL scheme '{scheme}' is not supported for media; use a data:, http:, https: or \
         file: URL"
    )]
    UnsupportedUrlScheme {
        /// The scheme as sent (lower-cased).
        scheme: String,
    },

    /// A media server redirected to a scheme other than `http` or `https` (a `file:` target
    /// above all: a remote server must never make us read a local file).
    #[error(
        "The media URL redirected to a '{scheme}:' URL; redirects may only lead to http: or \
         https: URLs"
    )]
    RedirectScheme {
        /// The target's scheme (lower-cased).
        scheme: String,
    },

    /// A media URL that cannot be parsed at all.
    #[error("Invalid media URL: {reason}")]
    InvalidMediaUrl {
        /// Why it does not parse.
        reason: String,
    },

    /// A `data:` URL that is malformed or not base64.
    #[error("Invalid data URL: {reason}")]
    InvalidDataUrl {
        /// Why, e.g. "it is not base64-encoded (its header must end with ';base64')".
        reason: String,
    },

    /// A `data:` URL whose payload exceeds the configured bound (checked before
    /// decoding).
    #[error("The data URL payload is {len} bytes, more than the maximum of {max} bytes")]
    DataUrlTooLarge {
        /// Payload length in bytes (still base64).
        len: usize,
        /// The bound.
        max: usize,
    },

    /// An http(s) media URL whose host is not in `--allowed-media-domains`.
    #[error(
        "The media URL host '{host}' is not allowed; allowed domains: {allowed} (see \
         --allowed-media-domains)"
    )]
    MediaDomainNotAllowed {
        /// The normalised host.
        host: String,
        /// The allowed domains, comma-separated.
        allowed: String,
    },

    /// An http(s) media URL whose host is, or resolves to, a non-public address.
    #[error(
        "Media URL host '{host}' resolves to {ip}, {article} {class} address; fetching from \
         non-public addresses is refused (start with --allow-private-media-hosts or list the \
         host in --allowed-media-domains to allow it)",
        article = class.article(),
        class = class.description()
    )]
    NonPublicAddress {
        /// The host as in the URL.
        host: String,
        /// The address it resolved to.
        ip: IpAddr,
        /// Why the address is not public.
        class: IpClass,
    },

    /// Too many HTTP redirects while fetching one media URL.
    #[error("The media URL redirected more than {max} times")]
    TooManyRedirects {
        /// The bound.
        max: usize,
    },

    /// A `file:` URL while `--allowed-local-media-path` is not set.
    #[error(
        "Loading local files is disabled; start the server with --allowed-local-media-path to \
         allow file: URLs under a directory"
    )]
    LocalMediaDisabled,

    /// A `file:` URL outside `--allowed-local-media-path` (or one that cannot be
    /// resolved).
    #[error("The file path '{path}' is not allowed: {reason}")]
    LocalPathNotAllowed {
        /// The path as given in the URL.
        path: String,
        /// Why it is refused.
        reason: String,
    },

    /// Start-up: an invalid configuration value (`--mm-processor-kwargs`,
    /// `--media-io-kwargs`, `--limit-mm-per-prompt`, `--allowed-local-media-path`,
    /// ...).
    #[error("Invalid {option}: {reason}")]
    InvalidConfig {
        /// The option, e.g. `--media-io-kwargs`.
        option: String,
        /// What is wrong.
        reason: String,
    },

    /// Start-up: the trusted-client policy file cannot be read or parsed.
    #[error("Invalid trusted-client policy {source_name}: {reason}")]
    InvalidPolicyFile {
        /// The file path (or `<string>` when parsed from memory).
        source_name: String,
        /// What is wrong.
        reason: String,
    },

    /// Start-up: a JSON Schema in the trusted-client policy does not compile.
    #[error("Invalid JSON Schema for {target} in the trusted-client policy: {reason}")]
    InvalidSchema {
        /// The modality (`video`, `image`, ...) or `mm_processor_kwargs`.
        target: String,
        /// The compiler's complaint.
        reason: String,
    },
}

impl PolicyError {
    /// The full message as the client sees it.
    pub fn message(&self) -> String {
        match self.fixed_message() {
            Some(text) => text.to_string(),
            None => self.to_string(),
        }
    }

    /// The message of the variants whose text never varies, without formatting it (the gate's
    /// refusal is the hot error path). Equal to the `Display` text (tested).
    pub fn fixed_message(&self) -> Option<&'static str> {
        match self {
            PolicyError::KwargsNotTrusted {
                field: KwargsField::MmProcessorKwargs,
            } => Some(
                "Per-request mm_processor_kwargs are disabled by default because they can change \
                 multimodal preprocessing resource usage. Start the server with \
                 --trust-request-mm-kwargs only when clients are trusted. \
                 (parameter=mm_processor_kwargs)",
            ),
            PolicyError::KwargsNotTrusted {
                field: KwargsField::MediaIoKwargs,
            } => Some(
                "Per-request media_io_kwargs are disabled by default because they can change \
                 multimodal media loading resource usage. Start the server with \
                 --trust-request-mm-kwargs only when clients are trusted. \
                 (parameter=media_io_kwargs)",
            ),
            _ => None,
        }
    }

    /// The `param` of the error body: the request field (or modality) at fault.
    pub fn param(&self) -> Option<&str> {
        match self {
            PolicyError::KwargsNotTrusted { field }
            | PolicyError::KwargsNotObject { field, .. }
            | PolicyError::InvalidKwarg { field, .. }
            | PolicyError::InconsistentKwargs { field, .. }
            | PolicyError::KwargsOutOfBounds { field, .. } => Some(field.as_str()),
            PolicyError::TooManyMediaItems { modality, .. } => Some(modality),
            PolicyError::UnsupportedUrlScheme { .. }
            | PolicyError::RedirectScheme { .. }
            | PolicyError::InvalidMediaUrl { .. }
            | PolicyError::InvalidDataUrl { .. }
            | PolicyError::DataUrlTooLarge { .. }
            | PolicyError::MediaDomainNotAllowed { .. }
            | PolicyError::NonPublicAddress { .. }
            | PolicyError::TooManyRedirects { .. }
            | PolicyError::LocalMediaDisabled
            | PolicyError::LocalPathNotAllowed { .. }
            | PolicyError::InvalidConfig { .. }
            | PolicyError::InvalidPolicyFile { .. }
            | PolicyError::InvalidSchema { .. } => None,
        }
    }

    /// True for errors that belong to start-up configuration, not to a request.
    pub fn is_startup_error(&self) -> bool {
        matches!(
            self,
            PolicyError::InvalidConfig { .. }
                | PolicyError::InvalidPolicyFile { .. }
                | PolicyError::InvalidSchema { .. }
        )
    }

    /// The HTTP status: 400 for every request-time error, 500 for start-up
    /// errors (which must never reach a client).
    pub fn status(&self) -> u16 {
        if self.is_startup_error() {
            500
        } else {
            400
        }
    }

    /// The `type` of the error body.
    pub fn error_type(&self) -> &'static str {
        if self.is_startup_error() {
            "InternalServerError"
        } else {
            "BadRequestError"
        }
    }
}

/// A short description of a JSON value's type for error messages.
pub(crate) fn describe_json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A JSON value as compact text for an error message, shortened when long.
pub(crate) fn compact_json(value: &serde_json::Value) -> String {
    const MAX_CHARS: usize = 80;
    let text = value.to_string();
    if text.chars().count() <= MAX_CHARS {
        text
    } else {
        let head: String = text.chars().take(MAX_CHARS).collect();
        format!("{head}...")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn gate_messages_are_exact() {
        let mm = PolicyError::KwargsNotTrusted {
            field: KwargsField::MmProcessorKwargs,
        };
        assert_eq!(
            mm.message(),
            "Per-request mm_processor_kwargs are disabled by default because they can change \
             multimodal preprocessing resource usage. Start the server with \
             --trust-request-mm-kwargs only when clients are trusted. \
             (parameter=mm_processor_kwargs)"
        );
        assert_eq!(mm.message(), mm.to_string());
        assert_eq!(mm.param(), Some("mm_processor_kwargs"));
        assert_eq!(mm.status(), 400);
        assert_eq!(mm.error_type(), "BadRequestError");

        let media = PolicyError::KwargsNotTrusted {
            field: KwargsField::MediaIoKwargs,
        };
        assert_eq!(
            media.message(),
            "Per-request media_io_kwargs are disabled by default because they can change \
             multimodal media loading resource usage. Start the server with \
             --trust-request-mm-kwargs only when clients are trusted. \
             (parameter=media_io_kwargs)"
        );
        assert_eq!(media.message(), media.to_string());
        assert_eq!(media.param(), Some("media_io_kwargs"));
    }

    #[test]
    fn limit_message_and_param() {
        let e = PolicyError::TooManyMediaItems {
            modality: "image".into(),
            limit: 2,
        };
        assert_eq!(
            e.message(),
            "At most 2 image(s) may be provided in one prompt."
        );
        assert_eq!(e.param(), Some("image"));
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn startup_errors_are_not_bad_requests() {
        let e = PolicyError::InvalidConfig {
            option: "--media-io-kwargs".into(),
            reason: "expected a JSON object".into(),
        };
        assert!(e.is_startup_error());
        assert_eq!(e.status(), 500);
        assert_eq!(e.error_type(), "InternalServerError");
        assert_eq!(e.param(), None);
    }

    #[test]
    fn describe_and_compact() {
        assert_eq!(describe_json_type(&json!("x")), "a string");
        assert_eq!(describe_json_type(&json!([1])), "a list");
        assert_eq!(describe_json_type(&json!(1)), "a number");
        assert_eq!(compact_json(&json!("invalid")), "\"invalid\"");
        let long = json!("a".repeat(200));
        assert!(compact_json(&long).ends_with("..."));
        assert_eq!(compact_json(&long).chars().count(), 83);
    }
}

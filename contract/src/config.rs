//! What the suite is pointed at: the server, its keys, its models and its trust mode.

use std::time::Duration;

/// How the server under test treats per-request `mm_processor_kwargs` / `media_io_kwargs`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ServerMode {
    /// The default deployment: non-empty kwargs are refused (CONTRACT section 2).
    #[default]
    Default,
    /// Started with `--trust-request-mm-kwargs`: every client is trusted, no bounds.
    Trusted,
    /// A trusted-client profile (CONTRACT section 8): `trusted_key` may send kwargs
    /// (within the policy's bounds), `untrusted_key` keeps the default refusal.
    Profile {
        trusted_key: String,
        untrusted_key: String,
    },
}

/// The suite's configuration.
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    /// Base URL of the server, e.g. `http://127.0.0.1:8000` (no trailing `/v1`).
    pub base_url: String,
    /// The API key sent as `Authorization: Bearer ...` on ordinary cases. In profile mode,
    /// when unset, the untrusted key is used.
    pub api_key: Option<String>,
    /// Model for chat/completions/tokenize; discovered from `GET /v1/models` when unset.
    pub chat_model: Option<String>,
    /// Model for embeddings/pooling/score/rerank; discovered when unset.
    pub embedding_model: Option<String>,
    /// The server's trust mode.
    pub mode: ServerMode,
    /// A media server the gateway may fetch from (the integration tests run one that
    /// counts hits); when set, the suite sends media URLs under it alongside refused
    /// kwargs, which must be refused without any fetch.
    pub media_base_url: Option<String>,
    /// How many cases run at once.
    pub concurrency: usize,
    /// Per-request timeout.
    pub request_timeout: Duration,
}

impl SuiteConfig {
    /// A configuration for `base_url` with everything else at its default.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            chat_model: None,
            embedding_model: None,
            mode: ServerMode::Default,
            media_base_url: None,
            concurrency: 8,
            request_timeout: Duration::from_secs(60),
        }
    }

    /// The key ordinary (non-gate) cases authenticate with.
    pub fn effective_api_key(&self) -> Option<String> {
        match (&self.api_key, &self.mode) {
            (Some(key), _) => Some(key.clone()),
            (None, ServerMode::Profile { untrusted_key, .. }) => Some(untrusted_key.clone()),
            (None, _) => None,
        }
    }

    /// The base URL without a trailing slash (and without a trailing `/v1`, which
    /// OpenAI clients habitually append).
    pub fn normalized_base_url(&self) -> String {
        let trimmed = self.base_url.trim_end_matches('/');
        trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_is_normalised() {
        assert_eq!(
            SuiteConfig::new("http://h:1/v1/").normalized_base_url(),
            "http://h:1"
        );
        assert_eq!(
            SuiteConfig::new("http://h:1").normalized_base_url(),
            "http://h:1"
        );
    }

    #[test]
    fn profile_mode_falls_back_to_the_untrusted_key() {
        let mut cfg = SuiteConfig::new("http://h:1");
        assert_eq!(cfg.effective_api_key(), None);
        cfg.mode = ServerMode::Profile {
            trusted_key: "t".into(),
            untrusted_key: "u".into(),
        };
        assert_eq!(cfg.effective_api_key().as_deref(), Some("u"));
        cfg.api_key = Some("k".into());
        assert_eq!(cfg.effective_api_key().as_deref(), Some("k"));
    }
}

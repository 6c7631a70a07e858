//! API-key auth (CONTRACT section 5): `--api-key` guards `/v1`, `/v2`, `/pooling`, `/score`,
//! `/rerank`, `/classify`, `/tokenize`, `/detokenize`; `/health`, `/ping`, `/version` and
//! `/metrics` stay open. Keys are compared in constant time. Runs before anything else looks
//! at the request.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use subtle::ConstantTimeEq;

/// The presented key, for the policy layers (trusted-client profile). Read from the
/// `Authorization` header by the handler (the front service has already checked it).
#[derive(Clone, Debug)]
pub struct PresentedKey(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for PresentedKey {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(PresentedKey(bearer(&parts.headers).map(str::to_string)))
    }
}

/// Extra acceptance check (the trusted-client profile's keys, possibly stored as hashes).
pub type KeyCheck = Box<dyn Fn(&str) -> bool + Send + Sync>;

pub struct AuthConfig {
    /// `--api-key` values. Empty: no auth.
    pub keys: Vec<Vec<u8>>,
    pub also_accept: Option<KeyCheck>,
}

pub fn is_open_path(path: &str) -> bool {
    matches!(path, "/health" | "/ping" | "/version" | "/metrics")
}

pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Constant-time membership: every configured key is compared, whatever matches.
pub fn key_matches(keys: &[Vec<u8>], presented: &[u8]) -> bool {
    let mut ok = subtle::Choice::from(0u8);
    for k in keys {
        ok |= k.as_slice().ct_eq(presented);
    }
    bool::from(ok)
}

impl AuthConfig {
    /// Whether a request for `path` with these headers may go on. The `Authorization` header
    /// is read only when keys are configured.
    pub fn allows(&self, path: &str, headers: &HeaderMap) -> bool {
        if self.keys.is_empty() || is_open_path(path) {
            return true;
        }
        bearer(headers).is_some_and(|p| {
            key_matches(&self.keys, p.as_bytes()) | self.also_accept.as_ref().is_some_and(|f| f(p))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching() {
        let keys = vec![b"alpha".to_vec(), b"beta".to_vec()];
        assert!(key_matches(&keys, b"beta"));
        assert!(!key_matches(&keys, b"bet"));
        assert!(!key_matches(&keys, b""));
        assert!(!key_matches(&[], b"alpha"));
    }

    #[test]
    fn open_paths() {
        for p in ["/health", "/ping", "/version", "/metrics"] {
            assert!(is_open_path(p));
        }
        for p in [
            "/v1/models",
            "/tokenize",
            "/score",
            "/v2/rerank",
            "/pooling",
        ] {
            assert!(!is_open_path(p));
        }
    }
}

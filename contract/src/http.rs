//! A thin HTTP client: requests described as data, replies captured whole.
//!
//! Nothing here panics on what a server sends: a reply is bytes plus, when they parse,
//! JSON; a transport failure is a [`TransportError`] the case records.

use std::time::Duration;

use reqwest::header::{HeaderMap, AUTHORIZATION, CONTENT_TYPE};
use reqwest::Method;
use serde_json::Value;

/// Why a request got no HTTP reply.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("could not build the HTTP client: {0}")]
    Build(String),
    #[error("request failed: {0}")]
    Send(String),
    #[error("reading the body failed: {0}")]
    Body(String),
}

/// A request body.
#[derive(Debug, Clone)]
pub enum Body {
    Empty,
    /// Serialised with `Content-Type: application/json`.
    Json(Value),
    /// Sent as is, with the given `Content-Type` (none when `None`).
    Raw {
        content_type: Option<String>,
        bytes: Vec<u8>,
    },
}

/// Which `Authorization` header a request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// The suite's configured key, if any.
    Configured,
    /// No header at all.
    Without,
    /// `Bearer <key>`.
    Key(String),
}

/// One request, as data.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    pub method: Method,
    pub path: String,
    pub body: Body,
    pub auth: Auth,
    pub headers: Vec<(String, String)>,
}

impl RequestSpec {
    pub fn get(path: &str) -> Self {
        Self {
            method: Method::GET,
            path: path.to_string(),
            body: Body::Empty,
            auth: Auth::Configured,
            headers: Vec::new(),
        }
    }

    pub fn post_json(path: &str, body: Value) -> Self {
        Self {
            method: Method::POST,
            path: path.to_string(),
            body: Body::Json(body),
            auth: Auth::Configured,
            headers: Vec::new(),
        }
    }

    pub fn post_raw(path: &str, content_type: Option<&str>, bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            method: Method::POST,
            path: path.to_string(),
            body: Body::Raw {
                content_type: content_type.map(str::to_string),
                bytes: bytes.into(),
            },
            auth: Auth::Configured,
            headers: Vec::new(),
        }
    }

    pub fn with_auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// `METHOD /path`, the route column of the report.
    pub fn route(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// A captured HTTP reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// The body parsed as JSON, when it is JSON.
    pub json: Option<Value>,
}

impl Reply {
    pub fn new(status: u16, headers: HeaderMap, body: Vec<u8>) -> Self {
        let json = serde_json::from_slice(&body).ok();
        Self {
            status,
            headers,
            body,
            json,
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// The media type of `Content-Type`, lower-cased, without parameters.
    pub fn media_type(&self) -> Option<String> {
        self.header(CONTENT_TYPE.as_str()).map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
    }

    /// `error.message` of an OpenAI-shaped error body.
    pub fn error_message(&self) -> Option<&str> {
        self.json.as_ref()?.get("error")?.get("message")?.as_str()
    }
}

/// The suite's HTTP client.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
    api_key: Option<String>,
}

impl Client {
    /// A client for `base_url` (no trailing slash) that sends `api_key` on
    /// [`Auth::Configured`] requests.
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        timeout: Duration,
    ) -> Result<Self, TransportError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|err| TransportError::Build(err.to_string()))?;
        Ok(Self {
            http,
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Sends `spec` and reads the whole reply.
    pub async fn send(&self, spec: &RequestSpec) -> Result<Reply, TransportError> {
        let url = format!("{}{}", self.base_url, spec.path);
        let mut request = self.http.request(spec.method.clone(), url);
        let key = match &spec.auth {
            Auth::Configured => self.api_key.clone(),
            Auth::Without => None,
            Auth::Key(key) => Some(key.clone()),
        };
        if let Some(key) = key {
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        for (name, value) in &spec.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        request = match &spec.body {
            Body::Empty => request,
            Body::Json(value) => request
                .header(CONTENT_TYPE, "application/json")
                .body(value.to_string()),
            Body::Raw {
                content_type,
                bytes,
            } => {
                let request = match content_type {
                    Some(content_type) => request.header(CONTENT_TYPE, content_type.as_str()),
                    None => request,
                };
                request.body(bytes.clone())
            }
        };
        let response = request
            .send()
            .await
            .map_err(|err| TransportError::Send(describe(&err)))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .bytes()
            .await
            .map_err(|err| TransportError::Body(describe(&err)))?;
        Ok(Reply::new(status, headers, body.to_vec()))
    }
}

/// A reqwest error with its source chain (the top-level text alone says little).
fn describe(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn reply_parses_json_and_media_type() {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("Application/JSON; charset=utf-8"),
        );
        let reply = Reply::new(400, headers, br#"{"error":{"message":"m"}}"#.to_vec());
        assert_eq!(reply.media_type().as_deref(), Some("application/json"));
        assert_eq!(reply.error_message(), Some("m"));
    }

    #[test]
    fn reply_keeps_non_json_bodies() {
        let reply = Reply::new(200, HeaderMap::new(), b"data: [DONE]\n\n".to_vec());
        assert!(reply.json.is_none());
        assert_eq!(reply.text(), "data: [DONE]\n\n");
        assert_eq!(reply.media_type(), None);
    }

    #[test]
    fn route_names_method_and_path() {
        assert_eq!(RequestSpec::get("/health").route(), "GET /health");
        assert_eq!(
            RequestSpec::post_json("/score", Value::Null).route(),
            "POST /score"
        );
    }
}

//! The gateway's one error type, mapped to HTTP once (CONTRACT section 5).
//!
//! Handlers and layers return `Result<_, ApiError>`; nothing else builds an error body.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use engine::EngineError;
use std::sync::LazyLock;

use policies::{KwargsField, PolicyError};
use serde::Serialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ApiError {
    /// A client mistake: validation, gate, limits, unsupported task.
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
    },
    /// Unknown model.
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
    /// A route or resource that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Missing or wrong API key.
    #[error("Unauthorized")]
    Unauthorized,
    /// The media could be addressed but not fetched (upstream error, size cap).
    #[error("{message}")]
    Unprocessable {
        message: String,
        param: Option<String>,
    },
    /// Too many requests in flight or queued; the client should retry.
    #[error("{0}")]
    Overloaded(String),
    /// A feature the server does not implement (vLLM answers 501 in a few places).
    #[error("{0}")]
    NotImplemented(String),
    /// The engine is not running.
    #[error("{0}")]
    Unavailable(String),
    /// A bug. The message is logged in full; the client gets it too (no secrets in there).
    #[error("{0}")]
    Internal(String),
    /// The request did not finish within `--request-timeout`.
    #[error("{0}")]
    Timeout(String),
    /// The body is over `--max-request-body-bytes`.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The trust gate's refusal (CONTRACT section 2): a 400 like [`ApiError::BadRequest`]
    /// whose text never varies, so its body is written once and shared by every refusal.
    #[error("{}", gate_message(*.0))]
    Gate(KwargsField),
}

fn gate_message(field: KwargsField) -> &'static str {
    PolicyError::KwargsNotTrusted { field }
        .fixed_message()
        .unwrap_or("Per-request multimodal kwargs are disabled by default.")
}

/// The two gate refusals' bodies, built by [`ApiError::to_json`] on first use.
fn gate_json(field: KwargsField) -> &'static str {
    static MM: LazyLock<String> =
        LazyLock::new(|| ApiError::Gate(KwargsField::MmProcessorKwargs).to_json());
    static MEDIA: LazyLock<String> =
        LazyLock::new(|| ApiError::Gate(KwargsField::MediaIoKwargs).to_json());
    match field {
        KwargsField::MmProcessorKwargs => &MM,
        KwargsField::MediaIoKwargs => &MEDIA,
    }
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
            param: param.map(str::to_string),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } | ApiError::Gate(_) => StatusCode::BAD_REQUEST,
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    pub fn error_type(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } | ApiError::Gate(_) => "BadRequestError",
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) => "NotFoundError",
            ApiError::Unauthorized => "AuthenticationError",
            ApiError::Unprocessable { .. } => "UnprocessableEntityError",
            ApiError::Overloaded(_) | ApiError::Unavailable(_) => "ServiceUnavailableError",
            ApiError::NotImplemented(_) => "NotImplementedError",
            ApiError::Internal(_) => "InternalServerError",
            ApiError::Timeout(_) => "GatewayTimeoutError",
            ApiError::PayloadTooLarge(_) => "RequestEntityTooLargeError",
        }
    }

    pub fn param(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest { param, .. } | ApiError::Unprocessable { param, .. } => {
                param.as_deref()
            }
            ApiError::ModelNotFound(_) => Some("model"),
            ApiError::Gate(field) => Some(field.as_str()),
            _ => None,
        }
    }

    /// The envelope `{"error": {"message", "type", "param", "code"}}`, keys in that order.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                r#type: self.error_type(),
                param: self.param(),
                code: self.status().as_u16(),
            },
        }
    }

    /// The envelope as JSON text: the same bytes `serde_json` writes for [`ApiError::body`],
    /// written directly (every rejection pays for this, so it skips the generic serializer).
    pub fn to_json(&self) -> String {
        let message = self.message();
        let mut out = String::with_capacity(message.len() + 96);
        out.push_str("{\"error\":{\"message\":");
        push_json_str(&mut out, &message);
        out.push_str(",\"type\":\"");
        out.push_str(self.error_type());
        out.push_str("\",\"param\":");
        match self.param() {
            Some(p) => push_json_str(&mut out, p),
            None => out.push_str("null"),
        }
        out.push_str(",\"code\":");
        let code = self.status().as_u16();
        out.extend([
            char::from(b'0' + (code / 100 % 10) as u8),
            char::from(b'0' + (code / 10 % 10) as u8),
            char::from(b'0' + (code % 10) as u8),
        ]);
        out.push_str("}}");
        out
    }

    /// The message as [`std::fmt::Display`] writes it, borrowed where the variant holds it
    /// whole (no formatting machinery on the rejection path).
    pub fn message(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ApiError::BadRequest { message, .. } | ApiError::Unprocessable { message, .. } => {
                message.as_str().into()
            }
            ApiError::NotFound(m)
            | ApiError::Overloaded(m)
            | ApiError::NotImplemented(m)
            | ApiError::Unavailable(m)
            | ApiError::Internal(m)
            | ApiError::Timeout(m)
            | ApiError::PayloadTooLarge(m) => m.as_str().into(),
            ApiError::Gate(field) => gate_message(*field).into(),
            ApiError::ModelNotFound(_) | ApiError::Unauthorized => self.to_string().into(),
        }
    }
}

/// Appends `s` as a JSON string; the escaping is `serde_json`'s (only `"`, `\\` and control
/// characters are escaped), with a fast path for the common text that needs none.
fn push_json_str(out: &mut String, s: &str) {
    // No early exit, so the check vectorises.
    let needs_escape = s.bytes().fold(false, |acc, b| {
        acc | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !needs_escape {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        // Serialising a string cannot fail.
        out.push_str(&serde_json::to_string(s).unwrap_or_default());
    }
}

#[derive(Serialize)]
pub struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

#[derive(Serialize)]
pub struct ErrorDetail<'a> {
    pub message: String,
    #[serde(rename = "type")]
    pub r#type: &'static str,
    pub param: Option<&'a str>,
    pub code: u16,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() && !matches!(self, ApiError::Overloaded(_)) {
            tracing::error!(status = status.as_u16(), error = %self, "request failed");
        } else {
            tracing::debug!(status = status.as_u16(), error = %self, "request rejected");
        }
        let body = match &self {
            ApiError::Gate(field) => axum::body::Body::from(gate_json(*field)),
            _ => axum::body::Body::from(self.to_json()),
        };
        let mut resp = Response::new(body);
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if matches!(self, ApiError::Overloaded(_) | ApiError::Unavailable(_)) {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

impl From<PolicyError> for ApiError {
    fn from(e: PolicyError) -> Self {
        if let PolicyError::KwargsNotTrusted { field } = e {
            return ApiError::Gate(field);
        }
        let message = e.message();
        let param = e.param().map(str::to_string);
        match e.status() {
            422 => ApiError::Unprocessable { message, param },
            _ => ApiError::BadRequest { message, param },
        }
    }
}

impl From<preprocess::PreprocessError> for ApiError {
    fn from(e: preprocess::PreprocessError) -> Self {
        use preprocess::error::ErrorKind;
        if let preprocess::PreprocessError::Policy(p) = e {
            return p.into();
        }
        let message = e.to_string();
        match e.kind() {
            ErrorKind::BadRequest => ApiError::BadRequest {
                message,
                param: Some("messages".into()),
            },
            ErrorKind::Unprocessable => ApiError::Unprocessable {
                message,
                param: Some("messages".into()),
            },
            ErrorKind::Overloaded => ApiError::Overloaded(message),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidRequest { message, param } => {
                ApiError::BadRequest { message, param }
            }
            EngineError::UnsupportedTask { .. } => ApiError::bad_request(e.to_string(), None),
            EngineError::Template(msg) => ApiError::bad_request(msg, None),
            EngineError::Overloaded(msg) => ApiError::Overloaded(msg),
            EngineError::Stopped => ApiError::Unavailable("The engine is not running.".into()),
            EngineError::Lora(e) => e.into(),
            EngineError::Load { .. }
            | EngineError::BackendUnavailable(_)
            | EngineError::Internal(_) => ApiError::Internal(e.to_string()),
        }
    }
}

/// vLLM's answers on the adapter routes: an unknown adapter is its 404, every other refusal a
/// 400 naming the adapter and the reason.
impl From<engine::lora::LoraError> for ApiError {
    fn from(e: engine::lora::LoraError) -> Self {
        match e {
            engine::lora::LoraError::NotFound(_) => ApiError::NotFound(e.to_string()),
            engine::lora::LoraError::NoBase { .. } => {
                ApiError::bad_request(e.to_string(), Some("lora_path"))
            }
            other => ApiError::bad_request(other.to_string(), None),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_json_writes_what_serde_json_writes() {
        let cases = [
            ApiError::bad_request("plain message (parameter=x)", Some("x")),
            ApiError::bad_request("quotes \" and \\ backslash\n newline \u{1} ctl é ✓", None),
            ApiError::ModelNotFound("m".into()),
            ApiError::Unauthorized,
            ApiError::Overloaded("busy".into()),
            ApiError::Unprocessable {
                message: "fetch failed".into(),
                param: Some("p\"q".into()),
            },
            ApiError::Timeout("slow".into()),
            ApiError::PayloadTooLarge("big".into()),
            ApiError::Internal("bug".into()),
            ApiError::NotImplemented("later".into()),
            ApiError::Gate(KwargsField::MmProcessorKwargs),
            ApiError::Gate(KwargsField::MediaIoKwargs),
        ];
        for e in cases {
            assert_eq!(e.message(), e.to_string());
            let want = serde_json::to_string(&e.body()).unwrap();
            assert_eq!(e.to_json(), want);
            let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
            assert_eq!(v["error"]["code"], e.status().as_u16());
        }
    }

    #[tokio::test]
    async fn the_gate_refusal_is_the_contract_envelope() {
        use http_body_util::BodyExt;
        let e: ApiError = PolicyError::KwargsNotTrusted {
            field: KwargsField::MmProcessorKwargs,
        }
        .into();
        let resp = e.into_response();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            resp.headers().get(header::CONTENT_TYPE).unwrap(),
            "application/json"
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"error":{"message":"Per-request mm_processor_kwargs are disabled by default because they can change multimodal preprocessing resource usage. Start the server with --trust-request-mm-kwargs only when clients are trusted. (parameter=mm_processor_kwargs)","type":"BadRequestError","param":"mm_processor_kwargs","code":400}}"#
        );
    }
}

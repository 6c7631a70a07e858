//! Expectations: what a case requires of a reply, as a list of small checks whose
//! failures are collected (not short-circuited) so the report says everything wrong.

use std::sync::Arc;

use serde_json::Value;

use crate::http::Reply;

/// The gate's refusal message for `mm_processor_kwargs` (CONTRACT section 2).
pub const MM_GATE_MESSAGE: &str = "Per-request mm_processor_kwargs are disabled by default because they can change multimodal preprocessing resource usage. Start the server with --trust-request-mm-kwargs only when clients are trusted. (parameter=mm_processor_kwargs)";
/// The gate's refusal message for `media_io_kwargs`.
pub const MEDIA_GATE_MESSAGE: &str = "Per-request media_io_kwargs are disabled by default because they can change multimodal media loading resource usage. Start the server with --trust-request-mm-kwargs only when clients are trusted. (parameter=media_io_kwargs)";
/// The prefix every gate message starts with, before the field name.
pub const GATE_MESSAGE_PREFIX: &str = "Per-request ";

/// One check over a reply.
pub type Check = Arc<dyn Fn(&Reply) -> Result<(), String> + Send + Sync>;

/// The two gated fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateField {
    MmProcessorKwargs,
    MediaIoKwargs,
}

impl GateField {
    pub fn name(self) -> &'static str {
        match self {
            Self::MmProcessorKwargs => "mm_processor_kwargs",
            Self::MediaIoKwargs => "media_io_kwargs",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Self::MmProcessorKwargs => MM_GATE_MESSAGE,
            Self::MediaIoKwargs => MEDIA_GATE_MESSAGE,
        }
    }

    /// The exact message prefix the brief pins: `Per-request <field> are disabled by default`.
    pub fn message_prefix(self) -> String {
        format!("Per-request {} are disabled by default", self.name())
    }
}

/// What `error.param` must be.
#[derive(Debug, Clone)]
pub enum Param {
    Exact(String),
    /// Any of these (`None` = JSON null).
    OneOf(Vec<Option<String>>),
    Any,
}

impl Param {
    pub fn exact(name: &str) -> Self {
        Self::Exact(name.to_string())
    }

    fn describe(&self) -> String {
        match self {
            Self::Exact(name) => format!("param={name}"),
            Self::OneOf(names) => {
                let names: Vec<String> = names
                    .iter()
                    .map(|name| name.clone().unwrap_or_else(|| "null".into()))
                    .collect();
                format!("param in [{}]", names.join(", "))
            }
            Self::Any => String::new(),
        }
    }

    fn accepts(&self, got: Option<&str>) -> bool {
        match self {
            Self::Exact(name) => got == Some(name.as_str()),
            Self::OneOf(names) => names.iter().any(|name| name.as_deref() == got),
            Self::Any => true,
        }
    }
}

/// What `error.message` must be.
#[derive(Debug, Clone)]
pub enum Message {
    Exact(String),
    Prefix(String),
    NonEmpty,
}

impl Message {
    pub fn exact(text: &str) -> Self {
        Self::Exact(text.to_string())
    }

    pub fn prefix(text: &str) -> Self {
        Self::Prefix(text.to_string())
    }

    fn describe(&self) -> String {
        match self {
            Self::Exact(text) => format!("message {text:?}"),
            Self::Prefix(text) => format!("message starting {text:?}"),
            Self::NonEmpty => String::new(),
        }
    }
}

/// A case's expectation: a summary for the report and the checks behind it.
#[derive(Clone)]
pub struct Expect {
    pub summary: String,
    checks: Vec<Check>,
}

impl std::fmt::Debug for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expect")
            .field("summary", &self.summary)
            .field("checks", &self.checks.len())
            .finish()
    }
}

impl Expect {
    pub fn new(summary: impl Into<String>) -> Self {
        Self {
            summary: summary.into(),
            checks: Vec::new(),
        }
    }

    /// Adds a check.
    pub fn with(
        mut self,
        check: impl Fn(&Reply) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.checks.push(Arc::new(check));
        self
    }

    /// Appends words to the summary.
    pub fn described(mut self, more: &str) -> Self {
        if !more.is_empty() {
            self.summary.push_str(", ");
            self.summary.push_str(more);
        }
        self
    }

    /// Runs every check; the failures, in order.
    pub fn evaluate(&self, reply: &Reply) -> Vec<String> {
        self.checks
            .iter()
            .filter_map(|check| check(reply).err())
            .collect()
    }

    /// An OpenAI-shaped error: status, envelope (keys message, type, param, code in that
    /// order, code = status, JSON content type), type, param and message.
    pub fn error(status: u16, error_type: &str, param: Param, message: Message) -> Self {
        let mut summary = format!("{status} {error_type}");
        for part in [param.describe(), message.describe()] {
            if !part.is_empty() {
                summary.push(' ');
                summary.push_str(&part);
            }
        }
        let error_type = error_type.to_string();
        Self::new(summary)
            .with(status_is(status))
            .with(error_envelope(status))
            .with(move |reply| {
                let got = error_field(reply, "type");
                if got.as_deref() == Some(error_type.as_str()) {
                    Ok(())
                } else {
                    Err(format!("error.type {got:?} != {error_type:?}"))
                }
            })
            .with(move |reply| {
                let got = error_field(reply, "param");
                if param.accepts(got.as_deref()) {
                    Ok(())
                } else {
                    Err(format!(
                        "error.param {got:?}: expected {}",
                        param.describe()
                    ))
                }
            })
            .with(move |reply| check_message(reply, &message))
    }

    /// A 400 `BadRequestError` naming `param` (any non-empty message), which is not the
    /// gate's refusal.
    pub fn bad_request(param: &str) -> Self {
        Self::error(
            400,
            "BadRequestError",
            Param::exact(param),
            Message::NonEmpty,
        )
        .with(not_gate())
    }

    /// The gate's refusal of `field`, exactly as CONTRACT section 2 writes it.
    pub fn gate_rejection(field: GateField) -> Self {
        let prefix = field.message_prefix();
        Self::error(
            400,
            "BadRequestError",
            Param::exact(field.name()),
            Message::exact(field.message()),
        )
        .with(move |reply| match reply.error_message() {
            Some(message) if message.starts_with(&prefix) => Ok(()),
            other => Err(format!("message {other:?} does not start with {prefix:?}")),
        })
    }

    /// The 404 for an unknown model.
    pub fn unknown_model(model: &str) -> Self {
        Self::error(
            404,
            "NotFoundError",
            Param::exact("model"),
            Message::Exact(format!("The model `{model}` does not exist.")),
        )
    }

    /// Status 200 with a JSON body (and not the gate's refusal).
    pub fn ok_json(summary: &str) -> Self {
        Self::new(format!("200 {summary}"))
            .with(status_is(200))
            .with(|reply| match reply.json {
                Some(_) => Ok(()),
                None => Err("body is not JSON".into()),
            })
            .with(not_gate())
    }
}

/// `error.<key>` as a string (`None` when absent, null or not a string).
pub fn error_field(reply: &Reply, key: &str) -> Option<String> {
    reply
        .json
        .as_ref()?
        .get("error")?
        .get(key)?
        .as_str()
        .map(str::to_string)
}

fn check_message(reply: &Reply, rule: &Message) -> Result<(), String> {
    let got = reply.error_message();
    match (rule, got) {
        (_, None) => Err("error.message missing or not a string".into()),
        (Message::Exact(want), Some(got)) if got != want => {
            Err(format!("error.message {got:?} != {want:?}"))
        }
        (Message::Prefix(want), Some(got)) if !got.starts_with(want.as_str()) => Err(format!(
            "error.message {got:?} does not start with {want:?}"
        )),
        (_, Some("")) => Err("error.message is empty".into()),
        _ => Ok(()),
    }
}

/// The status is `code`.
pub fn status_is(code: u16) -> impl Fn(&Reply) -> Result<(), String> + Send + Sync + 'static {
    move |reply: &Reply| {
        if reply.status == code {
            Ok(())
        } else {
            Err(format!("status {} != {code}", reply.status))
        }
    }
}

/// The body is `{"error": {"message", "type", "param", "code"}}`, keys in that order,
/// `code` an integer equal to the status, served as JSON.
pub fn error_envelope(
    status: u16,
) -> impl Fn(&Reply) -> Result<(), String> + Send + Sync + 'static {
    move |reply: &Reply| {
        if reply.media_type().as_deref() != Some("application/json") {
            return Err(format!(
                "content-type {:?} is not application/json",
                reply.header("content-type")
            ));
        }
        let Some(Value::Object(top)) = &reply.json else {
            return Err("body is not a JSON object".into());
        };
        let top_keys: Vec<&str> = top.keys().map(String::as_str).collect();
        if top_keys != ["error"] {
            return Err(format!("top-level keys {top_keys:?} != [\"error\"]"));
        }
        let Some(Value::Object(error)) = top.get("error") else {
            return Err("`error` is not an object".into());
        };
        let keys: Vec<&str> = error.keys().map(String::as_str).collect();
        if keys != ["message", "type", "param", "code"] {
            return Err(format!(
                "error keys {keys:?} != [\"message\", \"type\", \"param\", \"code\"]"
            ));
        }
        if !error
            .get("param")
            .is_some_and(|p| p.is_null() || p.is_string())
        {
            return Err("error.param is neither a string nor null".into());
        }
        match error.get("code").and_then(Value::as_u64) {
            Some(code) if code == u64::from(status) => Ok(()),
            _ => Err(format!(
                "error.code {:?} is not the integer {status}",
                error.get("code")
            )),
        }
    }
}

/// The reply is not the gate's refusal (of either field).
pub fn not_gate() -> impl Fn(&Reply) -> Result<(), String> + Send + Sync + 'static {
    |reply: &Reply| match reply.error_message() {
        Some(message) if is_gate_message(message) => {
            Err(format!("got the trust gate's refusal: {message:?}"))
        }
        _ => Ok(()),
    }
}

/// True for either gate message (or anything starting like one).
pub fn is_gate_message(message: &str) -> bool {
    [GateField::MmProcessorKwargs, GateField::MediaIoKwargs]
        .iter()
        .any(|field| message.starts_with(&field.message_prefix()))
}

/// The JSON value at `pointer` (RFC 6901) satisfies `test`.
pub fn json_at(
    pointer: &'static str,
    what: &'static str,
    test: impl Fn(&Value) -> bool + Send + Sync + 'static,
) -> impl Fn(&Reply) -> Result<(), String> + Send + Sync + 'static {
    move |reply: &Reply| {
        let got = reply.json.as_ref().and_then(|json| json.pointer(pointer));
        match got {
            Some(value) if test(value) => Ok(()),
            Some(value) => Err(format!(
                "{pointer} = {} is not {what}",
                clip(&value.to_string(), 120)
            )),
            None => Err(format!("{pointer} missing (expected {what})")),
        }
    }
}

/// A string at `pointer` starts with `prefix`.
pub fn string_prefix(
    pointer: &'static str,
    prefix: &'static str,
) -> impl Fn(&Reply) -> Result<(), String> + Send + Sync + 'static {
    move |reply: &Reply| {
        let got = reply.json.as_ref().and_then(|json| json.pointer(pointer));
        match got.and_then(Value::as_str) {
            Some(text) if text.starts_with(prefix) => Ok(()),
            Some(text) => Err(format!(
                "{pointer} = {text:?} does not start with {prefix:?}"
            )),
            None => Err(format!(
                "{pointer} missing or not a string (expected {prefix:?}...)"
            )),
        }
    }
}

/// A one-line summary of a reply for the report's `got` column.
pub fn summarize(reply: &Reply) -> String {
    if let Some(Value::Object(error)) = reply.json.as_ref().and_then(|json| json.get("error")) {
        let kind = error.get("type").and_then(Value::as_str).unwrap_or("?");
        let param = match error.get("param") {
            Some(Value::String(param)) => param.clone(),
            Some(Value::Null) | None => "null".into(),
            Some(other) => other.to_string(),
        };
        let message = error.get("message").and_then(Value::as_str).unwrap_or("");
        return format!(
            "{} {kind} param={param} {:?}",
            reply.status,
            clip(message, 240)
        );
    }
    let media = reply
        .media_type()
        .unwrap_or_else(|| "no content-type".into());
    if media == "text/event-stream" {
        let events = crate::sse::parse(&reply.text());
        return format!("{} {media}, {} events", reply.status, events.len());
    }
    let body = reply.text();
    if body.is_empty() {
        format!("{} {media}, empty body", reply.status)
    } else {
        format!("{} {media} {}", reply.status, clip(&body, 200))
    }
}

/// At most `max` characters of `text`, with an ellipsis when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(max).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
    use serde_json::json;

    fn reply(status: u16, body: &str) -> Reply {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Reply::new(status, headers, body.as_bytes().to_vec())
    }

    fn gate_body(field: GateField) -> String {
        json!({"error": {"message": field.message(), "type": "BadRequestError",
            "param": field.name(), "code": 400}})
        .to_string()
    }

    #[test]
    fn gate_rejection_accepts_the_contract_body() {
        for field in [GateField::MmProcessorKwargs, GateField::MediaIoKwargs] {
            let failures = Expect::gate_rejection(field).evaluate(&reply(400, &gate_body(field)));
            assert!(failures.is_empty(), "{failures:?}");
        }
    }

    #[test]
    fn gate_rejection_names_the_wrong_field() {
        let got = reply(400, &gate_body(GateField::MediaIoKwargs));
        let failures = Expect::gate_rejection(GateField::MmProcessorKwargs).evaluate(&got);
        assert!(failures.iter().any(|f| f.contains("error.param")));
        assert!(failures.iter().any(|f| f.contains("error.message")));
    }

    #[test]
    fn envelope_key_order_and_code_are_checked() {
        let reordered =
            r#"{"error":{"type":"BadRequestError","message":"m","param":null,"code":400}}"#;
        let failures = Expect::bad_request("x").evaluate(&reply(400, reordered));
        assert!(failures.iter().any(|f| f.contains("error keys")));
        let string_code =
            r#"{"error":{"message":"m","type":"BadRequestError","param":"x","code":"400"}}"#;
        let failures = Expect::bad_request("x").evaluate(&reply(400, string_code));
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("error.code"));
        let good = r#"{"error":{"message":"m","type":"BadRequestError","param":"x","code":400}}"#;
        assert!(Expect::bad_request("x")
            .evaluate(&reply(400, good))
            .is_empty());
    }

    #[test]
    fn bad_request_refuses_the_gate_message() {
        let got = reply(400, &gate_body(GateField::MmProcessorKwargs));
        let failures = Expect::bad_request("mm_processor_kwargs").evaluate(&got);
        assert!(failures.iter().any(|f| f.contains("trust gate")));
    }

    #[test]
    fn unknown_model_message_is_exact() {
        let body = r#"{"error":{"message":"The model `m` does not exist.","type":"NotFoundError","param":"model","code":404}}"#;
        assert!(Expect::unknown_model("m")
            .evaluate(&reply(404, body))
            .is_empty());
        assert!(!Expect::unknown_model("n")
            .evaluate(&reply(404, body))
            .is_empty());
    }

    #[test]
    fn json_checks_report_paths() {
        let got = reply(200, r#"{"id":"chatcmpl-1","choices":[]}"#);
        assert!(string_prefix("/id", "chatcmpl-")(&got).is_ok());
        let err = string_prefix("/id", "cmpl-")(&got)
            .err()
            .unwrap_or_default();
        assert!(err.contains("/id") && err.contains("cmpl-"), "{err}");
        assert!(json_at("/missing", "x", |_| true)(&got).is_err());
    }

    #[test]
    fn summaries_are_short() {
        let got = reply(400, &gate_body(GateField::MmProcessorKwargs));
        let text = summarize(&got);
        assert!(text.starts_with("400 BadRequestError param=mm_processor_kwargs"));
        assert_eq!(clip("abcdef", 3), "abc…");
    }
}

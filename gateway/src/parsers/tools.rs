//! Tool calling as vLLM does it. `tool_choice` decides how a reply may call the request's
//! `tools`:
//!
//! * `none` (or no tools): plain text;
//! * a named function: the reply is constrained to that function's `parameters` schema and
//!   returned as one call whose `arguments` is the reply;
//! * `required`: the reply is constrained to a JSON list of `{"name", "parameters"}` objects,
//!   one per call, each valid against its function's schema (`finish_reason: tool_calls`);
//! * `auto` (needs `--enable-auto-tool-choice` and `--tool-call-parser`): the model decides, and
//!   the parser finds the calls in its text (`finish_reason: tool_calls` when it did).

use engine::api::Constraint;
use serde::Serialize;
use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult};

/// The `--tool-call-parser` formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolParser {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5, Qwen3, SmolLM3,
    /// Hermes).
    Hermes,
    /// `{"name": ..., "parameters": {...}}`, several separated by `;`, optionally after
    /// `<|python_tag|>` (Llama 3.1+).
    Llama3Json,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`, or `[TOOL_CALLS]name[ARGS]{...}` as
    /// newer Mistral tokenizers write it.
    Mistral,
    /// `[get_weather(city="Paris"), get_time()]`: Python calls with literal arguments (Llama
    /// 3.2 and 4, Qwen3-Coder style prompts).
    Pythonic,
}

impl ToolParser {
    pub const NAMES: &'static [&'static str] = &["hermes", "llama3_json", "mistral", "pythonic"];

    pub fn parse(name: &str) -> Option<ToolParser> {
        match name {
            "hermes" => Some(ToolParser::Hermes),
            "llama3_json" => Some(ToolParser::Llama3Json),
            "mistral" => Some(ToolParser::Mistral),
            "pythonic" => Some(ToolParser::Pythonic),
            _ => None,
        }
    }
}

/// How this request's reply may call tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolMode {
    Off,
    Named(String),
    Required,
    Auto(ToolParser),
}

/// One call in a reply, in the OpenAI shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text, as the OpenAI API carries it.
    pub arguments: String,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message, Some("tool_choice"))
}

/// The functions of `tools` (`[{"type": "function", "function": {...}}]`).
fn functions(tools: Option<&Value>) -> Vec<&Value> {
    tools
        .and_then(Value::as_array)
        .map(|t| t.iter().filter_map(|tool| tool.get("function")).collect())
        .unwrap_or_default()
}

fn parameters(function: &Value) -> Value {
    function
        .get("parameters")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}))
}

/// The mode `tool_choice` asks for, checked against `tools` and the server's flags.
pub fn mode(
    tool_choice: Option<&Value>,
    tools: Option<&Value>,
    auto: Option<ToolParser>,
) -> ApiResult<ToolMode> {
    let has_tools = !functions(tools).is_empty();
    let choice = match tool_choice {
        None | Some(Value::Null) => {
            // vLLM's default is `auto` when tools are given and the server parses calls.
            return Ok(match auto {
                Some(parser) if has_tools => ToolMode::Auto(parser),
                _ => ToolMode::Off,
            });
        }
        Some(choice) => choice,
    };
    match choice {
        Value::String(s) if s == "none" => Ok(ToolMode::Off),
        Value::String(s) if s == "auto" => match auto {
            Some(parser) => Ok(if has_tools {
                ToolMode::Auto(parser)
            } else {
                ToolMode::Off
            }),
            None => Err(bad(
                "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
            )),
        },
        Value::String(s) if s == "required" => {
            if has_tools {
                Ok(ToolMode::Required)
            } else {
                Err(bad("When using `tool_choice`, `tools` must be set."))
            }
        }
        Value::Object(o) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}."))?;
            if !functions(tools)
                .iter()
                .any(|f| f.get("name").and_then(Value::as_str) == Some(name))
            {
                return Err(bad(format!("Tool '{name}' has not been passed in `tools`.")));
            }
            Ok(ToolMode::Named(name.to_string()))
        }
        other => Err(bad(format!(
            "tool_choice must be \"none\", \"auto\", \"required\" or a named function, got {other}."
        ))),
    }
}

/// Arguments as compact JSON, as OpenAI's API returns them: without it the grammar allows any
/// whitespace between tokens, and a weak model can spend its whole budget on it.
fn compact(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_flexible": false}));
    }
    schema
}

/// The constraint a mode puts on the reply (`Named` and `Required`).
pub fn constraint(mode: &ToolMode, tools: Option<&Value>) -> Option<Constraint> {
    let functions = functions(tools);
    match mode {
        ToolMode::Named(name) => functions
            .iter()
            .find(|f| f.get("name").and_then(Value::as_str) == Some(name))
            .map(|f| Constraint::JsonSchema(compact(parameters(f)))),
        ToolMode::Required => {
            let calls: Vec<Value> = functions
                .iter()
                .filter_map(|f| {
                    let name = f.get("name")?.as_str()?;
                    Some(json!({
                        "type": "object",
                        "properties": {"name": {"const": name}, "parameters": parameters(f)},
                        "required": ["name", "parameters"],
                        "additionalProperties": false
                    }))
                })
                .collect();
            Some(Constraint::JsonSchema(compact(json!({
                "type": "array", "minItems": 1, "items": {"anyOf": calls}
            }))))
        }
        ToolMode::Off | ToolMode::Auto(_) => None,
    }
}

fn call(id_base: &str, index: usize, name: String, arguments: &Value) -> ToolCall {
    ToolCall {
        id: format!("chatcmpl-tool-{id_base}-{index}"),
        kind: "function",
        function: FunctionCall {
            name,
            arguments: match arguments {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
        },
    }
}

/// A JSON object `{"name": ..., <args_key>: ...}` as a call.
fn named_call(v: &Value, args_keys: &[&str], id_base: &str, index: usize) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = args_keys
        .iter()
        .find_map(|k| v.get(*k))
        .cloned()
        .unwrap_or_else(|| json!({}));
    Some(call(id_base, index, name, &args))
}

/// The reply's text split into content and calls, as the mode reads it. `None` content means
/// the reply was calls only.
pub fn extract(mode: &ToolMode, text: &str, id_base: &str) -> (Option<String>, Vec<ToolCall>) {
    match mode {
        ToolMode::Off => (Some(text.to_string()), Vec::new()),
        ToolMode::Named(name) => (
            Some(String::new()),
            vec![call(
                id_base,
                0,
                name.clone(),
                &Value::String(text.to_string()),
            )],
        ),
        ToolMode::Required => {
            let calls: Vec<ToolCall> = serde_json::from_str::<Vec<Value>>(text)
                .map(|list| {
                    list.iter()
                        .enumerate()
                        .filter_map(|(i, v)| named_call(v, &["parameters"], id_base, i))
                        .collect()
                })
                .unwrap_or_default();
            if calls.is_empty() {
                (Some(text.to_string()), calls)
            } else {
                (Some(String::new()), calls)
            }
        }
        ToolMode::Auto(ToolParser::Hermes) => hermes(text, id_base),
        ToolMode::Auto(ToolParser::Llama3Json) => llama3_json(text, id_base),
        ToolMode::Auto(ToolParser::Mistral) => mistral(text, id_base),
        ToolMode::Auto(ToolParser::Pythonic) => super::pythonic::calls(text)
            .map(|calls| {
                let calls = calls
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, args))| call(id_base, i, name, &args))
                    .collect();
                (None, calls)
            })
            .unwrap_or_else(|| (Some(text.to_string()), Vec::new())),
    }
}

/// A streamed choice under a tool mode: its content goes out as it comes until the reply may
/// be starting a call (the parser's marker, or a reply that opens as calls); from there it is
/// held until the finish, when the calls are parsed from the whole reply.
#[derive(Debug)]
pub struct ToolStream {
    mode: ToolMode,
    text: String,
    /// Bytes of `text` already sent as content.
    sent: usize,
    /// Past a possible call start: nothing more goes out before the finish.
    holding: bool,
    /// Decided to be plain text (formats whose calls are the whole reply).
    plain: bool,
}

const PYTHON_TAGS: [&str; 2] = ["<|python_tag|>", "<|python_start|>"];

impl ToolStream {
    pub fn new(mode: ToolMode) -> Self {
        ToolStream {
            mode,
            text: String::new(),
            sent: 0,
            holding: false,
            plain: false,
        }
    }

    /// Adds a delta; returns the content that can go out now.
    pub fn push(&mut self, delta: &str) -> String {
        self.text.push_str(delta);
        if self.holding {
            return String::new();
        }
        let limit = self.limit();
        let out = self.text[self.sent..limit].to_string();
        self.sent = limit;
        out
    }

    /// How far the text can go out as content, setting `holding` once a call may have begun.
    fn limit(&mut self) -> usize {
        let marker = |s: &mut Self, marker: &str| match s.text.find(marker) {
            Some(at) => {
                s.holding = true;
                at.max(s.sent)
            }
            None => s.text.len() - super::reasoning::partial_tag_len(&s.text, marker),
        };
        match &self.mode {
            ToolMode::Off => self.text.len(),
            ToolMode::Named(_) | ToolMode::Required => {
                self.holding = true;
                self.sent
            }
            ToolMode::Auto(ToolParser::Hermes) => marker(self, HERMES_OPEN),
            ToolMode::Auto(ToolParser::Mistral) => marker(self, MISTRAL_CALLS),
            ToolMode::Auto(ToolParser::Llama3Json | ToolParser::Pythonic) => {
                if self.plain {
                    return self.text.len();
                }
                let t = self.text.trim_start();
                if t.starts_with(['{', '[']) || PYTHON_TAGS.iter().any(|tag| t.starts_with(tag)) {
                    self.holding = true;
                    self.sent
                } else if t.is_empty() || PYTHON_TAGS.iter().any(|tag| tag.starts_with(t)) {
                    self.sent
                } else {
                    self.plain = true;
                    self.text.len()
                }
            }
        }
    }

    /// At the finish: the content not sent yet and the calls. When the reply made calls, what
    /// was held is the calls; otherwise it goes out as content.
    pub fn finish(&mut self, id_base: &str) -> (String, Vec<ToolCall>) {
        let (_, calls) = extract(&self.mode, &self.text, id_base);
        let rest = if calls.is_empty() {
            self.text[self.sent..].to_string()
        } else {
            String::new()
        };
        self.sent = self.text.len();
        (rest, calls)
    }
}

const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";

fn mistral(text: &str, id_base: &str) -> (Option<String>, Vec<ToolCall>) {
    let Some(first) = text.find(MISTRAL_CALLS) else {
        return (Some(text.to_string()), Vec::new());
    };
    let not_calls = || (Some(text.to_string()), Vec::new());
    let mut calls = Vec::new();
    for part in text[first..]
        .split(MISTRAL_CALLS)
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        if part.starts_with('[') {
            let Ok(list) = serde_json::from_str::<Vec<Value>>(part) else {
                return not_calls();
            };
            for v in &list {
                match named_call(v, &["arguments", "parameters"], id_base, calls.len()) {
                    Some(c) => calls.push(c),
                    None => return not_calls(),
                }
            }
        } else {
            let Some((name, args)) = part.split_once(MISTRAL_ARGS) else {
                return not_calls();
            };
            let Ok(args) = serde_json::from_str::<Value>(args.trim()) else {
                return not_calls();
            };
            calls.push(call(id_base, calls.len(), name.trim().to_string(), &args));
        }
    }
    let content = text[..first].trim_end();
    ((!content.is_empty()).then(|| content.to_string()), calls)
}

/// The finish reason of a reply: `tool_calls` when the model chose to call (`auto`) or was made
/// to and finished (`required`), as vLLM reports it.
pub fn finish_reason(mode: &ToolMode, calls: &[ToolCall], otherwise: &'static str) -> &'static str {
    match mode {
        ToolMode::Auto(_) if !calls.is_empty() => "tool_calls",
        ToolMode::Required if !calls.is_empty() && otherwise == "stop" => "tool_calls",
        _ => otherwise,
    }
}

/// The calls as one stream delta each (`index` orders them, as the OpenAI SDK assembles them).
pub fn deltas(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(index, c)| {
            json!({"index": index, "id": c.id, "type": c.kind,
                   "function": {"name": c.function.name, "arguments": c.function.arguments}})
        })
        .collect()
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";

fn hermes(text: &str, id_base: &str) -> (Option<String>, Vec<ToolCall>) {
    let Some(first) = text.find(HERMES_OPEN) else {
        return (Some(text.to_string()), Vec::new());
    };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(HERMES_OPEN) {
        let body = &rest[start + HERMES_OPEN.len()..];
        let (inner, after) = match body.find(HERMES_CLOSE) {
            Some(end) => (&body[..end], &body[end + HERMES_CLOSE.len()..]),
            // A call cut off by the end of the reply still counts when its JSON is whole.
            None => (body, ""),
        };
        match serde_json::from_str::<Value>(inner.trim()) {
            Ok(v) => match named_call(&v, &["arguments", "parameters"], id_base, calls.len()) {
                Some(c) => calls.push(c),
                None => return (Some(text.to_string()), Vec::new()),
            },
            // Not a call after all: the reply is text.
            Err(_) => return (Some(text.to_string()), Vec::new()),
        }
        rest = after;
    }
    let content = text[..first].trim_end();
    ((!content.is_empty()).then(|| content.to_string()), calls)
}

fn llama3_json(text: &str, id_base: &str) -> (Option<String>, Vec<ToolCall>) {
    let body = text.trim_start();
    let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
    if !body.starts_with('{') {
        return (Some(text.to_string()), Vec::new());
    }
    let mut calls = Vec::new();
    // Calls are separated by `;` (between objects, so a `;` inside a string is left alone
    // unless it follows a `}`).
    let body = body.replace("};", "}");
    let stream = serde_json::Deserializer::from_str(&body).into_iter::<Value>();
    let mut consumed = 0;
    for item in stream {
        let Ok(v) = item else {
            return (Some(text.to_string()), Vec::new());
        };
        match named_call(&v, &["parameters", "arguments"], id_base, calls.len()) {
            Some(c) => calls.push(c),
            None => return (Some(text.to_string()), Vec::new()),
        }
        consumed += 1;
    }
    if consumed == 0 {
        return (Some(text.to_string()), Vec::new());
    }
    (None, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}},
            {"type": "function", "function": {"name": "get_time"}}
        ])
    }

    #[test]
    fn modes_follow_tool_choice_and_the_flags() {
        let t = tools();
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        assert_eq!(mode(None, Some(&t), None).unwrap(), ToolMode::Off);
        assert_eq!(
            mode(None, Some(&t), Some(ToolParser::Hermes)).unwrap(),
            ToolMode::Auto(ToolParser::Hermes)
        );
        assert_eq!(
            mode(Some(&named), Some(&t), None).unwrap(),
            ToolMode::Named("get_time".into())
        );
        assert_eq!(
            mode(Some(&json!("required")), Some(&t), None).unwrap(),
            ToolMode::Required
        );
        assert!(mode(Some(&json!("auto")), Some(&t), None).is_err());
        assert!(mode(Some(&json!("required")), None, None).is_err());
        let missing = json!({"type": "function", "function": {"name": "nope"}});
        assert!(mode(Some(&missing), Some(&t), None).is_err());
    }

    #[test]
    fn required_and_named_constrain_to_the_schemas() {
        let t = tools();
        let Some(Constraint::JsonSchema(s)) =
            constraint(&ToolMode::Named("get_weather".into()), Some(&t))
        else {
            panic!("a schema")
        };
        assert_eq!(s["required"], json!(["city"]));
        let Some(Constraint::JsonSchema(s)) = constraint(&ToolMode::Required, Some(&t)) else {
            panic!("a schema")
        };
        assert_eq!(s["items"]["anyOf"].as_array().unwrap().len(), 2);
        let (content, calls) = extract(
            &ToolMode::Required,
            r#"[{"name": "get_weather", "parameters": {"city": "Paris"}}]"#,
            "x",
        );
        assert_eq!(content.as_deref(), Some(""));
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].function.arguments, r#"{"city":"Paris"}"#);
    }

    /// Content streams until a call may start; the calls come whole at the finish.
    #[test]
    fn streams_send_content_until_a_call_starts() {
        let run = |mode: ToolMode, deltas: &[&str]| {
            let mut s = ToolStream::new(mode);
            let sent: Vec<String> = deltas.iter().map(|d| s.push(d)).collect();
            let (rest, calls) = s.finish("r");
            (sent, rest, calls.len())
        };
        let hermes = ToolMode::Auto(ToolParser::Hermes);
        let (sent, rest, calls) = run(
            hermes.clone(),
            &[
                "Let me ",
                "check.<tool",
                "_call>{\"name\": \"f\", \"arguments\": {}}",
                "</tool_call>",
            ],
        );
        assert_eq!(sent, ["Let me ", "check.", "", ""]);
        assert_eq!((rest.as_str(), calls), ("", 1));
        // A false start is sent at the finish.
        let (sent, rest, calls) = run(hermes, &["a <tool", "box> b"]);
        assert_eq!(sent, ["a ", "<toolbox> b"]);
        assert_eq!((rest.as_str(), calls), ("", 0));
        let (sent, rest, calls) = run(ToolMode::Auto(ToolParser::Pythonic), &[" ", "[f(x=1)", "]"]);
        assert_eq!(sent, ["", "", ""]);
        assert_eq!((rest.as_str(), calls), ("", 1));
        let (sent, _, calls) = run(ToolMode::Auto(ToolParser::Llama3Json), &["Hi", " there"]);
        assert_eq!(
            (sent, calls),
            (vec!["Hi".to_string(), " there".to_string()], 0)
        );
        let (sent, rest, calls) = run(
            ToolMode::Required,
            &["[{\"name\": \"f\", \"parameters\": {}}]"],
        );
        assert_eq!((sent, rest.as_str(), calls), (vec![String::new()], "", 1));
    }

    #[test]
    fn parsers_find_the_calls() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
        let (content, calls) = extract(&ToolMode::Auto(ToolParser::Hermes), text, "r");
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].id, "chatcmpl-tool-r-1");
        let (content, calls) = extract(&ToolMode::Auto(ToolParser::Hermes), "just text", "r");
        assert_eq!((content.as_deref(), calls.len()), (Some("just text"), 0));
        let broken = "<tool_call>{\"name\": oops</tool_call>";
        assert_eq!(
            extract(&ToolMode::Auto(ToolParser::Hermes), broken, "r")
                .1
                .len(),
            0
        );
        let (content, calls) = extract(
            &ToolMode::Auto(ToolParser::Llama3Json),
            "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}",
            "r",
        );
        assert_eq!((content, calls.len()), (None, 1));
        let (content, calls) = extract(
            &ToolMode::Auto(ToolParser::Mistral),
            "Sure.[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}]",
            "r",
        );
        assert_eq!((content.as_deref(), calls.len()), (Some("Sure."), 1));
        let (_, calls) = extract(
            &ToolMode::Auto(ToolParser::Mistral),
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}",
            "r",
        );
        assert_eq!(calls[0].function.arguments, r#"{"city":"Rome"}"#);
        let (content, calls) = extract(
            &ToolMode::Auto(ToolParser::Pythonic),
            "[get_weather(city='Rome')]",
            "r",
        );
        assert_eq!(
            (content, calls[0].function.name.as_str()),
            (None, "get_weather")
        );
    }
}

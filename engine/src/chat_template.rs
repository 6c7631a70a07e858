//! HF chat templates rendered with minijinja, configured as transformers does
//! (`trim_blocks`, `lstrip_blocks`, Python string and dict methods via minijinja-contrib's
//! pycompat, `raise_exception`, `strftime_now`, a `tojson` that matches Python's
//! `json.dumps(..., ensure_ascii=False)`).
//!
//! Variables: `messages`, `add_generation_prompt`, `tools` (when given), `bos_token` and
//! `eos_token` (the checkpoint's, unless the request's kwargs set them), and every template
//! kwarg. `messages` and `add_generation_prompt` always come from the request itself.
//!
//! `continue_final_message` renders without the generation prompt and cuts everything after the
//! final message's content, as transformers does.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use std::collections::HashMap;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, Value};
use minijinja::{Environment, Error as JinjaError, ErrorKind};

use crate::api::ChatTemplateOptions;
use crate::error::{EngineError, Result};

const TEMPLATE_NAME: &str = "chat_template";

/// A JSON object exposed to templates with its key order kept (Python dicts keep insertion
/// order; minijinja's own maps would sort keys unless built with `preserve_order`).
#[derive(Debug)]
struct JsonMap {
    keys: Vec<Value>,
    values: HashMap<String, Value>,
}

impl Object for JsonMap {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.values.get(key.as_str()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Iter(Box::new(self.keys.clone().into_iter()))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.keys.len())
    }
}

/// Convert request JSON into template values, keeping object key order.
fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        J::String(s) => Value::from(s.as_str()),
        J::Array(items) => Value::from(items.iter().map(json_value).collect::<Vec<_>>()),
        J::Object(map) => Value::from_object(JsonMap {
            keys: map.keys().map(|k| Value::from(k.as_str())).collect(),
            values: map
                .iter()
                .map(|(k, v)| (k.clone(), json_value(v)))
                .collect(),
        }),
    }
}

/// vLLM's message when a model has no template.
pub const NO_TEMPLATE_MESSAGE: &str = "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template if the tokenizer does not define one.";

/// The error a template's `raise_exception(msg)` call raises, carried as the jinja error's source.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

/// A compiled chat template (compile once, render per request).
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

fn map_error(err: JinjaError) -> EngineError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&err);
    while let Some(s) = source {
        if let Some(raised) = s.downcast_ref::<RaisedException>() {
            return EngineError::Template(raised.0.clone());
        }
        source = s.source();
    }
    let mut msg = match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    };
    if let Some(line) = err.line() {
        let _ = write!(msg, " (line {line})");
    }
    EngineError::Template(msg)
}

/// Remove transformers' `{% generation %}` / `{% endgeneration %}` markers (an extension that
/// only tracks assistant tokens and renders its body unchanged).
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let tag = &rest[start..start + len + 2];
        let inner =
            tag[2..tag.len() - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(tag);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

fn new_environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build();
    match syntax {
        Ok(s) => env.set_syntax(s),
        Err(e) => tracing::error!("chat template syntax config: {e}"),
    }
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg.clone())
                .with_source(RaisedException(msg)))
        },
    );
    env.add_function(
        "strftime_now",
        |fmt: String| -> std::result::Result<Value, JinjaError> {
            let secs = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            Ok(Value::from(strftime(&fmt, secs)))
        },
    );
    env.add_filter("tojson", tojson);
    env
}

/// `tojson(indent=None, separators=None, sort_keys=False)` as transformers defines it:
/// `json.dumps(x, ensure_ascii=False, ...)`.
fn tojson(value: Value, args: Kwargs) -> std::result::Result<Value, JinjaError> {
    let indent: Option<usize> = args.get("indent")?;
    let sort_keys: Option<bool> = args.get("sort_keys")?;
    let separators: Option<Vec<String>> = args.get("separators")?;
    args.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let fmt = PyJson {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    fmt.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Python `json.dumps` formatting.
struct PyJson {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl PyJson {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    }

    fn write(&self, v: &serde_json::Value, level: usize, out: &mut String) {
        use serde_json::Value as J;
        match v {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Number(n) => out.push_str(&py_number(n)),
            J::String(s) => write_py_string(s, out),
            J::Array(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.sep());
                    }
                    self.newline(level + 1, out);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push(']');
            }
            J::Object(map) => {
                if map.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, val)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.sep());
                    }
                    self.newline(level + 1, out);
                    write_py_string(k, out);
                    out.push_str(&self.key_sep);
                    self.write(val, level + 1, out);
                }
                self.newline(level, out);
                out.push('}');
            }
        }
    }

    fn sep(&self) -> &str {
        // With an indent, Python's item separator drops its trailing space before the newline.
        if self.indent.is_some() {
            self.item_sep.trim_end_matches(' ')
        } else {
            &self.item_sep
        }
    }
}

fn py_number(n: &serde_json::Number) -> String {
    if n.is_i64() || n.is_u64() {
        return n.to_string();
    }
    let f = n.as_f64().unwrap_or(0.0);
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Python repr: 1e+20, 1.5e-05.
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

fn write_py_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Civil date (year, month 1..=12, day 1..=31) of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// A C `strftime` subset over UTC (`%Y %y %m %d %e %H %I %M %S %p %B %b %A %a %j %%`, with the
/// glibc `-` flag for no padding, e.g. `%-d`).
pub fn strftime(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + u32::from(m > 2 && is_leap(y));
    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let num = |v: i64, w: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0w$}")
            }
        };
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&num(y.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(m as i64, 2)),
            Some('d') => out.push_str(&num(d as i64, 2)),
            Some('e') => out.push_str(&if no_pad {
                d.to_string()
            } else {
                format!("{d:>2}")
            }),
            Some('H') => out.push_str(&num(hh, 2)),
            Some('I') => out.push_str(&num(if hh % 12 == 0 { 12 } else { hh % 12 }, 2)),
            Some('M') => out.push_str(&num(mm, 2)),
            Some('S') => out.push_str(&num(ss, 2)),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('j') => out.push_str(&num(yday as i64, 3)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

impl ChatTemplate {
    /// Compile a template.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = new_environment();
        env.add_template_owned(TEMPLATE_NAME, strip_generation_tags(source))
            .map_err(map_error)?;
        Ok(ChatTemplate {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Render `messages` (a JSON array of message objects).
    pub fn render(
        &self,
        messages: &serde_json::Value,
        opts: &ChatTemplateOptions,
    ) -> Result<String> {
        if !messages.is_array() {
            return Err(EngineError::invalid(
                "messages must be a list",
                Some("messages"),
            ));
        }
        let add_generation_prompt = opts.add_generation_prompt && !opts.continue_final_message;
        let mut ctx = opts.template_kwargs.clone();
        if let Some(b) = &self.bos_token {
            ctx.entry("bos_token")
                .or_insert_with(|| serde_json::Value::String(b.clone()));
        }
        if let Some(e) = &self.eos_token {
            ctx.entry("eos_token")
                .or_insert_with(|| serde_json::Value::String(e.clone()));
        }
        if let Some(tools) = &opts.tools {
            ctx.insert("tools".into(), tools.clone());
        }
        ctx.insert("messages".into(), messages.clone());
        ctx.insert(
            "add_generation_prompt".into(),
            serde_json::Value::Bool(add_generation_prompt),
        );
        let template = self.env.get_template(TEMPLATE_NAME).map_err(map_error)?;
        let rendered = template
            .render(json_value(&serde_json::Value::Object(ctx)))
            .map_err(map_error)?;
        if opts.continue_final_message {
            return cut_after_final_message(rendered, messages);
        }
        Ok(rendered)
    }
}

/// Compile and render a one-off template (a per-request `chat_template`).
pub fn render_once(
    source: &str,
    bos_token: Option<String>,
    eos_token: Option<String>,
    messages: &serde_json::Value,
    opts: &ChatTemplateOptions,
) -> Result<String> {
    ChatTemplate::new(source, bos_token, eos_token)?.render(messages, opts)
}

/// transformers' `continue_final_message`: keep the rendered chat up to the end of the final
/// message's content.
fn cut_after_final_message(mut rendered: String, messages: &serde_json::Value) -> Result<String> {
    let last = messages.as_array().and_then(|m| m.last()).ok_or_else(|| {
        EngineError::invalid(
            "continue_final_message is set but there is no message to continue",
            Some("messages"),
        )
    })?;
    let final_text = match last.get("content") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(parts)) => parts
            .iter()
            .rev()
            .find_map(|p| p.get("text").and_then(|t| t.as_str()).map(str::to_string))
            .ok_or_else(|| {
                EngineError::invalid(
                    "continue_final_message is set but we could not find any text to continue in the final message!",
                    Some("messages"),
                )
            })?,
        _ => {
            return Err(EngineError::invalid(
                "continue_final_message is set but we could not find any text to continue in the final message!",
                Some("messages"),
            ))
        }
    };
    let stripped = final_text.trim();
    let Some(loc) = rendered.rfind(stripped) else {
        return Err(EngineError::invalid(
            "continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible.",
            Some("messages"),
        ));
    };
    let lstripped = final_text.trim_start();
    let end = if rendered[loc..].starts_with(lstripped) {
        loc + lstripped.len()
    } else {
        loc + stripped.len()
    };
    rendered.truncate(end);
    Ok(rendered)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn opts(gen: bool) -> ChatTemplateOptions {
        ChatTemplateOptions {
            add_generation_prompt: gen,
            ..Default::default()
        }
    }

    const SIMPLE: &str = "{% for m in messages %}<{{ m.role }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";

    #[test]
    fn renders_with_generation_prompt() {
        let t = ChatTemplate::new(SIMPLE, None, None).unwrap();
        let msgs = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(
            t.render(&msgs, &opts(true)).unwrap(),
            "<user>hi\n<assistant>"
        );
        assert_eq!(t.render(&msgs, &opts(false)).unwrap(), "<user>hi\n");
    }

    #[test]
    fn trim_and_lstrip_blocks() {
        let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let msgs = json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]);
        assert_eq!(t.render(&msgs, &opts(false)).unwrap(), "U:a\nU:b\n");
    }

    #[test]
    fn raise_exception_message_is_kept() {
        let src = "{% if messages[0].role != 'system' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let err = t
            .render(&json!([{"role": "user", "content": "x"}]), &opts(true))
            .unwrap_err();
        match err {
            EngineError::Template(m) => {
                assert_eq!(
                    m,
                    "Conversation roles must alternate user/assistant/user/assistant/..."
                )
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn syntax_errors_are_template_errors() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", None, None),
            Err(EngineError::Template(_))
        ));
    }

    #[test]
    fn pycompat_methods_and_tokens() {
        let src = "{{ bos_token }}{% for m in messages %}{{ m.content.strip() }}{% if m.content.startswith(' ') %}!{% endif %}{% for k, v in m.items() %}[{{ k }}]{% endfor %}{% endfor %}{{ eos_token }}{{ flavour }}";
        let t = ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into())).unwrap();
        let mut o = opts(false);
        o.template_kwargs.insert("flavour".into(), json!("X"));
        let out = t
            .render(&json!([{"role": "user", "content": "  hi "}]), &o)
            .unwrap();
        assert_eq!(out, "<s>hi![role][content]</s>X");
        // kwargs may override the special tokens.
        o.template_kwargs.insert("bos_token".into(), json!("B"));
        assert!(t
            .render(&json!([{"role": "user", "content": "x"}]), &o)
            .unwrap()
            .starts_with('B'));
    }

    #[test]
    fn tojson_matches_python() {
        let src = "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ {'b': 1, 'a': 2.5} | tojson(sort_keys=true) }}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let mut o = opts(false);
        o.tools = Some(json!([{"name": "f<x>", "d": "é\n", "p": {"x": [1, 2]}, "e": {}}]));
        let out = t.render(&json!([]), &o).unwrap();
        assert_eq!(
            out,
            "[{\"name\": \"f<x>\", \"d\": \"é\\n\", \"p\": {\"x\": [1, 2]}, \"e\": {}}]|{\n  \"name\": \"f<x>\",\n  \"d\": \"é\\n\",\n  \"p\": {\n    \"x\": [\n      1,\n      2\n    ]\n  },\n  \"e\": {}\n}|{\"a\": 2.5, \"b\": 1}"
        );
    }

    #[test]
    fn continue_final_message_cuts_after_content() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
            None,
            None,
        )
        .unwrap();
        let msgs =
            json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]);
        let o = ChatTemplateOptions {
            add_generation_prompt: true,
            continue_final_message: true,
            ..Default::default()
        };
        assert_eq!(
            t.render(&msgs, &o).unwrap(),
            "<user>hi</s>\n<assistant>Sure, "
        );
        let parts = json!([{"role": "assistant", "content": [{"type": "text", "text": "A"}]}]);
        let t2 = ChatTemplate::new(
            "{% for m in messages %}[{{ m.content[0].text }}]{% endfor %}",
            None,
            None,
        )
        .unwrap();
        assert_eq!(t2.render(&parts, &o).unwrap(), "[A");
    }

    #[test]
    fn generation_tags_are_ignored() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% generation %}{{ m.content }}{%- endgeneration %}{% endfor %}",
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            t.render(
                &json!([{"role": "assistant", "content": "ok"}]),
                &opts(false)
            )
            .unwrap(),
            "ok"
        );
    }

    #[test]
    fn strftime_formats_utc() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %-d, %I %p %j %%", t),
            "Thursday February 29, 01 PM 060 %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}", None, None).unwrap();
        let year: i32 = t.render(&json!([]), &opts(false)).unwrap().parse().unwrap();
        assert!(year >= 2024);
    }

    #[test]
    fn python_number_formatting() {
        let n = |v: serde_json::Value| match v {
            serde_json::Value::Number(n) => py_number(&n),
            _ => unreachable!(),
        };
        assert_eq!(n(json!(1.0)), "1.0");
        assert_eq!(n(json!(1e20)), "1e+20");
        assert_eq!(n(json!(1.5e-5)), "1.5e-05");
        assert_eq!(n(json!(-3)), "-3");
        assert_eq!(n(json!(0.25)), "0.25");
    }
}

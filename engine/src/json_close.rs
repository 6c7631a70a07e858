//! The shortest text that completes a JSON prefix into a value a JSON Schema accepts: what a
//! structured-output reply is forced to end with when its `max_tokens` is about to run out
//! (see `constraint::TokenRules`).
//!
//! The prefix is what the grammar let through, so it is JSON as far as it goes; this reads it
//! with a small incremental parser (containers open, the member or item in progress, a string,
//! number or literal cut short) and then closes from the inside out: finish the scalar, add the
//! required properties and `minItems` items still missing with their shortest values, close
//! every container. Whatever it cannot complete with certainty (a `pattern`, a `format`, an
//! `allOf` of several schemas) gives `None`, and the reply is not forced.

use serde_json::Value;

/// A container open in the prefix, with the schema that governs it.
enum Frame<'s> {
    Object {
        schema: &'s Value,
        seen: Vec<String>,
        state: ObjectState,
    },
    Array {
        schema: &'s Value,
        items: usize,
        state: ArrayState,
    },
}

enum ObjectState {
    /// After `{`: a key or the end.
    KeyOrEnd,
    /// After `,`: a key.
    Key,
    /// Inside a key's quotes.
    InKey(String),
    Colon(String),
    Value(String),
    /// After a member's value.
    After,
}

enum ArrayState {
    ValueOrEnd,
    Value,
    After,
}

/// A scalar cut short.
enum Partial<'s> {
    None,
    Str {
        schema: &'s Value,
        text: String,
        /// An escape in progress: `Some(0)` after a lone `\`, `Some(n)` with `n` hex digits of
        /// a `\u` still to come.
        escape: Option<usize>,
    },
    Number(String),
    Literal(&'static str, usize),
}

/// The shortest completion of `prefix` under `schema` (`root` resolves `$ref`s), or `None`
/// when the prefix is complete already, malformed, or needs what this does not model.
pub fn shortest_completion(root: &Value, prefix: &str) -> Option<String> {
    let mut frames: Vec<Frame<'_>> = Vec::new();
    let mut partial = Partial::None;
    let mut done = false;
    for c in prefix.chars() {
        match &mut partial {
            Partial::Str { text, escape, .. } => {
                if let Some(left) = *escape {
                    *escape = match (left, c) {
                        (0, 'u') => Some(4),
                        (0, _) | (1, _) => None,
                        (n, _) => Some(n - 1),
                    };
                    text.push(c);
                    continue;
                }
                match c {
                    '\\' => {
                        *escape = Some(0);
                        text.push(c);
                    }
                    '"' => {
                        partial = Partial::None;
                        value_done(&mut frames, &mut done);
                    }
                    _ => text.push(c),
                }
                continue;
            }
            Partial::Number(text) => {
                if c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E') {
                    text.push(c);
                    continue;
                }
                partial = Partial::None;
                value_done(&mut frames, &mut done);
            }
            Partial::Literal(word, at) => {
                if !word[*at..].starts_with(c) {
                    return None;
                }
                *at += 1;
                if *at == word.len() {
                    partial = Partial::None;
                    value_done(&mut frames, &mut done);
                }
                continue;
            }
            Partial::None => {}
        }
        if c.is_whitespace() {
            continue;
        }
        // Inside a key's quotes, characters belong to the key.
        if let Some(Frame::Object {
            state: ObjectState::InKey(key),
            ..
        }) = frames.last_mut()
        {
            match c {
                '"' => {
                    let key = std::mem::take(key);
                    set_object_state(&mut frames, ObjectState::Colon(key));
                }
                '\\' => return None,
                _ => key.push(c),
            }
            continue;
        }
        match frames.last_mut() {
            Some(Frame::Object { state, .. }) => match (&*state, c) {
                (ObjectState::KeyOrEnd | ObjectState::After, '}') => {
                    frames.pop();
                    value_done(&mut frames, &mut done);
                    continue;
                }
                (ObjectState::KeyOrEnd | ObjectState::Key, '"') => {
                    *state = ObjectState::InKey(String::new());
                    continue;
                }
                (ObjectState::After, ',') => {
                    *state = ObjectState::Key;
                    continue;
                }
                (ObjectState::Colon(key), ':') => {
                    *state = ObjectState::Value(key.clone());
                    continue;
                }
                (ObjectState::Value(_), _) => {}
                _ => return None,
            },
            Some(Frame::Array { state, .. }) => match (&*state, c) {
                (ArrayState::ValueOrEnd | ArrayState::After, ']') => {
                    frames.pop();
                    value_done(&mut frames, &mut done);
                    continue;
                }
                (ArrayState::After, ',') => {
                    *state = ArrayState::Value;
                    continue;
                }
                (ArrayState::After, _) => return None,
                _ => {}
            },
            None if done => return None,
            None => {}
        }
        // A value starts here.
        let schema = resolve(root, value_schema(root, &frames)?)?;
        match c {
            '{' => frames.push(Frame::Object {
                schema,
                seen: Vec::new(),
                state: ObjectState::KeyOrEnd,
            }),
            '[' => frames.push(Frame::Array {
                schema,
                items: 0,
                state: ArrayState::ValueOrEnd,
            }),
            '"' => {
                partial = Partial::Str {
                    schema,
                    text: String::new(),
                    escape: None,
                }
            }
            't' => partial = Partial::Literal("true", 1),
            'f' => partial = Partial::Literal("false", 1),
            'n' => partial = Partial::Literal("null", 1),
            '-' | '0'..='9' => partial = Partial::Number(c.to_string()),
            _ => return None,
        }
    }
    if done && frames.is_empty() {
        return None;
    }
    let mut out = String::new();
    // The scalar in progress, then the containers from the inside out.
    let closed_scalar = match partial {
        Partial::None => false,
        Partial::Str {
            schema,
            text,
            escape,
        } => {
            out.push_str(&close_string(schema, &text, escape)?);
            true
        }
        Partial::Number(text) => {
            let schema = resolve(root, value_schema(root, &frames)?)?;
            out.push_str(&close_number(schema, &text)?);
            true
        }
        Partial::Literal(word, at) => {
            out.push_str(&word[at..]);
            true
        }
    };
    if frames.is_empty() {
        if closed_scalar {
            return Some(out);
        }
        return shortest(root, root);
    }
    let mut first = true;
    while let Some(frame) = frames.pop() {
        let value_just_closed = !first || closed_scalar;
        first = false;
        match frame {
            Frame::Object {
                schema,
                mut seen,
                state,
            } => {
                let state = match state {
                    ObjectState::Value(key) if value_just_closed => {
                        seen.push(key);
                        ObjectState::After
                    }
                    s => s,
                };
                out.push_str(&close_object(root, schema, &seen, state)?);
            }
            Frame::Array {
                schema,
                items,
                state,
            } => {
                let (items, state) = match state {
                    ArrayState::Value | ArrayState::ValueOrEnd if value_just_closed => {
                        (items + 1, ArrayState::After)
                    }
                    s => (items, s),
                };
                out.push_str(&close_array(root, schema, items, state)?);
            }
        }
    }
    Some(out)
}

fn set_object_state(frames: &mut [Frame<'_>], next: ObjectState) {
    if let Some(Frame::Object { state, .. }) = frames.last_mut() {
        *state = next;
    }
}

/// A value ended: the frame that holds it moves past it.
fn value_done(frames: &mut [Frame<'_>], done: &mut bool) {
    match frames.last_mut() {
        None => *done = true,
        Some(Frame::Object { seen, state, .. }) => {
            if let ObjectState::Value(key) = state {
                seen.push(std::mem::take(key));
            }
            *state = ObjectState::After;
        }
        Some(Frame::Array { items, state, .. }) => {
            *items += 1;
            *state = ArrayState::After;
        }
    }
}

/// The schema of the value that starts at the innermost frame's current position.
fn value_schema<'s>(root: &'s Value, frames: &[Frame<'s>]) -> Option<&'s Value> {
    match frames.last() {
        None => Some(root),
        Some(Frame::Object {
            schema,
            state: ObjectState::Value(key),
            ..
        }) => property_schema(schema, key),
        Some(Frame::Array { schema, items, .. }) => item_schema(schema, *items),
        Some(Frame::Object { .. }) => None,
    }
}

const ANY: &Value = &Value::Bool(true);

fn property_schema<'s>(schema: &'s Value, key: &str) -> Option<&'s Value> {
    if let Some(p) = schema.get("properties").and_then(|p| p.get(key)) {
        return Some(p);
    }
    match schema.get("additionalProperties") {
        None | Some(Value::Bool(true)) => Some(ANY),
        Some(Value::Bool(false)) => None,
        Some(s) => Some(s),
    }
}

fn item_schema(schema: &Value, index: usize) -> Option<&Value> {
    if let Some(p) = schema
        .get("prefixItems")
        .and_then(Value::as_array)
        .and_then(|p| p.get(index))
    {
        return Some(p);
    }
    match schema.get("items") {
        None | Some(Value::Bool(true)) => Some(ANY),
        Some(Value::Bool(false)) => None,
        Some(s) => Some(s),
    }
}

/// `schema` with its `$ref` followed (local references only).
fn resolve<'s>(root: &'s Value, schema: &'s Value) -> Option<&'s Value> {
    let mut s = schema;
    for _ in 0..32 {
        match s.get("$ref").and_then(Value::as_str) {
            None => return Some(s),
            Some(r) => s = root.pointer(r.strip_prefix('#')?)?,
        }
    }
    None
}

fn close_string(schema: &Value, text: &str, escape: Option<usize>) -> Option<String> {
    let mut out = String::new();
    // Finish an escape: `\` takes `n`, `\uXY` takes zeros.
    match escape {
        None => {}
        Some(0) => out.push('n'),
        Some(n) => out.push_str(&"0".repeat(n)),
    }
    let options: Option<Vec<&str>> = match (schema.get("enum"), schema.get("const")) {
        (Some(Value::Array(a)), _) => Some(a.iter().filter_map(Value::as_str).collect()),
        (_, Some(Value::String(c))) => Some(vec![c.as_str()]),
        _ => None,
    };
    if let Some(options) = options {
        let rest = options
            .iter()
            .filter_map(|o| o.strip_prefix(text))
            .min_by_key(|r| r.len())?;
        return Some(format!("{rest}\""));
    }
    if schema.get("pattern").is_some() || schema.get("format").is_some() {
        return None;
    }
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
    let have = text.chars().count() + usize::from(escape.is_some());
    out.push_str(&"a".repeat(min.saturating_sub(have)));
    out.push('"');
    Some(out)
}

/// The digits that finish the number `text` inside the schema's bounds: a zero after a sign,
/// point or exponent, then as few more digits as bring a positive integer up to `minimum`.
fn close_number(schema: &Value, text: &str) -> Option<String> {
    let mut out = String::new();
    if text.ends_with(['-', '+', '.', 'e', 'E']) {
        out.push('0');
    }
    let (low, high) = bounds(schema);
    let fits = |v: f64| low.is_none_or(|l| v >= l) && high.is_none_or(|h| v <= h);
    let value: f64 = format!("{text}{out}").parse().ok()?;
    if fits(value) {
        return Some(out);
    }
    let digits = format!("{text}{out}");
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let base: f64 = digits.parse().ok()?;
    for extra in 1..=18 {
        let scale = 10f64.powi(extra);
        let (lo, hi) = (base * scale, base * scale + scale - 1.0);
        let want = low.map_or(lo, |l| l.ceil().max(lo));
        if want <= hi && fits(want) {
            let tail = (want - lo) as u64;
            return Some(format!("{out}{tail:0width$}", width = extra as usize));
        }
    }
    None
}

/// `minimum` / `exclusiveMinimum` and `maximum` / `exclusiveMaximum` as inclusive integer
/// bounds (what integers need; numbers take the same, conservatively).
fn bounds(schema: &Value) -> (Option<f64>, Option<f64>) {
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    let low = num("minimum").or_else(|| num("exclusiveMinimum").map(|m| m.floor() + 1.0));
    let high = num("maximum").or_else(|| num("exclusiveMaximum").map(|m| m.ceil() - 1.0));
    (low, high)
}

fn close_object(
    root: &Value,
    schema: &Value,
    seen: &[String],
    state: ObjectState,
) -> Option<String> {
    let missing: Vec<&str> = required(schema)
        .into_iter()
        .filter(|k| !seen.iter().any(|s| s == k))
        .collect();
    let without =
        |key: &str| -> Vec<&str> { missing.iter().copied().filter(|k| *k != key).collect() };
    let value_of = |key: &str| shortest(root, property_schema(schema, key)?);
    let declared = || {
        schema
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|p| p.keys().map(String::as_str))
    };
    match state {
        ObjectState::KeyOrEnd | ObjectState::After => {
            finish_object(root, schema, String::new(), &missing, !seen.is_empty())
        }
        ObjectState::Key => {
            // A member must follow the comma: the next required one, else a declared one, else
            // (where other properties are allowed) the empty name.
            let key = missing
                .first()
                .copied()
                .or_else(|| declared().find(|k| !seen.iter().any(|s| s == k)))
                .unwrap_or("");
            let out = format!("{}:{}", Value::String(key.to_string()), value_of(key)?);
            finish_object(root, schema, out, &without(key), true)
        }
        ObjectState::InKey(typed) => {
            // The key typed so far, finished as the first required, else declared, name it
            // begins; else as typed (where other properties are allowed).
            let key = missing
                .iter()
                .copied()
                .chain(declared())
                .find(|k| k.starts_with(typed.as_str()) && !seen.iter().any(|s| s == k))
                .unwrap_or(typed.as_str())
                .to_string();
            let out = format!("{}\":{}", &key[typed.len()..], value_of(&key)?);
            finish_object(root, schema, out, &without(&key), true)
        }
        ObjectState::Colon(key) => {
            let out = format!(":{}", value_of(&key)?);
            finish_object(root, schema, out, &without(&key), true)
        }
        ObjectState::Value(key) => {
            let out = value_of(&key)?;
            finish_object(root, schema, out, &without(&key), true)
        }
    }
}

/// `out`, the members for `missing` (each after a comma when a member precedes it), `}`.
fn finish_object(
    root: &Value,
    schema: &Value,
    mut out: String,
    missing: &[&str],
    mut has_members: bool,
) -> Option<String> {
    for key in missing {
        let value = shortest(root, property_schema(schema, key)?)?;
        if has_members {
            out.push(',');
        }
        out.push_str(&format!("{}:{value}", Value::String((*key).to_string())));
        has_members = true;
    }
    out.push('}');
    Some(out)
}

fn close_array(root: &Value, schema: &Value, items: usize, state: ArrayState) -> Option<String> {
    let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
    let mut out = String::new();
    let mut count = items;
    if let ArrayState::Value = state {
        out.push_str(&shortest(root, item_schema(schema, count)?)?);
        count += 1;
    }
    while count < min {
        if count > 0 {
            out.push(',');
        }
        out.push_str(&shortest(root, item_schema(schema, count)?)?);
        count += 1;
    }
    out.push(']');
    Some(out)
}

fn required(schema: &Value) -> Vec<&str> {
    let listed: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // In the order the properties are declared (the grammar emits them in that order).
    let mut ordered: Vec<&str> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.keys()
                .map(String::as_str)
                .filter(|k| listed.contains(k))
                .collect()
        })
        .unwrap_or_default();
    let undeclared: Vec<&str> = listed
        .iter()
        .copied()
        .filter(|k| !ordered.contains(k))
        .collect();
    ordered.extend(undeclared);
    ordered
}

/// The shortest JSON text `schema` accepts, or `None` where that needs what this does not
/// model.
pub fn shortest(root: &Value, schema: &Value) -> Option<String> {
    let schema = resolve(root, schema)?;
    let schema = match schema {
        Value::Bool(true) => return Some("0".into()),
        Value::Bool(false) => return None,
        s => s,
    };
    if let Some(c) = schema.get("const") {
        return Some(c.to_string());
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        return options.iter().map(Value::to_string).min_by_key(String::len);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = schema.get(key).and_then(Value::as_array) {
            return branches
                .iter()
                .filter_map(|b| shortest(root, b))
                .min_by_key(String::len);
        }
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        return match all.as_slice() {
            [one] => shortest(root, one),
            _ => None,
        };
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ if schema.get("properties").is_some() || schema.get("required").is_some() => {
            vec!["object"]
        }
        _ if schema.get("items").is_some() || schema.get("prefixItems").is_some() => {
            vec!["array"]
        }
        _ => return Some("0".into()),
    };
    types
        .into_iter()
        .filter_map(|t| shortest_of_type(root, schema, t))
        .min_by_key(String::len)
}

fn shortest_of_type(root: &Value, schema: &Value, ty: &str) -> Option<String> {
    match ty {
        "null" => Some("null".into()),
        "boolean" => Some("true".into()),
        "string" => close_string(schema, "", None).map(|s| format!("\"{s}")),
        "integer" | "number" => {
            if schema.get("multipleOf").is_some() {
                return None;
            }
            let (low, high) = bounds(schema);
            let v = match (low, high) {
                (Some(l), _) if l > 0.0 => l.ceil(),
                (_, Some(h)) if h < 0.0 => h.floor(),
                _ => 0.0,
            };
            if high.is_some_and(|h| v > h) || low.is_some_and(|l| v < l) {
                return None;
            }
            Some(format!("{}", v as i64))
        }
        "object" => {
            close_object(root, schema, &[], ObjectState::KeyOrEnd).map(|s| format!("{{{s}"))
        }
        "array" => close_array(root, schema, 0, ArrayState::ValueOrEnd).map(|s| format!("[{s}")),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 18},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                "kind": {"enum": ["person", "robot"]},
                "note": {"type": "string"},
                "home": {"$ref": "#/$defs/place"}
            },
            "required": ["name", "age", "tags", "kind", "home"],
            "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string", "minLength": 2}}, "required": ["city"]}}
        })
    }

    /// `prefix` + its completion parses and has every required field.
    fn closes(prefix: &str) -> String {
        let s = schema();
        let tail = shortest_completion(&s, prefix).unwrap_or_else(|| panic!("{prefix:?}"));
        let whole = format!("{prefix}{tail}");
        let v: Value = serde_json::from_str(&whole).unwrap_or_else(|e| panic!("{whole}: {e}"));
        for k in ["name", "age", "tags", "kind", "home"] {
            assert!(v.get(k).is_some(), "{whole} lacks {k}");
        }
        assert!(v["tags"].as_array().unwrap().len() >= 2, "{whole}");
        assert!(v["age"].as_i64().unwrap() >= 18, "{whole}");
        assert!(v["home"]["city"].as_str().unwrap().len() >= 2, "{whole}");
        whole
    }

    #[test]
    fn the_empty_prefix_gets_the_shortest_valid_value() {
        assert_eq!(
            closes(""),
            r#"{"name":"","age":18,"tags":["",""],"kind":"robot","home":{"city":"aa"}}"#
        );
    }

    #[test]
    fn every_cut_of_a_valid_reply_closes_into_a_valid_one() {
        let reply = r#"{ "name" : "Ada \"L\" \u00e9", "age": 36, "tags": ["a", "b", "c"], "kind": "person", "note": "x", "home": {"city": "London"} }"#;
        for (i, _) in reply.char_indices().skip(1) {
            closes(&reply[..i]);
        }
    }

    #[test]
    fn key_and_enum_prefixes_complete_to_a_declared_name() {
        assert!(closes(r#"{"na"#).starts_with(r#"{"name":"#));
        assert!(
            closes(r#"{"name":"x","age":20,"tags":["a","b"],"kind":"pe"#)
                .contains(r#""kind":"person""#)
        );
        assert!(closes(r#"{"name":"x","age":2"#).contains(r#""age":20,"#));
    }

    #[test]
    fn a_comma_after_the_last_declared_property_takes_another() {
        let open = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            shortest_completion(&open, r#"{"a": 1, "#).as_deref(),
            Some(r#""":0}"#)
        );
        let closed = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": false});
        assert_eq!(shortest_completion(&closed, r#"{"a": 1, "#), None);
    }

    #[test]
    fn what_it_cannot_model_is_none() {
        let pattern = json!({"type": "string", "pattern": "^[A-Z]{3}$"});
        assert_eq!(shortest_completion(&pattern, "\"AB"), None);
        let complete = json!({"type": "integer"});
        assert_eq!(shortest_completion(&complete, "12 "), None);
        assert_eq!(shortest_completion(&complete, "12"), Some(String::new()));
        // A character that shares a literal's low byte is no part of it.
        let object = json!({"type": "object"});
        assert_eq!(
            shortest_completion(&object, "{\"a\":tru"),
            Some("e}".into())
        );
        assert_eq!(shortest_completion(&object, "{\"a\":tru\u{165}"), None);
        let all = json!({"allOf": [{"type": "object"}, {"required": ["a"]}]});
        assert_eq!(shortest_completion(&all, ""), None);
    }
}

//! Structured outputs and token rules from the request: `response_format`, vLLM's
//! `structured_outputs` and the older `guided_*` fields become one engine [`Constraint`];
//! `logit_bias`, `allowed_token_ids` and `bad_words` become the engine's token rules. Only the
//! shapes are checked here; the engine compiles the grammar and checks token ids.

use engine::api::Constraint;
use serde_json::{Map, Value};

use super::sampling::SamplingFields;
use crate::error::{ApiError, ApiResult};

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

/// A JSON Schema given inline or as JSON text (vLLM accepts both for `guided_json` and
/// `structured_outputs.json`).
fn schema(value: &Value, param: &str) -> ApiResult<Constraint> {
    match value {
        Value::Object(_) | Value::Bool(_) => Ok(Constraint::JsonSchema(value.clone())),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(v @ (Value::Object(_) | Value::Bool(_))) => Ok(Constraint::JsonSchema(v)),
            _ => Err(bad(format!("{param} must be a JSON Schema object."), param)),
        },
        _ => Err(bad(format!("{param} must be a JSON Schema object."), param)),
    }
}

fn string(value: &Value, param: &str) -> ApiResult<String> {
    value
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or_else(|| bad(format!("{param} must be a non-empty string."), param))
}

fn choices(value: &Value, param: &str) -> ApiResult<Vec<String>> {
    value
        .as_array()
        .filter(|a| !a.is_empty())
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| {
            bad(
                format!("{param} must be a non-empty list of strings."),
                param,
            )
        })
}

fn from_response_format(rf: &Value) -> ApiResult<Option<Constraint>> {
    const P: &str = "response_format";
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => match rf.pointer("/json_schema/schema") {
            None | Some(Value::Null) => Ok(Some(Constraint::JsonObject)),
            Some(s) => schema(s, P).map(Some),
        },
        // `structural_tag` and unknown types are refused by the field checks before this.
        _ => Err(bad("this response_format type is not supported.", P)),
    }
}

/// The keys of `structured_outputs` that choose a constraint, and the options that only
/// tune another engine (accepted when off).
/// How JSON output may use whitespace, when the request says: compact
/// (`disable_any_whitespace`) or a pattern of its own (`whitespace_pattern`,
/// `guided_whitespace_pattern`). Otherwise the engine bounds it.
#[derive(Debug, Default)]
struct Whitespace {
    compact: Option<&'static str>,
    pattern: Option<(String, &'static str)>,
}

impl Whitespace {
    /// The option the request gave, if any.
    fn option(&self) -> Option<&'static str> {
        self.compact.or(self.pattern.as_ref().map(|(_, p)| *p))
    }

    /// `c` with these whitespace options; a 400 naming the option when `c` is not JSON.
    fn apply(self, c: Constraint) -> ApiResult<Constraint> {
        let opts = match (self.compact, self.pattern) {
            (None, None) => return Ok(c),
            (Some(a), Some((_, b))) => {
                return Err(bad(format!("{a} and {b} cannot be used together."), b))
            }
            (Some(param), None) => (serde_json::json!({"whitespace_flexible": false}), param),
            (None, Some((p, param))) => (serde_json::json!({"whitespace_pattern": p}), param),
        };
        let (opts, param) = opts;
        let mut schema = match c {
            Constraint::JsonObject => serde_json::json!({"type": "object"}),
            Constraint::JsonSchema(Value::Bool(true)) => serde_json::json!({}),
            Constraint::JsonSchema(s @ Value::Object(_)) => s,
            Constraint::JsonSchema(s) => return Ok(Constraint::JsonSchema(s)),
            _ => return Err(not_json(param)),
        };
        if let Some(obj) = schema.as_object_mut() {
            let x = obj
                .entry("x-guidance")
                .or_insert_with(|| serde_json::json!({}));
            if let (Some(x), Some(opts)) = (x.as_object_mut(), opts.as_object()) {
                x.extend(opts.clone());
            }
        }
        Ok(Constraint::JsonSchema(schema))
    }
}

fn from_structured_outputs(
    so: &Map<String, Value>,
    ws: &mut Whitespace,
) -> ApiResult<Option<Constraint>> {
    const P: &str = "structured_outputs";
    let mut found = Vec::new();
    for (key, value) in so {
        if value.is_null() {
            continue;
        }
        let c = match key.as_str() {
            "json" => schema(value, P)?,
            "regex" => Constraint::Regex(string(value, P)?),
            "choice" => Constraint::Choice(choices(value, P)?),
            "grammar" => Constraint::Grammar(string(value, P)?),
            "json_object" if value == &Value::Bool(true) => Constraint::JsonObject,
            "json_object" => continue,
            "disable_any_whitespace" => {
                match value {
                    Value::Bool(true) => {
                        ws.compact = Some("structured_outputs.disable_any_whitespace")
                    }
                    Value::Bool(false) => {}
                    _ => {
                        return Err(bad(
                            "structured_outputs.disable_any_whitespace must be a boolean.",
                            P,
                        ))
                    }
                }
                continue;
            }
            "whitespace_pattern" => {
                let p = string(value, "structured_outputs.whitespace_pattern")?;
                ws.pattern = Some((p, "structured_outputs.whitespace_pattern"));
                continue;
            }
            "disable_fallback" | "disable_additional_properties"
                if value == &Value::Bool(false) =>
            {
                continue
            }
            "backend" => continue,
            other => {
                return Err(bad(
                    format!("structured_outputs.{other} is not supported."),
                    P,
                ))
            }
        };
        found.push(c);
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(bad(
            "You can only use one kind of structured outputs constraint ('json', 'regex', \
             'choice', 'grammar' or 'json_object').",
            P,
        )),
    }
}

/// The request's constraint and the field that asked for it; a 400 when two fields ask.
pub fn constraint(s: &SamplingFields) -> ApiResult<Option<(Constraint, &'static str)>> {
    let v = &s.vllm;
    let mut found: Vec<(Constraint, &'static str)> = Vec::new();
    let mut ws = Whitespace::default();
    if let Some(rf) = s.response_format.as_deref() {
        if let Some(c) = from_response_format(rf)? {
            found.push((c, "response_format"));
        }
    }
    match v.structured_outputs.as_deref() {
        None | Some(Value::Null) => {}
        Some(Value::Object(so)) => {
            if let Some(c) = from_structured_outputs(so, &mut ws)? {
                found.push((c, "structured_outputs"));
            }
        }
        Some(_) => {
            return Err(bad(
                "structured_outputs must be an object.",
                "structured_outputs",
            ))
        }
    }
    let guided: [(&'static str, &Option<Box<Value>>); 4] = [
        ("guided_json", &v.guided_json),
        ("guided_regex", &v.guided_regex),
        ("guided_choice", &v.guided_choice),
        ("guided_grammar", &v.guided_grammar),
    ];
    for (name, value) in guided {
        let Some(value) = value.as_deref().filter(|v| !v.is_null()) else {
            continue;
        };
        let c = match name {
            "guided_json" => schema(value, name)?,
            "guided_regex" => Constraint::Regex(string(value, name)?),
            "guided_choice" => Constraint::Choice(choices(value, name)?),
            _ => Constraint::Grammar(string(value, name)?),
        };
        found.push((c, name));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(_, n)| *n).collect();
        return Err(bad(
            format!(
                "You can only use one kind of structured outputs constraint, got {}.",
                names.join(", ")
            ),
            names[1],
        ));
    }
    if let Some(p) = v
        .guided_whitespace_pattern
        .as_deref()
        .filter(|p| !p.is_null())
    {
        let p = string(p, "guided_whitespace_pattern")?;
        if ws.pattern.is_some() {
            return Err(bad(
                "guided_whitespace_pattern and structured_outputs.whitespace_pattern cannot be used together.",
                "guided_whitespace_pattern",
            ));
        }
        ws.pattern = Some((p, "guided_whitespace_pattern"));
    }
    match found.pop() {
        Some((c, field)) => Ok(Some((ws.apply(c)?, field))),
        None => match ws.option() {
            Some(param) => Err(not_json(param)),
            None => Ok(None),
        },
    }
}

fn not_json(param: &str) -> ApiError {
    bad(
        format!("{param} applies to JSON output (json, json_object or a JSON schema)."),
        param,
    )
}

/// `logit_bias`: token id (a string key, as the OpenAI API sends it) to a bias in [-100, 100].
pub fn logit_bias(s: &SamplingFields) -> ApiResult<Vec<(u32, f32)>> {
    const P: &str = "logit_bias";
    let Some(value) = s.vllm.logit_bias.as_deref().filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let Some(map) = value.as_object() else {
        return Err(bad("logit_bias must map token ids to numbers.", P));
    };
    let mut out: Vec<(u32, f32)> = map
        .iter()
        .map(|(key, bias)| {
            let id = key
                .trim()
                .parse::<u32>()
                .map_err(|_| bad(format!("logit_bias key {key:?} is not a token id."), P))?;
            let bias = bias
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    bad(
                        format!("logit_bias values must be numbers in [-100, 100], got {bias} for {key}."),
                        P,
                    )
                })?;
            Ok((id, bias as f32))
        })
        .collect::<ApiResult<_>>()?;
    out.sort_by_key(|(id, _)| *id);
    Ok(out)
}

pub fn allowed_token_ids(s: &SamplingFields) -> ApiResult<Option<Vec<u32>>> {
    const P: &str = "allowed_token_ids";
    let Some(value) = s.vllm.allowed_token_ids.as_deref().filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    value
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect::<Option<Vec<u32>>>()
        })
        .map(Some)
        .ok_or_else(|| bad("allowed_token_ids must be a list of token ids.", P))
}

pub fn bad_words(s: &SamplingFields) -> ApiResult<Vec<String>> {
    const P: &str = "bad_words";
    let Some(value) = s.vllm.bad_words.as_deref().filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    value
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| bad("bad_words must be a list of strings.", P))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> SamplingFields {
        serde_json::from_value(v).unwrap()
    }

    fn param(r: ApiResult<impl std::fmt::Debug>) -> Option<String> {
        match r {
            Err(ApiError::BadRequest { param, .. }) => param,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_field_gives_its_constraint() {
        let s = json!({"type": "object"});
        let cases = [
            (
                json!({"response_format": {"type": "json_object"}}),
                Constraint::JsonObject,
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}}),
                Constraint::JsonSchema(s.clone()),
            ),
            (
                json!({"guided_json": s.to_string()}),
                Constraint::JsonSchema(s.clone()),
            ),
            (
                json!({"guided_regex": "a+"}),
                Constraint::Regex("a+".into()),
            ),
            (
                json!({"guided_choice": ["a", "b"]}),
                Constraint::Choice(vec!["a".into(), "b".into()]),
            ),
            (
                json!({"structured_outputs": {"grammar": "start: \"x\""}}),
                Constraint::Grammar("start: \"x\"".into()),
            ),
            (
                json!({"structured_outputs": {"json_object": true}}),
                Constraint::JsonObject,
            ),
        ];
        for (body, want) in cases {
            let got = constraint(&fields(body.clone())).unwrap().map(|(c, _)| c);
            assert_eq!(got, Some(want), "{body}");
        }
        assert_eq!(
            constraint(&fields(json!({"response_format": {"type": "text"}}))).unwrap(),
            None
        );
    }

    #[test]
    fn whitespace_options_become_the_schemas_guidance() {
        let compact = json!({"structured_outputs": {"json_object": true,
            "disable_any_whitespace": true}});
        assert_eq!(
            constraint(&fields(compact)).unwrap().map(|(c, _)| c),
            Some(Constraint::JsonSchema(json!({"type": "object",
                "x-guidance": {"whitespace_flexible": false}})))
        );
        let pattern = json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "array"}}},
            "guided_whitespace_pattern": "[ ]?"});
        assert_eq!(
            constraint(&fields(pattern)).unwrap().map(|(c, _)| c),
            Some(Constraint::JsonSchema(json!({"type": "array",
                "x-guidance": {"whitespace_pattern": "[ ]?"}})))
        );
    }

    #[test]
    fn shapes_and_conflicts_are_400s() {
        let both = json!({"guided_regex": "a", "guided_choice": ["a"]});
        assert_eq!(
            param(constraint(&fields(both))).as_deref(),
            Some("guided_choice")
        );
        let two = json!({"structured_outputs": {"regex": "a", "choice": ["a"]}});
        assert_eq!(
            param(constraint(&fields(two))).as_deref(),
            Some("structured_outputs")
        );
        let unknown = json!({"structured_outputs": {"backend_options": " "}});
        assert_eq!(
            param(constraint(&fields(unknown))).as_deref(),
            Some("structured_outputs")
        );
        // Whitespace options need a JSON constraint, and one kind of them.
        let alone = json!({"structured_outputs": {"whitespace_pattern": " "}});
        assert_eq!(
            param(constraint(&fields(alone))).as_deref(),
            Some("structured_outputs.whitespace_pattern")
        );
        let on_regex = json!({"guided_regex": "a", "guided_whitespace_pattern": " "});
        assert_eq!(
            param(constraint(&fields(on_regex))).as_deref(),
            Some("guided_whitespace_pattern")
        );
        let both = json!({"structured_outputs": {"json_object": true,
            "disable_any_whitespace": true, "whitespace_pattern": " "}});
        assert_eq!(
            param(constraint(&fields(both))).as_deref(),
            Some("structured_outputs.whitespace_pattern")
        );
        assert_eq!(
            param(constraint(&fields(json!({"guided_choice": []})))).as_deref(),
            Some("guided_choice")
        );
        assert_eq!(
            param(logit_bias(&fields(json!({"logit_bias": {"12": 101}})))).as_deref(),
            Some("logit_bias")
        );
        assert_eq!(
            param(logit_bias(&fields(json!({"logit_bias": {"x": 1}})))).as_deref(),
            Some("logit_bias")
        );
        assert_eq!(
            logit_bias(&fields(json!({"logit_bias": {"7": -100, "3": 2.5}}))).unwrap(),
            vec![(3, 2.5), (7, -100.0)]
        );
        assert_eq!(
            param(allowed_token_ids(&fields(
                json!({"allowed_token_ids": [-1]})
            )))
            .as_deref(),
            Some("allowed_token_ids")
        );
        assert_eq!(
            param(bad_words(&fields(json!({"bad_words": [1]})))).as_deref(),
            Some("bad_words")
        );
    }
}

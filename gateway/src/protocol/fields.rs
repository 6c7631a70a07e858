//! What the server does with every field of a generation request. Each field vLLM's chat and
//! completion requests declare is here, in one of three kinds:
//!
//! * honoured: it does what vLLM documents;
//! * refused: a request that sets it to anything but its neutral value is a 400 naming it
//!   (the server cannot do what it asks, and a client that asked must not get something else);
//! * ignored on purpose: accepted and without effect, for the reason given.
//!
//! The tables are the reference (README "Request fields"); `tests` check that every field the
//! wire types declare is classified and that every vLLM field is declared, so a new one cannot
//! slip in unhandled.

use serde_json::Value;

use super::sampling::VllmFields;
use crate::error::{ApiError, ApiResult};

/// How the server treats one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    Honoured,
    /// Refused unless neutral; the text says why.
    Refused(&'static str),
    /// Accepted without effect; the text says why.
    Ignored(&'static str),
}

use Handling::{Honoured, Ignored, Refused};

const NOT_YET: &str = "not implemented by this server yet";

/// Fields chat and completions share.
pub const SHARED: &[(&str, Handling)] = &[
    ("model", Honoured),
    ("temperature", Honoured),
    ("top_p", Honoured),
    ("top_k", Honoured),
    ("min_p", Honoured),
    ("repetition_penalty", Honoured),
    ("presence_penalty", Honoured),
    ("frequency_penalty", Honoured),
    ("seed", Honoured),
    ("stop", Honoured),
    ("stop_token_ids", Honoured),
    ("n", Honoured),
    ("max_tokens", Honoured),
    ("min_tokens", Honoured),
    ("ignore_eos", Honoured),
    ("skip_special_tokens", Honoured),
    ("include_stop_str_in_output", Honoured),
    ("stream", Honoured),
    ("stream_options", Honoured),
    ("cache_salt", Honoured),
    ("truncate_prompt_tokens", Honoured),
    ("response_format", Honoured),
    (
        "user",
        Ignored("an opaque end-user id for the client's own records, as in vLLM"),
    ),
    ("echo", Honoured),
    ("add_special_tokens", Honoured),
    ("mm_processor_kwargs", Honoured),
    ("media_io_kwargs", Honoured),
    ("logit_bias", Honoured),
    ("allowed_token_ids", Honoured),
    ("bad_words", Honoured),
    ("prompt_logprobs", Honoured),
    ("structured_outputs", Honoured),
    ("guided_json", Honoured),
    ("guided_regex", Honoured),
    ("guided_choice", Honoured),
    ("guided_grammar", Honoured),
    (
        "guided_decoding_backend",
        Ignored("the server has one structured-output engine"),
    ),
    ("guided_whitespace_pattern", Honoured),
    ("structural_tag", Refused(NOT_YET)),
    (
        "best_of",
        Ignored("vLLM's V1 engine ignores it too: each of the n choices is returned"),
    ),
    ("use_beam_search", Refused("beam search is not implemented")),
    ("length_penalty", Refused("it applies to beam search only")),
    (
        "spaces_between_special_tokens",
        Ignored("it only changes slow tokenizers' decoding; every tokenizer here is a fast one"),
    ),
    ("priority", Refused("priority scheduling is not enabled")),
    (
        "request_id",
        Ignored("the response id comes from the X-Request-Id header, or a fresh one"),
    ),
    (
        "logits_processors",
        Refused("custom logits processors are not loaded"),
    ),
    ("return_tokens_as_token_ids", Refused(NOT_YET)),
    ("return_token_ids", Refused(NOT_YET)),
    (
        "kv_transfer_params",
        Refused("there is no disaggregated prefill"),
    ),
    ("vllm_xargs", Refused("no extension reads extra arguments")),
];

/// Fields of chat completions only.
pub const CHAT: &[(&str, Handling)] = &[
    ("messages", Honoured),
    ("max_completion_tokens", Honoured),
    ("logprobs", Honoured),
    ("top_logprobs", Honoured),
    ("tools", Honoured),
    ("tool_choice", Honoured),
    ("chat_template", Honoured),
    ("chat_template_kwargs", Honoured),
    ("add_generation_prompt", Honoured),
    ("continue_final_message", Honoured),
    ("documents", Refused(NOT_YET)),
    (
        "parallel_tool_calls",
        Ignored("the parsers return every call the reply makes"),
    ),
    ("reasoning_effort", Refused(NOT_YET)),
    ("include_reasoning", Honoured),
];

/// Fields of completions only.
pub const COMPLETION: &[(&str, Handling)] = &[
    ("prompt", Honoured),
    ("logprobs", Honoured),
    ("suffix", Refused("suffix is not currently supported")),
    ("prompt_embeds", Refused(NOT_YET)),
];

/// Whether `value` asks for nothing: null, false, an empty string, list or object, or the
/// field's own neutral number.
fn is_neutral(field: &str, value: &Value) -> bool {
    match (field, value) {
        (_, Value::Null) | (_, Value::Bool(false)) => true,
        ("priority", v) => v.as_f64() == Some(0.0),
        ("length_penalty", v) => v.as_f64() == Some(1.0),
        (_, Value::String(s)) => s.is_empty(),
        (_, Value::Array(a)) => a.is_empty(),
        (_, Value::Object(o)) => o.is_empty(),
        _ => false,
    }
}

/// The 400 for a refused field set to something.
pub fn refuse(field: &str, value: &Value, table: &[(&str, Handling)]) -> ApiResult<()> {
    let Some((_, Refused(why))) = table.iter().find(|(name, _)| *name == field) else {
        return Ok(());
    };
    if is_neutral(field, value) {
        return Ok(());
    }
    Err(ApiError::bad_request(
        format!("`{field}` is not supported: {why}."),
        Some(field),
    ))
}

impl VllmFields {
    /// The fields that are set, by name.
    pub fn present(&self) -> Vec<(&'static str, &Value)> {
        let all: [(&'static str, &Option<Box<Value>>); 23] = [
            ("logit_bias", &self.logit_bias),
            ("allowed_token_ids", &self.allowed_token_ids),
            ("bad_words", &self.bad_words),
            ("prompt_logprobs", &self.prompt_logprobs),
            ("structured_outputs", &self.structured_outputs),
            ("guided_json", &self.guided_json),
            ("guided_regex", &self.guided_regex),
            ("guided_choice", &self.guided_choice),
            ("guided_grammar", &self.guided_grammar),
            ("guided_decoding_backend", &self.guided_decoding_backend),
            ("guided_whitespace_pattern", &self.guided_whitespace_pattern),
            ("structural_tag", &self.structural_tag),
            ("best_of", &self.best_of),
            ("use_beam_search", &self.use_beam_search),
            ("length_penalty", &self.length_penalty),
            (
                "spaces_between_special_tokens",
                &self.spaces_between_special_tokens,
            ),
            ("priority", &self.priority),
            ("request_id", &self.request_id),
            ("logits_processors", &self.logits_processors),
            (
                "return_tokens_as_token_ids",
                &self.return_tokens_as_token_ids,
            ),
            ("return_token_ids", &self.return_token_ids),
            ("kv_transfer_params", &self.kv_transfer_params),
            ("vllm_xargs", &self.vllm_xargs),
        ];
        all.into_iter()
            .filter_map(|(name, v)| v.as_deref().map(|v| (name, v)))
            .collect()
    }

    /// Type checks of the fields the server reads or ignores, and the 400 for refused ones.
    pub fn check(&self) -> ApiResult<()> {
        for (name, value) in self.present() {
            match name {
                "prompt_logprobs" if !value.is_null() && !value.is_i64() => {
                    return Err(ApiError::bad_request(
                        format!("prompt_logprobs must be an integer, got {value}."),
                        Some(name),
                    ));
                }
                "best_of" if !value.is_null() && value.as_u64().is_none_or(|n| n < 1) => {
                    return Err(ApiError::bad_request(
                        format!("best_of must be a positive integer, got {value}."),
                        Some(name),
                    ));
                }
                _ => {}
            }
            refuse(name, value, SHARED)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::chat::ChatRequest;
    use crate::protocol::completion::CompletionRequest;
    use serde::de::{self, Deserializer, Visitor};

    /// The field names a derived `Deserialize` asks for, read from its `deserialize_struct`.
    fn declared<'de, T: de::Deserialize<'de>>() -> Vec<&'static str> {
        struct Names(Vec<&'static str>);
        #[derive(Debug)]
        struct Stop;
        impl std::fmt::Display for Stop {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("stop")
            }
        }
        impl std::error::Error for Stop {}
        impl de::Error for Stop {
            fn custom<M: std::fmt::Display>(_: M) -> Self {
                Stop
            }
        }
        impl<'de> Deserializer<'de> for &mut Names {
            type Error = Stop;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
                Err(Stop)
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Stop> {
                self.0.extend_from_slice(fields);
                Err(Stop)
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
                byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
                identifier ignored_any
            }
        }
        let mut names = Names(Vec::new());
        let _ = T::deserialize(&mut names);
        names.0
    }

    /// vLLM 0.31's chat and completion request fields (its `protocol.py`), to check that the
    /// wire types declare every one.
    const VLLM_SHARED: &[&str] = &[
        "model",
        "frequency_penalty",
        "logit_bias",
        "max_tokens",
        "n",
        "presence_penalty",
        "response_format",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "user",
        "best_of",
        "use_beam_search",
        "top_k",
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "prompt_logprobs",
        "allowed_token_ids",
        "bad_words",
        "echo",
        "add_special_tokens",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structural_tag",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "priority",
        "request_id",
        "logits_processors",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "cache_salt",
        "kv_transfer_params",
        "vllm_xargs",
        "mm_processor_kwargs",
    ];
    const VLLM_CHAT: &[&str] = &[
        "messages",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning_effort",
        "include_reasoning",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "documents",
    ];
    const VLLM_COMPLETION: &[&str] = &["prompt", "logprobs", "suffix", "prompt_embeds"];

    fn classified(table: &[(&str, Handling)], route: &[(&str, Handling)], name: &str) -> usize {
        table
            .iter()
            .chain(route)
            .filter(|(n, _)| *n == name)
            .count()
    }

    fn check_route<'de, T: de::Deserialize<'de>>(route: &[(&str, Handling)], vllm_route: &[&str]) {
        let names = declared::<T>();
        assert!(names.len() > 40, "{names:?}");
        for name in &names {
            assert_eq!(
                classified(SHARED, route, name),
                1,
                "`{name}` is declared but not classified exactly once"
            );
        }
        for name in VLLM_SHARED.iter().chain(vllm_route) {
            assert!(names.contains(name), "vLLM's `{name}` is not declared");
        }
        for (name, _) in SHARED.iter().chain(route) {
            assert!(
                names.contains(name),
                "`{name}` is classified but not declared"
            );
        }
    }

    #[test]
    fn every_chat_field_is_declared_and_classified() {
        check_route::<ChatRequest>(CHAT, VLLM_CHAT);
    }

    #[test]
    fn every_completion_field_is_declared_and_classified() {
        check_route::<CompletionRequest>(COMPLETION, VLLM_COMPLETION);
    }

    fn check_of(json: &str) -> Option<String> {
        let fields: VllmFields = serde_json::from_str(json).unwrap();
        match fields.check() {
            Ok(()) => None,
            Err(ApiError::BadRequest { param, .. }) => param,
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn refused_fields_are_400s_unless_neutral() {
        assert_eq!(
            check_of(r#"{"use_beam_search": true}"#).as_deref(),
            Some("use_beam_search")
        );
        assert_eq!(check_of(r#"{"use_beam_search": false}"#), None);
        assert_eq!(check_of(r#"{"priority": 0}"#), None);
        assert_eq!(check_of(r#"{"priority": 1}"#).as_deref(), Some("priority"));
        assert_eq!(check_of(r#"{"length_penalty": 1.0}"#), None);
        assert_eq!(
            check_of(r#"{"prompt_logprobs": "2"}"#).as_deref(),
            Some("prompt_logprobs")
        );
        assert_eq!(check_of(r#"{"best_of": 0}"#).as_deref(), Some("best_of"));
        assert_eq!(check_of(r#"{"best_of": 2, "request_id": "x"}"#), None);
        assert_eq!(check_of(r#"{"vllm_xargs": {}}"#), None);
        assert_eq!(
            check_of(r#"{"vllm_xargs": {"a": 1}}"#).as_deref(),
            Some("vllm_xargs")
        );
    }
}

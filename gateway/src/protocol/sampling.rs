//! Sampling and stopping fields shared by chat and completions, their validation
//! (CONTRACT section 6) and their conversion into the engine's [`SamplingParams`].

use engine::api::SamplingParams;
use serde::Deserialize;
use serde_json::{Number, Value};

use crate::error::{ApiError, ApiResult};
use crate::generation_config::GenerationDefaults;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// Fields chat and completions share, at the top level of both request objects (see
/// [`request_with_sampling`]).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<Number>,
    pub stop: Option<StopField>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub n: Option<i64>,
    pub max_tokens: Option<i64>,
    pub min_tokens: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub include_stop_str_in_output: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub cache_salt: Option<String>,
    pub truncate_prompt_tokens: Option<i64>,
    pub response_format: Option<Box<Value>>,
    pub user: Option<String>,
    /// vLLM's other generation fields, kept raw: each is honoured, refused with a 400 naming
    /// it, or ignored on purpose, as [`super::fields`] decides.
    #[serde(flatten)]
    pub vllm: VllmFields,
}

/// vLLM's generation fields beyond the OpenAI set, as the client sent them.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct VllmFields {
    pub logit_bias: Option<Box<Value>>,
    pub allowed_token_ids: Option<Box<Value>>,
    pub bad_words: Option<Box<Value>>,
    pub prompt_logprobs: Option<Box<Value>>,
    pub structured_outputs: Option<Box<Value>>,
    pub guided_json: Option<Box<Value>>,
    pub guided_regex: Option<Box<Value>>,
    pub guided_choice: Option<Box<Value>>,
    pub guided_grammar: Option<Box<Value>>,
    pub guided_decoding_backend: Option<Box<Value>>,
    pub guided_whitespace_pattern: Option<Box<Value>>,
    pub structural_tag: Option<Box<Value>>,
    pub best_of: Option<Box<Value>>,
    pub use_beam_search: Option<Box<Value>>,
    pub length_penalty: Option<Box<Value>>,
    pub spaces_between_special_tokens: Option<Box<Value>>,
    pub priority: Option<Box<Value>>,
    pub request_id: Option<Box<Value>>,
    pub logits_processors: Option<Box<Value>>,
    pub return_tokens_as_token_ids: Option<Box<Value>>,
    pub return_token_ids: Option<Box<Value>>,
    pub kv_transfer_params: Option<Box<Value>>,
    pub vllm_xargs: Option<Box<Value>>,
}

/// Declares a request type whose sampling fields sit at the top level of the JSON object and
/// land in its `sampling: SamplingFields`. It is parsed through a flat "wire" struct (named by
/// the caller) instead of `#[serde(flatten)]`: flatten buffers every key of the object into an
/// intermediate map and parses the sampling fields again from that, a third of the cost of
/// parsing a chat request. The conversion names every field of [`SamplingFields`], so a field
/// added there and not here does not compile.
macro_rules! request_with_sampling {
    (
        $(#[$meta:meta])*
        pub struct $name:ident via $wire:ident {
            $($(#[$fmeta:meta])* pub $field:ident : $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            pub sampling: $crate::protocol::sampling::SamplingFields,
        }

        #[derive(serde::Deserialize)]
        struct $wire {
            $($(#[$fmeta])* $field: $ty,)*
            temperature: Option<f64>,
            top_p: Option<f64>,
            top_k: Option<i64>,
            min_p: Option<f64>,
            repetition_penalty: Option<f64>,
            presence_penalty: Option<f64>,
            frequency_penalty: Option<f64>,
            seed: Option<serde_json::Number>,
            stop: Option<$crate::protocol::sampling::StopField>,
            stop_token_ids: Option<Vec<i64>>,
            n: Option<i64>,
            max_tokens: Option<i64>,
            min_tokens: Option<i64>,
            ignore_eos: Option<bool>,
            skip_special_tokens: Option<bool>,
            include_stop_str_in_output: Option<bool>,
            stream: Option<bool>,
            stream_options: Option<$crate::protocol::sampling::StreamOptions>,
            cache_salt: Option<String>,
            truncate_prompt_tokens: Option<i64>,
            response_format: Option<Box<serde_json::Value>>,
            user: Option<String>,
            logit_bias: Option<Box<serde_json::Value>>,
            allowed_token_ids: Option<Box<serde_json::Value>>,
            bad_words: Option<Box<serde_json::Value>>,
            prompt_logprobs: Option<Box<serde_json::Value>>,
            structured_outputs: Option<Box<serde_json::Value>>,
            guided_json: Option<Box<serde_json::Value>>,
            guided_regex: Option<Box<serde_json::Value>>,
            guided_choice: Option<Box<serde_json::Value>>,
            guided_grammar: Option<Box<serde_json::Value>>,
            guided_decoding_backend: Option<Box<serde_json::Value>>,
            guided_whitespace_pattern: Option<Box<serde_json::Value>>,
            structural_tag: Option<Box<serde_json::Value>>,
            best_of: Option<Box<serde_json::Value>>,
            use_beam_search: Option<Box<serde_json::Value>>,
            length_penalty: Option<Box<serde_json::Value>>,
            spaces_between_special_tokens: Option<Box<serde_json::Value>>,
            priority: Option<Box<serde_json::Value>>,
            request_id: Option<Box<serde_json::Value>>,
            logits_processors: Option<Box<serde_json::Value>>,
            return_tokens_as_token_ids: Option<Box<serde_json::Value>>,
            return_token_ids: Option<Box<serde_json::Value>>,
            kv_transfer_params: Option<Box<serde_json::Value>>,
            vllm_xargs: Option<Box<serde_json::Value>>,
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let w = <$wire as serde::Deserialize>::deserialize(d)?;
                Ok($name {
                    $($field: w.$field,)*
                    sampling: $crate::protocol::sampling::SamplingFields {
                        temperature: w.temperature,
                        top_p: w.top_p,
                        top_k: w.top_k,
                        min_p: w.min_p,
                        repetition_penalty: w.repetition_penalty,
                        presence_penalty: w.presence_penalty,
                        frequency_penalty: w.frequency_penalty,
                        seed: w.seed,
                        stop: w.stop,
                        stop_token_ids: w.stop_token_ids,
                        n: w.n,
                        max_tokens: w.max_tokens,
                        min_tokens: w.min_tokens,
                        ignore_eos: w.ignore_eos,
                        skip_special_tokens: w.skip_special_tokens,
                        include_stop_str_in_output: w.include_stop_str_in_output,
                        stream: w.stream,
                        stream_options: w.stream_options,
                        cache_salt: w.cache_salt,
                        truncate_prompt_tokens: w.truncate_prompt_tokens,
                        response_format: w.response_format,
                        user: w.user,
                        vllm: $crate::protocol::sampling::VllmFields {
                            logit_bias: w.logit_bias,
                            allowed_token_ids: w.allowed_token_ids,
                            bad_words: w.bad_words,
                            prompt_logprobs: w.prompt_logprobs,
                            structured_outputs: w.structured_outputs,
                            guided_json: w.guided_json,
                            guided_regex: w.guided_regex,
                            guided_choice: w.guided_choice,
                            guided_grammar: w.guided_grammar,
                            guided_decoding_backend: w.guided_decoding_backend,
                            guided_whitespace_pattern: w.guided_whitespace_pattern,
                            structural_tag: w.structural_tag,
                            best_of: w.best_of,
                            use_beam_search: w.use_beam_search,
                            length_penalty: w.length_penalty,
                            spaces_between_special_tokens: w.spaces_between_special_tokens,
                            priority: w.priority,
                            request_id: w.request_id,
                            logits_processors: w.logits_processors,
                            return_tokens_as_token_ids: w.return_tokens_as_token_ids,
                            return_token_ids: w.return_token_ids,
                            kv_transfer_params: w.kv_transfer_params,
                            vllm_xargs: w.vllm_xargs,
                        },
                    },
                })
            }
        }
    };
}
pub(crate) use request_with_sampling;

fn bad(msg: String, param: &str) -> ApiError {
    ApiError::bad_request(msg, Some(param))
}

impl SamplingFields {
    /// Range and combination checks that need no model. `max_tokens_field` is the name the
    /// client used for the token budget (chat prefers `max_completion_tokens`).
    pub fn validate(&self, max_tokens: Option<i64>, max_tokens_field: &str) -> ApiResult<()> {
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) || t.is_nan() {
                return Err(bad(
                    format!("temperature must be in [0, 2], got {t}."),
                    "temperature",
                ));
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(bad(format!("top_p must be in (0, 1], got {p}."), "top_p"));
            }
        }
        if let Some(k) = self.top_k {
            if k < -1 {
                return Err(bad(
                    format!("top_k must be -1 (disable), or at least 1, got {k}."),
                    "top_k",
                ));
            }
        }
        if let Some(p) = self.min_p {
            if !(0.0..=1.0).contains(&p) {
                return Err(bad(format!("min_p must be in [0, 1], got {p}."), "min_p"));
            }
        }
        if let Some(r) = self.repetition_penalty {
            if r.is_nan() || r <= 0.0 {
                return Err(bad(
                    format!("repetition_penalty must be greater than zero, got {r}."),
                    "repetition_penalty",
                ));
            }
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if let Some(v) = v {
                if !(-2.0..=2.0).contains(&v) {
                    return Err(bad(format!("{name} must be in [-2, 2], got {v}."), name));
                }
            }
        }
        if let Some(seed) = &self.seed {
            if seed.as_i64().is_none() {
                return Err(bad(
                    format!("seed must be an integer in the int64 range, got {seed}."),
                    "seed",
                ));
            }
        }
        if let Some(stop) = &self.stop {
            let list: Vec<&String> = match stop {
                StopField::One(s) => vec![s],
                StopField::Many(v) => v.iter().collect(),
            };
            if list.len() > 4 {
                return Err(bad(
                    format!("stop may hold at most 4 sequences, got {}.", list.len()),
                    "stop",
                ));
            }
            if list.iter().any(|s| s.is_empty()) {
                return Err(bad("stop cannot contain an empty string.".into(), "stop"));
            }
        }
        if let Some(ids) = &self.stop_token_ids {
            if let Some(id) = ids.iter().find(|&&id| id < 0 || id > u32::MAX as i64) {
                return Err(bad(
                    format!("stop_token_ids must be non-negative token ids, got {id}."),
                    "stop_token_ids",
                ));
            }
        }
        if let Some(n) = self.n {
            if !(1..=16384).contains(&n) {
                return Err(bad(format!("n must be in [1, 16384], got {n}."), "n"));
            }
        }
        if let Some(m) = max_tokens {
            if m < 1 {
                return Err(bad(
                    format!("{max_tokens_field} must be at least 1, got {m}."),
                    max_tokens_field,
                ));
            }
        }
        if let Some(m) = self.min_tokens {
            if m < 0 {
                return Err(bad(
                    format!("min_tokens must be at least 0, got {m}."),
                    "min_tokens",
                ));
            }
            if let Some(max) = max_tokens {
                if m > max {
                    return Err(bad(
                        format!("min_tokens must be less than or equal to {max_tokens_field}={max}, got {m}."),
                        "min_tokens",
                    ));
                }
            }
        }
        if self.stream_options.is_some() && self.stream != Some(true) {
            return Err(bad(
                "Stream options can only be defined when `stream=True`.".into(),
                "stream_options",
            ));
        }
        if let Some(salt) = &self.cache_salt {
            let len = salt.chars().count();
            if len == 0 || len > 128 {
                return Err(bad(
                    format!("cache_salt must be 1 to 128 characters long, got {len}."),
                    "cache_salt",
                ));
            }
            if salt.chars().any(|c| matches!(c, '@' | '/' | '\\' | '\0')) {
                return Err(bad(
                    "cache_salt must not contain '@', '/', '\\' or NUL.".into(),
                    "cache_salt",
                ));
            }
        }
        if let Some(t) = self.truncate_prompt_tokens {
            if t < -1 || t == 0 {
                return Err(bad(
                    format!("truncate_prompt_tokens must be -1 or at least 1, got {t}."),
                    "truncate_prompt_tokens",
                ));
            }
        }
        if let Some(rf) = &self.response_format {
            validate_response_format(rf)?;
        }
        self.vllm.check()?;
        if let Some(k) = self.prompt_logprobs() {
            // vLLM's words and order; the count against --max-logprobs needs the model.
            if self.stream == Some(true) && (k > 0 || k == -1) {
                return Err(bad(
                    "`prompt_logprobs` are not available when `stream=True`.".into(),
                    "prompt_logprobs",
                ));
            }
            if k < -1 {
                return Err(bad(
                    "`prompt_logprobs` must be a positive value or -1.".into(),
                    "prompt_logprobs",
                ));
            }
        }
        Ok(())
    }

    /// `prompt_logprobs` as sent (its type is checked by [`VllmFields::check`]).
    pub fn prompt_logprobs(&self) -> Option<i64> {
        self.vllm.prompt_logprobs.as_deref().and_then(Value::as_i64)
    }

    pub fn stop_strings(&self) -> Vec<String> {
        match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        }
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }

    /// The request's stop token ids, then (unless it sets `ignore_eos`) the generation
    /// config's `eos_token_id`s, as vLLM adds them.
    fn stop_token_ids(&self, defaults: &GenerationDefaults) -> Vec<u32> {
        let own = self.stop_token_ids.iter().flatten().map(|&i| i as u32);
        let ignore_eos = self.ignore_eos.unwrap_or(false);
        let eos = defaults.stop_token_ids.iter().filter(|_| !ignore_eos);
        let mut ids: Vec<u32> = own.collect();
        ids.extend(eos.filter(|id| !ids.contains(id)).collect::<Vec<_>>());
        ids
    }

    pub fn n(&self) -> usize {
        self.n.unwrap_or(1).max(1) as usize
    }

    /// The engine's sampling parameters, but `max_tokens`: the engine's front door fits that
    /// to each prompt's context. A field the request leaves out (or sends as null) takes the
    /// model's default (`defaults`), else vLLM's. A 400 for a malformed structured-output or
    /// token-rule field.
    pub fn to_params(
        &self,
        logprobs: Option<usize>,
        defaults: &GenerationDefaults,
    ) -> ApiResult<SamplingParams> {
        use super::structured;
        let d = SamplingParams::default();
        let float = |own: Option<f64>, model: Option<f64>, vllm: f32| {
            own.or(model).map_or(vllm, |v| v as f32)
        };
        Ok(SamplingParams {
            temperature: float(self.temperature, defaults.temperature, d.temperature),
            top_p: float(self.top_p, defaults.top_p, d.top_p),
            top_k: self
                .top_k
                .or(defaults.top_k)
                .map(|k| k.clamp(-1, i32::MAX as i64) as i32)
                .unwrap_or(d.top_k),
            min_p: float(self.min_p, defaults.min_p, d.min_p),
            repetition_penalty: float(
                self.repetition_penalty,
                defaults.repetition_penalty,
                d.repetition_penalty,
            ),
            presence_penalty: self.presence_penalty.map(|t| t as f32).unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.map(|t| t as f32).unwrap_or(0.0),
            seed: self
                .seed
                .as_ref()
                .and_then(Number::as_i64)
                .map(|s| s as u64),
            max_tokens: 0,
            min_tokens: self.min_tokens.unwrap_or(0).max(0) as usize,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stop_token_ids: self.stop_token_ids(defaults),
            stop: self.stop_strings(),
            include_stop_str_in_output: self.include_stop_str_in_output.unwrap_or(false),
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            logprobs,
            // Resolved against the model by the route (`generate::resolve_prompt_logprobs`).
            prompt_logprobs: None,
            constraint: structured::constraint(self)?.map(|(c, _)| c),
            logit_bias: structured::logit_bias(self)?,
            allowed_token_ids: structured::allowed_token_ids(self)?,
            bad_words: structured::bad_words(self)?,
        })
    }
}

fn validate_response_format(rf: &Value) -> ApiResult<()> {
    let Some(obj) = rf.as_object() else {
        return Err(bad(
            "response_format must be an object.".into(),
            "response_format",
        ));
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("text") | Some("json_object") => Ok(()),
        Some("structural_tag") => Err(bad(
            "response_format type 'structural_tag' is not supported.".into(),
            "response_format",
        )),
        Some("json_schema") => {
            if obj.get("json_schema").is_some_and(|v| v.is_object()) {
                Ok(())
            } else {
                Err(bad(
                    "When response_format type is 'json_schema', the 'json_schema' field must be provided."
                        .into(),
                    "response_format",
                ))
            }
        }
        Some(other) => Err(bad(
            format!("response_format type must be one of 'text', 'json_object', 'json_schema', 'structural_tag', got '{other}'."),
            "response_format",
        )),
        None => Err(bad("response_format needs a 'type'.".into(), "response_format")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> SamplingFields {
        serde_json::from_str(json).unwrap()
    }

    fn param_of(json: &str) -> Option<String> {
        match fields(json).validate(None, "max_tokens") {
            Err(ApiError::BadRequest { param, .. }) => param,
            Err(e) => panic!("unexpected {e:?}"),
            Ok(()) => None,
        }
    }

    #[test]
    fn ranges() {
        assert_eq!(
            param_of(r#"{"temperature": 2.5}"#).as_deref(),
            Some("temperature")
        );
        assert_eq!(param_of(r#"{"temperature": 2.0}"#), None);
        assert_eq!(param_of(r#"{"top_p": 0}"#).as_deref(), Some("top_p"));
        assert_eq!(param_of(r#"{"top_p": 1}"#), None);
        assert_eq!(param_of(r#"{"top_k": -2}"#).as_deref(), Some("top_k"));
        assert_eq!(param_of(r#"{"top_k": -1}"#), None);
        assert_eq!(param_of(r#"{"top_k": 0}"#), None);
        assert_eq!(param_of(r#"{"min_p": 1.5}"#).as_deref(), Some("min_p"));
        assert_eq!(
            param_of(r#"{"repetition_penalty": 0}"#).as_deref(),
            Some("repetition_penalty")
        );
        assert_eq!(
            param_of(r#"{"presence_penalty": -2.1}"#).as_deref(),
            Some("presence_penalty")
        );
        assert_eq!(
            param_of(r#"{"frequency_penalty": 2.1}"#).as_deref(),
            Some("frequency_penalty")
        );
        assert_eq!(
            param_of(r#"{"seed": 9223372036854775808}"#).as_deref(),
            Some("seed")
        );
        assert_eq!(param_of(r#"{"seed": -9223372036854775808}"#), None);
        assert_eq!(
            param_of(r#"{"stop": ["a","b","c","d","e"]}"#).as_deref(),
            Some("stop")
        );
        assert_eq!(param_of(r#"{"stop": ""}"#).as_deref(), Some("stop"));
        assert_eq!(param_of(r#"{"n": 0}"#).as_deref(), Some("n"));
        assert_eq!(param_of(r#"{"n": 16385}"#).as_deref(), Some("n"));
        assert_eq!(param_of(r#"{"n": 16384}"#), None);
        assert_eq!(
            param_of(r#"{"stream_options": {"include_usage": true}}"#).as_deref(),
            Some("stream_options")
        );
        assert_eq!(
            param_of(r#"{"stream": true, "stream_options": {"include_usage": true}}"#),
            None
        );
        assert_eq!(
            param_of(r#"{"cache_salt": ""}"#).as_deref(),
            Some("cache_salt")
        );
        assert_eq!(
            param_of(r#"{"cache_salt": "a/b"}"#).as_deref(),
            Some("cache_salt")
        );
        let long = "x".repeat(129);
        assert_eq!(
            param_of(&format!(r#"{{"cache_salt": "{long}"}}"#)).as_deref(),
            Some("cache_salt")
        );
        assert_eq!(
            param_of(&format!(r#"{{"cache_salt": "{}"}}"#, "x".repeat(128))),
            None
        );
        assert_eq!(
            param_of(r#"{"response_format": {"type": "json_schema"}}"#).as_deref(),
            Some("response_format")
        );
        assert_eq!(
            param_of(
                r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}"#
            ),
            None
        );
    }

    #[test]
    fn params_conversion() {
        let f = fields(r#"{"temperature": 0, "seed": 7, "stop": "x", "top_k": -1}"#);
        let p = f
            .to_params(Some(2), &GenerationDefaults::default())
            .unwrap();
        assert_eq!(p.temperature, 0.0);
        assert_eq!(p.seed, Some(7));
        assert_eq!(p.stop, vec!["x".to_string()]);
        assert_eq!(p.top_k, -1);
        assert_eq!(p.logprobs, Some(2));
    }
}

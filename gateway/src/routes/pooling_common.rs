//! What the pooling family (embeddings, pooling, score, rerank, classify) shares: field
//! checks, the request's input and options as the engine's pooling call takes them, vector
//! encodings.

use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use engine::handle::{ModelHandle, PoolInput, PoolOptions, PoolTask};
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::http::request_memory::RequestMemory;
use crate::protocol::chat::ChatMessage;
use crate::protocol::pooling::{EmbedInput, ListResponse, PoolingFields};
use crate::protocol::{now_secs, Usage};
use crate::state::AppState;

/// The engine's pooling call, after the outputs it will give are held on the request's
/// account (one per text, id list or pair, one for a chat).
pub async fn pool(
    memory: &RequestMemory,
    model: &ModelHandle,
    input: PoolInput,
    opts: PoolOptions,
) -> ApiResult<engine::handle::Pooled> {
    let outputs = match &input {
        PoolInput::Texts(texts) => texts.len(),
        PoolInput::Ids(ids) => ids.len(),
        PoolInput::Chat { .. } => 1,
        PoolInput::Pairs { queries, documents } => queries.len().max(documents.len()),
    };
    memory.hold(
        crate::memory::pooling_bytes(model.card(), outputs as u64),
        &format!("{outputs} pooled outputs"),
    )?;
    Ok(model.pool(input, opts).await?)
}

/// How vectors go out on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Float,
    Base64,
    Bytes,
    BytesOnly,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedDtype {
    F32,
    F16,
    Bf16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endian {
    Little,
    Big,
}

#[derive(Debug, Clone, Copy)]
pub struct OutputFormat {
    pub encoding: Encoding,
    pub dtype: EmbedDtype,
    pub endian: Endian,
}

impl PoolingFields {
    /// CONTRACT section 6 (pooling): formats, the removed `normalize`, `dimensions`.
    pub fn validate(&self) -> ApiResult<OutputFormat> {
        if self.normalize.is_some() {
            return Err(ApiError::bad_request(
                "Parameter `normalize` was removed; use `use_activation` instead.",
                Some("normalize"),
            ));
        }
        let encoding = match self.encoding_format.as_deref() {
            None | Some("float") => Encoding::Float,
            Some("base64") => Encoding::Base64,
            Some("bytes") => Encoding::Bytes,
            Some("bytes_only") => Encoding::BytesOnly,
            Some(other) => {
                return Err(ApiError::bad_request(
                    format!("encoding_format must be one of 'float', 'base64', 'bytes', 'bytes_only', got '{other}'."),
                    Some("encoding_format"),
                ))
            }
        };
        let dtype = match self.embed_dtype.as_deref() {
            None | Some("float32") => EmbedDtype::F32,
            Some("float16") => EmbedDtype::F16,
            Some("bfloat16") => EmbedDtype::Bf16,
            Some(other) => {
                return Err(ApiError::bad_request(
                    format!(
                    "embed_dtype must be one of 'float32', 'float16', 'bfloat16', got '{other}'."
                ),
                    Some("embed_dtype"),
                ))
            }
        };
        let endian = match self.endianness.as_deref() {
            None | Some("native") => {
                if cfg!(target_endian = "big") {
                    Endian::Big
                } else {
                    Endian::Little
                }
            }
            Some("little") => Endian::Little,
            Some("big") => Endian::Big,
            Some(other) => {
                return Err(ApiError::bad_request(
                    format!("endianness must be one of 'native', 'little', 'big', got '{other}'."),
                    Some("endianness"),
                ))
            }
        };
        if let Some(t) = self.truncate_prompt_tokens {
            if t < -1 || t == 0 {
                return Err(ApiError::bad_request(
                    format!("truncate_prompt_tokens must be -1 or at least 1, got {t}."),
                    Some("truncate_prompt_tokens"),
                ));
            }
        }
        // vLLM's Transformers names: pad to the model's length, or leave the input as is.
        match &self.padding {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "max_length" || s == "do_not_pad" => {}
            Some(other) => {
                return Err(ApiError::bad_request(
                    format!("padding must be one of 'max_length', 'do_not_pad', got {other}."),
                    Some("padding"),
                ))
            }
        }
        Ok(OutputFormat {
            encoding,
            dtype,
            endian,
        })
    }

    /// `dimensions` only works on Matryoshka models; none of ours is one.
    pub fn check_dimensions(&self, model: &ModelHandle) -> ApiResult<()> {
        if self.dimensions.is_some() {
            return Err(ApiError::bad_request(
                format!(
                    "Model \"{}\" does not support matryoshka representation, changing output dimensions will lead to poor results.",
                    model.card().name
                ),
                Some("dimensions"),
            ));
        }
        Ok(())
    }
}

/// The request's `input` or chat-style `messages` as the engine's pooling input. Chats are
/// rendered by the engine with the model's template (no generation prompt), text only.
pub fn pool_input(
    state: &AppState,
    model: &ModelHandle,
    input: Option<&EmbedInput>,
    messages: Option<&Vec<ChatMessage>>,
) -> ApiResult<PoolInput> {
    match (input, messages) {
        (Some(input), None) => Ok(match input.clone() {
            EmbedInput::Text(t) => PoolInput::Texts(vec![t]),
            EmbedInput::Texts(ts) => PoolInput::Texts(ts),
            EmbedInput::Ids(ids) => PoolInput::Ids(vec![ids]),
            EmbedInput::IdLists(lists) => PoolInput::Ids(lists),
        }),
        (None, Some(messages)) => {
            let parsed = super::messages::parse_messages(messages)?;
            super::chat::check_text_only(model, &parsed, "This route")?;
            let template = super::chat::template_options(
                state,
                &super::chat::RenderOptions {
                    add_generation_prompt: false,
                    ..Default::default()
                },
            );
            Ok(PoolInput::Chat {
                messages: Value::Array(parsed.template_messages(messages)),
                template: Box::new(template),
            })
        }
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "Give either `input` or `messages`, not both.",
            Some("input"),
        )),
        (None, None) => Err(ApiError::bad_request(
            "`input` (or `messages`) is required.",
            Some("input"),
        )),
    }
}

impl PoolingFields {
    /// What the shared fields ask of the engine for `task`; `field` is named in input errors.
    pub fn pool_options(&self, task: PoolTask, field: &'static str) -> PoolOptions {
        PoolOptions {
            task,
            add_special_tokens: self.add_special_tokens.unwrap_or(true),
            truncate_prompt_tokens: self.truncate_prompt_tokens,
            use_activation: self.use_activation,
            pad_to_max_length: self.padding.as_ref().and_then(Value::as_str) == Some("max_length"),
            field,
        }
    }

    /// Score, rerank and classify answer numbers, not vectors: the vector format fields would
    /// change nothing, so they are refused rather than ignored.
    pub fn refuse_vector_formats(&self, route: &str) -> ApiResult<()> {
        let set = [
            ("encoding_format", self.encoding_format.is_some()),
            ("embed_dtype", self.embed_dtype.is_some()),
            ("endianness", self.endianness.is_some()),
            ("dimensions", self.dimensions.is_some()),
        ];
        match set.iter().find(|(_, on)| *on) {
            Some((name, _)) => Err(ApiError::bad_request(
                format!("`{name}` applies to embedding vectors; {route} returns plain numbers."),
                Some(name),
            )),
            None => Ok(()),
        }
    }
}

/// The pooling family's list answer (`object: "list"`), usage counting every input token.
pub fn list_response<T: serde::Serialize>(
    id: String,
    model: &ModelHandle,
    data: Vec<T>,
    prompt_tokens: usize,
) -> Response {
    Json(ListResponse {
        id,
        object: "list",
        created: now_secs(),
        model: model.card().name.clone(),
        data,
        usage: Usage::new(prompt_tokens, 0),
    })
    .into_response()
}

/// The index of the largest value (the first on ties).
pub fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
            if x > best.1 {
                (i, x)
            } else {
                best
            }
        })
        .0
}

fn to_bytes(v: &[f32], fmt: OutputFormat) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for &x in v {
        match (fmt.dtype, fmt.endian) {
            (EmbedDtype::F32, Endian::Little) => out.extend_from_slice(&x.to_le_bytes()),
            (EmbedDtype::F32, Endian::Big) => out.extend_from_slice(&x.to_be_bytes()),
            (EmbedDtype::F16, Endian::Little) => {
                out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes())
            }
            (EmbedDtype::F16, Endian::Big) => {
                out.extend_from_slice(&half::f16::from_f32(x).to_be_bytes())
            }
            (EmbedDtype::Bf16, Endian::Little) => {
                out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes())
            }
            (EmbedDtype::Bf16, Endian::Big) => {
                out.extend_from_slice(&half::bf16::from_f32(x).to_be_bytes())
            }
        }
    }
    out
}

/// A vector as JSON: a float list, or base64 of its bytes in the requested dtype/endianness.
pub fn encode_vector(v: &[f32], fmt: OutputFormat) -> Value {
    match fmt.encoding {
        Encoding::Float => Value::from(v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
        _ => Value::from(base64::engine::general_purpose::STANDARD.encode(to_bytes(v, fmt))),
    }
}

/// For `bytes` / `bytes_only`: the raw vectors back to back.
pub fn raw_bytes(vectors: &[Vec<f32>], fmt: OutputFormat) -> Vec<u8> {
    vectors.iter().flat_map(|v| to_bytes(v, fmt)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_is_refused() {
        let f: PoolingFields = serde_json::from_str(r#"{"normalize": true}"#).unwrap();
        match f.validate() {
            Err(ApiError::BadRequest { message, param }) => {
                assert_eq!(
                    message,
                    "Parameter `normalize` was removed; use `use_activation` instead."
                );
                assert_eq!(param.as_deref(), Some("normalize"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn formats() {
        let f: PoolingFields = serde_json::from_str(
            r#"{"encoding_format": "base64", "embed_dtype": "float16", "endianness": "big"}"#,
        )
        .unwrap();
        let fmt = f.validate().unwrap();
        assert_eq!(fmt.encoding, Encoding::Base64);
        let v = encode_vector(&[1.0], fmt);
        // f16 1.0 = 0x3C00, big-endian.
        assert_eq!(
            v,
            Value::from(base64::engine::general_purpose::STANDARD.encode([0x3C, 0x00]))
        );
        let bad: PoolingFields = serde_json::from_str(r#"{"encoding_format": "hex"}"#).unwrap();
        assert!(bad.validate().is_err());
    }

    #[test]
    fn argmax_takes_the_first_largest() {
        assert_eq!(argmax(&[0.1, 0.7, 0.2]), 1);
        assert_eq!(argmax(&[0.5, 0.5]), 0);
    }

    #[test]
    fn vector_formats_are_refused_where_there_are_no_vectors() {
        let f: PoolingFields = serde_json::from_str(r#"{"dimensions": 8}"#).unwrap();
        match f.refuse_vector_formats("/rerank") {
            Err(ApiError::BadRequest { param, .. }) => {
                assert_eq!(param.as_deref(), Some("dimensions"))
            }
            other => panic!("{other:?}"),
        }
        assert!(PoolingFields::default()
            .refuse_vector_formats("/rerank")
            .is_ok());
    }
}

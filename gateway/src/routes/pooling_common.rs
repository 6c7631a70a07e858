//! What the pooling family (embeddings, pooling, score, rerank, classify) shares: field
//! checks, tokenization with the model's length limit, vector encodings.

use base64::Engine as _;
use engine::handle::ModelHandle;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::protocol::pooling::{EmbedInput, PoolingFields};

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

/// Token ids for one input, within the model's length. Too long: a 400 unless
/// `truncate_prompt_tokens` asks for truncation, which keeps the head of the text and the
/// closing special token (as sentence-transformers does for BERT inputs).
pub fn fit(
    model: &ModelHandle,
    mut ids: Vec<u32>,
    truncate: Option<i64>,
    closing_special: bool,
) -> ApiResult<Vec<u32>> {
    let max_len = model.card().max_model_len;
    let limit = match truncate {
        None => {
            if ids.len() > max_len {
                return Err(ApiError::bad_request(
                    format!(
                        "This model's maximum context length is {max_len} tokens. However, you requested {} tokens in the input for embedding generation. Please reduce the length of the input.",
                        ids.len()
                    ),
                    Some("input"),
                ));
            }
            return Ok(ids);
        }
        Some(-1) => max_len,
        Some(k) if k as usize > max_len => {
            return Err(ApiError::bad_request(
                "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.",
                Some("truncate_prompt_tokens"),
            ))
        }
        Some(k) => k as usize,
    };
    if ids.len() > limit {
        if closing_special && limit >= 2 {
            let last = ids[ids.len() - 1];
            ids.truncate(limit - 1);
            ids.push(last);
        } else {
            ids.truncate(limit);
        }
    }
    Ok(ids)
}

/// Tokenize texts for an encoder (special tokens included), fitting each to the model.
pub fn tokenize_texts(
    model: &ModelHandle,
    texts: &[String],
    fields: &PoolingFields,
) -> ApiResult<Vec<Vec<u32>>> {
    let add_special = fields.add_special_tokens.unwrap_or(true);
    let bytes = texts.iter().map(String::len).sum();
    engine::handle::off_reactor(bytes, || {
        texts
            .iter()
            .map(|t| {
                let ids = model.encode(t, add_special)?;
                fit(model, ids, fields.truncate_prompt_tokens, add_special)
            })
            .collect()
    })
}

/// Token ids for an `input` field.
pub fn tokenize_input(
    model: &ModelHandle,
    input: &EmbedInput,
    fields: &PoolingFields,
) -> ApiResult<Vec<Vec<u32>>> {
    let check = |ids: &[i64]| -> ApiResult<Vec<u32>> { Ok(model.token_ids(ids, "input")?) };
    match input {
        EmbedInput::Text(t) => tokenize_texts(model, std::slice::from_ref(t), fields),
        EmbedInput::Texts(ts) if ts.is_empty() => Err(ApiError::bad_request(
            "input must not be empty.",
            Some("input"),
        )),
        EmbedInput::Texts(ts) => tokenize_texts(model, ts, fields),
        EmbedInput::Ids(ids) => Ok(vec![fit(
            model,
            check(ids)?,
            fields.truncate_prompt_tokens,
            false,
        )?]),
        EmbedInput::IdLists(lists) if lists.is_empty() => Err(ApiError::bad_request(
            "input must not be empty.",
            Some("input"),
        )),
        EmbedInput::IdLists(lists) => lists
            .iter()
            .map(|ids| fit(model, check(ids)?, fields.truncate_prompt_tokens, false))
            .collect(),
    }
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

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        dot += x as f64 * y as f64;
        na += x as f64 * x as f64;
        nb += y as f64 * y as f64;
    }
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
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
    fn cosine_basics() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-12);
        assert_eq!(cosine(&[0.0], &[1.0]), 0.0);
    }
}

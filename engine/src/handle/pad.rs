//! vLLM's pooling `padding: "max_length"`: every input, once truncated, is filled up to the
//! model's length with the tokenizer's pad token, as the Transformers tokenizer pads it
//! (right side, type id 0). The model runs over the pads as over any other token (vLLM runs
//! no attention mask over a prompt), which is the point: a model trained on fixed-length
//! inputs with no mask (SigLIP's text tower) only gives comparable vectors that way.

use super::embed::EncodedInput;
use super::{EncoderBackend, ModelHandle, PoolOptions};
use crate::error::{EngineError, Result};

impl ModelHandle {
    /// The pad token and the length to pad to, when `opts` asks for padding; refused on a
    /// model whose tokenizer names no pad token.
    pub(super) fn padding(
        &self,
        e: &EncoderBackend,
        opts: PoolOptions,
    ) -> Result<Option<(u32, usize)>> {
        if !opts.pad_to_max_length {
            return Ok(None);
        }
        let pad = e.pad_id.ok_or_else(|| {
            EngineError::invalid(
                format!(
                    "padding 'max_length' needs a pad token, and the tokenizer of model {} has none.",
                    self.card().name
                ),
                Some("padding"),
            )
        })?;
        Ok(Some((pad, self.card().max_model_len)))
    }
}

/// Fills each input up to the length of `padding` (see [`ModelHandle::padding`]).
pub(super) fn pad(inputs: &mut [EncodedInput], padding: Option<(u32, usize)>) {
    let Some((pad, len)) = padding else {
        return;
    };
    for input in inputs {
        let missing = len.saturating_sub(input.ids.len());
        input.ids.extend(std::iter::repeat_n(pad, missing));
        if let Some(types) = &mut input.type_ids {
            types.extend(std::iter::repeat_n(0, missing));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_filled_on_the_right_with_the_pad_token_and_type_zero() {
        let mut inputs = vec![
            EncodedInput {
                ids: vec![101, 7, 102],
                type_ids: None,
            },
            EncodedInput {
                ids: vec![101, 7, 102, 8, 102],
                type_ids: Some(vec![0, 0, 0, 1, 1]),
            },
        ];
        pad(&mut inputs, Some((0, 6)));
        assert_eq!(inputs[0].ids, [101, 7, 102, 0, 0, 0]);
        assert_eq!(inputs[1].ids, [101, 7, 102, 8, 102, 0]);
        assert_eq!(inputs[1].type_ids.as_deref(), Some(&[0, 0, 0, 1, 1, 0][..]));
        let before = inputs.clone();
        pad(&mut inputs, None);
        assert_eq!(inputs, before, "no padding asked: unchanged");
    }
}

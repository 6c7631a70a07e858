//! The decoder as an embedding model (Qwen3-Embedding and other decoders served with vLLM's
//! `--convert embed`): one causal pass over each input, its final-norm hidden states pooled
//! (the last token's, or their mean), behind the pooling front door's [`EmbeddingModel`].
//!
//! A pass runs over a KV cache of its own, made for the batch and dropped after it, so it
//! shares nothing with generation; the cache holds one layer at a time (see
//! [`LlamaModel::layers`]). Every token's numbers are computed as in a generation step, which
//! does not depend on the rest of the batch: an input's vector is the same alone or batched.

use super::forward::validate_chunks;
use super::{LlamaModel, Scratch};
use crate::error::{EngineError, Result};
use crate::model::{
    ActivationMode, CausalLm, DecoderInfo, EmbeddingModel, EncoderHead, EncoderInfo, EncoderInput,
    PagedKvCache, Pooling, SeqChunk,
};

/// Tokens per block of the one-off cache (any size works: each input gets its own blocks).
const BLOCK: usize = 16;

impl LlamaModel {
    /// The final-norm hidden states of each prompt's tokens (`len x hidden`, row-major), from
    /// one causal pass over the batch.
    pub fn final_hidden(&self, prompts: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        if prompts.is_empty() {
            return Ok(Vec::new());
        }
        let mut tables = Vec::with_capacity(prompts.len());
        let mut blocks = 0u32;
        for p in prompts {
            let n = p.len().div_ceil(BLOCK) as u32;
            tables.push((blocks..blocks + n).collect::<Vec<u32>>());
            blocks += n;
        }
        let batch: Vec<SeqChunk<'_>> = prompts
            .iter()
            .zip(&tables)
            .map(|(tokens, table)| SeqChunk {
                lora: None,
                tokens,
                start_pos: 0,
                block_table: table,
                want_logits: false,
                media: None,
            })
            .collect();
        validate_chunks(&self.cfg, &batch, BLOCK, blocks as usize)?;
        let one_layer = DecoderInfo {
            n_layers: 1,
            ..self.info.clone()
        };
        let mut kv = PagedKvCache::new(&one_layer, BLOCK, blocks as usize);
        let mut s = Scratch::default();
        let spans = self.layers(&batch, &mut kv, &mut s)?;
        Ok(spans
            .iter()
            .map(|span| self.final_norm(&s, span.row..span.row + span.len))
            .collect())
    }
}

/// A Llama-shaped decoder with a pooling head: [`LlamaModel::final_hidden`] pooled.
pub struct DecoderEmbedder {
    model: LlamaModel,
    info: EncoderInfo,
}

impl DecoderEmbedder {
    /// `max_seq_len` is capped at the decoder's own positions.
    pub fn new(
        mut model: LlamaModel,
        pooling: Pooling,
        normalize: bool,
        max_seq_len: usize,
    ) -> Self {
        // f32 activations: an HF checkpoint's float weights take them on either path, and a
        // vector should not depend on a decode-speed trade-off.
        model.set_activation_mode(ActivationMode::F32);
        let info = EncoderInfo {
            hidden_size: model.cfg.hidden,
            max_seq_len: max_seq_len.min(model.cfg.max_position),
            pooling,
            normalize,
            head: EncoderHead::Embed,
        };
        DecoderEmbedder { model, info }
    }
}

impl EmbeddingModel for DecoderEmbedder {
    fn info(&self) -> &EncoderInfo {
        &self.info
    }

    fn forward(&self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>> {
        // A decoder reads one segment: pairs are scored by the cosine of their sides' vectors,
        // never encoded together.
        if batch
            .iter()
            .any(|input| input.type_ids.is_some_and(|t| t.iter().any(|&x| x != 0)))
        {
            return Err(EngineError::Internal(
                "a decoder embedding model takes single-segment inputs".into(),
            ));
        }
        if let Some(input) = batch.iter().find(|i| i.ids.len() > self.info.max_seq_len) {
            return Err(EngineError::invalid(
                format!(
                    "input of {} tokens exceeds the model's maximum of {}",
                    input.ids.len(),
                    self.info.max_seq_len
                ),
                None,
            ));
        }
        let prompts: Vec<&[u32]> = batch.iter().map(|i| i.ids).collect();
        let h = self.info.hidden_size;
        Ok(self
            .model
            .final_hidden(&prompts)?
            .iter()
            .map(|rows| self.info.pooling.pool(rows, h))
            .collect())
    }
}

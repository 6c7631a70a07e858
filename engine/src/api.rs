//! The types the gateway exchanges with the engine. Plain data, already validated by the
//! gateway (ranges, combinations); the engine only checks what needs the model (token ids).

use serde::Serialize;

/// What a served model can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    Generate,
    Embed,
    Score,
    Classify,
}

/// One entry of `/v1/models`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCard {
    /// The served name (`--served-model-name`, else the model path/name given).
    pub name: String,
    /// The checkpoint the name points at.
    pub root: String,
    pub max_model_len: usize,
    /// The device that runs the model: `cpu` or `cuda:N`.
    pub device: String,
    pub tasks: Vec<Task>,
    /// e.g. `["text"]`, `["text", "image", "video"]`.
    pub input_modalities: Vec<String>,
    /// Host memory the model holds and may use.
    pub memory: ModelMemory,
    /// The weights' bytes per tensor type, as the checkpoint stores them (read from its
    /// headers at load; the CPU holds them at that size).
    pub weight_types: crate::weight_summary::WeightSummary,
}

/// A served model's host memory, as the deployment's memory bound counts it (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelMemory {
    /// The weights: every byte of the checkpoint's weight files (mapped, resident once
    /// touched) plus the anonymous memory its load kept (converted tensors, the tokenizer).
    pub weights: u64,
    /// The host KV cache at its full size (0 for a GPU model's or an encoder).
    pub kv_cache: u64,
    /// One engine step at its largest: activations, logits, attention scratch, and the media
    /// towers' work on one prompt.
    pub step: u64,
    /// What one sequence (a decoder's choice, an encoder's input) holds besides the request
    /// body and its media: its token ids, its block table, its output.
    pub per_sequence: u64,
    /// The longest vocabulary entry in bytes: a logprob entry holds one token's text.
    pub max_token_bytes: u64,
}

/// Sampling and stopping for one sequence. Defaults are vLLM's.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// 0 or -1: off.
    pub top_k: i32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Per-request seed: the same seed gives the same tokens whatever the batch mates.
    pub seed: Option<u64>,
    /// New tokens at most (already clamped by the gateway to fit max_model_len).
    pub max_tokens: usize,
    pub min_tokens: usize,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
    pub stop: Vec<String>,
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: bool,
    /// `Some(k)`: report the chosen token's logprob and the top `k` alternatives.
    pub logprobs: Option<usize>,
    /// `Some(k)`: report, for every prompt token after the first, its logprob and rank under
    /// the model's distribution at the previous position, with the top `k` alternatives (the
    /// gateway resolves vLLM's `-1` to the vocabulary size). Such a prompt is computed in full:
    /// it takes no blocks from the prefix cache.
    pub prompt_logprobs: Option<usize>,
    /// Structured output: a grammar the generated text must match.
    pub constraint: Option<Constraint>,
    /// `(token id, bias)` pairs added to the logits (the gateway checks -100..=100; the engine
    /// checks the ids against the vocabulary).
    pub logit_bias: Vec<(u32, f32)>,
    /// Only these tokens may be generated (`None`: any).
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Words whose token sequence may not be completed (vLLM semantics: each word is
    /// tokenised as given and with a leading space; the last token of either is forbidden
    /// whenever the output ends with the rest of it).
    pub bad_words: Vec<String>,
}

/// A grammar the output must match. Checked (compiled) by
/// [`crate::handle::ModelHandle::check_constraint`]; errors carry no `param`, which the
/// gateway fills in with the request field it came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object.
    JsonObject,
    /// A JSON Schema (llguidance's subset: `type`, `properties`, `required`,
    /// `additionalProperties`, `items`, `prefixItems`, `enum`, `const`, `anyOf`/`oneOf`/`allOf`,
    /// local `$ref`, string `pattern`/`format`/lengths, numeric bounds; other validation
    /// keywords such as `uniqueItems` are refused, naming the keyword).
    JsonSchema(serde_json::Value),
    /// A regular expression (Rust `regex` syntax) the whole output must match.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect; a JSON llguidance grammar list (text starting
    /// with `{`) is also accepted. GBNF is not.
    Grammar(String),
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            max_tokens: 16,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            include_stop_str_in_output: false,
            skip_special_tokens: true,
            logprobs: None,
            prompt_logprobs: None,
            constraint: None,
            logit_bias: Vec::new(),
            allowed_token_ids: None,
            bad_words: Vec::new(),
        }
    }
}

/// One sequence to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub request_id: String,
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    /// Isolates prefix-cache reuse between tenants (CONTRACT section 7).
    pub cache_salt: Option<String>,
    /// The encoders' output for a multimodal prompt (`None` for text).
    pub media: Option<std::sync::Arc<PromptMedia>>,
}

/// A multimodal prompt's media, as the model's encoders produced it: what replaces the
/// placeholder rows, the M-RoPE positions of models that use them, and each item's content
/// hash and span for the prefix cache's `("mm", hash, offset)` keys.
#[derive(Debug, Clone, Default)]
pub struct PromptMedia {
    /// Each item's content hash and placeholder span in the prompt.
    pub items: Vec<crate::block_manager::MediaSpan>,
    /// Prompt positions (ascending) that take an embedding instead of a token's.
    pub rows: Vec<u32>,
    /// `rows.len() x hidden_size` values, in the order of `rows`.
    pub embeds: Vec<f32>,
    /// M-RoPE positions of every prompt token, and the offset of every later position.
    pub mrope: Option<(Vec<[u32; 3]>, i64)>,
}

impl PromptMedia {
    /// Shape checks against the prompt (the model checks the embedding width).
    pub fn check(&self, prompt_len: usize) -> Result<(), String> {
        if !self.rows.windows(2).all(|w| w[0] < w[1])
            || self.rows.last().is_some_and(|&r| r as usize >= prompt_len)
        {
            return Err("media rows must be ascending positions inside the prompt".into());
        }
        if self.rows.is_empty() != self.embeds.is_empty()
            || (!self.rows.is_empty() && !self.embeds.len().is_multiple_of(self.rows.len()))
        {
            return Err("media embeddings do not divide into the media rows".into());
        }
        if let Some((pos, _)) = &self.mrope {
            if pos.len() != prompt_len {
                return Err(format!(
                    "{} M-RoPE positions for a prompt of {prompt_len} tokens",
                    pos.len()
                ));
            }
        }
        if self.items.iter().any(|i| i.start + i.len > prompt_len) {
            return Err("a media item's span runs past the prompt".into());
        }
        Ok(())
    }

    /// The chunk view for prompt-or-generated positions `start .. start + len`: relative
    /// rows, their embeddings, and the positions of those tokens (buffers are reused).
    pub fn chunk<'a>(
        &'a self,
        start: usize,
        len: usize,
        prompt_len: usize,
        rows_buf: &'a mut Vec<u32>,
        pos_buf: &'a mut Vec<[u32; 3]>,
    ) -> ChunkMedia<'a> {
        let lo = self.rows.partition_point(|&r| (r as usize) < start);
        let hi = self.rows.partition_point(|&r| (r as usize) < start + len);
        let width = if self.rows.is_empty() {
            0
        } else {
            self.embeds.len() / self.rows.len()
        };
        rows_buf.clear();
        rows_buf.extend(self.rows[lo..hi].iter().map(|&r| r - start as u32));
        let (positions, delta) = match &self.mrope {
            Some((pos, delta)) => {
                pos_buf.clear();
                pos_buf.extend((start..start + len).map(|p| match pos.get(p) {
                    Some(p3) if p < prompt_len => *p3,
                    _ => [(p as i64 + delta).max(0) as u32; 3],
                }));
                (Some(&pos_buf[..]), *delta)
            }
            None => (None, 0),
        };
        ChunkMedia {
            rows: rows_buf,
            embeds: &self.embeds[lo * width..hi * width],
            positions,
            position_delta: delta,
        }
    }
}

/// The multimodal part of a chunk: rows whose input is an embedding (a vision or audio
/// encoder's output) instead of a token's, and the rotary positions of models with M-RoPE.
#[derive(Debug, Clone, Copy)]
pub struct ChunkMedia<'a> {
    /// Chunk rows (ascending) that take their input from `embeds`.
    pub rows: &'a [u32],
    /// `rows.len() x hidden_size` values, in the order of `rows`.
    pub embeds: &'a [f32],
    /// Per chunk token: (temporal, row, column) positions. `None`: every token's three
    /// positions are its sequence position plus `position_delta` (text after the media, and
    /// decode steps).
    pub positions: Option<&'a [[u32; 3]]>,
    /// See `positions`: the prompt's `max position + 1 - length`.
    pub position_delta: i64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
}

/// The logprob facts of one generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLogprobs {
    pub token_id: u32,
    pub logprob: f32,
    /// The top-k alternatives, best first.
    pub top: Vec<TokenLogprob>,
}

/// One prompt token's logprob facts (vLLM's prompt `Logprob` entries).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    pub token_id: u32,
    pub logprob: f32,
    /// 1 + the number of other tokens at least as likely (vLLM's rank: ties count ahead).
    pub rank: usize,
    /// The top-k alternatives, best first; the i-th has rank i + 1.
    pub top: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// max_tokens or the context length.
    Length,
    /// Cancelled.
    Abort,
}

/// What stopped a sequence with `FinishReason::Stop`, as vLLM's `stop_reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// EOS (vLLM reports `null`).
    Eos,
    TokenId(u32),
    String(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub stop_reason: Option<StopReason>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// An increment of one sequence's output. `text` is whole UTF-8 characters only and excludes
/// a stop string (unless `include_stop_str_in_output`); text that might still turn out to be the
/// start of a stop string is held back until it is known not to be.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Delta {
    pub text: String,
    pub token_ids: Vec<u32>,
    /// Aligned with `token_ids` when logprobs were requested, else empty.
    pub logprobs: Vec<StepLogprobs>,
    /// On the first delta when prompt logprobs were requested: one entry per prompt token,
    /// the first `None` (nothing predicts it).
    pub prompt_logprobs: Option<Vec<Option<PromptLogprob>>>,
    /// Set on the last delta of the sequence.
    pub finish: Option<Finish>,
}

/// Options for rendering a chat prompt.
#[derive(Debug, Clone, Default)]
pub struct ChatTemplateOptions {
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// A per-request template (the gateway only passes one when trusted).
    pub chat_template: Option<String>,
    /// Extra variables for the template (deployment defaults merged with the request's).
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
    pub tools: Option<serde_json::Value>,
}

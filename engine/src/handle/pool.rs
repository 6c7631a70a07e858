//! The front door for pooling: embeddings, classification and pair scores in one call.
//!
//! [`ModelHandle::pool`] takes what the client sent (texts, token ids, a chat, or the two
//! sides of a score request) and answers one row per input: tokenisation (pairs encoded as the
//! model's tokenizer encodes them, with token type ids), fitting to the context and
//! `truncate_prompt_tokens` (then `padding`), batching on the model's worker, the head, and what the request's
//! `use_activation` asks for on top of it. The gateway maps HTTP to this call and back.
//!
//! Scores come from the model's own head on a cross-encoder (one label: the pair's logit
//! through the checkpoint's score activation) and from the cosine of the two sides' vectors on
//! an embedding model.

use std::sync::mpsc::TrySendError;
use std::time::Instant;

use serde_json::Value;
use tokenizers::utils::truncation::{
    truncate_encodings, TruncationDirection, TruncationParams, TruncationStrategy,
};
use tokio::sync::oneshot;

use super::embed::{EmbedJob, EncodedInput};
use super::pad::pad;
use super::{Backend, EncoderBackend, ModelHandle};
use crate::api::ChatTemplateOptions;
use crate::error::{EngineError, Result};
use crate::model::{l2_normalize, ClassActivation, ClassifierInfo, EncoderHead};

/// What the client sent to pool.
pub enum PoolInput {
    Texts(Vec<String>),
    /// Token ids as the client sent them (special tokens as given).
    Ids(Vec<Vec<i64>>),
    /// Chat messages, rendered with the model's template (or a per-request one).
    Chat {
        messages: Value,
        template: Box<ChatTemplateOptions>,
    },
    /// The two sides of a score: one query against each document, or the i-th query with the
    /// i-th document.
    Pairs {
        queries: Vec<String>,
        documents: Vec<String>,
    },
}

/// What to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolTask {
    /// A sentence vector per input (normalised as the model or `use_activation` says).
    Embed,
    /// A classifier's probabilities per input (its logits with `use_activation: false`).
    Classify,
    /// One relevance score per pair ([`PoolInput::Pairs`] only).
    Score,
}

impl PoolTask {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolTask::Embed => "embed",
            PoolTask::Classify => "classify",
            PoolTask::Score => "score",
        }
    }
}

/// How to turn the input into rows.
#[derive(Debug, Clone, Copy)]
pub struct PoolOptions {
    pub task: PoolTask,
    pub add_special_tokens: bool,
    /// vLLM's `truncate_prompt_tokens`: cut each input (pair) to at most k tokens, special
    /// tokens included (-1: the model's length); `None`: too long is an error.
    pub truncate_prompt_tokens: Option<i64>,
    /// `None`: the task's default (the model's normalisation, the classifier's activation).
    pub use_activation: Option<bool>,
    /// vLLM's `padding: "max_length"`: each input filled to the model's length with the pad
    /// token (see `handle/pad.rs`).
    pub pad_to_max_length: bool,
    /// The request field that carried the input, named in errors.
    pub field: &'static str,
}

impl PoolOptions {
    /// `task` over the input in `field` as vLLM runs it by default: special tokens added, no
    /// truncation, the task's own activation.
    pub fn new(task: PoolTask, field: &'static str) -> Self {
        PoolOptions {
            task,
            add_special_tokens: true,
            truncate_prompt_tokens: None,
            use_activation: None,
            pad_to_max_length: false,
            field,
        }
    }
}

/// The answer: one row per input, or per pair for [`PoolTask::Score`] (a single value).
#[derive(Debug, Clone, PartialEq)]
pub struct Pooled {
    pub rows: Vec<Vec<f32>>,
    /// Tokens the model ran over, special tokens included.
    pub prompt_tokens: usize,
}

impl ModelHandle {
    /// The classifier's labels, in id order; `None` for an embedding model or a decoder.
    pub fn labels(&self) -> Option<&[String]> {
        match &self.inner.backend {
            Backend::Encoder(EncoderBackend {
                head: EncoderHead::Classify(c),
                ..
            }) => Some(&c.labels),
            _ => None,
        }
    }

    /// Tokenises, fits, batches and runs `input` for `opts.task`; see the module docs.
    pub async fn pool(&self, input: PoolInput, opts: PoolOptions) -> Result<Pooled> {
        let unsupported = || EngineError::UnsupportedTask {
            task: opts.task.as_str().into(),
        };
        let Backend::Encoder(e) = &self.inner.backend else {
            return Err(unsupported());
        };
        let limit = self.truncation_limit(opts.truncate_prompt_tokens)?;
        match (opts.task, &e.head, input) {
            (PoolTask::Score, head, PoolInput::Pairs { queries, documents }) => {
                let pairs = pair_indices(queries.len(), documents.len(), opts.field)?;
                match head {
                    EncoderHead::Classify(c) if c.labels.len() == 1 => {
                        let sides = (queries.as_slice(), documents.as_slice());
                        self.cross_scores(e, c, sides, &pairs, limit, opts).await
                    }
                    EncoderHead::Classify(_) => Err(unsupported()),
                    EncoderHead::Embed => {
                        self.cosine_scores(e, queries, documents, &pairs, limit, opts)
                            .await
                    }
                }
            }
            (PoolTask::Score, _, _) | (_, _, PoolInput::Pairs { .. }) => {
                Err(EngineError::Internal(
                    "scores are asked for with pairs, and pairs only for scores".into(),
                ))
            }
            (PoolTask::Embed, EncoderHead::Embed, input) => {
                let padding = self.padding(e, opts)?;
                let mut inputs = self.single_inputs(input, limit, opts)?;
                pad(&mut inputs, padding);
                let (mut rows, prompt_tokens) = self.run(e, inputs).await?;
                if opts.use_activation.unwrap_or(e.normalize) {
                    rows.iter_mut().for_each(|v| l2_normalize(v));
                }
                Ok(Pooled {
                    rows,
                    prompt_tokens,
                })
            }
            (PoolTask::Classify, EncoderHead::Classify(c), input) => {
                let padding = self.padding(e, opts)?;
                let mut inputs = self.single_inputs(input, limit, opts)?;
                pad(&mut inputs, padding);
                let (mut rows, prompt_tokens) = self.run(e, inputs).await?;
                let act = activation(opts.use_activation, c.classify);
                rows.iter_mut().for_each(|v| act.apply(v));
                Ok(Pooled {
                    rows,
                    prompt_tokens,
                })
            }
            _ => Err(unsupported()),
        }
    }

    /// Embeds already tokenised single-segment inputs as `/v1/embeddings` answers by default
    /// (normalised where the model normalises). Inputs are checked against the context and
    /// the vocabulary here.
    pub async fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>> {
        let Backend::Encoder(e) = &self.inner.backend else {
            return Err(EngineError::UnsupportedTask {
                task: "embed".into(),
            });
        };
        let inputs = inputs
            .into_iter()
            .map(|ids| EncodedInput {
                ids,
                type_ids: None,
            })
            .collect();
        let (mut rows, _) = self.run(e, inputs).await?;
        if e.head == EncoderHead::Embed && e.normalize {
            rows.iter_mut().for_each(|v| l2_normalize(v));
        }
        Ok(rows)
    }

    /// `truncate_prompt_tokens` as a token limit.
    fn truncation_limit(&self, truncate: Option<i64>) -> Result<Option<usize>> {
        let max_len = self.card().max_model_len;
        match truncate {
            None => Ok(None),
            Some(-1) => Ok(Some(max_len)),
            Some(k) if k >= 1 && k as u64 <= max_len as u64 => Ok(Some(k as usize)),
            Some(k) if k > 0 => Err(EngineError::invalid(
                "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.",
                Some("truncate_prompt_tokens"),
            )),
            Some(k) => Err(EngineError::invalid(
                format!("truncate_prompt_tokens must be -1 or at least 1, got {k}."),
                Some("truncate_prompt_tokens"),
            )),
        }
    }

    /// Texts, token ids or a chat as single-segment inputs, each fitted to the model.
    fn single_inputs(
        &self,
        input: PoolInput,
        limit: Option<usize>,
        opts: PoolOptions,
    ) -> Result<Vec<EncodedInput>> {
        let texts = match input {
            PoolInput::Texts(texts) => texts,
            PoolInput::Chat { messages, template } => vec![self.render_chat(&messages, &template)?],
            PoolInput::Ids(lists) => {
                if lists.is_empty() {
                    return Err(empty(opts.field));
                }
                return lists
                    .iter()
                    .map(|ids| {
                        let ids = self.token_ids(ids, opts.field)?;
                        self.fit(ids, limit, false, opts.field)
                    })
                    .collect();
            }
            PoolInput::Pairs { .. } => {
                return Err(EngineError::Internal("pairs are not single inputs".into()))
            }
        };
        if texts.is_empty() {
            return Err(empty(opts.field));
        }
        let bytes = texts.iter().map(String::len).sum();
        super::off_reactor(bytes, || {
            texts
                .iter()
                .map(|t| {
                    if limit.is_none() {
                        self.check_bytes(t.len(), opts.field)?;
                    }
                    let ids = self.encode(t, opts.add_special_tokens)?;
                    self.fit(ids, limit, opts.add_special_tokens, opts.field)
                })
                .collect()
        })
    }

    /// One input within the model's length. Too long: an error unless truncating, which keeps
    /// the head of the input and its closing special token (as the tokenizer's own right-side
    /// truncation does).
    fn fit(
        &self,
        mut ids: Vec<u32>,
        limit: Option<usize>,
        closing_special: bool,
        field: &'static str,
    ) -> Result<EncodedInput> {
        match limit {
            None => self.check_length(ids.len(), field)?,
            Some(k) if ids.len() > k => {
                if closing_special && k >= 2 {
                    let last = ids[ids.len() - 1];
                    ids.truncate(k - 1);
                    ids.push(last);
                } else {
                    ids.truncate(k);
                }
            }
            Some(_) => {}
        }
        if ids.is_empty() {
            return Err(empty(field));
        }
        Ok(EncodedInput {
            ids,
            type_ids: None,
        })
    }

    /// Refuses, before tokenising it, a text whose byte length alone proves it too long.
    fn check_bytes(&self, bytes: usize, field: &'static str) -> Result<()> {
        let max_len = self.card().max_model_len;
        let at_least = self.min_tokens_for(bytes);
        if at_least > max_len {
            return Err(EngineError::invalid(
                format!("This model's maximum context length is {max_len} tokens. However, you requested at least {at_least} tokens in the input ({bytes} bytes of text). Please reduce the length of the input."),
                Some(field),
            ));
        }
        Ok(())
    }

    fn check_length(&self, len: usize, field: &'static str) -> Result<()> {
        let max_len = self.card().max_model_len;
        if len > max_len {
            return Err(EngineError::invalid(
                format!("This model's maximum context length is {max_len} tokens. However, you requested {len} tokens in the input for embedding generation. Please reduce the length of the input."),
                Some(field),
            ));
        }
        Ok(())
    }

    /// A (query, document) pair as the tokenizer encodes it for a cross-encoder: both sides,
    /// then its pair template (special tokens, token type ids). With a limit, the longer side
    /// loses tokens first (the tokenizer's `longest_first`), so the whole pair fits.
    fn encode_pair(
        &self,
        query: &str,
        document: &str,
        limit: Option<usize>,
        opts: PoolOptions,
    ) -> Result<EncodedInput> {
        if limit.is_none() {
            self.check_bytes(query.len() + document.len(), opts.field)?;
        }
        let tok = self.tokenizer();
        let failed =
            |e: tokenizers::Error| EngineError::Internal(format!("tokenisation failed: {e}"));
        let first = tok.encode(query, false).map_err(failed)?;
        let second = tok.encode(document, false).map_err(failed)?;
        let (first, second) = match limit {
            None => (first, Some(second)),
            Some(k) => {
                let added = match tok.get_post_processor() {
                    Some(p) if opts.add_special_tokens => {
                        tokenizers::PostProcessor::added_tokens(p, true)
                    }
                    _ => 0,
                };
                let params = TruncationParams {
                    max_length: k.saturating_sub(added),
                    strategy: TruncationStrategy::LongestFirst,
                    stride: 0,
                    direction: TruncationDirection::Right,
                };
                truncate_encodings(first, Some(second), &params).map_err(failed)?
            }
        };
        let pair = tok
            .post_process(first, second, opts.add_special_tokens)
            .map_err(failed)?;
        let ids = pair.get_ids().to_vec();
        match limit {
            Some(k) if ids.len() > k => {
                return Err(EngineError::invalid(
                    format!("truncate_prompt_tokens {k} leaves no room for the pair's text: its special tokens alone take {} tokens.", ids.len()),
                    Some("truncate_prompt_tokens"),
                ))
            }
            _ => self.check_length(ids.len(), opts.field)?,
        }
        Ok(EncodedInput {
            type_ids: Some(pair.get_type_ids().to_vec()),
            ids,
        })
    }

    async fn cross_scores(
        &self,
        e: &EncoderBackend,
        classifier: &ClassifierInfo,
        (queries, documents): (&[String], &[String]),
        pairs: &[(usize, usize)],
        limit: Option<usize>,
        opts: PoolOptions,
    ) -> Result<Pooled> {
        let bytes = pairs
            .iter()
            .map(|&(q, d)| queries[q].len() + documents[d].len())
            .sum();
        let padding = self.padding(e, opts)?;
        let mut inputs = super::off_reactor(bytes, || {
            pairs
                .iter()
                .map(|&(q, d)| self.encode_pair(&queries[q], &documents[d], limit, opts))
                .collect::<Result<Vec<_>>>()
        })?;
        pad(&mut inputs, padding);
        let (logits, prompt_tokens) = self.run(e, inputs).await?;
        let act = activation(opts.use_activation, classifier.score);
        let rows = logits
            .into_iter()
            .map(|mut v| {
                act.apply(&mut v);
                v.truncate(1);
                v
            })
            .collect();
        Ok(Pooled {
            rows,
            prompt_tokens,
        })
    }

    /// A bi-encoder's scores: every text of both sides embedded once, then the cosine of
    /// each pair's vectors.
    async fn cosine_scores(
        &self,
        e: &EncoderBackend,
        queries: Vec<String>,
        documents: Vec<String>,
        pairs: &[(usize, usize)],
        limit: Option<usize>,
        opts: PoolOptions,
    ) -> Result<Pooled> {
        let n_left = queries.len();
        let mut texts = queries;
        texts.extend(documents);
        let padding = self.padding(e, opts)?;
        let mut inputs = self.single_inputs(PoolInput::Texts(texts), limit, opts)?;
        pad(&mut inputs, padding);
        let (vectors, prompt_tokens) = self.run(e, inputs).await?;
        let rows = pairs
            .iter()
            .map(|&(q, d)| vec![cosine(&vectors[q], &vectors[n_left + d]) as f32])
            .collect();
        Ok(Pooled {
            rows,
            prompt_tokens,
        })
    }

    /// Runs inputs on the model's worker (batched with other requests' inputs up to the token
    /// budget): the head's raw output per input, and the tokens run.
    async fn run(
        &self,
        e: &EncoderBackend,
        inputs: Vec<EncodedInput>,
    ) -> Result<(Vec<Vec<f32>>, usize)> {
        if inputs.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let vocab = self.inner.tokenizer.get_vocab_size(true);
        for (i, input) in inputs.iter().enumerate() {
            if input.ids.is_empty() {
                return Err(EngineError::invalid(
                    format!("input {i} is empty"),
                    Some("input"),
                ));
            }
            if input.ids.len() > e.max_seq_len {
                return Err(EngineError::invalid(
                    format!(
                        "This model's maximum context length is {} tokens. However, input {i} has {} tokens.",
                        e.max_seq_len,
                        input.ids.len()
                    ),
                    Some("input"),
                ));
            }
            if let Some(bad) = input.ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(EngineError::invalid(
                    format!("Token id {bad} is out of vocabulary"),
                    Some("input"),
                ));
            }
        }
        let started = Instant::now();
        let tokens: usize = inputs.iter().map(|i| i.ids.len()).sum();
        let (reply, wait) = oneshot::channel();
        match e.jobs.try_send(EmbedJob { inputs, reply }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(EngineError::Overloaded(
                    "the embedding queue is full".into(),
                ))
            }
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::Stopped),
        }
        let rows = wait
            .await
            .map_err(|_| EngineError::Internal("the embedding worker stopped".into()))??;
        // Counted like a finished generation, so the request and token counters cover every
        // model a dashboard shows; a request whose client left is not counted.
        self.inner.metrics.prompt_tokens(tokens);
        self.inner
            .metrics
            .request_finished(crate::api::FinishReason::Stop, started.elapsed());
        Ok((rows, tokens))
    }
}

/// The head's activation unless the request turned it off.
fn activation(use_activation: Option<bool>, default: ClassActivation) -> ClassActivation {
    if use_activation.unwrap_or(true) {
        default
    } else {
        ClassActivation::Identity
    }
}

fn empty(field: &'static str) -> EngineError {
    EngineError::invalid(format!("{field} must not be empty."), Some(field))
}

/// Index pairs for 1:N (one query against every document) and N:N (zipped).
pub fn pair_indices(
    n_left: usize,
    n_right: usize,
    field: &'static str,
) -> Result<Vec<(usize, usize)>> {
    if n_left == 0 || n_right == 0 {
        return Err(EngineError::invalid(
            "Both sides to score must be non-empty.",
            Some(field),
        ));
    }
    if n_left == 1 {
        Ok((0..n_right).map(|j| (0, j)).collect())
    } else if n_left == n_right {
        Ok((0..n_left).map(|i| (i, i)).collect())
    } else {
        Err(EngineError::invalid(
            format!("The two sides must have the same length for N:N scoring, or the first side a single item (got {n_left} and {n_right})."),
            Some(field),
        ))
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        dot += f64::from(x) * f64::from(y);
        na += f64::from(x) * f64::from(x);
        nb += f64::from(y) * f64::from(y);
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
    fn pair_shapes() {
        assert_eq!(
            pair_indices(1, 3, "documents").unwrap(),
            vec![(0, 0), (0, 1), (0, 2)]
        );
        assert_eq!(
            pair_indices(2, 2, "documents").unwrap(),
            vec![(0, 0), (1, 1)]
        );
        assert!(pair_indices(2, 3, "documents").is_err());
        assert!(pair_indices(0, 1, "documents").is_err());
    }

    #[test]
    fn cosine_basics() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-12);
        assert_eq!(cosine(&[0.0], &[1.0]), 0.0);
    }

    #[test]
    fn use_activation_false_is_identity() {
        assert_eq!(
            activation(Some(false), ClassActivation::Softmax),
            ClassActivation::Identity
        );
        assert_eq!(
            activation(None, ClassActivation::Sigmoid),
            ClassActivation::Sigmoid
        );
    }
}

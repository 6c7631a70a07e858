//! BERT-family encoder (BERT, MiniLM, RoBERTa, XLM-R) for sentence embeddings and sequence
//! classification.
//!
//! Word + position + token-type embeddings and LayerNorm, then post-LN transformer layers
//! (self-attention, GELU feed-forward), then the head ([`head`]): pooling (mean over the
//! tokens, [CLS] or last token), or a classification head over the first token. A head that
//! reads one token per sequence has the last layer run past that token only ([`picked`]).
//! RoBERTa and XLM-R differ from BERT only in their positions, which count from `pad_token_id + 1` (their
//! position table reserves the rows below), and in having a single token type.
//!
//! A batch is run without padding: it is cut into chunks of whole sequences with about the same
//! number of tokens (at least one per thread when the batch is big enough), and the tokens of a
//! chunk are packed into one `[tokens, hidden]` matrix, so every dense layer is one matrix
//! product over the chunk, and attention runs per (head, sequence) on that sequence's rows
//! only. No attention mask is needed and a sequence's vector does not depend on what it was
//! batched with. Chunks run side by side on the current rayon pool (`ThreadPool::install` to
//! bound it), each forward pass mostly on one thread; a batch too small to cut runs its layers'
//! loops in parallel instead.

mod chunks;
pub(crate) mod dense;
mod head;
mod picked;

use std::sync::Mutex;

use kernels::{add_layer_norm, gemm_packed, softmax_rows, Activation, PackedB};
use rayon::prelude::*;

use self::chunks::plan_chunks;
use self::dense::{activation_from_hf, internal, Dense};
pub use self::head::ClassifierLayout;
use self::head::Head;
use self::picked::LastBuffers;
use crate::error::{EngineError, Result};
use crate::hf::{HfConfig, SafetensorsWeights};
use crate::model::{EmbeddingModel, EncoderHead, EncoderInfo, EncoderInput, Pooling};

/// Rows per task for the row-wise operations (LayerNorm, activation).
const ROWS_PER_TASK: usize = 32;

#[derive(Debug, Clone)]
struct Dims {
    hidden: usize,
    heads: usize,
    head_dim: usize,
    intermediate: usize,
    vocab: usize,
    max_position: usize,
    /// Row of the position table for position 0 (RoBERTa: `pad_token_id + 1`).
    position_offset: usize,
    type_vocab: usize,
    eps: f32,
    act: Activation,
}

struct Embeddings {
    word: Vec<f32>,
    position: Vec<f32>,
    /// `[type_vocab][hidden]`.
    token_type: Vec<f32>,
    ln_g: Vec<f32>,
    ln_b: Vec<f32>,
}

struct Layer {
    /// Query, key and value projections fused: n = 3 * hidden.
    qkv: Dense,
    attn_out: Dense,
    ln1_g: Vec<f32>,
    ln1_b: Vec<f32>,
    up: Dense,
    down: Dense,
    ln2_g: Vec<f32>,
    ln2_b: Vec<f32>,
}

/// Activation buffers of one forward pass, kept between calls so that a pass allocates (and
/// page-faults) nothing once warm.
#[derive(Default)]
struct Workspace {
    x: Vec<f32>,
    qkv: Vec<f32>,
    ctx_heads: Vec<f32>,
    ctx: Vec<f32>,
    tmp: Vec<f32>,
    ffn: Vec<f32>,
}

/// Workspaces kept for reuse: one per concurrent forward pass (a pass per thread when a batch
/// is split), as many as the pool has threads, within these bounds.
const IDLE_WORKSPACES: (usize, usize) = (2, 8);

/// A loaded BERT encoder.
pub struct BertEncoder {
    info: EncoderInfo,
    dims: Dims,
    emb: Embeddings,
    layers: Vec<Layer>,
    head: Head,
    workspaces: Mutex<Vec<Workspace>>,
}

impl std::fmt::Debug for BertEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertEncoder")
            .field("info", &self.info)
            .field("dims", &self.dims)
            .field("layers", &self.layers.len())
            .finish()
    }
}

/// Reads tensors with the checkpoint's prefix (`bert.` in `BertForMaskedLM` and friends,
/// `roberta.` in `XLMRobertaForSequenceClassification`; empty for the top level).
struct Reader<'a> {
    weights: &'a SafetensorsWeights,
    prefix: &'static str,
}

impl Reader<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.weights
            .tensor_f32_shaped(&format!("{}{name}", self.prefix), shape)
    }

    /// A LayerNorm's scale and shift (`weight`/`bias`, or the old `gamma`/`beta`).
    fn layer_norm(&self, base: &str, h: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let full = format!("{}{base}.weight", self.prefix);
        if self.weights.contains(&full)
            || !self
                .weights
                .contains(&format!("{}{base}.gamma", self.prefix))
        {
            Ok((
                self.get(&format!("{base}.weight"), &[h])?,
                self.get(&format!("{base}.bias"), &[h])?,
            ))
        } else {
            Ok((
                self.get(&format!("{base}.gamma"), &[h])?,
                self.get(&format!("{base}.beta"), &[h])?,
            ))
        }
    }
}

/// What the loader decides about an encoder beyond its `config.json`.
#[derive(Debug, Clone)]
pub struct EncoderSpec {
    pub pooling: Pooling,
    /// Normalise sentence vectors by default.
    pub normalize: bool,
    pub head: EncoderHead,
    /// Where a classification head's tensors are (with [`EncoderHead::Classify`]).
    pub classifier_layout: ClassifierLayout,
    pub max_seq_len: usize,
}

/// The row of the position table that position 0 takes: RoBERTa-style models (RoBERTa,
/// XLM-R, CamemBERT) count positions from `pad_token_id + 1`, BERT from 0.
pub fn position_offset(cfg: &HfConfig) -> usize {
    match cfg.model_type.as_deref() {
        Some("roberta" | "xlm-roberta" | "camembert") => cfg.pad_token_id.unwrap_or(1) as usize + 1,
        _ => 0,
    }
}

impl BertEncoder {
    /// Builds the encoder from a parsed `config.json` and the checkpoint's weights. Every
    /// missing or misshaped tensor is a `Load` error naming it.
    pub fn load(cfg: &HfConfig, weights: &SafetensorsWeights, spec: EncoderSpec) -> Result<Self> {
        let EncoderSpec {
            pooling,
            normalize,
            head,
            classifier_layout,
            max_seq_len,
        } = spec;
        let hidden = cfg.require(cfg.hidden_size, "hidden_size")?;
        let layers_n = cfg.require(cfg.num_hidden_layers, "num_hidden_layers")?;
        let heads = cfg.require(cfg.num_attention_heads, "num_attention_heads")?;
        let intermediate = cfg.require(cfg.intermediate_size, "intermediate_size")?;
        let vocab = cfg.require(cfg.vocab_size, "vocab_size")?;
        let max_position = cfg.require(cfg.max_position_embeddings, "max_position_embeddings")?;
        let type_vocab = cfg.type_vocab_size.unwrap_or(2);
        let eps = cfg.layer_norm_eps.unwrap_or(1e-12) as f32;
        let act_name = cfg.hidden_act.as_deref().unwrap_or("gelu");
        let act = activation_from_hf(act_name).ok_or_else(|| {
            EngineError::load(
                "config.json",
                format!("unsupported hidden_act `{act_name}`"),
            )
        })?;
        if let Some(kind) = cfg.position_embedding_type.as_deref() {
            if kind != "absolute" {
                return Err(EngineError::load(
                    "config.json",
                    format!("unsupported position_embedding_type `{kind}` (only absolute)"),
                ));
            }
        }
        if heads == 0 || hidden == 0 || !hidden.is_multiple_of(heads) || type_vocab == 0 {
            return Err(EngineError::load(
                "config.json",
                format!("hidden_size {hidden} is not a multiple of num_attention_heads {heads}"),
            ));
        }
        let position_offset = position_offset(cfg);
        let max_len = max_position.saturating_sub(position_offset);
        if max_seq_len == 0 || max_seq_len > max_len {
            return Err(EngineError::load(
                "config.json",
                format!("max_seq_len {max_seq_len} is outside 1..={max_len} (max_position_embeddings {max_position}, positions from {position_offset})"),
            ));
        }
        let prefix = ["bert.", "roberta."]
            .into_iter()
            .find(|p| weights.contains(&format!("{p}embeddings.word_embeddings.weight")))
            .unwrap_or("");
        let r = Reader { weights, prefix };
        let root = Reader {
            weights,
            prefix: "",
        };
        let (ln_g, ln_b) = r.layer_norm("embeddings.LayerNorm", hidden)?;
        let emb = Embeddings {
            word: r.get("embeddings.word_embeddings.weight", &[vocab, hidden])?,
            position: r.get(
                "embeddings.position_embeddings.weight",
                &[max_position, hidden],
            )?,
            token_type: r.get(
                "embeddings.token_type_embeddings.weight",
                &[type_vocab, hidden],
            )?,
            ln_g,
            ln_b,
        };
        let mut layers = Vec::with_capacity(layers_n);
        for i in 0..layers_n {
            let p = format!("encoder.layer.{i}");
            let hh = [hidden, hidden];
            let mut qkv_w = Vec::with_capacity(3 * hidden * hidden);
            let mut qkv_b = Vec::with_capacity(3 * hidden);
            for part in ["query", "key", "value"] {
                qkv_w.extend(r.get(&format!("{p}.attention.self.{part}.weight"), &hh)?);
                qkv_b.extend(r.get(&format!("{p}.attention.self.{part}.bias"), &[hidden])?);
            }
            let (ln1_g, ln1_b) =
                r.layer_norm(&format!("{p}.attention.output.LayerNorm"), hidden)?;
            let (ln2_g, ln2_b) = r.layer_norm(&format!("{p}.output.LayerNorm"), hidden)?;
            let attn_out_w = r.get(&format!("{p}.attention.output.dense.weight"), &hh)?;
            let attn_out_b = r.get(&format!("{p}.attention.output.dense.bias"), &[hidden])?;
            let up_w = r.get(
                &format!("{p}.intermediate.dense.weight"),
                &[intermediate, hidden],
            )?;
            let up_b = r.get(&format!("{p}.intermediate.dense.bias"), &[intermediate])?;
            let down_w = r.get(&format!("{p}.output.dense.weight"), &[hidden, intermediate])?;
            let down_b = r.get(&format!("{p}.output.dense.bias"), &[hidden])?;
            layers.push(Layer {
                qkv: Dense::new(&qkv_w, qkv_b, 3 * hidden, hidden),
                attn_out: Dense::new(&attn_out_w, attn_out_b, hidden, hidden),
                ln1_g,
                ln1_b,
                up: Dense::new(&up_w, up_b, intermediate, hidden),
                down: Dense::new(&down_w, down_b, hidden, intermediate),
                ln2_g,
                ln2_b,
            });
        }
        let dims = Dims {
            hidden,
            heads,
            head_dim: hidden / heads,
            intermediate,
            vocab,
            max_position,
            position_offset,
            type_vocab,
            eps,
            act,
        };
        let head_impl = match &head {
            EncoderHead::Embed => Head::Pool(pooling),
            EncoderHead::Classify(c) => {
                Head::classifier(classifier_layout, &r, &root, hidden, c.labels.len())?
            }
        };
        tracing::info!(
            hidden,
            layers = layers_n,
            heads,
            max_seq_len,
            ?pooling,
            normalize,
            labels = match &head {
                EncoderHead::Embed => 0,
                EncoderHead::Classify(c) => c.labels.len(),
            },
            "loaded BERT encoder"
        );
        Ok(BertEncoder {
            info: EncoderInfo {
                hidden_size: hidden,
                max_seq_len,
                pooling,
                normalize,
                head,
            },
            dims,
            emb,
            layers,
            head: head_impl,
            workspaces: Mutex::new(Vec::new()),
        })
    }

    fn check_input(&self, index: usize, input: &EncoderInput<'_>) -> Result<()> {
        let ids = input.ids;
        if let Some(types) = input.type_ids {
            if types.len() != ids.len() {
                return Err(EngineError::Internal(format!(
                    "input {index}: {} token type ids for {} tokens",
                    types.len(),
                    ids.len()
                )));
            }
            if let Some(&bad) = types.iter().find(|&&t| t as usize >= self.dims.type_vocab) {
                return Err(EngineError::invalid(
                    format!(
                        "token type id {bad} in input {index} is out of range (the model has {} token types)",
                        self.dims.type_vocab
                    ),
                    Some("input"),
                ));
            }
        }
        if ids.is_empty() {
            return Err(EngineError::invalid(
                format!("input {index} has no tokens"),
                Some("input"),
            ));
        }
        let max = self
            .info
            .max_seq_len
            .min(self.dims.max_position - self.dims.position_offset);
        if ids.len() > max {
            return Err(EngineError::invalid(
                format!(
                    "This model's maximum context length is {max} tokens. However, input {index} has {} tokens.",
                    ids.len()
                ),
                Some("input"),
            ));
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.dims.vocab) {
            return Err(EngineError::invalid(
                format!(
                    "token id {bad} in input {index} is out of vocabulary (size {})",
                    self.dims.vocab
                ),
                Some("input"),
            ));
        }
        Ok(())
    }

    /// Runs the layers and the head over packed sequences: one result per sequence.
    fn run_chunk(&self, seqs: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>> {
        let total: usize = seqs.iter().map(|s| s.ids.len()).sum();
        let mut spans = Vec::with_capacity(seqs.len());
        let mut t0 = 0;
        for s in seqs {
            spans.push((t0, s.ids.len()));
            t0 += s.ids.len();
        }
        let mut ws = self
            .workspaces
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop()
            .unwrap_or_default();
        let result = self.forward_in(seqs, &spans, total, &mut ws);
        let mut idle = self
            .workspaces
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (fewest, most) = IDLE_WORKSPACES;
        if idle.len() < rayon::current_num_threads().clamp(fewest, most) {
            idle.push(ws);
        }
        result
    }

    fn forward_in(
        &self,
        seqs: &[EncoderInput<'_>],
        spans: &[(usize, usize)],
        total: usize,
        ws: &mut Workspace,
    ) -> Result<Vec<Vec<f32>>> {
        let d = &self.dims;
        let h = d.hidden;
        for (buf, len) in [
            (&mut ws.x, total * h),
            (&mut ws.qkv, total * 3 * h),
            (&mut ws.ctx_heads, total * h),
            (&mut ws.ctx, total * h),
            (&mut ws.tmp, total * h),
            (&mut ws.ffn, total * d.intermediate),
        ] {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
        }
        let mut x = &mut ws.x[..total * h];
        let mut tmp = &mut ws.tmp[..total * h];
        let qkv = &mut ws.qkv[..total * 3 * h];
        let ctx_heads = &mut ws.ctx_heads[..total * h];
        let ctx = &mut ws.ctx[..total * h];
        let ffn = &mut ws.ffn[..total * d.intermediate];
        self.embed_tokens(seqs, x);
        for (i, layer) in self.layers.iter().enumerate() {
            if let (true, Some(pick)) = (i + 1 == self.layers.len(), self.head.picked()) {
                // An empty sequence has no token to pick: the full layer handles it.
                if self.can_pick(layer) && spans.iter().all(|&(_, len)| len > 0) {
                    let buffers = LastBuffers {
                        x,
                        qkv,
                        rows: tmp,
                        query: ctx,
                        ctx: ctx_heads,
                        ffn,
                    };
                    let rows = self.last_layer_picked(layer, pick, spans, buffers)?;
                    let one_each: Vec<(usize, usize)> = (0..spans.len()).map(|s| (s, 1)).collect();
                    return self.head.apply(rows, &one_each, h);
                }
            }
            layer.qkv.forward(total, x, qkv)?;
            self.attention(qkv, spans, ctx_heads)?;
            self.heads_to_tokens(ctx_heads, total, ctx);
            layer.attn_out.forward(total, ctx, tmp)?;
            self.residual_norm(tmp, x, &layer.ln1_g, &layer.ln1_b);
            std::mem::swap(&mut x, &mut tmp);
            layer.up.forward_act(total, x, ffn, Some(d.act))?;
            layer.down.forward(total, ffn, tmp)?;
            self.residual_norm(tmp, x, &layer.ln2_g, &layer.ln2_b);
            std::mem::swap(&mut x, &mut tmp);
        }
        self.head.apply(x, spans, h)
    }

    fn embed_tokens(&self, seqs: &[EncoderInput<'_>], x: &mut [f32]) {
        let h = self.dims.hidden;
        let offset = self.dims.position_offset;
        let mut rows = x.chunks_exact_mut(h);
        for s in seqs {
            for (pos, (&id, row)) in s.ids.iter().zip(rows.by_ref()).enumerate() {
                let word = &self.emb.word[id as usize * h..(id as usize + 1) * h];
                let position = &self.emb.position[(pos + offset) * h..(pos + offset + 1) * h];
                let kind = s.type_ids.map_or(0, |t| t[pos] as usize);
                let token_type = &self.emb.token_type[kind * h..(kind + 1) * h];
                for (((o, &w), &p), &t) in row.iter_mut().zip(word).zip(position).zip(token_type) {
                    *o = w + p + t;
                }
            }
        }
        let (g, b, eps) = (&self.emb.ln_g, &self.emb.ln_b, self.dims.eps);
        x.par_chunks_mut(ROWS_PER_TASK * h)
            .for_each(|c| add_layer_norm(c, &[], g, b, eps));
    }

    /// `out = LayerNorm(out + residual)` row-wise, in parallel.
    fn residual_norm(&self, out: &mut [f32], residual: &[f32], g: &[f32], b: &[f32]) {
        let h = self.dims.hidden;
        let eps = self.dims.eps;
        out.par_chunks_mut(ROWS_PER_TASK * h)
            .zip(residual.par_chunks(ROWS_PER_TASK * h))
            .for_each(|(o, r)| add_layer_norm(o, r, g, b, eps));
    }

    /// Self-attention of every sequence, every head, into `out` laid out head-major:
    /// `[head][token][head_dim]`, so each (head, sequence) task owns one contiguous slice. A
    /// task runs the fused kernel of [`attention`] where the CPU and head size allow, and
    /// otherwise two products through the GEMM with a row softmax between them.
    fn attention(&self, qkv: &[f32], spans: &[(usize, usize)], out: &mut [f32]) -> Result<()> {
        let d = &self.dims;
        let (h, hd) = (d.hidden, d.head_dim);
        let ld = 3 * h;
        let scale = 1.0 / (hd as f32).sqrt();
        let fused = kernels::fused_attention_available(hd);
        let mut tasks = Vec::with_capacity(d.heads * spans.len());
        let mut rest = out;
        for head in 0..d.heads {
            for &(t0, len) in spans {
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut(len * hd);
                tasks.push((head, t0, len, mine));
                rest = tail;
            }
        }
        tasks.into_par_iter().try_for_each_init(
            || (PackedB::default(), PackedB::default(), Vec::<f32>::new()),
            |(keys, values, scores), (head, t0, len, mine)| {
                let q = &qkv[t0 * ld + head * hd..];
                if fused {
                    let k = &qkv[t0 * ld + h + head * hd..];
                    let v = &qkv[t0 * ld + 2 * h + head * hd..];
                    return kernels::fused_attention(
                        q, k, v, ld, len, hd, scale, keys, values, scores, mine,
                    )
                    .map_err(internal);
                }
                keys.pack_transposed(&qkv[t0 * ld + h + head * hd..], ld, hd, len);
                if scores.len() < len * len {
                    scores.resize(len * len, 0.0);
                }
                let scores = &mut scores[..len * len];
                gemm_packed(len, q, ld, keys, scores, len, None, false).map_err(internal)?;
                softmax_rows(scores, len, scale);
                values.pack_rows(&qkv[t0 * ld + 2 * h + head * hd..], ld, len, hd);
                gemm_packed(len, scores, len, values, mine, hd, None, false).map_err(internal)
            },
        )
    }

    /// Head-major attention output back to `[token][hidden]`.
    fn heads_to_tokens(&self, heads: &[f32], total: usize, out: &mut [f32]) {
        let (h, hd) = (self.dims.hidden, self.dims.head_dim);
        out.par_chunks_mut(ROWS_PER_TASK * h)
            .enumerate()
            .for_each(|(blk, rows)| {
                for (r, row) in rows.chunks_exact_mut(h).enumerate() {
                    let t = blk * ROWS_PER_TASK + r;
                    for (head, dst) in row.chunks_exact_mut(hd).enumerate() {
                        let src = (head * total + t) * hd;
                        dst.copy_from_slice(&heads[src..src + hd]);
                    }
                }
            });
    }
}

impl EmbeddingModel for BertEncoder {
    fn info(&self) -> &EncoderInfo {
        &self.info
    }

    fn step_host_bytes(&self, tokens: usize, threads: usize) -> u64 {
        let d = &self.dims;
        // The workspace's rows (x, qkv, per-head and merged context, tmp, ffn), the pooled
        // outputs, and each thread's scores of one head over the longest input.
        let rows = tokens * (8 * d.hidden + d.intermediate);
        let scores = threads * d.max_position * d.max_position;
        ((rows + scores) as u64).saturating_mul(4)
    }

    fn forward(&self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>> {
        for (i, input) in batch.iter().enumerate() {
            self.check_input(i, input)?;
        }
        // Longest first, so chunks hold sequences of similar length and the attention tasks of
        // a chunk are evenly sized.
        let mut order: Vec<usize> = (0..batch.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(batch[i].ids.len()));
        let lens: Vec<usize> = order.iter().map(|&i| batch[i].ids.len()).collect();
        let chunks = plan_chunks(&lens, rayon::current_num_threads());
        let run = |range: &std::ops::Range<usize>| {
            let seqs: Vec<EncoderInput<'_>> =
                order[range.clone()].iter().map(|&i| batch[i]).collect();
            self.run_chunk(&seqs)
        };
        // Chunks run side by side, one forward pass per thread; the layers' own parallel loops
        // then mostly stay on their thread, and a thread that finishes early steals from them.
        let results: Vec<Vec<Vec<f32>>> = chunks.par_iter().map(run).collect::<Result<_>>()?;
        let mut out = vec![Vec::new(); batch.len()];
        for (range, vectors) in chunks.iter().zip(results) {
            for (&i, v) in order[range.clone()].iter().zip(vectors) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}

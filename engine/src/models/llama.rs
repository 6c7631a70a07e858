//! Llama-family decoder (Llama, SmolLM, Mistral, Qwen2/3) over the paged KV cache.
//!
//! Pre-norm transformer: RMSNorm → attention (RoPE, grouped KV heads, optional Q/K/V biases
//! and per-head Q/K norms) → residual, RMSNorm → SwiGLU feed-forward → residual; final RMSNorm
//! and the LM head (tied to the token embeddings when the file has no `output.weight`).
//!
//! Weights stay in the memory-mapped GGUF in their stored type; the kernels dequantise on the
//! fly. In [`ActivationMode::Q8`] (the default) steps of up to 16 tokens (`Q8_MAX_TOKENS`)
//! quantise the activations to 8-bit blocks and use integer dot products against the 4- and
//! 8-bit weights; larger steps, and every step in [`ActivationMode::F32`], use f32
//! activations.
//!
//! A step stacks the tokens of every chunk in the batch into one activation matrix, so the
//! projections of a batch of decode tokens run as one GEMM; attention runs per sequence over
//! its block table.
//!
//! RoPE layout: llama.cpp's converter permutes Llama Q/K rows so that the "normal" rotation
//! (adjacent pairs) applies; Qwen-style architectures are stored unpermuted and use the NeoX
//! rotation (pairs `i`, `i + d/2`).

mod attention;
mod gguf;
mod gpu;
mod hf;

pub use gpu::GpuLlama;
pub use hf::{read_hf_config, HfDecoderConfig, HF_DECODER_ARCHITECTURES};

use std::sync::{Arc, Mutex};

use kernels::gpu::{Gpu, GpuDType};
use kernels::{ops, DType, MatmulJob, QMatrix};
use memmap2::Mmap;

use crate::device::DTypeRequest;
use crate::error::{EngineError, Result};
use crate::model::{
    host_kv_blocks, ActivationMode, CausalLm, DecoderInfo, KvBudget, KvDtype, PagedKvCache,
    SeqChunk,
};

use attention::{AttnShape, ChunkSpan};

/// Hyper-parameters read from the GGUF metadata.
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    pub architecture: String,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub eps: f32,
    pub rope_base: f32,
    pub rope_dim: usize,
    pub rope_neox: bool,
    /// Position scale for linear RoPE scaling (1 / factor).
    pub rope_freq_scale: f32,
    /// YaRN's attention factor: RoPE's cos and sin are scaled by it, so attention scores are
    /// scaled by its square (1 for every other RoPE).
    pub rope_attn_factor: f32,
    pub max_position: usize,
    /// M-RoPE (Qwen2-VL): how many of the `rope_dim / 2` frequencies turn with the temporal,
    /// row and column position. `None`: plain RoPE.
    pub mrope_section: Option<[usize; 3]>,
}

/// A weight matrix inside the memory map.
#[derive(Debug, Clone, Copy)]
struct Weight {
    /// Which memory map holds it (GGUF: the one file; safetensors: the shard).
    file: usize,
    dtype: DType,
    rows: usize,
    cols: usize,
    start: usize,
    len: usize,
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: Weight,
    wk: Weight,
    wv: Weight,
    wo: Weight,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    w_gate: Weight,
    w_up: Weight,
    w_down: Weight,
}

/// What a step mutates: the KV cache and the step buffers (kept between steps so decode does
/// not allocate per layer).
#[derive(Default)]
struct StepState {
    kv: Option<PagedKvCache>,
    scratch: Scratch,
}

#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// A loaded Llama-family decoder.
pub struct LlamaModel {
    info: DecoderInfo,
    cfg: LlamaConfig,
    maps: Vec<Arc<Mmap>>,
    token_embd: Weight,
    output: Weight,
    output_norm: Vec<f32>,
    rope_factors: Option<Vec<f32>>,
    layers: Vec<Layer>,
    activation_mode: ActivationMode,
    state: Mutex<StepState>,
}

/// In [`ActivationMode::Q8`], steps of at most this many tokens use the integer kernels; larger
/// ones (prefill) keep the f32 GEMM path, which is faster there.
const Q8_MAX_TOKENS: usize = 16;

impl std::fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaModel")
            .field("cfg", &self.cfg)
            .finish()
    }
}

fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(e.to_string())
}

/// Where a loader finds a layer's tensors: the parts of a layer and their names in GGUF
/// files and in HF checkpoints.
#[derive(Debug, Clone, Copy)]
enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    FfnNorm,
    Gate,
    Up,
    Down,
}

impl Part {
    fn gguf(self) -> &'static str {
        match self {
            Part::AttnNorm => "attn_norm.weight",
            Part::Q => "attn_q.weight",
            Part::K => "attn_k.weight",
            Part::V => "attn_v.weight",
            Part::O => "attn_output.weight",
            Part::QBias => "attn_q.bias",
            Part::KBias => "attn_k.bias",
            Part::VBias => "attn_v.bias",
            Part::QNorm => "attn_q_norm.weight",
            Part::KNorm => "attn_k_norm.weight",
            Part::FfnNorm => "ffn_norm.weight",
            Part::Gate => "ffn_gate.weight",
            Part::Up => "ffn_up.weight",
            Part::Down => "ffn_down.weight",
        }
    }

    fn hf(self) -> &'static str {
        match self {
            Part::AttnNorm => "input_layernorm.weight",
            Part::Q => "self_attn.q_proj.weight",
            Part::K => "self_attn.k_proj.weight",
            Part::V => "self_attn.v_proj.weight",
            Part::O => "self_attn.o_proj.weight",
            Part::QBias => "self_attn.q_proj.bias",
            Part::KBias => "self_attn.k_proj.bias",
            Part::VBias => "self_attn.v_proj.bias",
            Part::QNorm => "self_attn.q_norm.weight",
            Part::KNorm => "self_attn.k_norm.weight",
            Part::FfnNorm => "post_attention_layernorm.weight",
            Part::Gate => "mlp.gate_proj.weight",
            Part::Up => "mlp.up_proj.weight",
            Part::Down => "mlp.down_proj.weight",
        }
    }
}

/// What the layer builder needs from a checkpoint format.
trait WeightSource {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight>;
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>>;
    fn optional_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>>;
}

/// One decoder layer, its tensors named by `name`.
fn load_layer(
    l: &impl WeightSource,
    cfg: &LlamaConfig,
    name: impl Fn(Part) -> String,
) -> Result<Layer> {
    let (h, hd) = (cfg.hidden, cfg.head_dim);
    let (q_dim, kv_dim) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
    Ok(Layer {
        attn_norm: l.vector(&name(Part::AttnNorm), h)?,
        wq: l.matrix(&name(Part::Q), q_dim, h)?,
        wk: l.matrix(&name(Part::K), kv_dim, h)?,
        wv: l.matrix(&name(Part::V), kv_dim, h)?,
        wo: l.matrix(&name(Part::O), h, q_dim)?,
        bq: l.optional_vector(&name(Part::QBias), q_dim)?,
        bk: l.optional_vector(&name(Part::KBias), kv_dim)?,
        bv: l.optional_vector(&name(Part::VBias), kv_dim)?,
        q_norm: l.optional_vector(&name(Part::QNorm), hd)?,
        k_norm: l.optional_vector(&name(Part::KNorm), hd)?,
        ffn_norm: l.vector(&name(Part::FfnNorm), h)?,
        w_gate: l.matrix(&name(Part::Gate), cfg.ffn, h)?,
        w_up: l.matrix(&name(Part::Up), cfg.ffn, h)?,
        w_down: l.matrix(&name(Part::Down), h, cfg.ffn)?,
    })
}

impl LlamaModel {
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The one float type every matrix is stored in, if there is one (`None` for quantised
    /// or mixed checkpoints): `--dtype auto` follows it on a GPU.
    fn stored_dtype(&self) -> Option<GpuDType> {
        let layer_weights = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        let mut types = std::iter::once(&self.token_embd)
            .chain(std::iter::once(&self.output))
            .chain(layer_weights)
            .map(|w| w.dtype);
        let first = types.next()?;
        if types.any(|t| t != first) {
            return None;
        }
        match first {
            DType::F32 => Some(GpuDType::F32),
            DType::F16 => Some(GpuDType::F16),
            DType::BF16 => Some(GpuDType::BF16),
            _ => None,
        }
    }

    /// `matmul_multi` on the path the activation mode picks for a step of `m` tokens.
    fn matmul_multi(
        &self,
        x: &[f32],
        m: usize,
        jobs: &mut [MatmulJob<'_, '_>],
        accumulate: bool,
    ) -> Result<()> {
        if self.activation_mode == ActivationMode::Q8 && m <= Q8_MAX_TOKENS {
            kernels::matmul_multi_q8(x, m, jobs, accumulate)
        } else {
            kernels::matmul_multi(x, m, jobs, accumulate)
        }
        .map_err(internal)
    }

    fn matmul(
        &self,
        x: &[f32],
        m: usize,
        w: &Weight,
        out: &mut [f32],
        accumulate: bool,
    ) -> Result<()> {
        let w = self.qm(w)?;
        self.matmul_multi(x, m, &mut [MatmulJob { w, out }], accumulate)
    }

    fn qm(&self, w: &Weight) -> Result<QMatrix<'_>> {
        QMatrix::new(
            w.dtype,
            w.rows,
            w.cols,
            &self.maps[w.file][w.start..w.start + w.len],
        )
        .map_err(internal)
    }

    fn validate(&self, batch: &[SeqChunk<'_>], kv: &PagedKvCache) -> Result<()> {
        if kv.n_layers != self.cfg.n_layers
            || kv.n_kv_heads != self.cfg.n_kv_heads
            || kv.head_dim != self.cfg.head_dim
        {
            return Err(EngineError::Internal(format!(
                "KV cache shape ({} layers, {} KV heads, head dim {}) does not match the model",
                kv.n_layers, kv.n_kv_heads, kv.head_dim
            )));
        }
        let per_layer = kv.num_blocks * kv.block_size * kv.token_stride();
        if kv.block_size == 0 || kv.k.iter().chain(&kv.v).any(|b| b.len() != per_layer) {
            return Err(EngineError::Internal(
                "KV cache buffers have the wrong size".into(),
            ));
        }
        validate_chunks(&self.cfg, batch, kv.block_size, kv.num_blocks)
    }

    /// One step; `all_rows[i]` (when present) asks for chunk `i`'s logits at every token,
    /// as [`CausalLm::forward_rows`] returns them.
    fn run(
        &self,
        batch: &[SeqChunk<'_>],
        all_rows: &[bool],
        kv: &mut PagedKvCache,
        s: &mut Scratch,
    ) -> Result<Vec<Option<Vec<f32>>>> {
        let cfg = &self.cfg;
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let q_dim = cfg.n_heads * hd;
        let kv_dim = cfg.n_kv_heads * hd;
        let half = cfg.rope_dim / 2;
        let t_total: usize = batch.iter().map(|c| c.tokens.len()).sum();

        let mut spans = Vec::with_capacity(batch.len());
        let mut row = 0;
        for c in batch {
            spans.push(ChunkSpan {
                row,
                len: c.tokens.len(),
                start_pos: c.start_pos,
                block_table: c.block_table,
            });
            row += c.tokens.len();
        }

        s.x.resize(t_total * h, 0.0);
        s.h.resize(t_total * h, 0.0);
        s.q.resize(t_total * q_dim, 0.0);
        s.k.resize(t_total * kv_dim, 0.0);
        s.v.resize(t_total * kv_dim, 0.0);
        s.attn.resize(t_total * q_dim, 0.0);
        s.gate.resize(t_total * cfg.ffn, 0.0);
        s.up.resize(t_total * cfg.ffn, 0.0);
        s.cos.resize(t_total * half, 0.0);
        s.sin.resize(t_total * half, 0.0);

        // Embeddings (only the looked-up rows are dequantised; media rows are copied from the
        // encoder's output) and rotary angles.
        let embd = self.qm(&self.token_embd)?;
        let mut mrope = MropeScratch::default();
        for (c, span) in batch.iter().zip(&spans) {
            let mut media_rows = c
                .media
                .map(|m| m.rows.iter().zip(m.embeds.chunks_exact(h)))
                .into_iter()
                .flatten()
                .peekable();
            for (i, &tok) in c.tokens.iter().enumerate() {
                let t = span.row + i;
                let x = &mut s.x[t * h..(t + 1) * h];
                match media_rows.next_if(|(r, _)| **r as usize == i) {
                    Some((_, e)) => x.copy_from_slice(e),
                    None => embd.dequantize_row_into(tok as usize, x),
                }
                let (cos, sin) = (
                    &mut s.cos[t * half..(t + 1) * half],
                    &mut s.sin[t * half..(t + 1) * half],
                );
                match (cfg.mrope_section, c.media) {
                    (Some(sections), Some(m)) => {
                        let pos = match m.positions {
                            Some(p) => p[i].map(|v| v as i64),
                            None => [(c.start_pos + i) as i64 + m.position_delta; 3],
                        };
                        mrope.angles(cfg, self.rope_factors.as_deref(), sections, pos, cos, sin);
                    }
                    _ => ops::rope_angles(
                        c.start_pos + i,
                        cfg.rope_base,
                        cfg.rope_dim,
                        cfg.rope_freq_scale,
                        self.rope_factors.as_deref(),
                        cos,
                        sin,
                    ),
                }
            }
        }

        let shape = AttnShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: hd,
            block_size: kv.block_size,
            scale: cfg.rope_attn_factor * cfg.rope_attn_factor / (hd as f32).sqrt(),
        };
        for (li, layer) in self.layers.iter().enumerate() {
            for t in 0..t_total {
                ops::rmsnorm(
                    &s.x[t * h..(t + 1) * h],
                    &layer.attn_norm,
                    cfg.eps,
                    &mut s.h[t * h..(t + 1) * h],
                );
            }
            self.matmul_multi(
                &s.h,
                t_total,
                &mut [
                    MatmulJob {
                        w: self.qm(&layer.wq)?,
                        out: &mut s.q,
                    },
                    MatmulJob {
                        w: self.qm(&layer.wk)?,
                        out: &mut s.k,
                    },
                    MatmulJob {
                        w: self.qm(&layer.wv)?,
                        out: &mut s.v,
                    },
                ],
                false,
            )?;
            for t in 0..t_total {
                let q = &mut s.q[t * q_dim..(t + 1) * q_dim];
                let k = &mut s.k[t * kv_dim..(t + 1) * kv_dim];
                let v = &mut s.v[t * kv_dim..(t + 1) * kv_dim];
                if let Some(b) = &layer.bq {
                    ops::add_assign(q, b);
                }
                if let Some(b) = &layer.bk {
                    ops::add_assign(k, b);
                }
                if let Some(b) = &layer.bv {
                    ops::add_assign(v, b);
                }
                if let Some(w) = &layer.q_norm {
                    head_norm(q, w, hd, cfg.eps);
                }
                if let Some(w) = &layer.k_norm {
                    head_norm(k, w, hd, cfg.eps);
                }
                let cos = &s.cos[t * half..(t + 1) * half];
                let sin = &s.sin[t * half..(t + 1) * half];
                ops::rope(q, cfg.n_heads, hd, cfg.rope_dim, cos, sin, cfg.rope_neox);
                ops::rope(k, cfg.n_kv_heads, hd, cfg.rope_dim, cos, sin, cfg.rope_neox);
            }
            // Store this step's keys and values, then attend over the cache.
            for span in &spans {
                for i in 0..span.len {
                    let t = span.row + i;
                    let off = kv.offset(span.block_table, span.start_pos + i);
                    kv.k[li].write(off, &s.k[t * kv_dim..(t + 1) * kv_dim]);
                    kv.v[li].write(off, &s.v[t * kv_dim..(t + 1) * kv_dim]);
                }
            }
            attention::attend(&shape, &spans, &s.q, &kv.k[li], &kv.v[li], &mut s.attn);
            self.matmul(&s.attn, t_total, &layer.wo, &mut s.x, true)?;

            for t in 0..t_total {
                ops::rmsnorm(
                    &s.x[t * h..(t + 1) * h],
                    &layer.ffn_norm,
                    cfg.eps,
                    &mut s.h[t * h..(t + 1) * h],
                );
            }
            self.matmul_multi(
                &s.h,
                t_total,
                &mut [
                    MatmulJob {
                        w: self.qm(&layer.w_gate)?,
                        out: &mut s.gate,
                    },
                    MatmulJob {
                        w: self.qm(&layer.w_up)?,
                        out: &mut s.up,
                    },
                ],
                false,
            )?;
            ops::silu_mul(&mut s.gate, &s.up);
            self.matmul(&s.gate, t_total, &layer.w_down, &mut s.x, true)?;
        }

        // Final norm and LM head for the rows whose logits are wanted: each sampling chunk's
        // last row, then the other rows of the chunks that want all of theirs (prompt
        // logprobs). The sampling rows go through the head on their own, as in a step without
        // prompt logprobs: the quantised path depends on the row count, and asking for prompt
        // logprobs must not change what is sampled.
        let every = |ci: usize| all_rows.get(ci).copied().unwrap_or(false);
        let sampling: Vec<usize> = (0..batch.len())
            .filter(|&ci| batch[ci].want_logits)
            .collect();
        let extra: Vec<(usize, std::ops::Range<usize>)> = (0..batch.len())
            .filter(|&ci| every(ci))
            .map(|ci| {
                let end = spans[ci].row + spans[ci].len - usize::from(batch[ci].want_logits);
                (ci, spans[ci].row..end)
            })
            .collect();
        let last_rows: Vec<usize> = sampling
            .iter()
            .map(|&ci| spans[ci].row + spans[ci].len - 1)
            .collect();
        let sampled = self.lm_head(s, &last_rows)?;
        let extra_rows: Vec<usize> = extra.iter().flat_map(|(_, r)| r.clone()).collect();
        let mut rows = self.lm_head(s, &extra_rows)?;
        let vocab = cfg.vocab;
        let mut results: Vec<Option<Vec<f32>>> = vec![None; batch.len()];
        if let ([ci], []) = (&sampling[..], &extra[..]) {
            results[*ci] = Some(sampled);
            return Ok(results);
        }
        let mut at = 0;
        for (ci, r) in extra {
            let mut mine = if at == 0 && r.len() * vocab == rows.len() {
                std::mem::take(&mut rows)
            } else {
                rows[at * vocab..(at + r.len()) * vocab].to_vec()
            };
            at += r.len();
            if let Ok(j) = sampling.binary_search(&ci) {
                mine.extend_from_slice(&sampled[j * vocab..(j + 1) * vocab]);
            }
            results[ci] = Some(mine);
        }
        for (j, &ci) in sampling.iter().enumerate() {
            if results[ci].is_none() {
                results[ci] = Some(sampled[j * vocab..(j + 1) * vocab].to_vec());
            }
        }
        Ok(results)
    }

    /// The final norm and the LM head over rows `rows` of the step's hidden states: one
    /// logits row each, in that order.
    fn lm_head(&self, s: &Scratch, rows: &[usize]) -> Result<Vec<f32>> {
        let (h, n) = (self.cfg.hidden, rows.len());
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut normed = vec![0f32; n * h];
        for (j, &t) in rows.iter().enumerate() {
            ops::rmsnorm(
                &s.x[t * h..(t + 1) * h],
                &self.output_norm,
                self.cfg.eps,
                &mut normed[j * h..(j + 1) * h],
            );
        }
        let mut logits = vec![0f32; n * self.cfg.vocab];
        // The LM head sees only the logit rows: a prefill step's head is decode-sized.
        self.matmul(&normed, n, &self.output, &mut logits, false)?;
        Ok(logits)
    }
}

/// Checks a step's chunks against the model and a cache of `num_blocks` blocks of
/// `block_size` tokens: token ids, positions, media rows and block tables.
fn validate_chunks(
    cfg: &LlamaConfig,
    batch: &[SeqChunk<'_>],
    block_size: usize,
    num_blocks: usize,
) -> Result<()> {
    for (i, c) in batch.iter().enumerate() {
        if c.tokens.is_empty() {
            return Err(EngineError::Internal(format!(
                "batch chunk {i} has no tokens"
            )));
        }
        if let Some(m) = &c.media {
            let rows_ok = m.rows.windows(2).all(|w| w[0] < w[1])
                && m.rows.last().is_none_or(|&r| (r as usize) < c.tokens.len());
            if !rows_ok || m.embeds.len() != m.rows.len() * cfg.hidden {
                return Err(EngineError::Internal(format!(
                    "batch chunk {i}: {} media rows with {} values do not fit its {} tokens of width {}",
                    m.rows.len(),
                    m.embeds.len(),
                    c.tokens.len(),
                    cfg.hidden
                )));
            }
            if m.positions.is_some_and(|p| p.len() != c.tokens.len()) {
                return Err(EngineError::Internal(format!(
                    "batch chunk {i}: M-RoPE positions do not cover its {} tokens",
                    c.tokens.len()
                )));
            }
        }
        if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
            return Err(EngineError::invalid(
                format!(
                    "token id {t} is out of range for a vocabulary of {} tokens",
                    cfg.vocab
                ),
                Some("prompt"),
            ));
        }
        let end = c.start_pos + c.tokens.len();
        if end > cfg.max_position {
            return Err(EngineError::invalid(
                format!(
                    "sequence length {end} exceeds the model's maximum of {} positions",
                    cfg.max_position
                ),
                None,
            ));
        }
        let needed = end.div_ceil(block_size);
        if c.block_table.len() < needed {
            return Err(EngineError::Internal(format!(
                "block table of chunk {i} has {} blocks, {needed} needed for {end} positions",
                c.block_table.len()
            )));
        }
        if let Some(b) = c.block_table[..needed]
            .iter()
            .find(|&&b| b as usize >= num_blocks)
        {
            return Err(EngineError::Internal(format!(
                "block id {b} is outside the cache's {} blocks",
                num_blocks
            )));
        }
    }
    Ok(())
}

/// RMSNorm applied to each head of `x` separately (Qwen3 Q/K norms).
fn head_norm(x: &mut [f32], w: &[f32], hd: usize, eps: f32) {
    let mut tmp = vec![0f32; hd];
    for head in x.chunks_exact_mut(hd) {
        ops::rmsnorm(head, w, eps, &mut tmp);
        head.copy_from_slice(&tmp);
    }
}

/// M-RoPE angles: each position's angles computed once, then frequency `j` takes the
/// temporal, row or column one by the section it falls in.
#[derive(Default)]
struct MropeScratch {
    cos: [Vec<f32>; 3],
    sin: [Vec<f32>; 3],
}

impl MropeScratch {
    fn angles(
        &mut self,
        cfg: &LlamaConfig,
        factors: Option<&[f32]>,
        sections: [usize; 3],
        pos: [i64; 3],
        cos: &mut [f32],
        sin: &mut [f32],
    ) {
        let half = cfg.rope_dim / 2;
        for ((c, sn), &p) in self.cos.iter_mut().zip(&mut self.sin).zip(&pos) {
            c.resize(half, 0.0);
            sn.resize(half, 0.0);
            ops::rope_angles(
                p.max(0) as usize,
                cfg.rope_base,
                cfg.rope_dim,
                cfg.rope_freq_scale,
                factors,
                c,
                sn,
            );
        }
        let mut axis = 0;
        let mut left = sections[0];
        for j in 0..half {
            while left == 0 && axis < 2 {
                axis += 1;
                left = sections[axis];
            }
            left = left.saturating_sub(1);
            cos[j] = self.cos[axis][j];
            sin[j] = self.sin[axis][j];
        }
    }
}

impl CausalLm for LlamaModel {
    fn info(&self) -> &DecoderInfo {
        &self.info
    }

    fn activation_mode(&self) -> ActivationMode {
        self.activation_mode
    }

    fn set_activation_mode(&mut self, mode: ActivationMode) {
        self.activation_mode = mode;
    }

    fn to_gpu(&self, gpu: &Gpu, dtype: DTypeRequest) -> Result<Box<dyn CausalLm>> {
        let stored = self.stored_dtype();
        let mut m = GpuLlama::from_host(self, gpu.clone(), dtype.resolve(stored))?;
        m.set_activation_mode(self.activation_mode);
        Ok(Box::new(m))
    }

    fn allocate_kv(&mut self, block_size: usize, budget: &KvBudget) -> Result<usize> {
        if block_size == 0 {
            return Err(EngineError::invalid(
                "block_size must be at least 1",
                Some("block_size"),
            ));
        }
        let blocks = host_kv_blocks(block_size, budget);
        let dtype = match budget.dtype {
            KvDtype::Auto => KvDtype::Float32,
            d => d,
        };
        let bytes = blocks * block_size * PagedKvCache::bytes_per_token(&self.info, dtype);
        // The pages are zero-filled by the OS as they are first written, so the process grows
        // towards this size as sequences fill the cache: say so once, with the figure.
        tracing::info!(
            blocks,
            block_size,
            tokens = blocks * block_size,
            gib = %format!("{:.2}", bytes as f64 / (1u64 << 30) as f64),
            dtype = %dtype,
            "KV cache in host memory (committed as it fills; --kv-cache-tokens sizes it, --kv-cache-dtype sets its type)"
        );
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        state.kv = Some(PagedKvCache::with_dtype(
            &self.info, block_size, blocks, dtype,
        ));
        Ok(blocks)
    }

    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        self.forward_rows(batch, &[])
    }

    fn forward_rows(
        &mut self,
        batch: &[SeqChunk<'_>],
        all_rows: &[bool],
    ) -> Result<Vec<Option<Vec<f32>>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // The scratch holds only buffers that every step overwrites, and a failed step leaves
        // only cache slots that no sequence counts as computed: a poisoned lock is safe to
        // reuse.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let StepState { kv, scratch } = &mut *state;
        let kv = kv
            .as_mut()
            .ok_or_else(|| EngineError::Internal("the KV cache is not allocated".into()))?;
        self.validate(batch, kv)?;
        self.run(batch, all_rows, kv, scratch)
    }
}

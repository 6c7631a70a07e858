//! Llama-family decoder (Llama, SmolLM, Mistral, Qwen2/3, Phi-3, Gemma 2/3) over the paged KV
//! cache.
//!
//! Pre-norm transformer: RMSNorm → attention (RoPE, grouped KV heads, optional Q/K/V biases
//! and per-head Q/K norms) → residual, RMSNorm → SwiGLU feed-forward → residual; final RMSNorm
//! and the LM head (tied to the token embeddings when the file has no `output.weight`).
//! Families that differ (Gemma's scaled embeddings, norms after the attention and the MLP,
//! GeGLU, soft-capped scores; sliding-window layers) say so in [`FamilyTraits`] and
//! [`LlamaConfig::windows`], and the one forward pass honours each.
//!
//! Weights stay in the memory-mapped GGUF in their stored type; the kernels dequantise on the
//! fly. Where the CPU's kernels read quantised matrices faster interleaved (AVX-512 VNNI: every
//! quantised type; the other SIMD levels: the 32-weight types), the q8 mode copies them once
//! into that layout, at the same size (`interleave`). In [`ActivationMode::Q8`] (the default)
//! every step quantises the activations to 8-bit
//! blocks and uses integer dot products against quantised weights (float weights take f32
//! activations); [`ActivationMode::F32`] keeps f32 activations throughout. The path depends on
//! the mode and the weights only, never on the step's size: a token's numbers are the same
//! whatever else is in its batch.
//!
//! A step stacks the tokens of every chunk in the batch into one activation matrix, so the
//! projections of a batch of decode tokens run as one GEMM; attention runs per sequence over
//! its block table.
//!
//! RoPE layout: llama.cpp's converter permutes Llama Q/K rows so that the "normal" rotation
//! (adjacent pairs) applies; Qwen-style architectures are stored unpermuted and use the NeoX
//! rotation (pairs `i`, `i + d/2`).

mod attention;
mod embed;
mod forward;
mod gguf;
mod gpu;
mod hf;
mod hf_config;
mod interleave;
mod rope_scaling;
mod rules;
mod weights;

pub use embed::DecoderEmbedder;
pub use gpu::GpuLlama;
pub use hf::LmHead;
pub use hf_config::{activation, cfg_error, read_hf_config, text_section, HfDecoderConfig};
pub use rope_scaling::ContextRope;
pub use rules::{
    every_layer_slides, llama_gguf_layers, llama_traits, DecoderRules, GgufLayers, GgufShape,
    LLAMA_RULES,
};

use std::sync::{Arc, Mutex};

use kernels::gpu::{Gpu, GpuDType, PackedWeights};
use kernels::{DType, MatmulJob, QMatrix};
use memmap2::Mmap;

use crate::device::DTypeRequest;
use crate::error::{EngineError, Result};
use crate::model::{
    host_kv_blocks, ActivationMode, CausalLm, DecoderInfo, KvBudget, KvDtype, PagedKvCache,
    SeqChunk, StepShape, WeightSummary,
};

use forward::validate_chunks;
use weights::{load_layer, Layer, Weight, WeightSource};

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
    /// How the family's layers differ from Llama's.
    pub traits: FamilyTraits,
    /// Per layer, the sliding window it attends within: a query at position `p` sees
    /// positions `p - w + 1 ..= p`. Empty, or `None` for a layer: every earlier position.
    pub windows: Vec<Option<usize>>,
    /// RoPE base of the sliding-window layers where it differs from `rope_base` (Gemma 3's
    /// local layers, which take no RoPE scaling either).
    pub local_rope_base: Option<f32>,
}

impl LlamaConfig {
    /// Layer `layer`'s sliding window, if it has one.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }
}

/// The MLP's activation: `act(gate) · up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MlpActivation {
    /// SwiGLU (`silu`).
    #[default]
    Silu,
    /// GeGLU with the tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// What sets a family's layers apart from Llama's; the default is Llama.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FamilyTraits {
    /// The token embeddings are multiplied by this (Gemma: √hidden).
    pub embed_scale: Option<f32>,
    /// The checkpoint's norm weights are `w - 1` (HF Gemma); the loader adds the 1.
    pub norm_offset: bool,
    /// The attention's and the MLP's outputs are normed before each residual add (Gemma 2/3).
    pub sandwich_norms: bool,
    pub activation: MlpActivation,
    /// Attention scores are `c · tanh(s / c)` before the softmax (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits are `c · tanh(l / c)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// The attention scale when it is not `1 / √head_dim` (Gemma's `query_pre_attn_scalar`).
    pub attn_scale: Option<f32>,
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
    /// The sliding-window layers' angles where their RoPE differs (`local_rope_base`).
    cos_local: Vec<f32>,
    sin_local: Vec<f32>,
}

/// A loaded Llama-family decoder.
pub struct LlamaModel {
    info: DecoderInfo,
    cfg: LlamaConfig,
    maps: Vec<Arc<Mmap>>,
    /// The copy of the matrices in the kernels' interleaved layout, while the q8 activation
    /// path uses it.
    interleaved: Option<interleave::Interleaved>,
    /// `maps[0]` is a file's own pages (a copied range may leave the resident set).
    file_pages: bool,
    token_embd: Weight,
    output: Weight,
    output_norm: Vec<f32>,
    rope_factors: Option<Vec<f32>>,
    /// RoPE chosen by the served context (see [`CausalLm::fit_context`]).
    context_rope: Option<ContextRope>,
    layers: Vec<Layer>,
    activation_mode: ActivationMode,
    state: Mutex<StepState>,
}

impl std::fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaModel")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// What [`CausalLm::fit_context`] chose, for the log.
fn rope_kind(rope: &ContextRope, max_len: usize) -> &'static str {
    match rope {
        ContextRope::LongRope { original, .. } if max_len > *original => "longrope: long factors",
        ContextRope::LongRope { .. } => "longrope: short factors",
        ContextRope::Dynamic { original, .. } if max_len > *original => "dynamic: scaled base",
        ContextRope::Dynamic { .. } => "dynamic: unscaled",
    }
}

fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(e.to_string())
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

    /// `matmul_multi` on the path the activation mode picks (the same for every step size).
    fn matmul_multi(
        &self,
        x: &[f32],
        m: usize,
        jobs: &mut [MatmulJob<'_, '_>],
        accumulate: bool,
    ) -> Result<()> {
        if self.activation_mode == ActivationMode::Q8 {
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
        let bytes = &self.maps[w.file][w.start..w.start + w.len];
        if w.interleaved {
            QMatrix::interleaved(w.dtype, w.rows, w.cols, bytes)
        } else {
            QMatrix::new(w.dtype, w.rows, w.cols, bytes)
        }
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
}

impl CausalLm for LlamaModel {
    fn info(&self) -> &DecoderInfo {
        &self.info
    }

    fn step_host_bytes(&self, s: &StepShape) -> u64 {
        let c = &self.cfg;
        let (q, kv) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        // The scratch's rows: x and h, q, k, v, the attention output, gate and up.
        let per_row = 2 * c.hidden + 2 * q + 2 * kv + 2 * c.ffn;
        // The activations quantised for the integer kernels (at most 2 bytes a value, i.e.
        // half a float), or their block sums on the f32 path.
        let per_row = per_row + c.hidden.max(c.ffn).div_ceil(2);
        // An attention task scores one query against the whole context and sums the values
        // into a head-sized row; one task per thread at a time.
        let per_task = s.max_len + 2 * c.head_dim;
        let floats = (s.rows as u64) * per_row as u64
            + (s.logit_rows as u64) * 3 * c.vocab as u64
            + (s.threads as u64) * per_task as u64;
        floats.saturating_mul(4)
    }

    fn weight_summary(&self) -> WeightSummary {
        let mut s = WeightSummary::default();
        s.add(self.token_embd.dtype, self.token_embd.len as u64);
        if !self.output.same_bytes(&self.token_embd) {
            s.add(self.output.dtype, self.output.len as u64);
        }
        weights::count_f32(&mut s, &self.output_norm);
        if let Some(f) = &self.rope_factors {
            weights::count_f32(&mut s, f);
        }
        for l in &self.layers {
            l.count(&mut s);
        }
        let interleaved = self.interleaved.as_ref().map_or(0, |i| i.bytes as u64);
        s.set_interleaved(interleaved);
        if self.file_pages {
            s.set_released(interleaved);
        }
        s
    }

    fn activation_mode(&self) -> ActivationMode {
        self.activation_mode
    }

    fn set_activation_mode(&mut self, mode: ActivationMode) {
        self.activation_mode = mode;
        match mode {
            ActivationMode::F32 => self.deinterleave(),
            ActivationMode::Q8 => {
                if let Err(e) = self.interleave() {
                    // The matrices stay as the file stores them: slower, the same results.
                    tracing::warn!(error = %e, "matrices not interleaved");
                }
            }
        }
    }

    fn fit_context(&mut self, max_len: usize) {
        let Some(rope) = &self.context_rope else {
            return;
        };
        let (base, factors) = rope.for_context(max_len);
        if let Some(base) = base {
            self.cfg.rope_base = base;
        }
        if let ContextRope::LongRope { .. } = rope {
            self.rope_factors = factors;
        }
        tracing::info!(
            max_len,
            rope = ?rope_kind(rope, max_len),
            rope_base = self.cfg.rope_base,
            "RoPE fitted to the served context"
        );
    }

    fn lora_targets(&self) -> Option<crate::lora::LoraTargets> {
        let c = &self.cfg;
        Some(crate::lora::LoraTargets {
            n_layers: c.n_layers,
            hidden: c.hidden,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            ffn: c.ffn,
            // Checkpoints that rotate adjacent pairs are GGUF Llamas, whose Q/K rows the
            // converter permuted.
            qk_permuted: !c.rope_neox,
        })
    }

    fn to_gpu(&self, gpu: &Gpu, dtype: DTypeRequest) -> Result<Box<dyn CausalLm>> {
        let stored = self.stored_dtype();
        let mut m = GpuLlama::from_host(self, gpu.clone(), dtype.resolve(stored))?;
        m.set_activation_mode(self.activation_mode);
        Ok(Box::new(m))
    }

    fn export_gpu_weights(&self, gpu: &Gpu, dtype: DTypeRequest) -> Result<PackedWeights> {
        GpuLlama::from_host(self, gpu.clone(), dtype.resolve(self.stored_dtype()))?.export()
    }

    fn to_gpu_mapped(
        &self,
        gpu: &Gpu,
        dtype: DTypeRequest,
        weights: &PackedWeights,
    ) -> Result<Box<dyn CausalLm>> {
        let dtype = dtype.resolve(self.stored_dtype());
        let mut m = GpuLlama::from_packed(self, gpu.clone(), dtype, weights)?;
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

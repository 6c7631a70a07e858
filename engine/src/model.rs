//! The contract between model code and the serving machinery.
//!
//! A decoder ([`CausalLm`]) owns its weights and its paged KV cache, both on the device that
//! runs it (host memory for the CPU models, device memory for the CUDA one). The scheduler,
//! block manager and prefix cache stay on the host and know nothing of the device: they decide
//! which sequences run in a step and which cache blocks each one owns (its block table); the
//! model writes the keys and values of the new tokens into those blocks and attends over
//! everything the table covers. Sampling goes through the model too ([`CausalLm::step`]), so a
//! device model can sample where its logits are.

use kernels::gpu::{Gpu, PackedWeights};
use rand::rngs::StdRng;

use crate::device::DTypeRequest;
use crate::error::{EngineError, Result};
use crate::sampling::{Sampled, SequenceSampler};

mod encoder;

pub use crate::weight_summary::{human_bytes, WeightSummary};
pub use encoder::{
    l2_normalize, ClassActivation, ClassifierInfo, EmbeddingModel, EncoderHead, EncoderInfo,
    EncoderInput, LoadedEncoder, Pooling,
};

/// Shape facts the scheduler and the KV cache need about a decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderInfo {
    pub vocab_size: usize,
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Longest context the model supports (from the checkpoint metadata).
    pub max_position: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// What the KV cache may take: the operator's fixed size, or a share of device memory.
#[derive(Debug, Clone, PartialEq)]
pub struct KvBudget {
    /// Tokens the cache holds (all sequences together) when the operator fixed it
    /// (`--kv-cache-tokens`); `None` lets the device decide.
    pub tokens: Option<usize>,
    /// Fraction of device memory for weights, activations and KV (`--gpu-memory-utilization`);
    /// the GPU's KV block count follows from it when `tokens` is `None`.
    pub gpu_memory_utilization: f32,
    /// The largest step, in tokens (`--max-num-batched-tokens`): activation buffers are sized
    /// for it before the KV cache takes the rest.
    pub max_batched_tokens: usize,
    /// The most sequences in one step (`--max-num-active-seqs`).
    pub max_seqs: usize,
    /// The element type of a host (CPU) cache (`--kv-cache-dtype`).
    pub dtype: KvDtype,
}

/// The element type of the KV cache (`--kv-cache-dtype`, vLLM's flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// f32 on the CPU; a GPU model's cache takes the model's type.
    #[default]
    Auto,
    Float32,
    Float16,
    Bfloat16,
}

impl KvDtype {
    pub const fn as_str(self) -> &'static str {
        match self {
            KvDtype::Auto => "auto",
            KvDtype::Float32 => "float32",
            KvDtype::Float16 => "float16",
            KvDtype::Bfloat16 => "bfloat16",
        }
    }

    /// Bytes per element in a host cache.
    pub const fn host_size(self) -> usize {
        match self {
            KvDtype::Auto | KvDtype::Float32 => 4,
            KvDtype::Float16 | KvDtype::Bfloat16 => 2,
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(KvDtype::Auto),
            "float32" | "fp32" => Ok(KvDtype::Float32),
            "float16" | "half" | "fp16" => Ok(KvDtype::Float16),
            "bfloat16" | "bf16" => Ok(KvDtype::Bfloat16),
            other if other.starts_with("fp8") => Err(format!(
                "kv cache dtype `{other}` is not supported: 8-bit caches are not built (supported: auto, float32, float16, bfloat16)"
            )),
            other => Err(format!(
                "unknown kv cache dtype `{other}` (supported: auto, float32, float16, bfloat16)"
            )),
        }
    }
}

/// One layer's K or V storage in a host cache, in the cache's element type.
#[derive(Debug)]
pub enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    Bf16(Vec<half::bf16>),
}

impl KvBuf {
    fn zeroed(dtype: KvDtype, len: usize) -> Self {
        match dtype {
            KvDtype::Auto | KvDtype::Float32 => KvBuf::F32(vec![0.0; len]),
            KvDtype::Float16 => KvBuf::F16(vec![half::f16::ZERO; len]),
            KvDtype::Bfloat16 => KvBuf::Bf16(vec![half::bf16::ZERO; len]),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(b) => b.len(),
            KvBuf::F16(b) => b.len(),
            KvBuf::Bf16(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Store `src` at `off`, rounded to the cache's type.
    pub fn write(&mut self, off: usize, src: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        let n = src.len();
        match self {
            KvBuf::F32(b) => b[off..off + n].copy_from_slice(src),
            KvBuf::F16(b) => b[off..off + n].convert_from_f32_slice(src),
            KvBuf::Bf16(b) => b[off..off + n].convert_from_f32_slice(src),
        }
    }

    /// The f32 storage (an f32 cache), for code that keeps its own data in it.
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        match self {
            KvBuf::F32(b) => Some(b),
            _ => None,
        }
    }
}

/// KV tokens of a CPU model when the operator sets none.
pub const DEFAULT_CPU_KV_TOKENS: usize = 65536;

impl KvBudget {
    /// A budget of exactly `tokens` tokens (tests, benchmarks).
    pub fn tokens(tokens: usize) -> Self {
        KvBudget {
            tokens: Some(tokens),
            gpu_memory_utilization: 0.9,
            max_batched_tokens: 2048,
            max_seqs: 256,
            dtype: KvDtype::Auto,
        }
    }
}

/// One sequence to sample in a step: which chunk of the batch it is, and its sampler.
pub struct SampleRequest<'a> {
    /// Index of the chunk in the step's batch (its `want_logits` is set).
    pub chunk: usize,
    pub sampler: &'a mut SequenceSampler,
}

/// Paged key/value storage in host memory (the CPU models' cache). For each layer, `k[layer]` and `v[layer]` hold
/// `num_blocks * block_size * n_kv_heads * head_dim` floats laid out as
/// `[block][slot in block][kv head][head_dim]`. Token at position `p` of a sequence lives in
/// block `block_table[p / block_size]`, slot `p % block_size`.
#[derive(Debug)]
pub struct PagedKvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub k: Vec<KvBuf>,
    pub v: Vec<KvBuf>,
}

impl PagedKvCache {
    /// An f32 cache.
    pub fn new(info: &DecoderInfo, block_size: usize, num_blocks: usize) -> Self {
        Self::with_dtype(info, block_size, num_blocks, KvDtype::Float32)
    }

    pub fn with_dtype(
        info: &DecoderInfo,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Self {
        let per_layer = num_blocks * block_size * info.n_kv_heads * info.head_dim;
        PagedKvCache {
            block_size,
            num_blocks,
            n_layers: info.n_layers,
            n_kv_heads: info.n_kv_heads,
            head_dim: info.head_dim,
            k: (0..info.n_layers)
                .map(|_| KvBuf::zeroed(dtype, per_layer))
                .collect(),
            v: (0..info.n_layers)
                .map(|_| KvBuf::zeroed(dtype, per_layer))
                .collect(),
        }
    }

    /// Floats per token per layer for K (or V).
    pub fn token_stride(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Offset of the token at `pos` of a sequence with this block table, within one layer's
    /// K or V buffer.
    pub fn offset(&self, block_table: &[u32], pos: usize) -> usize {
        let block = block_table[pos / self.block_size] as usize;
        (block * self.block_size + pos % self.block_size) * self.token_stride()
    }

    /// Bytes of KV storage per token (all layers, K and V) in a cache of `dtype`.
    pub fn bytes_per_token(info: &DecoderInfo, dtype: KvDtype) -> usize {
        info.n_layers * info.n_kv_heads * info.head_dim * 2 * dtype.host_size()
    }
}

/// One sequence's share of a forward step.
#[derive(Debug, Clone)]
pub struct SeqChunk<'a> {
    /// The new tokens to run: a prefill chunk or one decode token.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; the cache already holds positions `0..start_pos`.
    pub start_pos: usize,
    /// Blocks covering positions `0..start_pos + tokens.len()`.
    pub block_table: &'a [u32],
    /// Return logits for the last token of this chunk (false for non-final prefill chunks).
    pub want_logits: bool,
    /// Media embeddings and M-RoPE positions of a multimodal prompt; `None` for text.
    pub media: Option<ChunkMedia<'a>>,
    /// The LoRA adapter the sequence runs with; `None`: the base model alone. Only a model
    /// whose [`CausalLm::lora_targets`] is `Some` is given one.
    pub lora: Option<&'a crate::lora::LoraAdapter>,
}

pub use crate::api::ChunkMedia;

/// How a decoder multiplies activations by quantised weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationMode {
    /// f32 activations against weights dequantised on the fly: reproduces an f32 reference
    /// of the same weights (top-5 logprobs within 0.05 on SmolLM2).
    F32,
    /// Every step (decode and prefill alike, so a row's numbers do not depend on the step)
    /// quantises the activations to 8-bit blocks and uses integer dot products against the
    /// quantised weights, as llama.cpp does: faster, and the logprobs drift from the f32
    /// reference by up to about 0.6 (greedy tokens change only where the top two are close).
    /// The default, as in llama.cpp.
    #[default]
    Q8,
}

impl ActivationMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            ActivationMode::F32 => "f32",
            ActivationMode::Q8 => "q8",
        }
    }
}

impl std::fmt::Display for ActivationMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ActivationMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(ActivationMode::F32),
            "q8" => Ok(ActivationMode::Q8),
            other => Err(format!(
                "unknown activation precision '{other}' (expected f32 or q8)"
            )),
        }
    }
}

/// The largest step the engine runs, as [`CausalLm::step_host_bytes`] sizes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShape {
    /// Tokens computed in the step (`--max-num-batched-tokens`).
    pub rows: usize,
    /// Rows that return logits: one per active sequence, or a chunk of prompt logprobs.
    pub logit_rows: usize,
    /// The longest context attended over.
    pub max_len: usize,
    /// Threads working at once.
    pub threads: usize,
}

/// What a model without a GPU implementation answers to the GPU calls.
fn no_gpu() -> EngineError {
    EngineError::BackendUnavailable("this model has no GPU implementation".into())
}

/// A Llama-family decoder (or any causal LM) behind the serving machinery.
pub trait CausalLm: Send {
    fn info(&self) -> &DecoderInfo;

    /// The device that runs the model, as `cpu` or `cuda:N` (logs, model card, metrics).
    fn device(&self) -> String {
        "cpu".into()
    }

    /// This model on `gpu`, weights copied as the `dtype` request resolves for it. Models
    /// without a GPU implementation say so.
    fn to_gpu(&self, gpu: &Gpu, dtype: DTypeRequest) -> Result<Box<dyn CausalLm>> {
        let _ = (gpu, dtype);
        Err(no_gpu())
    }

    /// This model's weights converted for `gpu` as `dtype` would convert them, packed into one
    /// region other processes can map (what the weight cache's daemon holds on a GPU).
    fn export_gpu_weights(&self, gpu: &Gpu, dtype: DTypeRequest) -> Result<PackedWeights> {
        let _ = (gpu, dtype);
        Err(no_gpu())
    }

    /// This model on `gpu` over `weights` that [`CausalLm::export_gpu_weights`] packed, in this
    /// process or another: views of the shared memory, nothing converted or copied.
    fn to_gpu_mapped(
        &self,
        gpu: &Gpu,
        dtype: DTypeRequest,
        weights: &PackedWeights,
    ) -> Result<Box<dyn CausalLm>> {
        let _ = (gpu, dtype, weights);
        Err(no_gpu())
    }

    /// The weights this model holds where it runs, by stored type (empty where a model does
    /// not say).
    fn weight_summary(&self) -> WeightSummary {
        WeightSummary::default()
    }

    /// Allocate the paged KV cache in blocks of `block_size` tokens within `budget`, replacing
    /// any earlier one. Returns the number of blocks.
    fn allocate_kv(&mut self, block_size: usize, budget: &KvBudget) -> Result<usize>;

    /// Host bytes one step of `shape` may hold beyond the weights and the KV cache (a term of
    /// the deployment's memory bound). This default counts the logits only, for models whose
    /// activations live on a device.
    fn step_host_bytes(&self, shape: &StepShape) -> u64 {
        // Each row of logits, and the sampler's sorted (index, value) copy of it.
        (shape.logit_rows as u64).saturating_mul(self.info().vocab_size as u64 * 12)
    }

    /// The activation precision of the quantised matmuls (models without a choice run f32).
    fn activation_mode(&self) -> ActivationMode {
        ActivationMode::F32
    }

    /// Choose the activation precision; models without a choice ignore it.
    fn set_activation_mode(&mut self, _mode: ActivationMode) {}

    /// Told the longest sequence it will serve (`--max-model-len` within its own limit) before
    /// it is placed on a device: a model whose numbers depend on it (LongRoPE's long or short
    /// factors, dynamic NTK's base) fixes them here, once, for every sequence.
    fn fit_context(&mut self, _max_len: usize) {}

    /// The projections LoRA adapters fit when this model runs them (chunks may then carry an
    /// adapter); `None`: it runs none, and a deployment with `--enable-lora` refuses it.
    fn lora_targets(&self) -> Option<crate::lora::LoraTargets> {
        None
    }

    /// Run one step over a batch of sequence chunks. Writes K/V of the new tokens into the
    /// cache and returns, per chunk, the logits (length `vocab_size`) of its last token when
    /// `want_logits` is set.
    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Option<Vec<f32>>>>;

    /// Run one step and sample the next token of each request (in the order given). `rng` is
    /// the engine's generator, for requests without a seed. A request's error fails that
    /// sequence only; an `Err` of the whole call fails the step. This default samples the
    /// host logits of [`CausalLm::forward`]; a device model may sample on the device.
    fn step(
        &mut self,
        batch: &[SeqChunk<'_>],
        requests: &mut [SampleRequest<'_>],
        eos: &[u32],
        rng: &mut StdRng,
    ) -> Result<Vec<Result<Sampled>>> {
        let logits = forward_with_masks(batch, requests, |batch| self.forward(batch))?;
        Ok(sample_on_host(logits, requests, eos, rng))
    }

    /// As [`CausalLm::forward`], except that a chunk whose `all_rows` entry is set returns the
    /// logits of every one of its tokens (`tokens.len() x vocab_size`, row-major, whatever its
    /// `want_logits`): prompt logprobs. Models that cannot say so.
    fn forward_rows(
        &mut self,
        batch: &[SeqChunk<'_>],
        all_rows: &[bool],
    ) -> Result<Vec<Option<Vec<f32>>>> {
        let _ = (batch, all_rows);
        Err(EngineError::BackendUnavailable(format!(
            "prompt logprobs are not implemented for this model on {}",
            self.device()
        )))
    }

    /// As [`CausalLm::step`], also returning the rows of [`CausalLm::forward_rows`] for the
    /// chunks whose `all_rows` entry is set (`None` for the others). Requests sample from the
    /// last row of their chunk.
    #[allow(clippy::type_complexity)]
    fn step_with_rows(
        &mut self,
        batch: &[SeqChunk<'_>],
        all_rows: &[bool],
        requests: &mut [SampleRequest<'_>],
        eos: &[u32],
        rng: &mut StdRng,
    ) -> Result<(Vec<Result<Sampled>>, Vec<Option<Vec<f32>>>)> {
        let mut out =
            forward_with_masks(batch, requests, |batch| self.forward_rows(batch, all_rows))?;
        let vocab = self.info().vocab_size;
        let mut last: Vec<Option<Vec<f32>>> = vec![None; out.len()];
        let mut rows: Vec<Option<Vec<f32>>> = vec![None; out.len()];
        for (i, o) in out.iter_mut().enumerate() {
            if all_rows.get(i).copied().unwrap_or(false) {
                let all = o.take();
                if batch[i].want_logits {
                    last[i] = all
                        .as_deref()
                        .and_then(|a| a.len().checked_sub(vocab).map(|at| a[at..].to_vec()));
                }
                rows[i] = all;
            } else {
                last[i] = o.take();
            }
        }
        Ok((sample_on_host(last, requests, eos, rng), rows))
    }
}

/// Runs `forward` while the structured-output masks of the guided requests are computed on
/// another thread, so a constrained batch's step does not wait for them after the forward.
pub fn forward_with_masks<T>(
    batch: &[SeqChunk<'_>],
    requests: &mut [SampleRequest<'_>],
    forward: impl FnOnce(&[SeqChunk<'_>]) -> Result<T>,
) -> Result<T> {
    if !requests.iter().any(|r| r.sampler.is_guided()) {
        return forward(batch);
    }
    std::thread::scope(|scope| {
        let masks = scope.spawn(|| {
            for r in requests.iter_mut().filter(|r| r.sampler.is_guided()) {
                r.sampler.prepare_mask();
            }
        });
        let out = forward(batch);
        // A panic computing a mask leaves it to be computed, and reported, when sampling.
        let _ = masks.join();
        out
    })
}

/// Sample each request from its chunk's host logits (what [`CausalLm::step`] does by default).
pub fn sample_on_host(
    mut logits: Vec<Option<Vec<f32>>>,
    requests: &mut [SampleRequest<'_>],
    eos: &[u32],
    rng: &mut StdRng,
) -> Vec<Result<Sampled>> {
    requests
        .iter_mut()
        .map(|r| {
            let mut row = logits
                .get_mut(r.chunk)
                .and_then(Option::take)
                .ok_or_else(|| {
                    EngineError::Internal(format!("no logits for batch chunk {}", r.chunk))
                })?;
            r.sampler.sample(&mut row, eos, rng)
        })
        .collect()
}

/// Blocks of `block_size` tokens a host cache may take within `budget`.
pub fn host_kv_blocks(block_size: usize, budget: &KvBudget) -> usize {
    budget.tokens.unwrap_or(DEFAULT_CPU_KV_TOKENS) / block_size.max(1)
}

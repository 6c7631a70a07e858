//! The Llama-family decoder on a GPU: the same model as the CPU one (built from it, so every
//! checkpoint the CPU loads — GGUF or HF — runs here too), with weights, KV cache and
//! activations in device memory, GEMMs through cuBLAS and everything else in the kernels of
//! `kernels/cuda/`.
//!
//! One step, for T tokens (`forward.rs`): embedding gather (media rows copied in) → per layer:
//! fused residual add + RMSNorm → QKV GEMM → biases, Q/K norms and RoPE → K/V into the paged
//! cache → paged attention (every row in the tile kernel) → output GEMM → residual add +
//! RMSNorm → gate/up GEMM → SwiGLU or GeGLU → down GEMM; then the last residual add and the
//! final norm on the rows whose logits are wanted, the LM head GEMM, and sampling on the
//! device. The families' differences ride on these steps: Gemma's embedding scale in the
//! gather, its norms of the attention's and the MLP's outputs in the residual adds, sliding
//! windows and soft-capped scores in the attention kernels, Gemma 3's local RoPE base as a
//! second frequency table, and soft-capped logits after the LM head.
//!
//! The residual stream and every GEMM output stay f32; GEMM inputs, weights and the KV cache
//! are the model's GPU type (bf16 by default; f32 for exact parity runs).

mod buffers;
mod forward;
mod plan;
mod shared;
mod weights;

use rand::rngs::StdRng;

use kernels::gpu::ops::{padded_rows, rope_inv_freq};
use kernels::gpu::ops::{SampleRow, Sampler, MAX_LOGPROBS};
use kernels::gpu::{Gpu, GpuBuffer, GpuDType, GpuError, PackedWeights};

use super::{LlamaConfig, LlamaModel};
use crate::error::{EngineError, Result};
use crate::model::{
    sample_on_host, CausalLm, DecoderInfo, KvBudget, SampleRequest, SeqChunk, WeightSummary,
};
use crate::sampling::Sampled;
use buffers::{scratch_bytes, GpuKv, Scratch};
use weights::GpuWeights;

fn gpu_err(e: GpuError) -> EngineError {
    match e {
        GpuError::OutOfMemory { .. } => EngineError::Overloaded(e.to_string()),
        other => EngineError::Internal(format!("GPU: {other}")),
    }
}

/// Device memory kept free beyond what the model allocates (cuBLAS workspaces, fragmentation).
const HEADROOM: usize = 256 << 20;

/// A Llama-family decoder on a GPU.
pub struct GpuLlama {
    info: DecoderInfo,
    cfg: LlamaConfig,
    gpu: Gpu,
    dtype: GpuDType,
    weights: GpuWeights,
    inv_freq: GpuBuffer,
    /// The sliding-window layers' frequencies where their RoPE base differs (Gemma 3).
    inv_freq_local: Option<GpuBuffer>,
    kv: Option<GpuKv>,
    scratch: Option<Scratch>,
    sampler: Option<Sampler>,
}

impl std::fmt::Debug for GpuLlama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLlama")
            .field("device", &self.gpu.info().label())
            .field("dtype", &self.dtype)
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl GpuLlama {
    /// Copy `model` to `gpu` as `dtype`.
    pub fn from_host(model: &LlamaModel, gpu: Gpu, dtype: GpuDType) -> Result<Self> {
        Self::check(model, &gpu)?;
        let weights = weights::upload(&gpu, model, dtype)?;
        Self::with_weights(model, gpu, dtype, weights)
    }

    /// `model` on `gpu` over device weights another process (or this one) converted and
    /// packed ([`GpuLlama::export`]): views of the shared region, nothing copied.
    pub fn from_packed(
        model: &LlamaModel,
        gpu: Gpu,
        dtype: GpuDType,
        packed: &PackedWeights,
    ) -> Result<Self> {
        Self::check(model, &gpu)?;
        let weights = shared::unpack(model, dtype, packed)?;
        Self::with_weights(model, gpu, dtype, weights)
    }

    /// This model's device weights, packed into one region other processes can map.
    pub fn export(&self) -> Result<PackedWeights> {
        shared::pack(&self.gpu, &self.weights)
    }

    /// Whether the GPU kernels can run `model`'s shape.
    fn check(model: &LlamaModel, gpu: &Gpu) -> Result<()> {
        let cfg = &model.cfg;
        if cfg.head_dim > 256 || !cfg.head_dim.is_multiple_of(8) {
            return Err(EngineError::load(
                gpu.info().label(),
                format!(
                    "head dim {} is not supported by the GPU attention kernels (a multiple of 8, at most 256)",
                    cfg.head_dim
                ),
            ));
        }
        if let Some(what) = gpu_unsupported(cfg) {
            return Err(EngineError::load(
                gpu.info().label(),
                format!("{what} is not supported by the GPU decoder (it runs on the CPU)"),
            ));
        }
        Ok(())
    }

    fn with_weights(
        model: &LlamaModel,
        gpu: Gpu,
        dtype: GpuDType,
        weights: GpuWeights,
    ) -> Result<Self> {
        let cfg = model.cfg.clone();
        let inv_freq = rope_inv_freq(cfg.rope_base, cfg.rope_dim, model.rope_factors.as_deref());
        let inv_freq = gpu.upload(&inv_freq).map_err(gpu_err)?;
        // As the CPU decoder: no scaling and no rope factors on the local layers.
        let inv_freq_local = cfg
            .local_rope_base
            .map(|base| gpu.upload(&rope_inv_freq(base, cfg.rope_dim, None)))
            .transpose()
            .map_err(gpu_err)?;
        Ok(GpuLlama {
            info: model.info.clone(),
            cfg,
            gpu,
            dtype,
            weights,
            inv_freq,
            inv_freq_local,
            kv: None,
            scratch: None,
            sampler: None,
        })
    }

    pub fn dtype(&self) -> GpuDType {
        self.dtype
    }

    /// Make the scratch hold `rows` tokens and `logit_rows` logit rows, each rounded up to
    /// whole GEMM chunks (`ops::gemm`).
    fn ensure_scratch(&mut self, rows: usize, logit_rows: usize) -> Result<()> {
        let (rows, logit_rows) = (padded_rows(rows), padded_rows(logit_rows));
        let fits = self
            .scratch
            .as_ref()
            .is_some_and(|s| s.rows >= rows && s.logit_rows >= logit_rows);
        if !fits {
            let (old_rows, old_logits) = self
                .scratch
                .as_ref()
                .map_or((0, 0), |s| (s.rows, s.logit_rows));
            self.scratch = None;
            self.scratch = Some(Scratch::new(
                &self.gpu,
                &self.cfg,
                self.dtype,
                rows.max(old_rows),
                logit_rows.max(old_logits),
            )?);
        }
        Ok(())
    }
}

impl CausalLm for GpuLlama {
    fn info(&self) -> &DecoderInfo {
        &self.info
    }

    fn device(&self) -> String {
        self.gpu.info().label()
    }

    fn weight_summary(&self) -> WeightSummary {
        self.weights.summary(self.dtype)
    }

    fn allocate_kv(&mut self, block_size: usize, budget: &KvBudget) -> Result<usize> {
        if block_size == 0 {
            return Err(EngineError::invalid(
                "block_size must be at least 1",
                Some("block_size"),
            ));
        }
        if budget.dtype != crate::model::KvDtype::Auto {
            return Err(EngineError::invalid(
                format!(
                    "--kv-cache-dtype {} applies to CPU decoders; a GPU model's KV cache takes the model's type (--dtype)",
                    budget.dtype
                ),
                Some("kv_cache_dtype"),
            ));
        }
        self.kv = None;
        // Activations first, for the largest step the scheduler may run.
        self.ensure_scratch(budget.max_batched_tokens.max(1), budget.max_seqs.max(1))?;
        let elem = self.dtype.size();
        let kv_dim = self.cfg.n_kv_heads * self.cfg.head_dim;
        let block_bytes = 2 * self.cfg.n_layers * block_size * kv_dim * elem;
        let (free, total) = self.gpu.memory().map_err(gpu_err)?;
        let num_blocks = match budget.tokens {
            Some(tokens) => tokens / block_size,
            None => {
                let util = budget.gpu_memory_utilization;
                if !(util > 0.0 && util <= 1.0) {
                    return Err(EngineError::invalid(
                        format!("gpu_memory_utilization must be in (0, 1], got {util}"),
                        Some("gpu_memory_utilization"),
                    ));
                }
                // Everything already on the card (this process's context, weights and
                // activations, and any other process) counts against the share.
                let allowed = (util as f64 * total as f64) as usize;
                let used = total - free;
                let room = allowed
                    .saturating_sub(used)
                    .min(free)
                    .saturating_sub(HEADROOM);
                if room < block_bytes {
                    return Err(EngineError::load(
                        self.device(),
                        format!(
                            "--gpu-memory-utilization {util} allows {:.2} GiB of the card's {:.2} GiB, and {:.2} GiB is in use (weights {:.2} GiB, activations {:.2} GiB): nothing is left for the KV cache; raise it or lower --max-num-batched-tokens",
                            allowed as f64 / GIB,
                            total as f64 / GIB,
                            used as f64 / GIB,
                            self.weights.bytes as f64 / GIB,
                            scratch_bytes(&self.cfg, self.dtype, budget.max_batched_tokens, budget.max_seqs) as f64 / GIB,
                        ),
                    ));
                }
                room / block_bytes
            }
        };
        let bytes = num_blocks * block_bytes;
        let buf = self.gpu.alloc(bytes.max(1)).map_err(|e| {
            EngineError::load(self.device(), format!("cannot allocate the KV cache: {e}"))
        })?;
        tracing::info!(
            device = %self.device(),
            blocks = num_blocks,
            block_size,
            tokens = num_blocks * block_size,
            gib = %format!("{:.2}", bytes as f64 / GIB),
            weights_gib = %format!("{:.2}", self.weights.bytes as f64 / GIB),
            dtype = %self.dtype,
            "KV cache on the GPU"
        );
        self.kv = Some(GpuKv {
            buf,
            block_size,
            num_blocks,
            layer_elems: num_blocks * block_size * kv_dim,
            elem,
        });
        Ok(num_blocks)
    }

    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let plan = self.run(batch)?;
        self.read_logits(&plan, batch.len())
    }

    fn step(
        &mut self,
        batch: &[SeqChunk<'_>],
        requests: &mut [SampleRequest<'_>],
        eos: &[u32],
        rng: &mut StdRng,
    ) -> Result<Vec<Result<Sampled>>> {
        if requests.is_empty() {
            let logits = self.forward(batch)?;
            return Ok(sample_on_host(logits, requests, eos, rng));
        }
        let plan = self.run(batch)?;
        // The device sampler returns at most MAX_LOGPROBS alternatives, and knows nothing of
        // structured outputs, logit_bias, allowed_token_ids or bad_words: such a request is
        // sampled on the host from its copied logits. Each request goes where it must
        // whatever the others in its step need, so its outcome does not depend on them.
        let on_host: Vec<bool> = requests.iter().map(|r| host_only(r)).collect();
        let mut out: Vec<Option<Result<Sampled>>> = (0..requests.len()).map(|_| None).collect();
        if on_host.iter().any(|&h| !h) {
            self.sample_on_device(&plan, requests, &on_host, eos, rng, &mut out)?;
        }
        if on_host.iter().any(|&h| h) {
            let mut logits = self.read_logits(&plan, batch.len())?;
            for ((r, slot), _) in requests
                .iter_mut()
                .zip(out.iter_mut())
                .zip(&on_host)
                .filter(|(_, &h)| h)
            {
                *slot = Some(match logits.get_mut(r.chunk).and_then(Option::take) {
                    Some(mut row) => r.sampler.sample(&mut row, eos, rng),
                    None => Err(EngineError::Internal(format!(
                        "no logits for batch chunk {}",
                        r.chunk
                    ))),
                });
            }
        }
        Ok(out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| Err(EngineError::Internal("a request was not sampled".into())))
            })
            .collect())
    }
}

impl GpuLlama {
    /// The logits `plan` left in the scratch, per batch chunk (`None` where none was wanted).
    fn read_logits(&self, plan: &plan::StepPlan, n_chunks: usize) -> Result<Vec<Option<Vec<f32>>>> {
        let vocab = self.cfg.vocab;
        let mut out: Vec<Option<Vec<f32>>> = vec![None; n_chunks];
        if plan.logit_chunks.is_empty() {
            return Ok(out);
        }
        let s = self
            .scratch
            .as_ref()
            .ok_or_else(|| EngineError::Internal("GPU buffers missing".into()))?;
        let all = self
            .gpu
            .read::<f32>(s.logits.ptr(), plan.logit_chunks.len() * vocab)
            .map_err(gpu_err)?;
        for (j, &c) in plan.logit_chunks.iter().enumerate() {
            out[c] = Some(all[j * vocab..(j + 1) * vocab].to_vec());
        }
        Ok(out)
    }

    /// Samples the requests not `on_host` on the device into `out`. Their uniforms are drawn
    /// in request order, as the host sampler draws them.
    fn sample_on_device(
        &mut self,
        plan: &plan::StepPlan,
        requests: &mut [SampleRequest<'_>],
        on_host: &[bool],
        eos: &[u32],
        rng: &mut StdRng,
        out: &mut [Option<Result<Sampled>>],
    ) -> Result<()> {
        let chunks = plan.logit_chunks.iter().max().map_or(0, |&c| c + 1);
        let mut row_of = vec![None; chunks];
        for (j, &c) in plan.logit_chunks.iter().enumerate() {
            if let Some(slot) = row_of.get_mut(c) {
                *slot = Some(j);
            }
        }
        // One row per logit row; a row no device request samples gets a greedy row whose
        // outcome is dropped.
        let mut rows = vec![SampleRow::default(); plan.logit_chunks.len()];
        let mut at = vec![None; requests.len()];
        for (i, r) in requests
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| !on_host[*i])
        {
            let j = row_of.get(r.chunk).copied().flatten().ok_or_else(|| {
                EngineError::Internal(format!("no logits for batch chunk {}", r.chunk))
            })?;
            rows[j] = r.sampler.device_row(eos, rng);
            at[i] = Some(j);
        }
        let logits = self
            .scratch
            .as_ref()
            .map(|s| s.logits.ptr())
            .ok_or_else(|| EngineError::Internal("GPU buffers missing".into()))?;
        let vocab = self.cfg.vocab;
        let sampler = match &mut self.sampler {
            Some(s) => s,
            none => none.insert(Sampler::new(&self.gpu, vocab).map_err(gpu_err)?),
        };
        let mut sampled: Vec<Option<_>> = sampler
            .sample(logits, &rows)
            .map_err(gpu_err)?
            .into_iter()
            .map(Some)
            .collect();
        for ((r, slot), j) in requests.iter().zip(out.iter_mut()).zip(at) {
            let Some(j) = j else { continue };
            *slot = Some(match sampled.get_mut(j).and_then(Option::take) {
                Some(Ok(row)) => Ok(r.sampler.from_device(row)),
                Some(Err(e)) => Err(EngineError::Internal(e.to_string())),
                None => Err(EngineError::Internal(
                    "a logit row was sampled twice".into(),
                )),
            });
        }
        Ok(())
    }
}

/// Whether a request must be sampled on the host (see [`GpuLlama::step`]).
fn host_only(r: &SampleRequest<'_>) -> bool {
    r.sampler.needs_host()
        || r.sampler
            .params()
            .logprobs
            .is_some_and(|k| k > MAX_LOGPROBS)
}

const GIB: f64 = (1u64 << 30) as f64;

/// The first setting the GPU kernels do not implement, named as `config.json` names it; the
/// bring-up then fails at the weights step, and `--device auto` serves the model on the CPU.
fn gpu_unsupported(cfg: &LlamaConfig) -> Option<&'static str> {
    // The CPU turns a local layer by each token's plain position; the GPU step has only the
    // three M-RoPE positions at hand, which differ from it on media rows.
    (cfg.local_rope_base.is_some() && cfg.mrope_section.is_some())
        .then_some("rope_local_base_freq with mrope_section")
}

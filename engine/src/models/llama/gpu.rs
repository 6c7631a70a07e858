//! The Llama-family decoder on a GPU: the same model as the CPU one (built from it, so every
//! checkpoint the CPU loads — GGUF or HF — runs here too), with weights, KV cache and
//! activations in device memory, GEMMs through cuBLAS and everything else in the kernels of
//! `kernels/cuda/`.
//!
//! One step, for T tokens: embedding gather (media rows copied in) → per layer: fused
//! residual add + RMSNorm → QKV GEMM → biases, Q/K norms and RoPE → K/V into the paged cache
//! → paged attention (decode rows and prefill tiles) → output GEMM → residual add + RMSNorm →
//! gate/up GEMM → SwiGLU → down GEMM; then the last residual add and the final norm on the
//! rows whose logits are wanted, the LM head GEMM, and sampling on the device.
//!
//! The residual stream and every GEMM output stay f32; GEMM inputs, weights and the KV cache
//! are the model's GPU type (bf16 by default; f32 for exact parity runs).

mod buffers;
mod plan;
mod weights;

use rand::rngs::StdRng;

use kernels::gpu::ops::{
    rope_inv_freq, AddRmsNorm, Embed, KvWrite, PagedAttention, RopeQk, SwiGlu,
};
use kernels::gpu::ops::{SampleRow, Sampler, MAX_LOGPROBS};
use kernels::gpu::{DevicePtr, Gemm, Gpu, GpuBuffer, GpuDType, GpuError};

use super::{validate_chunks, LlamaConfig, LlamaModel, MlpActivation};
use crate::error::{EngineError, Result};
use crate::model::{sample_on_host, CausalLm, DecoderInfo, KvBudget, SampleRequest, SeqChunk};
use crate::sampling::Sampled;
use buffers::{scratch_bytes, GpuKv, Scratch};
use plan::StepPlan;
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
        let cfg = model.cfg.clone();
        if cfg.head_dim > 256 || !cfg.head_dim.is_multiple_of(8) {
            return Err(EngineError::load(
                gpu.info().label(),
                format!(
                    "head dim {} is not supported by the GPU attention kernels (a multiple of 8, at most 256)",
                    cfg.head_dim
                ),
            ));
        }
        if let Some(what) = gpu_unsupported(&cfg) {
            return Err(EngineError::load(
                gpu.info().label(),
                format!("{what} is not supported by the GPU decoder (it runs on the CPU)"),
            ));
        }
        let weights = weights::upload(&gpu, model, dtype)?;
        let inv_freq = rope_inv_freq(cfg.rope_base, cfg.rope_dim, model.rope_factors.as_deref());
        let inv_freq = gpu.upload(&inv_freq).map_err(gpu_err)?;
        Ok(GpuLlama {
            info: model.info.clone(),
            cfg,
            gpu,
            dtype,
            weights,
            inv_freq,
            kv: None,
            scratch: None,
            sampler: None,
        })
    }

    pub fn dtype(&self) -> GpuDType {
        self.dtype
    }

    /// Make the scratch hold `rows` tokens and `logit_rows` logit rows.
    fn ensure_scratch(&mut self, rows: usize, logit_rows: usize) -> Result<()> {
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

    /// Run the step's layers and the LM head; the logits of `plan.logit_chunks` are in
    /// `scratch.logits`, one row each.
    fn run(&mut self, batch: &[SeqChunk<'_>]) -> Result<StepPlan> {
        let (block_size, num_blocks) = match &self.kv {
            Some(kv) => (kv.block_size, kv.num_blocks),
            None => {
                return Err(EngineError::Internal(
                    "the KV cache is not allocated".into(),
                ))
            }
        };
        validate_chunks(&self.cfg, batch, block_size, num_blocks)?;
        let pos_axes = if self.cfg.mrope_section.is_some() {
            3
        } else {
            1
        };
        let plan = StepPlan::build(batch, block_size, pos_axes);
        self.ensure_scratch(plan.n_rows, plan.logit_chunks.len())?;
        let (gpu, cfg, dtype) = (&self.gpu, &self.cfg, self.dtype);
        let (Some(s), Some(kv)) = (self.scratch.as_mut(), self.kv.as_ref()) else {
            return Err(EngineError::Internal("GPU buffers missing".into()));
        };
        if plan.ints.len() > s.ints_cap {
            s.ints_cap = plan.ints.len().next_power_of_two();
            s.ints = gpu.alloc(s.ints_cap * 4).map_err(gpu_err)?;
        }
        gpu.write(s.ints.ptr(), &plan.ints).map_err(gpu_err)?;
        let media = if plan.has_media && !plan.media.is_empty() {
            if plan.media.len() > s.media_cap {
                s.media_cap = plan.media.len().next_power_of_two();
                s.media = Some(gpu.alloc(s.media_cap * 4).map_err(gpu_err)?);
            }
            let m = s.media.as_ref().map(|b| b.ptr()).unwrap_or_default();
            gpu.write(m, &plan.media).map_err(gpu_err)?;
            Some(m)
        } else {
            None
        };
        let int = |off: usize| s.ints.at(off * 4);
        let (t, h) = (plan.n_rows, cfg.hidden);
        let (n_heads, n_kv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
        let qkv_stride = (n_heads + 2 * n_kv) * hd;
        let (q_dim, kv_dim) = (n_heads * hd, n_kv * hd);
        let w = &self.weights;

        // `x += delta` (when given), then RMSNorm with `weight` into `out`, over every row or
        // the rows listed.
        let norm = |delta: Option<DevicePtr>,
                    weight: &GpuBuffer,
                    out: DevicePtr,
                    rows: Option<DevicePtr>,
                    n_rows: usize| {
            AddRmsNorm {
                dtype,
                x: s.x.ptr(),
                delta,
                weight: weight.ptr(),
                out,
                rows,
                n_rows,
                hidden: h,
                eps: cfg.eps,
            }
            .launch(gpu)
            .map_err(gpu_err)
        };
        Embed {
            dtype,
            table: w.embed.ptr(),
            tokens: int(plan.at.tokens),
            media_slot: media.map(|_| int(plan.at.media_slot)),
            media,
            x: s.x.ptr(),
            n_tokens: t,
            hidden: h,
        }
        .launch(gpu)
        .map_err(gpu_err)?;

        let scale = cfg.rope_attn_factor * cfg.rope_attn_factor / (hd as f32).sqrt();
        for (li, layer) in w.layers.iter().enumerate() {
            norm(
                (li > 0).then(|| s.delta.ptr()),
                &layer.attn_norm,
                s.h.ptr(),
                None,
                t,
            )?;
            gemm(
                gpu,
                dtype,
                t,
                s.h.ptr(),
                &layer.wqkv,
                qkv_stride,
                h,
                s.qkv.ptr(),
            )?;
            RopeQk {
                qkv: s.qkv.ptr(),
                bias: layer.bias.as_ref().map(|b| b.ptr()),
                q_norm: layer.q_norm.as_ref().map(|b| b.ptr()),
                k_norm: layer.k_norm.as_ref().map(|b| b.ptr()),
                inv_freq: self.inv_freq.ptr(),
                positions: int(plan.at.positions),
                pos_axes,
                sections: cfg
                    .mrope_section
                    .map_or([cfg.rope_dim / 2, 0], |m| [m[0], m[1]]),
                n_tokens: t,
                n_heads,
                n_kv_heads: n_kv,
                head_dim: hd,
                rope_dim: cfg.rope_dim,
                neox: cfg.rope_neox,
                freq_scale: cfg.rope_freq_scale,
                eps: cfg.eps,
            }
            .launch(gpu)
            .map_err(gpu_err)?;
            KvWrite {
                dtype,
                qkv: s.qkv.ptr(),
                k_cache: kv.k(li),
                v_cache: kv.v(li),
                slots: int(plan.at.slots),
                n_tokens: t,
                qkv_stride,
                k_offset: q_dim,
                v_offset: q_dim + kv_dim,
                kv_dim,
            }
            .launch(gpu)
            .map_err(gpu_err)?;
            let attn = PagedAttention {
                dtype,
                out: s.attn.ptr(),
                q: s.qkv.ptr(),
                k_cache: kv.k(li),
                v_cache: kv.v(li),
                block_tables: int(plan.at.tables),
                q_stride: qkv_stride,
                out_stride: q_dim,
                n_heads,
                n_kv_heads: n_kv,
                head_dim: hd,
                block_size: kv.block_size,
                max_blocks: plan.max_blocks,
                scale,
            };
            if plan.n_decode > 0 {
                attn.decode(gpu, int(plan.at.q_seq), int(plan.at.q_ctx), plan.n_decode)
                    .map_err(gpu_err)?;
            }
            if plan.n_tiles > 0 {
                attn.prefill(gpu, int(plan.at.tiles), plan.n_tiles)
                    .map_err(gpu_err)?;
            }
            gemm(
                gpu,
                dtype,
                t,
                s.attn.ptr(),
                &layer.wo,
                h,
                q_dim,
                s.delta.ptr(),
            )?;
            norm(Some(s.delta.ptr()), &layer.ffn_norm, s.h.ptr(), None, t)?;
            gemm(
                gpu,
                dtype,
                t,
                s.h.ptr(),
                &layer.wgu,
                2 * cfg.ffn,
                h,
                s.gate_up.ptr(),
            )?;
            SwiGlu {
                dtype,
                gate_up: s.gate_up.ptr(),
                out: s.act.ptr(),
                n_tokens: t,
                ffn: cfg.ffn,
            }
            .launch(gpu)
            .map_err(gpu_err)?;
            gemm(
                gpu,
                dtype,
                t,
                s.act.ptr(),
                &layer.wdown,
                h,
                cfg.ffn,
                s.delta.ptr(),
            )?;
        }
        let n_logits = plan.logit_chunks.len();
        if n_logits > 0 {
            // The last layer's residual add happens here, for the wanted rows only.
            norm(
                Some(s.delta.ptr()),
                &w.out_norm,
                s.normed.ptr(),
                Some(int(plan.at.logit_rows)),
                n_logits,
            )?;
            gemm(
                gpu,
                dtype,
                n_logits,
                s.normed.ptr(),
                w.lm_head(),
                cfg.vocab,
                h,
                s.logits.ptr(),
            )?;
        }
        Ok(plan)
    }
}

/// `c = a · wᵀ` for `m` rows: `a` is `m × k` of `dtype`, `w` is `n × k`, `c` is f32 `m × n`.
#[allow(clippy::too_many_arguments)]
fn gemm(
    gpu: &Gpu,
    dtype: GpuDType,
    m: usize,
    a: DevicePtr,
    w: &GpuBuffer,
    n: usize,
    k: usize,
    c: DevicePtr,
) -> Result<()> {
    gpu.gemm(&Gemm {
        m,
        n,
        k,
        dtype,
        a,
        lda: k,
        b: w.ptr(),
        ldb: k,
        c,
        ldc: n,
        alpha: 1.0,
        beta: 0.0,
    })
    .map_err(gpu_err)
}

impl CausalLm for GpuLlama {
    fn info(&self) -> &DecoderInfo {
        &self.info
    }

    fn device(&self) -> String {
        self.gpu.info().label()
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
        let vocab = self.cfg.vocab;
        let mut out: Vec<Option<Vec<f32>>> = vec![None; batch.len()];
        if !plan.logit_chunks.is_empty() {
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
        }
        Ok(out)
    }

    fn step(
        &mut self,
        batch: &[SeqChunk<'_>],
        requests: &mut [SampleRequest<'_>],
        eos: &[u32],
        rng: &mut StdRng,
    ) -> Result<Vec<Result<Sampled>>> {
        // The device sampler returns at most MAX_LOGPROBS alternatives, and knows nothing of
        // structured outputs, logit_bias, allowed_token_ids or bad_words: a step with such a
        // request is sampled on the host from the copied logits.
        let wide = requests.iter().any(|r| {
            r.sampler.needs_host()
                || r.sampler
                    .params()
                    .logprobs
                    .is_some_and(|k| k > MAX_LOGPROBS)
        });
        if wide || requests.is_empty() {
            let logits = self.forward(batch)?;
            return Ok(sample_on_host(logits, requests, eos, rng));
        }
        let plan = self.run(batch)?;
        let mut row_of = vec![None; batch.len()];
        for (j, &c) in plan.logit_chunks.iter().enumerate() {
            row_of[c] = Some(j);
        }
        // One row per logit row; a chunk that wants logits but no sample gets a greedy row
        // whose outcome is dropped. The uniforms are drawn in request order, as the host
        // sampler draws them.
        let mut rows = vec![SampleRow::default(); plan.logit_chunks.len()];
        let mut at = Vec::with_capacity(requests.len());
        for r in requests.iter_mut() {
            let j = row_of.get(r.chunk).copied().flatten().ok_or_else(|| {
                EngineError::Internal(format!("no logits for batch chunk {}", r.chunk))
            })?;
            rows[j] = r.sampler.device_row(eos, rng);
            at.push(j);
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
        let mut out: Vec<Option<_>> = sampler
            .sample(logits, &rows)
            .map_err(gpu_err)?
            .into_iter()
            .map(Some)
            .collect();
        Ok(requests
            .iter()
            .zip(at)
            .map(|(r, j)| match out[j].take() {
                Some(Ok(row)) => Ok(r.sampler.from_device(row)),
                Some(Err(e)) => Err(EngineError::Internal(e.to_string())),
                None => Err(EngineError::Internal(
                    "a logit row was sampled twice".into(),
                )),
            })
            .collect())
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// The first setting the GPU kernels do not implement, named as `config.json` names it; the
/// bring-up then fails at the weights step, and `--device auto` serves the model on the CPU.
fn gpu_unsupported(cfg: &LlamaConfig) -> Option<&'static str> {
    let t = &cfg.traits;
    [
        (cfg.windows.iter().any(Option::is_some), "sliding_window"),
        (cfg.local_rope_base.is_some(), "rope_local_base_freq"),
        (t.embed_scale.is_some(), "a scaled embedding (Gemma)"),
        (
            t.sandwich_norms,
            "post_attention and post_feedforward norms (Gemma)",
        ),
        (
            t.activation != MlpActivation::Silu,
            "hidden_act other than silu",
        ),
        (t.attn_softcap.is_some(), "attn_logit_softcapping"),
        (t.final_softcap.is_some(), "final_logit_softcapping"),
        (t.attn_scale.is_some(), "query_pre_attn_scalar"),
    ]
    .into_iter()
    .find_map(|(on, name)| on.then_some(name))
}

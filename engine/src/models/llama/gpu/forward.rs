//! One step of the GPU decoder: the step plan uploaded, then the kernels and GEMMs of every
//! layer, the final norm over the rows whose logits are wanted, and the LM head.
//!
//! A sequence's logits do not depend on the rest of its step: every kernel but the GEMMs works
//! on each row (or each attention tile, see `plan.rs`) alone, and every GEMM, the LM head's
//! included, runs in chunks of a fixed number of rows (`ops::gemm`), the last one padded with
//! zero rows, so cuBLAS computes each weight's product at one shape whatever the batch.

use kernels::gpu::ops::{
    gemm_in_row_chunks, padded_rows, AddRmsNorm, Embed, Glu, GluActivation, KvWrite, LogitsSoftcap,
    PagedAttention, RopeQk,
};
use kernels::gpu::{DevicePtr, Gemm, Gpu, GpuBuffer, GpuDType};

use super::super::{validate_chunks, MlpActivation};
use super::plan::StepPlan;
use super::{gpu_err, GpuLlama};
use crate::error::{EngineError, Result};
use crate::model::SeqChunk;

impl GpuLlama {
    /// Run the step's layers and the LM head; the logits of `plan.logit_chunks` are in
    /// `scratch.logits`, one row each.
    pub(super) fn run(&mut self, batch: &[SeqChunk<'_>]) -> Result<StepPlan> {
        let (block_size, num_blocks) = match &self.kv {
            Some(kv) => (kv.block_size, kv.num_blocks),
            None => {
                return Err(EngineError::Internal(
                    "the KV cache is not allocated".into(),
                ))
            }
        };
        validate_chunks(&self.cfg, batch, block_size, num_blocks)?;
        // The GPU decoder reports no LoRA targets, so no adapter should reach it; one that did
        // would be silently ignored.
        if batch.iter().any(|c| c.lora.is_some()) {
            return Err(EngineError::Internal(
                "the GPU decoder does not run LoRA adapters".into(),
            ));
        }
        let pos_axes = if self.cfg.mrope_section.is_some() {
            3
        } else {
            1
        };
        let plan = StepPlan::build(batch, block_size, pos_axes);
        let n_logits = plan.logit_chunks.len();
        self.ensure_scratch(plan.n_rows, n_logits)?;
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
        // The GEMMs' inputs past the step's rows, up to the last chunk's end: zeros, so the
        // padding rows' products are zeros too. The kernels write rows below `t` (or below
        // `n_logits`) only, so this holds for the whole step.
        let e = dtype.size();
        for (buf, width, rows) in [
            (&s.h, h, t),
            (&s.attn, q_dim, t),
            (&s.act, cfg.ffn, t),
            (&s.normed, h, n_logits),
        ] {
            let pad = padded_rows(rows) - rows;
            if pad > 0 {
                gpu.memset(buf.at(rows * width * e), 0, pad * width * e)
                    .map_err(gpu_err)?;
            }
        }
        // A GEMM over every row of the step.
        let step_gemm = |a: DevicePtr, w: &GpuBuffer, n: usize, k: usize, c: DevicePtr| {
            gemm(gpu, dtype, t, a, w, n, k, c)
        };

        // `x += delta` (when given; through a norm with `delta_norm` when that is given too),
        // then RMSNorm with `weight` into `out`, over every row or the rows listed.
        let norm = |delta: Option<DevicePtr>,
                    delta_norm: Option<&GpuBuffer>,
                    weight: &GpuBuffer,
                    out: DevicePtr,
                    rows: Option<DevicePtr>,
                    n_rows: usize| {
            AddRmsNorm {
                dtype,
                x: s.x.ptr(),
                delta,
                delta_norm: delta_norm.map(GpuBuffer::ptr),
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
            scale: cfg.traits.embed_scale.unwrap_or(1.0),
        }
        .launch(gpu)
        .map_err(gpu_err)?;

        let base_scale = cfg.traits.attn_scale.unwrap_or(1.0 / (hd as f32).sqrt());
        let activation = match cfg.traits.activation {
            MlpActivation::Silu => GluActivation::Silu,
            MlpActivation::GeluTanh => GluActivation::GeluTanh,
        };
        // The previous layer's MLP output norm (Gemma), applied as its output is added.
        let mut pending_norm: Option<&GpuBuffer> = None;
        for (li, layer) in w.layers.iter().enumerate() {
            let window = cfg.window(li);
            // Gemma 3's sliding layers turn with their own base and no scaling, so YaRN's
            // attention factor (which belongs to the scaled RoPE) does not apply to them.
            let local = self.inv_freq_local.as_ref().filter(|_| window.is_some());
            let (inv_freq, freq_scale, attn_factor) = match local {
                Some(f) => (f, 1.0, 1.0),
                None => (&self.inv_freq, cfg.rope_freq_scale, cfg.rope_attn_factor),
            };
            norm(
                (li > 0).then(|| s.delta.ptr()),
                pending_norm,
                &layer.attn_norm,
                s.h.ptr(),
                None,
                t,
            )?;
            step_gemm(s.h.ptr(), &layer.wqkv, qkv_stride, h, s.qkv.ptr())?;
            RopeQk {
                qkv: s.qkv.ptr(),
                bias: layer.bias.as_ref().map(|b| b.ptr()),
                q_norm: layer.q_norm.as_ref().map(|b| b.ptr()),
                k_norm: layer.k_norm.as_ref().map(|b| b.ptr()),
                inv_freq: inv_freq.ptr(),
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
                freq_scale,
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
                scale: attn_factor * attn_factor * base_scale,
                window,
                softcap: cfg.traits.attn_softcap,
            };
            attn.prefill(gpu, int(plan.at.tiles), plan.n_tiles)
                .map_err(gpu_err)?;
            step_gemm(s.attn.ptr(), &layer.wo, h, q_dim, s.delta.ptr())?;
            norm(
                Some(s.delta.ptr()),
                layer.post_attn_norm.as_ref(),
                &layer.ffn_norm,
                s.h.ptr(),
                None,
                t,
            )?;
            step_gemm(s.h.ptr(), &layer.wgu, 2 * cfg.ffn, h, s.gate_up.ptr())?;
            Glu {
                dtype,
                gate_up: s.gate_up.ptr(),
                out: s.act.ptr(),
                n_tokens: t,
                ffn: cfg.ffn,
                activation,
            }
            .launch(gpu)
            .map_err(gpu_err)?;
            step_gemm(s.act.ptr(), &layer.wdown, h, cfg.ffn, s.delta.ptr())?;
            pending_norm = layer.post_ffn_norm.as_ref();
        }
        if n_logits > 0 {
            // The last layer's residual add happens here, for the wanted rows only.
            norm(
                Some(s.delta.ptr()),
                pending_norm,
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
            if let Some(cap) = cfg.traits.final_softcap {
                LogitsSoftcap {
                    logits: s.logits.ptr(),
                    n: n_logits * cfg.vocab,
                    cap,
                }
                .launch(gpu)
                .map_err(gpu_err)?;
            }
        }
        Ok(plan)
    }
}

/// `c = a · wᵀ` for `m` rows: `a` is `m × k` of `dtype`, `w` is `n × k`, `c` is f32 `m × n`;
/// both hold `padded_rows(m)` rows, `a`'s padding rows zero.
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
    gemm_in_row_chunks(
        gpu,
        &Gemm {
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
        },
    )
    .map_err(gpu_err)
}

//! The decoder's weights on the GPU, converted from the host model's memory-mapped checkpoint
//! (GGUF blocks dequantised, F16/BF16/F32 converted) to the GPU type as they are copied.
//!
//! Matrices that read the same input are fused into one: Q, K and V into `[q; k; v]` and the
//! gate and up projections into `[gate; up]`, so each is one GEMM. Norm weights, biases and
//! the rotary frequencies stay f32. The copy goes through the backend's staged upload (pinned
//! buffers on CUDA, so converting the next chunk overlaps copying the last), with a progress
//! line per GiB.

use std::time::Instant;

use kernels::gpu::{Gpu, GpuBuffer, GpuDType};
use kernels::{DType, QMatrix};

use super::super::{Layer, LlamaModel, Weight};
use crate::error::{EngineError, Result};
use crate::model::WeightSummary;

/// One decoder layer on the GPU.
pub(super) struct GpuLayer {
    pub attn_norm: GpuBuffer,
    /// `[q; k; v]`, `(n_heads + 2·n_kv_heads)·head_dim × hidden`.
    pub wqkv: GpuBuffer,
    /// Q/K/V biases in the same order (Qwen2), f32.
    pub bias: Option<GpuBuffer>,
    pub q_norm: Option<GpuBuffer>,
    pub k_norm: Option<GpuBuffer>,
    pub wo: GpuBuffer,
    /// Gemma 2/3: the norms of the attention's and the MLP's outputs, f32.
    pub post_attn_norm: Option<GpuBuffer>,
    pub post_ffn_norm: Option<GpuBuffer>,
    pub ffn_norm: GpuBuffer,
    /// `[gate; up]`, `2·ffn × hidden`.
    pub wgu: GpuBuffer,
    pub wdown: GpuBuffer,
}

/// Every weight of the model on the GPU.
pub(super) struct GpuWeights {
    pub embed: GpuBuffer,
    /// `None`: the LM head is the embedding table (tied).
    pub lm_head: Option<GpuBuffer>,
    pub out_norm: GpuBuffer,
    pub layers: Vec<GpuLayer>,
    /// Bytes held on the device.
    pub bytes: usize,
}

impl GpuWeights {
    pub fn lm_head(&self) -> &GpuBuffer {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// What the device holds: the matrices as `dtype`, the rest as f32.
    pub fn summary(&self, dtype: GpuDType) -> WeightSummary {
        let mut s = WeightSummary::default();
        let mut matrices: Vec<&GpuBuffer> = vec![&self.embed];
        matrices.extend(&self.lm_head);
        let mut vectors: Vec<&GpuBuffer> = vec![&self.out_norm];
        for l in &self.layers {
            matrices.extend([&l.wqkv, &l.wo, &l.wgu, &l.wdown]);
            vectors.extend([&l.attn_norm, &l.ffn_norm]);
            vectors.extend(
                [
                    &l.bias,
                    &l.q_norm,
                    &l.k_norm,
                    &l.post_attn_norm,
                    &l.post_ffn_norm,
                ]
                .into_iter()
                .flatten(),
            );
        }
        // Named as the host's types are, so the two summaries read alike.
        let stored = match dtype {
            GpuDType::F32 => DType::F32,
            GpuDType::BF16 => DType::BF16,
            GpuDType::F16 => DType::F16,
        };
        for b in matrices {
            s.add(stored, b.len_bytes() as u64);
        }
        for b in vectors {
            s.add(DType::F32, b.len_bytes() as u64);
        }
        s
    }
}

/// Counts uploaded bytes and logs each GiB.
struct Progress {
    total: usize,
    done: usize,
    next_log: usize,
    started: Instant,
}

const GIB: usize = 1 << 30;

impl Progress {
    fn add(&mut self, bytes: usize) {
        self.done += bytes;
        while self.done >= self.next_log {
            tracing::info!(
                uploaded_gib = self.next_log / GIB,
                total_gib = %format!("{:.2}", self.total as f64 / GIB as f64),
                elapsed_ms = self.started.elapsed().as_millis() as u64,
                "uploading weights"
            );
            self.next_log += GIB;
        }
    }
}

/// The host model's matrices, with the view to read them.
struct Source<'a> {
    model: &'a LlamaModel,
}

impl Source<'_> {
    fn qm(&self, w: &Weight) -> Result<QMatrix<'_>> {
        self.model.qm(w)
    }
}

fn gpu_err(e: kernels::gpu::GpuError) -> EngineError {
    EngineError::Internal(format!("GPU: {e}"))
}

/// Store `row` (f32) as `dtype` into `out`.
fn store(dtype: GpuDType, row: &[f32], out: &mut [u8]) {
    match dtype {
        GpuDType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(row) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GpuDType::BF16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(row) {
                o.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
            }
        }
        GpuDType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(row) {
                o.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
    }
}

/// Upload the rows of `parts` stacked on top of each other (all with the same width), as
/// `dtype`.
fn upload_matrix(
    gpu: &Gpu,
    src: &Source<'_>,
    parts: &[&Weight],
    dtype: GpuDType,
    progress: &mut Progress,
) -> Result<GpuBuffer> {
    let cols = parts[0].cols;
    if parts.iter().any(|w| w.cols != cols) {
        return Err(EngineError::Internal(
            "fused matrices differ in width".into(),
        ));
    }
    let views: Vec<QMatrix<'_>> = parts.iter().map(|w| src.qm(w)).collect::<Result<_>>()?;
    let rows: usize = parts.iter().map(|w| w.rows).sum();
    let row_bytes = cols * dtype.size();
    let bytes = rows * row_bytes;
    let buf = gpu.alloc(bytes).map_err(gpu_err)?;
    let mut f32_row = vec![0f32; cols];
    let mut partial = vec![0u8; row_bytes];
    // Row `r` of the stack as `dtype` into `out` (exactly `row_bytes`).
    let mut convert = |r: usize, out: &mut [u8]| {
        let mut r = r;
        for v in &views {
            if r < v.rows() {
                v.dequantize_row_into(r, &mut f32_row);
                store(dtype, &f32_row, out);
                return;
            }
            r -= v.rows();
        }
    };
    gpu.upload_with(buf.ptr(), bytes, &mut |off, chunk| {
        // The chunk may start and end inside a row.
        let mut pos = 0;
        while pos < chunk.len() {
            let abs = off + pos;
            let (r, within) = (abs / row_bytes, abs % row_bytes);
            let take = (row_bytes - within).min(chunk.len() - pos);
            if within == 0 && take == row_bytes {
                convert(r, &mut chunk[pos..pos + row_bytes]);
            } else {
                convert(r, &mut partial);
                chunk[pos..pos + take].copy_from_slice(&partial[within..within + take]);
            }
            pos += take;
        }
        Ok(())
    })
    .map_err(gpu_err)?;
    progress.add(bytes);
    Ok(buf)
}

fn upload_f32(gpu: &Gpu, v: &[f32]) -> Result<GpuBuffer> {
    gpu.upload(v).map_err(gpu_err)
}

fn upload_opt(gpu: &Gpu, v: Option<&[f32]>) -> Result<Option<GpuBuffer>> {
    v.map(|v| upload_f32(gpu, v)).transpose()
}

fn upload_layer(
    gpu: &Gpu,
    src: &Source<'_>,
    l: &Layer,
    dtype: GpuDType,
    progress: &mut Progress,
) -> Result<GpuLayer> {
    let bias = match (&l.bq, &l.bk, &l.bv) {
        (None, None, None) => None,
        (q, k, v) => {
            // A missing bias of a biased layer is zero.
            let mut all = Vec::with_capacity(l.wq.rows + l.wk.rows + l.wv.rows);
            for (b, n) in [(q, l.wq.rows), (k, l.wk.rows), (v, l.wv.rows)] {
                match b {
                    Some(b) => all.extend_from_slice(b),
                    None => all.extend(std::iter::repeat_n(0.0, n)),
                }
            }
            Some(upload_f32(gpu, &all)?)
        }
    };
    Ok(GpuLayer {
        attn_norm: upload_f32(gpu, &l.attn_norm)?,
        wqkv: upload_matrix(gpu, src, &[&l.wq, &l.wk, &l.wv], dtype, progress)?,
        bias,
        q_norm: upload_opt(gpu, l.q_norm.as_deref())?,
        k_norm: upload_opt(gpu, l.k_norm.as_deref())?,
        wo: upload_matrix(gpu, src, &[&l.wo], dtype, progress)?,
        post_attn_norm: upload_opt(gpu, l.post_attn_norm.as_deref())?,
        post_ffn_norm: upload_opt(gpu, l.post_ffn_norm.as_deref())?,
        ffn_norm: upload_f32(gpu, &l.ffn_norm)?,
        wgu: upload_matrix(gpu, src, &[&l.w_gate, &l.w_up], dtype, progress)?,
        wdown: upload_matrix(gpu, src, &[&l.w_down], dtype, progress)?,
    })
}

/// Bytes the matrices of `model` take as `dtype` (for the progress total and sizing).
pub(super) fn matrix_bytes(model: &LlamaModel, dtype: GpuDType) -> usize {
    let size = |w: &Weight| w.rows * w.cols * dtype.size();
    let tied = model.output.same_bytes(&model.token_embd);
    let mut total = size(&model.token_embd) + if tied { 0 } else { size(&model.output) };
    for l in &model.layers {
        total += [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
            .iter()
            .map(|w| size(w))
            .sum::<usize>();
    }
    total
}

/// Upload every weight of `model` as `dtype`.
pub(super) fn upload(gpu: &Gpu, model: &LlamaModel, dtype: GpuDType) -> Result<GpuWeights> {
    let started = Instant::now();
    let total = matrix_bytes(model, dtype);
    let (free, _) = gpu.memory().map_err(gpu_err)?;
    if total > free {
        return Err(EngineError::load(
            gpu.info().label(),
            format!(
                "the weights take {:.2} GiB as {dtype}, but only {:.2} GiB of device memory is free",
                total as f64 / GIB as f64,
                free as f64 / GIB as f64
            ),
        ));
    }
    let mut progress = Progress {
        total,
        done: 0,
        next_log: GIB,
        started,
    };
    let src = Source { model };
    let embed = upload_matrix(gpu, &src, &[&model.token_embd], dtype, &mut progress)?;
    let lm_head = if model.output.same_bytes(&model.token_embd) {
        None
    } else {
        Some(upload_matrix(
            gpu,
            &src,
            &[&model.output],
            dtype,
            &mut progress,
        )?)
    };
    let layers = model
        .layers
        .iter()
        .map(|l| upload_layer(gpu, &src, l, dtype, &mut progress))
        .collect::<Result<Vec<_>>>()?;
    let out_norm = upload_f32(gpu, &model.output_norm)?;
    gpu.synchronize().map_err(gpu_err)?;
    tracing::info!(
        device = %gpu.info().label(),
        dtype = %dtype,
        gib = %format!("{:.2}", total as f64 / GIB as f64),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "weights on the GPU"
    );
    Ok(GpuWeights {
        embed,
        lm_head,
        out_norm,
        layers,
        bytes: total,
    })
}

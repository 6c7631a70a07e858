//! The GPU decoder's device buffers: the paged KV cache and the activations of a step.

use kernels::gpu::ops::padded_rows;
use kernels::gpu::{DevicePtr, Gpu, GpuBuffer, GpuDType};

use super::super::LlamaConfig;
use super::gpu_err;
use crate::error::Result;

/// The paged KV cache: one allocation, K then V per layer, each
/// `num_blocks × block_size × kv_dim` elements of the model's type.
pub(super) struct GpuKv {
    pub(super) buf: GpuBuffer,
    pub(super) block_size: usize,
    pub(super) num_blocks: usize,
    pub(super) layer_elems: usize,
    pub(super) elem: usize,
}

impl GpuKv {
    pub(super) fn k(&self, layer: usize) -> DevicePtr {
        self.buf.at(2 * layer * self.layer_elems * self.elem)
    }
    pub(super) fn v(&self, layer: usize) -> DevicePtr {
        self.buf.at((2 * layer + 1) * self.layer_elems * self.elem)
    }
}

/// Activation buffers, sized for `rows` tokens and `logit_rows` logit rows (whole GEMM chunks:
/// the GEMMs read and write the padding rows); grown on demand.
pub(super) struct Scratch {
    pub(super) rows: usize,
    pub(super) logit_rows: usize,
    pub(super) x: GpuBuffer,
    pub(super) h: GpuBuffer,
    pub(super) qkv: GpuBuffer,
    pub(super) attn: GpuBuffer,
    pub(super) delta: GpuBuffer,
    pub(super) gate_up: GpuBuffer,
    pub(super) act: GpuBuffer,
    pub(super) normed: GpuBuffer,
    pub(super) logits: GpuBuffer,
    pub(super) ints: GpuBuffer,
    pub(super) ints_cap: usize,
    pub(super) media: Option<GpuBuffer>,
    pub(super) media_cap: usize,
}

/// Bytes of activation buffers for `rows` tokens and `logit_rows` logit rows (each rounded up
/// to whole GEMM chunks, as they are allocated).
pub(super) fn scratch_bytes(
    cfg: &LlamaConfig,
    dtype: GpuDType,
    rows: usize,
    logit_rows: usize,
) -> usize {
    let (rows, logit_rows) = (padded_rows(rows), padded_rows(logit_rows));
    let (h, f) = (cfg.hidden, cfg.ffn);
    let qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim;
    let q = cfg.n_heads * cfg.head_dim;
    let e = dtype.size();
    rows * (h * 4 + h * e + qkv * 4 + q * e + h * 4 + 2 * f * 4 + f * e)
        + logit_rows * (h * e + cfg.vocab * 4)
}

impl Scratch {
    pub(super) fn new(
        gpu: &Gpu,
        cfg: &LlamaConfig,
        dtype: GpuDType,
        rows: usize,
        logit_rows: usize,
    ) -> Result<Self> {
        let (h, f) = (cfg.hidden, cfg.ffn);
        let qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim;
        let q = cfg.n_heads * cfg.head_dim;
        let e = dtype.size();
        let a = |bytes: usize| gpu.alloc(bytes).map_err(gpu_err);
        Ok(Scratch {
            rows,
            logit_rows,
            x: a(rows * h * 4)?,
            h: a(rows * h * e)?,
            qkv: a(rows * qkv * 4)?,
            attn: a(rows * q * e)?,
            delta: a(rows * h * 4)?,
            gate_up: a(rows * 2 * f * 4)?,
            act: a(rows * f * e)?,
            normed: a(logit_rows * h * e)?,
            logits: a(logit_rows * cfg.vocab * 4)?,
            ints: a(4096 * 4)?,
            ints_cap: 4096,
            media: None,
            media_cap: 0,
        })
    }
}

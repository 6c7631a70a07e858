//! `rmsnorm.cu`: RMSNorm fused with the residual add.

use super::{grid_x, int, opt};
use crate::gpu::{Arg, DevicePtr, Gpu, GpuDType, GpuError, Launch, Result};

/// For each of `n_rows` rows: `x += delta` (when `delta` is set), then
/// `out = x · rsqrt(mean(x²) + eps) · weight`, stored as `dtype`.
///
/// With `delta_norm` set as well, `delta` is normed before the add:
/// `x += delta · rsqrt(mean(delta²) + eps) · delta_norm` (Gemma's post-attention and post-MLP
/// norms, which share `eps` with the others).
///
/// With `rows` set, output row `b` is computed from row `rows[b]` of `x` (and `delta`), and
/// only those rows of `x` are updated: the final norm uses it to take just the rows whose
/// logits are wanted. `x`, `delta` and the weights are f32; `out` is `n_rows × hidden` of
/// `dtype`.
#[derive(Debug, Clone, Copy)]
pub struct AddRmsNorm {
    pub dtype: GpuDType,
    pub x: DevicePtr,
    pub delta: Option<DevicePtr>,
    /// f32 `hidden`: the weight of a norm of `delta` before the add (needs `delta`).
    pub delta_norm: Option<DevicePtr>,
    pub weight: DevicePtr,
    pub out: DevicePtr,
    /// `n_rows` i32 row indices into `x`.
    pub rows: Option<DevicePtr>,
    pub n_rows: usize,
    pub hidden: usize,
    pub eps: f32,
}

impl AddRmsNorm {
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        if self.delta_norm.is_some() && self.delta.is_none() {
            return Err(GpuError::Invalid(
                "add_rmsnorm: a delta norm without a delta".into(),
            ));
        }
        gpu.launch(
            &format!("add_rmsnorm_{}", self.dtype.suffix()),
            Launch::new([grid_x("rows", self.n_rows)?, 1, 1], 256),
            &[
                Arg::Ptr(self.x),
                opt(self.delta),
                opt(self.delta_norm),
                Arg::Ptr(self.weight),
                Arg::Ptr(self.out),
                opt(self.rows),
                Arg::I32(int("hidden", self.hidden)?),
                Arg::F32(self.eps),
            ],
        )
    }
}

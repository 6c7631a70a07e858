//! Typed launchers, one per kernel job: each struct names a kernel's inputs and outputs (device
//! pointers, shapes, scalars) and `launch` checks the shapes it can and issues the kernel. The
//! engine's GPU model and the kernel tests call these, never `Gpu::launch` with raw argument
//! lists, so a kernel's signature has one owner on the host side.

mod attention;
mod elementwise;
mod norm;
mod sampling;

pub use attention::*;
pub use elementwise::*;
pub use norm::AddRmsNorm;
pub use sampling::*;

use super::{DevicePtr, GpuError, Result};

/// `Some(ptr)` as a kernel argument, `None` as a null pointer.
pub(crate) fn opt(p: Option<DevicePtr>) -> super::Arg {
    super::Arg::Ptr(p.unwrap_or(DevicePtr::NULL))
}

/// A dimension as a kernel's `int`.
pub(crate) fn int(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| GpuError::Invalid(format!("{what} = {v} does not fit an int")))
}

/// A grid dimension (`x` may be up to 2^31 - 1; `y` and `z` up to 65535).
pub(crate) fn grid_x(what: &str, v: usize) -> Result<u32> {
    if v == 0 {
        return Err(GpuError::Invalid(format!(
            "{what} is zero: nothing to launch"
        )));
    }
    u32::try_from(v)
        .ok()
        .filter(|&g| g < (1 << 31))
        .ok_or_else(|| GpuError::Invalid(format!("{what} = {v} is too many blocks")))
}

pub(crate) fn grid_yz(what: &str, v: usize) -> Result<u32> {
    if v == 0 || v > 65535 {
        return Err(GpuError::Invalid(format!(
            "{what} = {v} is outside a grid's 1..=65535"
        )));
    }
    Ok(v as u32)
}

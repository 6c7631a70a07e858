//! Whether a CUDA device can serve here, asked without creating a context: a missing driver
//! or library is an answer naming what is missing, never a panic (cudarc's loaders panic when
//! a library is absent, so each library is looked for first).

use super::DeviceInfo;

/// What `probe` says when the binary was built without the `cuda` feature.
pub const NOT_BUILT: &str =
    "this build has no CUDA support (it was built without the `cuda` feature)";

/// The outcome of [`probe`].
#[derive(Debug, Clone, PartialEq)]
pub enum Availability {
    /// The device exists and the driver, NVRTC and cuBLAS are loadable.
    Ready(DeviceInfo),
    /// Why CUDA cannot serve, in one line naming what is missing.
    Missing(String),
}

/// Look for CUDA device `ordinal` and the libraries the backend needs.
pub fn probe(ordinal: usize) -> Availability {
    match imp::probe(ordinal) {
        Ok(info) => Availability::Ready(info),
        Err(why) => Availability::Missing(why),
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    pub(super) fn probe(_ordinal: usize) -> Result<super::DeviceInfo, String> {
        Err(super::NOT_BUILT.to_string())
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use cudarc::driver::{result, sys};

    use crate::gpu::{BackendKind, DeviceInfo};

    pub(super) fn probe(ordinal: usize) -> Result<DeviceInfo, String> {
        // SAFETY: only tries to open the library; no symbol is called.
        if !unsafe { sys::is_culib_present() } {
            return Err("no NVIDIA driver: libcuda.so.1 could not be loaded".into());
        }
        result::init().map_err(|e| format!("the NVIDIA driver did not initialise: {e}"))?;
        let count = result::device::get_count()
            .map_err(|e| format!("the NVIDIA driver cannot count devices: {e}"))?;
        if count <= 0 {
            return Err("no CUDA device: the NVIDIA driver reports none".into());
        }
        if ordinal >= count as usize {
            return Err(format!(
                "no CUDA device {ordinal}: the NVIDIA driver reports {count} (cuda:0 to cuda:{})",
                count - 1
            ));
        }
        let info = device_info(ordinal).map_err(|e| format!("CUDA device {ordinal}: {e}"))?;
        // SAFETY: as above, these only try to open the libraries.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(
                "NVRTC (libnvrtc.so.13) could not be loaded: put the CUDA 13 toolkit's \
                 lib64 folder (or the nvidia-cuda-nvrtc wheel's lib folder) on LD_LIBRARY_PATH"
                    .into(),
            );
        }
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(
                "cuBLAS (libcublas.so.13) could not be loaded: put the CUDA 13 \
                 toolkit's lib64 folder on LD_LIBRARY_PATH"
                    .into(),
            );
        }
        Ok(info)
    }

    fn device_info(ordinal: usize) -> Result<DeviceInfo, result::DriverError> {
        let dev = result::device::get(ordinal as i32)?;
        // SAFETY: `dev` is a valid device handle from the driver.
        let (major, minor, total) = unsafe {
            (
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                )?,
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                )?,
                result::device::total_mem(dev)?,
            )
        };
        let mut version = 0i32;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut version) }.result()?;
        Ok(DeviceInfo {
            kind: BackendKind::Cuda,
            ordinal,
            name: result::device::get_name(dev)?,
            compute_capability: (major.max(0) as u32, minor.max(0) as u32),
            total_memory: total,
            driver_version: version.max(0) as u32,
        })
    }
}

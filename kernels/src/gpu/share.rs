//! Device memory shared between processes: one process allocates an exportable region and
//! passes its handle (a file descriptor) to others, which map the same memory and read it in
//! place. The weight cache uses it to hand a model's converted device weights from the
//! `preload` daemon to engines, so an engine's start copies nothing to the device.
//!
//! What a backend does underneath is behind [`super::Backend::alloc_exportable`],
//! [`super::Backend::import`] and [`super::Backend::release_shared`]: CUDA's virtual memory
//! management (a POSIX-fd shareable handle) on a GPU, a memfd mapped shared in the emulator.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::{DevicePtr, Gpu, GpuBuffer, GpuError, Result};

/// Offsets of packed buffers are multiples of this: what cuBLAS and the kernels' vector loads
/// want of a device pointer, as `cuMemAlloc` gives it.
pub const SLOT_ALIGN: usize = 256;

/// A region of shared device memory: exported by this process (it holds the handle others
/// map) or imported from another. Unmapped and released when the last view of it goes.
pub struct SharedRegion {
    gpu: Gpu,
    ptr: DevicePtr,
    bytes: usize,
    handle: Option<OwnedFd>,
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("device", &self.gpu.info().label())
            .field("ptr", &format_args!("{:#x}", self.ptr.0))
            .field("bytes", &self.bytes)
            .field("exported", &self.handle.is_some())
            .finish()
    }
}

impl SharedRegion {
    /// At least `bytes` of exportable memory on `gpu`.
    pub fn export(gpu: &Gpu, bytes: usize) -> Result<Self> {
        let (ptr, bytes, handle) = gpu.backend().alloc_exportable(bytes.max(1))?;
        Ok(SharedRegion {
            gpu: gpu.clone(),
            ptr,
            bytes,
            handle: Some(handle),
        })
    }

    /// The region another process exported as `handle`, `bytes` long, mapped on `gpu`.
    pub fn import(gpu: &Gpu, handle: BorrowedFd<'_>, bytes: usize) -> Result<Self> {
        let ptr = gpu.backend().import(handle, bytes)?;
        Ok(SharedRegion {
            gpu: gpu.clone(),
            ptr,
            bytes,
            handle: None,
        })
    }

    /// The handle to pass to other processes (`None` for an imported region).
    pub fn handle(&self) -> Option<BorrowedFd<'_>> {
        self.handle.as_ref().map(AsFd::as_fd)
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// `bytes` at `offset` of the region as a buffer that keeps the region mapped.
    pub fn view(self: &Arc<Self>, offset: usize, bytes: usize) -> Result<GpuBuffer> {
        if offset.checked_add(bytes).is_none_or(|end| end > self.bytes) {
            return Err(GpuError::Invalid(format!(
                "a view of {bytes} bytes at {offset} passes the end of a {}-byte shared region",
                self.bytes
            )));
        }
        Ok(GpuBuffer {
            ptr: self.ptr.offset(offset),
            bytes,
            gpu: self.gpu.clone(),
            region: Some(self.clone()),
        })
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: the region owns the mapping, and every view holds the region, so none is
        // left to use it.
        unsafe { self.gpu.backend().release_shared(self.ptr, self.bytes) }
    }
}

/// One named buffer inside a packed region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    pub offset: usize,
    pub bytes: usize,
}

/// Named buffers laid out in one shared region.
#[derive(Debug, Clone)]
pub struct PackedWeights {
    pub region: Arc<SharedRegion>,
    pub slots: Vec<Slot>,
}

impl PackedWeights {
    /// Copies `buffers` (device to device) into one new exportable region, each at an offset
    /// that is a multiple of [`SLOT_ALIGN`], in the given order.
    pub fn pack(gpu: &Gpu, buffers: &[(String, &GpuBuffer)]) -> Result<Self> {
        let mut slots = Vec::with_capacity(buffers.len());
        let mut end = 0usize;
        for (name, b) in buffers {
            let offset = end.next_multiple_of(SLOT_ALIGN);
            slots.push(Slot {
                name: name.clone(),
                offset,
                bytes: b.len_bytes(),
            });
            end = offset + b.len_bytes();
        }
        let region = Arc::new(SharedRegion::export(gpu, end)?);
        for (slot, (_, b)) in slots.iter().zip(buffers) {
            gpu.copy(region.ptr().offset(slot.offset), b.ptr(), slot.bytes)?;
        }
        gpu.synchronize()?;
        Ok(PackedWeights { region, slots })
    }

    /// The slots of another process's region, imported on `gpu` from its `handle`. Every slot
    /// must lie inside the region.
    pub fn import(
        gpu: &Gpu,
        handle: BorrowedFd<'_>,
        bytes: usize,
        slots: Vec<Slot>,
    ) -> Result<Self> {
        if let Some(s) = slots
            .iter()
            .find(|s| s.offset.checked_add(s.bytes).is_none_or(|e| e > bytes))
        {
            return Err(GpuError::Invalid(format!(
                "slot {} ({} bytes at {}) passes the end of the {bytes}-byte region",
                s.name, s.bytes, s.offset
            )));
        }
        let region = Arc::new(SharedRegion::import(gpu, handle, bytes)?);
        Ok(PackedWeights { region, slots })
    }

    /// Slot `name` as a buffer, which must be `bytes` long: a layout that does not fit the
    /// model asking is refused by name rather than read out of place.
    pub fn take(&self, name: &str, bytes: usize) -> Result<GpuBuffer> {
        let slot =
            self.slots.iter().find(|s| s.name == name).ok_or_else(|| {
                GpuError::Invalid(format!("no slot {name} in the shared weights"))
            })?;
        if slot.bytes != bytes {
            return Err(GpuError::Invalid(format!(
                "slot {name} holds {} bytes; the model expects {bytes}",
                slot.bytes
            )));
        }
        self.region.view(slot.offset, slot.bytes)
    }

    /// Bytes of the region.
    pub fn len_bytes(&self) -> usize {
        self.region.len_bytes()
    }
}

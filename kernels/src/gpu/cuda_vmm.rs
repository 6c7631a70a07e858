//! Device memory shared between processes on CUDA, through the driver's virtual memory
//! management: the exporter creates physical memory with a POSIX-fd shareable handle
//! (`cuMemCreate`, `cuMemExportToShareableHandle`) and maps it; an importer turns the fd it
//! received over a Unix socket back into the allocation (`cuMemImportFromShareableHandle`)
//! and maps it into an address range of its own (`cuMemAddressReserve`, `cuMemMap`,
//! `cuMemSetAccess`). Both drop their allocation handle once mapped: the physical memory lives
//! until the last mapping of any process is unmapped.
//!
//! Callers bind the device's context first. Legacy IPC handles (`cuIpcGetMemHandle`) are not
//! used: they need the memory from `cuMemAlloc` and give the importer no say on the mapping.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys;

use super::{DevicePtr, GpuError, Result};

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| GpuError::Driver {
        call,
        message: format!("{e:?}"),
    })
}

fn location(ordinal: usize) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal as c_int,
    }
}

fn properties(ordinal: usize) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct, all zero meaning "defaults" to the driver.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = POSIX_FD;
    prop.location = location(ordinal);
    prop
}

/// `bytes` rounded up to the device's allocation granularity.
fn granular(ordinal: usize, bytes: usize) -> Result<usize> {
    let prop = properties(ordinal);
    let mut g = 0usize;
    // SAFETY: `prop` and `g` are valid for the call.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(bytes.next_multiple_of(g.max(1)))
}

/// Maps `handle` (`bytes` long) at a new address range with read-write access for the device,
/// then drops the handle; on failure nothing is left reserved or held.
fn map(
    ordinal: usize,
    handle: sys::CUmemGenericAllocationHandle,
    bytes: usize,
) -> Result<DevicePtr> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: every call gets valid pointers; each failure undoes the steps before it.
    unsafe {
        let done = check(
            "cuMemAddressReserve",
            sys::cuMemAddressReserve(&mut ptr, bytes, 0, 0, 0),
        )
        .and_then(|()| {
            check("cuMemMap", sys::cuMemMap(ptr, bytes, 0, handle, 0)).inspect_err(|_| {
                sys::cuMemAddressFree(ptr, bytes);
            })
        })
        .and_then(|()| {
            // Read-write: read-only device mappings are not supported everywhere, and the
            // engine's kernels never write weights (the emulator's twin enforces read-only).
            let access = sys::CUmemAccessDesc {
                location: location(ordinal),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            check(
                "cuMemSetAccess",
                sys::cuMemSetAccess(ptr, bytes, &access, 1),
            )
            .inspect_err(|_| {
                sys::cuMemUnmap(ptr, bytes);
                sys::cuMemAddressFree(ptr, bytes);
            })
        });
        sys::cuMemRelease(handle);
        done.map(|()| DevicePtr(ptr))
    }
}

/// Exportable memory on device `ordinal`: its address, its size (rounded up to the
/// granularity) and its POSIX-fd handle.
pub(crate) fn export(ordinal: usize, bytes: usize) -> Result<(DevicePtr, usize, OwnedFd)> {
    let bytes = granular(ordinal, bytes)?;
    let prop = properties(ordinal);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid pointers; the handle is released below on failure or by `map`.
    check("cuMemCreate", unsafe {
        sys::cuMemCreate(&mut handle, bytes, &prop, 0)
    })?;
    let mut fd: c_int = -1;
    // SAFETY: for a POSIX-fd handle the driver writes an int.
    let exported = check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut c_int).cast::<c_void>(),
            handle,
            POSIX_FD,
            0,
        )
    });
    if let Err(e) = exported {
        // SAFETY: the handle is ours and unmapped.
        unsafe { sys::cuMemRelease(handle) };
        return Err(e);
    }
    // SAFETY: the driver gave us this new descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let ptr = map(ordinal, handle, bytes)?;
    Ok((ptr, bytes, fd))
}

/// Maps memory another process exported as `fd` (`bytes`, as rounded there) on `ordinal`.
pub(crate) fn import(ordinal: usize, fd: BorrowedFd<'_>, bytes: usize) -> Result<DevicePtr> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: for a POSIX-fd handle the driver takes the descriptor's value as the pointer;
    // it duplicates what it needs, so `fd` stays the caller's.
    check("cuMemImportFromShareableHandle", unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            fd.as_raw_fd() as usize as *mut c_void,
            POSIX_FD,
        )
    })?;
    map(ordinal, handle, bytes)
}

/// Unmaps a range of [`export`] or [`import`] and frees its addresses.
///
/// # Safety
/// `ptr` and `bytes` are one such range, used no more.
pub(crate) unsafe fn release(ptr: DevicePtr, bytes: usize) {
    // SAFETY: the caller's promise.
    let r = unsafe { sys::cuMemUnmap(ptr.0, bytes) };
    if let Err(e) = check("cuMemUnmap", r) {
        tracing::warn!("{e}");
    }
    // SAFETY: as above; the range is unmapped.
    let r = unsafe { sys::cuMemAddressFree(ptr.0, bytes) };
    if let Err(e) = check("cuMemAddressFree", r) {
        tracing::warn!("{e}");
    }
}

//! The CPU emulator backend: the kernel sources compiled with g++ (see `build.rs` and
//! `cuda/emu/`), host memory standing in for device memory, and a plain f32-accumulating GEMM
//! in place of cuBLAS.
//!
//! Besides running the kernels, it checks what a GPU would silently get wrong: every pointer a
//! kernel receives must point into a live allocation, every copy must stay inside one, and each
//! allocation is fenced by guard bytes that are checked after every launch, so a kernel that
//! writes out of bounds fails the launch that did it. New allocations are filled with 0xFF
//! (NaN in every float type) so reads of unwritten memory show.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Mutex;

use rayon::prelude::*;

use super::bringup::{Opener, Opening};
use super::sources::SOURCES;
use super::{
    Arg, Backend, BackendKind, DeviceInfo, DevicePtr, Gemm, GpuDType, GpuError, Launch, Result,
};

extern "C" {
    fn gateway_emu_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        smem: u32,
        args: *mut *mut c_void,
        sizes: *const u32,
        nargs: u32,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn gateway_emu_kernel_count() -> u32;
    fn gateway_emu_kernel_name(i: u32) -> *const c_char;
}

/// The kernels the emulator registered (every `EMU_KERNEL` line), sorted.
pub fn emulated_kernels() -> Vec<String> {
    // SAFETY: the table is filled by static initialisers before main and never changes; each
    // name is a NUL-terminated string owned by the table.
    unsafe {
        (0..gateway_emu_kernel_count())
            .filter_map(|i| {
                let p = gateway_emu_kernel_name(i);
                (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
            })
            .collect()
    }
}

/// Opens the emulator as the engine opens a CUDA device, step by step. Its compile step checks
/// that every kernel of every source is emulated, as NVRTC would find each entry point.
#[derive(Debug, Clone, Copy, Default)]
pub struct EmuOpener;

impl Opener for EmuOpener {
    fn begin(&self, _ordinal: usize) -> Box<dyn Opening> {
        Box::new(EmuOpening)
    }
}

struct EmuOpening;

impl Opening for EmuOpening {
    fn probe(&mut self) -> Result<()> {
        Ok(())
    }

    fn context(&mut self) -> Result<()> {
        Ok(())
    }

    fn compile(&mut self) -> Result<()> {
        let emulated = emulated_kernels();
        for src in SOURCES {
            if let Some(k) = src
                .kernels()
                .into_iter()
                .find(|k| !emulated.iter().any(|e| e == k))
            {
                return Err(GpuError::Compile {
                    file: src.file.into(),
                    arch: "emulator".into(),
                    log: format!("kernel {k} has no emulated twin"),
                });
            }
        }
        Ok(())
    }

    fn load_modules(&mut self) -> Result<()> {
        Ok(())
    }

    fn blas(&mut self) -> Result<()> {
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<std::sync::Arc<dyn Backend>> {
        Ok(std::sync::Arc::new(EmuBackend::new()))
    }
}

const GUARD: usize = 256;
const GUARD_BYTE: u8 = 0xA5;
const NOMINAL_MEMORY: usize = 16 << 30;

struct Allocation {
    bytes: usize,
    memory: Memory,
}

/// Where an allocation's bytes live.
enum Memory {
    /// Private heap memory with guard bytes on either side.
    Heap {
        layout: std::alloc::Layout,
        base: *mut u8,
    },
    /// A shared mapping of a memfd ([`super::share`]): exported (writable) or imported from
    /// another process (read-only: the backend refuses to write it, and a kernel that did
    /// would fault). No guard bytes: the bytes are the other process's too.
    Shared {
        _map: memmap2::MmapRaw,
        writable: bool,
    },
}

// SAFETY: the raw pointer is only an address of memory this backend owns; access to the table
// is behind a mutex.
unsafe impl Send for Allocation {}

pub(crate) struct EmuBackend {
    info: DeviceInfo,
    allocations: Mutex<BTreeMap<u64, Allocation>>,
}

impl EmuBackend {
    pub(crate) fn new() -> Self {
        EmuBackend {
            info: DeviceInfo {
                kind: BackendKind::Emulated,
                ordinal: 0,
                name: "CPU emulator".into(),
                compute_capability: (9, 0),
                total_memory: NOMINAL_MEMORY,
                driver_version: 0,
            },
            allocations: Mutex::new(BTreeMap::new()),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Allocation>> {
        self.allocations.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks that `[ptr, ptr + bytes)` lies inside one live allocation.
    fn check_range(&self, ptr: DevicePtr, bytes: usize, what: &str) -> Result<()> {
        self.check_access(ptr, bytes, what, false)
    }

    /// [`Self::check_range`] for a write: an imported shared region is read-only.
    fn check_write(&self, ptr: DevicePtr, bytes: usize, what: &str) -> Result<()> {
        self.check_access(ptr, bytes, what, true)
    }

    fn check_access(&self, ptr: DevicePtr, bytes: usize, what: &str, write: bool) -> Result<()> {
        let table = self.table();
        let Some(a) = table
            .range(..=ptr.0)
            .next_back()
            .filter(|(&start, a)| ptr.0 + bytes as u64 <= start + a.bytes as u64)
            .map(|(_, a)| a)
        else {
            return Err(GpuError::Invalid(format!(
                "{what}: {bytes} bytes at {:#x} are not inside one device allocation",
                ptr.0
            )));
        };
        if write
            && matches!(
                a.memory,
                Memory::Shared {
                    writable: false,
                    ..
                }
            )
        {
            return Err(GpuError::Invalid(format!(
                "{what}: {bytes} bytes at {:#x} are in memory mapped read-only from another process",
                ptr.0
            )));
        }
        Ok(())
    }

    fn insert_shared(&self, map: memmap2::MmapRaw, bytes: usize, writable: bool) -> DevicePtr {
        let ptr = map.as_mut_ptr() as u64;
        self.table().insert(
            ptr,
            Allocation {
                bytes,
                memory: Memory::Shared {
                    _map: map,
                    writable,
                },
            },
        );
        DevicePtr(ptr)
    }

    fn check_guards(&self) -> std::result::Result<(), String> {
        let table = self.table();
        for (&start, a) in table.iter() {
            let Memory::Heap { base, .. } = a.memory else {
                continue;
            };
            // SAFETY: the guard bytes belong to this live allocation.
            let (front, back) = unsafe {
                (
                    std::slice::from_raw_parts(base, GUARD),
                    std::slice::from_raw_parts(base.add(GUARD + a.bytes), GUARD),
                )
            };
            if let Some(i) = back.iter().position(|&b| b != GUARD_BYTE) {
                return Err(format!(
                    "wrote {i} bytes past the end of the {}-byte allocation at {start:#x}",
                    a.bytes
                ));
            }
            if let Some(i) = front.iter().rposition(|&b| b != GUARD_BYTE) {
                return Err(format!(
                    "wrote {} bytes before the start of the {}-byte allocation at {start:#x}",
                    GUARD - i,
                    a.bytes
                ));
            }
        }
        Ok(())
    }
}

impl Backend for EmuBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let total = bytes
            .div_ceil(GUARD)
            .checked_mul(GUARD)
            .and_then(|b| b.checked_add(2 * GUARD))
            .ok_or(GpuError::OutOfMemory {
                requested: bytes,
                free: 0,
            })?;
        let layout = std::alloc::Layout::from_size_align(total, GUARD)
            .map_err(|e| GpuError::Invalid(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc(layout) };
        if base.is_null() {
            return Err(GpuError::OutOfMemory {
                requested: bytes,
                free: 0,
            });
        }
        // SAFETY: `base` points at `total` writable bytes.
        unsafe {
            std::ptr::write_bytes(base, GUARD_BYTE, GUARD);
            std::ptr::write_bytes(base.add(GUARD), 0xFF, bytes);
            std::ptr::write_bytes(base.add(GUARD + bytes), GUARD_BYTE, total - GUARD - bytes);
        }
        let ptr = base as u64 + GUARD as u64;
        self.table().insert(
            ptr,
            Allocation {
                bytes,
                memory: Memory::Heap { layout, base },
            },
        );
        Ok(DevicePtr(ptr))
    }

    unsafe fn free(&self, ptr: DevicePtr) {
        if let Some(a) = self.table().remove(&ptr.0) {
            release(a);
        }
    }

    fn alloc_exportable(&self, bytes: usize) -> Result<(DevicePtr, usize, OwnedFd)> {
        let fail = |what: &str, e: std::io::Error| GpuError::Driver {
            call: "emulated export",
            message: format!("{what}: {e}"),
        };
        let fd =
            rustix::fs::memfd_create("gateway-device-weights", rustix::fs::MemfdFlags::CLOEXEC)
                .map_err(|e| fail("memfd_create", e.into()))?;
        let file = std::fs::File::from(fd);
        file.set_len(bytes as u64)
            .map_err(|e| fail("cannot size the memfd", e))?;
        let map = memmap2::MmapOptions::new()
            .len(bytes)
            .map_raw(&file)
            .map_err(|e| fail("cannot map the memfd", e))?;
        // SAFETY: `bytes` writable bytes, mapped above; unwritten memory reads as NaN, as `alloc`'s.
        unsafe { std::ptr::write_bytes(map.as_mut_ptr(), 0xFF, bytes) };
        Ok((
            self.insert_shared(map, bytes, true),
            bytes,
            OwnedFd::from(file),
        ))
    }

    fn import(&self, handle: BorrowedFd<'_>, bytes: usize) -> Result<DevicePtr> {
        let fail = |message: String| GpuError::Driver {
            call: "emulated import",
            message,
        };
        let file = std::fs::File::from(
            handle
                .try_clone_to_owned()
                .map_err(|e| fail(format!("cannot duplicate the handle: {e}")))?,
        );
        let len = file
            .metadata()
            .map_err(|e| fail(format!("cannot stat the handle: {e}")))?
            .len();
        if len < bytes as u64 {
            return Err(fail(format!(
                "the shared memory holds {len} bytes, {bytes} were announced"
            )));
        }
        let map = memmap2::MmapOptions::new()
            .len(bytes)
            .map_raw_read_only(&file)
            .map_err(|e| fail(format!("cannot map the shared memory: {e}")))?;
        Ok(self.insert_shared(map, bytes, false))
    }

    unsafe fn release_shared(&self, ptr: DevicePtr, _bytes: usize) {
        if let Some(a) = self.table().remove(&ptr.0) {
            release(a);
        }
    }

    fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.check_write(dst, src.len(), "upload")?;
        // SAFETY: the range lies inside a live allocation (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.0 as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        self.check_range(src, dst.len(), "download")?;
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(src.0 as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.check_write(dst, bytes, "copy destination")?;
        self.check_range(src, bytes, "copy source")?;
        // SAFETY: both ranges lie inside live allocations; `copy` allows overlap.
        unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, bytes) };
        Ok(())
    }

    fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.check_write(dst, bytes, "memset")?;
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(dst.0 as *mut u8, byte, bytes) };
        Ok(())
    }

    fn launch(&self, kernel: &str, shape: Launch, args: &[Arg]) -> Result<()> {
        let fail = |message: String| GpuError::Launch {
            kernel: kernel.to_string(),
            message,
        };
        for (i, a) in args.iter().enumerate() {
            if let Arg::Ptr(p) = a {
                if !p.is_null() {
                    self.check_range(*p, 0, &format!("argument {i}"))
                        .map_err(|e| fail(e.to_string()))?;
                }
            }
        }
        let name = CString::new(kernel).map_err(|e| fail(e.to_string()))?;
        let mut slots: Vec<[u8; 8]> = Vec::with_capacity(args.len());
        let mut sizes: Vec<u32> = Vec::with_capacity(args.len());
        for a in args {
            let (b, n) = a.bytes();
            slots.push(b);
            sizes.push(n as u32);
        }
        let mut ptrs: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s.as_mut_ptr().cast::<c_void>())
            .collect();
        let block = [shape.block, 1, 1];
        let mut err = vec![0 as c_char; 512];
        // SAFETY: every pointer argument was checked to point into a live allocation, the
        // runtime checks the argument count and sizes against the kernel's signature, and the
        // slots outlive the call.
        let rc = unsafe {
            gateway_emu_launch(
                name.as_ptr(),
                shape.grid.as_ptr(),
                block.as_ptr(),
                shape.shared_bytes,
                ptrs.as_mut_ptr(),
                sizes.as_ptr(),
                args.len() as u32,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if rc != 0 {
            // SAFETY: the runtime NUL-terminates the message within the buffer.
            let msg = unsafe { CStr::from_ptr(err.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            return Err(fail(msg));
        }
        self.check_guards().map_err(fail)
    }

    fn gemm(&self, g: &Gemm) -> Result<()> {
        let es = g.dtype.size();
        if g.lda < g.k || g.ldb < g.k || g.ldc < g.n {
            return Err(GpuError::Invalid(format!("gemm strides too small: {g:?}")));
        }
        if g.m == 0 || g.n == 0 {
            return Ok(());
        }
        self.check_range(g.a, ((g.m - 1) * g.lda + g.k) * es, "gemm A")?;
        self.check_range(g.b, ((g.n - 1) * g.ldb + g.k) * es, "gemm B")?;
        self.check_write(g.c, ((g.m - 1) * g.ldc + g.n) * 4, "gemm C")?;
        let load = |p: DevicePtr, i: usize| -> f32 {
            // SAFETY: every index read is inside the ranges checked above.
            unsafe {
                match g.dtype {
                    GpuDType::F32 => *(p.0 as *const f32).add(i),
                    GpuDType::BF16 => (*(p.0 as *const half::bf16).add(i)).to_f32(),
                    GpuDType::F16 => (*(p.0 as *const half::f16).add(i)).to_f32(),
                }
            }
        };
        let b: Vec<f32> = (0..g.n)
            .flat_map(|j| (0..g.k).map(move |l| (j, l)))
            .map(|(j, l)| load(g.b, j * g.ldb + l))
            .collect();
        let c = g.c.0 as usize;
        (0..g.m).into_par_iter().for_each(|i| {
            let a: Vec<f32> = (0..g.k).map(|l| load(g.a, i * g.lda + l)).collect();
            // The zero padding rows of the decoder's fixed-size GEMM chunks (`ops::gemm`) are
            // most of a small step's rows: their products are zeros, not worth the emulator's
            // time.
            let zero_row = a.iter().all(|&x| x == 0.0);
            for j in 0..g.n {
                let dot: f32 = if zero_row {
                    0.0
                } else {
                    a.iter()
                        .zip(&b[j * g.k..(j + 1) * g.k])
                        .map(|(x, y)| x * y)
                        .sum()
                };
                // SAFETY: row i of C is written by this task only, inside the checked range.
                unsafe {
                    let out = (c as *mut f32).add(i * g.ldc + j);
                    *out = if g.beta == 0.0 {
                        g.alpha * dot
                    } else {
                        g.alpha * dot + g.beta * *out
                    };
                }
            }
        });
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn memory(&self) -> Result<(usize, usize)> {
        let used: usize = self.table().values().map(|a| a.bytes).sum();
        Ok((NOMINAL_MEMORY.saturating_sub(used), NOMINAL_MEMORY))
    }
}

impl Drop for EmuBackend {
    fn drop(&mut self) {
        let table = std::mem::take(&mut *self.table());
        table.into_values().for_each(release);
    }
}

/// Frees an allocation taken out of the table (a shared one is unmapped as its map drops).
fn release(a: Allocation) {
    if let Memory::Heap { layout, base } = a.memory {
        // SAFETY: allocated in `alloc` with this layout, and out of the table, so freed once.
        unsafe { std::alloc::dealloc(base, layout) };
    }
}

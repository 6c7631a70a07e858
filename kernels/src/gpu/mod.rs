//! The GPU side of the kernels: device memory, kernel launches and GEMMs behind one handle,
//! [`Gpu`], whatever runs them.
//!
//! Two backends implement [`Backend`]:
//! - `cuda` (feature `cuda`): an NVIDIA GPU through the driver API (cudarc, loaded at run
//!   time, so the build needs no toolkit), kernels compiled by NVRTC for the device's own
//!   architecture, GEMMs through cuBLAS;
//! - `emu` (feature `emu`): the same kernel sources compiled for the CPU and run by a fiber
//!   emulator, with host memory as "device" memory. It exists so that tests check the kernels
//!   and the GPU model code on machines without a GPU; it is never a serving backend.
//!
//! Kernel sources live in `kernels/cuda/*.cu` (one file per job, see [`sources`]). Device
//! pointers are plain addresses ([`DevicePtr`]); a [`GpuBuffer`] owns one allocation and frees
//! it when dropped. All work goes to one in-order stream per backend, so launches, copies and
//! GEMMs run in the order they are issued.

pub mod blas_map;
pub mod bringup;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_blas;
#[cfg(feature = "cuda")]
mod cuda_vmm;
#[cfg(feature = "emu")]
mod emu;
#[cfg(feature = "cuda")]
pub mod nvrtc;
pub mod ops;
mod probe;
pub mod share;
pub mod sources;

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

pub use probe::{probe, Availability, NOT_BUILT};

#[cfg(feature = "emu")]
pub use emu::{emulated_kernels, EmuOpener};
#[cfg(feature = "fault-inject")]
pub mod inject;

pub use bringup::{CudaOpener, Opener, Step, StepError};
pub use share::{PackedWeights, SharedRegion, Slot};

/// A device address. In the emulator it is a host address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    pub const NULL: DevicePtr = DevicePtr(0);

    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }

    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

/// Errors of the GPU layer. Each names what failed, so a start-up error can be one line.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No usable device: names what is missing (driver, device, NVRTC, cuBLAS) or that this
    /// build has no CUDA support.
    #[error("{0}")]
    Unavailable(String),
    /// A driver call failed.
    #[error("CUDA {call} failed: {message}")]
    Driver { call: &'static str, message: String },
    /// NVRTC could not compile a kernel source.
    #[error("NVRTC could not compile {file} for {arch}: {log}")]
    Compile {
        file: String,
        arch: String,
        log: String,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS {call} failed: {message}")]
    Blas { call: &'static str, message: String },
    /// An allocation did not fit in device memory.
    #[error("out of device memory: {requested} bytes requested, {free} free")]
    OutOfMemory { requested: usize, free: usize },
    /// A launch was refused or a kernel broke a rule (the emulator checks these).
    #[error("kernel {kernel}: {message}")]
    Launch { kernel: String, message: String },
    /// A caller passed inconsistent sizes or shapes.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// Element types of GEMM operands and device tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuDType {
    F32,
    BF16,
    F16,
}

impl GpuDType {
    pub const fn size(self) -> usize {
        match self {
            GpuDType::F32 => 4,
            GpuDType::BF16 | GpuDType::F16 => 2,
        }
    }

    /// The suffix of the kernel instantiations for this type (`rmsnorm_bf16`, ...).
    pub const fn suffix(self) -> &'static str {
        match self {
            GpuDType::F32 => "f32",
            GpuDType::BF16 => "bf16",
            GpuDType::F16 => "f16",
        }
    }

    /// vLLM's name for the type (`--dtype`).
    pub const fn name(self) -> &'static str {
        match self {
            GpuDType::F32 => "float32",
            GpuDType::BF16 => "bfloat16",
            GpuDType::F16 => "float16",
        }
    }
}

impl fmt::Display for GpuDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A kernel parameter, passed by value as `cuLaunchKernel` expects.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    Ptr(DevicePtr),
    I32(i32),
    U32(u32),
    F32(f32),
    I64(i64),
    U64(u64),
}

impl Arg {
    /// The value's bytes, in a slot of 8, and its size.
    #[cfg_attr(not(any(feature = "cuda", feature = "emu")), allow(dead_code))]
    pub(crate) fn bytes(self) -> ([u8; 8], usize) {
        let mut b = [0u8; 8];
        let n = match self {
            Arg::Ptr(p) => {
                b.copy_from_slice(&p.0.to_ne_bytes());
                8
            }
            Arg::U64(v) => {
                b.copy_from_slice(&v.to_ne_bytes());
                8
            }
            Arg::I64(v) => {
                b.copy_from_slice(&v.to_ne_bytes());
                8
            }
            Arg::I32(v) => {
                b[..4].copy_from_slice(&v.to_ne_bytes());
                4
            }
            Arg::U32(v) => {
                b[..4].copy_from_slice(&v.to_ne_bytes());
                4
            }
            Arg::F32(v) => {
                b[..4].copy_from_slice(&v.to_ne_bytes());
                4
            }
        };
        (b, n)
    }
}

impl From<DevicePtr> for Arg {
    fn from(p: DevicePtr) -> Self {
        Arg::Ptr(p)
    }
}

impl From<&GpuBuffer> for Arg {
    fn from(b: &GpuBuffer) -> Self {
        Arg::Ptr(b.ptr())
    }
}

/// Grid and block shape of a launch (blocks are one-dimensional).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub grid: [u32; 3],
    pub block: u32,
    pub shared_bytes: u32,
}

impl Launch {
    pub fn new(grid: [u32; 3], block: u32) -> Self {
        Launch {
            grid,
            block,
            shared_bytes: 0,
        }
    }

    pub fn with_shared(mut self, bytes: u32) -> Self {
        self.shared_bytes = bytes;
        self
    }
}

/// `C = alpha · A · Bᵀ + beta · C`, row-major: `A` is `m × k` (row stride `lda`), `B` is
/// `n × k` (a weight stored `out × in`, stride `ldb`), `C` is `m × n` f32 (stride `ldc`). `A`
/// and `B` hold `dtype`; products accumulate in f32 (for f32 operands: full f32, no TF32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: GpuDType,
    pub a: DevicePtr,
    pub lda: usize,
    pub b: DevicePtr,
    pub ldb: usize,
    pub c: DevicePtr,
    pub ldc: usize,
    pub alpha: f32,
    pub beta: f32,
}

/// What kind of machine runs the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cuda,
    Emulated,
}

/// Facts about the device, for logs, the model card and sizing.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub kind: BackendKind,
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (9, 0 on an H100/H200).
    pub compute_capability: (u32, u32),
    pub total_memory: usize,
    /// The driver's CUDA version as `major * 1000 + minor * 10` (0 in the emulator).
    pub driver_version: u32,
}

impl DeviceInfo {
    /// `cuda:0`, or `emu:0` for the emulator.
    pub fn label(&self) -> String {
        match self.kind {
            BackendKind::Cuda => format!("cuda:{}", self.ordinal),
            BackendKind::Emulated => format!("emu:{}", self.ordinal),
        }
    }

    /// The NVRTC target for this device, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// The size of one staged chunk of a large upload.
pub const UPLOAD_CHUNK: usize = 32 << 20;

/// What a GPU backend provides. All work is ordered on one stream; `download` and
/// `synchronize` wait for it.
pub trait Backend: Send + Sync {
    fn info(&self) -> &DeviceInfo;
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// # Safety
    /// `ptr` came from `alloc` of this backend and is not used afterwards.
    unsafe fn free(&self, ptr: DevicePtr);
    /// Copy host bytes to the device; the host slice may be reused when this returns.
    fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;
    /// Copy device bytes to the host, after all earlier work.
    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()>;
    /// Fill `bytes` at `dst` from a producer: `fill(offset, chunk)` writes bytes
    /// `offset..offset + chunk.len()` of the data into `chunk`. Backends may overlap producing
    /// the next chunk with copying the last (CUDA stages through pinned buffers).
    fn upload_with(
        &self,
        dst: DevicePtr,
        bytes: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let mut chunk = vec![0u8; bytes.min(UPLOAD_CHUNK)];
        let mut off = 0;
        while off < bytes {
            let n = (bytes - off).min(UPLOAD_CHUNK);
            fill(off, &mut chunk[..n])?;
            self.upload(dst.offset(off), &chunk[..n])?;
            off += n;
        }
        Ok(())
    }
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()>;
    fn launch(&self, kernel: &str, shape: Launch, args: &[Arg]) -> Result<()>;
    fn gemm(&self, g: &Gemm) -> Result<()>;
    fn synchronize(&self) -> Result<()>;
    /// (free, total) bytes of device memory.
    fn memory(&self) -> Result<(usize, usize)>;
    /// Allocate at least `bytes` of device memory that another process can map, and the
    /// handle that lets it: a file descriptor (a CUDA VMM POSIX-fd shareable handle, or the
    /// emulator's memfd) to pass over a Unix socket. Returns the address, the bytes really
    /// allocated (rounded up to the backend's granularity) and the handle. Backends that
    /// cannot share memory say so.
    fn alloc_exportable(&self, bytes: usize) -> Result<(DevicePtr, usize, OwnedFd)> {
        let _ = bytes;
        Err(GpuError::Unavailable(format!(
            "{} cannot share device memory with other processes",
            self.info().label()
        )))
    }
    /// Map `bytes` of memory another process exported with [`Backend::alloc_exportable`]
    /// (its `handle`) into this device's address space. The handle may be closed afterwards.
    fn import(&self, handle: BorrowedFd<'_>, bytes: usize) -> Result<DevicePtr> {
        let _ = (handle, bytes);
        Err(GpuError::Unavailable(format!(
            "{} cannot map device memory of other processes",
            self.info().label()
        )))
    }
    /// Unmap and release memory of [`Backend::alloc_exportable`] or [`Backend::import`].
    ///
    /// # Safety
    /// `ptr` and `bytes` came from one of those calls on this backend, and nothing uses the
    /// range afterwards.
    unsafe fn release_shared(&self, ptr: DevicePtr, bytes: usize) {
        let _ = (ptr, bytes);
    }
    /// The engine is about to do `step` of putting a model on this device (`None`: bring-up
    /// is over): what it allocates and copies until the next call serves that step. Backends
    /// may log it; the tests' fault injector fails the step's work.
    fn enter(&self, step: Option<Step>) {
        tracing::debug!(device = %self.info().label(), step = ?step, "bring-up step");
    }
}

/// A shared handle on a backend.
#[derive(Clone)]
pub struct Gpu {
    backend: Arc<dyn Backend>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("device", self.backend.info())
            .finish()
    }
}

impl Gpu {
    pub fn from_backend(backend: Arc<dyn Backend>) -> Self {
        Gpu { backend }
    }

    /// Open CUDA device `ordinal`: probe it, create its context, stream and cuBLAS handle, and
    /// compile (or load from the disk cache) every kernel for its architecture. Without the
    /// `cuda` feature the probe says the build has none. [`bringup::open`] also says which
    /// step failed.
    pub fn cuda(ordinal: usize) -> Result<Self> {
        bringup::open(&CudaOpener, ordinal).map_err(|e| e.error)
    }

    /// The CPU emulator of the kernels (tests only: it is slow and single-threaded).
    #[cfg(feature = "emu")]
    pub fn emulator() -> Self {
        Gpu {
            backend: Arc::new(emu::EmuBackend::new()),
        }
    }

    pub fn info(&self) -> &DeviceInfo {
        self.backend.info()
    }

    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// An uninitialised buffer of `bytes`.
    pub fn alloc(&self, bytes: usize) -> Result<GpuBuffer> {
        let ptr = self.backend.alloc(bytes.max(1))?;
        Ok(GpuBuffer {
            ptr,
            bytes,
            gpu: self.clone(),
            region: None,
        })
    }

    /// A buffer of `bytes` set to zero.
    pub fn zeros(&self, bytes: usize) -> Result<GpuBuffer> {
        let b = self.alloc(bytes)?;
        self.backend.memset(b.ptr, 0, bytes)?;
        Ok(b)
    }

    /// A buffer holding `data`.
    pub fn upload<T: Pod>(&self, data: &[T]) -> Result<GpuBuffer> {
        let bytes = as_bytes(data);
        let b = self.alloc(bytes.len())?;
        self.backend.upload(b.ptr, bytes)?;
        Ok(b)
    }

    /// Fill `bytes` at `dst` chunk by chunk (see [`Backend::upload_with`]).
    pub fn upload_with(
        &self,
        dst: DevicePtr,
        bytes: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        self.backend.upload_with(dst, bytes, fill)
    }

    pub fn write<T: Pod>(&self, dst: DevicePtr, data: &[T]) -> Result<()> {
        self.backend.upload(dst, as_bytes(data))
    }

    /// Read `n` elements at `src` (waits for earlier work).
    pub fn read<T: Pod>(&self, src: DevicePtr, n: usize) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); n];
        self.backend.download(src, as_bytes_mut(&mut out))?;
        Ok(out)
    }

    pub fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.backend.copy(dst, src, bytes)
    }

    pub fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.backend.memset(dst, byte, bytes)
    }

    /// Launch `kernel`. A block larger than the kernel's declared bound
    /// ([`sources::launch_bound`]) is refused here, naming the kernel, whatever the backend:
    /// the compiler sized the kernel's registers for that bound, so the driver would refuse
    /// the launch with a less telling error.
    pub fn launch(&self, kernel: &str, shape: Launch, args: &[Arg]) -> Result<()> {
        if let Some(bound) = sources::launch_bound(kernel) {
            if shape.block > bound {
                return Err(GpuError::Launch {
                    kernel: kernel.to_string(),
                    message: format!(
                        "a block of {} threads exceeds the kernel's __launch_bounds__ of {bound}",
                        shape.block
                    ),
                });
            }
        }
        self.backend.launch(kernel, shape, args)
    }

    pub fn gemm(&self, g: &Gemm) -> Result<()> {
        self.backend.gemm(g)
    }

    pub fn synchronize(&self) -> Result<()> {
        self.backend.synchronize()
    }

    pub fn memory(&self) -> Result<(usize, usize)> {
        self.backend.memory()
    }

    /// See [`Backend::enter`].
    pub fn enter(&self, step: Option<Step>) {
        self.backend.enter(step)
    }
}

/// One device allocation, freed on drop; or a view into a [`SharedRegion`], which it keeps
/// mapped while it lives.
pub struct GpuBuffer {
    ptr: DevicePtr,
    bytes: usize,
    gpu: Gpu,
    region: Option<Arc<SharedRegion>>,
}

impl fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpuBuffer({:#x}, {} bytes)", self.ptr.0, self.bytes)
    }
}

impl GpuBuffer {
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// The address `bytes` into the buffer.
    pub fn at(&self, bytes: usize) -> DevicePtr {
        debug_assert!(bytes <= self.bytes);
        self.ptr.offset(bytes)
    }

    pub fn read<T: Pod>(&self) -> Result<Vec<T>> {
        self.gpu
            .read(self.ptr, self.bytes / std::mem::size_of::<T>())
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if self.region.is_none() {
            // SAFETY: the buffer owns `ptr`, allocated by this backend, and is going away.
            unsafe { self.gpu.backend.free(self.ptr) }
        }
    }
}

/// Plain data that can be copied to and from the device as bytes.
///
/// # Safety
/// Implementors have no padding and every bit pattern is a valid value.
pub unsafe trait Pod: Copy + 'static {
    fn zeroed() -> Self;
}

macro_rules! pod {
    ($($t:ty),*) => {$(
        // SAFETY: primitive numeric types have no padding and no invalid bit patterns.
        unsafe impl Pod for $t {
            fn zeroed() -> Self {
                0 as $t
            }
        }
    )*};
}
pod!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

// SAFETY: 16-bit floats are plain 16-bit patterns.
unsafe impl Pod for half::bf16 {
    fn zeroed() -> Self {
        half::bf16::ZERO
    }
}
// SAFETY: as above.
unsafe impl Pod for half::f16 {
    fn zeroed() -> Self {
        half::f16::ZERO
    }
}

pub fn as_bytes<T: Pod>(data: &[T]) -> &[u8] {
    // SAFETY: T is Pod (no padding), so its memory is initialised bytes.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

fn as_bytes_mut<T: Pod>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: T is Pod: any bytes written are a valid T.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), std::mem::size_of_val(data)) }
}

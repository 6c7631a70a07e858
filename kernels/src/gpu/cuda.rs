//! The CUDA backend: the driver API through cudarc's loaders (no toolkit at build time), one
//! non-blocking stream, the kernels compiled by NVRTC for the device's architecture and loaded
//! as modules, and cuBLAS for GEMMs.
//!
//! Errors of asynchronous work surface at the next call that waits (a download or
//! `synchronize`). `GATEWAY_CUDA_SYNC=1` synchronises after every launch, so a failing kernel
//! is named by its own launch (for debugging and the GPU check script).

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::{result, sys};

use super::bringup::Opening;
use super::cuda_blas::Blas;
use super::sources::{Source, SOURCES};
use super::{
    cuda_vmm, nvrtc, probe, Arg, Backend, DeviceInfo, DevicePtr, Gemm, GpuError, Launch, Result,
    UPLOAD_CHUNK,
};

fn driver(call: &'static str) -> impl Fn(result::DriverError) -> GpuError {
    move |e| GpuError::Driver {
        call,
        message: format!("{e:?}"),
    }
}

pub(crate) struct CudaBackend {
    info: DeviceInfo,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    blas: Mutex<Blas>,
    functions: HashMap<&'static str, sys::CUfunction>,
    modules: Vec<sys::CUmodule>,
    sync_each_launch: bool,
    /// Kernels whose dynamic shared-memory limit was raised, and to what.
    raised: Mutex<HashMap<&'static str, u32>>,
    /// The pinned buffers of staged uploads, made on the first and kept: pinning memory is
    /// slow, and a model upload stages every weight matrix.
    staging: Mutex<Option<Staging>>,
}

/// Two pinned buffers of [`UPLOAD_CHUNK`] bytes: one fills on the host while the other is
/// copied; each one's event marks when its copy is done.
struct Staging {
    buffers: [PinnedBuffer; 2],
    events: [Event; 2],
}

// SAFETY: driver handles may be used from any thread once the context is current, which every
// call makes it; the cuBLAS handle, which is not thread-safe, and the pinned staging buffers
// are behind mutexes; the function table is read-only after construction.
unsafe impl Send for CudaBackend {}
unsafe impl Sync for CudaBackend {}

/// A CUDA device being opened (see [`super::bringup`]): what each step has made so far. An
/// opening dropped before [`Opening::finish`] releases it in reverse order, so a failed step
/// leaves no context, stream, module or cuBLAS handle behind.
pub(crate) struct CudaOpening {
    ordinal: usize,
    info: Option<DeviceInfo>,
    /// The retained primary context.
    ctx: Option<sys::CUcontext>,
    stream: Option<sys::CUstream>,
    /// Machine code of each source, between the compile and module-load steps.
    images: Vec<(&'static Source, Vec<u8>)>,
    from_cache: usize,
    modules: Vec<sys::CUmodule>,
    functions: HashMap<&'static str, sys::CUfunction>,
    blas: Option<Blas>,
    started: Instant,
}

impl CudaOpening {
    pub(crate) fn new(ordinal: usize) -> Self {
        CudaOpening {
            ordinal,
            info: None,
            ctx: None,
            stream: None,
            images: Vec::new(),
            from_cache: 0,
            modules: Vec::new(),
            functions: HashMap::new(),
            blas: None,
            started: Instant::now(),
        }
    }

    fn info(&self) -> Result<&DeviceInfo> {
        self.info
            .as_ref()
            .ok_or_else(|| GpuError::Invalid("the device was not probed".into()))
    }

    fn bind(&self) -> Result<()> {
        let ctx = self
            .ctx
            .ok_or_else(|| GpuError::Invalid("the device has no context yet".into()))?;
        // SAFETY: the context is retained until this opening (or its backend) releases it.
        unsafe { result::ctx::set_current(ctx) }.map_err(driver("cuCtxSetCurrent"))
    }
}

impl Opening for CudaOpening {
    fn probe(&mut self) -> Result<()> {
        match probe::probe(self.ordinal) {
            probe::Availability::Ready(info) => {
                self.info = Some(info);
                Ok(())
            }
            probe::Availability::Missing(why) => Err(GpuError::Unavailable(why)),
        }
    }

    fn context(&mut self) -> Result<()> {
        let dev = result::device::get(self.ordinal as i32).map_err(driver("cuDeviceGet"))?;
        // SAFETY: `dev` is valid; the primary context is retained until Drop releases it.
        let ctx = unsafe { result::primary_ctx::retain(dev) }
            .map_err(driver("cuDevicePrimaryCtxRetain"))?;
        self.ctx = Some(ctx);
        self.bind()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(driver("cuStreamCreate"))?;
        self.stream = Some(stream);
        Ok(())
    }

    fn compile(&mut self) -> Result<()> {
        let arch = self.info()?.arch();
        for src in SOURCES {
            let (image, hit) = nvrtc::compile_cached(src, &arch)?;
            self.from_cache += usize::from(hit);
            self.images.push((src, image));
        }
        Ok(())
    }

    fn load_modules(&mut self) -> Result<()> {
        self.bind()?;
        for (src, image) in std::mem::take(&mut self.images) {
            // SAFETY: `image` is a cubin for this device's architecture; the driver copies it.
            let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
                .map_err(driver("cuModuleLoadData"))?;
            self.modules.push(module);
            for name in src.kernels() {
                let cname = CString::new(name).map_err(|e| GpuError::Invalid(e.to_string()))?;
                // SAFETY: the module is loaded and outlives the function handle.
                let f = unsafe { result::module::get_function(module, cname) }
                    .map_err(driver("cuModuleGetFunction"))?;
                self.functions.insert(name, f);
            }
        }
        let info = self.info()?;
        tracing::info!(
            device = %info.label(),
            arch = %info.arch(),
            sources = SOURCES.len(),
            from_cache = self.from_cache,
            kernels = self.functions.len(),
            elapsed_ms = self.started.elapsed().as_millis() as u64,
            "CUDA kernels ready"
        );
        Ok(())
    }

    fn blas(&mut self) -> Result<()> {
        self.bind()?;
        let stream = self
            .stream
            .ok_or_else(|| GpuError::Invalid("the device has no stream yet".into()))?;
        self.blas = Some(Blas::create(stream)?);
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<Arc<dyn Backend>> {
        let missing = || GpuError::Invalid("a CUDA device was finished before every step".into());
        let (Some(info), Some(ctx), Some(stream)) = (self.info.clone(), self.ctx, self.stream)
        else {
            return Err(missing());
        };
        let Some(handle) = self.blas.take() else {
            return Err(missing());
        };
        // The backend owns the handles from here: the opening's Drop must not release them.
        self.ctx = None;
        self.stream = None;
        Ok(Arc::new(CudaBackend {
            info,
            ctx,
            stream,
            blas: Mutex::new(handle),
            functions: std::mem::take(&mut self.functions),
            modules: std::mem::take(&mut self.modules),
            sync_each_launch: std::env::var("GATEWAY_CUDA_SYNC").is_ok_and(|v| v == "1"),
            raised: Mutex::new(HashMap::new()),
            staging: Mutex::new(None),
        }))
    }
}

impl Drop for CudaOpening {
    fn drop(&mut self) {
        let Some(ctx) = self.ctx else {
            return;
        };
        // SAFETY: each handle was made by one of this opening's steps and is released once,
        // newest first, with its context current.
        unsafe {
            let _ = result::ctx::set_current(ctx);
            if let Some(handle) = self.blas.take() {
                handle.destroy();
            }
            for m in self.modules.drain(..) {
                let _ = result::module::unload(m);
            }
            if let Some(stream) = self.stream.take() {
                let _ = result::stream::destroy(stream);
            }
            if let Ok(dev) = result::device::get(self.ordinal as i32) {
                let _ = result::primary_ctx::release(dev);
            }
        }
    }
}

impl CudaBackend {
    fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the backend's life.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(driver("cuCtxSetCurrent"))
    }

    fn stream_sync(&self) -> Result<()> {
        // SAFETY: the stream lives as long as the backend.
        unsafe { result::stream::synchronize(self.stream) }.map_err(driver("cuStreamSynchronize"))
    }

    fn raise_shared_limit(&self, name: &'static str, f: sys::CUfunction, bytes: u32) -> Result<()> {
        let mut raised = self.raised.lock().unwrap_or_else(|e| e.into_inner());
        if raised.get(name).is_some_and(|&b| b >= bytes) {
            return Ok(());
        }
        // SAFETY: `f` is a loaded function.
        unsafe {
            result::function::set_function_attribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(driver("cuFuncSetAttribute"))?;
        raised.insert(name, bytes);
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        // SAFETY: a plain device allocation, freed in `free`.
        match unsafe { result::malloc_sync(bytes) } {
            Ok(p) => Ok(DevicePtr(p)),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                let free = result::mem_get_info().map(|m| m.0).unwrap_or(0);
                Err(GpuError::OutOfMemory {
                    requested: bytes,
                    free,
                })
            }
            Err(e) => Err(driver("cuMemAlloc")(e)),
        }
    }

    unsafe fn free(&self, ptr: DevicePtr) {
        if self.bind().is_ok() {
            // SAFETY: the caller passes a pointer from `alloc`, used no more.
            if let Err(e) = unsafe { result::free_sync(ptr.0) } {
                tracing::warn!("cuMemFree failed: {e:?}");
            }
        }
    }

    fn alloc_exportable(&self, bytes: usize) -> Result<(DevicePtr, usize, OwnedFd)> {
        self.bind()?;
        cuda_vmm::export(self.info.ordinal, bytes)
    }

    fn import(&self, handle: BorrowedFd<'_>, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        cuda_vmm::import(self.info.ordinal, handle, bytes)
    }

    unsafe fn release_shared(&self, ptr: DevicePtr, bytes: usize) {
        // Earlier work may still read the range.
        if self.bind().and_then(|()| self.stream_sync()).is_ok() {
            // SAFETY: the caller's promise, passed on.
            unsafe { cuda_vmm::release(ptr, bytes) }
        }
    }

    fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: from pageable memory the call returns once `src` has been staged, so the
        // slice may be reused; the caller guarantees the destination range.
        unsafe { result::memcpy_htod_async(dst.0, src, self.stream) }
            .map_err(driver("cuMemcpyHtoDAsync"))
    }

    fn upload_with(
        &self,
        dst: DevicePtr,
        bytes: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        self.bind()?;
        if bytes == 0 {
            return Ok(());
        }
        let mut guard = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        let staging = match &mut *guard {
            Some(s) => s,
            none => none.insert(Staging {
                buffers: [
                    PinnedBuffer::new(UPLOAD_CHUNK)?,
                    PinnedBuffer::new(UPLOAD_CHUNK)?,
                ],
                events: [Event::new()?, Event::new()?],
            }),
        };
        let mut off = 0;
        let mut i = 0;
        while off < bytes {
            let n = (bytes - off).min(UPLOAD_CHUNK);
            staging.events[i].wait()?;
            let buf = staging.buffers[i].slice(n);
            fill(off, buf)?;
            // SAFETY: the pinned buffer stays untouched until its event has passed.
            unsafe { result::memcpy_htod_async(dst.offset(off).0, &*buf, self.stream) }
                .map_err(driver("cuMemcpyHtoDAsync"))?;
            staging.events[i].record(self.stream)?;
            off += n;
            i ^= 1;
        }
        self.stream_sync()
    }

    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees the source range; the stream is synchronised before
        // the host reads `dst`.
        unsafe { result::memcpy_dtoh_async(dst, src.0, self.stream) }
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        self.stream_sync()
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees both ranges.
        unsafe { result::memcpy_dtod_async(dst.0, src.0, bytes, self.stream) }
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees the range.
        unsafe { result::memset_d8_async(dst.0, byte, bytes, self.stream) }
            .map_err(driver("cuMemsetD8Async"))
    }

    fn launch(&self, kernel: &str, shape: Launch, args: &[Arg]) -> Result<()> {
        let Some((&name, &f)) = self.functions.get_key_value(kernel) else {
            return Err(GpuError::Launch {
                kernel: kernel.to_string(),
                message: "no such kernel in the compiled sources".into(),
            });
        };
        self.bind()?;
        if shape.shared_bytes > 48 * 1024 {
            self.raise_shared_limit(name, f, shape.shared_bytes)?;
        }
        let mut slots: Vec<[u8; 8]> = args.iter().map(|a| a.bytes().0).collect();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s.as_mut_ptr().cast::<c_void>())
            .collect();
        // SAFETY: `params[i]` points at the i-th argument's bytes, which outlive the call (the
        // driver copies them at launch). Argument types and counts are checked by the emulator
        // tests, which launch through the same code.
        unsafe {
            result::launch_kernel(
                f,
                (shape.grid[0], shape.grid[1], shape.grid[2]),
                (shape.block, 1, 1),
                shape.shared_bytes,
                self.stream,
                &mut params,
            )
        }
        .map_err(|e| GpuError::Launch {
            kernel: kernel.to_string(),
            message: format!("{e:?}"),
        })?;
        if self.sync_each_launch {
            self.stream_sync().map_err(|e| GpuError::Launch {
                kernel: kernel.to_string(),
                message: e.to_string(),
            })?;
        }
        Ok(())
    }

    fn gemm(&self, g: &Gemm) -> Result<()> {
        self.bind()?;
        self.blas.lock().unwrap_or_else(|e| e.into_inner()).gemm(g)
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.stream_sync()
    }

    fn memory(&self) -> Result<(usize, usize)> {
        self.bind()?;
        result::mem_get_info().map_err(driver("cuMemGetInfo"))
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        let _ = self.stream_sync();
        // The pinned buffers and events go while the context is still current.
        drop(
            self.staging
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        // SAFETY: each handle was created by this backend and is released once, after the
        // stream's work has finished.
        unsafe {
            self.blas
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .destroy();
            for m in self.modules.drain(..) {
                let _ = result::module::unload(m);
            }
            let _ = result::stream::destroy(self.stream);
            if let Ok(dev) = result::device::get(self.info.ordinal as i32) {
                let _ = result::primary_ctx::release(dev);
            }
        }
    }
}

/// Page-locked host memory for staged uploads.
struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
}

impl PinnedBuffer {
    fn new(len: usize) -> Result<Self> {
        // SAFETY: a plain pinned allocation, freed in Drop.
        let ptr = unsafe { result::malloc_host(len, 0) }.map_err(driver("cuMemHostAlloc"))?;
        Ok(PinnedBuffer {
            ptr: ptr.cast(),
            len,
        })
    }

    #[allow(clippy::mut_from_ref)]
    fn slice(&self, n: usize) -> &mut [u8] {
        // SAFETY: the buffer holds `len >= n` bytes; the caller uses one slice at a time, and
        // only after the event guarding the buffer has passed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, n.min(self.len)) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc; the stream was synchronised before drop.
        unsafe {
            let _ = result::free_host(self.ptr.cast());
        }
    }
}

/// An event that marks when a staging buffer is free again.
struct Event {
    event: sys::CUevent,
    recorded: std::cell::Cell<bool>,
}

impl Event {
    fn new() -> Result<Self> {
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(driver("cuEventCreate"))?;
        Ok(Event {
            event,
            recorded: std::cell::Cell::new(false),
        })
    }

    fn record(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: both handles are valid.
        unsafe { result::event::record(self.event, stream) }.map_err(driver("cuEventRecord"))?;
        self.recorded.set(true);
        Ok(())
    }

    fn wait(&self) -> Result<()> {
        if !self.recorded.get() {
            return Ok(());
        }
        // SAFETY: the event is valid and was recorded.
        unsafe { result::event::synchronize(self.event) }.map_err(driver("cuEventSynchronize"))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once.
        unsafe {
            let _ = result::event::destroy(self.event);
        }
    }
}

//! Fault injection for the tests of GPU bring-up (feature `fault-inject`, enabled only by the
//! crates' dev-dependencies): an [`Opener`] that fails one chosen [`Step`] of an inner opener,
//! and whose backend fails the engine's steps (weights, KV cache, self-test) when the engine
//! enters them.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use super::bringup::{Opener, Opening, Step};
use super::{Arg, Backend, DeviceInfo, DevicePtr, Gemm, GpuError, Launch, Result};

/// Fails `step` of bringing a model up on the devices of `inner`.
pub struct FaultyOpener<O> {
    inner: O,
    step: Step,
}

impl<O: Opener> FaultyOpener<O> {
    pub fn new(inner: O, step: Step) -> Self {
        FaultyOpener { inner, step }
    }
}

fn injected(step: Step) -> GpuError {
    GpuError::Invalid(format!("injected fault in the {step} step"))
}

impl<O: Opener> Opener for FaultyOpener<O> {
    fn begin(&self, ordinal: usize) -> Box<dyn Opening> {
        Box::new(FaultyOpening {
            inner: self.inner.begin(ordinal),
            step: self.step,
        })
    }
}

struct FaultyOpening {
    inner: Box<dyn Opening>,
    step: Step,
}

impl FaultyOpening {
    fn run(&mut self, step: Step, f: impl FnOnce(&mut dyn Opening) -> Result<()>) -> Result<()> {
        if self.step == step {
            return Err(injected(step));
        }
        f(&mut *self.inner)
    }
}

impl Opening for FaultyOpening {
    fn probe(&mut self) -> Result<()> {
        self.run(Step::Probe, |o| o.probe())
    }
    fn context(&mut self) -> Result<()> {
        self.run(Step::Context, |o| o.context())
    }
    fn compile(&mut self) -> Result<()> {
        self.run(Step::Nvrtc, |o| o.compile())
    }
    fn load_modules(&mut self) -> Result<()> {
        self.run(Step::ModuleLoad, |o| o.load_modules())
    }
    fn blas(&mut self) -> Result<()> {
        self.run(Step::Cublas, |o| o.blas())
    }
    fn finish(self: Box<Self>) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(FaultyBackend {
            inner: self.inner.finish()?,
            step: self.step,
            now: AtomicU8::new(u8::MAX),
        }))
    }
}

/// The inner backend, except that while the engine is in the chosen step, allocations fail
/// as out of memory (weights, KV cache) and downloads come back wrong (self-test: the values
/// reversed, finite but not the model's).
struct FaultyBackend {
    inner: Arc<dyn Backend>,
    step: Step,
    /// The step the engine entered last (its index in [`Step::ALL`]).
    now: AtomicU8,
}

impl FaultyBackend {
    fn in_faulty_step(&self) -> bool {
        Step::ALL
            .get(usize::from(self.now.load(Ordering::SeqCst)))
            .is_some_and(|&s| s == self.step)
    }
}

impl Backend for FaultyBackend {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        if self.in_faulty_step() && self.step != Step::SelfTest {
            let free = self.inner.memory().map(|(free, _)| free).unwrap_or(0);
            return Err(GpuError::OutOfMemory {
                requested: bytes,
                free: free.min(bytes.saturating_sub(1)),
            });
        }
        self.inner.alloc(bytes)
    }
    unsafe fn free(&self, ptr: DevicePtr) {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.inner.free(ptr) }
    }
    fn alloc_exportable(&self, bytes: usize) -> Result<(DevicePtr, usize, OwnedFd)> {
        self.inner.alloc_exportable(bytes)
    }
    /// Mapping another process's weights is the weights step's work: it fails there.
    fn import(&self, handle: BorrowedFd<'_>, bytes: usize) -> Result<DevicePtr> {
        if self.in_faulty_step() && self.step == Step::Weights {
            return Err(GpuError::Driver {
                call: "import (injected)",
                message: "the mapping failed".into(),
            });
        }
        self.inner.import(handle, bytes)
    }
    unsafe fn release_shared(&self, ptr: DevicePtr, bytes: usize) {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.inner.release_shared(ptr, bytes) }
    }
    fn upload(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.inner.upload(dst, src)
    }
    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        self.inner.download(src, dst)?;
        if self.in_faulty_step() && self.step == Step::SelfTest && dst.len().is_multiple_of(4) {
            let words: Vec<[u8; 4]> = dst
                .chunks_exact(4)
                .rev()
                .map(|c| [c[0], c[1], c[2], c[3]])
                .collect();
            for (d, w) in dst.chunks_exact_mut(4).zip(words) {
                d.copy_from_slice(&w);
            }
        }
        Ok(())
    }
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.inner.copy(dst, src, bytes)
    }
    fn memset(&self, dst: DevicePtr, byte: u8, bytes: usize) -> Result<()> {
        self.inner.memset(dst, byte, bytes)
    }
    fn launch(&self, kernel: &str, shape: Launch, args: &[Arg]) -> Result<()> {
        self.inner.launch(kernel, shape, args)
    }
    fn gemm(&self, g: &Gemm) -> Result<()> {
        self.inner.gemm(g)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn memory(&self) -> Result<(usize, usize)> {
        self.inner.memory()
    }
    fn enter(&self, step: Option<Step>) {
        let i = step
            .and_then(|step| Step::ALL.iter().position(|&s| s == step))
            .map_or(u8::MAX, |i| i as u8);
        self.now.store(i, Ordering::SeqCst);
        self.inner.enter(step);
    }
}

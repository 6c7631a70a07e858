//! Bringing a GPU up one named step at a time, so that a failure says which step failed and a
//! caller can decide per step what to do (`--device auto` falls back to the CPU whatever the
//! step; `--device cuda` fails naming it).
//!
//! The device's own steps (probe, context, NVRTC, module load, cuBLAS) run behind
//! [`Opening`]; the steps that put a model on the device (weights, KV cache, self-test) are
//! the engine's, announced to the backend with [`Backend::enter`] so that a backend can tell
//! which step its allocations and copies serve.

use std::fmt;
use std::sync::Arc;

use super::{Backend, Gpu, GpuError};

/// A step of bringing a model up on a GPU, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// The driver, the device, NVRTC and cuBLAS are there (no context yet).
    Probe,
    /// The device's primary context and the stream.
    Context,
    /// Every kernel source as machine code for the device (the disk cache, else NVRTC).
    Nvrtc,
    /// The machine code loaded as modules, every kernel's function found.
    ModuleLoad,
    /// The cuBLAS handle on the stream.
    Cublas,
    /// A model's weights allocated and uploaded.
    Weights,
    /// A model's KV cache allocated.
    KvCache,
    /// A one-token forward of the loaded model against its CPU twin.
    SelfTest,
}

impl Step {
    pub const ALL: [Step; 8] = [
        Step::Probe,
        Step::Context,
        Step::Nvrtc,
        Step::ModuleLoad,
        Step::Cublas,
        Step::Weights,
        Step::KvCache,
        Step::SelfTest,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Step::Probe => "probe",
            Step::Context => "context",
            Step::Nvrtc => "NVRTC",
            Step::ModuleLoad => "module load",
            Step::Cublas => "cuBLAS",
            Step::Weights => "weights",
            Step::KvCache => "KV cache",
            Step::SelfTest => "self-test",
        }
    }

    /// Whether the step belongs to opening the device (before any model).
    pub const fn is_device_step(self) -> bool {
        matches!(
            self,
            Step::Probe | Step::Context | Step::Nvrtc | Step::ModuleLoad | Step::Cublas
        )
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A step that failed, and why.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed: {error}")]
pub struct StepError {
    pub step: Step,
    #[source]
    pub error: GpuError,
}

impl StepError {
    pub fn at(step: Step) -> impl Fn(GpuError) -> StepError {
        move |error| StepError { step, error }
    }
}

/// A device being opened. The steps are called once each, in order; an `Opening` dropped
/// before [`Opening::finish`] releases whatever its steps made.
pub trait Opening {
    fn probe(&mut self) -> Result<(), GpuError>;
    fn context(&mut self) -> Result<(), GpuError>;
    fn compile(&mut self) -> Result<(), GpuError>;
    fn load_modules(&mut self) -> Result<(), GpuError>;
    fn blas(&mut self) -> Result<(), GpuError>;
    /// The opened device, after every step succeeded (a failure here counts as the last
    /// step's).
    fn finish(self: Box<Self>) -> Result<Arc<dyn Backend>, GpuError>;
}

/// Where devices come from: the CUDA driver in a server; the emulator, or a fault injector
/// around it, in tests.
pub trait Opener: Send + Sync {
    fn begin(&self, ordinal: usize) -> Box<dyn Opening>;
}

/// Open device `ordinal` of `opener`, step by step.
pub fn open(opener: &dyn Opener, ordinal: usize) -> Result<Gpu, StepError> {
    let mut o = opener.begin(ordinal);
    o.probe().map_err(StepError::at(Step::Probe))?;
    o.context().map_err(StepError::at(Step::Context))?;
    o.compile().map_err(StepError::at(Step::Nvrtc))?;
    o.load_modules().map_err(StepError::at(Step::ModuleLoad))?;
    o.blas().map_err(StepError::at(Step::Cublas))?;
    let backend = o.finish().map_err(StepError::at(Step::Cublas))?;
    Ok(Gpu::from_backend(backend))
}

/// The CUDA driver's devices (without the `cuda` feature, every open fails at the probe
/// saying the build has none).
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaOpener;

impl Opener for CudaOpener {
    fn begin(&self, ordinal: usize) -> Box<dyn Opening> {
        #[cfg(feature = "cuda")]
        {
            Box::new(super::cuda::CudaOpening::new(ordinal))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Box::new(NotBuilt)
        }
    }
}

#[cfg(not(feature = "cuda"))]
struct NotBuilt;

#[cfg(not(feature = "cuda"))]
impl Opening for NotBuilt {
    fn probe(&mut self) -> Result<(), GpuError> {
        Err(GpuError::Unavailable(super::NOT_BUILT.into()))
    }
    fn context(&mut self) -> Result<(), GpuError> {
        self.probe()
    }
    fn compile(&mut self) -> Result<(), GpuError> {
        self.probe()
    }
    fn load_modules(&mut self) -> Result<(), GpuError> {
        self.probe()
    }
    fn blas(&mut self) -> Result<(), GpuError> {
        self.probe()
    }
    fn finish(self: Box<Self>) -> Result<Arc<dyn Backend>, GpuError> {
        Err(GpuError::Unavailable(super::NOT_BUILT.into()))
    }
}

//! Switches for tests that must see the engine do what nothing else makes it do on demand:
//! `ENGINE_FAULT_INJECT=scheduler-panic` panics in the scheduler's step, outside the model's
//! panic guard, as a bug there would; `ENGINE_TEST_DEVICE=emu` opens the kernels' CPU emulator
//! where a CUDA device is asked for (`--device cuda`, or `preload --device cuda`), so the
//! built binary's GPU paths (the GPU weight cache among them) run on a machine without one.
//! They exist only in builds with the `fault-inject` feature, which `make test` turns on and
//! no release build does: a product binary has no variable that crashes it or fakes a GPU.

#[cfg(feature = "fault-inject")]
use std::sync::OnceLock;

/// Whether the scheduler should panic at its next step.
#[cfg(feature = "fault-inject")]
pub(crate) fn scheduler_panic() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("ENGINE_FAULT_INJECT").is_ok_and(|v| v == "scheduler-panic");
        if on {
            tracing::warn!("ENGINE_FAULT_INJECT=scheduler-panic: the scheduler will panic");
        }
        on
    })
}

/// Without the `fault-inject` feature nothing is injected.
#[cfg(not(feature = "fault-inject"))]
pub(crate) const fn scheduler_panic() -> bool {
    false
}

/// Where CUDA devices are opened: the driver's, or the emulator under `ENGINE_TEST_DEVICE=emu`.
#[cfg(feature = "fault-inject")]
pub(crate) fn gpu_opener() -> &'static dyn kernels::gpu::Opener {
    static EMU: OnceLock<bool> = OnceLock::new();
    let emu = *EMU.get_or_init(|| {
        let on = std::env::var("ENGINE_TEST_DEVICE").is_ok_and(|v| v == "emu");
        if on {
            tracing::warn!("ENGINE_TEST_DEVICE=emu: CUDA devices are the kernels' CPU emulator");
        }
        on
    });
    if emu {
        &kernels::gpu::EmuOpener
    } else {
        &kernels::gpu::CudaOpener
    }
}

/// Without the `fault-inject` feature devices are the driver's.
#[cfg(not(feature = "fault-inject"))]
pub(crate) fn gpu_opener() -> &'static dyn kernels::gpu::Opener {
    &kernels::gpu::CudaOpener
}

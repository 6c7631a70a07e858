//! Which device runs the decoders: the operator's request (`--device`, `--dtype`), and its
//! resolution at start-up into the CPU or an opened CUDA device.
//!
//! `auto` takes CUDA device 0 when every step of opening it succeeds (probe, context, NVRTC,
//! module load, cuBLAS), and otherwise the CPU, with one log line saying which step failed and
//! why. An explicit `cuda[:N]` that cannot be served is a start-up error naming the step. Nothing above the engine sees
//! which device a model runs on except through [`crate::api::ModelCard::device`] and the
//! metrics.

use std::fmt;
use std::str::FromStr;

use kernels::gpu::bringup::{self, Opener, Step};
use kernels::gpu::{Gpu, GpuDType};

use crate::error::{EngineError, Result};

/// `--device`: where the operator wants the decoders to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// CUDA device 0 when it can serve, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// A CUDA device (`cuda` is `cuda:0`).
    Cuda(usize),
}

impl FromStr for DeviceRequest {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" | "gpu" => Ok(DeviceRequest::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceRequest::Cuda)
                .ok_or_else(|| {
                    format!("unknown device '{s}' (expected auto, cpu, cuda or cuda:N)")
                }),
        }
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRequest::Auto => f.write_str("auto"),
            DeviceRequest::Cpu => f.write_str("cpu"),
            DeviceRequest::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// `--dtype`: the type of a GPU model's weights, activations and KV cache, with vLLM's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DTypeRequest {
    /// bfloat16, or float16 where the checkpoint's weights are float16.
    #[default]
    Auto,
    BFloat16,
    Float16,
    /// Full f32 (weights too): the mode the GPU parity checks run in.
    Float32,
}

impl FromStr for DTypeRequest {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DTypeRequest::Auto),
            "bfloat16" | "bf16" => Ok(DTypeRequest::BFloat16),
            "float16" | "half" | "fp16" | "f16" => Ok(DTypeRequest::Float16),
            "float32" | "float" | "fp32" | "f32" => Ok(DTypeRequest::Float32),
            _ => Err(format!(
                "unknown dtype '{s}' (expected auto, bfloat16, float16 or float32)"
            )),
        }
    }
}

impl fmt::Display for DTypeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DTypeRequest::Auto => "auto",
            DTypeRequest::BFloat16 => "bfloat16",
            DTypeRequest::Float16 => "float16",
            DTypeRequest::Float32 => "float32",
        })
    }
}

impl DTypeRequest {
    /// The GPU type for a checkpoint whose matrices are stored as `stored` (`None`: quantised
    /// or mixed, e.g. GGUF).
    pub fn resolve(self, stored: Option<GpuDType>) -> GpuDType {
        match self {
            DTypeRequest::Auto => match stored {
                Some(GpuDType::F16) => GpuDType::F16,
                _ => GpuDType::BF16,
            },
            DTypeRequest::BFloat16 => GpuDType::BF16,
            DTypeRequest::Float16 => GpuDType::F16,
            DTypeRequest::Float32 => GpuDType::F32,
        }
    }
}

/// Where decoders run, once resolved.
#[derive(Debug, Clone)]
pub enum Device {
    Cpu,
    Gpu(Gpu),
}

impl Device {
    /// `cpu`, or the GPU's label (`cuda:0`).
    pub fn label(&self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            Device::Gpu(g) => g.info().label(),
        }
    }
}

/// Resolve `--device` on the CUDA driver's devices (see [`resolve_with`]).
pub fn resolve(request: DeviceRequest) -> Result<Device> {
    resolve_with(request, crate::fault::gpu_opener())
}

/// Resolve `--device`: open the device step by step through `opener` (probe, context, NVRTC,
/// module load, cuBLAS). `auto` serves on the CPU, with one log line saying why, whatever step
/// fails; an explicit `cuda[:N]` fails naming the step.
pub fn resolve_with(request: DeviceRequest, opener: &dyn Opener) -> Result<Device> {
    let ordinal = match request {
        DeviceRequest::Cpu => return Ok(Device::Cpu),
        DeviceRequest::Auto => 0,
        DeviceRequest::Cuda(n) => n,
    };
    match bringup::open(opener, ordinal) {
        Ok(gpu) => {
            log_opened(&gpu);
            Ok(Device::Gpu(gpu))
        }
        Err(e) if request == DeviceRequest::Auto => {
            if e.step == Step::Probe {
                // No usable GPU here at all: the usual case on a CPU machine.
                tracing::info!("--device auto: serving on the CPU ({})", one_line(&e.error));
            } else {
                tracing::warn!(
                    "--device auto: serving on the CPU: CUDA device {ordinal} {}",
                    one_line(&e)
                );
            }
            Ok(Device::Cpu)
        }
        Err(e) => Err(EngineError::BackendUnavailable(if e.step == Step::Probe {
            format!("--device {request}: {}", one_line(&e.error))
        } else {
            format!("--device {request}: CUDA device {ordinal} {}", one_line(&e))
        })),
    }
}

/// An error's text on one line (NVRTC's log spans many), cut to a length a log line and a
/// start-up error can carry.
pub(crate) fn one_line(e: &dyn fmt::Display) -> String {
    const MAX: usize = 600;
    let text = e.to_string();
    let mut line = text
        .split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    if line.len() > MAX {
        let mut cut = MAX;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push_str(" ...");
    }
    line
}

fn log_opened(gpu: &Gpu) {
    let info = gpu.info();
    tracing::info!(
        device = %info.label(),
        name = %info.name,
        compute_capability = %format!("{}.{}", info.compute_capability.0, info.compute_capability.1),
        memory_gib = %format!("{:.1}", info.total_memory as f64 / (1u64 << 30) as f64),
        driver = %format!("{}.{}", info.driver_version / 1000, (info.driver_version % 1000) / 10),
        "CUDA device opened"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_device_and_dtype_names() {
        assert_eq!("auto".parse(), Ok(DeviceRequest::Auto));
        assert_eq!("CPU".parse(), Ok(DeviceRequest::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceRequest::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceRequest::Cuda(3)));
        assert!("cuda:x".parse::<DeviceRequest>().is_err());
        assert!("tpu".parse::<DeviceRequest>().is_err());
        assert_eq!("half".parse(), Ok(DTypeRequest::Float16));
        assert_eq!("bfloat16".parse(), Ok(DTypeRequest::BFloat16));
        assert_eq!("float".parse(), Ok(DTypeRequest::Float32));
        assert!("int8".parse::<DTypeRequest>().is_err());
    }

    #[test]
    fn auto_dtype_follows_the_checkpoint() {
        assert_eq!(
            DTypeRequest::Auto.resolve(Some(GpuDType::F16)),
            GpuDType::F16
        );
        assert_eq!(
            DTypeRequest::Auto.resolve(Some(GpuDType::F32)),
            GpuDType::BF16
        );
        assert_eq!(DTypeRequest::Auto.resolve(None), GpuDType::BF16);
        assert_eq!(DTypeRequest::Float32.resolve(None), GpuDType::F32);
    }

    #[test]
    fn without_a_gpu_auto_is_the_cpu_and_cuda_is_an_error_naming_why() {
        // This machine may have a GPU; only the no-GPU answers are asserted.
        if let kernels::gpu::Availability::Missing(why) = kernels::gpu::probe(0) {
            assert!(matches!(resolve(DeviceRequest::Auto), Ok(Device::Cpu)));
            match resolve(DeviceRequest::Cuda(0)) {
                Err(EngineError::BackendUnavailable(msg)) => {
                    assert!(msg.contains(&why), "{msg}");
                    assert!(!msg.contains('\n'), "one line: {msg}");
                }
                other => panic!("expected BackendUnavailable, got {other:?}"),
            }
        }
        assert!(matches!(resolve(DeviceRequest::Cpu), Ok(Device::Cpu)));
    }

    /// Every device step's failure, injected through the opener: `auto` is the CPU with one
    /// log line naming the step, `cuda` an error naming it; with no fault the emulator opens.
    #[test]
    fn a_failing_device_step_is_the_cpu_under_auto_and_an_error_under_cuda() {
        use kernels::gpu::inject::FaultyOpener;
        use kernels::gpu::EmuOpener;

        assert!(matches!(
            resolve_with(DeviceRequest::Auto, &EmuOpener),
            Ok(Device::Gpu(_))
        ));
        for step in Step::ALL.into_iter().filter(|s| s.is_device_step()) {
            let opener = FaultyOpener::new(EmuOpener, step);
            let (device, logs) =
                crate::test_log::capture(|| resolve_with(DeviceRequest::Auto, &opener));
            assert!(matches!(device, Ok(Device::Cpu)), "{step}: {device:?}");
            let lines: Vec<&str> = logs
                .lines()
                .filter(|l| l.contains("serving on the CPU"))
                .collect();
            assert_eq!(lines.len(), 1, "{step}: one line saying why: {logs}");
            assert!(
                lines[0].contains(&format!("injected fault in the {step} step")),
                "{}",
                lines[0]
            );
            if step != Step::Probe {
                assert!(lines[0].contains(&format!("{step} failed")), "{}", lines[0]);
            }
            match resolve_with(DeviceRequest::Cuda(0), &opener) {
                Err(EngineError::BackendUnavailable(msg)) => {
                    assert!(msg.starts_with("--device cuda:0: "), "{msg}");
                    assert!(msg.contains(&format!("the {step} step")), "{msg}");
                }
                other => panic!("{step}: expected BackendUnavailable, got {other:?}"),
            }
        }
    }

    #[test]
    fn an_error_is_one_bounded_line() {
        let log = format!("rc 6\n  kernel.cu(3): error: x\n\n{}", "y".repeat(2000));
        let line = one_line(&log);
        assert!(!line.contains('\n'));
        assert!(
            line.starts_with("rc 6 | kernel.cu(3): error: x | yyy"),
            "{line}"
        );
        assert!(line.len() < 700);
    }
}

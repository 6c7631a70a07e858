//! Helpers shared by the kernel checks (`tests/gpu_*.rs`, each including this file): the
//! `checks!` macro that runs every check on the emulator and on a real GPU, a seeded
//! generator, storage-type conversion as the host does it, and error measures.
//!
//! Every check draws fresh random inputs and poisons its outputs before each run, so an
//! unwritten element fails. On the emulator the checks always run (feature `emu`); on a GPU
//! (feature `cuda`) they are ignored unless asked for with `--include-ignored`, which
//! `scripts/gpu-check.sh` does on the GPU machine, and there they fail if no device opens.
#![allow(dead_code)]

use kernels::gpu::{Gpu, GpuBuffer, GpuDType};

/// `checks!(a, b)`: tests `emu::a`, `emu::b` (always run) and `cuda::a`, `cuda::b` (ignored
/// unless asked for), each calling the function of that name with the device.
macro_rules! checks {
    ($($name:ident),* $(,)?) => {
        mod emu {
            $(
                #[test]
                fn $name() {
                    super::$name(&kernels::gpu::Gpu::emulator());
                }
            )*
        }

        #[cfg(feature = "cuda")]
        mod cuda {
            $(
                #[test]
                #[ignore = "needs a CUDA device: scripts/gpu-check.sh runs it with --include-ignored"]
                fn $name() {
                    let gpu = kernels::gpu::Gpu::cuda(0).expect("a CUDA device");
                    super::$name(&gpu);
                }
            )*
        }
    };
}
pub(crate) use checks;

/// A small deterministic generator (xorshift64*), seeded per check from the clock so each run
/// draws fresh inputs; the seed is printed so a failure can be replayed with `GPU_CHECK_SEED`.
pub struct Rng(u64);

impl Rng {
    pub fn new(name: &str) -> Self {
        // A seed that does not parse is refused rather than replaced by the clock: a replay
        // that silently draws other inputs would pass for a fix.
        let seed = std::env::var("GPU_CHECK_SEED")
            .ok()
            .map(|s| {
                s.trim()
                    .parse::<u64>()
                    .unwrap_or_else(|e| panic!("GPU_CHECK_SEED={s:?} is not a u64: {e}"))
            })
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("{name}: seed {seed} (GPU_CHECK_SEED={seed} replays it)");
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-a, a).
    pub fn sym(&mut self, a: f32) -> f32 {
        (self.unit() * 2.0 - 1.0) * a
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| self.sym(a)).collect()
    }
}

/// The element types a kernel is instantiated for.
pub const TYPES: [GpuDType; 3] = [GpuDType::F32, GpuDType::BF16, GpuDType::F16];

/// Round a value through the storage type, as the host's conversions do.
pub fn round(t: GpuDType, v: f32) -> f32 {
    match t {
        GpuDType::F32 => v,
        GpuDType::BF16 => half::bf16::from_f32(v).to_f32(),
        GpuDType::F16 => half::f16::from_f32(v).to_f32(),
    }
}

/// Upload f32 values stored as `t`.
pub fn upload_as(gpu: &Gpu, t: GpuDType, v: &[f32]) -> GpuBuffer {
    match t {
        GpuDType::F32 => gpu.upload(v).unwrap(),
        GpuDType::BF16 => {
            let h: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
            gpu.upload(&h).unwrap()
        }
        GpuDType::F16 => {
            let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
            gpu.upload(&h).unwrap()
        }
    }
}

/// Read `n` values stored as `t`, as f32.
pub fn read_as(gpu: &Gpu, t: GpuDType, b: &GpuBuffer, n: usize) -> Vec<f32> {
    match t {
        GpuDType::F32 => gpu.read::<f32>(b.ptr(), n).unwrap(),
        GpuDType::BF16 => gpu
            .read::<half::bf16>(b.ptr(), n)
            .unwrap()
            .into_iter()
            .map(|x| x.to_f32())
            .collect(),
        GpuDType::F16 => gpu
            .read::<half::f16>(b.ptr(), n)
            .unwrap()
            .into_iter()
            .map(|x| x.to_f32())
            .collect(),
    }
}

/// A buffer of `n` elements of `t`, every byte 0xFF (NaN in each float type).
pub fn poisoned(gpu: &Gpu, t: GpuDType, n: usize) -> GpuBuffer {
    let b = gpu.alloc(n * t.size()).unwrap();
    gpu.memset(b.ptr(), 0xFF, n * t.size()).unwrap();
    b
}

/// ‖got − want‖ / ‖want‖, NaN (an unwritten or broken element) counting as infinite.
pub fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let mut num = 0f64;
    let mut den = 0f64;
    for (g, w) in got.iter().zip(want) {
        if !g.is_finite() && g != w {
            return f64::INFINITY;
        }
        num += ((g - w) as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// The relative-error bound for results stored as `t`.
pub fn tolerance(t: GpuDType) -> f64 {
    match t {
        GpuDType::F32 => 1e-5,
        GpuDType::BF16 => 1e-2,
        GpuDType::F16 => 2e-3,
    }
}

pub fn assert_close(what: &str, t: GpuDType, got: &[f32], want: &[f32]) {
    let e = rel_err(got, want);
    assert!(
        e <= tolerance(t),
        "{what} ({t}): relative error {e:.3e} over {:.0e}",
        tolerance(t)
    );
}

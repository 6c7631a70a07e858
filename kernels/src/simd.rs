//! Run-time CPU feature detection.

use std::sync::OnceLock;

/// The vector instruction set the kernels use on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    /// Portable Rust loops (any target).
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
}

/// Detected once, then cached. Setting `KERNELS_FORCE_SCALAR=1` forces the scalar path (for
/// testing the fallback on AVX2 machines).
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

fn detect() -> SimdLevel {
    if std::env::var_os("KERNELS_FORCE_SCALAR").is_some_and(|v| v == "1") {
        return SimdLevel::Scalar;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Scalar
}

//! The CPU kernels, and the one place that decides which instructions they use
//! ([`features`]).
//!
//! - Weight storage and the decoder's products: [`dequant`], [`dot`] (fused dequantise-and-dot),
//!   [`q8`] (integer dot products against quantised activations), [`kquant`] (the 256-weight
//!   super-block types and their integer kernels), [`matmul`] (the drivers),
//!   [`dense`] (plain f32 GEMMs through the `gemm` crate), [`ops`] (norms, RoPE, softmax, ...).
//! - The encoder's compute: [`gemm`] (f32 GEMM over pre-packed B), [`encoder`] (LayerNorm,
//!   GELU, row softmax) and [`attention`] (fused self-attention).
//!
//! Every kernel family with SIMD versions has an entry point that takes the [`Isa`] to run
//! (the tests force each level the CPU has), and a public one that passes [`cpu_isa`].

/// One test per listed level: `level_tests!(check => Scalar, Avx2)` defines the tests
/// `scalar`, `avx2`, ... (so invoke it in a module named after what `check` checks), each
/// calling `check(isa)`. A level the build machine lacks shows as ignored, with its reason; a
/// level that runs first asserts that the CPU really has it, so a mismatch fails instead of
/// passing.
#[cfg(test)]
macro_rules! level_tests {
    ($check:path => $($level:ident),+ $(,)?) => {
        $( level_tests!(@one $check, $level); )+
    };
    (@one $check:path, Scalar) => {
        #[test]
        fn scalar() {
            $crate::cpu::run_at($crate::cpu::CpuLevel::Scalar, $check);
        }
    };
    (@one $check:path, Avx2) => {
        #[test]
        #[cfg_attr(not(host_avx2), ignore = "CPU lacks avx2+fma+f16c")]
        fn avx2() {
            $crate::cpu::run_at($crate::cpu::CpuLevel::Avx2, $check);
        }
    };
    (@one $check:path, AvxVnni) => {
        #[test]
        #[cfg_attr(not(host_avxvnni), ignore = "CPU lacks avxvnni")]
        fn avxvnni() {
            $crate::cpu::run_at($crate::cpu::CpuLevel::AvxVnni, $check);
        }
    };
    (@one $check:path, Avx512) => {
        #[test]
        #[cfg_attr(not(host_avx512), ignore = "CPU lacks avx512f+bw+vl")]
        fn avx512() {
            $crate::cpu::run_at($crate::cpu::CpuLevel::Avx512, $check);
        }
    };
    (@one $check:path, Avx512Vnni) => {
        #[test]
        #[cfg_attr(not(host_avx512vnni), ignore = "CPU lacks avx512vnni")]
        fn avx512vnni() {
            $crate::cpu::run_at($crate::cpu::CpuLevel::Avx512Vnni, $check);
        }
    };
}

pub(crate) mod attention;
pub(crate) mod dense;
pub(crate) mod dequant;
pub(crate) mod dot;
pub(crate) mod encoder;
pub(crate) mod features;
pub(crate) mod gemm;
pub(crate) mod kquant;
pub(crate) mod matmul;
pub mod ops;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel;
pub(crate) mod q8;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use attention::{fused_attention, fused_attention_available};
pub use dense::{gemm_ab, gemm_abt};
pub use dequant::dequantize_row;
pub use encoder::{add_layer_norm, erf, softmax_rows, Activation};
pub use features::{cpu_features, cpu_isa, cpu_level, CpuFeatures, CpuLevel, Isa, CPU_LEVEL_VAR};
pub use gemm::{gemm_packed, gemm_packed_cols, gemm_packed_post, Epilogue, PackedB, PackedCols};
pub use kquant::INTERLEAVE_VAR;
pub(crate) use kquant::{
    dequantize_interleaved_row, has_interleaved_layout, interleave, interleaving_pays,
};
pub use kquant::{quantize_row_q8k, Q8KBlock, QK_K};
pub use matmul::{matmul, matmul_multi, matmul_multi_q8, matmul_q8, MatmulJob};
pub use q8::{q8_supports, quantize_row_q8, Q8Block, Q8_BLOCK};

/// Runs `check` on `level`, which the build machine has (the per-level tests are ignored
/// elsewhere).
#[cfg(test)]
pub(crate) fn run_at(level: CpuLevel, check: impl FnOnce(Isa)) {
    let isa = Isa::new(level).unwrap_or_else(|| {
        panic!("the build saw {level} on this CPU, but run-time detection does not")
    });
    check(isa);
}

#[cfg(test)]
mod tests;

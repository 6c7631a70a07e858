//! Compute kernels for the engine's models: CPU kernels, and the CUDA kernels with the device
//! layer that runs them ([`gpu`]).
//!
//! - [`DType`] and [`QMatrix`]: weight storage types (F32, F16, BF16, Q8_0, Q4_0, Q4_1) viewed
//!   in place (a memory-mapped checkpoint is used as is; nothing is dequantised at load).
//! - [`matmul`] / [`matmul_multi`]: `out = x · Wᵀ` with f32 activations. Few activation rows
//!   (decode) run a fused kernel that dequantises each block inside the dot product; many rows
//!   (prefill) dequantise weight tiles into a scratch buffer and call the `gemm` crate. Both keep
//!   f32 accuracy.
//! - [`matmul_q8`] / [`matmul_multi_q8`]: the same products with the activations quantised to
//!   8-bit blocks ([`Q8Block`], [`quantize_row_q8`]) and integer dot products against Q4_0,
//!   Q4_1 and Q8_0 weights (AVX2, AVX-VNNI or AVX-512 VNNI, chosen at run time by
//!   [`q8_level`]). Faster for decode; the activations carry quantisation error.
//! - [`ops`]: RMSNorm, RoPE, SiLU·mul, softmax, dot/axpy helpers.
//!
//! SIMD is chosen at run time (AVX2+FMA+F16C on x86_64, with a scalar fallback everywhere).
//! Parallel work runs on the current rayon pool: install a pool of the wanted size around
//! calls (or build the global pool once) to control the thread count.

mod dense;
mod dequant;
mod dot;
mod dtype;
pub mod gpu;
mod matmul;
pub mod ops;
mod q8;
mod simd;

pub use dense::{gemm_ab, gemm_abt};
pub use dequant::dequantize_row;
pub use dtype::{DType, KernelError, QMatrix};
pub use matmul::{matmul, matmul_multi, matmul_multi_q8, matmul_q8, MatmulJob};
pub use q8::{q8_level, q8_supports, quantize_row_q8, Q8Block, Q8Level, Q8_BLOCK};
pub use simd::{simd_level, SimdLevel};

#[cfg(test)]
mod tests;

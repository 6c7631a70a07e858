//! Compute kernels for the engine's models: CPU kernels, and the CUDA kernels with the device
//! layer that runs them ([`gpu`]).
//!
//! - [`DType`] and [`QMatrix`]: weight storage types (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
//!   Q5_1, IQ4_NL, the K-quants Q2_K..Q6_K and IQ4_XS, in ggml's block layouts) viewed in place
//!   (a memory-mapped checkpoint is used as is; nothing is dequantised at load).
//! - [`matmul`] / [`matmul_multi`]: `out = x · Wᵀ` with f32 activations. Few activation rows
//!   (decode) run a fused kernel that dequantises each block inside the dot product; many rows
//!   (prefill) dequantise weight tiles into a scratch buffer and call the `gemm` crate. Both keep
//!   f32 accuracy.
//! - [`matmul_q8`] / [`matmul_multi_q8`]: the same products with the activations quantised to
//!   8-bit blocks ([`Q8Block`] of 32 values, [`Q8KBlock`] of 256 for the super-block types)
//!   and integer dot products against every quantised type (AVX2 `maddubs` for all; AVX-VNNI
//!   and AVX-512 VNNI `vpdpbusd` for the wide byte products of Q8_0 and IQ4_NL). Faster for
//!   decode; the activations carry quantisation error.
//! - [`ops`]: RMSNorm, RoPE, SiLU·mul, softmax, dot/axpy helpers.
//! - [`sampling`]: the sampler's semantics, once: the CPU sampler runs it and the GPU sampling
//!   kernel is tested against it.
//! - The encoder's f32 compute: [`PackedB`] / [`gemm_packed`], [`add_layer_norm`],
//!   [`Activation`], [`softmax_rows`], [`fused_attention`].
//!
//! SIMD is chosen at run time by one detector, [`cpu_isa`] (AVX2+FMA+F16C, AVX-VNNI, AVX-512,
//! AVX-512 VNNI on x86_64, with a scalar fallback everywhere); the environment variable
//! `KERNELS_CPU_LEVEL=scalar|avx2|avxvnni|avx512|avx512vnni` caps it.
//! Parallel work runs on the current rayon pool: install a pool of the wanted size around
//! calls (or build the global pool once) to control the thread count.

mod cpu;
mod dtype;
pub mod gpu;
pub mod sampling;

pub use cpu::ops;
pub use cpu::{
    add_layer_norm, cpu_features, cpu_isa, cpu_level, dequantize_row, erf, fused_attention,
    fused_attention_available, gemm_ab, gemm_abt, gemm_packed, gemm_packed_cols, gemm_packed_post,
    matmul, matmul_multi, matmul_multi_q8, matmul_q8, q8_supports, quantize_row_q8,
    quantize_row_q8k, softmax_rows, Activation, CpuFeatures, CpuLevel, Epilogue, Isa, MatmulJob,
    PackedB, PackedCols, Q8Block, Q8KBlock, CPU_LEVEL_VAR, INTERLEAVE_VAR, Q8_BLOCK, QK_K,
};
pub use dtype::{interleave_rows, interleaving_pays, DType, KernelError, QMatrix};

// SwiGLU: out[t][i] = silu(g) · u with g = gate_up[t][i], u = gate_up[t][ffn + i] and
// silu(g) = g / (1 + exp(−g)), evaluated in f32 in the order kernels::ops::silu_mul uses and
// stored as T (the down projection's input type). gate_up is the f32 output of the fused
// gate|up GEMM, n_tokens × 2·ffn; out is n_tokens × ffn.
// Launch: grid.x = n_tokens, any grid.y (columns split over the y blocks).
#include "common.cuh"

template <typename T>
DEV void swiglu_row(const float* __restrict__ gate_up, T* __restrict__ out, int ffn) {
  const long t = blockIdx.x;
  const float* gate = gate_up + t * 2L * ffn;
  const float* up = gate + ffn;
  T* o = out + t * (long)ffn;
  const int first = (int)(blockIdx.y * blockDim.x + threadIdx.x);
  const int stride = (int)(gridDim.y * blockDim.x);
  for (int i = first; i < ffn; i += stride) {
    const float g = gate[i];
    // exp(−g) overflows to inf for g < −88: g / inf is −0, the limit of silu.
    o[i] = from_f32<T>(g / (1.f + expf(-g)) * up[i]);
  }
}

KERNEL_BOUNDED(swiglu_f32, 256)(const float* gate_up, float* out, int ffn) {
  swiglu_row<float>(gate_up, out, ffn);
}
KERNEL_BOUNDED(swiglu_bf16, 256)(const float* gate_up, bf16* out, int ffn) {
  swiglu_row<bf16>(gate_up, out, ffn);
}
KERNEL_BOUNDED(swiglu_f16, 256)(const float* gate_up, f16* out, int ffn) {
  swiglu_row<f16>(gate_up, out, ffn);
}

EMU_KERNEL(swiglu_f32)
EMU_KERNEL(swiglu_bf16)
EMU_KERNEL(swiglu_f16)

// Gated MLP activation: out[t][i] = act(g) · u with g = gate_up[t][i], u = gate_up[t][ffn + i],
// evaluated in f32 and stored as T (the down projection's input type). gate_up is the f32
// output of the fused gate|up GEMM, n_tokens × 2·ffn; out is n_tokens × ffn. act is
// - SiLU (gelu == 0): g / (1 + exp(−g)), in the order kernels::ops::silu_mul uses (SwiGLU);
// - GELU, tanh approximation (gelu != 0): 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))
//   (GeGLU, `gelu_pytorch_tanh`).
// Launch: grid.x = n_tokens, any grid.y (columns split over the y blocks).
#include "common.cuh"

template <typename T>
DEV void glu_row(const float* __restrict__ gate_up, T* __restrict__ out, int ffn, int gelu) {
  const long t = blockIdx.x;
  const float* gate = gate_up + t * 2L * ffn;
  const float* up = gate + ffn;
  T* o = out + t * (long)ffn;
  const int first = (int)(blockIdx.y * blockDim.x + threadIdx.x);
  const int stride = (int)(gridDim.y * blockDim.x);
  for (int i = first; i < ffn; i += stride) {
    const float g = gate[i];
    float a;
    if (gelu) {
      const float k = 0.7978845608028654f;  // √(2/π)
      a = 0.5f * g * (1.f + tanhf(k * (g + 0.044715f * g * g * g)));
    } else {
      // exp(−g) overflows to inf for g < −88: g / inf is −0, the limit of silu.
      a = g / (1.f + expf(-g));
    }
    o[i] = from_f32<T>(a * up[i]);
  }
}

KERNEL_BOUNDED(glu_f32, 256)(const float* gate_up, float* out, int ffn, int gelu) {
  glu_row<float>(gate_up, out, ffn, gelu);
}
KERNEL_BOUNDED(glu_bf16, 256)(const float* gate_up, bf16* out, int ffn, int gelu) {
  glu_row<bf16>(gate_up, out, ffn, gelu);
}
KERNEL_BOUNDED(glu_f16, 256)(const float* gate_up, f16* out, int ffn, int gelu) {
  glu_row<f16>(gate_up, out, ffn, gelu);
}

EMU_KERNEL(glu_f32)
EMU_KERNEL(glu_bf16)
EMU_KERNEL(glu_f16)

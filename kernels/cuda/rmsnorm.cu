// RMSNorm fused with the residual add: `x += delta` (when delta is given), then
// `out = x / sqrt(mean(x^2) + eps) * weight`, in the storage type of the next GEMM's input.
// With delta_weight as well, delta is normed first: `x += delta / sqrt(mean(delta^2) + eps) *
// delta_weight` (Gemma's norms of the attention's and the MLP's outputs, same eps).
// One block per row; the residual stream `x` stays f32.
#include "common.cuh"

// rows: when given, block b handles row rows[b] of x (and delta) and writes row b of out, so
// the final norm can pick the rows whose logits are wanted.
template <typename T>
DEV void add_rmsnorm(float* __restrict__ x, const float* __restrict__ delta,
                     const float* __restrict__ delta_weight, const float* __restrict__ weight,
                     T* __restrict__ out, const int* __restrict__ rows, int hidden, float eps) {
  __shared__ float scratch[32];
  const int b = blockIdx.x;
  const long r = rows ? rows[b] : b;
  float* xr = x + r * (long)hidden;
  const float* dr = delta ? delta + r * (long)hidden : nullptr;
  // The pointers are the same for the whole block: every thread takes the same branches and
  // reaches each block_sum.
  float inv_d = 1.f;
  if (dr && delta_weight) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += dr[i] * dr[i];
    inv_d = rsqrtf(block_sum(ss, scratch) / (float)hidden + eps);
  }
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = xr[i];
    if (dr) {
      v += delta_weight ? delta_weight[i] * (dr[i] * inv_d) : dr[i];
      xr[i] = v;
    }
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / (float)hidden + eps);
  T* o = out + (long)b * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = from_f32<T>(xr[i] * inv * weight[i]);
}

KERNEL_BOUNDED(add_rmsnorm_f32, 256)(float* x, const float* delta, const float* delta_weight,
                                     const float* weight, float* out, const int* rows, int hidden,
                                     float eps) {
  add_rmsnorm<float>(x, delta, delta_weight, weight, out, rows, hidden, eps);
}
KERNEL_BOUNDED(add_rmsnorm_bf16, 256)(float* x, const float* delta, const float* delta_weight,
                                      const float* weight, bf16* out, const int* rows, int hidden,
                                      float eps) {
  add_rmsnorm<bf16>(x, delta, delta_weight, weight, out, rows, hidden, eps);
}
KERNEL_BOUNDED(add_rmsnorm_f16, 256)(float* x, const float* delta, const float* delta_weight,
                                     const float* weight, f16* out, const int* rows, int hidden,
                                     float eps) {
  add_rmsnorm<f16>(x, delta, delta_weight, weight, out, rows, hidden, eps);
}

EMU_KERNEL(add_rmsnorm_f32)
EMU_KERNEL(add_rmsnorm_bf16)
EMU_KERNEL(add_rmsnorm_f16)

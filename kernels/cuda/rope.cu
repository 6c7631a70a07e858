// Attention input preparation, in place on each f32 row of the fused QKV projection
// qkv[t] = [q heads | k heads | v heads] (n_heads, n_kv_heads, n_kv_heads heads of head_dim;
// row stride qkv_stride), in the order the CPU decoder (engine/src/models/llama.rs) applies:
// (a) bias, when given: qkv[t][j] += bias[j] for j < (n_heads + 2·n_kv_heads)·head_dim;
// (b) q_norm / k_norm, when given (Qwen3): RMSNorm of each q (k) head on its own,
//     h = w · (h · 1/sqrt(mean(h²) + eps)) as kernels::ops::rmsnorm computes it (sum of
//     squares in f64);
// (c) RoPE on the first rope_dim elements of every q and k head (v untouched). Frequency
//     i < rope_dim/2 turns by angle = ((float)pos · freq_scale) · inv_freq[i] (f32 products, as
//     kernels::ops::rope_angles), cos/sin evaluated in f64 and rounded to f32 as it does;
//     pos = max(positions[t·pos_axes + axis(i)], 0) with axis(i) = 0 when pos_axes == 1,
//     else (M-RoPE, Qwen2-VL: temporal, row, column) 0 for i < section0, 1 for
//     i < section0 + section1, 2 beyond. neox pairs (i, i + rope_dim/2), otherwise
//     (2i, 2i + 1); (a, b) -> (a·cos − b·sin, a·sin + b·cos).
// inv_freq (rope_dim/2 floats) comes from gpu::ops::rope_inv_freq.
// Launch: grid.x = n_tokens; a block of whole warps, one warp per head at a time; dynamic
// shared memory of rope_dim floats (the token's cos and sin).
#include "common.cuh"

DEV double rope_warp_sum_f64(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

KERNEL_BOUNDED(rope_qk, 256)(float* qkv, const float* bias, const float* q_norm, const float* k_norm,
                    const float* inv_freq, const int* positions, int qkv_stride, int n_heads,
                    int n_kv_heads, int head_dim, int rope_dim, int neox, int pos_axes,
                    int section0, int section1, float freq_scale, float eps) {
  DYN_SHARED(float, rot);  // rot[i] = cos, rot[half + i] = sin of frequency i
  const int half = rope_dim / 2;
  const long t = blockIdx.x;
  float* row = qkv + t * (long)qkv_stride;

  // The angles depend on the token only: computed once, shared by every head.
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const int axis = pos_axes == 1 ? 0 : (i < section0 ? 0 : (i < section0 + section1 ? 1 : 2));
    const int pos = max(positions[t * pos_axes + axis], 0);
    const float angle = ((float)pos * freq_scale) * inv_freq[i];
    rot[i] = (float)cos((double)angle);
    rot[half + i] = (float)sin((double)angle);
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int qk_heads = n_heads + n_kv_heads;
  // v heads need only their bias.
  const int heads = bias ? qk_heads + n_kv_heads : qk_heads;
  // Every branch below depends on the head only, so the whole warp takes it together.
  for (int h = warp; h < heads; h += n_warps) {
    float* x = row + (long)h * head_dim;
    if (bias) {
      const float* b = bias + (long)h * head_dim;
      for (int j = lane; j < head_dim; j += 32) x[j] += b[j];
    }
    if (h >= qk_heads) continue;
    const float* w = h < n_heads ? q_norm : k_norm;
    if (w) {
      double ss = 0.0;
      for (int j = lane; j < head_dim; j += 32) ss += (double)x[j] * (double)x[j];
      ss = rope_warp_sum_f64(ss);
      const float inv = 1.f / sqrtf((float)(ss / (double)head_dim) + eps);
      for (int j = lane; j < head_dim; j += 32) x[j] = w[j] * (x[j] * inv);
    }
    // The pairs cross lanes: each lane must see the others' writes above.
    __syncwarp();
    for (int i = lane; i < half; i += 32) {
      const int i0 = neox ? i : 2 * i;
      const int i1 = neox ? i + half : 2 * i + 1;
      const float a = x[i0], b = x[i1], c = rot[i], s = rot[half + i];
      x[i0] = a * c - b * s;
      x[i1] = a * s + b * c;
    }
    // The next head's bias pass does not touch this head: no barrier needed before it.
  }
}

EMU_KERNEL(rope_qk)

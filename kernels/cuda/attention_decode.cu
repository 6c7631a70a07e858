// Paged attention for decode: each query row against its own sequence's cached keys and values.
//
// Query row t (f32, head h at q[t·q_stride + h·head_dim]) belongs to block-table row q_seq[t]
// and sees the q_ctx[t] keys at positions 0..q_ctx[t]−1 (the step's own key is already in the
// cache), or with a sliding window w > 0 only the last w of them (positions before are never
// read). The token at position p lives in block block_tables[row·max_blocks + p / block_size],
// slot p % block_size; one layer's cache is [num_blocks][block_size][n_kv_heads][head_dim] of T.
// Query head h reads KV head h / (n_heads / n_kv_heads) (GQA). Scores are q·k·scale; with
// softcap > 0 they become softcap·tanh(score / softcap) before the softmax (Gemma 2). The
// output, row t head h at out[t·out_stride + h·head_dim], is stored as T (it feeds the output
// projection).
//
// Launch: grid (n_queries, n_heads), 128 threads, no dynamic shared memory; head_dim a multiple
// of 8 up to 256, caches 16-byte aligned (the launcher checks both).
//
// Each lane owns 8 consecutive dimensions, so one key row is read with 16-byte loads by a group
// of `lpk` lanes (the power of two covering head_dim / 8: 16 lanes for head_dim 128, all 32 for
// 256); a warp therefore works on 32 / lpk keys at once, and each group takes two keys per step
// so that four 16-byte loads (eight for f32) are in flight per lane. The score needs log2(lpk)
// shuffles. Every group keeps its own online softmax (running max, running sum, rescaled
// accumulator) in registers, so any context length works without memory proportional to it; the
// groups of all four warps are merged through shared memory at the end.
#include "common.cuh"

namespace attn_decode_impl {

constexpr int WARPS = 4;
constexpr int THREADS = 32 * WARPS;
// Keys each lane group takes per step (independent loads in flight).
constexpr int KEYS_PER_STEP = 2;

// Lanes per key row: the power of two covering head_dim / 8.
DEV int lanes_per_key(int head_dim) {
  int l = 1;
  while (8 * l < head_dim) l <<= 1;
  return l;
}

template <typename T>
DEV void attn_decode(T* __restrict__ out, const float* __restrict__ q,
                     const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                     const int* __restrict__ block_tables, const int* __restrict__ q_seq,
                     const int* __restrict__ q_ctx, int q_stride, int out_stride, int n_heads,
                     int n_kv_heads, int head_dim, int block_size, int max_blocks, float scale,
                     int window, float softcap) {
  // One slot per lane group: (THREADS / lpk) groups of head_dim <= 8·lpk accumulators.
  __shared__ float group_acc[THREADS * 8];
  __shared__ float group_m[THREADS], group_l[THREADS], group_w[THREADS];

  const int t = blockIdx.x, h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lpk = lanes_per_key(head_dim), keys_per_warp = 32 / lpk;
  const int g = lane & (lpk - 1), sub = lane / lpk;
  const int d0 = 8 * g;
  // Lanes past head_dim (head_dim 80 uses 10 of 16) take part in the shuffles with zeros.
  const bool has_dims = d0 < head_dim;
  const int kvh = h / (n_heads / n_kv_heads);
  const long kv_dim = (long)n_kv_heads * head_dim;
  const long head_off = (long)kvh * head_dim + d0;
  const int* table = block_tables + (long)q_seq[t] * max_blocks;
  const int ctx = q_ctx[t];
  const int first = window > 0 ? max(ctx - window, 0) : 0;

  float qv[8], acc[8];
  {
    const float* qh = q + (long)t * q_stride + (long)h * head_dim + d0;
    UNROLL for (int i = 0; i < 8; ++i) {
      qv[i] = has_dims ? qh[i] * scale : 0.f;
      acc[i] = 0.f;
    }
  }
  float m = neg_inf(), l = 0.f;

  // Keys of one round of the block: every group of every warp takes one.
  const int round = WARPS * keys_per_warp;
  // The loop bound is warp-uniform (every lane reaches every shuffle); keys past the context
  // are masked per lane.
  for (int base = first + warp * keys_per_warp; base < ctx; base += KEYS_PER_STEP * round) {
    float kf[KEYS_PER_STEP][8], vf[KEYS_PER_STEP][8], s[KEYS_PER_STEP];
    bool valid[KEYS_PER_STEP];
    UNROLL for (int u = 0; u < KEYS_PER_STEP; ++u) {
      const int j = base + u * round + sub;
      valid[u] = j < ctx;
      if (valid[u] && has_dims) {
        const long slot = (long)table[j / block_size] * block_size + j % block_size;
        load8(k_cache + slot * kv_dim + head_off, kf[u]);
        load8(v_cache + slot * kv_dim + head_off, vf[u]);
      } else {
        UNROLL for (int i = 0; i < 8; ++i) kf[u][i] = vf[u][i] = 0.f;
      }
    }
    UNROLL for (int u = 0; u < KEYS_PER_STEP; ++u) {
      s[u] = 0.f;
      UNROLL for (int i = 0; i < 8; ++i) s[u] += qv[i] * kf[u][i];
    }
    for (int o = 1; o < lpk; o <<= 1) {
      UNROLL for (int u = 0; u < KEYS_PER_STEP; ++u) s[u] += __shfl_xor_sync(0xffffffffu, s[u], o);
    }
    if (softcap > 0.f) {
      UNROLL for (int u = 0; u < KEYS_PER_STEP; ++u) s[u] = softcap * tanhf(s[u] / softcap);
    }
    // valid[0] is false only when this group has no key left (keys rise with u).
    if (valid[0]) {
      float mx = m;
      UNROLL for (int u = 0; u < KEYS_PER_STEP; ++u) if (valid[u]) mx = fmaxf(mx, s[u]);
      const float corr = expf(m - mx);  // 0 while m is still -inf
      l *= corr;
      UNROLL for (int i = 0; i < 8; ++i) acc[i] *= corr;
      UNROLL for (int u = 0; u < KEYS_PER_STEP; ++u) {
        if (!valid[u]) continue;
        const float p = expf(s[u] - mx);
        l += p;
        UNROLL for (int i = 0; i < 8; ++i) acc[i] += p * vf[u][i];
      }
      m = mx;
    }
  }

  const int group = warp * keys_per_warp + sub;
  const int n_groups = WARPS * keys_per_warp;
  if (g == 0) {
    group_m[group] = m;
    group_l[group] = l;
  }
  if (has_dims) {
    UNROLL for (int i = 0; i < 8; ++i) group_acc[group * head_dim + d0 + i] = acc[i];
  }
  __syncthreads();
  float big = neg_inf();
  for (int k = 0; k < n_groups; ++k) big = fmaxf(big, group_m[k]);
  // A group that saw no key (a context shorter than the groups) has m = -inf: weight 0.
  if ((int)threadIdx.x < n_groups) {
    const float mk = group_m[threadIdx.x];
    group_w[threadIdx.x] = mk == neg_inf() ? 0.f : expf(mk - big);
  }
  __syncthreads();
  float total = 0.f;
  for (int k = 0; k < n_groups; ++k) total += group_l[k] * group_w[k];
  // An empty context (q_ctx 0, outside the contract) gives zeros rather than NaN.
  const float inv = total > 0.f ? 1.f / total : 0.f;
  T* o = out + (long)t * out_stride + (long)h * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.f;
    for (int k = 0; k < n_groups; ++k) sum += group_acc[k * head_dim + d] * group_w[k];
    o[d] = from_f32<T>(sum * inv);
  }
}

}  // namespace attn_decode_impl

KERNEL_BOUNDED(attn_decode_f32, 128)(float* out, const float* q, const float* k_cache,
    const float* v_cache, const int* block_tables, const int* q_seq, const int* q_ctx,
    int q_stride, int out_stride, int n_heads, int n_kv_heads, int head_dim, int block_size,
    int max_blocks, float scale, int window, float softcap) {
  attn_decode_impl::attn_decode<float>(out, q, k_cache, v_cache, block_tables, q_seq, q_ctx,
                                     q_stride, out_stride, n_heads, n_kv_heads, head_dim,
                                     block_size, max_blocks, scale, window, softcap);
}
KERNEL_BOUNDED(attn_decode_bf16, 128)(bf16* out, const float* q, const bf16* k_cache,
    const bf16* v_cache, const int* block_tables, const int* q_seq, const int* q_ctx,
    int q_stride, int out_stride, int n_heads, int n_kv_heads, int head_dim, int block_size,
    int max_blocks, float scale, int window, float softcap) {
  attn_decode_impl::attn_decode<bf16>(out, q, k_cache, v_cache, block_tables, q_seq, q_ctx,
                                     q_stride, out_stride, n_heads, n_kv_heads, head_dim,
                                     block_size, max_blocks, scale, window, softcap);
}
KERNEL_BOUNDED(attn_decode_f16, 128)(f16* out, const float* q, const f16* k_cache,
    const f16* v_cache, const int* block_tables, const int* q_seq, const int* q_ctx,
    int q_stride, int out_stride, int n_heads, int n_kv_heads, int head_dim, int block_size,
    int max_blocks, float scale, int window, float softcap) {
  attn_decode_impl::attn_decode<f16>(out, q, k_cache, v_cache, block_tables, q_seq, q_ctx,
                                     q_stride, out_stride, n_heads, n_kv_heads, head_dim,
                                     block_size, max_blocks, scale, window, softcap);
}

EMU_KERNEL(attn_decode_f32)
EMU_KERNEL(attn_decode_bf16)
EMU_KERNEL(attn_decode_f16)

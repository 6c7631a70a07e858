// Paged attention for prefill chunks: tiles of consecutive query rows of one sequence (causal,
// varlen across sequences), reading every earlier position from the cache.
//
// Tile b is tiles[4b .. 4b+4] = (first query row, query rows in the tile (1..=TILE), block-table
// row, context length of its first query); query i of the tile sees ctx0 + i keys (positions
// 0..ctx0+i−1, its own included: the step's keys are already in the cache), or with a sliding
// window w > 0 only the last w of them: the tile reads no position that none of its queries
// sees. Scores are soft-capped when softcap > 0, as in attention_decode.cu. Layouts as in
// attention_decode.cu: q f32 with row stride q_stride, the cache
// [num_blocks][block_size][n_kv_heads][head_dim] of T (16-byte aligned), out T with row stride
// out_stride, GQA by h / (n_heads / n_kv_heads).
//
// Launch: grid (n_tiles, n_heads), 128 threads, dynamic shared memory shared_floats(head_dim,
// lanes_per_key(head_dim)) floats (the launcher's prefill_shared_bytes mirrors both).
//
// The tile's queries (scaled, transposed) stay in shared memory; the block then walks the
// context in passes of `kpp` keys, staging their keys and values as f32 so that all 16 queries
// reuse them. Warp w owns queries 4w..4w+3 and, per pass:
// - scores: lane = part·kpp + key computes the dot products of its key with the warp's four
//   queries over its `part` of head_dim (kpp = 32 keys per pass when the stage fits 48 KiB,
//   else 16 or 8, with 2 or 4 lanes per key), reading one key element and the four queries'
//   element (one 16-byte broadcast) per step; no shuffles but the parts' sum;
// - online softmax per query over the pass (running max, running sum kept per lane, rescaled
//   accumulator): the probabilities go to a per-warp slice of shared memory;
// - values: lanes span head_dim (NE = ceil(head_dim / 32) accumulators per query, a template
//   parameter so the register arrays are indexed by constants).
// Key rows are padded to an odd stride so the lanes of the score step hit distinct banks.
//
// A query row's result does not depend on its tile (which rows share it, where it sits in it,
// how long it is), so a one-row tile (a decode row) and any prefill tiling give the same bits
// for the same query and cache: the passes start at multiples of kpp from position 0 whatever
// the tile, every per-query quantity (score, running max, each lane's running sum, the
// accumulators) is updated from that query's own keys in pass order, and a key a query does
// not see changes nothing (weight 0 against a finite or zeroed value; a correction of
// exp(0) = 1). Positions before the tile's first visible key are never read: their stage
// slots are zeroed.
#include "common.cuh"

namespace attn_prefill_impl {

constexpr int TILE = 16;  // PREFILL_TILE on the host
constexpr int WARPS = 4;
constexpr int QPW = TILE / WARPS;  // queries per warp
constexpr int MAX_SHARED = 48 * 1024;

struct __align__(16) Float4 {
  float v[4];
};

// Shared floats for `lpk` lanes per key (kpp = 32 / lpk keys per pass): the queries
// [head_dim][TILE], the probabilities [WARPS][kpp][QPW], the values [kpp][head_dim] and the keys
// [32][head_dim / lpk + 1], in that order (each part starts 16-byte aligned but the last).
DEV int shared_floats(int head_dim, int lpk) {
  const int kpp = 32 / lpk;
  return TILE * head_dim + WARPS * kpp * QPW + kpp * head_dim + 32 * (head_dim / lpk + 1);
}

// The fewest lanes per key (the most keys per pass) whose stage fits 48 KiB.
DEV int lanes_per_key(int head_dim) {
  int lpk = 1;
  while (lpk < 4 && 4 * shared_floats(head_dim, lpk) > MAX_SHARED) lpk <<= 1;
  return lpk;
}

template <typename T, int NE>
DEV void attn_prefill(T* __restrict__ out, const float* __restrict__ q,
                      const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                      const int* __restrict__ block_tables, const int* __restrict__ tiles,
                      int q_stride, int out_stride, int n_heads, int n_kv_heads, int head_dim,
                      int block_size, int max_blocks, float scale, int window,
                      float softcap) {
  DYN_SHARED(float, smem);
  const int lpk = lanes_per_key(head_dim), kpp = 32 / lpk, hp = head_dim / lpk;
  float* q_t = smem;                        // [head_dim][TILE], scaled
  float* probs = q_t + TILE * head_dim;     // [WARPS][kpp][QPW]
  float* vals = probs + WARPS * kpp * QPW;  // [kpp][head_dim]
  float* keys = vals + kpp * head_dim;      // [32][hp + 1]: row part·kpp + j, dims part·hp..

  const int* tile = tiles + 4 * (long)blockIdx.x;
  const int first_row = tile[0], n_rows = tile[1], ctx0 = tile[3];
  const int* table = block_tables + (long)tile[2] * max_blocks;
  const int h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kj = lane & (kpp - 1), part = lane / kpp;
  const int q0 = warp * QPW;
  const int kvh = h / (n_heads / n_kv_heads);
  const long kv_dim = (long)n_kv_heads * head_dim;
  const long head_off = (long)kvh * head_dim;
  // The last query's context: every key the tile needs.
  const int ctx_end = ctx0 + n_rows - 1;
  // The first query's window: the first key the tile needs; its pass starts at the multiple
  // of kpp below it.
  const int first = window > 0 ? max(ctx0 - window, 0) : 0;
  const int first_pass = first - first % kpp;
  // The warp's rows that hold a query (warp-uniform): the others skip their arithmetic and
  // shuffles, so a one-row tile costs one warp's work (a warp with none only stages keys).
  const int rows_here = min(QPW, n_rows - q0);

  for (int i = threadIdx.x; i < TILE * head_dim; i += blockDim.x) {
    const int r = i / head_dim, d = i - r * head_dim;
    q_t[d * TILE + r] =
        r < n_rows ? q[(long)(first_row + r) * q_stride + (long)h * head_dim + d] * scale : 0.f;
  }

  float acc[QPW][NE], m[QPW], l[QPW];
  UNROLL for (int r = 0; r < QPW; ++r) {
    UNROLL for (int e = 0; e < NE; ++e) acc[r][e] = 0.f;
    m[r] = neg_inf();
    l[r] = 0.f;  // this lane's keys only; summed over the warp at the end
  }

  const int groups = head_dim / 8;
  for (int c0 = first_pass; c0 < ctx_end; c0 += kpp) {
    const int n = min(kpp, ctx_end - c0);
    __syncthreads();  // the previous pass is done with the stage (and the queries are written)
    for (int i = threadIdx.x; i < n * groups; i += blockDim.x) {
      const int j = i / groups, d = 8 * (i - j * groups);
      const int p = c0 + j;
      float kf[8], vf[8];
      if (p >= first) {
        const long off =
            ((long)table[p / block_size] * block_size + p % block_size) * kv_dim + head_off + d;
        load8(k_cache + off, kf);
        load8(v_cache + off, vf);
      } else {
        UNROLL for (int e = 0; e < 8; ++e) kf[e] = vf[e] = 0.f;
      }
      UNROLL for (int e = 0; e < 8; ++e) {
        const int dd = d + e, pt = dd / hp;
        keys[(pt * kpp + j) * (hp + 1) + dd - pt * hp] = kf[e];
        vals[j * head_dim + dd] = vf[e];
      }
    }
    __syncthreads();
    if (rows_here <= 0) continue;

    // Scores of key c0 + kj against the warp's queries, over this lane's part of head_dim.
    float s[QPW];
    UNROLL for (int r = 0; r < QPW; ++r) s[r] = 0.f;
    {
      const float* kr = keys + lane * (hp + 1);
      const Float4* qc = reinterpret_cast<const Float4*>(q_t + part * hp * TILE + q0);
      for (int i = 0; i < hp; ++i) {
        const float k = kr[i];
        const Float4 qq = qc[i * (TILE / 4)];
        UNROLL for (int r = 0; r < QPW; ++r) s[r] += qq.v[r] * k;
      }
    }
    for (int o = kpp; o < 32; o <<= 1) {
      UNROLL for (int r = 0; r < QPW; ++r) {
        if (r < rows_here) s[r] += __shfl_xor_sync(0xffffffffu, s[r], o);
      }
    }
    if (softcap > 0.f) {
      UNROLL for (int r = 0; r < QPW; ++r) s[r] = softcap * tanhf(s[r] / softcap);
    }

    const int p = c0 + kj;
    float pr[QPW];
    UNROLL for (int r = 0; r < QPW; ++r) {
      if (r >= rows_here) {
        pr[r] = 0.f;
        continue;
      }
      // Also false for the rows of a pass past its n keys (they hold stale values).
      const int ctx = ctx0 + q0 + r;
      const bool ok = p < ctx && (window <= 0 || p >= ctx - window);
      const float sv = ok ? s[r] : neg_inf();
      float mx = sv;
      for (int o = 1; o < kpp; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m[r], mx);
      // A query with no key yet keeps m = -inf and zero weights.
      const float mu = m_new == neg_inf() ? 0.f : m_new;
      const float corr = expf(m[r] - mu);
      pr[r] = ok ? expf(sv - mu) : 0.f;
      l[r] = l[r] * corr + (part == 0 ? pr[r] : 0.f);
      UNROLL for (int e = 0; e < NE; ++e) acc[r][e] *= corr;
      m[r] = m_new;
    }
    Float4* wp = reinterpret_cast<Float4*>(probs) + warp * kpp;
    if (part == 0) {
      Float4 pv;
      UNROLL for (int r = 0; r < QPW; ++r) pv.v[r] = pr[r];
      wp[kj] = pv;
    }
    __syncwarp();

    for (int j = 0; j < n; ++j) {
      const Float4 pv = wp[j];
      const float* vr = vals + j * head_dim + lane;
      UNROLL for (int e = 0; e < NE; ++e) {
        const float v = lane + 32 * e < head_dim ? vr[32 * e] : 0.f;
        UNROLL for (int r = 0; r < QPW; ++r) acc[r][e] += pv.v[r] * v;
      }
    }
  }

  UNROLL for (int r = 0; r < QPW; ++r) {
    if (r >= rows_here) continue;
    const float inv = 1.f / warp_sum(l[r]);
    T* o = out + (long)(first_row + q0 + r) * out_stride + (long)h * head_dim;
    UNROLL for (int e = 0; e < NE; ++e) {
      const int d = lane + 32 * e;
      if (d < head_dim) o[d] = from_f32<T>(acc[r][e] * inv);
    }
  }
}

// One instantiation per accumulator count, so the register arrays have constant bounds.
template <typename T>
DEV void attn_prefill_any(T* out, const float* q, const T* k_cache, const T* v_cache,
                          const int* block_tables, const int* tiles, int q_stride,
                          int out_stride, int n_heads, int n_kv_heads, int head_dim,
                          int block_size, int max_blocks, float scale, int window,
                          float softcap) {
#define ATTN_PREFILL_CASE(ne)                                                                 \
  case ne:                                                                                    \
    attn_prefill<T, ne>(out, q, k_cache, v_cache, block_tables, tiles, q_stride, out_stride, \
                        n_heads, n_kv_heads, head_dim, block_size, max_blocks, scale, window, \
                        softcap);                                                             \
    break;
  switch ((head_dim + 31) / 32) {
    ATTN_PREFILL_CASE(1)
    ATTN_PREFILL_CASE(2)
    ATTN_PREFILL_CASE(3)
    ATTN_PREFILL_CASE(4)
    ATTN_PREFILL_CASE(5)
    ATTN_PREFILL_CASE(6)
    ATTN_PREFILL_CASE(7)
    ATTN_PREFILL_CASE(8)
    default:
      break;  // head_dim > 256: refused by the launcher
  }
#undef ATTN_PREFILL_CASE
}

}  // namespace attn_prefill_impl

KERNEL_BOUNDED(attn_prefill_f32, 128)(float* out, const float* q, const float* k_cache,
    const float* v_cache, const int* block_tables, const int* tiles, int q_stride, int out_stride,
    int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks, float scale,
    int window, float softcap) {
  attn_prefill_impl::attn_prefill_any<float>(out, q, k_cache, v_cache, block_tables, tiles,
                                           q_stride, out_stride, n_heads, n_kv_heads, head_dim,
                                           block_size, max_blocks, scale, window, softcap);
}
KERNEL_BOUNDED(attn_prefill_bf16, 128)(bf16* out, const float* q, const bf16* k_cache,
    const bf16* v_cache, const int* block_tables, const int* tiles, int q_stride, int out_stride,
    int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks, float scale,
    int window, float softcap) {
  attn_prefill_impl::attn_prefill_any<bf16>(out, q, k_cache, v_cache, block_tables, tiles,
                                           q_stride, out_stride, n_heads, n_kv_heads, head_dim,
                                           block_size, max_blocks, scale, window, softcap);
}
KERNEL_BOUNDED(attn_prefill_f16, 128)(f16* out, const float* q, const f16* k_cache,
    const f16* v_cache, const int* block_tables, const int* tiles, int q_stride, int out_stride,
    int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks, float scale,
    int window, float softcap) {
  attn_prefill_impl::attn_prefill_any<f16>(out, q, k_cache, v_cache, block_tables, tiles,
                                           q_stride, out_stride, n_heads, n_kv_heads, head_dim,
                                           block_size, max_blocks, scale, window, softcap);
}

EMU_KERNEL(attn_prefill_f32)
EMU_KERNEL(attn_prefill_bf16)
EMU_KERNEL(attn_prefill_f16)

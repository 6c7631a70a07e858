// Store one layer's keys and values of a step in the paged cache. For token t with slot
// s = slots[t] (s < 0: a padding row, skipped):
//   k_cache[s·kv_dim + j] = qkv[t·qkv_stride + k_offset + j]
//   v_cache[s·kv_dim + j] = qkv[t·qkv_stride + v_offset + j]     for j < kv_dim,
// converted to T. The cache is slot-major, [num_blocks][block_size][n_kv_heads][head_dim] with
// kv_dim = n_kv_heads·head_dim, as the CPU cache (engine/src/model.rs) lays it out; slots come
// from the block tables (gpu::ops::slot_mapping). No two rows may share a slot.
// Launch: grid.x = n_tokens, any grid.y (columns split over the y blocks).
#include "common.cuh"

template <typename T>
DEV void kv_write_row(const float* __restrict__ qkv, T* __restrict__ k_cache,
                      T* __restrict__ v_cache, const int* __restrict__ slots, int qkv_stride,
                      int k_offset, int v_offset, int kv_dim) {
  const long t = blockIdx.x;
  const int s = slots[t];
  if (s < 0) return;  // no barrier follows: the whole block skips a padding row
  const float* k = qkv + t * (long)qkv_stride + k_offset;
  const float* v = qkv + t * (long)qkv_stride + v_offset;
  T* kc = k_cache + (long)s * kv_dim;
  T* vc = v_cache + (long)s * kv_dim;
  const int first = (int)(blockIdx.y * blockDim.x + threadIdx.x);
  const int stride = (int)(gridDim.y * blockDim.x);
  for (int j = first; j < kv_dim; j += stride) {
    kc[j] = from_f32<T>(k[j]);
    vc[j] = from_f32<T>(v[j]);
  }
}

KERNEL_BOUNDED(kv_write_f32, 256)(const float* qkv, float* k_cache, float* v_cache, const int* slots,
                         int qkv_stride, int k_offset, int v_offset, int kv_dim) {
  kv_write_row<float>(qkv, k_cache, v_cache, slots, qkv_stride, k_offset, v_offset, kv_dim);
}
KERNEL_BOUNDED(kv_write_bf16, 256)(const float* qkv, bf16* k_cache, bf16* v_cache, const int* slots,
                          int qkv_stride, int k_offset, int v_offset, int kv_dim) {
  kv_write_row<bf16>(qkv, k_cache, v_cache, slots, qkv_stride, k_offset, v_offset, kv_dim);
}
KERNEL_BOUNDED(kv_write_f16, 256)(const float* qkv, f16* k_cache, f16* v_cache, const int* slots,
                         int qkv_stride, int k_offset, int v_offset, int kv_dim) {
  kv_write_row<f16>(qkv, k_cache, v_cache, slots, qkv_stride, k_offset, v_offset, kv_dim);
}

EMU_KERNEL(kv_write_f32)
EMU_KERNEL(kv_write_bf16)
EMU_KERNEL(kv_write_f16)

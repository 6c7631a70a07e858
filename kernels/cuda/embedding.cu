// Token embedding lookup, with media rows spliced in: row t of the f32 residual stream `x`
// (n_tokens × hidden) becomes
// - row media_slot[t] of `media` (f32, width hidden) when media_slot is given and
//   media_slot[t] >= 0 (an encoder's output for an image/audio placeholder token);
// - otherwise row tokens[t] of `table` (vocab × hidden, storage type T) converted to f32 and
//   multiplied by `scale` (Gemma's √hidden; 1 for every other family).
// Launch: grid.x = n_tokens (block b writes row b), any grid.y (the row's columns are split
// over the y blocks, so a decode step of one token still fills several SMs). The caller
// guarantees 0 <= tokens[t] < vocab and media_slot[t] < the number of media rows.
#include "common.cuh"

template <typename T>
DEV void embed_row(const T* __restrict__ table, const int* __restrict__ tokens,
                   const int* __restrict__ media_slot, const float* __restrict__ media,
                   float* __restrict__ x, int hidden, float scale) {
  const long t = blockIdx.x;
  const int slot = media_slot ? media_slot[t] : -1;
  float* xr = x + t * (long)hidden;
  const int first = (int)(blockIdx.y * blockDim.x + threadIdx.x);
  const int stride = (int)(gridDim.y * blockDim.x);
  if (slot >= 0) {
    const float* src = media + (long)slot * hidden;
    for (int i = first; i < hidden; i += stride) xr[i] = src[i];
  } else {
    const T* src = table + (long)tokens[t] * hidden;
    // Unscaled rows stay an exact copy (NaN payloads and subnormals included).
    if (scale == 1.f) {
      for (int i = first; i < hidden; i += stride) xr[i] = to_f32(src[i]);
    } else {
      for (int i = first; i < hidden; i += stride) xr[i] = to_f32(src[i]) * scale;
    }
  }
}

KERNEL_BOUNDED(embed_f32, 256)(const float* table, const int* tokens, const int* media_slot,
                      const float* media, float* x, int hidden, float scale) {
  embed_row<float>(table, tokens, media_slot, media, x, hidden, scale);
}
KERNEL_BOUNDED(embed_bf16, 256)(const bf16* table, const int* tokens, const int* media_slot,
                       const float* media, float* x, int hidden, float scale) {
  embed_row<bf16>(table, tokens, media_slot, media, x, hidden, scale);
}
KERNEL_BOUNDED(embed_f16, 256)(const f16* table, const int* tokens, const int* media_slot,
                      const float* media, float* x, int hidden, float scale) {
  embed_row<f16>(table, tokens, media_slot, media, x, hidden, scale);
}

EMU_KERNEL(embed_f32)
EMU_KERNEL(embed_bf16)
EMU_KERNEL(embed_f16)

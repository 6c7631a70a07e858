// Final logit soft-capping (Gemma 2 style): logits[i] = cap · tanh(logits[i] / cap) for
// i < n, in place, f32. cap > 0. Launch: any 1-D grid; a grid-stride loop covers n.
#include "common.cuh"

KERNEL_BOUNDED(logits_softcap, 256)(float* logits, long long n, float cap) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    logits[i] = cap * tanhf(logits[i] / cap);
}

EMU_KERNEL(logits_softcap)

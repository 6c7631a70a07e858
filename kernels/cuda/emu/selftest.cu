// Kernels that break the rules on purpose, compiled into the emulator only (never into the
// NVRTC sources), so the tests can check that the emulator catches each mistake.
#include "../common.cuh"

KERNEL_BOUNDED(emu_selftest_out_of_bounds, 64)(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = 1.f;  // no bound check: the last block writes past n
  (void)n;
}

KERNEL_BOUNDED(emu_selftest_early_exit, 64)(float* out) {
  if (threadIdx.x == 7) return;
  __syncthreads();
  out[threadIdx.x] = 1.f;
}

KERNEL_BOUNDED(emu_selftest_divergent_shuffle, 64)(float* out) {
  float v = (float)threadIdx.x;
  if ((threadIdx.x & 31) < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

KERNEL_BOUNDED(emu_selftest_block_sum, 256)(float* out, const float* in) {
  __shared__ float scratch[32];
  const float s = block_sum(in[threadIdx.x], scratch);
  const float m = block_max(in[threadIdx.x], scratch);
  if (threadIdx.x == 0) {
    out[0] = s;
    out[1] = m;
  }
}

// Each thread reads its neighbour's shared word with no barrier after the write: a race.
KERNEL_BOUNDED(emu_selftest_missing_barrier, 64)(float* out) {
  __shared__ float word[64];
  word[threadIdx.x] = (float)(blockIdx.x * 1000 + threadIdx.x);
  out[blockIdx.x * blockDim.x + threadIdx.x] = word[threadIdx.x ^ 1u];
}

EMU_KERNEL(emu_selftest_out_of_bounds)
EMU_KERNEL(emu_selftest_missing_barrier)
EMU_KERNEL(emu_selftest_early_exit)
EMU_KERNEL(emu_selftest_divergent_shuffle)
EMU_KERNEL(emu_selftest_block_sum)

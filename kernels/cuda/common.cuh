// Device code shared by every kernel: storage types and their conversions, warp and block
// reductions, and the macros that let one source compile for the GPU (NVRTC) and for the CPU
// emulator the tests run where no GPU is present (g++ with emu/shim.h).
//
// Rules for kernel sources, so both compilers accept them and the emulator can check them:
// - one-dimensional blocks whose size is a multiple of 32, at most 1024 threads;
// - every thread of a block reaches every __syncthreads(), and every lane of a warp every
//   warp-synchronous call (shuffles, __syncwarp): no early return before either;
// - dynamic shared memory only through DYN_SHARED, static shared arrays declared `__shared__`;
// - each entry point is `KERNEL void name(...)`, listed once with EMU_KERNEL(name) at the end
//   of its file.
#pragma once

#if defined(__CUDACC__)
#define KERNEL extern "C" __global__
#define DEV __device__ __forceinline__
#define UNROLL _Pragma("unroll")
#define EMU_KERNEL(name)
#define DYN_SHARED(T, name)                                              \
  extern __shared__ __align__(16) unsigned char name##_dyn_bytes[];      \
  T* name = reinterpret_cast<T*>(name##_dyn_bytes)
#else
#include "emu/shim.h"
#define UNROLL
#endif

// bf16 and f16 as plain 16-bit storage: no toolkit header is needed, and the bits are the same
// as those cuBLAS and the host (the `half` crate) read and write.
struct bf16 {
  unsigned short bits;
};
struct f16 {
  unsigned short bits;
};

DEV float to_f32(float v) { return v; }
DEV float to_f32(bf16 v) { return __uint_as_float(((unsigned)v.bits) << 16); }

#if defined(__CUDACC__)
DEV float to_f32(f16 v) {
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(v.bits));
  return r;
}
DEV f16 f16_from(float v) {
  f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
  return r;
}
#else
DEV float to_f32(f16 v) { return emu::half_to_float(v.bits); }
DEV f16 f16_from(float v) { return f16{emu::float_to_half(v)}; }
#endif

// Round to nearest even, as the host's conversions do; NaN stays a (quiet) NaN.
DEV bf16 bf16_from(float v) {
  unsigned u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{(unsigned short)((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{(unsigned short)(u >> 16)};
}

template <typename T>
DEV T from_f32(float v);
template <>
DEV float from_f32<float>(float v) { return v; }
template <>
DEV bf16 from_f32<bf16>(float v) { return bf16_from(v); }
template <>
DEV f16 from_f32<f16>(float v) { return f16_from(v); }

DEV float neg_inf() { return __uint_as_float(0xff800000u); }
DEV float pos_inf() { return __uint_as_float(0x7f800000u); }

DEV float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

DEV float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds 32 floats of shared
// memory that no other live reduction uses.
DEV float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // an earlier reduction may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0.f;
  return warp_sum(v);
}

DEV float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : neg_inf();
  return warp_max(v);
}

// Sixteen bytes in one load (the address must be 16-byte aligned).
struct __align__(16) Raw16 {
  unsigned w[4];
};

DEV Raw16 load16(const void* p) {
#if defined(__CUDACC__)
  return *reinterpret_cast<const Raw16*>(p);
#else
  Raw16 r;
  memcpy(&r, p, sizeof r);
  return r;
#endif
}

// Eight consecutive elements at a 16-byte aligned address, as f32.
DEV void load8(const float* p, float (&v)[8]) {
  const Raw16 a = load16(p), b = load16(p + 4);
  UNROLL for (int i = 0; i < 4; ++i) {
    v[i] = __uint_as_float(a.w[i]);
    v[4 + i] = __uint_as_float(b.w[i]);
  }
}
DEV void load8(const bf16* p, float (&v)[8]) {
  const Raw16 a = load16(p);
  UNROLL for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(a.w[i] << 16);
    v[2 * i + 1] = __uint_as_float(a.w[i] & 0xffff0000u);
  }
}
DEV void load8(const f16* p, float (&v)[8]) {
  const Raw16 a = load16(p);
  UNROLL for (int i = 0; i < 4; ++i) {
    v[2 * i] = to_f32(f16{(unsigned short)(a.w[i] & 0xffffu)});
    v[2 * i + 1] = to_f32(f16{(unsigned short)(a.w[i] >> 16)});
  }
}

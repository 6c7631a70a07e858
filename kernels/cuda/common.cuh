// Device code shared by every kernel: storage types and their conversions, warp and block
// reductions, and the macros that let one source compile for the GPU (NVRTC) and for the CPU
// emulator the tests run where no GPU is present (g++ with emu/shim.h).
//
// Rules for kernel sources, so both compilers accept them and the emulator can check them:
// - one-dimensional blocks whose size is a multiple of 32, at most 1024 threads;
// - every thread of a block reaches every __syncthreads(), and every lane of a warp every
//   warp-synchronous call (shuffles, __syncwarp): no early return before either;
// - dynamic shared memory only through DYN_SHARED, static shared arrays declared `__shared__`;
// - each entry point is `KERNEL_BOUNDED(name, max_threads)(...)`, listed once with
//   EMU_KERNEL(name) at the end of its file. `max_threads` (a literal: the Rust side reads it
//   from the source) is the largest block it is ever launched with: NVRTC gets it as
//   __launch_bounds__, so the compiler keeps registers within what that block can have, the
//   emulator and `Gpu::launch` refuse a larger block, and a test checks the compiled register
//   count against it.
#pragma once

#if defined(__CUDACC__)
#define KERNEL_BOUNDED(name, max_threads) \
  extern "C" __global__ void __launch_bounds__(max_threads) name
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

// f16 conversions in plain integer arithmetic: the same code runs on the GPU and in the
// emulator, so the tests check what the device executes (an inline-PTX `cvt` would run on the
// device alone). Both are exact, and round to nearest even as the host's `half` crate does.
DEV float to_f32(f16 v) {
  const unsigned h = v.bits;
  const unsigned sign = (h & 0x8000u) << 16;
  const unsigned exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1fu) {
    // Infinity, or a NaN made quiet with its payload kept.
    return __uint_as_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  }
  if (exp == 0u) {
    // Zero or a subnormal: mant units of 2^-24, which an f32 holds exactly.
    const float m = (float)mant * 5.9604644775390625e-8f;
    return sign ? -m : m;
  }
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

DEV f16 f16_from(float v) {
  const unsigned x = __float_as_uint(v);
  const unsigned short sign = (unsigned short)((x >> 16) & 0x8000u);
  const unsigned a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{(unsigned short)(sign | 0x7e00u)};  // NaN stays a quiet NaN
  if (a >= 0x477ff000u) return f16{(unsigned short)(sign | 0x7c00u)};  // rounds past 65504
  if (a < 0x38800000u) {
    // An f16 subnormal (or zero): units of 2^-24, the significand shifted right and rounded.
    if (a < 0x33000000u) return f16{sign};  // under half the smallest subnormal
    const unsigned shift = 126u - (a >> 23);
    const unsigned mant = (a & 0x7fffffu) | 0x800000u;
    unsigned h = mant >> shift;
    const unsigned rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return f16{(unsigned short)(sign | h)};
  }
  // Normal: rebias the exponent, keep 10 mantissa bits, round (a carry may reach infinity).
  unsigned h = (a - 0x38000000u) >> 13;
  const unsigned rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return f16{(unsigned short)(sign | h)};
}

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

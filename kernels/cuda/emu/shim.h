// The CUDA built-ins the kernels use, defined for a CPU build (g++), so that the test suite can
// run the very same kernel sources on a machine with no GPU.
//
// Each block runs on one OS thread; its CUDA threads are fibers (ucontext) switched only at
// synchronisation points (__syncthreads, __syncwarp, shuffles). Blocks run one after another,
// which is what makes `__shared__` as a function-local `static` correct. Threads run in index
// order between barriers in even blocks and in reverse order in odd ones (see run_block), so
// a missing barrier shows as blocks that disagree. The runtime
// (runtime.cpp) checks what CUDA leaves undefined: a thread that exits while others wait at a
// barrier, a warp whose lanes meet different synchronisation points, out-of-range launch
// shapes.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cstddef>
#include <utility>

namespace emu {

struct Dim3 {
  unsigned x, y, z;
};

const Dim3& thread_idx();
const Dim3& block_idx();
const Dim3& block_dim();
const Dim3& grid_dim();
void sync_block();
void sync_warp();
void* dyn_smem();
// Publish `bits` for this lane, wait for the warp, and return what lane `src` published.
uint64_t lane_exchange(uint64_t bits, unsigned src);

using Invoker = void (*)(void* fn, void** args);

template <typename... A, std::size_t... I>
void call_with(void (*f)(A...), void** args, std::index_sequence<I...>) {
  f(*static_cast<A*>(args[I])...);
}

template <typename... A>
void invoke(void* fn, void** args) {
  call_with(reinterpret_cast<void (*)(A...)>(fn), args, std::index_sequence_for<A...>{});
}

void register_kernel(const char* name, void* fn, Invoker invoker, unsigned nargs,
                     const unsigned* sizes, unsigned max_threads);

struct Registrar {
  template <typename... A>
  Registrar(const char* name, void (*f)(A...), unsigned max_threads) {
    static const unsigned sizes[sizeof...(A) + 1] = {(unsigned)sizeof(A)..., 0u};
    register_kernel(name, reinterpret_cast<void*>(f), &invoke<A...>, sizeof...(A), sizes,
                    max_threads);
  }
};

template <typename T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  return b;
}

template <typename T>
T from_bits(uint64_t b) {
  T v;
  memcpy(&v, &b, sizeof(T));
  return v;
}

inline unsigned lane_id() { return thread_idx().x & 31u; }

}  // namespace emu

// The bound becomes a constant beside the kernel, which EMU_KERNEL registers with it.
#define KERNEL_BOUNDED(name, max_threads)                    \
  static constexpr unsigned emu_max_threads_##name = (max_threads); \
  extern "C" void name
#define DEV inline
#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define EMU_KERNEL(name) \
  static emu::Registrar emu_registrar_##name(#name, &name, emu_max_threads_##name);
#define DYN_SHARED(T, name) T* name = reinterpret_cast<T*>(emu::dyn_smem())

#define threadIdx (emu::thread_idx())
#define blockIdx (emu::block_idx())
#define blockDim (emu::block_dim())
#define gridDim (emu::grid_dim())

inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::sync_warp(); }

template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  const unsigned lane = emu::lane_id();
  const unsigned src = (lane & ~(unsigned)(width - 1)) | ((lane ^ (unsigned)mask) & (width - 1));
  return emu::from_bits<T>(emu::lane_exchange(emu::to_bits(v), src));
}

template <typename T>
T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
  const unsigned lane = emu::lane_id();
  const unsigned src = (lane & ~(unsigned)(width - 1)) | ((unsigned)src_lane & (width - 1));
  return emu::from_bits<T>(emu::lane_exchange(emu::to_bits(v), src));
}

template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  const unsigned lane = emu::lane_id();
  const unsigned in_seg = lane & (width - 1);
  const unsigned src = in_seg + delta < (unsigned)width ? lane + delta : lane;
  return emu::from_bits<T>(emu::lane_exchange(emu::to_bits(v), src));
}

template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  const unsigned lane = emu::lane_id();
  const unsigned in_seg = lane & (width - 1);
  const unsigned src = in_seg >= delta ? lane - delta : lane;
  return emu::from_bits<T>(emu::lane_exchange(emu::to_bits(v), src));
}

inline unsigned __ballot_sync(unsigned, int pred) {
  // Two exchanges: each lane publishes its bit, then reads all 32 (fibers switch only at sync
  // points, so the lanes' slots are stable between the exchanges).
  unsigned r = 0;
  for (unsigned l = 0; l < 32; ++l) {
    const uint64_t b = emu::lane_exchange(pred ? 1u : 0u, l);
    r |= (unsigned)(b & 1u) << l;
  }
  return r;
}

inline float __uint_as_float(unsigned u) { return emu::from_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return (unsigned)emu::to_bits(f); }
inline float __int_as_float(int i) { return emu::from_bits<float>((uint64_t)(unsigned)i); }
inline int __float_as_int(float f) { return (int)(unsigned)emu::to_bits(f); }
inline double __longlong_as_double(long long v) { return emu::from_bits<double>((uint64_t)v); }
inline long long __double_as_longlong(double d) { return (long long)emu::to_bits(d); }

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

template <typename T>
T __ldg(const T* p) {
  return *p;
}

// Fibers switch only at synchronisation points, so a read-modify-write is atomic here.
template <typename T>
T atomicAdd(T* p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
inline int atomicMax(int* p, int v) {
  int old = *p;
  if (v > old) *p = v;
  return old;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  unsigned old = *p;
  if (v > old) *p = v;
  return old;
}
inline int atomicMin(int* p, int v) {
  int old = *p;
  if (v < old) *p = v;
  return old;
}

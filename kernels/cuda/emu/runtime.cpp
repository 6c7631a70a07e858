// The CPU emulator's runtime: the kernel table, the launch entry point the Rust side calls, and
// the fiber scheduler that runs one block's threads. See shim.h for the model.

#include <ucontext.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "shim.h"

namespace emu {
namespace {

enum State { RUN, AT_BLOCK, AT_WARP, DONE };

struct Fiber {
  ucontext_t ctx;
  State state;
  std::vector<char> stack;
};

struct Entry {
  void* fn;
  Invoker invoker;
  unsigned nargs;
  const unsigned* sizes;
  unsigned max_threads;
};

constexpr size_t kStack = 128 * 1024;
constexpr unsigned kMaxThreads = 1024;
// What a block may take without opting in on the GPU (cuFuncSetAttribute): the emulator holds
// kernels to it so they launch there as they do here.
constexpr unsigned kMaxDynSmem = 48 * 1024;

struct Machine {
  std::map<std::string, Entry>& table() {
    static std::map<std::string, Entry> t;
    return t;
  }
  std::mutex lock;
  Dim3 tid{0, 0, 0}, bid{0, 0, 0}, bdim{1, 1, 1}, gdim{1, 1, 1};
  std::vector<Fiber> fibers;
  ucontext_t sched;
  unsigned cur = 0;
  std::vector<unsigned char> dyn;
  std::vector<uint64_t> xch;
  const Entry* entry = nullptr;
  void** args = nullptr;
};

Machine& m() {
  static Machine machine;
  return machine;
}

void fiber_main() {
  Machine& s = m();
  s.entry->invoker(s.entry->fn, s.args);
  s.fibers[s.cur].state = DONE;
  // uc_link returns to the scheduler.
}

void yield(State why) {
  Machine& s = m();
  Fiber& f = s.fibers[s.cur];
  f.state = why;
  swapcontext(&f.ctx, &s.sched);
}

std::string list_threads(const std::vector<Fiber>& fs, State st) {
  std::string out;
  int shown = 0;
  for (size_t i = 0; i < fs.size(); ++i) {
    if (fs[i].state != st) continue;
    if (shown++ == 8) {
      out += ", ...";
      break;
    }
    if (!out.empty()) out += ", ";
    out += std::to_string(i);
  }
  return out;
}

// Runs one block to completion; false with `err` set when the kernel broke a rule.
bool run_block(Machine& s, unsigned n, std::string& err) {
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = s.fibers[t];
    f.state = RUN;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &s.sched;
    makecontext(&f.ctx, fiber_main, 0);
  }
  const unsigned warps = n / 32;
  // Between two barriers the threads run one after another: forward in even blocks, backward
  // in odd ones. A kernel that reads shared memory another thread wrote without a barrier
  // between then reads the new value in one kind of block and the old in the other, so its
  // blocks disagree and a test against a reference fails, whichever way round the race goes.
  const bool backward = (s.bid.x + s.bid.y + s.bid.z) & 1u;
  for (;;) {
    for (unsigned i = 0; i < n; ++i) {
      const unsigned t = backward ? n - 1 - i : i;
      if (s.fibers[t].state != RUN) continue;
      s.cur = t;
      s.tid = Dim3{t, 0, 0};
      swapcontext(&s.sched, &s.fibers[t].ctx);
    }
    // Every thread now waits at a barrier or has finished.
    bool released = false;
    for (unsigned w = 0; w < warps; ++w) {
      unsigned at_warp = 0;
      for (unsigned l = 0; l < 32; ++l) at_warp += s.fibers[w * 32 + l].state == AT_WARP;
      if (at_warp == 32) {
        for (unsigned l = 0; l < 32; ++l) s.fibers[w * 32 + l].state = RUN;
        released = true;
      } else if (at_warp > 0) {
        // No thread runs at this point: the other lanes exited or wait at __syncthreads.
        err = "warp " + std::to_string(w) + ": " + std::to_string(at_warp) +
              " of 32 lanes wait at a warp-synchronous call (shuffle or __syncwarp) that the other "
              "lanes never reach";
        return false;
      }
    }
    if (released) continue;
    unsigned done = 0, at_block = 0;
    for (unsigned t = 0; t < n; ++t) {
      done += s.fibers[t].state == DONE;
      at_block += s.fibers[t].state == AT_BLOCK;
    }
    if (done == n) return true;
    if (at_block + done == n && done > 0) {
      err = "threads " + list_threads(s.fibers, AT_BLOCK) +
            " wait at __syncthreads while threads " + list_threads(s.fibers, DONE) +
            " have exited";
      return false;
    }
    if (at_block == n) {
      for (unsigned t = 0; t < n; ++t) s.fibers[t].state = RUN;
      continue;
    }
    err = "deadlock: threads " + list_threads(s.fibers, AT_BLOCK) +
          " wait at __syncthreads while threads " + list_threads(s.fibers, AT_WARP) +
          " wait at a warp-synchronous call";
    return false;
  }
}

}  // namespace

const Dim3& thread_idx() { return m().tid; }
const Dim3& block_idx() { return m().bid; }
const Dim3& block_dim() { return m().bdim; }
const Dim3& grid_dim() { return m().gdim; }
void sync_block() { yield(AT_BLOCK); }
void sync_warp() { yield(AT_WARP); }
void* dyn_smem() { return m().dyn.data(); }

uint64_t lane_exchange(uint64_t bits, unsigned src) {
  Machine& s = m();
  const unsigned t = s.cur;
  s.xch[t] = bits;
  yield(AT_WARP);
  const uint64_t r = s.xch[(t & ~31u) | (src & 31u)];
  yield(AT_WARP);
  return r;
}

void register_kernel(const char* name, void* fn, Invoker invoker, unsigned nargs,
                     const unsigned* sizes, unsigned max_threads) {
  m().table()[name] = Entry{fn, invoker, nargs, sizes, max_threads};
}

}  // namespace emu

namespace {
void put_err(char* buf, size_t len, const std::string& msg) {
  if (!buf || len == 0) return;
  const size_t n = msg.size() < len - 1 ? msg.size() : len - 1;
  memcpy(buf, msg.data(), n);
  buf[n] = 0;
}
}  // namespace

extern "C" {

// Runs `name` over the grid, block after block. Arguments follow cuLaunchKernel: `args[i]`
// points at the i-th parameter's value; `sizes[i]` is its size in bytes, checked against the
// kernel's signature. Returns 0, or -1 with a message in `err`.
int gateway_emu_launch(const char* name, const unsigned* grid, const unsigned* block,
                       unsigned smem, void** args, const unsigned* sizes, unsigned nargs,
                       char* err, size_t err_len) {
  using namespace emu;
  Machine& s = m();
  std::lock_guard<std::mutex> guard(s.lock);
  auto it = s.table().find(name);
  if (it == s.table().end()) {
    put_err(err, err_len, std::string("no kernel named ") + name);
    return -1;
  }
  const Entry& e = it->second;
  if (e.nargs != nargs) {
    put_err(err, err_len,
            std::string(name) + " takes " + std::to_string(e.nargs) + " arguments, " +
                std::to_string(nargs) + " were passed");
    return -1;
  }
  for (unsigned i = 0; i < nargs; ++i) {
    if (e.sizes[i] != sizes[i]) {
      put_err(err, err_len,
              std::string(name) + ": argument " + std::to_string(i) + " is " +
                  std::to_string(e.sizes[i]) + " bytes in the kernel, " +
                  std::to_string(sizes[i]) + " were passed");
      return -1;
    }
  }
  const unsigned n = block[0] * block[1] * block[2];
  if (block[1] != 1 || block[2] != 1 || n == 0 || n % 32 != 0 || n > kMaxThreads) {
    put_err(err, err_len,
            std::string(name) + ": blocks must be one-dimensional with a multiple of 32 threads, "
                                "at most 1024");
    return -1;
  }
  if (n > e.max_threads) {
    put_err(err, err_len,
            std::string(name) + ": a block of " + std::to_string(n) +
                " threads exceeds the kernel's __launch_bounds__ of " +
                std::to_string(e.max_threads));
    return -1;
  }
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || grid[1] > 65535 || grid[2] > 65535) {
    put_err(err, err_len, std::string(name) + ": grid dimensions out of range");
    return -1;
  }
  if (smem > kMaxDynSmem) {
    put_err(err, err_len,
            std::string(name) + ": " + std::to_string(smem) +
                " bytes of dynamic shared memory (at most 49152 without an opt-in)");
    return -1;
  }
  if (s.fibers.size() < n) {
    s.fibers.resize(n);
    for (auto& f : s.fibers)
      if (f.stack.empty()) f.stack.resize(kStack);
  }
  s.xch.assign(n, 0);
  // Poison dynamic shared memory: a kernel must not read what it did not write.
  s.dyn.assign(smem + 16, 0xA5);
  s.entry = &e;
  s.args = args;
  s.bdim = Dim3{block[0], 1, 1};
  s.gdim = Dim3{grid[0], grid[1], grid[2]};
  for (unsigned z = 0; z < grid[2]; ++z)
    for (unsigned y = 0; y < grid[1]; ++y)
      for (unsigned x = 0; x < grid[0]; ++x) {
        s.bid = Dim3{x, y, z};
        std::string why;
        if (!run_block(s, n, why)) {
          put_err(err, err_len,
                  std::string(name) + ", block (" + std::to_string(x) + ", " + std::to_string(y) +
                      ", " + std::to_string(z) + "): " + why);
          return -1;
        }
      }
  return 0;
}

// The number of registered kernels, and their names (for the consistency test).
unsigned gateway_emu_kernel_count() { return (unsigned)emu::m().table().size(); }

const char* gateway_emu_kernel_name(unsigned i) {
  auto& t = emu::m().table();
  if (i >= t.size()) return nullptr;
  auto it = t.begin();
  std::advance(it, i);
  return it->first.c_str();
}
}

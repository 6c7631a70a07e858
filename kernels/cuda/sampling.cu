// Sampling the next token on the device, one block per row of logits, with the semantics of the
// engine's CPU sampler (engine/src/sampling.rs, vLLM's order of operations):
//   1. logprobs of the raw logits (log-softmax with f64 sums, top-n by value then id);
//   2. min_tokens: the given ids are masked to -inf;
//   3. penalties: repetition over prompt and output tokens, then frequency and presence;
//   4. greedy arg-max, or temperature, min_p, top_k, top_p and one draw with the host's
//      uniform u in [0, 1).
//
// Nothing is sorted. Orders are decided on a 32-bit key that orders floats as Rust's
// `f32::total_cmp` does, and positions in the CPU's sorted order (value descending, id
// ascending) are found by a 4-ary search over the key: each round counts (or sums the f64
// weights of) the elements at or above three thresholds. Ties at the final key are resolved by
// id with a scan in id order. A row's candidates are copied into shared memory when they fit,
// so the searches after top_k / min_p usually run on a few hundred elements.
//
// Float arithmetic repeats the CPU's operations one rounding at a time (explicit _rn
// intrinsics: NVRTC would otherwise fuse a multiply and an add). Mass sums are f64 but their
// order differs from the CPU's sequential sums, so a draw whose target lies within rounding of a
// candidate boundary may land on the neighbouring candidate.
#include "common.cuh"

namespace sampler {

constexpr int kMaxLogprobs = 20;
constexpr int kMaxThreads = 1024;
constexpr int kOk = 0;
// Logprobs were asked for and no raw logit is finite (or one is +inf).
constexpr int kNoFiniteLogit = 1;
// Nothing is left to sample from after masking, penalties and the filters.
constexpr int kNothingToSample = 2;
constexpr float kGreedyEps = 1e-5f;

#if defined(__CUDACC__)
DEV float add_rn(float a, float b) { return __fadd_rn(a, b); }
DEV float sub_rn(float a, float b) { return __fsub_rn(a, b); }
DEV float mul_rn(float a, float b) { return __fmul_rn(a, b); }
DEV float div_rn(float a, float b) { return __fdiv_rn(a, b); }
#else
DEV float add_rn(float a, float b) { return a + b; }
DEV float sub_rn(float a, float b) { return a - b; }
DEV float mul_rn(float a, float b) { return a * b; }
DEV float div_rn(float a, float b) { return a / b; }
#endif

DEV bool is_nan(float v) { return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u; }
DEV double dinf() { return __longlong_as_double(0x7ff0000000000000ll); }

// Unsigned order of the key = total_cmp order of the float (-0 below +0). NaN is mapped to
// -inf before keying, as the CPU ranks it, so key 0 (a NaN's) never occurs.
DEV unsigned key_of(float v) {
  const unsigned u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
DEV float value_of(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The CPU's weight of a candidate: exp of the f32 difference, in f64.
DEV double weight_of(float v, float max) { return exp((double)sub_rn(v, max)); }

// Shared memory for block-wide reductions and scans: `red` holds 3 values per thread, `red2`
// 3 per warp. Reductions use barriers only (no shuffles) so that the emulator, which switches
// every thread at each synchronisation point, runs them cheaply; every thread gets bitwise the
// same result.
struct Scratch {
  double* red;
  double* red2;
  int* pick;
};

struct OpSum {
  DEV double operator()(double a, double b) const { return a + b; }
};
struct OpMax {
  DEV double operator()(double a, double b) const { return a > b ? a : b; }
};
struct OpMin {
  DEV double operator()(double a, double b) const { return a < b ? a : b; }
};

// Reduces R values per thread over the block. Safe to call back to back: `red` is only read
// between this call's two barriers, `red2` only after the second and rewritten after the
// next call's first.
template <int R, typename Op>
DEV void block_reduce(double (&v)[R], Op op, const Scratch& s) {
  const int t = threadIdx.x, nt = blockDim.x, nw = nt >> 5;
  for (int r = 0; r < R; ++r) s.red[r * nt + t] = v[r];
  __syncthreads();
  if (t < 32) {
    for (int r = 0; r < R; ++r) {
      double a = s.red[r * nt + t];
      for (int w = 1; w < nw; ++w) a = op(a, s.red[r * nt + w * 32 + t]);
      s.red2[r * 32 + t] = a;
    }
  }
  __syncthreads();
  for (int r = 0; r < R; ++r) {
    double a = s.red2[r * 32];
    for (int l = 1; l < 32; ++l) a = op(a, s.red2[r * 32 + l]);
    v[r] = a;
  }
}

// Exclusive and inclusive prefix sums of two non-negative values per thread, in thread order.
// The folds are arranged so that thread t's inclusive sum is bitwise thread t+1's exclusive
// one: the intervals [excl, incl) tile [0, total) with no gap or overlap.
struct Prefix {
  double excl[2], incl[2], total[2];
};

DEV Prefix block_scan(double a, double b, const Scratch& s) {
  const int t = threadIdx.x, nt = blockDim.x, nw = nt >> 5, w = t >> 5;
  s.red[t] = a;
  s.red[nt + t] = b;
  __syncthreads();
  if (t < nw) {
    for (int r = 0; r < 2; ++r) {
      double x = 0.0;
      for (int j = 0; j < 32; ++j) x += s.red[r * nt + t * 32 + j];
      s.red2[r * 32 + t] = x;
    }
  }
  __syncthreads();
  Prefix p;
  for (int r = 0; r < 2; ++r) {
    double wpre = 0.0;
    for (int k = 0; k < w; ++k) wpre += s.red2[r * 32 + k];
    double total = wpre;
    for (int k = w; k < nw; ++k) total += s.red2[r * 32 + k];
    double lpre = 0.0;
    for (int j = w * 32; j < t; ++j) lpre += s.red[r * nt + j];
    p.excl[r] = wpre + lpre;
    p.incl[r] = wpre + (lpre + (r ? b : a));
    p.total[r] = total;
  }
  __syncthreads();  // `red` is read above until here
  return p;
}

// The elements a search or scan runs over: a row of values (raw logits, or the transformed
// copy), or the row's candidates compacted into shared memory in id order.
struct Items {
  const float* v;  // row values (when not listed)
  int n;           // number of items
  bool raw;        // raw logits: NaN ranks as -inf
  bool filter;     // candidates only: > -inf, >= floor and inside the cut
  float floor, max;
  // Listed candidates: weight, key and id of each.
  bool listed;
  const double* lw;
  const unsigned* lk;
  const int* lid;
  // A prefix of the sorted order: keep key > cut_key, or key == cut_key with id <= cut_id.
  unsigned cut_key;
  int cut_id;

  DEV bool in_cut(unsigned key, int id) const {
    return key > cut_key || (key == cut_key && id <= cut_id);
  }

  // Whether item i is a member; its key and token id.
  DEV bool get(int i, unsigned& key, int& id) const {
    if (listed) {
      key = lk[i];
      id = lid[i];
      return in_cut(key, id);
    }
    float x = v[i];
    if (raw && is_nan(x)) x = neg_inf();
    key = key_of(x);
    id = i;
    if (!filter) return true;
    return x > neg_inf() && x >= floor && in_cut(key, id);
  }

  DEV double weight(int i, unsigned key) const {
    return listed ? lw[i] : weight_of(value_of(key), max);
  }
};

// What a search sums per member: 1 (counts) or its weight (mass).
enum Measure { kCount, kMass };

// Predicates on the sum S(t) over members with key >= t; each is true for small t.
struct AtLeast {
  double limit;
  DEV bool operator()(double s) const { return s >= limit; }
};
struct Above {
  double limit;
  DEV bool operator()(double s) const { return s > limit; }
};

// The largest key t with pred(S(t)), taking pred(S(0)) as true (no element has key 0: that
// key is a NaN's), so 0 means that no key satisfies it. `above` gets S(t + 1).
template <typename Pred>
DEV unsigned search(const Items& it, Measure m, Pred pred, double& above, const Scratch& s) {
  unsigned long long lo = 0, hi = 1ull << 32;
  above = 0.0;
  while (hi - lo > 1) {
    const unsigned long long span = hi - lo;
    const unsigned th[3] = {(unsigned)(lo + span / 4), (unsigned)(lo + span / 2),
                            (unsigned)(lo + span / 4 + span / 2)};
    double acc[3] = {0.0, 0.0, 0.0};
    for (int i = threadIdx.x; i < it.n; i += blockDim.x) {
      unsigned key;
      int id;
      if (!it.get(i, key, id) || key < th[0]) continue;
      const double w = m == kMass ? it.weight(i, key) : 1.0;
      acc[0] += w;
      if (key >= th[1]) acc[1] += w;
      if (key >= th[2]) acc[2] += w;
    }
    block_reduce<3>(acc, OpSum(), s);
    // Subsets summed in the same order never sum to more, so pred is monotone here too.
    for (int j = 0; j < 3; ++j) {
      if (pred(acc[j])) {
        lo = th[j];
      } else {
        hi = th[j];
        above = acc[j];
        break;
      }
    }
  }
  return (unsigned)lo;
}

// Members with exactly this key.
DEV int count_at(const Items& it, unsigned k, const Scratch& s) {
  double c[1] = {0.0};
  for (int i = threadIdx.x; i < it.n; i += blockDim.x) {
    unsigned key;
    int id;
    if (it.get(i, key, id) && key == k) c[0] += 1.0;
  }
  block_reduce<1>(c, OpSum(), s);
  return (int)c[0];
}

// Walks the members in id order (restricted to key == tie_key when `tie`), subtracting each
// one's weight (mass) or 1 (count) from `target`, and returns the id of the first whose weight
// exceeds what remains, as the CPU's draw does; when none does, the last member; -1 when there
// are no members. Each thread owns a contiguous chunk; a scan finds the chunk the target
// falls in and that thread walks it.
DEV int select(const Items& it, Measure m, bool tie, unsigned tie_key, double target,
               const Scratch& s) {
  const int t = threadIdx.x, nt = blockDim.x;
  const int chunk = (it.n + nt - 1) / nt;
  const int beg = min(it.n, t * chunk), end = min(it.n, beg + chunk);
  double mass = 0.0, count = 0.0;
  for (int i = beg; i < end; ++i) {
    unsigned key;
    int id;
    if (!it.get(i, key, id) || (tie && key != tie_key)) continue;
    mass += m == kMass ? it.weight(i, key) : 1.0;
    count += 1.0;
  }
  const Prefix p = block_scan(mass, count, s);
  if (p.total[1] == 0.0) return -1;
  // Exactly one thread is picked: the one whose interval holds the target, or else the one
  // with the last member.
  const bool inside = target < p.total[0];
  const bool mine = inside ? (p.excl[0] <= target && target < p.incl[0])
                           : (count > 0.0 && p.excl[1] + count == p.total[1]);
  if (mine) {
    double rest = target - p.excl[0];
    int found = -1, last = -1, last_positive = -1;
    for (int i = beg; i < end && found < 0; ++i) {
      unsigned key;
      int id;
      if (!it.get(i, key, id) || (tie && key != tie_key)) continue;
      const double w = m == kMass ? it.weight(i, key) : 1.0;
      last = id;
      if (w > 0.0) last_positive = id;
      if (inside) {
        if (rest < w) found = id;
        rest -= w;
      }
    }
    // Inside the chunk's interval but past its walk (rounding): its last weighted member.
    *s.pick = inside ? (found >= 0 ? found : last_positive) : last;
  }
  __syncthreads();
  return *s.pick;
}

// Copies the members of `it` (not listed) into the shared list, in id order, and makes `it`
// refer to the list.
DEV void compact(Items& it, double* lw, unsigned* lk, int* lid, const Scratch& s) {
  const int t = threadIdx.x, nt = blockDim.x;
  const int chunk = (it.n + nt - 1) / nt;
  const int beg = min(it.n, t * chunk), end = min(it.n, beg + chunk);
  double count = 0.0;
  for (int i = beg; i < end; ++i) {
    unsigned key;
    int id;
    if (it.get(i, key, id)) count += 1.0;
  }
  const Prefix p = block_scan(count, 0.0, s);
  int at = (int)p.excl[0];
  for (int i = beg; i < end; ++i) {
    unsigned key;
    int id;
    if (!it.get(i, key, id)) continue;
    lw[at] = it.weight(i, key);
    lk[at] = key;
    lid[at] = id;
    ++at;
  }
  __syncthreads();
  it.listed = true;
  it.lw = lw;
  it.lk = lk;
  it.lid = lid;
  it.n = (int)p.total[0];
}

// The first `n` members in sorted order (value descending, id ascending), as a cut.
DEV void first_n(const Items& it, int n, unsigned& cut_key, int& cut_id, const Scratch& s) {
  double above;
  cut_key = search(it, kCount, AtLeast{(double)n}, above, s);
  cut_id = select(it, kCount, true, cut_key, (double)(n - (int)above - 1), s);
}

struct Args {
  const float* logits;
  float* work;
  int vocab;
  const float* temperature;
  const int* top_k;
  const float* top_p;
  const float* ln_min_p;
  const double* uniform;
  const int* n_logprobs;
  const float* repetition;
  const float* frequency;
  const float* presence;
  const int* penalty_offsets;
  const int* penalty_ids;
  const int* penalty_counts;
  const int* mask_offsets;
  const int* mask_ids;
  int list_cap;
  int* out_token;
  float* out_logprob;
  int* out_top_ids;
  float* out_top_logprobs;
  int* out_status;
};

struct Top {
  int* count;
  unsigned* key;
  int* id;
};

// Step 1: the raw distribution's normaliser (max, log-sum-exp) and its top n entries.
// Returns false when no raw logit is finite.
DEV bool raw_logprobs(const Args& a, const float* raw, int n, double& max, double& lse,
                      const Top& top, const Scratch& s) {
  const int t = threadIdx.x, nt = blockDim.x, V = a.vocab, b = blockIdx.x;
  double m[1] = {-dinf()};
  for (int i = t; i < V; i += nt) {
    const float x = raw[i];
    if (!is_nan(x) && (double)x > m[0]) m[0] = x;
  }
  block_reduce<1>(m, OpMax(), s);
  if (!(m[0] > -dinf() && m[0] < dinf())) return false;
  max = m[0];
  double sum[1] = {0.0};
  for (int i = t; i < V; i += nt) {
    const float x = raw[i];
    if (!is_nan(x)) sum[0] += exp((double)x - max);
  }
  block_reduce<1>(sum, OpSum(), s);
  lse = log(sum[0]);
  n = min(n, V);
  if (n > 0) {
    Items all{};
    all.v = raw;
    all.n = V;
    all.raw = true;
    unsigned cut_key;
    int cut_id;
    first_n(all, n, cut_key, cut_id, s);
    for (int i = t; i < V; i += nt) {
      unsigned key;
      int id;
      all.get(i, key, id);
      if (key > cut_key || (key == cut_key && id <= cut_id)) {
        const int slot = atomicAdd(top.count, 1);
        if (slot < kMaxLogprobs) {
          top.key[slot] = key;
          top.id[slot] = id;
        }
      }
    }
    __syncthreads();
    if (t == 0) {
      const int got = min(*top.count, kMaxLogprobs);
      for (int i = 1; i < got; ++i) {
        const unsigned k = top.key[i];
        const int id = top.id[i];
        int j = i;
        while (j > 0 && (top.key[j - 1] < k || (top.key[j - 1] == k && top.id[j - 1] > id))) {
          top.key[j] = top.key[j - 1];
          top.id[j] = top.id[j - 1];
          --j;
        }
        top.key[j] = k;
        top.id[j] = id;
      }
      for (int i = 0; i < got; ++i) {
        a.out_top_ids[b * kMaxLogprobs + i] = top.id[i];
        const float x = value_of(top.key[i]);
        a.out_top_logprobs[b * kMaxLogprobs + i] = (float)((double)x - max - lse);
      }
    }
  }
  return true;
}

// Steps 2 and 3 into the work row: the raw logits, masked ids at -inf, then the penalties.
DEV void penalise(const Args& a, const float* raw, float* work) {
  const int t = threadIdx.x, nt = blockDim.x, V = a.vocab, b = blockIdx.x;
  for (int i = t; i < V; i += nt) work[i] = raw[i];
  __syncthreads();
  for (int j = a.mask_offsets[b] + t; j < a.mask_offsets[b + 1]; j += nt) {
    const int id = a.mask_ids[j];
    if (id >= 0 && id < V) work[id] = neg_inf();
  }
  __syncthreads();
  const float rp = a.repetition[b], fp = a.frequency[b], pp = a.presence[b];
  const bool rep = rp != 1.0f && rp > 0.0f;
  const bool freq = fp != 0.0f || pp != 0.0f;
  if (rep || freq) {
    // Entries are distinct ids (the host merges duplicates), so no two threads share one.
    for (int j = a.penalty_offsets[b] + t; j < a.penalty_offsets[b + 1]; j += nt) {
      const int id = a.penalty_ids[j];
      if (id < 0 || id >= V) continue;
      const int count = a.penalty_counts[j];
      float l = work[id];
      if (rep) l = l > 0.0f ? div_rn(l, rp) : mul_rn(l, rp);
      if (freq && count > 0) l = sub_rn(l, add_rn(mul_rn(fp, (float)count), pp));
      work[id] = l;
    }
  }
  __syncthreads();
}

// Step 4, greedy: the first index of the largest value, NaN and -inf ignored; -1 if none.
DEV int greedy(const float* work, int V, const Scratch& s) {
  const int t = threadIdx.x, nt = blockDim.x;
  double m[1] = {-dinf()};
  for (int i = t; i < V; i += nt) {
    const float x = work[i];
    if (!is_nan(x) && (double)x > m[0]) m[0] = x;
  }
  block_reduce<1>(m, OpMax(), s);
  if (!(m[0] > -dinf())) return -1;
  const float best = (float)m[0];
  double first[1] = {(double)V};
  for (int i = t; i < V; i += nt) {
    if (work[i] == best) {
      first[0] = i;
      break;
    }
  }
  block_reduce<1>(first, OpMin(), s);
  return (int)first[0];
}

// Step 4, random: temperature, min_p, top_k, top_p and the draw; -1 if nothing is left.
DEV int draw(const Args& a, float* work, const Scratch& s, double* lw, unsigned* lk, int* lid) {
  const int t = threadIdx.x, nt = blockDim.x, V = a.vocab, b = blockIdx.x;
  const float inv_t = div_rn(1.0f, a.temperature[b]);
  double m[1] = {-dinf()};
  for (int i = t; i < V; i += nt) {
    float x = work[i];
    if (is_nan(x)) x = neg_inf();
    x = mul_rn(x, inv_t);
    // -inf times a zero inverse temperature: the CPU drops such NaNs like -inf.
    if (is_nan(x)) x = neg_inf();
    work[i] = x;
    if ((double)x > m[0]) m[0] = x;
  }
  block_reduce<1>(m, OpMax(), s);
  if (!(m[0] > -dinf() && m[0] < dinf())) return -1;
  const float max = (float)m[0];

  Items it{};
  it.v = work;
  it.n = V;
  it.max = max;
  it.floor = add_rn(max, a.ln_min_p[b]);
  it.cut_key = 0;  // no cut: every real key is above 0
  it.cut_id = 0;

  const int top_k = a.top_k[b];
  const bool by_top_k = top_k > 0 && top_k < V;
  if (by_top_k) first_n(it, top_k, it.cut_key, it.cut_id, s);

  it.filter = true;
  double cand[2] = {0.0, 0.0};
  for (int i = t; i < it.n; i += nt) {
    unsigned key;
    int id;
    if (!it.get(i, key, id)) continue;
    cand[0] += 1.0;
    cand[1] += it.weight(i, key);
  }
  block_reduce<2>(cand, OpSum(), s);
  if (cand[0] == 0.0) return -1;
  if (cand[0] <= (double)a.list_cap) compact(it, lw, lk, lid, s);
  double total = cand[1];

  const float top_p = a.top_p[b];
  if (top_p < 1.0f) {
    // The shortest prefix of the sorted candidates whose weight reaches top_p of the total.
    const double limit = (double)top_p * total;
    unsigned cut_key;
    int cut_id;
    if (limit <= 0.0) {
      first_n(it, 1, cut_key, cut_id, s);
      it.cut_key = cut_key;
      it.cut_id = cut_id;
      total = weight_of(value_of(cut_key), max);
    } else {
      double above;
      cut_key = search(it, kMass, AtLeast{limit}, above, s);
      if (cut_key != 0) {  // else the whole list is needed (rounding): no cut
        const int ties = count_at(it, cut_key, s);
        const double w = weight_of(value_of(cut_key), max);
        const double q = ceil((limit - above) / w);
        const int need = q < 1.0 ? 1 : (q > (double)ties ? ties : (int)q);
        it.cut_id = select(it, kCount, true, cut_key, (double)(need - 1), s);
        it.cut_key = cut_key;
        total = above + (double)need * w;
      }
    }
  }

  const double target = a.uniform[b] * total;
  if (!(by_top_k || top_p < 1.0f)) return select(it, kMass, false, 0, target, s);
  // Sorted order: the first candidate where the running mass passes the target.
  double above;
  const unsigned k = search(it, kMass, Above{target}, above, s);
  if (k == 0) {
    // The target is past the total (rounding): the last candidate, lowest value, highest id.
    double lowest[1] = {dinf()};
    for (int i = t; i < it.n; i += nt) {
      unsigned key;
      int id;
      if (it.get(i, key, id) && (double)key < lowest[0]) lowest[0] = key;
    }
    block_reduce<1>(lowest, OpMin(), s);
    return select(it, kCount, true, (unsigned)lowest[0], dinf(), s);
  }
  const int ties = count_at(it, k, s);
  const double w = weight_of(value_of(k), max);
  const double q = floor((target - above) / w) + 1.0;
  const int need = q < 1.0 ? 1 : (q > (double)ties ? ties : (int)q);
  return select(it, kCount, true, k, (double)(need - 1), s);
}

DEV void sample_row(const Args& a, const Scratch& s, const Top& top, double* lw, unsigned* lk,
                    int* lid) {
  const int t = threadIdx.x, b = blockIdx.x, V = a.vocab;
  const float* raw = a.logits + (long long)b * V;
  float* work = a.work + (long long)b * V;
  const int n_lp = min(a.n_logprobs[b], kMaxLogprobs);
  if (t == 0) {
    *top.count = 0;
    for (int i = 0; i < kMaxLogprobs; ++i) {
      a.out_top_ids[b * kMaxLogprobs + i] = -1;
      a.out_top_logprobs[b * kMaxLogprobs + i] = neg_inf();
    }
  }
  __syncthreads();

  int status = kOk, token = -1;
  double max = 0.0, lse = 0.0;
  if (n_lp >= 0 && !raw_logprobs(a, raw, n_lp, max, lse, top, s)) status = kNoFiniteLogit;
  if (status == kOk) {
    penalise(a, raw, work);
    token = a.temperature[b] < kGreedyEps ? greedy(work, V, s) : draw(a, work, s, lw, lk, lid);
    if (token < 0) status = kNothingToSample;
  }
  if (t == 0) {
    a.out_status[b] = status;
    a.out_token[b] = status == kOk ? token : -1;
    float lp = __uint_as_float(0x7fc00000u);
    if (status == kOk && n_lp >= 0) {
      const float x = raw[token];
      lp = is_nan(x) ? neg_inf() : (float)((double)x - max - lse);
    }
    a.out_logprob[b] = lp;
  }
}

}  // namespace sampler

// One block per row (at most 1024 threads, a multiple of 32). Row b of `logits` and `work` is
// `vocab` wide; per-row parameters are arrays of n_rows; penalty entries of row b are
// [penalty_offsets[b], penalty_offsets[b + 1]) of penalty_ids / penalty_counts (distinct ids,
// count = occurrences in the output, 0 for prompt-only ids), masked ids likewise.
// `ln_min_p` is ln(min_p), -inf when min_p is off. `list_cap` is how many candidates the
// dynamic shared memory holds (16 bytes each). Outputs: token (-1 on failure), the raw
// logprob of the token (NaN unless logprobs are asked for), the top ids and logprobs
// (kMaxLogprobs per row, -1 / -inf past n_logprobs), and the status. 1024 threads leave each
// at most 64 registers: the bound makes the compiler keep to it.
KERNEL_BOUNDED(sample_tokens, 1024)(const float* logits, float* work, int vocab, const float* temperature,
                          const int* top_k, const float* top_p, const float* ln_min_p,
                          const double* uniform, const int* n_logprobs, const float* repetition,
                          const float* frequency, const float* presence,
                          const int* penalty_offsets, const int* penalty_ids,
                          const int* penalty_counts, const int* mask_offsets, const int* mask_ids,
                          int list_cap, int* out_token, float* out_logprob, int* out_top_ids,
                          float* out_top_logprobs, int* out_status) {
  __shared__ double red[3 * sampler::kMaxThreads];
  __shared__ double red2[3 * 32];
  __shared__ int pick;
  __shared__ int top_count;
  __shared__ unsigned top_key[sampler::kMaxLogprobs];
  __shared__ int top_id[sampler::kMaxLogprobs];
  DYN_SHARED(double, list);
  const sampler::Args a{logits,       work,          vocab,           temperature,
                        top_k,        top_p,         ln_min_p,        uniform,
                        n_logprobs,   repetition,    frequency,       presence,
                        penalty_offsets, penalty_ids, penalty_counts, mask_offsets,
                        mask_ids,     list_cap,      out_token,       out_logprob,
                        out_top_ids,  out_top_logprobs, out_status};
  const sampler::Scratch s{red, red2, &pick};
  const sampler::Top top{&top_count, top_key, top_id};
  unsigned* list_keys = reinterpret_cast<unsigned*>(list + list_cap);
  int* list_ids = reinterpret_cast<int*>(list_keys + list_cap);
  sampler::sample_row(a, s, top, list, list_keys, list_ids);
}

EMU_KERNEL(sample_tokens)

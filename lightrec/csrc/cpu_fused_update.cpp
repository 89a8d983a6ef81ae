// The fused (in-backward) optimizer update of the torch kernel on CPU: one pass that de-duplicates
// the looked-up ids, sums each row's gradient contributions and updates every touched row once.
//
// Registered as torch.ops.lightrec.cpu_fused_update (built at first use by lightrec/_native.py;
// lightrec/kernels/cpu_update.py is the Python side and documents the arguments). The arithmetic
// follows lightrec/kernels/sparse_update.py operation by operation (compiled without FMA
// contraction), so the two agree to the last bit except where torch's own vectorised kernels
// round differently (the row mean of row-wise Adagrad, Adam's alpha-scaled adds). Built with
// -fno-math-errno (lightrec/_native.py): otherwise std::sqrt must be able to set errno and GCC keeps
// Adam's and Adagrad's element loops scalar (twice the time of the whole update).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

// Inlined into both builds of phase 3 (below), so each compiles them for its own instruction set.
#define LIGHTREC_ALWAYS_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LIGHTREC_X86_DISPATCH 1
#else
#define LIGHTREC_X86_DISPATCH 0
#endif

enum Optimizer : int64_t { SGD = 0, ADAGRAD = 1, ROWWISE_ADAGRAD = 2, ADAM = 3 };
enum DecayMode : int64_t { NONE = 0, L2 = 1, DECOUPLED = 2 };

struct Params {
  int64_t optimizer;
  int64_t decay_mode;
  double lr, eps, beta1, beta2, weight_decay, bias1, bias2;
};

// Where the gradient of occurrence i lives: bag k = bag_of_id[i] (or i), then the bag's row in an
// [A, C, D] strided view, (k / C, k % C) -- read from `bag_start` (each bag's offset, filled once per
// call without dividing: A * C entries) rather than divided out per occurrence (~80 cycles; measured
// 0.4 ms of a 1.9 ms update of 16k ids in 32-id bags).
//
// Or, with `parts` > 0 (one id per bag, no bag_of_id), occurrence i's row lies in the last part k whose
// part_start[k] <= i, at part_base[k] + (i - part_start[k]) * part_stride[k]: the gradient read where
// it arrived (a sharded lookup's own rows and each peer's rows in its shared-memory chunk) instead of
// copied into one tensor first.
template <typename scalar_t>
struct GradRows {
  const scalar_t* base;
  int64_t s1;
  const int64_t* bag_of_id;  // nullptr: occurrence i is bag i
  const scalar_t* scale;     // nullptr: no per-occurrence factor
  const int64_t* bag_start;  // nullptr: A == 1, bag k starts at k * s1
  int64_t parts = 0;
  const scalar_t* const* part_base = nullptr;
  const int64_t* part_start = nullptr;
  const int64_t* part_stride = nullptr;
  LIGHTREC_ALWAYS_INLINE const scalar_t* row(int64_t i) const {
    if (parts > 0) {
      int64_t k = parts - 1;
      while (i < part_start[k]) --k;
      return part_base[k] + (i - part_start[k]) * part_stride[k];
    }
    const int64_t k = bag_of_id ? bag_of_id[i] : i;
    return base + (bag_start ? bag_start[k] : k * s1);
  }
};

// `grad` is the row's summed gradient (read only); `buf` a [d] buffer for the L2-decayed copy.
template <typename scalar_t>
LIGHTREC_ALWAYS_INLINE void update_row(const Params& p, int64_t d, scalar_t* w, scalar_t* m1, scalar_t* m2, const scalar_t* grad,
                       scalar_t* buf) {
  const scalar_t lr = static_cast<scalar_t>(p.lr);
  const scalar_t eps = static_cast<scalar_t>(p.eps);
  const scalar_t wd = static_cast<scalar_t>(p.weight_decay);
  const scalar_t* g = grad;
  if (p.decay_mode == L2) {
    for (int64_t j = 0; j < d; ++j) buf[j] = grad[j] + wd * w[j];
    g = buf;
  }
  // The decoupled decay scales the row read *before* the update (sparse_update's order).
  const scalar_t keep = p.decay_mode == DECOUPLED ? static_cast<scalar_t>(1.0) - lr * wd : static_cast<scalar_t>(1.0);
  switch (p.optimizer) {
    case SGD:
      for (int64_t j = 0; j < d; ++j) {
        const scalar_t wj = p.decay_mode == DECOUPLED ? w[j] * keep : w[j];
        w[j] = wj - lr * g[j];
      }
      break;
    case ADAGRAD:
      for (int64_t j = 0; j < d; ++j) {
        const scalar_t s = m1[j] + g[j] * g[j];
        m1[j] = s;
        const scalar_t u = lr * g[j] / (std::sqrt(s) + eps);
        const scalar_t wj = p.decay_mode == DECOUPLED ? w[j] * keep : w[j];
        w[j] = wj - u;
      }
      break;
    case ROWWISE_ADAGRAD: {
      // Eight partial sums (vectorisable); torch's mean reduces in its own order too.
      scalar_t part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t j = 0;
      for (; j + 8 <= d; j += 8)
        for (int k = 0; k < 8; ++k) part[k] += g[j + k] * g[j + k];
      for (; j < d; ++j) part[0] += g[j] * g[j];
      const scalar_t sq = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
      const scalar_t m = m1[0] + sq / static_cast<scalar_t>(d);
      m1[0] = m;
      const scalar_t f = lr / (std::sqrt(m) + eps);
      for (int64_t j = 0; j < d; ++j) {
        const scalar_t wj = p.decay_mode == DECOUPLED ? w[j] * keep : w[j];
        w[j] = wj - f * g[j];
      }
      break;
    }
    case ADAM: {
      const scalar_t b1 = static_cast<scalar_t>(p.beta1), b2 = static_cast<scalar_t>(p.beta2);
      const scalar_t a1 = static_cast<scalar_t>(1.0 - p.beta1), a2 = static_cast<scalar_t>(1.0 - p.beta2);
      const scalar_t c1 = static_cast<scalar_t>(p.bias1), c2 = static_cast<scalar_t>(p.bias2);
      for (int64_t j = 0; j < d; ++j) {
        const scalar_t n1 = m1[j] * b1 + a1 * g[j];
        const scalar_t n2 = m2[j] * b2 + a2 * g[j] * g[j];
        m1[j] = n1;
        m2[j] = n2;
        const scalar_t u = lr * (n1 / c1) / (std::sqrt(n2 / c2) + eps);
        const scalar_t wj = p.decay_mode == DECOUPLED ? w[j] * keep : w[j];
        w[j] = wj - u;
      }
      break;
    }
    default:
      break;
  }
}

LIGHTREC_ALWAYS_INLINE void prefetch_lines(const char* p, int64_t bytes, bool write) {
  for (int64_t off = 0; off < bytes; off += 64) {
    if (write) {
      __builtin_prefetch(p + off, 1);
    } else {
      __builtin_prefetch(p + off, 0);
    }
  }
}

// Phase 3's inputs, shared by the threads: each thread updates the unique rows [lo, hi).
template <typename scalar_t>
struct RowUpdates {
  const Params& p;
  int64_t d, w_row, m1_row;
  scalar_t *w, *m1, *m2;
  int32_t* scratch;  // nullptr: nothing to reset (the id table de-duplicated)
  const GradRows<scalar_t>& grads;
  const int64_t* uniq;
  const int64_t* start;  // CSR of each unique row's occurrences (nullptr when every id is distinct)
  const int64_t* order;

  // Rows are visited in input order, so the gradient streams; the rows themselves are random reads,
  // latency-bound: every cache line of the row 8 ahead is prefetched (measured on 53k random rows of
  // 13 x 100k x 64: 0 ahead 17 ms, 4 ahead 11.4, 8 ahead 10.3, 16 ahead 10.3; visiting in row
  // order instead was slower, 15 ms, as the gradient reads turn random).
  LIGHTREC_ALWAYS_INLINE void range(int64_t lo, int64_t hi) const {
    constexpr int64_t kAhead = 8;
    const bool distinct = start == nullptr;
    const int64_t row_bytes = d * static_cast<int64_t>(sizeof(scalar_t));
    const int64_t state_bytes = m1_row * static_cast<int64_t>(sizeof(scalar_t));
    std::vector<scalar_t> g(static_cast<size_t>(d)), buf(static_cast<size_t>(d));
    for (int64_t u = lo; u < hi; ++u) {
      if (u + kAhead < hi) {  // every cache line of the row ahead, its state and its gradient
        const int64_t ua = u + kAhead;
        const int64_t r = uniq[ua];
        prefetch_lines(reinterpret_cast<const char*>(w + r * w_row), row_bytes, true);
        if (m1 != nullptr) prefetch_lines(reinterpret_cast<const char*>(m1 + r * m1_row), state_bytes, true);
        if (m2 != nullptr) prefetch_lines(reinterpret_cast<const char*>(m2 + r * m1_row), state_bytes, true);
        prefetch_lines(reinterpret_cast<const char*>(grads.row(distinct ? ua : order[start[ua]])), row_bytes, false);
        if (scratch != nullptr) __builtin_prefetch(scratch + r, 1);  // reset below; its line left the cache since step 1
      }
      const int64_t r = uniq[u];
      scalar_t* wr = w + r * w_row;
      scalar_t* m1r = m1 ? m1 + r * m1_row : nullptr;
      scalar_t* m2r = m2 ? m2 + r * m1_row : nullptr;
      const int64_t first = distinct ? u : start[u];
      const int64_t last = distinct ? u + 1 : start[u + 1];
      if (last - first == 1 && grads.scale == nullptr) {  // one plain contribution: the gradient row itself
        update_row<scalar_t>(p, d, wr, m1r, m2r, grads.row(distinct ? u : order[first]), buf.data());
        if (scratch != nullptr) scratch[r] = -1;
        continue;
      }
      for (int64_t j = 0; j < d; ++j) g[j] = 0;
      for (int64_t k = first; k < last; ++k) {
        const int64_t i = distinct ? k : order[k];
        const scalar_t* src = grads.row(i);
        if (grads.scale != nullptr) {
          const scalar_t f = grads.scale[i];
          for (int64_t j = 0; j < d; ++j) g[j] += src[j] * f;
        } else {
          for (int64_t j = 0; j < d; ++j) g[j] += src[j];
        }
      }
      update_row<scalar_t>(p, d, wr, m1r, m2r, g.data(), buf.data());
      if (scratch != nullptr) scratch[r] = -1;
    }
  }
};

// The same loop twice: as the portable build compiles it (SSE2 on x86-64), and with AVX2 for the
// CPUs that have it, picked at run time -- the library is built once per machine but a shared
// extension cache may serve several. No FMA either way (-ffp-contract=off, and AVX2 alone has
// none), so both round exactly alike. Measured in the 26 x 100k x 64 row-wise Adagrad model step
// (1 thread): the update 6.3 -> 4.8-5.1 ms.
template <typename scalar_t>
void update_rows_portable(const RowUpdates<scalar_t>& job, int64_t lo, int64_t hi) {
  job.range(lo, hi);
}

#if LIGHTREC_X86_DISPATCH
template <typename scalar_t>
__attribute__((target("avx2"))) void update_rows_avx2(const RowUpdates<scalar_t>& job, int64_t lo, int64_t hi) {
  job.range(lo, hi);
}
#endif

template <typename scalar_t>
void update_rows(const RowUpdates<scalar_t>& job, int64_t lo, int64_t hi) {
#if LIGHTREC_X86_DISPATCH
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return update_rows_avx2<scalar_t>(job, lo, hi);
#endif
  update_rows_portable<scalar_t>(job, lo, hi);
}

// How phase 1 finds each id's unique index (the op's `dedupe` argument).
enum Dedupe : int64_t { DEDUPE_AUTO = 0, DEDUPE_SCRATCH = 1, DEDUPE_TABLE = 2 };

// Phase 1 with the persistent [rows] int32 scratch (scratch[row] = its unique index, -1 elsewhere):
// O(n), no sort, no [rows]-sized clearing; but every id is a random access to a [rows]-sized array
// (5 MiB for 1.3M rows), a cache and TLB miss, and phase 3 touches the entry again to reset it. The
// entry kDedupAhead ids ahead is prefetched (measured on 53k random ids of 13 x 100k rows: see
// benchmarks/bench_cpu_update.py).
void dedupe_with_scratch(int32_t* scratch, int64_t rows, const int64_t* ids, int64_t n, std::vector<int64_t>& uniq,
                         std::vector<int32_t>& inv) {
  constexpr int64_t kDedupAhead = 16;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kDedupAhead < n) {
      const int64_t ahead = ids[i + kDedupAhead];
      if (ahead >= 0 && ahead < rows) __builtin_prefetch(scratch + ahead, 1);
    }
    const int64_t id = ids[i];
    if (id < 0 || id >= rows) {
      for (int64_t r : uniq) scratch[r] = -1;  // leave the scratch clean for the next call
      TORCH_CHECK(false, "cpu_fused_update: id ", id, " at position ", i, " is outside [0, ", rows, ")");
    }
    int32_t s = scratch[id];
    if (s < 0) {
      s = static_cast<int32_t>(uniq.size());
      scratch[id] = s;
      uniq.push_back(id);
    }
    inv[i] = s;
  }
}

// Phase 1 with an open-addressing table of this call's ids: 2n..4n slots (a power of two, at least
// 64) of {id, unique index}, 16 bytes each, kept per thread between calls and cleared by one memset.
// Where it is smaller than the [rows] scratch (few ids against many rows: 53k ids of 26 x 100k rows
// make 2 MiB against 10 MiB) it stays in cache while the scratch's entries are DRAM misses, and
// phase 3 has no entries to reset: measured 4.8 -> 3.5 ms for that update on one thread.
struct IdSlot {
  int64_t id;  // -1: empty
  int64_t index;
};

inline int table_bits(int64_t n) {
  int bits = 6;
  while ((int64_t{1} << bits) < 2 * n) ++bits;
  return bits;
}

inline uint64_t slot_of(int64_t id, int shift) {
  return (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> shift;  // Fibonacci hashing: top bits
}

void dedupe_with_table(int64_t rows, const int64_t* ids, int64_t n, std::vector<int64_t>& uniq,
                       std::vector<int32_t>& inv) {
  thread_local std::vector<IdSlot> table;
  const int bits = table_bits(n);
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  const int shift = 64 - bits;
  table.resize(static_cast<size_t>(mask + 1));
  std::memset(static_cast<void*>(table.data()), 0xff, table.size() * sizeof(IdSlot));  // every id -1
  constexpr int64_t kDedupAhead = 16;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kDedupAhead < n) __builtin_prefetch(&table[slot_of(ids[i + kDedupAhead], shift)], 1);
    const int64_t id = ids[i];
    TORCH_CHECK(id >= 0 && id < rows, "cpu_fused_update: id ", id, " at position ", i, " is outside [0, ", rows, ")");
    uint64_t s = slot_of(id, shift);
    while (table[s].id != id && table[s].id >= 0) s = (s + 1) & mask;  // linear probing; never full (2n slots)
    if (table[s].id < 0) {
      table[s].id = id;
      table[s].index = static_cast<int64_t>(uniq.size());
      uniq.push_back(id);
    }
    inv[i] = static_cast<int32_t>(table[s].index);
  }
}

// DEDUPE_AUTO takes the table where it is no larger than the scratch.
inline bool use_table(int64_t dedupe, int64_t n, int64_t rows) {
  if (dedupe != DEDUPE_AUTO) return dedupe == DEDUPE_TABLE;
  const int64_t slots = int64_t{1} << table_bits(n);
  return slots * static_cast<int64_t>(sizeof(IdSlot)) <= rows * static_cast<int64_t>(sizeof(int32_t));
}

// Phase 3 split over torch's intra-op thread count (torch.set_num_threads), in contiguous ranges of
// unique rows. Not at::parallel_for: in torch's CPU wheels that is OpenMP pragmas compiled into the
// caller, and this library is built without -fopenmp, so it ran on one thread (measured: Adam over
// 1.45M touched rows, 197 ms on 1 or 2 threads); building with -fopenmp would load a second OpenMP
// runtime that does not follow torch.set_num_threads. Threads are started per call only where each
// gets at least kRowsPerThread rows (~50 us to start one, against ~100 ns a row).
template <typename F>
void run_on_threads(int64_t count, const F& f) {
  constexpr int64_t kRowsPerThread = 16384;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), count / kRowsPerThread));
  if (threads == 1) {
    f(0, count);
    return;
  }
  const int64_t chunk = (count + threads - 1) / threads;
  std::vector<std::thread> helpers;
  helpers.reserve(static_cast<size_t>(threads - 1));
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t lo = t * chunk, hi = std::min(count, lo + chunk);
    helpers.emplace_back([&f, lo, hi] { f(lo, hi); });
  }
  f(0, std::min(count, chunk));
  for (std::thread& helper : helpers) helper.join();
}

template <typename scalar_t>
void run(const Params& p, at::Tensor& weight, scalar_t* m1, scalar_t* m2, int64_t m1_row, int32_t* scratch,
         const int64_t* ids, int64_t n, const GradRows<scalar_t>& grads, int64_t dedupe) {
  const int64_t rows = weight.size(0), d = weight.size(1), w_row = weight.stride(0);
  scalar_t* w = weight.data_ptr<scalar_t>();
  // 1. De-duplicate: the unique rows in first-occurrence order, and each id's index among them.
  std::vector<int64_t> uniq;
  uniq.reserve(static_cast<size_t>(n));
  std::vector<int32_t> inv(static_cast<size_t>(n));
  if (use_table(dedupe, n, rows)) {
    dedupe_with_table(rows, ids, n, uniq, inv);
    scratch = nullptr;  // untouched: nothing to reset in phase 3
  } else {
    dedupe_with_scratch(scratch, rows, ids, n, uniq, inv);
  }
  const int64_t u_count = static_cast<int64_t>(uniq.size());

  // 2. Occurrences of each unique row, in input order (CSR); skipped when every id is distinct.
  std::vector<int64_t> start, order;
  const bool distinct = u_count == n;
  if (!distinct) {
    start.assign(static_cast<size_t>(u_count) + 1, 0);
    for (int64_t i = 0; i < n; ++i) ++start[inv[i] + 1];
    for (int64_t u = 0; u < u_count; ++u) start[u + 1] += start[u];
    order.resize(static_cast<size_t>(n));
    std::vector<int64_t> cursor(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[cursor[inv[i]]++] = i;
  }
  // 3. Sum each row's contributions and update it once; rows are independent, so threads split them.
  const RowUpdates<scalar_t> job{p, d, w_row, m1_row, w, m1, m2, scratch, grads, uniq.data(),
                                 distinct ? nullptr : start.data(), distinct ? nullptr : order.data()};
  run_on_threads(u_count, [&](int64_t lo, int64_t hi) { update_rows<scalar_t>(job, lo, hi); });
}

void cpu_fused_update(at::Tensor weight, const c10::optional<at::Tensor>& momentum1,
                      const c10::optional<at::Tensor>& momentum2, at::Tensor scratch, const at::Tensor& ids,
                      const at::Tensor& grad, const c10::optional<at::Tensor>& bag_of_id,
                      const c10::optional<at::Tensor>& scale, int64_t optimizer, double lr, double eps,
                      double beta1, double beta2, double weight_decay, int64_t decay_mode, double bias1,
                      double bias2, int64_t dedupe, at::TensorList grad_parts, at::IntArrayRef part_starts) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.stride(1) == 1,
              "cpu_fused_update: weight must be a CPU [rows, D] tensor with unit column stride");
  TORCH_CHECK(scratch.scalar_type() == at::kInt && scratch.is_contiguous() && scratch.numel() == weight.size(0),
              "cpu_fused_update: scratch must be int32 [rows] (all -1)");
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.is_contiguous(), "cpu_fused_update: ids must be contiguous int64");
  TORCH_CHECK(grad.dim() == 3 && grad.size(2) == weight.size(1) && grad.stride(2) == 1 &&
                  grad.scalar_type() == weight.scalar_type(),
              "cpu_fused_update: grad must be [A, C, D] with unit last stride, in the weight's dtype");
  TORCH_CHECK(optimizer >= SGD && optimizer <= ADAM, "cpu_fused_update: unknown optimizer code ", optimizer);
  TORCH_CHECK(dedupe >= DEDUPE_AUTO && dedupe <= DEDUPE_TABLE, "cpu_fused_update: unknown dedupe code ", dedupe);
  const int64_t n = ids.numel();
  const int64_t* bags = nullptr;
  if (bag_of_id.has_value()) {
    TORCH_CHECK(bag_of_id->scalar_type() == at::kLong && bag_of_id->is_contiguous() && bag_of_id->numel() == n,
                "cpu_fused_update: bag_of_id must be contiguous int64 [N]");
    bags = bag_of_id->data_ptr<int64_t>();
    const int64_t num_bags = grad.size(0) * grad.size(1);
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(bags[i] >= 0 && bags[i] < num_bags, "cpu_fused_update: bag_of_id[", i, "] = ", bags[i],
                  " is outside the gradient's ", num_bags, " bags");
    }
  } else if (grad_parts.empty()) {
    TORCH_CHECK(grad.size(0) * grad.size(1) >= n, "cpu_fused_update: grad has fewer rows than ids");
  }
  const int64_t num_parts = static_cast<int64_t>(grad_parts.size());
  TORCH_CHECK(num_parts == static_cast<int64_t>(part_starts.size()),
              "cpu_fused_update: grad_parts and part_starts must have one entry each per part");
  TORCH_CHECK(num_parts == 0 || !bag_of_id.has_value(), "cpu_fused_update: grad_parts take one id per bag");
  for (int64_t k = 0; k < num_parts; ++k) {
    const at::Tensor& part = grad_parts[k];
    const int64_t end = k + 1 < num_parts ? part_starts[k + 1] : n;
    TORCH_CHECK(part.dim() == 2 && part.size(1) == weight.size(1) && (part.stride(1) == 1 || part.size(1) <= 1) &&
                    part.scalar_type() == weight.scalar_type() && part.device().is_cpu(),
                "cpu_fused_update: grad_parts[", k, "] must be a CPU [n_k, D] tensor with unit column stride, in "
                "the weight's dtype");
    TORCH_CHECK(part_starts[k] == (k == 0 ? 0 : part_starts[k - 1] + grad_parts[k - 1].size(0)) &&
                    part_starts[k] + part.size(0) == end,
                "cpu_fused_update: grad_parts must cover the ", n, " ids back to back from 0 (part ", k,
                " starts at ", part_starts[k], " with ", part.size(0), " rows)");
  }
  Params p{optimizer, decay_mode, lr, eps, beta1, beta2, weight_decay, bias1, bias2};
  AT_DISPATCH_FLOATING_TYPES(weight.scalar_type(), "cpu_fused_update", [&] {
    const scalar_t* sc = nullptr;
    if (scale.has_value()) {
      TORCH_CHECK(scale->scalar_type() == weight.scalar_type() && scale->is_contiguous() && scale->numel() == n,
                  "cpu_fused_update: scale must be contiguous [N] in the weight's dtype");
      sc = scale->data_ptr<scalar_t>();
    }
    scalar_t* m1 = nullptr;
    scalar_t* m2 = nullptr;
    int64_t m1_row = 0;
    if (optimizer != SGD) {
      TORCH_CHECK(momentum1.has_value() && momentum1->is_contiguous() && momentum1->scalar_type() == weight.scalar_type() &&
                      momentum1->size(0) == weight.size(0),
                  "cpu_fused_update: this optimizer needs momentum1 aligned with the weight rows");
      m1 = momentum1->data_ptr<scalar_t>();
      m1_row = optimizer == ROWWISE_ADAGRAD ? 1 : weight.size(1);
      TORCH_CHECK(momentum1->numel() == weight.size(0) * m1_row, "cpu_fused_update: momentum1 has the wrong shape");
    }
    if (optimizer == ADAM) {
      TORCH_CHECK(momentum2.has_value() && momentum2->is_contiguous() && momentum2->sizes() == momentum1->sizes() &&
                      momentum2->scalar_type() == weight.scalar_type(),
                  "cpu_fused_update: Adam needs momentum2 shaped like momentum1");
      m2 = momentum2->data_ptr<scalar_t>();
    }
    std::vector<int64_t> bag_start;
    if (grad.size(0) != 1) {
      const int64_t a = grad.size(0), c = grad.size(1);
      bag_start.resize(static_cast<size_t>(a * c));
      for (int64_t x = 0; x < a; ++x)
        for (int64_t y = 0; y < c; ++y) bag_start[x * c + y] = x * grad.stride(0) + y * grad.stride(1);
    }
    GradRows<scalar_t> rows{grad.data_ptr<scalar_t>(), grad.stride(1), bags, sc,
                            bag_start.empty() ? nullptr : bag_start.data()};
    std::vector<const scalar_t*> part_base;
    std::vector<int64_t> part_start, part_stride;
    for (int64_t k = 0; k < num_parts; ++k) {
      part_base.push_back(grad_parts[k].data_ptr<scalar_t>());
      part_start.push_back(part_starts[k]);
      part_stride.push_back(grad_parts[k].stride(0));
    }
    if (num_parts > 0) {
      rows.parts = num_parts;
      rows.part_base = part_base.data();
      rows.part_start = part_start.data();
      rows.part_stride = part_stride.data();
    }
    run<scalar_t>(p, weight, m1, m2, m1_row, scratch.data_ptr<int32_t>(), ids.data_ptr<int64_t>(), n, rows, dedupe);
  });
}

}  // namespace

TORCH_LIBRARY(lightrec_cpu, m) {
  m.def(
      "cpu_fused_update(Tensor(a!) weight, Tensor(b!)? momentum1, Tensor(c!)? momentum2, Tensor(d!) scratch, "
      "Tensor ids, Tensor grad, Tensor? bag_of_id, Tensor? scale, int optimizer, float lr, float eps, "
      "float beta1, float beta2, float weight_decay, int decay_mode, float bias1, float bias2, int dedupe, "
      "Tensor[] grad_parts, int[] part_starts) -> ()");
}

TORCH_LIBRARY_IMPL(lightrec_cpu, CPU, m) { m.impl("cpu_fused_update", &cpu_fused_update); }

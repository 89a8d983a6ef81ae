// The fused (in-backward) optimizer update of the torch kernel on CPU: one pass that de-duplicates
// the looked-up ids, sums each row's gradient contributions and updates every touched row once.
//
// Registered as torch.ops.lightrec.cpu_fused_update (built at first use by lightrec/_native.py;
// lightrec/kernels/cpu_update.py is the Python side and documents the arguments). The arithmetic
// follows lightrec/kernels/sparse_update.py operation by operation (compiled without FMA
// contraction), so the two agree to the last bit except where torch's own vectorised kernels
// round differently (the row mean of row-wise Adagrad, Adam's alpha-scaled adds).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

enum Optimizer : int64_t { SGD = 0, ADAGRAD = 1, ROWWISE_ADAGRAD = 2, ADAM = 3 };
enum DecayMode : int64_t { NONE = 0, L2 = 1, DECOUPLED = 2 };

struct Params {
  int64_t optimizer;
  int64_t decay_mode;
  double lr, eps, beta1, beta2, weight_decay, bias1, bias2;
};

// Where the gradient of occurrence i lives: bag k = bag_of_id[i] (or i), then the bag's row in a
// [A, C, D] strided view: (k / C, k % C).
template <typename scalar_t>
struct GradRows {
  const scalar_t* base;
  int64_t c, s0, s1;
  const int64_t* bag_of_id;  // nullptr: occurrence i is bag i
  const scalar_t* scale;     // nullptr: no per-occurrence factor
  bool flat;                 // A == 1
  inline const scalar_t* row(int64_t i) const {
    const int64_t k = bag_of_id ? bag_of_id[i] : i;
    if (flat) return base + k * s1;  // [1, C, D]: no division (~80 cycles a row otherwise)
    return base + (k / c) * s0 + (k % c) * s1;
  }
};

// `grad` is the row's summed gradient (read only); `buf` a [d] buffer for the L2-decayed copy.
template <typename scalar_t>
inline void update_row(const Params& p, int64_t d, scalar_t* w, scalar_t* m1, scalar_t* m2, const scalar_t* grad,
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

inline void prefetch_lines(const char* p, int64_t bytes, bool write) {
  for (int64_t off = 0; off < bytes; off += 64) {
    if (write) {
      __builtin_prefetch(p + off, 1);
    } else {
      __builtin_prefetch(p + off, 0);
    }
  }
}

template <typename scalar_t>
void run(const Params& p, at::Tensor& weight, scalar_t* m1, scalar_t* m2, int64_t m1_row, int32_t* scratch,
         const int64_t* ids, int64_t n, const GradRows<scalar_t>& grads) {
  const int64_t rows = weight.size(0), d = weight.size(1), w_row = weight.stride(0);
  scalar_t* w = weight.data_ptr<scalar_t>();
  // 1. De-duplicate with the persistent scratch (scratch[row] = its unique index, -1 elsewhere):
  // O(n), no sort, no [rows]-sized clearing.
  std::vector<int64_t> uniq;
  uniq.reserve(static_cast<size_t>(n));
  std::vector<int32_t> inv(static_cast<size_t>(n));
  // The scratch is [rows] int32 (5 MiB for 1.3M rows): each id's entry is a random read, a cache and
  // TLB miss -- so the entry kDedupAhead ids ahead is prefetched (measured on 53k random ids of
  // 13 x 100k rows: see benchmarks/bench_cpu_update.py).
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
  // Rows are visited in input order, so the gradient streams; the rows themselves are random reads,
  // latency-bound: every cache line of the row 8 ahead is prefetched (measured on 53k random rows of
  // 13 x 100k x 64: 0 ahead 17 ms, 4 ahead 11.4, 8 ahead 10.3, 16 ahead 10.3; visiting in row
  // order instead was slower, 15 ms, as the gradient reads turn random).
  constexpr int64_t kAhead = 8;
  const int64_t row_bytes = d * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t state_bytes = m1_row * static_cast<int64_t>(sizeof(scalar_t));
  at::parallel_for(0, u_count, 64, [&](int64_t lo, int64_t hi) {
    std::vector<scalar_t> g(static_cast<size_t>(d)), buf(static_cast<size_t>(d));
    for (int64_t u = lo; u < hi; ++u) {
      if (u + kAhead < hi) {  // every cache line of the row ahead, its state and its gradient
        const int64_t ua = u + kAhead;
        const int64_t r = uniq[ua];
        prefetch_lines(reinterpret_cast<const char*>(w + r * w_row), row_bytes, true);
        if (m1 != nullptr) prefetch_lines(reinterpret_cast<const char*>(m1 + r * m1_row), state_bytes, true);
        if (m2 != nullptr) prefetch_lines(reinterpret_cast<const char*>(m2 + r * m1_row), state_bytes, true);
        prefetch_lines(reinterpret_cast<const char*>(grads.row(distinct ? ua : order[start[ua]])), row_bytes, false);
        __builtin_prefetch(scratch + r, 1);  // reset below; its line left the cache since step 1
      }
      const int64_t r = uniq[u];
      scalar_t* wr = w + r * w_row;
      scalar_t* m1r = m1 ? m1 + r * m1_row : nullptr;
      scalar_t* m2r = m2 ? m2 + r * m1_row : nullptr;
      if (distinct && grads.scale == nullptr) {  // one plain contribution: the gradient row itself
        update_row<scalar_t>(p, d, wr, m1r, m2r, grads.row(u), buf.data());
        scratch[r] = -1;
        continue;
      }
      const int64_t first = distinct ? u : start[u];
      const int64_t last = distinct ? u + 1 : start[u + 1];
      if (last - first == 1 && grads.scale == nullptr) {  // one plain contribution: no copy into g
        update_row<scalar_t>(p, d, wr, m1r, m2r, grads.row(distinct ? u : order[first]), buf.data());
        scratch[r] = -1;
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
      scratch[r] = -1;
    }
  });
}

void cpu_fused_update(at::Tensor weight, const c10::optional<at::Tensor>& momentum1,
                      const c10::optional<at::Tensor>& momentum2, at::Tensor scratch, const at::Tensor& ids,
                      const at::Tensor& grad, const c10::optional<at::Tensor>& bag_of_id,
                      const c10::optional<at::Tensor>& scale, int64_t optimizer, double lr, double eps,
                      double beta1, double beta2, double weight_decay, int64_t decay_mode, double bias1,
                      double bias2) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.stride(1) == 1,
              "cpu_fused_update: weight must be a CPU [rows, D] tensor with unit column stride");
  TORCH_CHECK(scratch.scalar_type() == at::kInt && scratch.is_contiguous() && scratch.numel() == weight.size(0),
              "cpu_fused_update: scratch must be int32 [rows] (all -1)");
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.is_contiguous(), "cpu_fused_update: ids must be contiguous int64");
  TORCH_CHECK(grad.dim() == 3 && grad.size(2) == weight.size(1) && grad.stride(2) == 1 &&
                  grad.scalar_type() == weight.scalar_type(),
              "cpu_fused_update: grad must be [A, C, D] with unit last stride, in the weight's dtype");
  TORCH_CHECK(optimizer >= SGD && optimizer <= ADAM, "cpu_fused_update: unknown optimizer code ", optimizer);
  const int64_t n = ids.numel();
  const int64_t* bags = nullptr;
  if (bag_of_id.has_value()) {
    TORCH_CHECK(bag_of_id->scalar_type() == at::kLong && bag_of_id->is_contiguous() && bag_of_id->numel() == n,
                "cpu_fused_update: bag_of_id must be contiguous int64 [N]");
    bags = bag_of_id->data_ptr<int64_t>();
  } else {
    TORCH_CHECK(grad.size(0) * grad.size(1) >= n, "cpu_fused_update: grad has fewer rows than ids");
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
    GradRows<scalar_t> rows{grad.data_ptr<scalar_t>(), grad.size(1), grad.stride(0), grad.stride(1), bags, sc,
                            grad.size(0) == 1};
    run<scalar_t>(p, weight, m1, m2, m1_row, scratch.data_ptr<int32_t>(), ids.data_ptr<int64_t>(), n, rows);
  });
}

}  // namespace

TORCH_LIBRARY(lightrec_cpu, m) {
  m.def(
      "cpu_fused_update(Tensor(a!) weight, Tensor(b!)? momentum1, Tensor(c!)? momentum2, Tensor(d!) scratch, "
      "Tensor ids, Tensor grad, Tensor? bag_of_id, Tensor? scale, int optimizer, float lr, float eps, "
      "float beta1, float beta2, float weight_decay, int decay_mode, float bias1, float bias2) -> ()");
}

TORCH_LIBRARY_IMPL(lightrec_cpu, CPU, m) { m.impl("cpu_fused_update", &cpu_fused_update); }

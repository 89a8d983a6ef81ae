// Row gather out[i] = weight[ids[i]] on CPU, with the rows a few ids ahead prefetched: the torch
// kernel's forward where every bag holds one id (pooling is a gather) and of unpooled lookups.
//
// Registered as torch.ops.lightrec_cpu.gather_rows (built at first use by lightrec/_native.py;
// lightrec/kernels/cpu_gather.py is the Python side). The bytes are copied, so the result equals
// weight.index_select(0, ids) exactly. torch's index_select copies row by row without prefetching;
// every row is a random read of a table far larger than the caches, so it waits on each one.
// Measured on 53k random ids of 26 x 100k x 64 fp32 tables (huge pages, 1 thread): index_select
// 2.27-2.35 ms; prefetching 0 / 4 / 8 / 16 / 32 rows ahead 2.16 / 1.83-1.90 / 1.77-1.83 / 1.78-1.84 /
// 1.81-1.87 ms.
//
// gather_rows_into writes the same rows into a caller's [M, K * D] block instead of a new tensor: id i
// lands at out[i / K, (i % K) * D : (i % K + 1) * D], for any row stride of out. That is how a sharded
// lookup writes its rows straight into the pooled output's column block and the shared-memory segment
// of the exchange (lightrec/distributed/comm/pooled_all_to_all.py) instead of a tensor copied twice.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kAhead = 8;  // rows prefetched ahead (see the measurement above)

void check_operands(const at::Tensor& weight, const at::Tensor& ids, const char* op) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.stride(1) == 1, op,
              ": weight must be a CPU [rows, D] tensor with unit column stride");
  TORCH_CHECK(ids.device().is_cpu() && ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(), op,
              ": ids must be a contiguous CPU int64 [N] tensor");
  const int64_t n = ids.numel(), rows = weight.size(0);
  const int64_t* idx = ids.data_ptr<int64_t>();
  // Checked up front (one sequential pass over the ids): a bad id leaves nothing half-copied.
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(idx[i] >= 0 && idx[i] < rows, op, ": id ", idx[i], " at position ", i, " is outside [0, ", rows,
                ")");
  }
}

// Copies row ids[i] of weight to out + (i / per_row) * out_row_bytes + (i % per_row) * row_bytes.
void copy_rows(const at::Tensor& weight, const at::Tensor& ids, char* o, int64_t per_row, int64_t out_row_bytes) {
  const int64_t n = ids.numel(), d = weight.size(1);
  const int64_t elem = static_cast<int64_t>(weight.element_size());
  const int64_t row_bytes = d * elem, w_stride = weight.stride(0) * elem;
  if (n == 0 || d == 0) return;
  const char* w = static_cast<const char*>(weight.data_ptr());
  const int64_t* idx = ids.data_ptr<int64_t>();
  // One thread: the copy is bound by memory latency, which the prefetch hides. (at::parallel_for would
  // run serially anyway: this library is built without -fopenmp; see cpu_fused_update.cpp.)
  int64_t slot = 0;
  char* dst_row = o;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const char* ahead = w + idx[i + kAhead] * w_stride;
      for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(ahead + off, 0, 0);
    }
    std::memcpy(dst_row + slot * row_bytes, w + idx[i] * w_stride, static_cast<size_t>(row_bytes));
    if (++slot == per_row) {
      slot = 0;
      dst_row += out_row_bytes;
    }
  }
}

at::Tensor gather_rows(const at::Tensor& weight, const at::Tensor& ids) {
  check_operands(weight, ids, "gather_rows");
  const int64_t n = ids.numel(), d = weight.size(1);
  at::Tensor out = at::empty({n, d}, weight.options());
  copy_rows(weight, ids, static_cast<char*>(out.data_ptr()), 1, d * static_cast<int64_t>(weight.element_size()));
  return out;
}

void gather_rows_into(const at::Tensor& weight, const at::Tensor& ids, const at::Tensor& out) {
  check_operands(weight, ids, "gather_rows_into");
  const int64_t d = weight.size(1);
  TORCH_CHECK(out.device().is_cpu() && out.dim() == 2 && out.scalar_type() == weight.scalar_type(),
              "gather_rows_into: out must be a CPU [M, K * D] tensor of the weight's dtype");
  TORCH_CHECK(d > 0 && out.size(1) % d == 0 && out.size(0) * (out.size(1) / d) == ids.numel(),
              "gather_rows_into: out ", out.sizes(), " does not hold ", ids.numel(), " rows of ", d, " columns");
  TORCH_CHECK(out.stride(1) == 1 || out.size(1) <= 1, "gather_rows_into: out needs unit column stride");
  const int64_t elem = static_cast<int64_t>(weight.element_size());
  copy_rows(weight, ids, static_cast<char*>(out.data_ptr()), out.size(1) / d, out.stride(0) * elem);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightrec_cpu, m) {
  m.def("gather_rows(Tensor weight, Tensor ids) -> Tensor");
  // Defined with its kernel for every backend: it checks that its operands are on the CPU itself.
  m.def("gather_rows_into(Tensor weight, Tensor ids, Tensor(a!) out) -> ()", &gather_rows_into);
}

TORCH_LIBRARY_IMPL(lightrec_cpu, CPU, m) { m.impl("gather_rows", &gather_rows); }

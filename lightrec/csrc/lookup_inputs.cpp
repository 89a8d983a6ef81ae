// The per-call chores around a batched lookup on CPU, each one pass instead of several torch ops:
//
// * check_lookup_inputs(indices, offsets, feature_rows, batch) -> int[3]: the id check of
//   lightrec/kernels/input_checks.py (``id_check="sync"``). Returns [offsets_ok, ids_ok, singletons]:
//   offsets start at 0, end at len(indices) and never decrease; every id of feature f (bags
//   f*B .. (f+1)*B - 1) lies in [0, feature_rows[f]) (only looked at when the offsets are fine);
//   every bag holds exactly one id. The Python side words the precise error when one fails. With
//   torch ops this is an aminmax, a comparison of shifted offsets and an equality with an arange:
//   ~190 us for 53k ids of 26 features; this pass ~20 us (1 thread).
// * sample_major_ids(indices, feature_shift, batch) -> Tensor: ids of one-id-per-bag features read
//   sample-major, out[b * F + f] = indices[f * B + b] + feature_shift[f] (the torch kernel's
//   pooled lookup is then a row gather straight into the [B, F * D] output). With torch ops a
//   repeat_interleave, an add and a transposing copy: ~200 us for 53k ids; this ~30 us.
//
// Registered as torch.ops.lightrec_cpu.* (built at first use by lightrec/_native.py).

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

// The hot loops are built twice (AVX2 and the baseline) and the loader picks one per machine: the
// 64-bit compares they reduce vectorise only from AVX2 on (the extension is built without -march).
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define LIGHTREC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LIGHTREC_CLONES
#endif

// Offsets non-decreasing (bit 0 of the result set when one decreases) and every length one (bit 1
// set when one is not), in one branch-free pass. Offsets are compared, not subtracted: a signed
// difference can wrap (offsets [0, INT_MAX, INT_MIN, -1, n] have no "negative" length), and the
// length-one test subtracts unsigned, where wrapping is defined.
template <typename O>
LIGHTREC_CLONES int check_lengths(const O* off, int64_t bags) {
  using U = std::make_unsigned_t<O>;
  int decreasing = 0, not_one = 0;
  for (int64_t k = 0; k < bags; ++k) {
    decreasing |= off[k + 1] < off[k];
    not_one |= static_cast<U>(static_cast<U>(off[k + 1]) - static_cast<U>(off[k])) != U{1};
  }
  return decreasing | (not_one << 1);
}

// Whether any id of ids[0, n) is outside [0, rows): a negative id, sign-extended to 64 bits and read
// unsigned, is larger than any row count.
template <typename I>
LIGHTREC_CLONES bool any_outside(const I* ids, int64_t n, int64_t rows) {
  const uint64_t limit = static_cast<uint64_t>(rows);
  int outside = 0;
  for (int64_t i = 0; i < n; ++i) outside |= static_cast<uint64_t>(static_cast<int64_t>(ids[i])) >= limit;
  return outside != 0;
}

template <typename I, typename O>
bool ids_in_range(const I* ids, const O* off, const int64_t* rows, int64_t features, int64_t batch) {
  for (int64_t f = 0; f < features; ++f) {
    const int64_t lo = off[f * batch], hi = off[(f + 1) * batch];
    // The offsets were checked (first 0, last n, non-decreasing); this keeps a read inside ids whatever.
    if (lo < 0 || hi < lo) return false;
    if (any_outside(ids + lo, hi - lo, rows[f])) return false;
  }
  return true;
}

template <typename I, typename O>
std::vector<int64_t> check_typed(const at::Tensor& indices, const at::Tensor& offsets, const at::Tensor& rows,
                                 int64_t batch) {
  const int64_t bags = offsets.numel() - 1, n = indices.numel(), features = rows.numel();
  const O* off = offsets.data_ptr<O>();
  const int lengths = check_lengths(off, bags);
  const bool offsets_ok = off[0] == 0 && static_cast<int64_t>(off[bags]) == n && (lengths & 1) == 0;
  const bool singletons = offsets_ok && (lengths & 2) == 0;
  const bool ids_ok =
      offsets_ok && ids_in_range(indices.data_ptr<I>(), off, rows.data_ptr<int64_t>(), features, batch);
  return {offsets_ok, ids_ok, singletons && ids_ok};
}

template <typename I>
std::vector<int64_t> check_by_offsets(const at::Tensor& indices, const at::Tensor& offsets, const at::Tensor& rows,
                                      int64_t batch) {
  return offsets.scalar_type() == at::kLong ? check_typed<I, int64_t>(indices, offsets, rows, batch)
                                            : check_typed<I, int32_t>(indices, offsets, rows, batch);
}

std::vector<int64_t> check_lookup_inputs(const at::Tensor& indices, const at::Tensor& offsets,
                                         const at::Tensor& feature_rows, int64_t batch) {
  auto index_type = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.dim() == 1 && t.is_contiguous() &&
           (t.scalar_type() == at::kLong || t.scalar_type() == at::kInt);
  };
  TORCH_CHECK(index_type(indices) && index_type(offsets),
              "check_lookup_inputs: indices and offsets must be contiguous 1-D CPU int32/int64 tensors");
  TORCH_CHECK(feature_rows.device().is_cpu() && feature_rows.scalar_type() == at::kLong &&
                  feature_rows.dim() == 1 && feature_rows.is_contiguous(),
              "check_lookup_inputs: feature_rows must be a contiguous CPU int64 [F] tensor");
  const int64_t features = feature_rows.numel();
  TORCH_CHECK(batch > 0 && features > 0 && offsets.numel() == features * batch + 1,
              "check_lookup_inputs: offsets must hold F * batch + 1 entries, got ", offsets.numel(), " for F=",
              features, ", batch=", batch);
  return indices.scalar_type() == at::kLong ? check_by_offsets<int64_t>(indices, offsets, feature_rows, batch)
                                            : check_by_offsets<int32_t>(indices, offsets, feature_rows, batch);
}

at::Tensor sample_major_ids(const at::Tensor& indices, const at::Tensor& feature_shift, int64_t batch) {
  TORCH_CHECK(indices.device().is_cpu() && indices.scalar_type() == at::kLong && indices.dim() == 1 &&
                  indices.is_contiguous(),
              "sample_major_ids: indices must be a contiguous CPU int64 [F * B] tensor");
  TORCH_CHECK(feature_shift.device().is_cpu() && feature_shift.scalar_type() == at::kLong &&
                  feature_shift.dim() == 1 && feature_shift.is_contiguous(),
              "sample_major_ids: feature_shift must be a contiguous CPU int64 [F] tensor");
  const int64_t features = feature_shift.numel();
  TORCH_CHECK(batch >= 0 && indices.numel() == features * batch, "sample_major_ids: indices must hold F * batch = ",
              features * batch, " ids, got ", indices.numel());
  at::Tensor out = at::empty({indices.numel()}, indices.options());
  const int64_t* in = indices.data_ptr<int64_t>();
  const int64_t* shift = feature_shift.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  // Blocks of samples, so a block's F input runs and its output stay in L1 while it is transposed.
  constexpr int64_t kBlock = 64;
  for (int64_t b0 = 0; b0 < batch; b0 += kBlock) {
    const int64_t b1 = std::min(batch, b0 + kBlock);
    for (int64_t f = 0; f < features; ++f) {
      const int64_t* src = in + f * batch;
      const int64_t s = shift[f];
      for (int64_t b = b0; b < b1; ++b) o[b * features + f] = src[b] + s;
    }
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightrec_cpu, m) {
  m.def("check_lookup_inputs(Tensor indices, Tensor offsets, Tensor feature_rows, int batch) -> int[]");
  m.def("sample_major_ids(Tensor indices, Tensor feature_shift, int batch) -> Tensor");
}

TORCH_LIBRARY_IMPL(lightrec_cpu, CPU, m) {
  m.impl("check_lookup_inputs", &check_lookup_inputs);
  m.impl("sample_major_ids", &sample_major_ids);
}

// The training step of a managed-collision table on CPU: look a batch of raw ids up and hand rows to
// the new ones, in one pass instead of some forty small tensor operations.
//
// Registered as torch.ops.lightrec_mch.lookup_insert (built at first use by lightrec/_native.py;
// lightrec/modules/managed_collision/mch_native.py is the Python side and documents the arguments and results). It
// makes exactly the decisions of the torch-op path, step by step:
//
//   lookup      mch_index.SlotIndex.lookup      the id's newest entry, verified against the slot
//                                               state (here in a hash table: same answer, fewer
//                                               cache misses)
//   bookkeeping mch_step._lookup_and_insert     last access of every row looked up, counts of hits
//   new ids     torch.unique                    ascending, with their lookups in the step
//   admission   mch_step._insert/_sketch_index  hashed counters inside the id's bucket segment
//   rows        mch_index.SlotIndex.take        free rows, then victims not seen since the round
//   shortage    mch_slots.priority_order        more lookups first, then smaller id (stable)
//   placing     mch_step._occupy                slot state, last access, counts
//   index       mch_index.SlotIndex.insert      the placed ids are returned (folded into the sorted
//                                               index later) and put in the hash
//
// tests/modules/managed_collision/test_mch_native.py runs both paths side by side over many steps and compares
// every decision.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using at::Tensor;

// SplitMix64's finaliser (lightrec.modules.managed_collision.ops.mix64: the same bits as torch's wrapping int64 ops).
inline int64_t mix64(int64_t x) {
  uint64_t z = static_cast<uint64_t>(x) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return static_cast<int64_t>(z ^ (z >> 31));
}

inline int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

inline int64_t remainder(int64_t a, int64_t b) {  // b > 0, torch.remainder's sign rule
  const int64_t r = a % b;
  return r < 0 ? r + b : r;
}

constexpr int64_t kEmpty = INT64_MAX;  // mc_ops.EMPTY_ID: a free slot, a free hash entry

// id -> slot, open addressing with linear probing over [H, 2] (id, slot) pairs (H a power of two,
// kept at most 3/4 full by the Python side). Entries are never removed: an evicted id's entry goes
// stale and fails the check against the slot state, as the sorted index's do.
struct Hash {
  int64_t* table;
  int64_t mask;
  int64_t count;

  inline int64_t home(int64_t id) const { return mix64(id) & mask; }
  inline int64_t find(int64_t id, int64_t h) const {  // the slot of id's entry, or -1
    for (;; h = (h + 1) & mask) {
      const int64_t key = table[2 * h];
      if (key == id) return table[2 * h + 1];
      if (key == kEmpty) return -1;
    }
  }
  inline void put(int64_t id, int64_t slot) {  // the newest entry of an id replaces the older one
    for (int64_t h = home(id);; h = (h + 1) & mask) {
      const int64_t key = table[2 * h];
      if (key == id || key == kEmpty) {
        count += key == kEmpty;
        table[2 * h] = id;
        table[2 * h + 1] = slot;
        return;
      }
    }
  }
};

// The module's local buckets (mch_slots.BucketLayout) and the routing of ids to them (mc_ops.block_bucket).
struct Layout {
  const int64_t* bounds;  // [nl + 1] local slot offsets
  int64_t nl, start_bucket, buckets, block;

  inline int64_t local_bucket(int64_t id) const {
    if (nl == 1) return 0;
    const int64_t global = buckets == 1 ? 0 : std::min(floor_div(id, block), buckets - 1);
    return std::clamp<int64_t>(global - start_bucket, 0, nl - 1);
  }
  inline int64_t default_slot(int64_t b) const { return bounds[b + 1] - 1; }
  inline int64_t sketch(int64_t id) const {  // admission counter of an id (mch_step._sketch_index)
    const int64_t b = local_bucket(id);
    return bounds[b] + remainder(mix64(id), bounds[b + 1] - bounds[b]);
  }
};

// The hand-out queues (mch_index.SlotIndex: per bucket free slots, then victims; a cursor each).
struct Queues {
  const int64_t* flat;    // [Q] all buckets' queues, one after the other
  const int64_t* starts;  // [nl + 1] offsets into flat
  const int64_t* free_len;
  int64_t* cursor;
  int64_t round_iter;

  // Up to n rows of bucket b appended to `rows` (free first, then victims, also appended to
  // `victims`); returns how many.
  int64_t take(int64_t b, int64_t n, const int64_t* last_seen, std::vector<int64_t>& rows,
               std::vector<int64_t>& victims) const {
    const int64_t* queue = flat + starts[b];
    const int64_t len = starts[b + 1] - starts[b];
    const int64_t cur = cursor[b], free_end = free_len[b];
    if (cur + n <= free_end) {
      rows.insert(rows.end(), queue + cur, queue + cur + n);
      cursor[b] = cur + n;
      return n;
    }
    const int64_t free = std::max<int64_t>(free_end - cur, 0);
    rows.insert(rows.end(), queue + cur, queue + cur + free);
    const int64_t need = n - free;
    int64_t picked = 0, j = std::max(cur, free_end);
    for (; j < len && picked < need; ++j) {  // every entry looked at is used up
      if (j + 16 < len) __builtin_prefetch(last_seen + queue[j + 16]);
      if (last_seen[queue[j]] <= round_iter) {
        rows.push_back(queue[j]);
        victims.push_back(queue[j]);
        ++picked;
      }
    }
    cursor[b] = j;
    return free + picked;
  }
};

void check_state(const Tensor& t, int64_t size, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.is_contiguous() && t.dim() == 1,
              "lightrec_mch.lookup_insert: ", name, " must be a contiguous 1-d int64 CPU tensor");
  TORCH_CHECK(size < 0 || t.numel() == size, "lightrec_mch.lookup_insert: ", name, " has ", t.numel(),
              " elements, expected ", size);
}

Tensor from_vector(const std::vector<int64_t>& v) {
  Tensor out = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  std::copy(v.begin(), v.end(), out.data_ptr<int64_t>());
  return out;
}

// Returns (rows [N], placed ids [P] ascending, their slots [P], evicted rows [E], waiting ids [W],
// their lookups [W], info [3 + nl]: ids left in the default row, ids placed, hash entries used, the
// cursors).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> lookup_insert(
    const Tensor& values, Tensor slot_ids, Tensor last_access, const c10::optional<Tensor>& counts,
    const c10::optional<Tensor>& admission_counts, Tensor hash, int64_t hash_count, const Tensor& index_ids,
    const Tensor& index_slots, bool rebuild_hash, const Tensor& queue, at::IntArrayRef queue_starts,
    at::IntArrayRef free_len, at::IntArrayRef cursor, at::IntArrayRef bounds, int64_t start_bucket, int64_t buckets,
    int64_t block, int64_t it, int64_t round_iter, int64_t admission_threshold) {
  const int64_t nl = static_cast<int64_t>(bounds.size()) - 1;
  TORCH_CHECK(nl >= 1 && static_cast<int64_t>(queue_starts.size()) == nl + 1 &&
                  static_cast<int64_t>(free_len.size()) == nl && static_cast<int64_t>(cursor.size()) == nl,
              "lightrec_mch.lookup_insert: bounds, queue_starts, free_len and cursor disagree on the buckets");
  TORCH_CHECK(buckets == 1 || block > 0, "lightrec_mch.lookup_insert: block must be positive");
  const int64_t z = slot_ids.numel();
  check_state(values, -1, "values");
  check_state(slot_ids, -1, "slot_ids");
  check_state(last_access, z, "last_access");
  check_state(index_ids, -1, "index_ids");
  check_state(index_slots, index_ids.numel(), "index_slots");
  check_state(queue, queue_starts[nl], "queue");
  if (counts.has_value()) check_state(*counts, z, "counts");
  if (admission_counts.has_value()) check_state(*admission_counts, z, "admission_counts");
  const int64_t h_size = hash.dim() == 2 ? hash.size(0) : 0;
  TORCH_CHECK(hash.device().is_cpu() && hash.scalar_type() == at::kLong && hash.is_contiguous() && hash.dim() == 2 &&
                  hash.size(1) == 2 && h_size >= 2 && (h_size & (h_size - 1)) == 0,
              "lightrec_mch.lookup_insert: hash must be a contiguous [H, 2] int64 CPU tensor, H a power of two");
  TORCH_CHECK(bounds[nl] == z, "lightrec_mch.lookup_insert: bounds end at ", bounds[nl], ", the state has ", z,
              " slots");

  const Layout layout{bounds.data(), nl, start_bucket, buckets, block};
  std::vector<int64_t> cursors(cursor.begin(), cursor.end());
  const Queues queues{queue.data_ptr<int64_t>(), queue_starts.data(), free_len.data(), cursors.data(), round_iter};
  const int64_t n = values.numel();
  const int64_t* v = values.data_ptr<int64_t>();
  int64_t* sid = slot_ids.data_ptr<int64_t>();
  int64_t* last = last_access.data_ptr<int64_t>();
  int64_t* cnt_state = counts.has_value() ? counts->data_ptr<int64_t>() : nullptr;
  Hash table{hash.data_ptr<int64_t>(), h_size - 1, hash_count};
  if (rebuild_hash) {  // from the sorted index: the entries that still hold, newest last
    std::fill(table.table, table.table + 2 * h_size, kEmpty);
    table.count = 0;
    const int64_t l = index_ids.numel();
    const int64_t* ids = index_ids.data_ptr<int64_t>();
    const int64_t* islots = index_slots.data_ptr<int64_t>();
    for (int64_t j = 0; j < l; ++j) {
      TORCH_CHECK(islots[j] >= 0 && islots[j] < z, "lightrec_mch.lookup_insert: the index names slot ", islots[j],
                  " outside [0, ", z, ")");
      if (sid[islots[j]] == ids[j]) table.put(ids[j], islots[j]);
    }
  }
  TORCH_CHECK(table.count + n < h_size, "lightrec_mch.lookup_insert: the hash is too full (", table.count, " + ", n,
              " entries in ", h_size, ")");

  // 1. lookup; every row looked up (default rows too) is marked seen, hits are counted
  Tensor rows_t = at::empty({n}, at::kLong);
  int64_t* rows = rows_t.data_ptr<int64_t>();
  // (in passes, so that the random reads of the hash and the state overlap instead of waiting for
  // each other behind mispredicted hit/miss branches)
  constexpr int64_t kAhead = 16;  // prefetch distance of the random reads
  std::vector<int64_t> found(n);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(v[i] != kEmpty, "lightrec_mch.lookup_insert: id ", v[i], " at position ", i,
                " is the free-slot marker (ids must be below input_hash_size)");
    found[i] = table.home(v[i]);
  }
  for (int64_t i = 0; i < std::min(n, kAhead); ++i) __builtin_prefetch(table.table + 2 * found[i]);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(table.table + 2 * found[i + kAhead]);
    found[i] = table.find(v[i], found[i]);
  }
  std::vector<uint8_t> hits(n);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && found[i + kAhead] >= 0) __builtin_prefetch(sid + found[i + kAhead]);
    hits[i] = found[i] >= 0 && sid[found[i]] == v[i];
  }
  std::vector<int64_t> missed;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && hits[i + kAhead]) __builtin_prefetch(last + found[i + kAhead], 1);
    const bool hit = hits[i] != 0;
    rows[i] = hit ? found[i] : layout.default_slot(layout.local_bucket(v[i]));
    last[rows[i]] = it;
    if (hit && cnt_state != nullptr) ++cnt_state[found[i]];
    if (!hit) missed.push_back(i);
  }
  Tensor none = at::empty({0}, at::kLong);
  std::vector<int64_t> info(3 + nl, 0);
  if (missed.empty()) {
    info[2] = table.count;
    std::copy(cursors.begin(), cursors.end(), info.begin() + 3);
    return {rows_t, none, none, none, none, none, from_vector(info)};
  }

  // 2. the new ids, ascending, with their lookups in the step; inverse[k]: the id of missed[k]
  std::vector<std::pair<int64_t, int64_t>> order(missed.size());  // (id, k)
  for (size_t k = 0; k < missed.size(); ++k) order[k] = {v[missed[k]], static_cast<int64_t>(k)};
  std::sort(order.begin(), order.end());
  std::vector<int64_t> uniq, ucnt, inverse(missed.size());
  for (const auto& [id, k] : order) {
    if (uniq.empty() || uniq.back() != id) {
      uniq.push_back(id);
      ucnt.push_back(0);
    }
    ++ucnt.back();
    inverse[k] = static_cast<int64_t>(uniq.size()) - 1;
  }
  const int64_t u = static_cast<int64_t>(uniq.size());

  // 3. admission: candidates are the new ids whose counter reached the threshold (all without admission)
  std::vector<int64_t> cand;  // positions in uniq, ascending
  const bool admission = admission_threshold > 1;
  if (admission) {
    TORCH_CHECK(admission_counts.has_value(), "lightrec_mch.lookup_insert: admission needs admission_counts");
    int64_t* adm = admission_counts->data_ptr<int64_t>();
    std::vector<int64_t> sketch(u);
    for (int64_t k = 0; k < u; ++k) {
      sketch[k] = layout.sketch(uniq[k]);
      adm[sketch[k]] += ucnt[k];
    }
    for (int64_t k = 0; k < u; ++k)
      if (adm[sketch[k]] >= admission_threshold) cand.push_back(k);
  } else {
    cand.resize(u);
    std::iota(cand.begin(), cand.end(), 0);
  }

  // 4. rows, bucket by bucket (ascending ids are grouped by bucket)
  std::vector<int64_t> slot, victims, placed, waiting;  // placed / waiting: positions in cand
  for (size_t first = 0; first < cand.size();) {
    const int64_t b = layout.local_bucket(uniq[cand[first]]);
    size_t end = first + 1;
    while (end < cand.size() && layout.local_bucket(uniq[cand[end]]) == b) ++end;
    const int64_t want = static_cast<int64_t>(end - first);
    const int64_t got = queues.take(b, want, last, slot, victims);
    const size_t mine = placed.size();
    for (size_t k = first; k < end; ++k) placed.push_back(static_cast<int64_t>(k));
    if (got < want) {  // rows ran short: the ids with more lookups in the step go first
      std::stable_sort(placed.begin() + mine, placed.end(),
                       [&](int64_t a, int64_t c) { return ucnt[cand[a]] > ucnt[cand[c]]; });
      waiting.insert(waiting.end(), placed.begin() + mine + got, placed.end());
      placed.resize(mine + got);
    }
    first = end;
  }

  // 5. the placed ids take their rows and enter the hash (and, ascending, the pending index entries)
  std::vector<int64_t> got_of_uniq(u, -1);
  std::vector<std::pair<int64_t, int64_t>> fresh(placed.size());  // (id, slot)
  for (size_t k = 0; k < placed.size(); ++k) {
    const int64_t q = cand[placed[k]], s = slot[k];
    sid[s] = uniq[q];
    last[s] = it;
    if (cnt_state != nullptr) cnt_state[s] = ucnt[q];
    got_of_uniq[q] = s;
    fresh[k] = {uniq[q], s};
  }
  std::sort(fresh.begin(), fresh.end());
  std::vector<int64_t> fresh_ids(fresh.size()), fresh_slots(fresh.size());
  for (size_t k = 0; k < fresh.size(); ++k) {
    fresh_ids[k] = fresh[k].first;
    fresh_slots[k] = fresh[k].second;
    table.put(fresh[k].first, fresh[k].second);
  }

  // 6. every missed position gets its id's row, or its bucket's default row
  int64_t unplaced = 0;
  for (size_t k = 0; k < missed.size(); ++k) {
    const int64_t s = got_of_uniq[inverse[k]];
    if (s >= 0) {
      rows[missed[k]] = s;
    } else {
      rows[missed[k]] = layout.default_slot(layout.local_bucket(v[missed[k]]));
      ++unplaced;
    }
  }
  std::vector<int64_t> wait_ids(waiting.size()), wait_cnt(waiting.size());
  for (size_t k = 0; k < waiting.size(); ++k) {
    wait_ids[k] = uniq[cand[waiting[k]]];
    wait_cnt[k] = ucnt[cand[waiting[k]]];
  }
  info[0] = unplaced;
  info[1] = static_cast<int64_t>(placed.size());
  info[2] = table.count;
  std::copy(cursors.begin(), cursors.end(), info.begin() + 3);
  return {rows_t, from_vector(fresh_ids), from_vector(fresh_slots), from_vector(victims), from_vector(wait_ids),
          from_vector(wait_cnt), from_vector(info)};
}

// [rows, dim] uniform values in [low, low + scale): lightrec.modules.managed_collision.ops.uniform_block, bit for bit
// (SplitMix64's i-th output from seed, its top 53 bits as a float64 in [0, 1), scaled, then rounded
// once to the dtype; compiled without FMA contraction, as the rest of the library).
Tensor uniform_rows(int64_t rows, int64_t dim, int64_t seed, double low, double scale, at::ScalarType dtype) {
  TORCH_CHECK(rows >= 0 && dim >= 0 && seed >= 0, "lightrec_mch.uniform_rows: rows, dim and seed must be >= 0");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble, "lightrec_mch.uniform_rows: float32 or float64 only");
  Tensor out = at::empty({rows, dim}, at::TensorOptions().dtype(dtype));
  const int64_t n = rows * dim;
  AT_DISPATCH_FLOATING_TYPES(dtype, "uniform_rows", [&] {
    scalar_t* o = out.data_ptr<scalar_t>();
    uint64_t state = static_cast<uint64_t>(seed);
    for (int64_t i = 0; i < n; ++i, state += 0x9E3779B97F4A7C15ULL) {
      const uint64_t bits = static_cast<uint64_t>(mix64(static_cast<int64_t>(state)));
      const double unit = static_cast<double>(bits >> 11) * 0x1.0p-53;
      o[i] = static_cast<scalar_t>(unit * scale + low);
    }
  });
  return out;
}

// Rows of a table given fresh values and a zero optimizer state in one pass (a managed-collision
// step resets the rows new ids took): row rows[k] gets row k of uniform_rows(k, D, seed, low, scale,
// float32), converted to the table's dtype, as reinit_values + the kernels' reset_rows write it
// (lightrec.kernels.kernel_interface.ResidentRows.reset_tables_uniform is the Python side).
void reset_rows_uniform(Tensor weight, at::TensorList states, const Tensor& rows, int64_t seed, double low,
                        double scale) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 2 && weight.stride(1) == 1 &&
                  (weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kDouble),
              "lightrec_mch.reset_rows_uniform: weight must be a [R, D] float32/float64 CPU view with unit column stride");
  TORCH_CHECK(rows.device().is_cpu() && rows.scalar_type() == at::kLong && rows.is_contiguous() && rows.dim() == 1,
              "lightrec_mch.reset_rows_uniform: rows must be a contiguous 1-d int64 CPU tensor");
  TORCH_CHECK(seed >= 0, "lightrec_mch.reset_rows_uniform: seed must be >= 0");
  const int64_t r = weight.size(0), d = weight.size(1), k = rows.numel();
  const int64_t* row = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < k; ++i)
    TORCH_CHECK(row[i] >= 0 && row[i] < r, "lightrec_mch.reset_rows_uniform: row ", row[i], " is outside [0, ", r, ")");
  for (const Tensor& state : states) {
    TORCH_CHECK(state.device().is_cpu() && state.dim() >= 1 && state.size(0) == r && state.is_contiguous() &&
                    state.scalar_type() == weight.scalar_type(),
                "lightrec_mch.reset_rows_uniform: every state must be a contiguous [R, ...] tensor of the weight's dtype");
  }
  AT_DISPATCH_FLOATING_TYPES(weight.scalar_type(), "reset_rows_uniform", [&] {
    scalar_t* w = weight.data_ptr<scalar_t>();
    const int64_t stride = weight.stride(0);
    uint64_t state = static_cast<uint64_t>(seed);
    for (int64_t i = 0; i < k; ++i) {
      scalar_t* out = w + row[i] * stride;
      for (int64_t j = 0; j < d; ++j, state += 0x9E3779B97F4A7C15ULL) {
        const uint64_t bits = static_cast<uint64_t>(mix64(static_cast<int64_t>(state)));
        const double unit = static_cast<double>(bits >> 11) * 0x1.0p-53;
        out[j] = static_cast<scalar_t>(static_cast<float>(unit * scale + low));
      }
    }
    for (const Tensor& st : states) {
      scalar_t* base = st.data_ptr<scalar_t>();
      const int64_t width = st.numel() / r;
      for (int64_t i = 0; i < k; ++i) std::fill(base + row[i] * width, base + (row[i] + 1) * width, scalar_t(0));
    }
  });
}

}  // namespace

TORCH_LIBRARY(lightrec_mch, m) {
  m.def(
      "lookup_insert(Tensor values, Tensor(a!) slot_ids, Tensor(b!) last_access, Tensor(c!)? counts, "
      "Tensor(d!)? admission_counts, Tensor(e!) hash, int hash_count, Tensor index_ids, Tensor index_slots, "
      "bool rebuild_hash, Tensor queue, int[] queue_starts, int[] free_len, int[] cursor, int[] bounds, "
      "int start_bucket, int buckets, int block, int it, int round_iter, int admission_threshold) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("reset_rows_uniform(Tensor(a!) weight, Tensor(b!)[] states, Tensor rows, int seed, float low, float scale) -> ()");
}

TORCH_LIBRARY_IMPL(lightrec_mch, CPU, m) {
  m.impl("lookup_insert", &lookup_insert);
  m.impl("reset_rows_uniform", &reset_rows_uniform);
}

// No tensor argument to dispatch on: a catch-all kernel.
TORCH_LIBRARY_FRAGMENT(lightrec_mch, m) {
  m.def("uniform_rows(int rows, int dim, int seed, float low, float scale, ScalarType dtype) -> Tensor",
        &uniform_rows);
}

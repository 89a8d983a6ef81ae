// The per-batch bookkeeping and row copies of a tiered table's cache on CPU, each one native call.
//
// Registered as torch.ops.lightrec_tiered.* (built at first use by lightrec/_native.py). The Python
// side is lightrec/kernels/tiered_cache.py (CacheIndex.admit_batch and its torch path, which these
// ops must match slot for slot: the tests compare every state tensor after random streams) and
// lightrec/kernels/tiered_transfer.py. The state tensors and their meaning are documented in
// tiered_cache.py; in short, over S slots and R rows of every table of one kernel:
//
//   slot_of [R] int32|int64, row_of [S] int64 (table-local row, -1 free), last_used [S] int64,
//   freq [S] int64, pins [S] int32, dirty [S] bool,
//   free_ring [S] int64: per table t a ring over [cache_offset[t], cache_offset[t+1]) of its free
//   global slots, taken from the head, victims appended at the tail;
//   free_state [2, T] int64: per table the ring's head (an offset into the table's region) and count.
//
// tiered_admit(...) does what the training thread did in a few dozen torch ops: gather the slot of
// every id, admit the missing rows (sorted, unique), evicting the `k` evictable slots of lowest
// (score, slot) when a table's free slots run out, then touch the slots of every id (and mark them
// dirty for a training batch). Evictable: cached, unpinned, and last used before `protect_from`,
// the lookup count of the oldest batch in flight (tiered_cache.py: "Which slots stay put"); the
// batch's own hits are never evicted for its other rows. tiered_evict(...) is the same eviction
// ahead of need; tiered_touch(...) is the lookup of a batch that its prefetch admitted whole.
//
// tiered_transfer / tiered_copy_rows / tiered_advise are the row copies between the cache and the
// row store and the POSIX_FADV_WILLNEED announcements: one call each, without the GIL (torch
// releases it around an op), so the training thread's Python runs meanwhile.

#include <ATen/core/Tensor.h>
#include <ATen/Functions.h>
#include <torch/library.h>

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

// How far ahead the per-id loops start loading the state of a later id: the slots of a batch are
// scattered over state arrays of megabytes, so each id is a cache miss; loading a few ahead
// overlaps them instead of waiting for each in turn.
constexpr int64_t kAhead = 16;

struct State {
  at::Tensor slot_of, row_of, last_used, freq, pins, dirty, free_ring, free_state;
};

void check_state(const State& s) {
  auto cpu_contig = [](const at::Tensor& t, at::ScalarType dtype, const char* name) {
    TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == dtype, "tiered_admit: ", name,
                " must be a contiguous CPU tensor of ", dtype);
  };
  TORCH_CHECK(s.slot_of.scalar_type() == at::kInt || s.slot_of.scalar_type() == at::kLong,
              "tiered_admit: slot_of must be int32 or int64");
  cpu_contig(s.slot_of, s.slot_of.scalar_type(), "slot_of");
  cpu_contig(s.row_of, at::kLong, "row_of");
  cpu_contig(s.last_used, at::kLong, "last_used");
  cpu_contig(s.freq, at::kLong, "freq");
  cpu_contig(s.pins, at::kInt, "pins");
  cpu_contig(s.dirty, at::kBool, "dirty");
  cpu_contig(s.free_ring, at::kLong, "free_ring");
  cpu_contig(s.free_state, at::kLong, "free_state");
  const int64_t slots = s.row_of.numel();  // every per-slot tensor has one entry per cache slot
  TORCH_CHECK(s.last_used.numel() == slots && s.freq.numel() == slots && s.pins.numel() == slots &&
                  s.dirty.numel() == slots && s.free_ring.numel() == slots,
              "tiered_admit: last_used, freq, pins, dirty and free_ring need one entry per slot (", slots, ")");
}

// Every slot of `s` is -1 (when `allow_missing`) or in [0, size): checked before any state changes,
// so a bad slot leaves the state as it was.
void check_slots(const char* op, const int64_t* s, int64_t n, int64_t size, bool allow_missing) {
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK((allow_missing && s[i] < 0) || (s[i] >= 0 && s[i] < size), op, ": slot ", s[i], " outside [0, ",
                size, ")");
  }
}

// The score eviction minimises: LRU the last use; LFU the frequency, recency breaking ties
// (CacheIndex._score: (min(freq, 2^30) << 32) | min(last, 2^32 - 1)).
inline int64_t score(const int64_t* last, const int64_t* freq, int64_t s, bool lfu) {
  if (!lfu) return last[s];
  const int64_t f = std::min<int64_t>(freq[s], int64_t{1} << 30);
  const int64_t l = std::min<int64_t>(last[s], (int64_t{1} << 32) - 1);
  return (f << 32) | l;
}

// The k-th smallest (1-based) of `values` (reordered), and how many are smaller (added to
// `below`): a radix select over the bytes of (value - min), most significant first -- each pass
// counts the candidates' next byte and keeps only the bucket holding the k-th.
int64_t kth_smallest(std::vector<int64_t>& values, int64_t k, int64_t& below) {
  const int64_t lo = *std::min_element(values.begin(), values.end());
  const uint64_t range = static_cast<uint64_t>(*std::max_element(values.begin(), values.end()) - lo);
  int shift = 0;
  while (shift < 56 && (range >> shift) > 255) shift += 8;
  size_t n = values.size();
  for (;; shift -= 8) {
    int64_t hist[256] = {0};
    for (size_t i = 0; i < n; ++i) ++hist[(static_cast<uint64_t>(values[i] - lo) >> shift) & 255];
    int bucket = 0;
    while (hist[bucket] < k) {  // k <= the candidates, so some bucket holds the k-th
      k -= hist[bucket];
      below += hist[bucket];
      ++bucket;
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i)
      if (static_cast<int>((static_cast<uint64_t>(values[i] - lo) >> shift) & 255) == bucket) values[kept++] = values[i];
    n = kept;
    if (shift == 0) return values[0];  // every candidate left has the same value
  }
}

// The per-slot state eviction reads. A slot is evictable when it holds a row, no pin holds it,
// and its last use is older than `protect`: the tick of the oldest batch still in flight (a
// prefetched batch not yet looked up, a lookup whose backward has not run), so the slots of every
// batch in flight -- used at that tick or later -- stay put without a pin per id.
struct Slots {
  const int64_t* row_of;
  const int32_t* pins;
  const int64_t* last;
  const int64_t* freq;
  bool lfu;
  int64_t protect;
  bool evictable(int64_t s) const { return row_of[s] >= 0 && pins[s] == 0 && last[s] < protect; }
  int64_t score_of(int64_t s) const { return score(last, freq, s, lfu); }
};

// The evictable slots of [lo, hi): how many, and the range of their scores.
struct Evictable {
  int64_t count = 0, min = INT64_MAX, max = INT64_MIN;
};

Evictable scan_evictable(const Slots& c, int64_t lo, int64_t hi) {
  Evictable e;
  for (int64_t s = lo; s < hi; ++s) {
    if (!c.evictable(s)) continue;
    const int64_t v = c.score_of(s);
    ++e.count;
    e.min = std::min(e.min, v);
    e.max = std::max(e.max, v);
  }
  return e;
}

int64_t count_evictable(const Slots& c, int64_t lo, int64_t hi) {
  int64_t e = 0;
  for (int64_t s = lo; s < hi; ++s) e += c.evictable(s);
  return e;
}

// The k evictable slots of [lo, hi) of lowest (score, slot), in slot order, given the k-th lowest
// score `threshold` and how many evictable slots score below it: those, then the lowest-numbered at it.
std::vector<int64_t> slots_up_to(const Slots& c, int64_t lo, int64_t hi, int64_t k, int64_t threshold, int64_t below) {
  int64_t ties = k - below;
  std::vector<int64_t> victims;
  victims.reserve(k);
  for (int64_t s = lo; s < hi && static_cast<int64_t>(victims.size()) < k; ++s) {
    if (!c.evictable(s)) continue;
    const int64_t v = c.score_of(s);
    if (v < threshold || (v == threshold && ties-- > 0)) victims.push_back(s);
  }
  return victims;
}

// The bucket of `hist` holding the rest-th lowest value (1-based; the histogram holds at least that
// many): `rest` becomes its rank inside that bucket, and `below` grows by the values of the buckets
// before it.
template <typename count_t>
int64_t bucket_of_kth(const std::vector<count_t>& hist, int64_t& rest, int64_t& below) {
  int64_t bucket = 0;
  while (hist[bucket] < rest) {
    rest -= hist[bucket];
    below += hist[bucket];
    ++bucket;
  }
  return bucket;
}

// The k (1 <= k <= e.count) evictable slots of [lo, hi) of lowest (score, slot), in slot order.
// Two more passes over the slots and no sort: a 16-bit histogram of the scores' top digit (for LRU
// the ticks of a cache usually span fewer than 2^16 lookups, so this already names the k-th lowest
// score; otherwise the scores of its bucket are narrowed further by kth_smallest); then every slot
// below that score and the lowest-numbered ones at it.
std::vector<int64_t> lowest_slots(const Slots& c, int64_t lo, int64_t hi, int64_t k, const Evictable& e) {
  const int64_t mn = e.min;
  const uint64_t range = static_cast<uint64_t>(e.max - mn);
  int shift = 0;
  while (shift < 48 && (range >> shift) > 65535) shift += 16;
  std::vector<int64_t> hist(std::min<uint64_t>(range >> shift, 65535) + 1, 0);
  for (int64_t s = lo; s < hi; ++s)
    if (c.evictable(s)) ++hist[static_cast<uint64_t>(c.score_of(s) - mn) >> shift];
  int64_t below = 0, rest = k;
  const int64_t bucket = bucket_of_kth(hist, rest, below);
  int64_t threshold;
  if (shift == 0) {
    threshold = mn + bucket;
  } else {  // several scores share the bucket: select among them
    std::vector<int64_t> candidates;
    candidates.reserve(hist[bucket]);
    for (int64_t s = lo; s < hi; ++s) {
      if (!c.evictable(s)) continue;
      const int64_t v = c.score_of(s);
      if (static_cast<int64_t>(static_cast<uint64_t>(v - mn) >> shift) == bucket) candidates.push_back(v);
    }
    threshold = kth_smallest(candidates, rest, below);
  }
  return slots_up_to(c, lo, hi, k, threshold, below);
}

// The window of 2^16 lookups up to `tick` the LRU and LFU histograms of last uses cover.
constexpr int64_t kWindow = 65536;

// The histogram bucket of a last use `last` in the window starting at `base`: 0 older, 1 + (last -
// base) inside, kWindow + 1 newer.
inline int64_t window_bucket(int64_t last, int64_t base) {
  const int64_t d = last - base;
  return d < 0 ? 0 : (d >= kWindow ? kWindow + 1 : d + 1);
}

// One pass over the evictable slots of [lo, hi): histogram them by `bucket_of(slot)` into `hist` and
// count them into `available`. Returns how many to evict: at least short_by and headroom_k, as many
// as there are.
template <typename BucketOf>
int64_t histogram_evictable(const Slots& c, int64_t lo, int64_t hi, BucketOf bucket_of, std::vector<int32_t>& hist,
                            int64_t short_by, int64_t headroom_k, int64_t& available) {
  int64_t count = 0;
  for (int64_t s = lo; s < hi; ++s) {
    if (!c.evictable(s)) continue;
    ++hist[bucket_of(s)];
    ++count;
  }
  available = count;
  return std::min(count, std::max(short_by, headroom_k));
}

// LRU's eviction in two passes instead of three: the scores are lookup ticks, and the evictable
// slots of a cache under pressure were used within the last 2^16 lookups of `tick` (a slot unused
// for longer would have been evicted long before), so one pass can count them and histogram their
// ticks over that window at once. Returns false -- nothing found, nothing changed -- when the k-th
// lowest tick is outside the window (then the general path above runs); else the victims, and
// `available` is the count of evictable slots.
bool lru_lowest_slots(const Slots& c, int64_t lo, int64_t hi, int64_t tick, int64_t short_by, int64_t headroom_k,
                      int64_t& available, std::vector<int64_t>& victims) {
  const int64_t base = tick - (kWindow - 1);
  std::vector<int32_t> hist(kWindow + 2, 0);  // window_bucket(last use)
  const int64_t k = histogram_evictable(
      c, lo, hi, [&](int64_t s) { return window_bucket(c.last[s], base); }, hist, short_by, headroom_k, available);
  if (k <= 0) return true;
  int64_t below = 0, rest = k;
  const int64_t bucket = bucket_of_kth(hist, rest, below);
  if (bucket == 0 || bucket == kWindow + 1) return false;  // the k-th lowest is outside the window
  victims = slots_up_to(c, lo, hi, k, base + bucket - 1, below);
  return true;
}

// LFU's eviction in three passes instead of four: its score is (frequency, last use). One pass counts
// the evictable slots and histograms their frequencies (a slot read 2^16 times or more is rare: then
// the general path runs), which names the frequency of the k-th lowest; a second histograms the last
// uses of the slots at that frequency over the 2^16 lookups up to `tick`, as lru_lowest_slots does;
// the third takes the victims. Returns false -- nothing found, nothing changed -- when either
// histogram cannot name the k-th lowest score.
bool lfu_lowest_slots(const Slots& c, int64_t lo, int64_t hi, int64_t tick, int64_t short_by, int64_t headroom_k,
                      int64_t& available, std::vector<int64_t>& victims) {
  if (tick >= (int64_t{1} << 32) - 1) return false;  // (the score keeps 32 bits of the last use)
  std::vector<int32_t> by_freq(kWindow, 0);  // frequencies of 2^16 - 1 and more share the last bucket
  const int64_t k = histogram_evictable(
      c, lo, hi, [&](int64_t s) { return std::min<int64_t>(c.freq[s], kWindow - 1); }, by_freq, short_by, headroom_k,
      available);
  if (k <= 0) return true;
  int64_t below = 0, rest = k;
  const int64_t f = bucket_of_kth(by_freq, rest, below);
  if (f == kWindow - 1) return false;
  const int64_t base = tick - (kWindow - 1);
  std::vector<int32_t> by_last(kWindow + 2, 0);  // window_bucket(last use), of the slots read f times
  for (int64_t s = lo; s < hi; ++s)
    if (c.evictable(s) && c.freq[s] == f) ++by_last[window_bucket(c.last[s], base)];
  const int64_t bucket = bucket_of_kth(by_last, rest, below);
  if (bucket == 0 || bucket == kWindow + 1) return false;
  victims = slots_up_to(c, lo, hi, k, (f << 32) | (base + bucket - 1), below);
  return true;
}

// Evict at least `short_by` (as many as there are) and at least `headroom_k` of table t's
// evictable slots (those of lowest score): append them to its free ring's tail, in slot order,
// and unmap their rows; the dirty ones' (row, slot) are appended to wb_rows / wb_slots (to be
// written back before the slots are reused). The table's slots are [lo, lo + size), its rows
// start at global row `row_offset_t`.
template <typename slot_t>
void evict_slots(slot_t* slot_of, int64_t* row_of, const Slots& cache, bool* dirty, int64_t* freq, int64_t* ring, int64_t* head,
                 int64_t* count, int64_t t, int64_t lo, int64_t size, int64_t row_offset_t, int64_t short_by,
                 int64_t headroom_k, int64_t tick, std::vector<int64_t>& wb_rows, std::vector<int64_t>& wb_slots) {
  std::vector<int64_t> victims;
  int64_t available = 0;
  const bool found = cache.lfu ? lfu_lowest_slots(cache, lo, lo + size, tick, short_by, headroom_k, available, victims)
                               : lru_lowest_slots(cache, lo, lo + size, tick, short_by, headroom_k, available, victims);
  if (!found) {
    const Evictable e = scan_evictable(cache, lo, lo + size);
    available = e.count;
    const int64_t k = std::min(available, std::max(std::min(short_by, available), headroom_k));
    if (k > 0) victims = lowest_slots(cache, lo, lo + size, k, e);
  }
  const size_t nv = victims.size();
  for (size_t i = 0; i < nv; ++i) {
    if (i + kAhead < nv) {  // the victims' rows are scattered over slot_of: load a few ahead
      const int64_t r = row_of[victims[i + kAhead]];
      if (r >= 0) __builtin_prefetch(slot_of + r + row_offset_t, 1);
    }
    const int64_t s = victims[i];
    ring[lo + (head[t] + count[t]) % size] = s;  // appended at the ring's tail, in slot order
    ++count[t];
    const int64_t r = row_of[s];  // unmapped (the dirty ones are written back)
    if (dirty[s]) {
      wb_rows.push_back(r);
      wb_slots.push_back(s);
    }
    slot_of[r + row_offset_t] = -1;
    row_of[s] = -1;
    dirty[s] = false;
    freq[s] = 0;
  }
}

template <typename slot_t>
std::vector<at::Tensor> admit_impl(const State& st, const std::vector<int64_t>& row_offset,
                                   const std::vector<int64_t>& cache_offset, const at::Tensor& global_rows, int64_t tick,
                                   int64_t protect_from, bool lfu, double headroom, bool best_effort, bool pin) {
  const int64_t tables = static_cast<int64_t>(row_offset.size()) - 1;
  const int64_t n = global_rows.numel();
  slot_t* slot_of = st.slot_of.data_ptr<slot_t>();
  int64_t* row_of = st.row_of.data_ptr<int64_t>();
  int64_t* last = st.last_used.data_ptr<int64_t>();
  int64_t* freq = st.freq.data_ptr<int64_t>();
  int32_t* pins = st.pins.data_ptr<int32_t>();
  bool* dirty = st.dirty.data_ptr<bool>();
  int64_t* ring = st.free_ring.data_ptr<int64_t>();
  int64_t* head = st.free_state.data_ptr<int64_t>();
  int64_t* count = head + tables;
  const int64_t* rows = global_rows.data_ptr<int64_t>();
  const int64_t total_rows = st.slot_of.numel();
  // the slots of the batches in flight (used at protect_from or later) and of this one are kept
  const Slots cache{row_of, pins, last, freq, lfu, std::min(protect_from, tick)};

  // info: missed ids; the table that cannot hold the batch (-1: none), the rows it needs and its
  // free / evictable / kept slots; then per table the rows fetched and the dirty rows written back.
  constexpr int64_t kHead = 6;
  at::Tensor info = at::zeros({kHead + 2 * tables}, at::kLong);
  int64_t* inf = info.data_ptr<int64_t>();
  inf[1] = -1;

  for (int64_t i = 0; i < n; ++i)  // checked first: the lookup pass below reads ahead of the id it handles
    TORCH_CHECK(rows[i] >= 0 && rows[i] < total_rows, "tiered_admit: global row ", rows[i], " outside [0, ",
                total_rows, ")");
  // One pass looks every id up. The rows a batch hits must not be evicted for its other rows: a
  // best-effort admission (a prefetch; never refused) touches them right here -- used at `tick`,
  // they are kept -- and marks them dirty when `pin` (the backward will update them), so the pass
  // after the admission visits only the ids that missed. An admission that may be refused pins its
  // hits for the while instead, and touches them only once it is sure to go ahead.
  const bool touch_hits_now = best_effort;
  std::vector<int64_t> missed, missed_at;  // the missing rows, and the positions of the ids that missed
  std::vector<int64_t> before(n);         // the slot of each id before the admission (-1: missed)
  for (int64_t i = 0; i < n; ++i) {
    // two stages ahead: the slot of a later id, and the state of the slot of a nearer one
    if (i + 2 * kAhead < n) __builtin_prefetch(slot_of + rows[i + 2 * kAhead]);
    if (i + kAhead < n) {
      const int64_t ahead = slot_of[rows[i + kAhead]];
      if (ahead >= 0) {
        __builtin_prefetch(touch_hits_now ? static_cast<const void*>(last + ahead) : pins + ahead, 1);
        if (touch_hits_now && pin) __builtin_prefetch(dirty + ahead, 1);
      }
    }
    const int64_t s = slot_of[rows[i]];
    before[i] = s;
    if (s < 0) {
      missed.push_back(rows[i]);
      missed_at.push_back(i);
      continue;
    }
    if (touch_hits_now) {
      last[s] = tick;
      if (lfu) ++freq[s];
      if (pin) dirty[s] = true;
    } else {
      ++pins[s];
    }
  }
  inf[0] = static_cast<int64_t>(missed.size());
  std::vector<int64_t> fetch_rows, fetch_slots, wb_rows, wb_slots;
  if (!missed.empty()) {
    std::sort(missed.begin(), missed.end());
    missed.erase(std::unique(missed.begin(), missed.end()), missed.end());
    // the rows of table t among `missed`: [first[t], first[t + 1])
    std::vector<int64_t> first(tables + 1, 0);
    for (int64_t t = 0; t < tables; ++t)
      first[t + 1] = std::lower_bound(missed.begin(), missed.end(), row_offset[t + 1]) - missed.begin();
    if (!best_effort) {  // every table is checked before any bookkeeping changes
      for (int64_t t = 0; t < tables; ++t) {
        const int64_t need = first[t + 1] - first[t];
        if (need > count[t] && need > count[t] + count_evictable(cache, cache_offset[t], cache_offset[t + 1])) {
          inf[1] = t;
          inf[2] = need;
          inf[3] = count[t];
          inf[4] = count_evictable(cache, cache_offset[t], cache_offset[t + 1]);
          for (int64_t s = cache_offset[t]; s < cache_offset[t + 1]; ++s) inf[5] += row_of[s] >= 0 && !cache.evictable(s);
          break;
        }
      }
    }
    if (inf[1] < 0) {
      for (int64_t t = 0; t < tables; ++t) {
        int64_t need = first[t + 1] - first[t];
        if (need == 0) continue;
        const int64_t lo = cache_offset[t], size = cache_offset[t + 1] - lo;
        if (count[t] < need) {
          const int64_t headroom_k = static_cast<int64_t>(std::ceil(headroom * static_cast<double>(size)));
          const size_t written = wb_rows.size();
          evict_slots(slot_of, row_of, cache, dirty, freq, ring, head, count, t, lo, size, row_offset[t], need - count[t],
                      headroom_k, tick, wb_rows, wb_slots);
          inf[kHead + tables + t] = static_cast<int64_t>(wb_rows.size() - written);
          need = std::min(need, count[t]);
        }
        for (int64_t j = 0; j < need; ++j) {  // map the newcomers to the ring's head
          const int64_t g = missed[first[t] + j];
          const int64_t s = ring[lo + head[t]];
          head[t] = (head[t] + 1) % size;
          --count[t];
          slot_of[g] = static_cast<slot_t>(s);
          row_of[s] = g - row_offset[t];
          dirty[s] = false;
          freq[s] = 0;
          fetch_rows.push_back(g - row_offset[t]);
          fetch_slots.push_back(s);
        }
        inf[kHead + t] = need;
      }
    }
  }
  auto vec = [](const std::vector<int64_t>& v) {
    at::Tensor out = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
    if (!v.empty()) std::memcpy(out.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
    return out;
  };
  if (inf[1] >= 0) {  // refused: nothing changed but the hits' pins, taken back
    for (int64_t i = 0; i < n; ++i)
      if (before[i] >= 0) --pins[before[i]];
    return {at::empty({0}, at::kLong), info, vec({}), vec({}), vec({}), vec({})};
  }
  at::Tensor slots = at::empty({n}, at::kLong);
  int64_t* out = slots.data_ptr<int64_t>();
  auto use = [&](int64_t s) {
    last[s] = tick;
    if (lfu) ++freq[s];
    if (pin) dirty[s] = true;
  };
  if (touch_hits_now) {  // the hits are done: only the ids that missed are left
    std::memcpy(out, before.data(), n * sizeof(int64_t));
    for (const int64_t i : missed_at) {
      const int64_t s = slot_of[rows[i]];
      out[i] = s;
      if (s >= 0) use(s);  // (-1: a best-effort admission left it out)
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n && before[i + kAhead] >= 0) {
        __builtin_prefetch(last + before[i + kAhead], 1);
        __builtin_prefetch(pins + before[i + kAhead], 1);
      }
      const bool hit = before[i] >= 0;
      const int64_t s = hit ? before[i] : static_cast<int64_t>(slot_of[rows[i]]);
      out[i] = s;
      use(s);
      if (hit) --pins[s];  // the pin that kept it during the admission
    }
  }
  return {slots, info, vec(fetch_rows), vec(fetch_slots), vec(wb_rows), vec(wb_slots)};
}

std::vector<at::Tensor> tiered_admit(at::Tensor slot_of, at::Tensor row_of, at::Tensor last_used, at::Tensor freq,
                                     at::Tensor pins, at::Tensor dirty, at::Tensor free_ring, at::Tensor free_state,
                                     at::IntArrayRef row_offset, at::IntArrayRef cache_offset,
                                     const at::Tensor& global_rows, int64_t tick, int64_t protect_from, bool lfu,
                                     double headroom, bool best_effort, bool pin) {
  State st{slot_of, row_of, last_used, freq, pins, dirty, free_ring, free_state};
  check_state(st);
  const int64_t tables = static_cast<int64_t>(row_offset.size()) - 1;
  TORCH_CHECK(tables >= 1 && static_cast<int64_t>(cache_offset.size()) == tables + 1,
              "tiered_admit: row_offset and cache_offset need T + 1 entries each");
  TORCH_CHECK(row_offset.back() == slot_of.numel() && cache_offset.back() == row_of.numel() &&
                  free_state.numel() == 2 * tables,
              "tiered_admit: the offsets do not match the state tensors");
  TORCH_CHECK(global_rows.device().is_cpu() && global_rows.scalar_type() == at::kLong && global_rows.is_contiguous(),
              "tiered_admit: global_rows must be a contiguous int64 CPU tensor");
  std::vector<int64_t> ro(row_offset.begin(), row_offset.end()), co(cache_offset.begin(), cache_offset.end());
  if (slot_of.scalar_type() == at::kInt)
    return admit_impl<int32_t>(st, ro, co, global_rows, tick, protect_from, lfu, headroom, best_effort, pin);
  return admit_impl<int64_t>(st, ro, co, global_rows, tick, protect_from, lfu, headroom, best_effort, pin);
}

// Evict ahead of need: free at least `k` of table `table`'s evictable slots (as many as there are;
// those of lowest score, kept: used at `protect` or later, or pinned), as an admission short of
// free slots would. Returns the dirty victims' (rows, slots) to write back before reuse.
std::vector<at::Tensor> tiered_evict(at::Tensor slot_of, at::Tensor row_of, at::Tensor last_used, at::Tensor freq,
                                     at::Tensor pins, at::Tensor dirty, at::Tensor free_ring, at::Tensor free_state,
                                     at::IntArrayRef row_offset, at::IntArrayRef cache_offset, int64_t table, int64_t k,
                                     int64_t tick, int64_t protect, bool lfu) {
  State st{slot_of, row_of, last_used, freq, pins, dirty, free_ring, free_state};
  check_state(st);
  const int64_t tables = static_cast<int64_t>(row_offset.size()) - 1;
  TORCH_CHECK(tables >= 1 && static_cast<int64_t>(cache_offset.size()) == tables + 1 && table >= 0 && table < tables &&
                  row_offset.back() == slot_of.numel() && cache_offset.back() == row_of.numel() &&
                  free_state.numel() == 2 * tables && k >= 0,
              "tiered_evict: the offsets do not match the state tensors, or table / k out of range");
  const Slots cache{row_of.data_ptr<int64_t>(), pins.data_ptr<int32_t>(), last_used.data_ptr<int64_t>(),
                    freq.data_ptr<int64_t>(), lfu, protect};
  std::vector<int64_t> wb_rows, wb_slots;
  int64_t* head = free_state.data_ptr<int64_t>();
  const int64_t lo = cache_offset[table], size = cache_offset[table + 1] - lo;
  auto run = [&](auto* slots) {
    evict_slots(slots, row_of.data_ptr<int64_t>(), cache, dirty.data_ptr<bool>(), freq.data_ptr<int64_t>(),
                free_ring.data_ptr<int64_t>(), head, head + tables, table, lo, size, row_offset[table], 0, k, tick,
                wb_rows, wb_slots);
  };
  if (slot_of.scalar_type() == at::kInt)
    run(slot_of.data_ptr<int32_t>());
  else
    run(slot_of.data_ptr<int64_t>());
  auto vec = [](const std::vector<int64_t>& v) {
    at::Tensor out = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
    if (!v.empty()) std::memcpy(out.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
    return out;
  };
  return {vec(wb_rows), vec(wb_slots)};
}

// pins[slots[i]] += delta for every i with slots[i] >= 0; then, when mark_dirty, dirty[slots[i]] = true.
void tiered_release(at::Tensor pins, at::Tensor dirty, const at::Tensor& slots, int64_t delta, bool mark_dirty) {
  TORCH_CHECK(pins.device().is_cpu() && pins.is_contiguous() && pins.scalar_type() == at::kInt,
              "tiered_release: pins must be a contiguous int32 CPU tensor");
  TORCH_CHECK(dirty.device().is_cpu() && dirty.is_contiguous() && dirty.scalar_type() == at::kBool,
              "tiered_release: dirty must be a contiguous bool CPU tensor");
  TORCH_CHECK(slots.device().is_cpu() && slots.is_contiguous() && slots.scalar_type() == at::kLong,
              "tiered_release: slots must be a contiguous int64 CPU tensor");
  int32_t* p = pins.data_ptr<int32_t>();
  bool* d = dirty.data_ptr<bool>();
  const int64_t* s = slots.data_ptr<int64_t>();
  TORCH_CHECK(dirty.numel() == pins.numel(), "tiered_release: pins and dirty need one entry per slot");
  check_slots("tiered_release", s, slots.numel(), pins.numel(), true);
  const int64_t n = slots.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && s[i + kAhead] >= 0) {
      __builtin_prefetch(p + s[i + kAhead], 1);
      if (mark_dirty) __builtin_prefetch(d + s[i + kAhead], 1);
    }
    if (s[i] < 0) continue;  // an id a best-effort admission left out
    p[s[i]] += static_cast<int32_t>(delta);
    if (mark_dirty) d[s[i]] = true;
  }
}

// The lookup of a batch its prefetch admitted whole: for every id, last_used[s] = tick, freq[s] += 1
// (LFU), pins[s] += pin_delta.
void tiered_touch(at::Tensor last_used, at::Tensor freq, at::Tensor pins, const at::Tensor& slots, int64_t tick, bool lfu,
                  int64_t pin_delta) {
  TORCH_CHECK(last_used.device().is_cpu() && last_used.is_contiguous() && last_used.scalar_type() == at::kLong &&
                  freq.device().is_cpu() && freq.is_contiguous() && freq.scalar_type() == at::kLong &&
                  pins.device().is_cpu() && pins.is_contiguous() && pins.scalar_type() == at::kInt &&
                  slots.device().is_cpu() && slots.is_contiguous() && slots.scalar_type() == at::kLong,
              "tiered_touch: last_used / freq (int64), pins (int32) and slots (int64) must be contiguous CPU tensors");
  int64_t* last = last_used.data_ptr<int64_t>();
  int64_t* f = freq.data_ptr<int64_t>();
  int32_t* p = pins.data_ptr<int32_t>();
  const int64_t* s = slots.data_ptr<int64_t>();
  TORCH_CHECK(last_used.numel() == pins.numel() && freq.numel() == pins.numel(),
              "tiered_touch: last_used, freq and pins need one entry per slot");
  check_slots("tiered_touch", s, slots.numel(), pins.numel(), false);
  const int64_t n = slots.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      __builtin_prefetch(last + s[i + kAhead], 1);
      __builtin_prefetch(p + s[i + kAhead], 1);
      if (lfu) __builtin_prefetch(f + s[i + kAhead], 1);
    }
    last[s[i]] = tick;
    if (lfu) ++f[s[i]];
    p[s[i]] += static_cast<int32_t>(pin_delta);
  }
}

// dst[j][dst_rows[i]] = src[j][src_rows[i]] for every tensor pair j and every i: rows of any
// dtype, unit stride inside a row ([R] or [R, D]), any row stride.
void tiered_copy_rows(at::TensorList src, const at::Tensor& src_rows, at::TensorList dst, const at::Tensor& dst_rows) {
  TORCH_CHECK(src.size() == dst.size(), "tiered_copy_rows: ", src.size(), " sources but ", dst.size(), " targets");
  TORCH_CHECK(src_rows.scalar_type() == at::kLong && dst_rows.scalar_type() == at::kLong && src_rows.is_contiguous() &&
                  dst_rows.is_contiguous() && src_rows.numel() == dst_rows.numel(),
              "tiered_copy_rows: the row lists must be contiguous int64 tensors of one length");
  const int64_t n = src_rows.numel();
  const int64_t* sr = src_rows.data_ptr<int64_t>();
  const int64_t* dr = dst_rows.data_ptr<int64_t>();
  for (size_t j = 0; j < src.size(); ++j) {
    const at::Tensor& a = src[j];
    const at::Tensor& b = dst[j];
    TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu() && a.scalar_type() == b.scalar_type() && a.dim() == b.dim() &&
                    a.dim() >= 1 && a.dim() <= 2 && (a.dim() == 1 || (a.size(1) == b.size(1) && a.stride(1) == 1 &&
                                                                       b.stride(1) == 1)),
                "tiered_copy_rows: pair ", j, " must be CPU tensors of one dtype, [R] or [R, D] with unit column stride");
    const int64_t item = a.element_size();
    const int64_t row_bytes = (a.dim() == 2 ? a.size(1) : 1) * item;
    const int64_t sa = a.stride(0) * item, sb = b.stride(0) * item;
    const char* pa = static_cast<const char*>(a.data_ptr());
    char* pb = static_cast<char*>(b.data_ptr());
    const int64_t ra = a.size(0), rb = b.size(0);
    for (int64_t i = 0; i < n; ++i)
      TORCH_CHECK(sr[i] >= 0 && sr[i] < ra && dr[i] >= 0 && dr[i] < rb, "tiered_copy_rows: row ", sr[i], " -> ", dr[i],
                  " outside the tensors");
    // the rows are scattered: start loading later ones early (kAhead)
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) {
        __builtin_prefetch(pa + sr[i + kAhead] * sa);
        __builtin_prefetch(pb + dr[i + kAhead] * sb, 1);
      }
      std::memcpy(pb + dr[i] * sb, pa + sr[i] * sa, row_bytes);
    }
  }
}

// How many of up to `sample` of `pages` (spread over them; they come in no particular order, so
// any spread is a sample) are not in the page cache, looked up with mincore() at `base`; and how
// many were looked up.
std::pair<int64_t, int64_t> missing_pages(const std::vector<int64_t>& pages, int64_t base, int64_t page, int64_t sample) {
  const int64_t n = static_cast<int64_t>(pages.size());
  const int64_t probes = std::min(sample, n);
  int64_t missing = 0;
  for (int64_t p = 0; p < probes; ++p) {
    unsigned char resident = 0;
    void* address = reinterpret_cast<void*>(static_cast<uintptr_t>(base + pages[p * n / probes] * page));
    if (mincore(address, static_cast<size_t>(page), &resident) != 0 || !(resident & 1)) ++missing;
  }
  return {missing, probes};
}

// POSIX_FADV_WILLNEED every page of `pages` (sorted here) of file `fd`; pages at most `gap` apart
// are announced as one range (tiered_store.page_ranges is the same in Python). Returns the ranges.
int64_t announce_pages(std::vector<int64_t>& pages, int64_t fd, int64_t page, int64_t gap) {
  std::sort(pages.begin(), pages.end());
  const int64_t n = static_cast<int64_t>(pages.size());
  int64_t ranges = 0, i = 0;
  while (i < n) {
    int64_t last = pages[i];
    int64_t k = i + 1;
    while (k < n && pages[k] - last <= gap + 1) last = pages[k++];
#if defined(POSIX_FADV_WILLNEED)
    posix_fadvise(static_cast<int>(fd), pages[i] * page, (last - pages[i] + 1) * page, POSIX_FADV_WILLNEED);
#endif
    ++ranges;
    i = k;
  }
  return ranges;
}

// POSIX_FADV_WILLNEED the pages of `rows` in each file fds[j] (row r at byte r * strides[j], the
// file mapped at address bases[j]). A file whose pages are mostly in the page cache already is
// skipped: up to `sample` of the pages are looked up with mincore() first, and if at most one in
// eight is missing nothing is announced -- an announcement is a system call per range (~1 us each
// even for cached pages, thousands per step), and the few missing pages are read when touched.
// Returns the number of ranges announced.
int64_t tiered_advise(at::IntArrayRef fds, at::IntArrayRef bases, at::IntArrayRef strides, const at::Tensor& rows,
                      int64_t page, int64_t gap, int64_t sample) {
  TORCH_CHECK(fds.size() == strides.size() && fds.size() == bases.size(), "tiered_advise: one base and stride per file");
  TORCH_CHECK(rows.device().is_cpu() && rows.scalar_type() == at::kLong && rows.is_contiguous(),
              "tiered_advise: rows must be a contiguous int64 CPU tensor");
  const int64_t n = rows.numel();
  const int64_t* r = rows.data_ptr<int64_t>();
  std::vector<int64_t> pages(n);
  int64_t ranges = 0;
  for (size_t j = 0; j < fds.size(); ++j) {
    for (int64_t i = 0; i < n; ++i) pages[i] = r[i] * strides[j] / page;
    if (n > 0 && sample > 0) {
      const auto [missing, probes] = missing_pages(pages, bases[j], page, sample);
      if (missing * 8 <= probes) continue;
    }
    ranges += announce_pages(pages, fds[j], page, gap);
  }
  return ranges;
}

// One table's part of a transfer, on the calling thread: the dirty victims written back (cache ->
// store: store[j][wb_rows] = cache[j][wb_slots]), then the admitted rows fetched (cache[j][fetch_slots]
// = store[j][fetch_rows]), for every tensor pair j (the weights, then each row state).
//
// fds[j] >= 0: store[j] is that file, mapped at store[j]'s address (an SSD store). Up to `sample`
// of the pages this part reads and up to `sample` of those it writes (a write to a page not in the
// page cache reads it first) are looked up with mincore() (sample 0: none; the caller knows they are
// cached). When more than kSyncPages of a file's pages look missing (the missing share of each
// sample, times the pages it stands for), its pages are announced (WILLNEED: the disk reads them in
// parallel) and, with `only_if_cached`, nothing is copied and false is returned: the caller hands
// the copies to its worker thread rather than wait for the disk on the training thread. A few
// missing pages are read when touched. Returns true when the rows were copied.
bool tiered_transfer(at::TensorList cache, at::TensorList store, at::IntArrayRef fds, const at::Tensor& wb_slots,
                     const at::Tensor& wb_rows, const at::Tensor& fetch_rows, const at::Tensor& fetch_slots, int64_t page,
                     int64_t gap, int64_t sample, bool only_if_cached) {
  constexpr int64_t kSyncPages = 16;
  TORCH_CHECK(cache.size() == store.size() && fds.size() == store.size(),
              "tiered_transfer: one store tensor and one file (-1: none) per cache tensor");
  for (const at::Tensor* t : {&wb_slots, &wb_rows, &fetch_rows, &fetch_slots})
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kLong && t->is_contiguous(),
                "tiered_transfer: the row and slot lists must be contiguous int64 CPU tensors");
  const int64_t nw = wb_rows.numel(), nf = fetch_rows.numel();
  if (sample > 0 && nw + nf > 0) {
    bool deferred = false;
    std::vector<int64_t> written(nw), read(nf);
    const int64_t* w = wb_rows.data_ptr<int64_t>();
    const int64_t* f = fetch_rows.data_ptr<int64_t>();
    for (size_t j = 0; j < store.size(); ++j) {
      if (fds[j] < 0) continue;
      const int64_t stride = store[j].stride(0) * store[j].element_size();
      const int64_t base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(store[j].data_ptr()));
      for (int64_t i = 0; i < nw; ++i) written[i] = w[i] * stride / page;
      for (int64_t i = 0; i < nf; ++i) read[i] = f[i] * stride / page;
      double expected_missing = 0.0;
      for (const std::vector<int64_t>* pages : {&written, &read}) {
        if (pages->empty()) continue;
        const auto [missing, probes] = missing_pages(*pages, base, page, sample);
        expected_missing += static_cast<double>(missing) * static_cast<double>(pages->size()) / static_cast<double>(probes);
      }
      if (expected_missing <= kSyncPages) continue;
      std::vector<int64_t> pages(written);
      pages.insert(pages.end(), read.begin(), read.end());
      announce_pages(pages, fds[j], page, gap);
      deferred = only_if_cached;
    }
    if (deferred) return false;
  }
  if (nw) tiered_copy_rows(cache, wb_slots, store, wb_rows);
  if (nf) tiered_copy_rows(store, fetch_rows, cache, fetch_slots);
  return true;
}

}  // namespace

TORCH_LIBRARY(lightrec_tiered, m) {
  m.def(
      "tiered_admit(Tensor(a!) slot_of, Tensor(b!) row_of, Tensor(c!) last_used, Tensor(d!) freq, Tensor(e!) pins, "
      "Tensor(f!) dirty, Tensor(g!) free_ring, Tensor(h!) free_state, int[] row_offset, int[] cache_offset, "
      "Tensor global_rows, int tick, int protect_from, bool lfu, float headroom, bool best_effort, bool pin) -> Tensor[]");
  m.def(
      "tiered_evict(Tensor(a!) slot_of, Tensor(b!) row_of, Tensor(c!) last_used, Tensor(d!) freq, Tensor(e!) pins, "
      "Tensor(f!) dirty, Tensor(g!) free_ring, Tensor(h!) free_state, int[] row_offset, int[] cache_offset, int table, "
      "int k, int tick, int protect, bool lfu) -> Tensor[]");
  m.def("tiered_release(Tensor(a!) pins, Tensor(b!) dirty, Tensor slots, int delta, bool mark_dirty) -> ()");
  m.def("tiered_touch(Tensor(a!) last_used, Tensor(b!) freq, Tensor(c!) pins, Tensor slots, int tick, bool lfu, int pin_delta) -> ()");
  m.def("tiered_copy_rows(Tensor[] src, Tensor src_rows, Tensor(a!)[] dst, Tensor dst_rows) -> ()");
  m.def("tiered_advise(int[] fds, int[] bases, int[] strides, Tensor rows, int page, int gap, int sample) -> int");
  m.def(
      "tiered_transfer(Tensor(a!)[] cache, Tensor(b!)[] store, int[] fds, Tensor wb_slots, Tensor wb_rows, "
      "Tensor fetch_rows, Tensor fetch_slots, int page, int gap, int sample, bool only_if_cached) -> bool");
}

TORCH_LIBRARY_IMPL(lightrec_tiered, CPU, m) {
  m.impl("tiered_admit", &tiered_admit);
  m.impl("tiered_evict", &tiered_evict);
  m.impl("tiered_release", &tiered_release);
  m.impl("tiered_touch", &tiered_touch);
  m.impl("tiered_copy_rows", &tiered_copy_rows);
  m.impl("tiered_advise", &tiered_advise);
  m.impl("tiered_transfer", &tiered_transfer);
}

// Cross-process signalling for lightrec's shared-memory transport (lightrec/distributed/comm/shm_*.py).
//
// The words live in a shared mapping (a torch tensor made over an mmap of a /dev/shm file); the
// ops below give them acquire/release ordering and block with a futex, so a rank waiting for its
// peer sleeps instead of spinning on a core its peer needs (2 ranks on 2 cores).
//
//   shm_store(words, i, value)               release-store value into int32 word i, wake its waiters
//   shm_wait(words, i, value, timeout_s) -> int   block until (int32)(word - value) >= 0 (wrap-aware);
//                                                 returns the word, or the word - 2^40 once timeout_s
//                                                 seconds passed (the caller checks its peers and
//                                                 waits again); timeout_s <= 0 polls once
//   shm_fetch_add(words, i, delta) -> int    atomic add, returns the previous value

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int32_t* word_ptr(const at::Tensor& words, int64_t i) {
  TORCH_CHECK(words.scalar_type() == at::kInt && words.is_contiguous() && words.device().is_cpu(),
              "shm ops: words must be a contiguous int32 CPU tensor");
  TORCH_CHECK(i >= 0 && i < words.numel(), "shm ops: word ", i, " is outside [0, ", words.numel(), ")");
  return words.data_ptr<int32_t>() + i;
}

void shm_store(at::Tensor words, int64_t i, int64_t value) {
  int32_t* w = word_ptr(words, i);
  __atomic_store_n(w, static_cast<int32_t>(value), __ATOMIC_RELEASE);
  syscall(SYS_futex, w, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

int64_t shm_wait(at::Tensor words, int64_t i, int64_t value, double timeout_s) {
  int32_t* w = word_ptr(words, i);
  const int32_t target = static_cast<int32_t>(value);
  // A short spin first: the peer is usually a few microseconds away (none for a poll, timeout <= 0).
  const int spins = timeout_s > 0 ? 2000 : 1;
  for (int spin = 0; spin < spins; ++spin) {
    const int32_t cur = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    if (static_cast<int32_t>(static_cast<uint32_t>(cur) - static_cast<uint32_t>(target)) >= 0) return cur;
    cpu_relax();
  }
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  while (true) {
    const int32_t cur = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    if (static_cast<int32_t>(static_cast<uint32_t>(cur) - static_cast<uint32_t>(target)) >= 0) return cur;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double waited = (now.tv_sec - start.tv_sec) + 1e-9 * (now.tv_nsec - start.tv_nsec);
    if (waited >= timeout_s) return static_cast<int64_t>(cur) - (int64_t{1} << 40);  // "timed out" marker
    struct timespec slice = {0, 50 * 1000 * 1000};  // 50 ms: the caller re-checks on timeout only
    syscall(SYS_futex, w, FUTEX_WAIT, cur, &slice, nullptr, 0);
  }
}

int64_t shm_fetch_add(at::Tensor words, int64_t i, int64_t delta) {
  return __atomic_fetch_add(word_ptr(words, i), static_cast<int32_t>(delta), __ATOMIC_ACQ_REL);
}

}  // namespace

TORCH_LIBRARY(lightrec_shm, m) {
  m.def("shm_store(Tensor(a!) words, int i, int value) -> ()");
  m.def("shm_wait(Tensor words, int i, int value, float timeout_s) -> int");
  m.def("shm_fetch_add(Tensor(a!) words, int i, int delta) -> int");
}

TORCH_LIBRARY_IMPL(lightrec_shm, CPU, m) {
  m.impl("shm_store", &shm_store);
  m.impl("shm_wait", &shm_wait);
  m.impl("shm_fetch_add", &shm_fetch_add);
}

// The thread budget and parallel_for of parallel.h: a lock-free count of busy helper
// threads, threads started per loop and joined before it returns.
#include "dsa/contract/parallel.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dsa {
namespace {

// CPUs this process may run on (its affinity mask), read once.
int hardware_threads() {
  static const int n = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

// Constant-initialised, so loops and max_threads() work during other files' static
// initialisation too. g_max 0 means "not set": the hardware threads.
std::atomic<int> g_max{0};
std::atomic<int> g_helpers{0};  // helper threads running in loops now, all loops together
std::atomic<bool> g_forked_child{false};

// A child of fork() has only the forking thread: it never starts threads (the parent's
// loops may have held tokens at the fork, and a threaded child could deadlock).
[[maybe_unused]] const bool g_atfork_registered = [] {
  return pthread_atfork(nullptr, nullptr, [] { g_forked_child.store(true); }) == 0;
}();

// Takes up to `want` helper slots under the budget; returns how many it got.
int acquire(int want) {
  const int limit = max_threads() - 1;
  int used = g_helpers.load();
  while (used < limit) {
    const int take = std::min(want, limit - used);
    if (g_helpers.compare_exchange_weak(used, used + take)) return take;
  }
  return 0;
}

constexpr double kMinWorkPerThread = 262144.0;  // 2^18 flops: below this a thread is not worth it

}  // namespace

void set_max_threads(int n) {
  if (n < 1)
    throw std::invalid_argument("set_max_threads: argument 'n' got " + std::to_string(n) +
                                ", expected >= 1");
  g_max.store(n);
}

int max_threads() {
  const int n = g_max.load();
  return n > 0 ? n : hardware_threads();
}

void parallel_for(int64_t n, double work_per_item,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const double total = static_cast<double>(n) * std::max(0.0, work_per_item);
  int64_t want = std::min<int64_t>(n, max_threads()) - 1;
  want = std::min<int64_t>(want, static_cast<int64_t>(total / kMinWorkPerThread) - 1);
  const int helpers = (want <= 0 || g_forked_child.load()) ? 0 : acquire(static_cast<int>(want));
  if (helpers == 0) {
    fn(0, n);
    return;
  }
  // Several chunks per thread balance uneven items; which thread runs a chunk never
  // changes what the chunk computes.
  const int64_t chunks = std::min<int64_t>(n, 16 * static_cast<int64_t>(helpers + 1));
  const int64_t size = (n + chunks - 1) / chunks;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    for (int64_t c = next++; c < chunks && !failed.load(); c = next++) {
      const int64_t begin = c * size, end = std::min(n, begin + size);
      if (begin >= end) continue;
      try {
        fn(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(helpers));
  int started = 0;
  try {
    for (; started < helpers; ++started)
      threads.emplace_back([&] {
        work();
        g_helpers.fetch_sub(1);  // give the slot back as soon as this helper is done
      });
  } catch (...) {
    g_helpers.fetch_sub(helpers - started);  // threads that could not start
  }
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

void parallel_ordered(int64_t n, const std::function<void(int64_t)>& work,
                      const std::function<void(int64_t)>& emit,
                      const std::function<bool(int64_t)>& fail_fast) {
  if (n <= 0) return;
  std::mutex mu;
  std::vector<char> done(static_cast<size_t>(n), 0);
  int64_t next_emit = 0;
  std::atomic<bool> stop{false};
  // Items are claimed in index order, so every item below a claimed one is claimed too.
  std::atomic<int64_t> next_item{0};
  auto run_items = [&](int64_t, int64_t) {
    for (int64_t i = next_item++; i < n && !stop.load(); i = next_item++) {
      try {
        work(i);
        std::lock_guard<std::mutex> lock(mu);
        done[static_cast<size_t>(i)] = 1;
        while (next_emit < n && done[static_cast<size_t>(next_emit)] && !stop.load()) {
          emit(next_emit);
          if (fail_fast && fail_fast(next_emit)) stop.store(true);
          ++next_emit;
        }
      } catch (...) {
        stop.store(true);  // no new items; parallel_for rethrows
        throw;
      }
    }
  };
  // One loop index per thread: each thread claims items until none are left.
  const int64_t threads = std::min<int64_t>(n, max_threads());
  parallel_for(threads, 1e18, run_items);
}

}  // namespace dsa

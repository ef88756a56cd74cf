// The thread budget and parallel_for of parallel.h: a lock-free token count of free helper
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

int hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::atomic<int> g_max{hardware_threads()};
std::atomic<int> g_free{g_max.load() - 1};  // helper threads not in use by any loop
std::atomic<bool> g_forked_child{false};

// A child of fork() has only the forking thread: it never starts threads (the parent's
// loops may have held tokens at the fork, and a threaded child could deadlock).
[[maybe_unused]] const bool g_atfork_registered = [] {
  return pthread_atfork(nullptr, nullptr, [] { g_forked_child.store(true); }) == 0;
}();

// Takes up to `want` tokens; returns how many it got.
int acquire(int want) {
  int free = g_free.load();
  while (free > 0) {
    const int take = std::min(want, free);
    if (g_free.compare_exchange_weak(free, free - take)) return take;
  }
  return 0;
}

constexpr double kMinWorkPerThread = 262144.0;  // 2^18 flops: below this a thread is not worth it

}  // namespace

void set_max_threads(int n) {
  if (n < 1)
    throw std::invalid_argument("set_max_threads: argument 'n' got " + std::to_string(n) +
                                ", expected >= 1");
  const int old = g_max.exchange(n);
  g_free.fetch_add(n - old);
}

int max_threads() { return g_max.load(); }

void parallel_for(int64_t n, double work_per_item,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const double total = static_cast<double>(n) * std::max(0.0, work_per_item);
  int64_t want = std::min<int64_t>(n, g_max.load()) - 1;
  want = std::min<int64_t>(want, static_cast<int64_t>(total / kMinWorkPerThread) - 1);
  const int helpers = (want <= 0 || g_forked_child.load()) ? 0 : acquire(static_cast<int>(want));
  if (helpers == 0) {
    fn(0, n);
    return;
  }
  // Several chunks per thread balance uneven items; which thread runs a chunk never
  // changes what the chunk computes.
  const int64_t chunks = std::min<int64_t>(n, 4 * static_cast<int64_t>(helpers + 1));
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
        g_free.fetch_add(1);  // give the token back as soon as this helper is done
      });
  } catch (...) {
    g_free.fetch_add(helpers - started);  // threads that could not start
  }
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace dsa

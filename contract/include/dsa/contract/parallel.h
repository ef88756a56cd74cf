// One process-wide thread budget and a deterministic parallel loop over independent items,
// used by the reference (rows of an op) and the CLI (cases of a run). No persistent pool:
// each loop starts its threads and joins them before returning, so a fork() between loops
// leaves nothing behind; a forked child always runs loops on its calling thread.
#pragma once

#include <cstdint>
#include <functional>

namespace dsa {

/// Sets the total number of threads parallel loops may use at once, nested loops included
/// (the calling thread counts as one). n >= 1; 1 makes every loop serial. Default: the CPUs
/// of this process's affinity mask. Loops already running keep the threads they have.
/// Throws std::invalid_argument naming `n` when n < 1.
void set_max_threads(int n);

/// The current budget set by set_max_threads (>= 1).
int max_threads();

/// Calls fn(begin, end) over consecutive chunks covering [0, n), each index exactly once.
/// Chunks run on the calling thread plus up to max_threads() - 1 helper threads, as many as
/// the budget has free now (nested loops share it; a loop inside a busy one runs serially).
/// `work_per_item` is a rough cost of one index in flops; loops below ~2^18 flops in all run
/// serially. fn must only write state owned by its indices: results then do not depend on
/// the thread count. The first exception thrown by fn is rethrown after all chunks stop.
/// n <= 0 does nothing. Rule: issue 13 (bitwise results whatever the thread count).
void parallel_for(int64_t n, double work_per_item,
                  const std::function<void(int64_t begin, int64_t end)>& fn);

/// Runs work(i) for every i in [0, n), up to max_threads() items at once (heavy items: one
/// per thread), and calls emit(i) in index order, each as soon as items 0..i are done (emit
/// runs on one thread at a time, e.g. to print reports in a deterministic order). fail_fast(i),
/// when given and true after emit(i), stops starting new items and emits nothing after i.
/// The first exception of work or emit is rethrown after the running items end.
void parallel_ordered(int64_t n, const std::function<void(int64_t)>& work,
                      const std::function<void(int64_t)>& emit,
                      const std::function<bool(int64_t)>& fail_fast = nullptr);

}  // namespace dsa

// Op-level top-k execution counter (SPEC §8): counts every dispatcher call of
// `dsa::topk_indices` and `aten::topk` in the process while alive, whatever backend or thread
// runs it, through a global at::RecordFunction callback.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace dsa::optimized {

/// RAII counting scope. Construction starts counting (the first live counter installs the
/// global RecordFunction callback, the last one removes it); destruction stops it. Several
/// counters may be alive at once, on any threads; each counts every top-k execution that
/// starts while it is alive. Thread-safe (a mutex guards the registry, counts are atomic).
/// Counted operator names: counted_topk_ops(). Composite ops that call a counted op are
/// counted once per call of that op (dsa::topk_indices sorts internally and is counted
/// once; aten::sort is deliberately not counted).
class TopkCounter {
 public:
  TopkCounter();
  ~TopkCounter();
  TopkCounter(const TopkCounter&) = delete;
  TopkCounter& operator=(const TopkCounter&) = delete;

  /// Top-k executions started since construction (or the last reset()).
  int64_t count() const { return count_->load(); }
  void reset() { count_->store(0); }

 private:
  std::shared_ptr<std::atomic<int64_t>> count_;
};

/// The RecordFunction names counted as one top-k execution each:
/// "dsa::topk_indices", "aten::topk".
const std::vector<const char*>& counted_topk_ops();

}  // namespace dsa::optimized

// The oracle's determinism re-run as the route making the call sees it (SPEC §3.5): a
// per-thread mark, so that a route whose calls each start in a fresh process (the plugin route)
// can make the re-run a second call in one process.
#pragma once

#include <string>

namespace dsa::oracle {

/// Marks the oracle's determinism re-run (SPEC §3.5: the second run of an identical call) on
/// the calling thread while alive (check_start.h's run_backend holds one around the second
/// call). A route whose calls would otherwise each start from a fresh process (the plugin
/// route: every call in a forked child) reads active() and makes that run the second call in
/// one process, after a call on other values of the same shapes, so a kernel whose result
/// depends on an earlier call (a CUDA graph replayed with a stale input buffer, a cache keyed
/// by shape) returns another result there and fails the determinism check; it says so with
/// note(), which the oracle appends to that failure. Wrappers need not forward anything: the
/// mark is per thread and the wrapped call runs on the same thread. Throws nothing.
class SecondRunScope {
 public:
  SecondRunScope();
  ~SecondRunScope();
  SecondRunScope(const SecondRunScope&) = delete;
  SecondRunScope& operator=(const SecondRunScope&) = delete;
  /// True on this thread while a SecondRunScope is alive.
  static bool active();
  /// Records how the route made the re-run (e.g. "the second call in one process, after ...");
  /// ignored when no scope is active.
  static void note(const std::string& how);
  /// What note() recorded under this scope ("" when nothing).
  const std::string& how() const;

 private:
  std::string how_;
  SecondRunScope* previous_;
};

}  // namespace dsa::oracle

// A memo for the cases judged on a thread that carry none of their own (OpCase::memo null):
// the property runner gives each draw one, so the forward and backward checks of a draw share
// the float64 reference, baseline and floors (issue 13's sharing, for generated cases).
#pragma once

#include <memory>

#include "dsa/oracle/case_memo.h"

namespace dsa::oracle {

/// The memo of the innermost ScopedCaseMemo alive on this thread, or null when none is. The
/// checks (op_check.h, fp8_check.h) use it for a case whose OpCase::memo is null. Throws nothing.
CaseMemo* scoped_case_memo();

/// While alive, `memo` is the memo of every case judged on this thread without one of its own
/// (a case with OpCase::memo keeps it). Nestable; a null `memo` means none. Results are keyed by
/// the fingerprint of the inputs they read (shared_result), so one memo may serve many cases,
/// e.g. every subject judged on the same draws (props::run_suites). Throws nothing.
class ScopedCaseMemo {
 public:
  explicit ScopedCaseMemo(std::shared_ptr<CaseMemo> memo);
  ~ScopedCaseMemo();
  ScopedCaseMemo(const ScopedCaseMemo&) = delete;
  ScopedCaseMemo& operator=(const ScopedCaseMemo&) = delete;

 private:
  std::shared_ptr<CaseMemo> memo_;
  CaseMemo* previous_;
};

}  // namespace dsa::oracle

// Internal to the oracle (not installed): the opening of every op check, shared by
// op_check.cpp (SPEC §2-§7) and fp8_check.cpp (§10).
#pragma once

#include <string>

#include "dsa/oracle/backend.h"
#include "dsa/oracle/report.h"

namespace dsa::oracle::detail {

/// A report for `op_name` on `b`: Skip with the reason when the backend is unavailable here
/// or does not support `op`, else Pass (to be judged).
inline OpReport start_report(Backend& b, const std::string& op_name, Op op) {
  OpReport r;
  r.backend = b.name();
  r.op = op_name;
  const std::string why = b.unavailable_reason();
  if (!why.empty()) {
    r.verdict = Verdict::Skip;
    r.reason = why;
  } else if (!b.supports(op)) {
    r.verdict = Verdict::Skip;
    r.reason = std::string("op ") + to_string(op) + " not supported";
  }
  return r;
}

}  // namespace dsa::oracle::detail

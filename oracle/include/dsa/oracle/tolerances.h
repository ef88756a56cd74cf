// The one tolerance table of the suite (SPEC §9, STYLE "Tolerances are data"): every ρ and
// floor, keyed by (op, output, dtype), each with a one-line reason. Nothing else in the code
// base (tests included) carries a literal tolerance.
#pragma once

#include <string>
#include <vector>

#include "dsa/contract/dtype.h"

namespace dsa::oracle {

/// One row of the table. The ratio rule (SPEC §9) accepts a candidate when
///   err(candidate) <= rho · err(baseline) + floor_eps · epsilon(dtype) · scale
/// with err = max abs error against the float64 reference over finite positions and
/// scale = max |reference| (finite positions). Ops: the dsa::oracle::to_string(Op) names,
/// plus "peer:<op>" rows used when a peer producer's fp32 `expected.*` is judged against
/// the reference (its error plays the candidate; the fp32 baseline plays the baseline).
struct Tolerance {
  std::string op;
  std::string output;
  DType dtype;
  double rho;
  double floor_eps;
  std::string reason;
};

/// The entry for (op, output, dtype). Throws std::out_of_range naming the key when absent
/// (a missing entry is a bug in the table, never silently a default).
const Tolerance& tolerance(const std::string& op, const std::string& output, DType dtype);

/// Every entry, in table order (for `dsa-verify tolerances` and docs).
const std::vector<Tolerance>& tolerance_table();

/// Absolute floor of `tol` for a reference of max magnitude `scale`.
double floor_abs(const Tolerance& tol, double scale);

}  // namespace dsa::oracle

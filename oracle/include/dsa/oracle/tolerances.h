// The one tolerance table of the suite (SPEC §9, STYLE "Tolerances are data"): every ρ and
// floor, keyed by (op, output, dtype), each with a one-line reason. Nothing else in the code
// base (tests included) carries a literal tolerance.
#pragma once

#include <string>
#include <vector>

#include "dsa/contract/dtype.h"

namespace dsa::oracle {

/// One row of the table. The ratio rule (SPEC §9) accepts a candidate when
///   err(candidate) <= rho · err(baseline) + floor
///   floor = floor_eps · eps(F32) · max(scale, term_scale) + out_ulps · eps(dtype) · scale
/// with err = max abs error against the float64 reference over finite positions,
/// scale = max |reference| (finite positions), and term_scale = a bound on the magnitude of
/// the terms summed into the output, computed by the op checker from the inputs (so an output
/// that cancels to ~0 is judged at the precision of its terms, as FlashAttention's atol at
/// the inputs' scale does). eps(F32) because SPEC §2/§5 fix fp32 accumulation; out_ulps
/// covers one rounding flip of a 16-bit output. Ops: the dsa::oracle::to_string(Op) names,
/// plus "peer:<op>" rows used when a peer producer's fp32 `expected.*` is judged against
/// the reference (its error plays the candidate; the fp32 baseline plays the baseline).
struct Tolerance {
  std::string op;
  std::string output;
  DType dtype;
  double rho;
  double floor_eps;
  double out_ulps;
  std::string reason;
};

/// The entry for (op, output, dtype). Throws std::out_of_range naming the key when absent
/// (a missing entry is a bug in the table, never silently a default).
const Tolerance& tolerance(const std::string& op, const std::string& output, DType dtype);

/// Every entry, in table order (for `dsa-verify tolerances` and docs).
const std::vector<Tolerance>& tolerance_table();

/// Absolute floor of `tol` for a reference of max magnitude `scale` and a term bound
/// `term_scale` (0 when unknown).
double floor_abs(const Tolerance& tol, double scale, double term_scale = 0.0);

}  // namespace dsa::oracle

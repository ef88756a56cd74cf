// Fixture runner (target dsa_oracle_fixtures): runs a fixture's op on the reference and,
// optionally, on a backend, and compares both with the fixture's `expected.*` and with each
// other. Backs `dsa-verify fixtures check` and `make audit`. Format: fixtures/peer/README.md.
#pragma once

#include <string>
#include <vector>

#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/op_check.h"
#include "dsa/oracle/report.h"

namespace dsa::oracle {

/// Result of one fixture.
struct FixtureReport {
  std::string case_name, op, producer;
  /// Producer's expected.* judged against the float64 reference: floats by the ratio rule
  /// with the "peer:<op>" rows of the table (fp32 producer rounding), non-finite positions
  /// identical; top-k by check_topk under the policy in params and the conventions JSON
  /// (narrowed width etc. as explicit adapters, listed in notes).
  OpReport reference_vs_expected;
  /// check_op on the backend for each op the fixture covers (ratio rule vs the reference).
  std::vector<OpReport> backend_vs_reference;
  /// Backend outputs vs expected.*: metrics only (verdict from non-finite positions and, for
  /// top-k, set equality modulo ties); empty when no backend was given.
  OpReport backend_vs_expected;
  bool passed() const;
};

/// Builds the OpCase of a fixture (windows from ks/ke when present, else full; params
/// sm_scale, d_v, k, tie_break, sorted, mode, coeff). Throws fixtures::FileError naming a
/// missing tensor or parameter.
OpCase op_case_from_fixture(const fixtures::Fixture& f);

/// Ops a fixture's `op` string covers ("sparse_mla_fwd+bwd" → fwd, bwd). Throws
/// fixtures::FileError on an unknown op string.
std::vector<Op> fixture_ops(const fixtures::Fixture& f);

/// Checks `f` on the reference and, when `backend` is not null, on the backend.
/// Never throws for numeric disagreement (reported); throws FileError on malformed fixtures.
/// `opt` is passed to every check_op of the backend.
FixtureReport check_fixture(const fixtures::Fixture& f, Backend* backend = nullptr,
                            const CheckOptions& opt = {});

/// Multi-line report: one header per section, then the per-tensor metric tables.
std::string format_fixture_report(const FixtureReport& r);

}  // namespace dsa::oracle

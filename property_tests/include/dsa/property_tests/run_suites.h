// The property suite over several subjects on the same draws (the false-alarm run of a seed).
#pragma once

#include <vector>

#include "dsa/property_tests/suite.h"

namespace dsa::props {

/// run_suite for each of `subjects` on the same draws, property by property: every subject runs
/// a property before the next property starts, all of them inside one oracle::ScopedCaseMemo
/// for that property (released before the next), so each draw's float64 reference, baseline
/// and floors are computed once for all the subjects instead of once per subject. out[i] holds
/// subject i's rows: the verdicts, cases and messages run_suite(subjects[i], o) gives, in its
/// order. Throws std::invalid_argument when o.stop_at_first_failure is set (use run_suite).
std::vector<std::vector<PropertyResult>> run_suites(const std::vector<Subject>& subjects, const SuiteOptions& o);

}  // namespace dsa::props

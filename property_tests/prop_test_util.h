// Helpers of the property suite's own gtest files (prop_tests_main.cpp, coverage_test.cpp,
// row_limits_test.cpp): properties and mutants by name, level-0 options, fields of a message.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "dsa/property_tests/suite.h"

namespace dsa::props::test {

/// The property named `name` (all_properties()); throws std::invalid_argument naming it if none.
inline const Property& property_named(const std::string& name) {
  for (const auto& p : all_properties())
    if (p.name == name) return p;
  throw std::invalid_argument("no property " + name);
}

/// The mutant named `name` (mutant_subjects()); throws std::invalid_argument naming it if none.
inline Subject mutant_named(const std::string& name) {
  for (const auto& m : mutant_subjects())
    if (m.name == name) return m;
  throw std::invalid_argument("no mutant " + name);
}

/// Level-0 options with seed `seed` (0: RapidCheck's own), no fixture dump, no end-of-process
/// summary; shrinking only when `shrink` (a test that reads the shrunk counterexample).
inline SuiteOptions level0(uint64_t seed, bool shrink = false) {
  SuiteOptions o;
  o.level = 0;
  o.seed = seed;
  o.shrink = shrink;
  o.dump = false;
  o.quiet = true;
  return o;
}

/// The number after the last `key` in `message` (e.g. " s_q=" in a shrunk case's log), -1 when
/// absent.
inline int64_t last_field(const std::string& message, const std::string& key) {
  const auto at = message.rfind(key);
  return at == std::string::npos ? -1 : std::atoll(message.c_str() + at + key.size());
}

}  // namespace dsa::props::test

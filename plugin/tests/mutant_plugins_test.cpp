// Mutation score through the plugin path (issue 6): every backend-level mutant of the
// property suite, built as a plugin (plugin/examples/mutant_plugin.cpp), is loaded with the
// loader (dlopen, ABI checks, isolated calls) and must be caught by the suite.
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>

#include "dsa/plugin/plugin_backend.h"
#include "dsa/property_tests/suite.h"

namespace {

std::vector<std::string> mutant_plugin_paths() {
  std::vector<std::string> paths;
  std::stringstream ss(DSA_MUTANT_PLUGINS);
  std::string p;
  while (std::getline(ss, p, '|')) paths.push_back(p);
  return paths;
}

// Backend-level mutants (the block-level ones, §8 replay, have no ABI op).
std::vector<dsa::props::Subject> backend_mutants() {
  std::vector<dsa::props::Subject> out;
  for (auto& s : dsa::props::mutant_subjects())
    if (s.name.rfind("block_", 0) != 0) out.push_back(s);
  return out;
}

TEST(MutantPlugins, OnePluginPerBackendMutant) {
  EXPECT_EQ(mutant_plugin_paths().size(), backend_mutants().size())
      << "set DSA_BACKEND_MUTANT_COUNT in plugin/CMakeLists.txt to the number of backend mutants";
}

TEST(MutantPlugins, EveryMutantIsCaughtThroughThePluginPath) {
  const auto paths = mutant_plugin_paths();
  const auto mutants = backend_mutants();
  ASSERT_EQ(paths.size(), mutants.size());
  dsa::props::SuiteOptions o;
  o.level = 0;
  o.shrink = false;
  o.dump = false;
  o.quiet = true;
  o.stop_at_first_failure = true;
  size_t caught = 0;
  std::ostringstream table;
  for (size_t i = 0; i < paths.size(); ++i) {
    dsa::props::Subject s = dsa::props::backend_subject(dsa::plugin::register_plugin(paths[i]));
    s.focus = mutants[i].focus;
    std::string by;
    for (const auto& r : dsa::props::run_suite(s, o))
      if (r.verdict == dsa::oracle::Verdict::Fail) { by = r.property; break; }
    caught += !by.empty();
    table << (by.empty() ? "MISSED " : "caught ") << mutants[i].name << " (" << mutants[i].fault
          << ")" << (by.empty() ? "" : " by " + by) << "\n";
    EXPECT_FALSE(by.empty()) << "mutant plugin " << paths[i] << " (" << mutants[i].fault
                             << ") passed every property";
  }
  std::cout << table.str() << "mutation score through the plugin path: " << caught << "/"
            << paths.size() << "\n";
}

}  // namespace

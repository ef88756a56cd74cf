// The SPEC §10 bad-input properties through the plugin route (fresh-user F3/F3b): only the
// documented rejection (DSA_STATUS_INVALID_ARGUMENT, promptly, nothing written past a buffer)
// passes fp8.invalid_scale_rejected, paged.bad_table_rejected and paged.invalid_scale_rejected;
// a crash, a hang, a write past `scores`, another error status or a silent answer fails, with
// a message saying which. The loader hands a bad block table to an isolated plugin (so the
// property judges the kernel), and to a plugin run in-process it does not (the property is
// then a skip, never a pass). Plugin: tests/bad_input_plugin.c, mode from DSA_BAD_INPUT_MODE.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "dsa/plugin/plugin_backend.h"
#include "dsa/property_tests/suite.h"

namespace {

using dsa::oracle::Verdict;
using dsa::props::PropertyResult;

const char* const kProperties[] = {"fp8.invalid_scale_rejected", "paged.bad_table_rejected",
                                   "paged.invalid_scale_rejected"};

const dsa::props::Property& property_named(const std::string& name) {
  for (const auto& p : dsa::props::all_properties())
    if (p.name == name) return p;
  throw std::invalid_argument("no property " + name);
}

dsa::props::Subject plugin_subject(bool isolate, std::chrono::milliseconds timeout) {
  dsa::props::Subject s;
  s.name = "plugin:bad_input";
  s.make = [isolate, timeout]() -> std::unique_ptr<dsa::oracle::Backend> {
    dsa::plugin::PluginOptions o;
    o.isolate = isolate;
    o.timeout = timeout;
    return dsa::plugin::open_plugin(DSA_BAD_INPUT_PLUGIN, o);
  };
  return s;
}

// The property `prop` at level 0 (seed 7, no shrinking) on the plugin in mode `mode`.
PropertyResult run_in_mode(const char* mode, const std::string& prop, bool isolate = true,
                           std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  ::setenv("DSA_BAD_INPUT_MODE", mode, 1);
  dsa::props::SuiteOptions o;
  o.level = 0;
  o.seed = 7;
  o.shrink = false;
  o.dump = false;
  o.quiet = true;
  PropertyResult r = dsa::props::run_property(plugin_subject(isolate, timeout), property_named(prop), o);
  ::unsetenv("DSA_BAD_INPUT_MODE");
  std::cout << "  " << mode << (isolate ? "" : " (in process)") << " " << prop << ": "
            << dsa::oracle::to_string(r.verdict) << " " << r.message.substr(0, 240) << "\n";
  return r;
}

TEST(BadInputThroughPlugin, TheDocumentedRejectionPasses) {
  for (const char* prop : kProperties) {
    const PropertyResult r = run_in_mode("check", prop);
    EXPECT_EQ(r.verdict, Verdict::Pass) << prop << ": " << r.message;
    EXPECT_GT(r.cases, 0) << prop;
  }
}

TEST(BadInputThroughPlugin, EveryOtherOutcomeFailsSayingWhich) {
  const struct {
    const char* mode;
    const char* says;
  } cases[] = {{"clamp", "accepted "},
               {"crash", "crashed on "},
               {"overrun", "wrote outside its buffers on "},
               {"internal", "failed with another error on "}};
  for (const auto& c : cases)
    for (const char* prop : kProperties) {
      const PropertyResult r = run_in_mode(c.mode, prop);
      EXPECT_EQ(r.verdict, Verdict::Fail) << c.mode << " " << prop << ": " << r.message;
      EXPECT_NE(r.message.find(c.says), std::string::npos) << c.mode << " " << prop << ": " << r.message;
    }
}

TEST(BadInputThroughPlugin, AHangFailsAtTheTimeout) {
  for (const char* prop : kProperties) {
    const PropertyResult r = run_in_mode("hang", prop, true, std::chrono::milliseconds(300));
    EXPECT_EQ(r.verdict, Verdict::Fail) << prop << ": " << r.message;
    EXPECT_NE(r.message.find("hung on "), std::string::npos) << prop << ": " << r.message;
  }
}

// F3b: a plugin that silently clamps bad table entries fails paged.bad_table_rejected (the
// loader no longer rejects the table itself before an isolated call); in process the loader
// does, so the property cannot see the kernel and is a skip saying why, never a pass.
TEST(BadInputThroughPlugin, BadTablesReachTheIsolatedKernelElseTheyAreNotJudged) {
  const PropertyResult isolated = run_in_mode("clamp", "paged.bad_table_rejected");
  EXPECT_EQ(isolated.verdict, Verdict::Fail) << isolated.message;
  for (const char* mode : {"clamp", "check"}) {
    const PropertyResult r = run_in_mode(mode, "paged.bad_table_rejected", /*isolate=*/false);
    EXPECT_EQ(r.verdict, Verdict::Skip) << mode << ": " << r.message;
    EXPECT_NE(r.message.find("not applicable on this route"), std::string::npos) << r.message;
  }
  // Scales reach the kernel on both routes: in process the checking kernel passes.
  EXPECT_EQ(run_in_mode("check", "paged.invalid_scale_rejected", false).verdict, Verdict::Pass);
  EXPECT_EQ(run_in_mode("clamp", "paged.invalid_scale_rejected", false).verdict, Verdict::Fail);
}

}  // namespace

// Faults a fresh user found in the reports and argument checks (issue 12 item 8; project rule
// "bad input gets a clear error naming the argument and the expected value"): --ops selects
// what is judged and the report names the op that failed; messages begin with what failed for
// the user, never an internal path. Label golden.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "dsa/property_tests/suite.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::Scratch;
using test::lines_with;
using test::run_cli_capture;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The plugin library of the mutant named `name` (props::mutant_subjects order), or "".
std::string mutant_plugin_named(const std::string& name) {
  const std::vector<props::Subject> all = props::mutant_subjects();
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].name == name) return test::mutant_plugin(i);
  return "";
}

// A kernel whose forward is right and whose backward overwrites dkv: --ops sparse_mla_fwd
// judges the forward only (the forward properties' backward parts and the block properties
// do not run), so it passes; --ops sparse_mla_bwd judges the backward and fails under that op.
TEST(OpsSelection, ForwardOnlyJudgesTheForwardAndBackwardOnlyTheBackward) {
  const std::string plugin = mutant_plugin_named("smla_dkv_assigned_not_accumulated");
  ASSERT_FALSE(plugin.empty());
  Scratch dir("ops_selection");
  std::string out;
  EXPECT_EQ(run_cli_capture("audit --plugin " + plugin + " --ops sparse_mla_fwd --seed 5 --dump-dir " +
                                dir.file("d") + " --only smla.empty_rows,smla.extreme_rows_in_batch,"
                                "smla.topk_length_respected,smla.fp32_inputs",
                            &out),
            0);
  EXPECT_TRUE(lines_with(out, {"sparse_mla_bwd"}).empty()) << "the backward was judged";
  EXPECT_EQ(lines_with(out, {"sparse_mla_fwd ", "property:smla.", " pass "}).size(), 4u);
  EXPECT_EQ(run_cli_capture("audit --plugin " + plugin + " --ops sparse_mla_bwd --seed 5 --dump-dir " +
                                dir.file("d") + " --only smla.duplicates_accumulate_in_dkv",
                            &out),
            1);
  EXPECT_EQ(lines_with(out, {"sparse_mla_bwd ", "property:smla.duplicates_accumulate_in_dkv", " fail "}).size(), 1u);
}

// Without --ops a forward property also judges the backward (when the kernel has one); a
// backward failure is filed under sparse_mla_bwd in the table, the progress line and JUnit,
// and the message begins with the oracle's line (op, output, err > bound), not with RapidCheck's
// source location and macro ("../../property_tests/...: RC_FAIL(::dsa::oracle::...)").
TEST(OpsSelection, ABackwardFailureInAForwardPropertyIsNamedByItsOp) {
  const std::string plugin = mutant_plugin_named("smla_dkv_assigned_not_accumulated");
  ASSERT_FALSE(plugin.empty());
  Scratch dir("ops_naming");
  std::string out;
  EXPECT_EQ(run_cli_capture("audit --plugin " + plugin + " --only smla.empty_rows --seed 5 --junit " +
                                dir.file("r.xml") + " --dump-dir " + dir.file("d"),
                            &out),
            1);
  EXPECT_EQ(lines_with(out, {"[1/1] fail sparse_mla_bwd smla.empty_rows"}).size(), 1u);
  EXPECT_EQ(lines_with(out, {"sparse_mla_bwd ", "property:smla.empty_rows", " fail "}).size(), 1u);
  EXPECT_TRUE(lines_with(out, {"sparse_mla_fwd ", "property:smla.empty_rows"}).empty());
  const std::string xml = read_text(dir.file("r.xml"));
  const std::string attr = "<failure message=\"";
  const size_t at = xml.find(attr);
  ASSERT_NE(at, std::string::npos) << xml;
  const std::string message = xml.substr(at + attr.size(), 200);
  EXPECT_EQ(message.rfind("[FAIL] plugin:", 0), 0u) << message;
  EXPECT_NE(message.find("sparse_mla_bwd: dkv: "), std::string::npos) << message;
  EXPECT_NE(message.find("&gt; bound"), std::string::npos) << message;
  for (const char* internal : {"dsa::", "RC_FAIL", ".cpp:", "../"})
    EXPECT_EQ(message.find(internal), std::string::npos) << internal << " in " << message;
}

}  // namespace
}  // namespace dsa::cli

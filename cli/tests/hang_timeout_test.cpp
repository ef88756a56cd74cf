// An in-process backend whose call hangs gets the per-call timeout a plugin's isolated calls
// have (--timeout): the audit ends with a failed case naming the hung call ("timed out after N
// s"), every result computed before it in the report (JSON, JUnit, summary), exit 1, without
// waiting for the stuck thread (CallWatchdog). Before, the audit hung with the call, forever.
// The program under test is dsa-verify built with one more in-process backend
// (tests/test_backends.cpp); `timeout -s KILL 600` only keeps a regression from hanging the
// test run (a hung audit ignores a first SIGTERM: InterruptHandlers waits for the task).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "dsa/fixtures/fixture.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::Scratch;
using test::golden;

TEST(HungInProcessCall, IsAFailedCaseAndTheReportKeepsEveryResultBeforeIt) {
  Scratch dir("hung_call");
  std::filesystem::create_directories(dir.file("fx/golden"));
  std::filesystem::create_directories(dir.file("fx/peer"));
  std::filesystem::copy_file(golden("topk_plateau_small_sorted"), dir.file("fx/golden/topk_plateau_small_sorted.safetensors"));
  // The peer file: topk_distinct_causal with the backend's hang marker where row 0 never reads.
  fixtures::Fixture f = fixtures::load_fixture(golden("topk_distinct_causal"));
  ASSERT_LE(f.inputs.at("ke").get(0), 71);
  f.inputs.at("scores").set(71, 12345.678f);
  fixtures::save_fixture(dir.file("fx/peer/hangs.safetensors"), f);

  const std::string json = dir.file("r.json"), junit = dir.file("r.xml");
  const std::string cmd = std::string("timeout -s KILL 600 ") + DSA_VERIFY_TEST_BACKENDS + " audit --backend test:hangs-on-marker"
                          " --ops topk --seed 7 --timeout 2 --jobs 1 --json " + json + " --junit " + junit +
                          " > " + dir.file("out.txt") + " 2>&1";
  const int status = std::system(("env DSA_FIXTURES_DIR=" + dir.file("fx") + " " + cmd).c_str());
  const std::string out = test::read_text(dir.file("out.txt"));
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 1) << out;  // 137: `timeout` had to kill it (the audit hung)
  EXPECT_NE(out.find("audit stopped: an in-process call hung (peer:hangs: topk call of backend "
                     "'test:hangs-on-marker', past --timeout 2 s)"), std::string::npos) << out;

  const nlohmann::json j = test::read_json(json);
  EXPECT_EQ(j.value("hung_call", ""), "peer:hangs: topk call of backend 'test:hangs-on-marker'") << j.dump(1);
  EXPECT_FALSE(j.value("finished", true)) << j.dump(1);  // a partial report says so (fresh12 F5)
  size_t passed = 0;
  bool hung = false, golden_passed = false;
  for (const auto& c : j.at("cases")) {
    const std::string prop = c.value("property", ""), status_word = c.value("status", "");
    passed += status_word == "pass";
    golden_passed |= prop == "golden:topk_plateau_small_sorted" && status_word == "pass";
    if (prop == "peer:hangs") {
      hung = true;
      EXPECT_EQ(status_word, "fail") << c.dump(1);
      EXPECT_EQ(c.value("message", "").rfind("timed out after 2 s: the topk call of backend 'test:hangs-on-marker' "
                                             "was still running", 0), 0u) << c.dump(1);
    }
  }
  EXPECT_TRUE(hung) << j.dump(1);
  EXPECT_TRUE(golden_passed) << j.dump(1);  // the results before the hang are kept
  EXPECT_GE(passed, 2u) << j.dump(1);       // the topk properties and the golden
  EXPECT_EQ(j.at("summary").value("failed", -1), 1) << j.dump(1);
  EXPECT_NE(test::read_text(junit).find("timed out after 2 s"), std::string::npos);
}

}  // namespace
}  // namespace dsa::cli

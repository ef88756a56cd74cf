// An in-process backend whose call hangs gets the per-call timeout a plugin's isolated calls
// have (--timeout): the audit ends with a failed case naming the hung call ("timed out after N
// s"), every result computed before it in the report (JSON, JUnit, summary), exit 1, without
// waiting for the stuck thread (CallWatchdog). Before, the audit hung with the call, forever.
// The program under test is dsa-verify built with one more in-process backend
// (tests/test_backends.cpp); `timeout -s KILL 600` only keeps a regression from hanging the
// test run (a hung audit ignores a first SIGTERM: InterruptHandlers waits for the task).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <string>
#include <thread>

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

// Lines in the slow backend's call log (one per op call, written when the call starts).
size_t calls_logged(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// SIGINT during an audit of an in-process backend: the running property stops after the call
// that was running (SuiteOptions::stop_requested), the audit writes its partial report and
// exits 130. Before, the first SIGINT let the running property finish all its draws (here 25
// of 0.3 s each, every one a call counted in the log) and only then stopped. The assertion is on
// calls made after the signal, not on time; the deadlines only keep a regression from hanging.
TEST(InterruptedInProcessAudit, StopsAfterTheRunningCallAndWritesThePartialReport) {
  Scratch dir("interrupt_in_process");
  const std::string log = dir.file("calls.txt"), json = dir.file("r.json"), out = dir.file("out.txt");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("DSA_TEST_CALL_LOG", log.c_str(), 1);
    const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execl(DSA_VERIFY_TEST_BACKENDS, "dsa-verify", "audit", "--backend", "test:slow-topk", "--only",
          "topk.contract_exact,topk.nan_never_selected", "--seed", "7", "--jobs", "1", "--json", json.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto wait_until = [](int seconds, const auto& done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  };
  int status = 0;
  bool exited = false;
  auto reaped = [&] {
    exited = exited || waitpid(pid, &status, WNOHANG) == pid;
    return exited;
  };
  if (!wait_until(300, [&] { return calls_logged(log) >= 3 || reaped(); })) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "no third backend call within 300 s: " << test::read_text(out);
  }
  ASSERT_FALSE(exited) << "the audit ended before it was interrupted: " << test::read_text(out);
  ASSERT_EQ(kill(pid, SIGINT), 0);
  const size_t at_signal = calls_logged(log);
  if (!wait_until(120, reaped)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the audit was still running 120 s after SIGINT (calls since: " << calls_logged(log) - at_signal
           << "): " << test::read_text(out);
  }
  const std::string text = test::read_text(out);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 130) << text;  // 128 + SIGINT
  // The call running at the signal may finish, and a draw that calls the kernel twice (its
  // determinism re-run) may make one more; never the property's remaining draws.
  EXPECT_LE(calls_logged(log) - at_signal, 2u) << text;
  const nlohmann::json j = test::read_json(json);
  EXPECT_EQ(j.value("interrupted", ""), "SIGINT") << j.dump(1);
  EXPECT_FALSE(j.value("finished", true)) << j.dump(1);
  size_t stopped = 0;
  for (const auto& c : j.at("cases")) {
    if (c.value("status", "") != "interrupted") continue;
    ++stopped;
    EXPECT_EQ(c.value("property", "").rfind("property:topk.", 0), 0u) << c.dump(1);
    EXPECT_NE(c.value("message", "").find("interrupted by SIGINT"), std::string::npos) << c.dump(1);
  }
  EXPECT_EQ(stopped, 1u) << j.dump(1);
}

}  // namespace
}  // namespace dsa::cli

// run_isolated: results, exceptions, crashes, aborts, exits and hangs of the child all come
// back as an IsolatedResult; the test process keeps going. The child never outlives its
// caller (SIGTERM under InterruptHandlers, SIGKILL of the caller).
#include "dsa/plugin/isolation.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "dsa/oracle/backend.h"
#include "dsa/plugin/findings.h"

namespace dsa::plugin {
namespace {

using namespace std::chrono_literals;

constexpr auto kGenerous = 30s;  // never reached by a passing test; bounds a broken one

// Under AddressSanitizer a SIGSEGV is caught by ASan, which prints "SEGV" and exits 1.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

TEST(RunIsolated, ReturnsTensorsOfEveryDtypeBitExact) {
  Tensor a = Tensor::from_f64({2, 3}, {1.5, -0.0, 3.25, 1e300, -7.0, 0.1});
  Tensor b = Tensor::from_i32({4}, {-1, 0, 7, 2147483647});
  Tensor c = a.to(DType::BF16);
  Tensor empty(DType::F32, {0, 5});
  IsolatedResult r = run_isolated([&] { return std::vector<Tensor>{a, b, c, empty}; }, kGenerous);
  ASSERT_TRUE(r.ok()) << r.message;
  ASSERT_EQ(r.outputs.size(), 4u);
  const Tensor* want[] = {&a, &b, &c, &empty};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.outputs[i].dtype(), want[i]->dtype());
    EXPECT_EQ(r.outputs[i].shape(), want[i]->shape());
    ASSERT_EQ(r.outputs[i].nbytes(), want[i]->nbytes());
    if (want[i]->nbytes()) {
      EXPECT_EQ(0, std::memcmp(r.outputs[i].raw(), want[i]->raw(), want[i]->nbytes()));
    }
  }
}

TEST(RunIsolated, LargeOutputLargerThanAPipeBuffer) {
  Tensor big(DType::F64, {1 << 20});  // 8 MiB: the parent must drain while the child writes
  for (int64_t i = 0; i < big.numel(); i += 4099) big.set(i, static_cast<double>(i));
  IsolatedResult r = run_isolated([&] { return std::vector<Tensor>{big}; }, kGenerous);
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(0, std::memcmp(r.outputs.at(0).raw(), big.raw(), big.nbytes()));
}

TEST(RunIsolated, ExceptionsKeepTheirFamily) {
  IsolatedResult r = run_isolated(
      []() -> std::vector<Tensor> { throw std::invalid_argument("bad q"); }, kGenerous);
  EXPECT_EQ(r.status, IsolatedStatus::Threw);
  EXPECT_EQ(r.thrown, ThrownKind::InvalidArgument);
  EXPECT_EQ(r.message, "bad q");
  EXPECT_THROW(rethrow_in_parent(r, "ctx"), std::invalid_argument);

  r = run_isolated(
      []() -> std::vector<Tensor> { throw dsa::oracle::NotSupported("no bf16"); }, kGenerous);
  EXPECT_EQ(r.thrown, ThrownKind::NotSupported);
  EXPECT_THROW(rethrow_in_parent(r, "ctx"), dsa::oracle::NotSupported);

  r = run_isolated([]() -> std::vector<Tensor> { throw PluginCallError("oom", 3); }, kGenerous);
  EXPECT_EQ(r.thrown, ThrownKind::PluginCallError);
  EXPECT_EQ(r.call_status, 3);
  try {
    rethrow_in_parent(r, "ctx");
    FAIL() << "no throw";
  } catch (const PluginCallError& e) {
    EXPECT_EQ(e.status(), 3);
    EXPECT_STREQ(e.what(), "oom");
  }

  r = run_isolated([]() -> std::vector<Tensor> { throw ContractViolation("overrun"); }, kGenerous);
  EXPECT_THROW(rethrow_in_parent(r, "ctx"), ContractViolation);
  r = run_isolated([]() -> std::vector<Tensor> { throw 42; }, kGenerous);
  EXPECT_EQ(r.thrown, ThrownKind::Other);
  EXPECT_THROW(rethrow_in_parent(r, "ctx"), std::runtime_error);
}

TEST(RunIsolated, SegfaultBecomesCrashedWithItsSignal) {
  IsolatedResult r = run_isolated(
      []() -> std::vector<Tensor> {
        ::raise(SIGSEGV);
        return {};
      },
      kGenerous);
  EXPECT_EQ(r.status, IsolatedStatus::Crashed);
  if (!kAsan) {
    EXPECT_EQ(r.signal, SIGSEGV);
  }
  EXPECT_NE(r.message.find("SEGV"), std::string::npos) << r.message;
  EXPECT_THROW(rethrow_in_parent(r, "plugin 'x': topk_indices"), IsolatedFailure);
}

TEST(RunIsolated, AbortBecomesCrashedAndKeepsTheChildOutput) {
  IsolatedResult r = run_isolated(
      []() -> std::vector<Tensor> {
        std::fprintf(stderr, "assertion failed in my_kernel.cu:42\n");
        std::abort();
      },
      kGenerous);
  EXPECT_EQ(r.status, IsolatedStatus::Crashed);
  EXPECT_EQ(r.signal, SIGABRT);
  EXPECT_NE(r.output_tail.find("my_kernel.cu:42"), std::string::npos) << r.output_tail;
  EXPECT_NE(r.message.find("my_kernel.cu:42"), std::string::npos) << r.message;
}

TEST(RunIsolated, ExitWithoutResultIsACrash) {
  IsolatedResult r = run_isolated(
      []() -> std::vector<Tensor> {
        std::exit(7);
      },
      kGenerous);
  EXPECT_EQ(r.status, IsolatedStatus::Crashed);
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_NE(r.message.find("exited with code 7"), std::string::npos) << r.message;
}

TEST(RunIsolated, HangIsKilledAtTheTimeout) {
  auto start = std::chrono::steady_clock::now();
  IsolatedResult r = run_isolated(
      []() -> std::vector<Tensor> {
        for (;;) ::pause();
      },
      300ms);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.status, IsolatedStatus::TimedOut);
  EXPECT_NE(r.message.find("timed out after 300 ms"), std::string::npos) << r.message;
  EXPECT_LT(took, 10s);
  // The parent keeps going.
  IsolatedResult ok = run_isolated([] { return std::vector<Tensor>{}; }, kGenerous);
  EXPECT_TRUE(ok.ok()) << ok.message;
}

TEST(RunIsolated, HangAfterClosingOutputStillTimesOut) {
  IsolatedResult r = run_isolated(
      []() -> std::vector<Tensor> {
        ::close(STDOUT_FILENO);
        ::close(STDERR_FILENO);
        std::this_thread::sleep_for(1h);
        return {};
      },
      300ms);
  EXPECT_EQ(r.status, IsolatedStatus::TimedOut);
}

TEST(RunIsolated, RejectsANonPositiveTimeout) {
  EXPECT_THROW(run_isolated([] { return std::vector<Tensor>{}; }, 0ms), std::invalid_argument);
}

// A child that writes its pid to `fd`, then hangs.
std::function<std::vector<Tensor>()> report_pid_then_hang(int fd) {
  return [fd]() -> std::vector<Tensor> {
    const pid_t self = ::getpid();
    if (::write(fd, &self, sizeof self) != sizeof self) ::_exit(5);
    for (;;) ::pause();
  };
}

pid_t read_pid(int fd) {
  pid_t pid = 0;
  EXPECT_EQ(::read(fd, &pid, sizeof pid), static_cast<ssize_t>(sizeof pid));
  return pid;
}

// Gone, or a zombie nobody reaped yet.
bool process_ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');
  return close != std::string::npos && line.size() > close + 2 && line[close + 2] == 'Z';
}

bool ends_within(pid_t pid, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!process_ended(pid)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// Issue 14: SIGTERM while a child hangs kills it at once; later calls do not start.
TEST(InterruptHandlers, SigtermKillsTheRunningChildAndStopsLaterCalls) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t child = 0;
  {
    InterruptHandlers handlers;
    std::thread signaller([&] {
      child = read_pid(fds[0]);  // the child is inside fn
      ::kill(::getpid(), SIGTERM);
    });
    IsolatedResult r = run_isolated(report_pid_then_hang(fds[1]), kGenerous);
    signaller.join();
    EXPECT_EQ(r.status, IsolatedStatus::Interrupted) << r.message;
    EXPECT_NE(r.message.find("interrupted by SIGTERM"), std::string::npos) << r.message;
    EXPECT_EQ(handlers.signal(), SIGTERM);
    EXPECT_EQ(interrupt_signal(), SIGTERM);
    ASSERT_GT(child, 0);
    EXPECT_TRUE(process_ended(child));  // reaped before run_isolated returned
    IsolatedResult later = run_isolated([] { return std::vector<Tensor>{}; }, kGenerous);
    EXPECT_EQ(later.status, IsolatedStatus::Interrupted);
    EXPECT_NE(later.message.find("not started"), std::string::npos) << later.message;
    EXPECT_THROW(rethrow_in_parent(later, "ctx"), IsolatedFailure);
    EXPECT_THROW(InterruptHandlers second, std::logic_error);
  }
  ::close(fds[0]);
  ::close(fds[1]);
  // Handlers gone: the record is cleared and calls run again.
  EXPECT_EQ(interrupt_signal(), 0);
  EXPECT_TRUE(run_isolated([] { return std::vector<Tensor>{}; }, kGenerous).ok());
}

// Issue 14: SIGKILL of the caller (nothing runs in it) still ends the child: PR_SET_PDEATHSIG.
TEST(RunIsolated, ChildDiesWithItsParent) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t caller = ::fork();
  ASSERT_GE(caller, 0);
  if (caller == 0) {  // the "auditor": waits on a child that hangs
    run_isolated(report_pid_then_hang(fds[1]), kGenerous);
    ::_exit(0);
  }
  const pid_t child = read_pid(fds[0]);
  ASSERT_GT(child, 0);
  EXPECT_FALSE(process_ended(child));
  ::kill(caller, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(caller, &status, 0), caller);
  EXPECT_TRUE(ends_within(child, 20s)) << "child " << child << " outlived its killed parent";
  if (!process_ended(child)) ::kill(child, SIGKILL);
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace
}  // namespace dsa::plugin

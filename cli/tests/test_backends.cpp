// Backends registered only in the test build of dsa-verify (dsa_verify_test_backends: the
// program's own main, plus these): in-process C++ backends the real program cannot name.
//  - "test:hangs-on-marker": the float64 reference's top-k, except that a call whose scores
//    hold kHangMarker in row 0, column 71 (outside row 0's window in the test's fixture: never
//    selected, so the fixture's expected.* stay right) sleeps forever: an in-process kernel that
//    hangs (CallWatchdog, cli/src/call_watchdog.h).
//  - "test:declines-neg-inf": the float64 reference's top-k, declining (NotSupported) every call
//    whose scores hold a -inf anywhere: a kernel that cannot take the -inf SPEC §2 writes outside
//    every window (§3.1: never selected); INCOMPLETE unless `--unsupported neg_inf_scores`.
//  - "test:slow-topk": the float64 reference's top-k, 0.3 s a call, each call appending one
//    line to the file $DSA_TEST_CALL_LOG names (if set) before it sleeps: a slow in-process
//    kernel whose calls a test can count (an interrupted audit stops after the running call).
//  - "test:flash-bwd-exp2-f32": fresh16's FlashBwdF32 (oracle/tests/flash_bwd_f32.h), a correct
//    FlashAttention-2/3-style sparse MLA whose fp32 backward recomputes P = exp2(...) from its
//    forward's fp32 lse: WEAK (not DISAGREES) on the extreme draws' 2^18-logit rows with fp32
//    inputs (SPEC §9, "P recomputed from the forward's lse").
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <thread>

#include "dsa/oracle/backend.h"
#include "dsa/oracle/reference_backend.h"
#include "flash_bwd_f32.h"

namespace {

using namespace dsa;

constexpr float kHangMarker = 12345.678f;

class HangsOnMarker final : public oracle::Backend {
 public:
  std::string name() const override { return "test:hangs-on-marker"; }
  bool supports(oracle::Op op) const override { return op == oracle::Op::Topk; }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    if (s.dim() == 2 && s.size(0) > 0 && s.size(1) > 71 && s.get(71) == static_cast<double>(kHangMarker))
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    return ref_->select_topk(s, k, p, w);
  }

 private:
  std::unique_ptr<oracle::Backend> ref_ = oracle::make_reference_backend();
};

class DeclinesNegInf final : public oracle::Backend {
 public:
  std::string name() const override { return "test:declines-neg-inf"; }
  bool supports(oracle::Op op) const override { return op == oracle::Op::Topk; }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    for (int64_t i = 0; i < s.numel(); ++i)
      if (s.get(i) == -INFINITY) throw oracle::NotSupported("-inf scores not supported");
    return ref_->select_topk(s, k, p, w);
  }

 private:
  std::unique_ptr<oracle::Backend> ref_ = oracle::make_reference_backend();
};

class SlowTopk final : public oracle::Backend {
 public:
  std::string name() const override { return "test:slow-topk"; }
  bool supports(oracle::Op op) const override { return op == oracle::Op::Topk; }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    if (const char* log = std::getenv("DSA_TEST_CALL_LOG"); log && *log) {
      std::ofstream(log, std::ios::app) << "call\n";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return ref_->select_topk(s, k, p, w);
  }

 private:
  std::unique_ptr<oracle::Backend> ref_ = oracle::make_reference_backend();
};

const bool registered = [] {
  oracle::register_backend("test:flash-bwd-exp2-f32", [] { return std::make_unique<test::FlashBwdF32Kernel>(); });
  oracle::register_backend("test:slow-topk", [] { return std::make_unique<SlowTopk>(); });
  oracle::register_backend("test:declines-neg-inf", [] { return std::make_unique<DeclinesNegInf>(); });
  oracle::register_backend("test:hangs-on-marker", [] { return std::make_unique<HangsOnMarker>(); });
  return true;
}();

}  // namespace

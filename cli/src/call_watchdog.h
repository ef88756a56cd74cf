// A per-call timeout for in-process backends (built-in C++ backends, the Python backend of a
// non-isolated audit). A plugin's calls run in a forked child that is killed at --timeout
// (plugin/isolation.h); an in-process call cannot be killed, so a call past the timeout ends
// the audit instead: the watchdog's monitor thread calls the route's handler, which writes the
// report of every result already computed (the hung call named as a failed case, "timed out
// after N s") and exits the process without waiting for the stuck thread (std::_Exit after
// flushing; no destructor runs, so nothing the stuck call uses is freed under it).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "dsa/oracle/backend.h"

namespace dsa::cli {

/// One per-call timeout, `seconds` (the audit's --timeout, Python's timeout=), as the whole
/// milliseconds that both of its watchers count: CallWatchdog for an in-process backend and the
/// plugin runner's killed-at-timeout child (plugin::PluginOptions::timeout). Rounded to nearest,
/// at least 1 ms. The caller checks the range first (numeric_options.h: 0.001 to 86400 s;
/// Python's check_timeout); this converts only.
inline std::chrono::milliseconds call_timeout(double seconds) {
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::llround(seconds * 1000))));
}

/// A duration in seconds as text for messages ("timed out after 0.25 s", "... after 31.4 s"):
/// three significant digits below 10 s, tenths from 10 s on (a trailing ".0" dropped), so a
/// sub-second value never reads "0 s". `seconds` >= 0 and finite (else printed as %g).
inline std::string seconds_text(double seconds) {
  char buf[64];
  if (!std::isfinite(seconds) || seconds < 0) std::snprintf(buf, sizeof buf, "%g", seconds);
  else if (seconds < 10) std::snprintf(buf, sizeof buf, "%.3g", seconds);
  else std::snprintf(buf, sizeof buf, "%.1f", seconds);
  std::string s = buf;
  if (seconds >= 10 && s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

/// Watches the op calls made through WatchdogBackend. `timeout`: seconds per call (> 0; the
/// audit's --timeout, the same value as a plugin call's). `on_timeout(what, seconds)` runs on
/// the monitor thread for the first call that passes the timeout (`what`: the task label set by
/// ScopedTaskLabel on the calling thread, then the op and backend, e.g. "property:topk.long_rows:
/// topk of backend 'x'"); it is expected not to return (write the reports, then std::_Exit). If
/// it returns, the monitor stops watching. Throws std::invalid_argument for timeout <= 0.
class CallWatchdog {
 public:
  using Handler = std::function<void(const std::string& what, double seconds)>;
  CallWatchdog(std::chrono::milliseconds timeout, Handler on_timeout);
  ~CallWatchdog();
  CallWatchdog(const CallWatchdog&) = delete;
  CallWatchdog& operator=(const CallWatchdog&) = delete;

  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Registers a call (what: op and backend) until the returned guard is destroyed.
  class Call {
   public:
    Call(CallWatchdog& w, const std::string& what);
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    CallWatchdog& w_;
    uint64_t id_;
  };

 private:
  struct Active {
    std::chrono::steady_clock::time_point deadline;
    std::chrono::steady_clock::time_point start;
    std::string what;
  };
  void monitor();
  const std::chrono::milliseconds timeout_;
  Handler on_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Active> active_;
  uint64_t next_id_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

/// Sets the label of the task this thread runs (e.g. "golden:topk_mtp", "property:topk.long_rows")
/// while alive; CallWatchdog names it in the timeout message.
class ScopedTaskLabel {
 public:
  explicit ScopedTaskLabel(std::string label);
  ~ScopedTaskLabel();
  ScopedTaskLabel(const ScopedTaskLabel&) = delete;
  ScopedTaskLabel& operator=(const ScopedTaskLabel&) = delete;
  /// The label of the task this thread runs ("" outside one).
  static const std::string& current();

 private:
  std::string previous_;
};

/// A backend whose every op call is watched by `watchdog` (owned backend, or a borrowed one);
/// everything else is forwarded. Use for in-process backends only: a plugin's calls have their
/// own timeout (isolated children).
class WatchdogBackend final : public oracle::Backend {
 public:
  WatchdogBackend(std::unique_ptr<oracle::Backend> inner, CallWatchdog& watchdog);
  WatchdogBackend(oracle::Backend& inner, CallWatchdog& watchdog);
  std::string name() const override { return inner_->name(); }
  std::string unavailable_reason() const override { return inner_->unavailable_reason(); }
  bool deterministic() const override { return inner_->deterministic(); }
  bool computes_reference() const override { return inner_->computes_reference(); }
  bool supports(oracle::Op op) const override { return inner_->supports(op); }
  std::optional<std::set<std::string>> provided_outputs() const override { return inner_->provided_outputs(); }
  oracle::RoundingModel rounding_model() const override { return inner_->rounding_model(); }
  bool fp8_reduced_accumulation() const override { return inner_->fp8_reduced_accumulation(); }
  oracle::CallFailure classify_failure(const std::exception& e) const override { return inner_->classify_failure(e); }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override;
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win,
                                       const Tensor& d) override;
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override;
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override;
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override;
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override;
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override;
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override;
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override;

 private:
  std::string what(oracle::Op op) const;
  std::unique_ptr<oracle::Backend> owned_;
  oracle::Backend* inner_;
  CallWatchdog& watchdog_;
};

}  // namespace dsa::cli

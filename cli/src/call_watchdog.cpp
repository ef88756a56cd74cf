#include "call_watchdog.h"

#include <stdexcept>
#include <utility>

namespace dsa::cli {

namespace {
thread_local std::string g_task_label;
}  // namespace

ScopedTaskLabel::ScopedTaskLabel(std::string label) : previous_(std::move(g_task_label)) {
  g_task_label = std::move(label);
}
ScopedTaskLabel::~ScopedTaskLabel() { g_task_label = std::move(previous_); }
const std::string& ScopedTaskLabel::current() { return g_task_label; }

CallWatchdog::CallWatchdog(std::chrono::milliseconds timeout, Handler on_timeout)
    : timeout_(timeout), on_timeout_(std::move(on_timeout)) {
  if (timeout.count() <= 0)
    throw std::invalid_argument("CallWatchdog: argument 'timeout' got " + std::to_string(timeout.count()) +
                                " ms, expected > 0");
  thread_ = std::thread([this] { monitor(); });
}

CallWatchdog::~CallWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CallWatchdog::Call::Call(CallWatchdog& w, const std::string& what) : w_(w) {
  const auto now = std::chrono::steady_clock::now();
  const std::string& task = ScopedTaskLabel::current();
  {
    std::lock_guard<std::mutex> lock(w_.mu_);
    id_ = w_.next_id_++;
    w_.active_[id_] = Active{now + w_.timeout_, now, task.empty() ? what : task + ": " + what};
  }
  w_.cv_.notify_all();  // the monitor may wait for an earlier deadline than this one: harmless
}

CallWatchdog::Call::~Call() {
  std::lock_guard<std::mutex> lock(w_.mu_);
  w_.active_.erase(id_);
}

void CallWatchdog::monitor() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    auto next = std::chrono::steady_clock::time_point::max();
    for (const auto& [id, a] : active_) next = std::min(next, a.deadline);
    if (next == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock);
      continue;
    }
    if (std::chrono::steady_clock::now() < next) {
      cv_.wait_until(lock, next);
      continue;
    }
    // The earliest deadline has passed and its call is still registered: it hung.
    for (const auto& [id, a] : active_) {
      if (a.deadline != next) continue;
      const std::string what = a.what;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - a.start).count();
      lock.unlock();
      on_timeout_(what, secs);  // normally does not return (reports written, process ended)
      return;
    }
  }
}

WatchdogBackend::WatchdogBackend(std::unique_ptr<oracle::Backend> inner, CallWatchdog& watchdog)
    : owned_(std::move(inner)), inner_(owned_.get()), watchdog_(watchdog) {}
WatchdogBackend::WatchdogBackend(oracle::Backend& inner, CallWatchdog& watchdog)
    : inner_(&inner), watchdog_(watchdog) {}

std::string WatchdogBackend::what(oracle::Op op) const {
  return std::string(oracle::to_string(op)) + " call of backend '" + inner_->name() + "'";
}

Tensor WatchdogBackend::indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) {
  CallWatchdog::Call c(watchdog_, what(oracle::Op::IndexerScores));
  return inner_->indexer_scores(q, k, w, win);
}
IndexerGrads WatchdogBackend::indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                                      const KeyWindows& win, const Tensor& d) {
  CallWatchdog::Call c(watchdog_, what(oracle::Op::IndexerScoresBackward));
  return inner_->indexer_scores_backward(q, k, w, win, d);
}
Tensor WatchdogBackend::select_topk(const Tensor& s, int64_t k, const TopkPolicy& p,
                                    const std::optional<KeyWindows>& w) {
  CallWatchdog::Call c(watchdog_, what(oracle::Op::Topk));
  return inner_->select_topk(s, k, p, w);
}
SparseMlaForward WatchdogBackend::sparse_mla_forward(const SparseMlaInputs& in) {
  CallWatchdog::Call c(watchdog_, what(oracle::Op::SparseMlaFwd));
  return inner_->sparse_mla_forward(in);
}
SparseMlaGrads WatchdogBackend::sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) {
  CallWatchdog::Call c(watchdog_, what(oracle::Op::SparseMlaBwd));
  return inner_->sparse_mla_backward(in, dout);
}
IndexerKlResult WatchdogBackend::indexer_kl_loss(const IndexerKlInputs& in) {
  CallWatchdog::Call c(watchdog_, what(oracle::Op::IndexerKlLoss));
  return inner_->indexer_kl_loss(in);
}
Tensor WatchdogBackend::fp8_indexer_scores(const Fp8IndexerInputs& in) {
  CallWatchdog::Call c(watchdog_, what(oracle::Op::Fp8IndexerScores));
  return inner_->fp8_indexer_scores(in);
}
Tensor WatchdogBackend::paged_indexer_scores(const PagedIndexerInputs& in) {
  CallWatchdog::Call c(watchdog_, what(oracle::Op::PagedIndexerScores));
  return inner_->paged_indexer_scores(in);
}
SparseMlaForward WatchdogBackend::sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) {
  CallWatchdog::Call c(watchdog_, what(oracle::Op::SparseMlaFp8Fwd));
  return inner_->sparse_mla_fp8_forward(in);
}

}  // namespace dsa::cli

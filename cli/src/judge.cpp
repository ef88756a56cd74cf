#include "judge.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/fixture_check.h"

namespace dsa::cli {

std::vector<std::string> parse_output_names(const std::vector<std::string>& names,
                                            const std::string& flag) {
  const auto& known = oracle::all_output_names();
  std::vector<std::string> out;
  for (const auto& n : names) {
    if (!std::binary_search(known.begin(), known.end(), n)) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      throw std::invalid_argument("argument '" + flag + "' got \"" + n + "\", expected output names (" +
                                  list + ")");
    }
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  if (out.empty()) throw std::invalid_argument("argument '" + flag + "' names no output");
  return out;
}

oracle::CheckOptions check_options(const JudgeOptions& j, bool file_route) {
  oracle::CheckOptions o;
  o.check_determinism = !file_route;
  o.allow_weak = j.allow_weak;
  if (j.outputs) o.provided_outputs.emplace(j.outputs->begin(), j.outputs->end());
  return o;
}

namespace {

class ProvidedOutputsBackend : public oracle::Backend {
 public:
  ProvidedOutputsBackend(std::unique_ptr<oracle::Backend> inner, std::set<std::string> outputs)
      : inner_(std::move(inner)), outputs_(std::move(outputs)) {
    if (auto declared = inner_->provided_outputs()) {
      std::set<std::string> both;
      for (const auto& n : outputs_)
        if (declared->count(n)) both.insert(n);
      outputs_ = both;
    }
  }
  std::string name() const override { return inner_->name(); }
  std::string unavailable_reason() const override { return inner_->unavailable_reason(); }
  bool deterministic() const override { return inner_->deterministic(); }
  bool supports(oracle::Op op) const override { return inner_->supports(op); }
  std::optional<std::set<std::string>> provided_outputs() const override { return outputs_; }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return inner_->indexer_scores(q, k, w, win);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    return inner_->indexer_scores_backward(q, k, w, win, d);
  }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p,
                     const std::optional<KeyWindows>& win) override {
    return inner_->select_topk(s, k, p, win);
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    return inner_->sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    return inner_->sparse_mla_backward(in, dout);
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override { return inner_->indexer_kl_loss(in); }

 private:
  std::unique_ptr<oracle::Backend> inner_;
  std::set<std::string> outputs_;
};

}  // namespace

std::unique_ptr<oracle::Backend> with_provided_outputs(std::unique_ptr<oracle::Backend> inner,
                                                       std::set<std::string> outputs) {
  return std::make_unique<ProvidedOutputsBackend>(std::move(inner), std::move(outputs));
}

int exit_code(const std::vector<oracle::OpReport>& reports) {
  return oracle::overall_verdict(reports) == oracle::Verdict::Pass ? kExitOk : kExitDisagree;
}

nlohmann::json reports_json(const std::vector<oracle::OpReport>& reports) {
  auto num = [](double v) -> nlohmann::json {
    if (std::isnan(v)) return nullptr;
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return v;
  };
  nlohmann::json j;
  j["verdict"] = oracle::verdict_line(reports);
  j["exit_code"] = exit_code(reports);
  j["ops"] = nlohmann::json::array();
  for (const auto& r : reports) {
    nlohmann::json o;
    o["op"] = r.op;
    o["backend"] = r.backend;
    o["verdict"] = oracle::to_string(r.verdict);
    o["reason"] = r.reason;
    o["notes"] = r.notes;
    o["not_judged"] = r.not_judged;
    o["topk_violations"] = r.topk_violations.size();
    o["outputs"] = nlohmann::json::array();
    for (const auto& t : r.tensors)
      o["outputs"].push_back({{"name", t.name},
                              {"dtype", dtype_name(t.dtype)},
                              {"passed", t.passed},
                              {"max_abs", num(t.metrics.max_abs)},
                              {"bound", num(t.bound)},
                              {"baseline_err", num(t.baseline_err)},
                              {"floor", num(t.floor)},
                              {"ratio", num(t.ratio)},
                              {"message", t.message}});
    j["ops"].push_back(o);
  }
  return j;
}

}  // namespace dsa::cli

// Registry of named backends and the NotSupported defaults of dsa::oracle::Backend.
#include "dsa/oracle/backend.h"
#include "dsa/oracle/second_run.h"

#include <map>
#include <mutex>

namespace dsa::oracle {

const char* to_string(Op op) {
  switch (op) {
    case Op::IndexerScores: return "indexer_scores";
    case Op::IndexerScoresBackward: return "indexer_scores_backward";
    case Op::Topk: return "topk";
    case Op::SparseMlaFwd: return "sparse_mla_fwd";
    case Op::SparseMlaBwd: return "sparse_mla_bwd";
    case Op::IndexerKlLoss: return "indexer_kl_loss";
    case Op::Fp8IndexerScores: return "fp8_indexer_scores";
    case Op::PagedIndexerScores: return "paged_indexer_scores";
    case Op::SparseMlaFp8Fwd: return "sparse_mla_fp8_fwd";
  }
  return "?";
}

const std::vector<Op>& all_ops() {
  static const std::vector<Op> ops = {Op::IndexerScores, Op::IndexerScoresBackward, Op::Topk,
                                      Op::SparseMlaFwd,  Op::SparseMlaBwd,          Op::IndexerKlLoss,
                                      Op::Fp8IndexerScores, Op::PagedIndexerScores, Op::SparseMlaFp8Fwd};
  return ops;
}

const std::vector<std::string>& op_output_names(Op op) {
  static const std::map<Op, std::vector<std::string>> names = {
      {Op::IndexerScores, {"scores"}},
      {Op::IndexerScoresBackward, {"dq_idx", "dk_idx", "dw"}},
      {Op::Topk, {"indices"}},
      {Op::SparseMlaFwd, {"out", "lse", "max_logits"}},
      {Op::SparseMlaBwd, {"dq", "dkv", "dsink"}},
      {Op::IndexerKlLoss, {"loss", "d_scores"}},
      {Op::Fp8IndexerScores, {"scores"}},
      {Op::PagedIndexerScores, {"scores"}},
      {Op::SparseMlaFp8Fwd, {"out", "lse", "max_logits"}}};
  return names.at(op);
}

namespace {
[[noreturn]] void not_supported(const Backend& b, Op op) {
  throw NotSupported(b.name() + ": op " + to_string(op) + " is not implemented");
}

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

Tensor Backend::indexer_scores(const Tensor&, const Tensor&, const Tensor&, const KeyWindows&) {
  not_supported(*this, Op::IndexerScores);
}
IndexerGrads Backend::indexer_scores_backward(const Tensor&, const Tensor&, const Tensor&,
                                              const KeyWindows&, const Tensor&) {
  not_supported(*this, Op::IndexerScoresBackward);
}
Tensor Backend::select_topk(const Tensor&, int64_t, const TopkPolicy&,
                            const std::optional<KeyWindows>&) {
  not_supported(*this, Op::Topk);
}
SparseMlaForward Backend::sparse_mla_forward(const SparseMlaInputs&) {
  not_supported(*this, Op::SparseMlaFwd);
}
SparseMlaGrads Backend::sparse_mla_backward(const SparseMlaInputs&, const Tensor&) {
  not_supported(*this, Op::SparseMlaBwd);
}
IndexerKlResult Backend::indexer_kl_loss(const IndexerKlInputs&) {
  not_supported(*this, Op::IndexerKlLoss);
}
Tensor Backend::fp8_indexer_scores(const Fp8IndexerInputs&) {
  not_supported(*this, Op::Fp8IndexerScores);
}
Tensor Backend::paged_indexer_scores(const PagedIndexerInputs&) {
  not_supported(*this, Op::PagedIndexerScores);
}
SparseMlaForward Backend::sparse_mla_fp8_forward(const SparseMlaFp8Inputs&) {
  not_supported(*this, Op::SparseMlaFp8Fwd);
}

namespace {
thread_local SecondRunScope* current_second_run = nullptr;
}  // namespace

SecondRunScope::SecondRunScope() : previous_(current_second_run) { current_second_run = this; }
SecondRunScope::~SecondRunScope() { current_second_run = previous_; }
bool SecondRunScope::active() { return current_second_run != nullptr; }
void SecondRunScope::note(const std::string& how) {
  if (current_second_run != nullptr) current_second_run->how_ = how;
}
const std::string& SecondRunScope::how() const { return how_; }

void register_backend(const std::string& name, BackendFactory factory) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> backend_names() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& kv : r.factories) names.push_back(kv.first);
  return names;
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  BackendFactory factory;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      std::string known;
      for (const auto& kv : r.factories) known += (known.empty() ? "" : ", ") + kv.first;
      throw std::invalid_argument("make_backend: unknown backend '" + name + "' (known: " +
                                  (known.empty() ? std::string("none") : known) + ")");
    }
    factory = it->second;
  }
  return factory();
}

}  // namespace dsa::oracle

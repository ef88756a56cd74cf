// Stored outputs as a Backend: the one candidate of every file route (compare, fixtures
// check, replay of a file, the Python route).
#include "dsa/oracle/candidate_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "dsa/contract/errors.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/fixtures/safetensors.h"

namespace dsa::oracle {

using fixtures::Convention;

const std::vector<std::string>& all_output_names() {
  static const std::vector<std::string> all = [] {
    std::set<std::string> s;
    for (Op op : all_ops())
      for (const auto& n : op_output_names(op)) s.insert(n);
    return std::vector<std::string>(s.begin(), s.end());
  }();
  return all;
}

CandidateBackend::CandidateBackend(std::map<std::string, Tensor> outputs, std::string label,
                                   std::vector<Convention> conventions, std::string name)
    : outputs_(std::move(outputs)),
      label_(std::move(label)),
      name_(std::move(name)),
      conventions_(std::move(conventions)) {}

bool CandidateBackend::supports(Op op) const { return !stored_outputs(op).empty(); }

std::vector<std::string> CandidateBackend::stored_outputs(Op op) const {
  std::vector<std::string> out;
  for (const auto& n : op_output_names(op))
    if (has(n)) out.push_back(n);
  return out;
}

bool CandidateBackend::uses(Convention c) const {
  return std::find(conventions_.begin(), conventions_.end(), c) != conventions_.end();
}

Tensor CandidateBackend::get(const std::string& n) const {
  auto it = outputs_.find(n);
  return it == outputs_.end() ? Tensor() : it->second;
}

void CandidateBackend::need(Op op) const {
  if (!supports(op)) throw NotSupported(label_ + ": holds no outputs for " + to_string(op));
}

void CandidateBackend::note(const std::string& line) {
  if (std::find(notes_.begin(), notes_.end(), line) == notes_.end()) notes_.push_back(line);
}

Tensor CandidateBackend::indexer_scores(const Tensor&, const Tensor&, const Tensor&,
                                        const KeyWindows&) {
  need(Op::IndexerScores);
  return get("scores");
}

IndexerGrads CandidateBackend::indexer_scores_backward(const Tensor&, const Tensor&,
                                                       const Tensor&, const KeyWindows&,
                                                       const Tensor&) {
  need(Op::IndexerScoresBackward);
  return IndexerGrads{get("dq_idx"), get("dk_idx"), get("dw")};
}

Tensor CandidateBackend::select_topk(const Tensor& scores, int64_t k, const TopkPolicy&,
                                     const std::optional<KeyWindows>&) {
  need(Op::Topk);
  Tensor idx = get("indices");
  const std::string before = shape_str(idx.shape());
  if (uses(Convention::IdsSq1K) && idx.dim() == 3 && idx.size(1) == 1) {
    idx = idx.reshaped({idx.size(0), idx.size(2)});
    note("ids_s_q_1_k: indices " + before + " viewed as " + shape_str(idx.shape()));
  }
  if (uses(Convention::Int64Ids) && idx.dtype() == DType::I64) {
    Tensor narrow(DType::I32, idx.shape());
    const int64_t* src = idx.data<int64_t>();
    int64_t unrepresentable = 0;
    for (int64_t i = 0; i < idx.numel(); ++i) {
      const bool fits = src[i] >= std::numeric_limits<int32_t>::min() &&
                        src[i] <= std::numeric_limits<int32_t>::max();
      unrepresentable += !fits;
      narrow.data<int32_t>()[i] =
          fits ? static_cast<int32_t>(src[i]) : std::numeric_limits<int32_t>::min();
    }
    idx = narrow;
    note("int64_ids: I64 indices narrowed to I32" +
         (unrepresentable ? " (" + std::to_string(unrepresentable) +
                                " id(s) outside int32 became INT32_MIN: out of range)"
                          : std::string()));
  }
  if (uses(Convention::TopkWidthMinKSkv) && scores.dim() == 2 && idx.dim() == 2) {
    const int64_t narrowed = std::min(k, scores.size(1));
    if (narrowed < k && idx.size(1) == narrowed) {
      Tensor wide(idx.dtype(), {idx.size(0), k});
      for (int64_t t = 0; t < idx.size(0); ++t)
        for (int64_t j = 0; j < k; ++j)
          wide.set(t * k + j, j < narrowed ? idx.get(t * narrowed + j) : -1.0);
      note("topk_width_min_k_s_kv: indices " + shape_str(idx.shape()) + " padded with -1 to " +
           shape_str(wide.shape()));
      idx = wide;
    }
  }
  return idx;
}

Tensor CandidateBackend::fp8_indexer_scores(const Fp8IndexerInputs&) {
  need(Op::Fp8IndexerScores);
  return get("scores");
}

Tensor CandidateBackend::paged_indexer_scores(const PagedIndexerInputs&) {
  need(Op::PagedIndexerScores);
  return get("scores");
}

SparseMlaForward CandidateBackend::sparse_mla_fp8_forward(const SparseMlaFp8Inputs&) {
  need(Op::SparseMlaFp8Fwd);
  return stored_forward();
}

SparseMlaForward CandidateBackend::sparse_mla_forward(const SparseMlaInputs&) {
  need(Op::SparseMlaFwd);
  return stored_forward();
}

SparseMlaForward CandidateBackend::stored_forward() {
  SparseMlaForward r{get("out"), get("lse"), get("max_logits")};
  if (uses(Convention::LseBase2)) {
    // log2-based: ln x = log2 x · ln 2, one rounding in the candidate's own dtype.
    for (Tensor* t : {&r.lse, &r.max_logits}) {
      if (!t->defined()) continue;
      Tensor c(t->dtype(), t->shape());
      for (int64_t i = 0; i < t->numel(); ++i) c.set(i, t->get(i) * std::log(2.0));
      *t = c;
    }
    note("lse_base2: lse and max_logits multiplied by ln 2");
  }
  return r;
}

SparseMlaGrads CandidateBackend::sparse_mla_backward(const SparseMlaInputs&, const Tensor&) {
  need(Op::SparseMlaBwd);
  SparseMlaGrads g{get("dq"), get("dkv"), std::nullopt};
  if (has("dsink")) g.dsink = get("dsink");
  return g;
}

IndexerKlResult CandidateBackend::indexer_kl_loss(const IndexerKlInputs&) {
  need(Op::IndexerKlLoss);
  return IndexerKlResult{get("loss"), get("d_scores")};
}

std::unique_ptr<CandidateBackend> load_candidate_file(const std::string& path,
                                                      const std::vector<Convention>& conventions,
                                                      std::vector<std::string>* ignored) {
  fixtures::SafetensorsFile file = fixtures::read_safetensors(path);
  std::vector<Convention> conv = conventions;
  // The golden's rule (fixtures::parse_conventions_field): names applied, a JSON object kept
  // as free text and never applied, anything else a FileError. Before, text that was not a
  // JSON array was ignored silently here (fresh20 F1: a bare `lse_base2` made a correct base-2
  // lse DISAGREE with no word on the field).
  if (auto it = file.metadata.find("conventions"); it != file.metadata.end())
    for (Convention c : fixtures::parse_conventions_field(it->second, path).names)
      if (std::find(conv.begin(), conv.end(), c) == conv.end()) conv.push_back(c);
  const auto& known = all_output_names();
  std::map<std::string, Tensor> outputs;
  for (auto& [name, t] : file.tensors) {
    const std::string base = name.rfind("expected.", 0) == 0 ? name.substr(9) : name;
    if (!std::binary_search(known.begin(), known.end(), base)) {
      if (ignored) ignored->push_back(name);
      continue;
    }
    if (!outputs.emplace(base, t).second)
      throw fixtures::FileError(path, "holds output '" + base + "' twice (as '" + base +
                                          "' and 'expected." + base + "')");
  }
  if (outputs.empty()) {
    std::string list;
    for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
    throw fixtures::FileError(path, "holds none of the output tensors (" + list + ")");
  }
  return std::make_unique<CandidateBackend>(std::move(outputs), path, std::move(conv));
}

}  // namespace dsa::oracle

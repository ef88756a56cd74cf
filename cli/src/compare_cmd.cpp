// `dsa-verify compare`: an external kernel's outputs, saved as safetensors, judged against a
// golden fixture by the oracle. The candidate file is wrapped as a Backend that returns its
// tensors, so it passes through exactly the checks a built-in backend does; convention
// adapters are explicit flags and never loosen a tolerance (SPEC §9, §3.6).
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "commands.h"
#include "dsa/contract/errors.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/topk_check.h"

namespace dsa::cli {
namespace {

using oracle::Op;

class CandidateFileBackend : public oracle::Backend {
 public:
  CandidateFileBackend(fixtures::SafetensorsFile file, std::string label, CompareAdapters adapters)
      : file_(std::move(file)), label_(std::move(label)), adapters_(adapters) {}

  std::string name() const override { return "candidate-file"; }
  // The file holds one output per tensor: running twice returns the same bytes.
  bool deterministic() const override { return true; }

  bool supports(Op op) const override {
    switch (op) {
      case Op::IndexerScores: return has({"scores"});
      case Op::IndexerScoresBackward: return any({"dq_idx", "dk_idx", "dw"});
      case Op::Topk: return has({"indices"});
      case Op::SparseMlaFwd: return any({"out", "lse", "max_logits"});
      case Op::SparseMlaBwd: return any({"dq", "dkv", "dsink"});
      case Op::IndexerKlLoss: return any({"loss", "d_scores"});
    }
    return false;
  }

  Tensor indexer_scores(const Tensor&, const Tensor&, const Tensor&, const KeyWindows&) override {
    need(Op::IndexerScores);
    return get("scores");
  }
  IndexerGrads indexer_scores_backward(const Tensor&, const Tensor&, const Tensor&,
                                       const KeyWindows&, const Tensor&) override {
    need(Op::IndexerScoresBackward);
    return IndexerGrads{get("dq_idx"), get("dk_idx"), get("dw")};
  }
  Tensor select_topk(const Tensor&, int64_t k, const TopkPolicy&,
                     const std::optional<KeyWindows>&) override {
    need(Op::Topk);
    Tensor idx = get("indices");
    if (adapters_.indices_3d) {
      if (idx.dim() != 3 || idx.size(1) != 1)
        throw fixtures::FileError(label_, "--indices-3d: 'indices' has shape " +
                                              shape_str(idx.shape()) + ", expected [s_q, 1, k]");
      idx = idx.reshaped({idx.size(0), idx.size(2)});
    }
    if (adapters_.int64_ids) {
      if (idx.dtype() != DType::I64)
        throw fixtures::FileError(label_, std::string("--int64-ids: 'indices' has dtype ") +
                                              dtype_name(idx.dtype()) + ", expected I64");
      Tensor narrow(DType::I32, idx.shape());
      const int64_t* src = idx.data<int64_t>();
      for (int64_t i = 0; i < idx.numel(); ++i) {
        if (src[i] < std::numeric_limits<int32_t>::min() || src[i] > std::numeric_limits<int32_t>::max())
          throw fixtures::FileError(label_, "--int64-ids: index " + std::to_string(src[i]) +
                                                " at flat position " + std::to_string(i) +
                                                " does not fit in int32");
        narrow.data<int32_t>()[i] = static_cast<int32_t>(src[i]);
      }
      idx = narrow;
    }
    if (adapters_.narrowed_topk_width) idx = oracle::adapt_topk_width(idx, k);
    return idx;
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs&) override {
    need(Op::SparseMlaFwd);
    SparseMlaForward r{get("out"), get("lse"), get("max_logits")};
    if (adapters_.lse_base2) {
      // log2-based: lse = lse2 · ln 2 (one rounding in the candidate's dtype).
      for (Tensor* t : {&r.lse, &r.max_logits})
        if (t->defined()) for (int64_t i = 0; i < t->numel(); ++i) t->set(i, t->get(i) * std::log(2.0));
    }
    return r;
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs&, const Tensor&) override {
    need(Op::SparseMlaBwd);
    SparseMlaGrads g{get("dq"), get("dkv"), std::nullopt};
    if (file_.tensors.count("dsink")) g.dsink = get("dsink");
    return g;
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs&) override {
    need(Op::IndexerKlLoss);
    return IndexerKlResult{get("loss"), get("d_scores")};
  }

 private:
  bool has(std::initializer_list<const char*> names) const {
    for (const char* n : names)
      if (!file_.tensors.count(n)) return false;
    return true;
  }
  // Kernels often return only some outputs (no max_logits, say): the op is run and what is
  // missing is Incomplete unless CheckOptions::provided_outputs names what is provided.
  bool any(std::initializer_list<const char*> names) const {
    for (const char* n : names)
      if (file_.tensors.count(n)) return true;
    return false;
  }
  void need(Op op) const {
    if (!supports(op))
      throw oracle::NotSupported(label_ + ": holds no outputs for " + oracle::to_string(op));
  }
  Tensor get(const std::string& n) const {
    auto it = file_.tensors.find(n);
    return it == file_.tensors.end() ? Tensor() : it->second;
  }

  fixtures::SafetensorsFile file_;
  std::string label_;
  CompareAdapters adapters_;
};

const std::set<std::string> kOutputNames = {"scores", "dq_idx", "dk_idx", "dw", "indices", "out",
                                            "lse", "max_logits", "dq", "dkv", "dsink", "loss",
                                            "d_scores"};

}  // namespace

int run_compare(const std::string& golden, const std::string& candidate,
                const CompareAdapters& adapters) {
  fixtures::Fixture f = fixtures::load_fixture(golden);
  fixtures::SafetensorsFile cand = fixtures::read_safetensors(candidate);
  size_t known = 0;
  for (const auto& [name, t] : cand.tensors) {
    std::string base = name.rfind("expected.", 0) == 0 ? name.substr(9) : name;
    if (kOutputNames.count(base)) ++known;
    else std::printf("note: %s: tensor '%s' is not an output name; ignored\n", candidate.c_str(), name.c_str());
  }
  // Accept outputs saved as `expected.<name>` as well as plain `<name>`.
  fixtures::SafetensorsFile outputs;
  for (auto& [name, t] : cand.tensors)
    outputs.tensors[name.rfind("expected.", 0) == 0 ? name.substr(9) : name] = t;
  if (known == 0)
    throw fixtures::FileError(candidate, "holds none of the output tensors (out, lse, max_logits, "
                                         "dq, dkv, dsink, indices, scores, dq_idx, dk_idx, dw, "
                                         "loss, d_scores)");
  // Adapters are named in the report: they convert a convention, never loosen a check.
  if (adapters.lse_base2) std::printf("adapter: --lse-base2: candidate lse and max_logits multiplied by ln 2\n");
  if (adapters.narrowed_topk_width) std::printf("adapter: --narrowed-topk-width: candidate indices padded with -1 to k columns\n");
  if (adapters.int64_ids) std::printf("adapter: --int64-ids: candidate I64 indices narrowed to I32 (range-checked)\n");
  if (adapters.indices_3d) std::printf("adapter: --indices-3d: candidate [s_q, 1, k] indices viewed as [s_q, k]\n");
  CandidateFileBackend backend(std::move(outputs), candidate, adapters);
  oracle::CheckOptions opt;
  opt.check_determinism = false;  // a file returns the same bytes twice by construction
  oracle::FixtureReport r = oracle::check_fixture(f, &backend, opt);
  std::printf("%s\n", oracle::format_fixture_report(r).c_str());
  bool judged = false;
  for (const auto& op : r.backend_vs_reference) judged |= op.verdict != oracle::Verdict::Skip;
  if (!judged)
    throw fixtures::FileError(candidate, "holds no outputs for the golden's op " + f.op);
  std::printf("compare: %s\n", r.passed() ? "AGREES" : "DISAGREES");
  return r.passed() ? kExitOk : kExitDisagree;
}

}  // namespace dsa::cli

#include "py_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "dlpack_capsule.h"
#include "dsa/contract/errors.h"
#include "dsa/contract/fp8.h"

namespace py = pybind11;

namespace dsa::python {

using oracle::Op;

namespace {

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t(DType::I64, {static_cast<int64_t>(v.size())});
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

// The output width of a paged case: max_context, or the largest context when it is -1
// (PagedIndexerInputs). Bad context_lens are left to the reference and the backend to reject.
int64_t paged_max_context(const PagedIndexerInputs& in) {
  if (in.max_context >= 0) return in.max_context;
  int64_t m = 0;
  for (int64_t b = 0; b < in.context_lens.numel(); ++b)
    m = std::max<int64_t>(m, static_cast<int64_t>(in.context_lens.get(b)));
  return m;
}

// What one output must look like (SPEC shapes; `ids`: int32 top-k indices, else floating).
struct OutputRule {
  std::string name;
  std::vector<int64_t> shape;
  bool ids = false;
  const char* spec = "";
};

std::vector<OutputRule> output_rules(Op op, const oracle::OpCase& c) {
  switch (op) {
    case Op::IndexerScores:
      return {{"scores", {c.q_idx.size(0), c.k_idx.size(0)}, false, "SPEC §2: [s_q, s_kv] fp32"}};
    case Op::IndexerScoresBackward:
      return {{"dq_idx", c.q_idx.shape(), false, "SPEC §2: shape of q_idx"},
              {"dk_idx", c.k_idx.shape(), false, "SPEC §2: shape of k_idx"},
              {"dw", c.w.shape(), false, "SPEC §2: shape of w"}};
    case Op::Topk:
      return {{"indices", {c.scores.size(0), c.k}, true, "SPEC §3: [s_q, k] int32, -1 padded"}};
    case Op::SparseMlaFwd: {
      const int64_t s_q = c.mla.q.size(0), h_q = c.mla.q.size(1);
      return {{"out", {s_q, h_q, c.mla.d_v}, false, "SPEC §4: [s_q, h_q, d_v]"},
              {"lse", {s_q, h_q}, false, "SPEC §4: [s_q, h_q] fp32, natural log"},
              {"max_logits", {s_q, h_q}, false, "SPEC §4: [s_q, h_q] fp32"}};
    }
    case Op::SparseMlaBwd: {
      std::vector<OutputRule> r = {{"dq", c.mla.q.shape(), false, "SPEC §5: shape of q"},
                                   {"dkv", c.mla.kv.shape(), false, "SPEC §5: shape of kv"}};
      if (c.mla.attn_sink) r.push_back({"dsink", {c.mla.q.size(1)}, false, "SPEC §5: [h_q]"});
      return r;
    }
    case Op::IndexerKlLoss:
      return {{"loss", {1}, false, "SPEC §7: one value, [1] or []"},
              {"d_scores", c.kl.scores.shape(), false, "SPEC §7: shape of scores"}};
    case Op::Fp8IndexerScores:
      return {{"scores", {c.fp8_indexer.q_idx.size(0), c.fp8_indexer.k_idx.size(0)}, false,
               "SPEC §10: [s_q, s_kv] fp32"}};
    case Op::PagedIndexerScores: {
      const PagedIndexerInputs& in = c.paged_indexer;
      return {{"scores", {in.q_idx.size(0) * in.q_idx.size(1), paged_max_context(in)}, false,
               "SPEC §10: [batch * next_n, max_context] fp32"}};
    }
    case Op::SparseMlaFp8Fwd: {
      const int64_t s_q = c.mla_fp8.q.size(0), h_q = c.mla_fp8.q.size(1);
      return {{"out", {s_q, h_q, kMlaFp8NopeDim}, false, "SPEC §10/§4: [s_q, h_q, 512]"},
              {"lse", {s_q, h_q}, false, "SPEC §10/§4: [s_q, h_q] fp32, natural log"},
              {"max_logits", {s_q, h_q}, false, "SPEC §10/§4: [s_q, h_q] fp32"}};
    }
  }
  throw std::invalid_argument("output_rules: unknown op");
}

// Calls the bridge for one op and returns the checked outputs by name (a declared-absent
// output is missing from the map).
std::map<std::string, Tensor> call(const py::object& bridge, const std::string& backend_name, Op op,
                                   const oracle::OpCase& c) {
  if (stop_requested().load())  // the audit was stopped: the kernel is not called again
    throw oracle::NotSupported("not run: the audit was interrupted");
  py::gil_scoped_acquire gil;
  const std::string op_name = oracle::to_string(op);
  OpArgs args = op_args(op, c);
  const std::vector<OutputRule> rules = output_rules(op, c);
  py::dict tensors;
  std::vector<std::pair<const Tensor*, std::shared_ptr<Tensor>>> handed;
  for (auto& [name, t] : args.tensors) {
    auto copy = std::make_shared<Tensor>(t);  // the backend's copy; `t` stays to detect writes
    tensors[py::str(name)] = to_capsule(copy);
    handed.push_back({&t, copy});
  }
  for (const auto& name : args.none) tensors[py::str(name)] = py::none();
  py::list names;
  for (const auto& r : rules) names.append(r.name);

  py::tuple res;
  try {
    res = bridge.attr("call")(op_name, tensors, args.scalars, names);
  } catch (py::error_already_set& e) {
    // Only BaseExceptions the bridge does not catch get here (KeyboardInterrupt, SystemExit):
    // remembered, so run_task re-raises them after the oracle unwinds.
    if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) {
      interrupted().store(true);
      stop_requested().store(true);  // no further call: the task unwinds at once
    }
    throw std::runtime_error("python backend '" + backend_name + "': " + op_name + ": " + e.what());
  }
  const std::string status = res[0].cast<std::string>();
  const std::string where = "python backend '" + backend_name + "': " + op_name;
  if (status == "not_supported") throw oracle::NotSupported(res[1].cast<std::string>());
  // ValueError: the kernel's documented rejection of bad input (CallFailure::ArgumentError).
  if (status == "invalid_argument") throw std::invalid_argument(where + ": " + res[1].cast<std::string>());
  if (status != "ok") throw std::runtime_error(where + ": " + res[1].cast<std::string>());

  for (size_t i = 0; i < handed.size(); ++i) {
    const Tensor& orig = *handed[i].first;
    const Tensor& seen = *handed[i].second;
    size_t changed = 0;
    const auto* a = reinterpret_cast<const unsigned char*>(orig.raw());
    const auto* b = reinterpret_cast<const unsigned char*>(seen.raw());
    for (size_t j = 0; j < orig.nbytes(); ++j) changed += a[j] != b[j];
    if (changed)
      throw std::runtime_error(where + ": input '" + args.tensors[i].first + "' was modified in place (" +
                               std::to_string(changed) + " bytes changed); inputs are read-only");
  }

  py::dict caps = res[1];
  std::map<std::string, Tensor> out;
  for (const auto& r : rules) {
    if (!caps.contains(r.name)) continue;  // declared as not provided (backend.outputs)
    const std::string what = where + " output '" + r.name + "'";
    Tensor t = from_capsule(caps[py::str(r.name)], what);
    if (r.ids && t.dtype() != DType::I32)
      throw std::runtime_error(what + " has dtype " + dtype_name(t.dtype()) +
                               ", expected I32 (" + r.spec + "; convert with .int())");
    if (!r.ids && !is_floating(t.dtype()))
      throw std::runtime_error(what + " has dtype " + dtype_name(t.dtype()) +
                               ", expected a floating dtype (" + r.spec + ")");
    // The loss's shape is the judge's to decide, by the one rule every route uses
    // (oracle::scalar_loss_shape: [1] or []); it is handed over as returned.
    if (r.name != "loss" && t.shape() != r.shape)
      throw std::runtime_error(what + " has shape " + shape_str(t.shape()) + ", expected " +
                               shape_str(r.shape) + " (" + r.spec + ")");
    out[r.name] = std::move(t);
  }
  return out;
}

Tensor take(std::map<std::string, Tensor>& m, const char* name) {
  auto it = m.find(name);
  return it == m.end() ? Tensor() : std::move(it->second);
}

}  // namespace

std::atomic<bool>& interrupted() {
  static std::atomic<bool> flag{false};
  return flag;
}

std::atomic<bool>& stop_requested() {
  static std::atomic<bool> flag{false};
  return flag;
}

std::vector<std::string> output_names(Op op, bool with_sink) {
  switch (op) {
    case Op::IndexerScores: return {"scores"};
    case Op::IndexerScoresBackward: return {"dq_idx", "dk_idx", "dw"};
    case Op::Topk: return {"indices"};
    case Op::SparseMlaFwd: return {"out", "lse", "max_logits"};
    case Op::SparseMlaBwd:
      return with_sink ? std::vector<std::string>{"dq", "dkv", "dsink"} : std::vector<std::string>{"dq", "dkv"};
    case Op::IndexerKlLoss: return {"loss", "d_scores"};
    case Op::Fp8IndexerScores: return {"scores"};
    case Op::PagedIndexerScores: return {"scores"};
    case Op::SparseMlaFp8Fwd: return {"out", "lse", "max_logits"};
  }
  return {};
}

OpArgs op_args(Op op, const oracle::OpCase& c) {
  OpArgs a;
  auto tensor = [&](const char* name, const Tensor& t) { a.tensors.push_back({name, t}); };
  auto optional = [&](const char* name, const std::optional<Tensor>& t) {
    if (t) tensor(name, *t);
    else a.none.push_back(name);
  };
  auto windows = [&](const KeyWindows& w) {
    tensor("ks", i64_tensor(w.ks));
    tensor("ke", i64_tensor(w.ke));
  };
  auto mla = [&](const SparseMlaInputs& in) {
    tensor("q", in.q);
    tensor("kv", in.kv);
    tensor("indices", in.indices.dim() == 3 ? in.indices.reshaped({in.indices.size(0), in.indices.size(2)})
                                            : in.indices);
    optional("topk_length", in.topk_length);
    optional("attn_sink", in.attn_sink);
    a.scalars["sm_scale"] = in.sm_scale;
    a.scalars["d_v"] = in.d_v;
  };
  switch (op) {
    case Op::IndexerScores:
    case Op::IndexerScoresBackward:
      tensor("q_idx", c.q_idx);
      tensor("k_idx", c.k_idx);
      tensor("w", c.w);
      windows(c.windows);
      if (op == Op::IndexerScoresBackward) tensor("d_scores", c.d_scores);
      break;
    case Op::Topk:
      tensor("scores", c.scores);
      if (c.topk_windows) windows(*c.topk_windows);
      else a.none = {"ks", "ke"};
      a.scalars["k"] = c.k;
      a.scalars["tie_break"] = to_string(c.policy.tie_break);
      a.scalars["sorted"] = c.policy.sorted;
      break;
    case Op::SparseMlaFwd:
      mla(c.mla);
      break;
    case Op::SparseMlaBwd:
      mla(c.mla);
      tensor("dout", c.dout);
      break;
    case Op::IndexerKlLoss:
      tensor("scores", c.kl.scores);
      tensor("q", c.kl.q);
      tensor("kv", c.kl.kv);
      windows(c.kl.windows);
      optional("indices", c.kl.indices);
      a.scalars["sm_scale"] = c.kl.sm_scale;
      a.scalars["mode"] = to_string(c.kl.mode);
      a.scalars["coeff"] = c.kl.coeff;
      break;
    case Op::Fp8IndexerScores:  // FP8 bytes as U8 (torch.uint8), their format as fp8_format
      tensor("q_idx", c.fp8_indexer.q_idx);
      tensor("k_idx", c.fp8_indexer.k_idx);
      tensor("k_scale", c.fp8_indexer.k_scale);
      tensor("w", c.fp8_indexer.w);
      windows(c.fp8_indexer.windows);
      a.scalars["fp8_format"] = to_string(c.fp8_indexer.format);
      break;
    case Op::PagedIndexerScores: {
      const PagedIndexerInputs& in = c.paged_indexer;
      tensor("q_idx", in.q_idx);
      tensor("k_cache", in.k_cache);
      tensor("k_scale_cache", in.k_scale_cache);
      tensor("w", in.w);
      tensor("block_table", in.block_table);
      tensor("context_lens", in.context_lens);
      a.scalars["block_size"] = in.k_cache.dim() >= 2 ? in.k_cache.size(1) : int64_t{-1};
      a.scalars["max_context"] = paged_max_context(in);
      a.scalars["fp8_format"] = to_string(in.format);
      break;
    }
    case Op::SparseMlaFp8Fwd: {
      const SparseMlaFp8Inputs& in = c.mla_fp8;
      tensor("q", in.q);
      tensor("kv_cache", in.kv_cache);  // U8, as given: [tokens,656] or [num_blocks,block_size(,1),656]
      tensor("indices", in.indices.dim() == 3 ? in.indices.reshaped({in.indices.size(0), in.indices.size(2)})
                                              : in.indices);
      optional("topk_length", in.topk_length);
      optional("attn_sink", in.attn_sink);
      a.scalars["sm_scale"] = in.sm_scale;
      a.scalars["d_v"] = kMlaFp8NopeDim;
      break;
    }
  }
  return a;
}

PyBackend::BridgeHandle PyBackend::share(const py::object& bridge) {
  return BridgeHandle(new py::object(bridge), [](py::object* o) {
    py::gil_scoped_acquire gil;
    delete o;
  });
}

PyBackend::PyBackend(BridgeHandle bridge) : bridge_(std::move(bridge)) {}

std::string PyBackend::name() const {
  py::gil_scoped_acquire gil;
  return bridge_->attr("name").cast<std::string>();
}

std::string PyBackend::unavailable_reason() const {
  py::gil_scoped_acquire gil;
  return bridge_->attr("unavailable_reason")().cast<std::string>();
}

bool PyBackend::deterministic() const {
  py::gil_scoped_acquire gil;
  return bridge_->attr("deterministic").cast<bool>();
}

bool PyBackend::supports(Op op) const {
  py::gil_scoped_acquire gil;
  return bridge_->attr("supports")(oracle::to_string(op)).cast<bool>();
}

Tensor PyBackend::indexer_scores(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                 const KeyWindows& windows) {
  oracle::OpCase c;
  c.q_idx = q_idx;
  c.k_idx = k_idx;
  c.w = w;
  c.windows = windows;
  auto o = call(*bridge_, name(), Op::IndexerScores, c);
  return take(o, "scores");
}

IndexerGrads PyBackend::indexer_scores_backward(const Tensor& q_idx, const Tensor& k_idx,
                                                const Tensor& w, const KeyWindows& windows,
                                                const Tensor& d_scores) {
  oracle::OpCase c;
  c.q_idx = q_idx;
  c.k_idx = k_idx;
  c.w = w;
  c.windows = windows;
  c.d_scores = d_scores;
  auto o = call(*bridge_, name(), Op::IndexerScoresBackward, c);
  return IndexerGrads{take(o, "dq_idx"), take(o, "dk_idx"), take(o, "dw")};
}

Tensor PyBackend::select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                              const std::optional<KeyWindows>& windows) {
  oracle::OpCase c;
  c.scores = scores;
  c.k = k;
  c.policy = policy;
  c.topk_windows = windows;
  auto o = call(*bridge_, name(), Op::Topk, c);
  return take(o, "indices");
}

SparseMlaForward PyBackend::sparse_mla_forward(const SparseMlaInputs& in) {
  oracle::OpCase c;
  c.mla = in;
  auto o = call(*bridge_, name(), Op::SparseMlaFwd, c);
  return SparseMlaForward{take(o, "out"), take(o, "lse"), take(o, "max_logits")};
}

SparseMlaGrads PyBackend::sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) {
  oracle::OpCase c;
  c.mla = in;
  c.dout = dout;
  auto o = call(*bridge_, name(), Op::SparseMlaBwd, c);
  SparseMlaGrads g{take(o, "dq"), take(o, "dkv"), std::nullopt};
  if (o.count("dsink")) g.dsink = take(o, "dsink");
  return g;
}

IndexerKlResult PyBackend::indexer_kl_loss(const IndexerKlInputs& in) {
  oracle::OpCase c;
  c.kl = in;
  auto o = call(*bridge_, name(), Op::IndexerKlLoss, c);
  return IndexerKlResult{take(o, "loss"), take(o, "d_scores")};
}

Tensor PyBackend::fp8_indexer_scores(const Fp8IndexerInputs& in) {
  oracle::OpCase c;
  c.fp8_indexer = in;
  auto o = call(*bridge_, name(), Op::Fp8IndexerScores, c);
  return take(o, "scores");
}

Tensor PyBackend::paged_indexer_scores(const PagedIndexerInputs& in) {
  oracle::OpCase c;
  c.paged_indexer = in;
  auto o = call(*bridge_, name(), Op::PagedIndexerScores, c);
  return take(o, "scores");
}

SparseMlaForward PyBackend::sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) {
  oracle::OpCase c;
  c.mla_fp8 = in;
  auto o = call(*bridge_, name(), Op::SparseMlaFp8Fwd, c);
  return SparseMlaForward{take(o, "out"), take(o, "lse"), take(o, "max_logits")};
}

bool PyBackend::fp8_reduced_accumulation() const {
  py::gil_scoped_acquire gil;
  return bridge_->attr("fp8_reduced_accumulation").cast<bool>();
}

}  // namespace dsa::python

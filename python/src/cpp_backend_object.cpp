#include "cpp_backend_object.h"

#include <pybind11/stl.h>

#include <atomic>
#include <map>

#include "dlpack_capsule.h"
#include "dsa/contract/fp8.h"
#include "py_backend.h"

namespace py = pybind11;

namespace dsa::python {
namespace {

using oracle::Op;

Op op_from(const std::string& name) {
  for (Op op : oracle::all_ops())
    if (name == oracle::to_string(op)) return op;
  throw std::invalid_argument("call: argument 'op' got \"" + name + "\", expected an op name");
}

std::optional<Tensor> optional_tensor(const py::dict& t, const char* name) {
  if (!t.contains(name) || t[name].is_none()) return std::nullopt;
  return from_capsule(t[name], std::string("input '") + name + "'");
}

Tensor tensor(const py::dict& t, const char* name) {
  auto v = optional_tensor(t, name);
  if (!v) throw std::invalid_argument(std::string("call: missing input '") + name + "'");
  return *v;
}

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = static_cast<int64_t>(t.get(i));
  return v;
}

KeyWindows windows(const py::dict& t, int64_t s_kv) {
  return KeyWindows::explicit_windows(ints(tensor(t, "ks")), ints(tensor(t, "ke")), s_kv);
}

SparseMlaInputs mla(const py::dict& t, const py::dict& s) {
  SparseMlaInputs in;
  in.q = tensor(t, "q");
  in.kv = tensor(t, "kv");
  in.indices = tensor(t, "indices");
  in.topk_length = optional_tensor(t, "topk_length");
  in.attn_sink = optional_tensor(t, "attn_sink");
  in.sm_scale = s["sm_scale"].cast<double>();
  in.d_v = s["d_v"].cast<int64_t>();
  return in;
}

py::dict call(CppBackend& self, const std::string& op_name, const py::dict& t, const py::dict& s) {
  oracle::Backend& b = *self.backend;
  std::map<std::string, Tensor> out;
  switch (op_from(op_name)) {
    case Op::IndexerScores: {
      const Tensor k_idx = tensor(t, "k_idx");
      out["scores"] = b.indexer_scores(tensor(t, "q_idx"), k_idx, tensor(t, "w"), windows(t, k_idx.size(0)));
      break;
    }
    case Op::IndexerScoresBackward: {
      const Tensor k_idx = tensor(t, "k_idx");
      IndexerGrads g = b.indexer_scores_backward(tensor(t, "q_idx"), k_idx, tensor(t, "w"),
                                                 windows(t, k_idx.size(0)), tensor(t, "d_scores"));
      out = {{"dq_idx", g.dq_idx}, {"dk_idx", g.dk_idx}, {"dw", g.dw}};
      break;
    }
    case Op::Topk: {
      const Tensor scores = tensor(t, "scores");
      std::optional<KeyWindows> w;
      if (t.contains("ks") && !t["ks"].is_none()) w = windows(t, scores.size(1));
      TopkPolicy policy{parse_tie_break(s["tie_break"].cast<std::string>()), s["sorted"].cast<bool>()};
      out["indices"] = b.select_topk(scores, s["k"].cast<int64_t>(), policy, w);
      break;
    }
    case Op::SparseMlaFwd: {
      SparseMlaForward f = b.sparse_mla_forward(mla(t, s));
      out = {{"out", f.out}, {"lse", f.lse}, {"max_logits", f.max_logits}};
      break;
    }
    case Op::SparseMlaBwd: {
      SparseMlaGrads g = b.sparse_mla_backward(mla(t, s), tensor(t, "dout"));
      out = {{"dq", g.dq}, {"dkv", g.dkv}};
      if (g.dsink) out["dsink"] = *g.dsink;
      break;
    }
    case Op::IndexerKlLoss: {
      IndexerKlInputs in;
      in.scores = tensor(t, "scores");
      in.q = tensor(t, "q");
      in.kv = tensor(t, "kv");
      in.sm_scale = s["sm_scale"].cast<double>();
      in.windows = windows(t, in.scores.size(1));
      in.mode = parse_kl_mode(s["mode"].cast<std::string>());
      in.indices = optional_tensor(t, "indices");
      in.coeff = s["coeff"].cast<double>();
      IndexerKlResult r = b.indexer_kl_loss(in);
      out = {{"loss", r.loss}, {"d_scores", r.d_scores}};
      break;
    }
    case Op::Fp8IndexerScores: {  // SPEC §10: uint8 bytes + fp8_format, as PyBackend passes them
      Fp8IndexerInputs in;
      in.q_idx = tensor(t, "q_idx");
      in.k_idx = tensor(t, "k_idx");
      in.k_scale = tensor(t, "k_scale");
      in.w = tensor(t, "w");
      in.windows = windows(t, in.k_idx.size(0));
      in.format = parse_fp8_format(s["fp8_format"].cast<std::string>());
      out["scores"] = b.fp8_indexer_scores(in);
      break;
    }
    case Op::PagedIndexerScores: {
      PagedIndexerInputs in;
      in.q_idx = tensor(t, "q_idx");
      in.k_cache = tensor(t, "k_cache");
      in.k_scale_cache = tensor(t, "k_scale_cache");
      in.w = tensor(t, "w");
      in.block_table = tensor(t, "block_table");
      in.context_lens = tensor(t, "context_lens");
      in.max_context = s.contains("max_context") ? s["max_context"].cast<int64_t>() : -1;
      in.format = parse_fp8_format(s["fp8_format"].cast<std::string>());
      out["scores"] = b.paged_indexer_scores(in);
      break;
    }
    case Op::SparseMlaFp8Fwd: {
      SparseMlaFp8Inputs in;
      in.q = tensor(t, "q");
      in.kv_cache = tensor(t, "kv_cache");
      in.indices = tensor(t, "indices");
      in.topk_length = optional_tensor(t, "topk_length");
      in.attn_sink = optional_tensor(t, "attn_sink");
      in.sm_scale = s["sm_scale"].cast<double>();
      SparseMlaForward f = b.sparse_mla_fp8_forward(in);
      out = {{"out", f.out}, {"lse", f.lse}, {"max_logits", f.max_logits}};
      break;
    }
  }
  py::dict d;
  for (auto& [name, v] : out)
    if (v.defined()) d[py::str(name)] = to_capsule(std::make_shared<Tensor>(std::move(v)));
  return d;
}

std::atomic<long long>& translator_calls() {
  static std::atomic<long long> n{0};
  return n;
}

}  // namespace

void bind_cpp_backend(py::module_& m) {
  // Module-local: it only sees exceptions of this module's own functions. A global translator
  // lands in every pybind11 module sharing these internals, torch included: each c10::Error of
  // a torch op called from Python was rethrown by this module's code (seen in gdb), in _core
  // under its own static C++ runtime, i.e. two C++ runtimes handling one exception.
  py::register_local_exception_translator([](std::exception_ptr p) {
    translator_calls().fetch_add(1);
    try {
      if (p) std::rethrow_exception(p);
    } catch (const oracle::NotSupported& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    }
  });
  m.def("_translator_calls", [] { return translator_calls().load(); },
        "How many exceptions this module's translator has examined (only this module's own: an "
        "exception of another module, e.g. a torch op, never reaches it)");
  py::class_<CppBackend>(m, "CppBackend", py::module_local(), "A C++ dsa::oracle::Backend called with DLPack capsules")
      .def_property_readonly("name", [](const CppBackend& b) { return b.backend->name(); })
      .def_property_readonly("deterministic", [](const CppBackend& b) { return b.backend->deterministic(); })
      .def_property_readonly("fp8_reduced_accumulation",
                             [](const CppBackend& b) { return b.backend->fp8_reduced_accumulation(); })
      .def("unavailable_reason", [](const CppBackend& b) { return b.backend->unavailable_reason(); })
      .def("supports", [](const CppBackend& b, const std::string& op) { return b.backend->supports(op_from(op)); })
      .def("call", &call, py::arg("op"), py::arg("tensors"), py::arg("scalars"));
}

}  // namespace dsa::python

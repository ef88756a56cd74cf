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

oracle::CheckOptions check_options(const JudgeOptions& j, bool file_route, const oracle::Backend& backend) {
  oracle::CheckOptions o = check_options(j, file_route);
  if (auto declared = backend.provided_outputs()) {
    if (!o.provided_outputs) {
      o.provided_outputs = *declared;
    } else {
      std::set<std::string> both;
      for (const auto& n : *o.provided_outputs)
        if (declared->count(n)) both.insert(n);
      o.provided_outputs = both;
    }
  }
  return o;
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
                              {"bound", num(t.max_bound)},  // candidate-independent
                              {"baseline_err", num(t.baseline_err)},
                              {"floor", num(t.largest.floor_acc + t.largest.floor_underflow + t.largest.floor_round)},
                              {"floor_source", t.floor_source},
                              {"err_over_bound", num(t.worst)},
                              {"weak_rows", t.weak_rows},
                              {"ratio", num(t.ratio)},
                              {"message", t.message}});
    j["ops"].push_back(o);
  }
  return j;
}

}  // namespace dsa::cli

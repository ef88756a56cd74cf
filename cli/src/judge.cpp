#include "judge.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <new>
#include <stdexcept>

#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"
#include "report.h"

namespace dsa::cli {

std::vector<std::string> split_list_option(const std::vector<std::string>& values, const std::string& flag) {
  std::vector<std::string> out;
  for (const auto& v : values) {
    size_t begin = 0;
    while (true) {
      const size_t end = v.find(',', begin);
      const std::string item = v.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
      if (item.empty())
        throw std::invalid_argument("argument '" + flag + "' got \"" + v +
                                    "\": an empty item, expected comma-separated names (e.g. a,b), none empty");
      // One rule for every list flag (as --outputs): a name given twice is a usage error,
      // never merged silently (fresh11 F3c: --unsupported invalid_ids,invalid_ids passed).
      if (std::find(out.begin(), out.end(), item) != out.end())
        throw std::invalid_argument("argument '" + flag + "' names \"" + item + "\" twice (got \"" + v +
                                    "\"), expected each name once");
      out.push_back(item);
      if (end == std::string::npos) break;
      begin = end + 1;
    }
  }
  return out;
}

void check_conventions_apply(const std::vector<fixtures::Convention>& conventions,
                             const std::vector<oracle::Op>& ops, const std::string& flag) {
  std::vector<std::string> names;
  for (oracle::Op op : ops) names.emplace_back(oracle::to_string(op));
  fixtures::check_conventions_apply(conventions, names, flag);  // the one rule (fixtures)
}

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
    // A name given twice (`out,out`, `--outputs out --outputs out`) is a typo for another
    // output more often than not: a usage error, never silently merged.
    if (std::find(out.begin(), out.end(), n) != out.end()) {
      std::string given;
      for (const auto& g : names) given += (given.empty() ? "" : ",") + g;
      throw std::invalid_argument("argument '" + flag + "' names \"" + n + "\" twice (got \"" + given +
                                  "\"), expected each output name once");
    }
    out.push_back(n);
  }
  if (out.empty()) throw std::invalid_argument("argument '" + flag + "' names no output");
  return out;
}

int report_resource_error(const oracle::ResourceError& e, const std::string& json_path) {
  for (const auto& r : e.partial) std::printf("%s", oracle::format_op_report(r).c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "dsa-verify: error: %s\n", e.what());
  if (!json_path.empty()) {
    nlohmann::json j = reports_json(e.partial);
    j["error"] = e.what();
    j["exit_code"] = kExitUsage;
    write_text_file(json_path, j.dump(2) + "\n");
  }
  return kExitUsage;
}

oracle::CheckOptions check_options(const JudgeOptions& j, bool file_route) {
  oracle::CheckOptions o;
  o.check_determinism = !file_route;
  o.allow_weak = j.allow_weak;
  o.rounding.sink_after_rounding = j.sink_after_rounding;
  o.rounding.normalized_p = j.normalized_p;
  if (j.outputs) o.provided_outputs.emplace(j.outputs->begin(), j.outputs->end());
  o.unsupported = j.unsupported;
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

oracle::RoundingModel rounding_flags_of(const JudgeOptions& j) {
  oracle::RoundingModel m;
  m.sink_after_rounding = j.sink_after_rounding;
  m.normalized_p = j.normalized_p;
  return m;
}

std::string rounding_flags(const oracle::RoundingModel& m) {
  std::string s;
  if (m.sink_after_rounding) s += " --sink-after-rounding";
  if (m.normalized_p) s += " --normalized-p";
  return s;
}

std::string rounding_line(const std::string& backend, const DeclaredRounding& d) {
  std::string s;
  auto add = [&](bool flag, bool declared, const char* name, const char* option) {
    if (!flag && !declared) return;
    std::string by = declared ? "declared by the backend's capabilities" : "";
    if (flag) by += std::string(by.empty() ? "" : ", and ") + option;
    s += std::string(s.empty() ? "" : ", ") + name + " (" + by + ")";
  };
  add(d.flags.sink_after_rounding, d.backend.sink_after_rounding, "sink_after_rounding", "--sink-after-rounding");
  add(d.flags.normalized_p, d.backend.normalized_p, "normalized_p", "--normalized-p");
  return s.empty() ? s : "rounding models of " + backend + ": " + s;
}

nlohmann::json announce_rounding(const std::string& backend, const DeclaredRounding& d) {
  const std::string line = rounding_line(backend, d);
  if (!line.empty()) std::printf("%s\n", line.c_str());
  return rounding_json(backend, d);
}

nlohmann::json rounding_json(const std::string& backend, const DeclaredRounding& d) {
  const oracle::RoundingModel j = d.judged();
  return {{"backend", backend},
          {"sink_after_rounding",
           {{"judged", j.sink_after_rounding}, {"flag", d.flags.sink_after_rounding},
            {"backend", d.backend.sink_after_rounding}}},
          {"normalized_p",
           {{"judged", j.normalized_p}, {"flag", d.flags.normalized_p}, {"backend", d.backend.normalized_p}}}};
}

void add_convention_hints(std::vector<oracle::OpReport>& reports, const oracle::CandidateBackend& candidate,
                          const oracle::OpCase* c, HintRoute route) {
  const Tensor* ids = candidate.stored("indices");
  if (!ids) return;
  auto uses = [&](fixtures::Convention c) {
    const auto& all = candidate.conventions();
    return std::find(all.begin(), all.end(), c) != all.end();
  };
  // (violation rule, hint) pairs that apply to this file
  std::vector<std::pair<std::string, std::string>> hints;
  if (ids->dtype() == DType::I64 && !uses(fixtures::Convention::Int64Ids))
    hints.emplace_back("dtype", "the file stores int64 ids: if the kernel returns int64 ids, pass "
                                "--convention int64_ids (it narrows them to int32; an id outside int32 still fails)");
  if (ids->dim() == 3 && ids->size(1) == 1 && !uses(fixtures::Convention::IdsSq1K))
    hints.emplace_back("shape", "the file stores [s_q, 1, k] ids: if that is the kernel's layout, pass "
                                "--convention ids_s_q_1_k");
  // SPEC §3.6: some selectors narrow the output to min(k, s_kv) columns. A candidate of that
  // width still fails without the declaration (a convention is a representation, declared,
  // never inferred); the hint says how to declare it on this route.
  if (c && ids->dim() == 2 && c->scores.dim() == 2 && !uses(fixtures::Convention::TopkWidthMinKSkv)) {
    const int64_t s_kv = c->scores.size(1), k = c->k;
    if (s_kv < k && ids->size(1) == s_kv) {
      const std::string how =
          route == HintRoute::FixtureField
              ? "add \"topk_width_min_k_s_kv\" to the fixture's conventions metadata (a JSON array)"
              : route == HintRoute::CompareFlags
                    ? "pass --narrowed-topk-width (= --convention topk_width_min_k_s_kv)"
                    : "pass --convention topk_width_min_k_s_kv";
      hints.emplace_back("shape", "the candidate's ids are [s_q, " + std::to_string(s_kv) + "] = [s_q, min(k, s_kv)] with k = " +
                                      std::to_string(k) + " > s_kv = " + std::to_string(s_kv) +
                                      ": if the kernel narrows the width so, declare it: " + how +
                                      " (undeclared it fails; declared, every contract rule is still checked)");
    }
  }
  for (auto& r : reports) {
    if (r.op != oracle::to_string(oracle::Op::Topk) || r.passed()) continue;
    for (const auto& [rule, hint] : hints) {
      bool found = false;
      for (auto& v : r.topk_violations)
        if (v.rule == rule) {
          v.detail += "; hint: " + hint;
          found = true;
        }
      if (found) r.reason += "; hint: " + hint;
    }
  }
}

bool judged_nothing(const std::vector<oracle::OpReport>& reports) {
  return !reports.empty() &&
         std::all_of(reports.begin(), reports.end(),
                     [](const oracle::OpReport& r) { return r.verdict == oracle::Verdict::Skip; });
}

int exit_code(const std::vector<oracle::OpReport>& reports) {
  if (judged_nothing(reports)) return kExitUsage;
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
                              {"floor", num(t.largest.floor_acc + t.largest.floor_underflow + t.largest.floor_round +
                                            t.largest.floor_presink)},
                              {"floor_source", t.floor_source},
                              {"sink_after_rounding", t.rounding.sink_after_rounding},
                              {"normalized_p", t.rounding.normalized_p},
                              {"err_over_bound", num(t.worst)},
                              {"weak_rows", t.weak_rows},
                              {"ratio", num(t.ratio)},
                              {"message", t.message}});
    j["ops"].push_back(o);
  }
  return j;
}

void check_fixture_inputs(const fixtures::Fixture& f, const oracle::OpCase& c, const std::vector<oracle::Op>& ops) {
  const std::string file = f.path.empty() ? f.case_name : f.path;
  for (oracle::Op op : ops) {
    // What the reference says of the inputs of `op` ("" when it computes the op): the reason of
    // its "backend threw" report (run_backend's prefix), or the invalid_argument check_op
    // propagates from the reference it judges with.
    auto rejection = [&]() -> std::string {
      std::unique_ptr<oracle::Backend> reference = oracle::make_reference_backend();
      oracle::CheckOptions opt;
      opt.check_determinism = false;
      try {
        const oracle::OpReport r = oracle::check_op(*reference, op, c, opt);
        const std::string threw = "backend threw: ";
        if (r.verdict == oracle::Verdict::Fail && r.reason.rfind(threw, 0) == 0) return r.reason.substr(threw.size());
      } catch (const std::invalid_argument& e) {
        return e.what();
      }
      return "";
    };
    std::string why;
    try {
      const std::string key = std::string("cli/input_check/") + oracle::to_string(op);
      why = c.memo ? c.memo->get<std::string>(key, rejection) : rejection();
    } catch (const std::bad_alloc&) {
      throw oracle::ResourceError(file + ": out of memory (std::bad_alloc) checking the inputs of op " +
                                      oracle::to_string(op) + ": no verdict (not a disagreement)",
                                  {});
    }
    if (why.empty()) continue;
    // "sparse_mla_forward: argument 'x' ..." → "argument 'x' ...", as compare words it.
    const size_t colon = why.find(": argument");
    if (colon != std::string::npos && why.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == colon)
      why = why.substr(colon + 2);
    throw fixtures::FileError(file, std::string(oracle::to_string(op)) + " inputs: " + why);
  }
}

// compare and replay --candidate alike (fresh21: replay said nothing of stray tensors).
void print_candidate_file_notes(const fixtures::Fixture& f, const oracle::CandidateBackend& backend,
                                const std::vector<std::string>& ignored, const oracle::CheckOptions& opt,
                                const std::string& candidate) {
  for (const auto& n : ignored)
    std::printf("note: %s: tensor '%s' is not an output name; ignored\n", candidate.c_str(), n.c_str());
  const std::vector<oracle::Op> judged = oracle::fixture_ops(f);
  std::set<std::string> judged_names;
  for (oracle::Op op : judged)
    for (const auto& n : backend.stored_outputs(op)) judged_names.insert(n);
  std::set<std::string> said;
  for (oracle::Op op : oracle::all_ops()) {
    if (std::find(judged.begin(), judged.end(), op) != judged.end()) continue;
    for (const auto& n : backend.stored_outputs(op))
      if (!judged_names.count(n) && said.insert(n).second)
        std::printf("note: %s: tensor '%s' is an output of %s, which golden op '%s' does not "
                    "define; not judged\n", candidate.c_str(), n.c_str(), oracle::to_string(op),
                    f.op.c_str());
  }
  // dsink is an output of the backward only for a case with attn_sink (SPEC §5).
  if (backend.stored("dsink") && !f.inputs.count("attn_sink") && said.insert("dsink").second)
    std::printf("note: %s: tensor 'dsink' is in the file but golden '%s' has no attn_sink, so the case "
                "defines no dsink; not judged\n", candidate.c_str(), f.case_name.c_str());
  // Per op, as check_op applies --outputs (oracle::provided_outputs_for): an op none of whose
  // outputs is named is judged in full, so none of its tensors is "not judged".
  for (oracle::Op op : judged)
    for (const auto& n : oracle::not_judged_outputs(op, opt.provided_outputs))
      if (backend.stored(n) && said.insert(n).second)
        std::printf("note: %s: tensor '%s' is in the file but not named by --outputs; not judged\n",
                    candidate.c_str(), n.c_str());
}


}  // namespace dsa::cli

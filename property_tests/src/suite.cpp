// The property runner (RapidCheck driven programmatically) and the mutation analysis.
#include <rapidcheck.h>
#include <rapidcheck/detail/TestListener.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "fp8_props_common.h"
#include "props_common.h"

namespace dsa::props {

using oracle::Verdict;

const std::vector<Property>& all_properties() {
  static const std::vector<Property> props = [] {
    std::vector<Property> p;
    add_topk_properties(p);
    add_indexer_properties(p);
    add_sparse_mla_properties(p);
    add_kl_loss_properties(p);
    add_block_properties(p);
    add_fp8_properties(p);
    return p;
  }();
  return props;
}

int cases_for_level(int level, int cost) {
  static const int kBase[3] = {25, 100, 400};  // CI, level 1, soak
  const int base = kBase[std::clamp(level, 0, 2)];
  return std::max(3, base / std::max(1, cost));
}

int env_test_level() {
  const char* v = std::getenv("DSA_TEST_LEVEL");
  return v ? std::clamp(std::atoi(v), 0, 2) : 0;
}

namespace {
// Silences RapidCheck's end-of-process reproduce summary (mutation runs fail on purpose).
class NullListener final : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

std::string first_line(const std::string& s) {
  const auto n = s.find('\n');
  return n == std::string::npos ? s : s.substr(0, n);
}
// RapidCheck's failure description begins with the assertion's source location and macro
// ("../../property_tests/x.cpp:97:\nRC_FAIL(::dsa::oracle::format_op_report(dsa_r_))\n\n<text>").
// A report must begin with what failed for the user: the text of an RC_FAIL (the oracle's
// "[FAIL] backend op: output: ... > bound ..."), or "property assertion failed: EXPR" for an
// RC_ASSERT, or "exception: WHAT" for an exception out of the body; the source location
// moves to the end, without the build tree's "../" prefix.
std::string user_message(const std::string& d) {
  size_t start = d.find_first_not_of(" \n");
  if (start == std::string::npos) return d;
  // An exception out of the body (a plugin's error status, a backend's throw): its message
  // first, not RapidCheck's preamble.
  const std::string thrown = "Exception thrown with message:\n";
  if (d.compare(start, thrown.size(), thrown) == 0) return "exception: " + d.substr(start + thrown.size());
  const size_t l1 = d.find('\n', start);
  if (l1 == std::string::npos || l1 == start || d[l1 - 1] != ':') return d;
  std::string where = d.substr(start, l1 - 1 - start);  // path:line
  const size_t colon = where.rfind(':');
  if (colon == std::string::npos || colon + 1 == where.size() ||
      where.find_first_not_of("0123456789", colon + 1) != std::string::npos)
    return d;
  const size_t l2 = d.find('\n', l1 + 1);
  const std::string macro = d.substr(l1 + 1, l2 == std::string::npos ? std::string::npos : l2 - l1 - 1);
  const size_t paren = macro.find('(');
  if (macro.rfind("RC_", 0) != 0 || paren == std::string::npos || macro.back() != ')') return d;
  std::string rest = l2 == std::string::npos ? "" : d.substr(l2 + 1);
  const size_t text = rest.find_first_not_of('\n');
  rest = text == std::string::npos ? "" : rest.substr(text);
  while (where.rfind("../", 0) == 0) where.erase(0, 3);
  std::string out;
  if (macro.rfind("RC_FAIL(", 0) == 0 && !rest.empty()) {
    out = rest;
  } else {
    out = "property assertion failed: " + macro.substr(paren + 1, macro.size() - paren - 2);
    if (!rest.empty()) out += "\n" + rest;
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out + "\n(assertion at " + where + ")";
}

std::string sanitize(std::string s) {
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') ch = '_';
  return s;
}
}  // namespace

Subject backend_subject(const std::string& name) {
  Subject s;
  s.name = name;
  s.make = [name] { return oracle::make_backend(name); };
  return s;
}

PropertyResult run_property(const Subject& s, const Property& p, const SuiteOptions& o) {
  PropertyResult r;
  r.subject = s.name;
  r.property = p.name;
  std::unique_ptr<oracle::Backend> backend;
  try {
    backend = s.make();
  } catch (const std::exception& e) {
    r.verdict = Verdict::Skip;
    r.message = std::string("cannot create backend: ") + e.what();
    return r;
  }
  const std::string why = backend->unavailable_reason();
  if (!why.empty()) {
    r.verdict = Verdict::Skip;
    r.message = why;
    return r;
  }
  if (o.level < p.min_level) {
    r.verdict = Verdict::Skip;
    r.message = "runs at level >= " + std::to_string(p.min_level) + " (DSA_TEST_LEVEL / --level)";
    return r;
  }
  for (oracle::Op op : p.ops)
    if (!backend->supports(op)) {
      r.verdict = Verdict::Skip;
      r.message = std::string("op ") + oracle::to_string(op) + " not supported";
      return r;
    }

  rc::detail::TestParams params = rc::detail::configuration().testParams;
  if (o.seed != 0) params.seed = o.seed;
  params.maxSuccess = cases_for_level(o.level, p.cost);
  params.disableShrinking = !o.shrink;
  rc::detail::TestMetadata md;
  md.id = s.name + "/" + p.name;
  md.description = md.id;

  std::string dump_path;
  if (o.dump) {
    std::string dir = o.dump_dir;
    if (dir.empty()) {
      const char* env = std::getenv("DSA_DUMP_DIR");
      dir = env && *env ? env : "build/failures";
    }
    dump_path = (std::filesystem::path(dir) / (sanitize(s.name) + "__" + sanitize(p.name) + ".safetensors")).string();
  }
  set_dump_target(dump_path);
  set_selected_ops(o.ops);
  set_generation_level(o.level);
  oracle::Backend& b = *backend;
  // A backend that declares an op but answers "not supported" at run time (a plugin's
  // DSA_STATUS_UNSUPPORTED) makes the property a skip, never a pass or a failure.
  std::string unsupported;
  // The op of the report assertion that failed in the last failing execution (the reported,
  // shrunk case): a forward property's backward part fails under sparse_mla_bwd.
  std::string failed_op;
  const auto property = rc::detail::toProperty([&] {
    if (!unsupported.empty()) return;
    reset_failing_op();
    try {
      p.body(b, s.block);
    } catch (const oracle::NotSupported& e) {
      unsupported = e.what();
    } catch (const rc::detail::CaseResult& res) {
      if (res.type == rc::detail::CaseResult::Type::Failure) failed_op = failing_op();
      throw;  // a discard (RC_PRE) leaves the last failure's op
    } catch (...) {
      failed_op = failing_op();  // an exception fails the case too
      throw;
    }
  });
  NullListener quiet;
  const oracle::ScopedCheckDefaults check_defaults(o.check);
  const auto result = o.quiet ? rc::detail::checkProperty(property, md, params, quiet)
                              : rc::detail::checkProperty(property, md, params);
  set_dump_target("");
  set_selected_ops({});
  set_generation_level(0);

  if (!unsupported.empty()) {
    r.verdict = Verdict::Skip;
    r.message = "not supported by the backend: " + unsupported;
    return r;
  }
  if (result.template is<rc::detail::SuccessResult>()) {
    r.cases = result.template get<rc::detail::SuccessResult>().numSuccess;
    return r;
  }
  r.verdict = Verdict::Fail;
  std::ostringstream msg;
  if (result.template is<rc::detail::FailureResult>()) {
    const auto& f = result.template get<rc::detail::FailureResult>();
    r.cases = f.numSuccess;
    msg << user_message(f.description);
    r.failed_op = failed_op;
    for (const auto& kv : f.counterExample) msg << "\n  " << kv.first << " = " << kv.second;
    rc::detail::Configuration cfg;
    cfg.testParams = params;
    cfg.reproduce[md.id] = f.reproduce;
    r.repro = "RC_PARAMS=\"" + rc::detail::configToMinimalString(cfg) + "\" DSA_TEST_LEVEL=" +
              std::to_string(o.level) + (o.repro_command.empty() ? "" : " " + o.repro_command);
    if (!dump_path.empty() && std::filesystem::exists(dump_path)) r.dumped = dump_path;
  } else {
    std::ostringstream os;
    rc::detail::printResultMessage(result, os);
    msg << os.str();
  }
  r.message = msg.str();
  if (o.log) {
    *o.log << "[FAIL] " << s.name << " " << p.name << " after " << r.cases << " passing case(s)\n"
           << r.message << "\n";
    if (!r.repro.empty()) *o.log << "  repro: " << r.repro << "\n";
    if (!r.dumped.empty()) *o.log << "  failing case dumped: " << r.dumped << "\n";
  }
  return r;
}

std::vector<PropertyResult> run_suite(const Subject& s, const SuiteOptions& o) {
  std::vector<const Property*> order;
  for (const auto& p : all_properties())
    if (o.only.empty() || std::any_of(o.only.begin(), o.only.end(), [&](const std::string& e) {
          return p.name == e || p.name.rfind(e + ".", 0) == 0;
        }))
      order.push_back(&p);
  if (!s.focus.empty())
    std::stable_partition(order.begin(), order.end(),
                          [&](const Property* p) { return p->name.rfind(s.focus, 0) == 0; });
  std::vector<PropertyResult> out;
  for (const Property* p : order) {
    out.push_back(run_property(s, *p, o));
    if (o.stop_at_first_failure && out.back().verdict == Verdict::Fail) break;
  }
  return out;
}

std::string format_results(const std::vector<PropertyResult>& rows) {
  std::ostringstream os;
  char line[512];
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "  %-16s %-46s %-5s %5d  %s\n", r.subject.c_str(),
                  r.property.c_str(), oracle::to_string(r.verdict), r.cases,
                  first_line(r.message).substr(0, 80).c_str());
    os << line;
  }
  return os.str();
}

std::vector<MutantResult> run_mutation_analysis(const SuiteOptions& o_in, bool full_matrix) {
  SuiteOptions o = o_in;
  o.stop_at_first_failure = !full_matrix;
  o.shrink = false;
  o.dump = false;
  o.quiet = true;
  o.log = nullptr;
  std::vector<MutantResult> rows;
  for (const Subject& m : mutant_subjects()) {
    const auto t0 = std::chrono::steady_clock::now();
    MutantResult row;
    row.mutant = m.name;
    row.fault = m.fault;
    for (const auto& r : run_suite(m, o))
      if (r.verdict == Verdict::Fail) {
        row.kills.push_back(r.property);
        if (row.caught) continue;
        row.caught = true;
        row.caught_by = r.property;
        // The first informative line: skip RapidCheck's "Falsifiable after..." header.
        std::istringstream is(r.message);
        std::string l;
        while (std::getline(is, l))
          if (!l.empty() && l.rfind("Falsifiable", 0) != 0 && l.find("RC_") == std::string::npos) {
            row.message = l;
            break;
          }
      }
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rows.push_back(row);
  }
  return rows;
}

std::string format_mutation_table(const std::vector<MutantResult>& rows) {
  std::ostringstream os;
  char line[640];
  std::snprintf(line, sizeof line, "  %-38s %-6s %-44s %5s %6s  %s\n", "mutant", "caught",
                "caught by (first)", "kills", "sec", "fault");
  os << line;
  int caught = 0;
  for (const auto& r : rows) {
    caught += r.caught;
    const std::string kills = std::to_string(r.kills.size());
    std::snprintf(line, sizeof line, "  %-38s %-6s %-44s %5s %6.2f  %s\n", r.mutant.c_str(),
                  r.caught ? "yes" : "NO", r.caught_by.c_str(), kills.c_str(), r.seconds,
                  r.fault.c_str());
    os << line;
  }
  os << "  mutation score: " << caught << "/" << rows.size()
     << "   (kills: failing properties; 1 when the run stops at the first)\n";
  return os.str();
}

std::string format_kill_matrix(const std::vector<MutantResult>& rows) {
  std::ostringstream os;
  for (const auto& p : all_properties()) {
    std::vector<std::string> by;
    for (const auto& r : rows)
      if (std::find(r.kills.begin(), r.kills.end(), p.name) != r.kills.end()) by.push_back(r.mutant);
    os << "  " << p.name << ": ";
    if (by.empty()) os << "(catches no mutant)";
    for (size_t i = 0; i < by.size(); ++i) os << (i ? ", " : "") << by[i];
    os << "\n";
  }
  return os.str();
}

}  // namespace dsa::props

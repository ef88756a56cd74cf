// The property runner (RapidCheck driven programmatically) and the mutation analysis.
#include <rapidcheck.h>
#include <rapidcheck/detail/TestListener.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <sstream>

#include "dsa/oracle/scoped_case_memo.h"
#include "dsa/property_tests/run_suites.h"
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
    add_declared_model_properties(p);
    return p;
  }();
  return props;
}

bool declares(const oracle::RoundingModel& m, const std::string& name) {
  if (name.empty()) return true;
  if (name == "normalized_p") return m.normalized_p;
  if (name == "sink_after_rounding") return m.sink_after_rounding;
  throw std::invalid_argument("declares: unknown rounding model \"" + name +
                              "\"; expected \"normalized_p\" or \"sink_after_rounding\"");
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

namespace {
struct FeatureInfo {
  const char* key;
  bool mandatory;
  const char* description;
};
// SPEC §1-§4, §6, §7 and §10: what every kernel must handle, then the optional inputs.
const FeatureInfo kFeatures[] = {
    {"invalid_ids", true, "invalid ids (-1, negative, >= s_kv or past topk_length: contribute nothing; SPEC §4)"},
    {"empty_rows", true, "empty rows (no valid slot: out 0, lse +inf; SPEC §6)"},
    {"duplicate_ids", true, "duplicate ids (separate terms; SPEC §4)"},
    {"neg_inf_scores", true, "-inf scores (never selected, -1 slots; SPEC §3.1-§3.2)"},
    {"nan_scores", true, "NaN scores (never selected; SPEC §3.1)"},
    {"k_boundary_ties", true,
     "ties at the k-th value (more selectable entries equal to v* than free slots: the tie fill; "
     "SPEC §3.3, 'the normal case')"},
    {"poisoned_unread", true,
     "unread §10 parts holding anything (table entries past a context out of range or -1, cache "
     "slots and tokens no valid read uses full of NaN bytes and invalid scales; SPEC §10)"},
    {"empty_windows", true,
     "empty key windows (a query row with ks >= ke: an indexer row all -inf, a KL row with no term; "
     "SPEC §1, §6, §7)"},
    {"negative_weights", true, "negative head weights w (SPEC §2: w may be negative)"},
    {"short_context", true,
     "paged contexts shorter than next_n (the first queries' MTP windows empty; SPEC §1, §10)"},
    {"attn_sink", false, "attention sinks (optional input; SPEC §4)"},
    {"topk_length", false, "topk_length (optional input; SPEC §4)"},
    {"indices_view", false, "[s_q, 1, k] ids view (SPEC §4)"},
    {"fp32_inputs", false, "fp32 q/kv (reference runs; SPEC §4)"},
};
const FeatureInfo* find_feature(const std::string& key) {
  for (const auto& f : kFeatures)
    if (key == f.key) return &f;
  return nullptr;
}
// True when `names` (--unsupported) covers the feature `what` of property `prop`: the feature
// key (or empty rows through invalid ids: oracle::unsupported_covers), or the property's name
// or family (the user leaves the whole property out).
bool waived_by(const std::vector<std::string>& names, const std::string& what, const std::string& prop,
               bool invalid_present) {
  for (const auto& n : names)
    if (n == prop || prop.rfind(n + ".", 0) == 0) return true;
  return oracle::unsupported_covers(names, what, invalid_present);
}
// A limit the backend declared up front (its capabilities), not a run-time decline: such draws
// are discarded and counted, never taken as a declined mandatory behaviour.
bool declared_limitation(const std::string& why) { return oracle::declared_limitation(why); }
}  // namespace

const std::vector<std::string>& draw_feature_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& f : kFeatures) k.push_back(f.key);
    return k;
  }();
  return keys;
}

bool mandatory_feature(const std::string& key) {
  const FeatureInfo* f = find_feature(key);
  return f && f->mandatory;
}

std::string feature_description(const std::string& key) {
  const FeatureInfo* f = find_feature(key);
  if (!f) throw std::invalid_argument("feature_description: unknown feature key \"" + key + "\"");
  return f->description;
}

void validate_unsupported(const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (find_feature(n)) continue;
    const bool prop = std::any_of(all_properties().begin(), all_properties().end(), [&](const Property& p) {
      return p.name == n || p.name.rfind(n + ".", 0) == 0;
    });
    if (prop) continue;
    std::string keys;
    for (const auto& k : draw_feature_keys()) keys += (keys.empty() ? "" : ", ") + k;
    throw std::invalid_argument("--unsupported: unknown entry \"" + n + "\"; expected a feature (" + keys +
                                ") or a property name or family (see --list)");
  }
}

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
  // The checks judge with the rounding models the run or the backend declares, as the audit's
  // property tasks do (cli/src/audit_tasks.cpp), so a declaring subject is judged alike on every
  // route (mutation runs call run_property directly).
  oracle::CheckOptions check = o.check;
  check.rounding = oracle::either(check.rounding, backend->rounding_model());
  if (!declares(check.rounding, p.declared_model)) {
    r.verdict = Verdict::Skip;
    r.message = "checks the rounding model " + p.declared_model +
                ", which the backend does not declare (--normalized-p / --sink-after-rounding, a plugin's "
                "rounding_models, a Python backend attribute): nothing to check";
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
  set_unsupported_names(o.unsupported);
  set_generation_level(o.level);
  oracle::Backend& b = *backend;
  // A draw the backend declines (NotSupported: a plugin's DSA_STATUS_UNSUPPORTED, a Python
  // backend's NotImplementedError) is discarded and another drawn, so the property still
  // judges its full count of draws on what the backend supports (fresh-user finding F3). Per
  // draw feature (note_draw_feature): draws judged, declined, and declined without any
  // optional input (the decline can only be about the shape or a mandatory behaviour).
  // `proven`: declined draws whose twin without the feature the backend ran (note_declined_for);
  // such a draw counts as declined for those features alone (fresh-user F6: a draw with NaN and
  // -inf declined for its -inf is no declined NaN case).
  struct Tally {
    int judged = 0, declined = 0, declined_plain = 0, proven = 0;
  };
  std::map<std::string, Tally> features;
  std::map<std::string, int> reasons;
  int judged = 0, declined = 0;
  int nothing = 0;          // draws that judged nothing (discarded and redrawn, not declines)
  std::string nothing_why;  // the last one's reason
  bool counting = true;  // false from the first failure on (shrinking re-runs the body)
  int failing_draw_index = 0;  // draws (judged or declined) before the first failing one
  // With none judged after this many declines the backend declines the property: nothing more
  // is drawn. Not fewer: RapidCheck's size starts at 0 and grows by one per 10 discards in a
  // row, and size-scaled draws (gen::inRange: h_q, s_q) reach past their minimum only from
  // size ~5-25 on, so a backend that declines h_q 1 declines the first tens of draws.
  constexpr int kStopAfterDeclines = 100;
  auto tally = [&](bool was_declined, bool declared = false, const std::vector<std::string>& proven = {}) {
    if (!counting) return;
    (was_declined ? declined : judged) += 1;
    if (declared) return;
    for (const auto& f : proven) ++features[f].proven;
    bool optional = false;
    for (const auto& f : draw_features()) optional = optional || !mandatory_feature(f);
    for (const auto& f : draw_features()) {
      if (was_declined && !proven.empty() && std::find(proven.begin(), proven.end(), f) == proven.end()) continue;
      Tally& t = features[f];
      if (!was_declined) ++t.judged;
      else {
        ++t.declined;
        if (!optional) ++t.declined_plain;
      }
    }
  };
  // The op of the report assertion that failed in the last failing execution (the reported,
  // shrunk case): a forward property's backward part fails under sparse_mla_bwd.
  std::string failed_op;
  bool dumped = false;  // a failing execution of this run saved its case at dump_path
  bool stopped = false;  // o.stop_requested() returned true: nothing more is drawn or called
  const auto property = rc::detail::toProperty([&] {
    if (stopped || (o.stop_requested && o.stop_requested())) {
      stopped = true;
      return;
    }
    if (declined + nothing >= kStopAfterDeclines && judged == 0) return;  // nothing more drawn
    reset_failing_op();
    take_judged_nothing();
    take_declined_for();
    clear_draw_features();
    // The many-row generators' first draw is their largest. Shrinking re-runs the body
    // with the failing draw's choices: it sees the draw index the failing execution saw.
    const int draw_index = counting ? judged + declined : failing_draw_index;
    set_draw_index(draw_index);
    clear_pending_dump();
    // The checks of this draw share their reference results: in the caller's memo when one is
    // in scope (run_suites), else in this draw's own.
    std::optional<oracle::ScopedCaseMemo> draw_memo;
    if (!oracle::scoped_case_memo()) draw_memo.emplace(std::make_shared<oracle::CaseMemo>());
    std::string why;
    try {
      p.body(b, s.block);
    } catch (const oracle::NotSupported& e) {
      clear_pending_dump();  // a declined draw is no failing case: not dumped
      why = e.what();
      if (why.empty()) why = "not supported";
    } catch (const rc::detail::CaseResult& res) {
      const std::string why_nothing = take_judged_nothing();
      if (res.type == rc::detail::CaseResult::Type::Discard && counting && !why_nothing.empty()) {
        ++nothing;
        nothing_why = why_nothing;
      }
      if (res.type == rc::detail::CaseResult::Type::Failure) {
        dumped |= save_pending_dump();  // shrinking: the last one saved is the minimal case
        failed_op = failing_op();
        if (counting) failing_draw_index = draw_index;
        tally(false);
        counting = false;
      }
      clear_pending_dump();  // a discarded draw (judged nothing, e.g. k = 0) is not dumped
      throw;  // a discard (RC_PRE) leaves the last failure's op
    } catch (...) {
      dumped |= save_pending_dump();
      failed_op = failing_op();  // an exception fails the case too
      if (counting) failing_draw_index = draw_index;
      tally(false);
      counting = false;
      throw;
    }
    if (!why.empty()) {
      // Up to 400 characters: a plugin's reason follows its name, path and op ("plugin 'x'
      // (/path/libx.so): sparse_mla_fwd: plugin returned DSA_STATUS_UNSUPPORTED: <its message>"),
      // which 160 characters cut off under a long build path.
      if (counting) ++reasons[why.substr(0, 400)];
      tally(true, declared_limitation(why), take_declined_for());
      RC_DISCARD("declined by the backend: " + why);
    }
    tally(false);
  });
  NullListener quiet;
  const oracle::ScopedCheckDefaults check_defaults(check);
  const auto result = o.quiet ? rc::detail::checkProperty(property, md, params, quiet)
                              : rc::detail::checkProperty(property, md, params);
  clear_pending_dump();
  set_dump_target("");
  set_selected_ops({});
  set_unsupported_names({});
  set_generation_level(0);
  set_draw_index(0);

  r.drawn = judged + declined;
  r.declined = declined;
  r.judged_nothing = nothing;
  r.stopped = stopped;
  if (stopped && !result.template is<rc::detail::FailureResult>()) {
    // The draws after the stop returned without running: no verdict either way.
    r.verdict = Verdict::Skip;
    r.cases = judged;
    r.message = "stopped after " + std::to_string(judged) + " judged draw(s), before the property finished "
                "(SuiteOptions::stop_requested); not a verdict";
    return r;
  }
  if (declined > 0) {
    std::vector<std::pair<int, std::string>> by;
    for (const auto& [why, n] : reasons) by.push_back({n, why});
    std::sort(by.begin(), by.end(), [](const auto& a, const auto& x) { return a.first > x.first; });
    for (size_t i = 0; i < by.size() && i < 3; ++i)
      r.declined_why += (i ? "; " : "") + by[i].second + (by.size() > 1 ? " (" + std::to_string(by[i].first) + ")" : "");
    if (by.size() > 3) r.declined_why += "; ...";
  }
  const std::string declined_note = "declined " + std::to_string(declined) + " of " + std::to_string(r.drawn) +
                                    " draws: " + r.declined_why;
  // SPEC-mandatory behaviour never judged: the backend ran the property (judged draws) but
  // declined a mandatory feature's plain draws (no optional input) and judged none with it. A
  // property of which no draw was judged is a skip naming the reasons (the backend runs none
  // of it, as a NotImplementedError op), never INCOMPLETE.
  std::vector<std::string> missing_lines;
  auto missing = [&](const std::string& what, const std::string& line) {
    const bool waived = waived_by(o.unsupported, what, p.name, features.count("invalid_ids") > 0);
    (waived ? r.waived : r.mandatory_declined).push_back(what);
    if (!waived) missing_lines.push_back(line);
  };
  // A decline proven to be about the feature (the backend ran the draw's twin without it)
  // counts even when no draw was judged (the backend runs the op, just not this SPEC case) and
  // when other draws with it were judged (the decline depends on the values, as a fixture's).
  for (const auto& [key, t] : features) {
    if (!mandatory_feature(key)) continue;
    if (t.judged == 0 && ((judged > 0 && t.declined_plain > 0) || t.proven > 0))
      // (a property that notes no draw features counts the proven draws only)
      missing(key, feature_description(key) + ": every one of the " + std::to_string(std::max(t.declined, t.proven)) +
                       " draws that had it declined, none judged" +
                       (t.proven > 0 ? " (the backend ran " + std::to_string(t.proven) + " of them with it taken out)"
                                     : std::string()));
    else if (t.proven > 0)
      missing(key, feature_description(key) + ": the backend declined " + std::to_string(t.proven) +
                       " draws holding it but ran the same draws with it taken out (the decline depends on the "
                       "values; " + std::to_string(t.judged) + " other draws with it judged)");
  }
  const bool failed = result.template is<rc::detail::FailureResult>();
  if (!failed && !missing_lines.empty()) {
    r.verdict = Verdict::Fail;
    r.cases = judged;
    std::string keys;
    for (const auto& m : r.mandatory_declined) keys += (keys.empty() ? "" : ",") + m;
    r.message = "INCOMPLETE: backend declined mandatory cases: ";
    for (size_t i = 0; i < missing_lines.size(); ++i) r.message += (i ? "; " : "") + missing_lines[i];
    r.message += " (" + declined_note + "). A kernel that leaves them out is audited with --unsupported " + keys +
                 " (Python: unsupported=[...]); the verdict then names what was not judged.";
    if (o.log) *o.log << "[INCOMPLETE] " << s.name << " " << p.name << ": " << r.message << "\n";
    return r;
  }
  const std::string waived_note = r.waived.empty() ? "" : " (not judged, named unsupported: " + [&] {
    std::string w;
    for (const auto& x : r.waived) w += (w.empty() ? "" : ", ") + x;
    return w;
  }() + ")";
  // A property about one feature (Property::needs) that judged no draw with it: a skip.
  if (!failed && judged > 0 && !p.needs.empty() && features[p.needs].judged == 0) {
    r.verdict = Verdict::Skip;
    r.cases = judged;
    r.message = "judged no draw with " + feature_description(p.needs) + " (" + std::to_string(judged) +
                " judged draw(s) without it passed" + (declined > 0 ? "; " + declined_note : std::string()) + ")" +
                waived_note;
    return r;
  }
  if (!failed && judged == 0 && declined == 0 && nothing > 0) {
    // Every draw judged nothing (e.g. only outputs no draw defines): a skip, never a pass.
    r.verdict = Verdict::Skip;
    r.message = "judged nothing in any of " + std::to_string(nothing) + " draws: " + nothing_why;
    return r;
  }
  if (!failed && judged == 0 && declined > 0) {
    r.verdict = Verdict::Skip;
    r.message = "not supported by the backend: declined every one of " + std::to_string(declined) +
                " draws: " + r.declined_why + waived_note;
    return r;
  }
  if (result.template is<rc::detail::GaveUpResult>()) {
    r.verdict = Verdict::Skip;
    r.cases = judged;
    r.message = "not supported by the backend (nearly every draw): " + declined_note + "; " +
                std::to_string(judged) + " judged draw(s) passed" + waived_note;
    return r;
  }
  if (result.template is<rc::detail::SuccessResult>()) {
    r.cases = judged;
    if (declined > 0) r.message = declined_note + waived_note;
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
    if (dumped) r.dumped = dump_path;  // never a file an earlier run left there
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

namespace {
// The properties run_suite runs for s, in its order: o.only's, the subject's focus first.
std::vector<const Property*> suite_order(const Subject& s, const SuiteOptions& o) {
  std::vector<const Property*> order;
  for (const auto& p : all_properties())
    if (o.only.empty() || std::any_of(o.only.begin(), o.only.end(), [&](const std::string& e) {
          return p.name == e || p.name.rfind(e + ".", 0) == 0;
        }))
      order.push_back(&p);
  if (!s.focus.empty())
    std::stable_partition(order.begin(), order.end(),
                          [&](const Property* p) { return p->name.rfind(s.focus, 0) == 0; });
  return order;
}
}  // namespace

std::vector<PropertyResult> run_suite(const Subject& s, const SuiteOptions& o) {
  std::vector<PropertyResult> out;
  for (const Property* p : suite_order(s, o)) {
    out.push_back(run_property(s, *p, o));
    if (o.stop_at_first_failure && out.back().verdict == Verdict::Fail) break;
  }
  return out;
}

std::vector<std::vector<PropertyResult>> run_suites(const std::vector<Subject>& subjects, const SuiteOptions& o) {
  if (o.stop_at_first_failure)
    throw std::invalid_argument("run_suites: stop_at_first_failure is not supported (use run_suite)");
  // Each subject's rows in run_suite's order; the properties run in all_properties() order,
  // each for every subject that runs it, on one memo.
  std::vector<std::vector<PropertyResult>> out(subjects.size());
  std::vector<std::map<const Property*, size_t>> position(subjects.size());
  for (size_t i = 0; i < subjects.size(); ++i) {
    const auto order = suite_order(subjects[i], o);
    out[i].resize(order.size());
    for (size_t j = 0; j < order.size(); ++j) position[i][order[j]] = j;
  }
  for (const auto& p : all_properties()) {
    const oracle::ScopedCaseMemo memo(std::make_shared<oracle::CaseMemo>());  // p's draws, every subject's
    for (size_t i = 0; i < subjects.size(); ++i) {
      const auto at = position[i].find(&p);
      if (at != position[i].end()) out[i][at->second] = run_property(subjects[i], p, o);
    }
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

std::vector<MutantResult> run_mutation_analysis(const SuiteOptions& o, bool full_matrix) {
  return run_mutation_analysis(o, full_matrix, mutant_subjects());
}

std::vector<MutantResult> run_mutation_analysis(const SuiteOptions& o_in, bool full_matrix,
                                                const std::vector<Subject>& mutants) {
  SuiteOptions o = o_in;
  o.stop_at_first_failure = !full_matrix;
  o.shrink = false;
  o.dump = false;
  o.quiet = true;
  o.log = nullptr;
  std::vector<MutantResult> rows;
  for (const Subject& m : mutants) {
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

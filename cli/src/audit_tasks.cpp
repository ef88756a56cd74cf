#include "audit_tasks.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <mutex>
#include <set>
#include <tuple>

#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/fixture_check.h"
#include "judge.h"

namespace fs = std::filesystem;

namespace dsa::cli {

std::string status_of(oracle::Verdict v) {
  // Weak and Incomplete fail like Fail (SPEC §9); only Skip is a skip.
  return v == oracle::Verdict::Pass ? "pass" : v == oracle::Verdict::Skip ? "skip" : "fail";
}

bool op_selected(const AuditOptions& o, const std::string& op) {
  return o.ops.empty() || std::find(o.ops.begin(), o.ops.end(), op) != o.ops.end();
}

double worst_ratio(const oracle::OpReport& r) {
  double w = 0.0;
  for (const auto& t : r.tensors)
    if (std::isfinite(t.ratio)) w = std::max(w, t.ratio);
  return w;
}

double worst_err_over_bound(const oracle::OpReport& r) {
  double w = 0.0;
  for (const auto& t : r.tensors)
    if (!std::isnan(t.worst)) w = std::max(w, t.worst);
  return w;
}

int64_t nonfinite_mismatches(const oracle::OpReport& r) {
  int64_t n = 0;
  for (const auto& t : r.tensors) n += t.metrics.nonfinite_mismatches;
  return n;
}

void set_measured(CaseResult& c, const oracle::OpReport& r) {
  c.worst_ratio = worst_ratio(r);
  c.worst_err_over_bound = worst_err_over_bound(r);
  c.nonfinite_mismatches = nonfinite_mismatches(r);
  c.has_ratio = !r.tensors.empty();
}

std::vector<std::string> not_judged_outputs(const props::Property& p,
                                            const std::optional<std::set<std::string>>& provided) {
  std::vector<std::string> out;
  if (!provided) return out;
  for (oracle::Op op : p.ops)  // an op none of whose outputs is named is judged in full
    for (const auto& n : oracle::not_judged_outputs(op, provided))
      if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  return out;
}

std::vector<std::string> list_fixtures(const std::string& dir) {
  std::vector<std::string> files;
  if (!fs::is_directory(dir)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> check_fixture_dirs(const FixtureDirs& dirs) {
  const std::string both = dirs.golden + " and " + dirs.peer;
  if (!fs::is_directory(dirs.golden) || !fs::is_directory(dirs.peer))
    throw std::invalid_argument("audit: fixture directories " + both +
                                " must exist (set DSA_FIXTURES_DIR to the repo's fixtures/ folder)");
  const bool golden = !list_fixtures(dirs.golden).empty(), peer = !list_fixtures(dirs.peer).empty();
  if (!golden && !peer)
    throw std::invalid_argument("audit: fixture directories " + both +
                                " hold no fixture (*.safetensors): the audit would judge no golden and no peer "
                                "case (set DSA_FIXTURES_DIR to the repo's fixtures/ folder, or run properties "
                                "alone with --only)");
  std::vector<std::string> notes;
  for (const auto& [has, kind, dir] : {std::tuple{golden, "golden", dirs.golden}, std::tuple{peer, "peer", dirs.peer}})
    if (!has)
      notes.push_back(std::string("audit: no ") + kind + " fixture (*.safetensors) in " + dir + ": no " + kind +
                      " case is judged (DSA_FIXTURES_DIR)");
  return notes;
}

namespace {
// The audited backend as a fixture task sees it under --ops: an op outside the selection is
// not supported (check_fixture skips it; the backend is never called for it), except the
// forward when the backward is selected: the backward's baseline takes Δ at the dtype of the
// candidate's own out (SPEC §9), as without --ops; its forward report is dropped by the task.
class SelectedOpsBackend final : public oracle::Backend {
 public:
  SelectedOpsBackend(oracle::Backend& inner, const AuditOptions& o) : inner_(inner), o_(o) {}
  std::string name() const override { return inner_.name(); }
  std::string unavailable_reason() const override { return inner_.unavailable_reason(); }
  bool deterministic() const override { return inner_.deterministic(); }
  bool computes_reference() const override { return inner_.computes_reference(); }
  bool supports(oracle::Op op) const override { return inner_.supports(op) && runs(op); }
  std::optional<std::set<std::string>> provided_outputs() const override { return inner_.provided_outputs(); }
  oracle::RoundingModel rounding_model() const override { return inner_.rounding_model(); }
  bool fp8_reduced_accumulation() const override { return inner_.fp8_reduced_accumulation(); }
  oracle::CallFailure classify_failure(const std::exception& e) const override { return inner_.classify_failure(e); }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    need(oracle::Op::IndexerScores);
    return inner_.indexer_scores(q, k, w, win);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win,
                                       const Tensor& d) override {
    need(oracle::Op::IndexerScoresBackward);
    return inner_.indexer_scores_backward(q, k, w, win, d);
  }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    need(oracle::Op::Topk);
    return inner_.select_topk(s, k, p, w);
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    need(oracle::Op::SparseMlaFwd);
    return inner_.sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    need(oracle::Op::SparseMlaBwd);
    return inner_.sparse_mla_backward(in, dout);
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    need(oracle::Op::IndexerKlLoss);
    return inner_.indexer_kl_loss(in);
  }
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    need(oracle::Op::Fp8IndexerScores);
    return inner_.fp8_indexer_scores(in);
  }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    need(oracle::Op::PagedIndexerScores);
    return inner_.paged_indexer_scores(in);
  }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    need(oracle::Op::SparseMlaFp8Fwd);
    return inner_.sparse_mla_fp8_forward(in);
  }

 private:
  bool runs(oracle::Op op) const {
    if (op_selected(o_, oracle::to_string(op))) return true;
    return op == oracle::Op::SparseMlaFwd && op_selected(o_, oracle::to_string(oracle::Op::SparseMlaBwd));
  }
  void need(oracle::Op op) const {
    if (!runs(op)) throw oracle::NotSupported(std::string("op ") + oracle::to_string(op) + " not selected (--ops)");
  }
  oracle::Backend& inner_;
  const AuditOptions& o_;
};
}  // namespace

// Fixture tasks: one per file; each yields one case per op the fixture covers.
void add_fixture_tasks(std::vector<AuditTask>& tasks, const std::string& dir, const std::string& kind,
                       oracle::Backend& backend, const AuditOptions& opts, const ReproCommands& repro_cmds) {
  for (const auto& file : list_fixtures(dir)) {
    std::string stem = fs::path(file).stem().string();
    tasks.push_back({"fixture", kind + ":" + stem, [file, kind, stem, &backend, &opts, replay = repro_cmds.replay]() {
      std::vector<CaseResult> out;
      fixtures::Fixture f = fixtures::load_fixture(file);
      // A fixture none of whose ops is selected (--ops) is not run: the backend is never called
      // for an op outside the selection (a skip in the progress line).
      const std::vector<oracle::Op> ops = oracle::fixture_ops(f);
      if (std::none_of(ops.begin(), ops.end(), [&](oracle::Op op) { return op_selected(opts, oracle::to_string(op)); }))
        return out;
      // The same judging code and options as compare, replay and fixtures check; under --ops the
      // backend is not called for an op outside the selection.
      SelectedOpsBackend selected(backend, opts);
      oracle::Backend& judged = opts.ops.empty() ? backend : static_cast<oracle::Backend&>(selected);
      const oracle::OpCase fc = oracle::op_case_from_fixture(f);
      {  // inputs the reference rejects: one input error (exit 2) before the producer or the backend
        std::vector<oracle::Op> judged_ops;
        for (oracle::Op op : ops)
          if (op_selected(opts, oracle::to_string(op))) judged_ops.push_back(op);
        check_fixture_inputs(f, fc, judged_ops);
      }
      // check_fixture in two steps (producer, then the backend), so that running out of memory
      // in either keeps the reports judged before it (TaskResourceError below).
      oracle::CheckOptions opt = check_options(opts.judge, false, backend);
      opt.unsupported = opts.unsupported;  // a declined mandatory case the user names: a skip
      oracle::FixtureReport r;
      std::string out_of_memory;
      bool producer_done = false;
      try {
        r = oracle::check_fixture(f, fc, nullptr, opt);
        producer_done = true;
        r.backend_vs_reference = oracle::judge_fixture_ops(f, fc, judged, opt);
      } catch (const oracle::ResourceError& e) {
        out_of_memory = e.what();
        (producer_done ? r.backend_vs_reference : r.producer_vs_reference) = e.partial;
      }
      {  // as fixtures check: a producer's undeclared representation gets its hint
        const oracle::CandidateBackend producer = oracle::expected_candidate(f);
        add_convention_hints(r.producer_vs_reference, producer, &fc, HintRoute::FixtureField);
      }
      std::string repro = replay(file);
      for (const auto& op : r.backend_vs_reference) {
        if (!op_selected(opts, op.op)) continue;
        CaseResult c = make_case(op.op, kind + ":" + stem, status_of(op.verdict));
        set_measured(c, op);
        c.cases = op.verdict == oracle::Verdict::Skip ? 0 : 1;  // a skip judged nothing
        c.message = op.verdict == oracle::Verdict::Pass ? "" : op.reason;
        if (op.verdict == oracle::Verdict::Pass) c.not_judged = op.not_judged;  // partial
        if (!op.passed()) {
          c.message += "\n" + oracle::format_op_report(op);
          c.repro = repro;
          c.fixture = file;
        }
        out.push_back(c);
      }
      // The producer's expected.* are judged by the same check_op: a shipped fixture that
      // deviates from the contract is a failed case of its own.
      for (const auto& p : r.producer_vs_reference) {
        if (p.passed() || !op_selected(opts, p.op)) continue;
        CaseResult c = make_case("fixture", kind + ":" + stem + " (producer " + p.op + ")", "fail");
        c.message = p.reason + "\n" + oracle::format_op_report(p);
        c.repro = "dsa-verify fixtures check " + file;
        c.fixture = file;
        out.push_back(c);
      }
      if (!out_of_memory.empty()) throw TaskResourceError(out_of_memory, std::move(out));
      return out;
    }});
  }
}

bool property_selected(const AuditOptions& o, const props::Property& p) {
  if (!o.only.empty() && std::find(o.only.begin(), o.only.end(), p.name) == o.only.end()) return false;
  // Every op the property needs must be selected: --ops sparse_mla_fwd runs no block property
  // (it judges the backward too); optional parts follow SuiteOptions::ops (props::judges).
  for (oracle::Op op : p.ops)
    if (!op_selected(o, oracle::to_string(op))) return false;
  return true;
}

std::vector<oracle::Op> selected_ops(const AuditOptions& o) {
  std::vector<oracle::Op> ops;
  for (oracle::Op op : oracle::all_ops())
    if (!o.ops.empty() && op_selected(o, oracle::to_string(op))) ops.push_back(op);
  return ops;
}

// Property tasks: one per property of the suite (dsa/property_tests/suite.h).
void add_property_tasks(std::vector<AuditTask>& tasks, const props::Subject& subject,
                        const AuditOptions& opts, const ReproCommands& repro_cmds) {
  // The outputs the subject declares it writes (a plugin's provided_outputs) are judged like
  // --outputs: the others are not judged (SPEC §9 complete outputs).
  std::optional<std::set<std::string>> declared;
  oracle::RoundingModel declared_rounding;  // the subject's rounding models (a plugin's rounding_models)
  if (subject.make) {
    try {
      const std::unique_ptr<oracle::Backend> b = subject.make();
      declared = b->provided_outputs();
      declared_rounding = b->rounding_model();
    } catch (const std::exception&) {
      // A backend that cannot be created fails in each property, with its own message.
    }
  }
  for (const props::Property& p : props::all_properties()) {
    if (!property_selected(opts, p)) continue;
    // A property that checks a rounding model (Property::declared_model) is no task for a
    // subject that declares none: the audit of such a backend is unchanged.
    if (!props::declares(oracle::either(check_options(opts.judge, false).rounding, declared_rounding),
                         p.declared_model))
      continue;
    std::string op = p.name.rfind("block.", 0) == 0 || p.ops.empty() ? "dsa_block"
                                                                  : oracle::to_string(p.ops.front());
    tasks.push_back({op, p.name, [&subject, &p, op, &opts, declared, declared_rounding, audit = repro_cmds.audit]() {
      props::SuiteOptions so;
      so.level = opts.level;
      so.seed = opts.seed;
      so.dump_dir = opts.dump_dir;
      so.check = check_options(opts.judge, false);  // --outputs, --allow-weak: as the fixtures
      // Either the flags or the subject declares a rounding model, as judge_fixture_ops joins them.
      so.check.rounding = oracle::either(so.check.rounding, declared_rounding);
      so.ops = selected_ops(opts);  // a forward property judges its backward part only if selected
      so.unsupported = opts.unsupported;  // declined mandatory cases the user accepts
      so.stop_requested = opts.stop_requested;  // an interrupted audit stops between draws
      if (declared) {
        std::set<std::string> both;
        for (const auto& n : *declared)
          if (!so.check.provided_outputs || so.check.provided_outputs->count(n)) both.insert(n);
        so.check.provided_outputs = both;
      }
      so.quiet = true;
      // Through a plugin every call is a forked child with a timeout: no shrinking, so a
      // hanging or crashing kernel costs one timeout per property, not one per shrink step.
      so.shrink = opts.plugin.empty();
      so.repro_command = audit + " --only " + p.name +
                         " --level " + std::to_string(opts.level);
      // RapidCheck keeps its configuration in process-wide state: one property at a time,
      // while fixture tasks run alongside (--jobs).
      static std::mutex rapidcheck_mu;
      std::unique_lock<std::mutex> one_property(rapidcheck_mu);
      props::PropertyResult r = props::run_property(subject, p, so);
      one_property.unlock();
      // A failure is filed under the op whose check failed (a forward property's backward part
      // fails under sparse_mla_bwd), else under the property's op.
      const bool known_op = std::any_of(oracle::all_ops().begin(), oracle::all_ops().end(),
                                        [&](oracle::Op x) { return r.failed_op == oracle::to_string(x); });
      CaseResult c = make_case(known_op && op != "dsa_block" ? r.failed_op : op, "property:" + p.name,
                               status_of(r.verdict));
      if (r.verdict == oracle::Verdict::Pass) {
        c.not_judged = not_judged_outputs(p, so.check.provided_outputs);
        // A pass that left out declined draws the user named (--unsupported) is partial, never a
        // plain pass: "partial: neg_inf_scores cases not judged" (fresh12 F8).
        for (const auto& w : r.waived) c.not_judged.push_back(w + " cases");
      }
      c.cases = r.cases;
      c.message = r.message;
      c.repro = r.repro;
      c.fixture = r.dumped;
      return std::vector<CaseResult>{c};
    }});
  }
}

// Unknown op or property names are usage errors, not an empty (and green) audit.
void validate_selection(const AuditOptions& o) {
  props::validate_unsupported(o.unsupported);  // --unsupported: feature keys or properties
  std::string known_ops;
  for (oracle::Op op : oracle::all_ops()) known_ops += std::string(known_ops.empty() ? "" : ", ") + oracle::to_string(op);
  for (const auto& name : o.ops) {
    bool ok = false;
    for (oracle::Op op : oracle::all_ops()) ok |= name == oracle::to_string(op);
    if (!ok) throw std::invalid_argument("audit: argument '--ops' got \"" + name + "\", expected one of " + known_ops);
  }
  for (const auto& name : o.only) {
    bool ok = false;
    for (const auto& p : props::all_properties()) ok |= name == p.name;
    if (!ok)
      throw std::invalid_argument("audit: argument '--only' got \"" + name +
                                  "\", expected a property name (see the audit table, e.g. topk.contract_exact)");
  }
  // A property --only names whose ops --ops does not all select would silently not run: a
  // usage error naming both, the ops it needs and the properties --ops leaves to choose from.
  if (o.only.empty() || o.ops.empty()) return;
  std::string ops_list;
  for (const auto& n : o.ops) ops_list += (ops_list.empty() ? "" : ",") + n;
  for (const auto& name : o.only) {
    for (const auto& p : props::all_properties()) {
      if (p.name != name) continue;
      AuditOptions ops_only = o;
      ops_only.only.clear();
      if (property_selected(ops_only, p)) break;
      std::string needs, missing, choices;
      for (oracle::Op op : p.ops) {
        needs += (needs.empty() ? "" : ", ") + std::string(oracle::to_string(op));
        if (!op_selected(o, oracle::to_string(op)))
          missing += (missing.empty() ? "" : ",") + std::string(oracle::to_string(op));
      }
      for (const auto& q : props::all_properties())
        if (property_selected(ops_only, q)) choices += (choices.empty() ? "" : ", ") + q.name;
      throw std::invalid_argument(
          "audit: arguments '--only' and '--ops' clash: --only names \"" + name + "\", a property of " +
          needs + ", but --ops " + ops_list + " does not select " + missing + ". With --ops " + ops_list +
          ", --only takes one of: " + (choices.empty() ? std::string("(no property)") : choices) +
          "; or add " + missing + " to --ops");
    }
  }
}

}  // namespace dsa::cli

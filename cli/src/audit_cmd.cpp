// `dsa-verify audit`: the main job. For each chosen backend, runs the property suite, the
// golden fixtures and the peer fixtures op by op through the oracle, shows progress, prints
// the summary table and writes JSON / JUnit reports.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "commands.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/plugin/plugin_backend.h"
#include "dsa/property_tests/suite.h"
#include "report.h"

namespace fs = std::filesystem;

namespace dsa::cli {
namespace {

// One unit of audit work: produces one or more case results when run.
struct AuditTask {
  std::string op, property;
  std::function<std::vector<CaseResult>()> run;
};

// Report status of an oracle verdict: "pass" | "fail" | "skip".
std::string status_of(oracle::Verdict v) {
  return v == oracle::Verdict::Pass ? "pass" : v == oracle::Verdict::Fail ? "fail" : "skip";
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

std::vector<std::string> list_fixtures(const std::string& dir) {
  std::vector<std::string> files;
  if (!fs::is_directory(dir)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// How a reproduction command names what was audited: --plugin PATH or --backend NAME.
std::string target_flag(const AuditOptions& o, const std::string& backend) {
  return o.plugin.empty() ? "--backend " + backend : "--plugin " + o.plugin;
}

// Fixture tasks: one per file; each yields one case per op the fixture covers.
void add_fixture_tasks(std::vector<AuditTask>& tasks, const std::string& dir, const std::string& kind,
                       oracle::Backend& backend, const AuditOptions& opts) {
  for (const auto& file : list_fixtures(dir)) {
    std::string stem = fs::path(file).stem().string();
    tasks.push_back({"fixture", kind + ":" + stem, [file, kind, stem, &backend, &opts]() {
      std::vector<CaseResult> out;
      fixtures::Fixture f = fixtures::load_fixture(file);
      oracle::FixtureReport r = oracle::check_fixture(f, &backend);
      std::string repro = "dsa-verify replay " + file + " " + target_flag(opts, backend.name());
      for (const auto& op : r.backend_vs_reference) {
        if (!op_selected(opts, op.op)) continue;
        CaseResult c = make_case(op.op, kind + ":" + stem, status_of(op.verdict));
        c.worst_ratio = worst_ratio(op);
        c.has_ratio = !op.tensors.empty();
        c.cases = 1;
        c.message = op.verdict == oracle::Verdict::Pass ? "" : op.reason;
        if (op.verdict == oracle::Verdict::Fail) {
          c.message += "\n" + oracle::format_op_report(op);
          c.repro = repro;
          c.fixture = file;
        }
        out.push_back(c);
      }
      if (!r.reference_vs_expected.passed()) {
        CaseResult c = make_case("fixture", kind + ":" + stem + " (reference vs producer)", "fail");
        c.message = r.reference_vs_expected.reason;
        c.repro = repro;
        c.fixture = file;
        out.push_back(c);
      }
      return out;
    }});
  }
}

bool property_selected(const AuditOptions& o, const props::Property& p) {
  if (!o.only.empty() && std::find(o.only.begin(), o.only.end(), p.name) == o.only.end()) return false;
  if (o.ops.empty()) return true;
  for (oracle::Op op : p.ops)
    if (op_selected(o, oracle::to_string(op))) return true;
  return false;
}

// Property tasks: one per property of the suite (dsa/property_tests/suite.h).
void add_property_tasks(std::vector<AuditTask>& tasks, const props::Subject& subject,
                        const AuditOptions& opts) {
  for (const props::Property& p : props::all_properties()) {
    if (!property_selected(opts, p)) continue;
    std::string op = p.name.rfind("block.", 0) == 0 || p.ops.empty() ? "dsa_block"
                                                                  : oracle::to_string(p.ops.front());
    tasks.push_back({op, p.name, [&subject, &p, op, &opts]() {
      props::SuiteOptions so;
      so.level = opts.level;
      so.seed = opts.seed;
      so.dump_dir = opts.dump_dir;
      so.quiet = true;
      // Through a plugin every call is a forked child with a timeout: no shrinking, so a
      // hanging or crashing kernel costs one timeout per property, not one per shrink step.
      so.shrink = opts.plugin.empty();
      so.repro_command = "dsa-verify audit " + target_flag(opts, subject.name) + " --only " + p.name +
                         " --level " + std::to_string(opts.level);
      props::PropertyResult r = props::run_property(subject, p, so);
      CaseResult c = make_case(op, "property:" + p.name, status_of(r.verdict));
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
}

std::vector<std::string> default_backends() {
  std::vector<std::string> names;
  for (const auto& n : oracle::backend_names()) {
    if (n != "libtorch-cpu" && n != "libtorch-cuda" && n != "cuda") continue;
    if (n != "libtorch-cpu" && !oracle::make_backend(n)->unavailable_reason().empty()) continue;
    names.push_back(n);
  }
  if (names.empty()) names.push_back("reference");  // built without LibTorch
  return names;
}

}  // namespace

int run_audit(const AuditOptions& opts) {
  FixtureDirs dirs = default_fixture_dirs();
  std::vector<std::string> names = opts.backends.empty() ? default_backends() : opts.backends;
  // A plugin is checked now (a library that cannot be used throws PluginLoadError: exit 2)
  // and registered as "plugin:<name>"; every call then runs in an isolated child process.
  if (!opts.plugin.empty()) {
    plugin::PluginOptions po;
    po.timeout = std::chrono::milliseconds(static_cast<int64_t>(opts.timeout_s * 1000));
    names = {plugin::register_plugin(opts.plugin, po)};
  }
  validate_selection(opts);
  // Report paths are checked before the run, so a typo does not cost the audit's results.
  for (const std::string* path : {&opts.json_path, &opts.junit_path})
    if (!path->empty()) write_text_file(*path, "");
  if (!fs::is_directory(dirs.golden) || !fs::is_directory(dirs.peer))
    throw std::invalid_argument("audit: fixture directories " + dirs.golden + " and " + dirs.peer +
                                " must exist (set DSA_FIXTURES_DIR to the repo's fixtures/ folder)");
  std::vector<CaseResult> all;
  bool input_error = false;
  std::string label;
  bool stop = false;
  for (const auto& name : names) {
    std::unique_ptr<oracle::Backend> backend = oracle::make_backend(name);
    label += (label.empty() ? "" : ",") + name;
    std::string why = backend->unavailable_reason();
    if (!why.empty()) {
      CaseResult c = make_case("*", "backend " + name, "skip");
      c.message = why;
      all.push_back(c);
      continue;
    }
    std::vector<AuditTask> tasks;
    props::Subject subject = props::backend_subject(name);
    add_property_tasks(tasks, subject, opts);
    if (opts.only.empty()) {  // --only names properties: fixtures are not run
      add_fixture_tasks(tasks, dirs.golden, "golden", *backend, opts);
      add_fixture_tasks(tasks, dirs.peer, "peer", *backend, opts);
    }
    std::fprintf(stderr, "audit %s: %zu tasks (level %d, seed %s)\n", name.c_str(), tasks.size(),
                 opts.level, opts.seed ? std::to_string(opts.seed).c_str() : "random per property");
    Progress progress(tasks.size());
    for (auto& task : tasks) {
      auto t0 = std::chrono::steady_clock::now();
      std::vector<CaseResult> results;
      try {
        results = task.run();
      } catch (const fixtures::FileError& e) {
        // A shipped fixture that cannot be read is an input error (exit 2), reported as a
        // failed case so that every other result is still printed and written.
        input_error = true;
        CaseResult c = make_case(task.op, task.property, "fail");
        c.message = std::string("input error: ") + e.what();
        results.push_back(c);
      } catch (const std::exception& e) {
        CaseResult c = make_case(task.op, task.property, "fail");
        c.message = std::string("error: ") + e.what();
        results.push_back(c);
      }
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      CaseResult shown = make_case(task.op, task.property, "pass");
      for (auto& r : results) {
        r.seconds = secs / std::max<size_t>(results.size(), 1);
        if (names.size() > 1) r.op = name + "/" + r.op;
        if (r.status == "fail") shown.status = "fail";
        all.push_back(r);
      }
      progress.update(shown);
      if (opts.fail_fast && shown.status == "fail") { stop = true; break; }
    }
    progress.finish();
    if (stop) break;
  }
  print_summary(stdout, label, all);
  if (!opts.json_path.empty()) {
    nlohmann::json j = to_json(label, all);
    j["level"] = opts.level;
    j["seed"] = opts.seed;  // 0: RapidCheck drew a seed per property (see each repro line)
    j["plugin"] = opts.plugin;
    j["version"] = DSA_VERSION;
    write_text_file(opts.json_path, j.dump(2) + "\n");
  }
  if (!opts.junit_path.empty()) write_text_file(opts.junit_path, to_junit(label, all));
  bool failed = std::any_of(all.begin(), all.end(), [](const CaseResult& c) { return c.status == "fail"; });
  if (input_error) return kExitUsage;
  return failed ? kExitDisagree : kExitOk;
}

}  // namespace dsa::cli

// `dsa-verify audit`: the main job. For each chosen backend, runs the property suite, the
// golden fixtures and the peer fixtures op by op through the oracle, shows progress, prints
// the summary table and writes JSON / JUnit reports. SIGINT/SIGTERM end the running plugin
// child and still write the report of what was done (issue 14).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <set>

#include "commands.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/contract/parallel.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/plugin/isolation.h"
#include "dsa/plugin/plugin_backend.h"
#include "dsa/property_tests/suite.h"
#include "audit_tasks.h"
#include "call_watchdog.h"
#include "judge.h"

namespace fs = std::filesystem;

namespace dsa::cli {
namespace {

// How a reproduction command names what was audited (--plugin PATH or --backend NAME) and
// how it was judged (--outputs, --allow-weak, and the rounding models `rounding` judged with,
// whether a flag or the backend's capabilities declared them), so that the repro judges the same way.
std::string target_flag(const AuditOptions& o, const std::string& backend, const oracle::RoundingModel& rounding) {
  std::string s = o.plugin.empty() ? "--backend " + backend : "--plugin " + o.plugin;
  if (o.judge.outputs) {
    std::string list;
    for (const auto& n : *o.judge.outputs) list += (list.empty() ? "" : ",") + n;
    s += " --outputs " + list;
  }
  if (o.judge.allow_weak) s += " --allow-weak";
  return s + rounding_flags(rounding);
}

// `seconds` as the shortest decimal text that reads back as the same double ("2.5", "0.1").
std::string exact_seconds(double seconds) {
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, seconds);
    if (std::strtod(buf, nullptr) == seconds) break;
  }
  return buf;
}

// The options of this run that a property's reproduction command must repeat to run it the same
// way (fresh12 F11): --ops (a forward property judges its backward part only if selected),
// --seed, --timeout (when not the default) and --unsupported (declines it names are not
// INCOMPLETE). The property's own --only and --level are added by add_property_tasks.
std::string run_flags(const AuditOptions& o) {
  auto joined = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  };
  std::string s;
  if (!o.ops.empty()) s += " --ops " + joined(o.ops);
  if (o.seed != 0) s += " --seed " + std::to_string(o.seed);
  if (o.timeout_s != AuditOptions{}.timeout_s) s += " --timeout " + exact_seconds(o.timeout_s);
  if (!o.unsupported.empty()) s += " --unsupported " + joined(o.unsupported);
  return s;
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

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

// The label a task's results carry (and its calls' watchdog label): fixture tasks "golden:x",
// property tasks "property:x".
std::string task_label(const AuditTask& task) {
  return (task.op == "fixture" ? "" : "property:") + task.property;
}

// The case that was running when the audit was interrupted: its partial outcome (a killed
// plugin call reads as a failure) is kept in the message, never reported as a verdict.
CaseResult interrupted_case(const AuditTask& task, int sig, const std::vector<CaseResult>& partial) {
  // Named like the task's own results: fixture tasks "golden:x", property tasks "property:x".
  CaseResult c = make_case(task.op, task_label(task), "interrupted");
  c.message = std::string("interrupted by ") + signal_name(sig) + " while this case ran; not a verdict";
  for (const auto& r : partial)
    if (!r.message.empty()) {
      c.message += " (partial outcome " + r.status + ": " + r.message.substr(0, 300) + ")";
      break;
    }
  return c;
}

}  // namespace

int run_audit(const AuditOptions& options) {
  // SIGINT/SIGTERM: the running plugin child is killed, the audit stops, marks the running
  // case "interrupted" and writes the partial report; exit 128 + signal. A second signal
  // ends the process at once. An in-process backend's property stops after its running call
  // (stop_requested), not after its remaining draws.
  plugin::InterruptHandlers interrupts;
  AuditOptions opts = options;
  opts.stop_requested = [] { return plugin::interrupt_signal() != 0; };
  FixtureDirs dirs = default_fixture_dirs();
  std::vector<std::string> names = opts.backends.empty() ? default_backends() : opts.backends;
  // One per-call limit for both watchers: a plugin's killed child and an in-process call's watchdog.
  const std::chrono::milliseconds per_call = call_timeout(opts.timeout_s);
  // A plugin is checked now (a library that cannot be used throws PluginLoadError: exit 2)
  // and registered as "plugin:<name>"; every call then runs in an isolated child process.
  if (!opts.plugin.empty()) {
    plugin::PluginOptions po;
    po.timeout = per_call;
    try {
      names = {plugin::register_plugin(opts.plugin, po)};
    } catch (const std::exception&) {
      if (int sig = interrupts.signal()) {
        std::fprintf(stderr, "audit: interrupted by %s while loading the plugin; nothing audited\n",
                     signal_name(sig));
        return kExitInterruptedBase + sig;
      }
      throw;
    }
  }
  validate_selection(opts);
  if (opts.judge.outputs) {  // every --outputs name is an output of a selected op
    std::vector<oracle::Op> selected;
    for (oracle::Op op : oracle::all_ops())
      if (opts.ops.empty() || std::find(opts.ops.begin(), opts.ops.end(), oracle::to_string(op)) != opts.ops.end())
        selected.push_back(op);
    oracle::check_provided_outputs(*opts.judge.outputs, selected, "--outputs");
  }
  if (!fs::is_directory(dirs.golden) || !fs::is_directory(dirs.peer))
    throw std::invalid_argument("audit: fixture directories " + dirs.golden + " and " + dirs.peer +
                                " must exist (set DSA_FIXTURES_DIR to the repo's fixtures/ folder)");
  // Fixtures are judged unless --only: none at all is an error, a directory without any a note.
  std::vector<std::string> notes;
  if (opts.only.empty()) notes = check_fixture_dirs(dirs);
  for (const auto& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  std::vector<CaseResult> all;
  bool input_error = false;
  std::string label;
  bool stop = false;
  int interrupted = 0;      // the signal that stopped the audit, else 0
  size_t tasks_not_run = 0;  // of the backend that was interrupted
  std::vector<std::string> ran_nothing;  // backends of which no case passed or failed
  // "backend/op" for each op named in --ops of which a backend judged no case although some
  // were selected (fresh17 F6: a misnamed or missing backward was all skips and the audit
  // exited 0). Exit 2, as ran_nothing. An op --only left without a case is not listed.
  std::vector<std::string> ops_ran_nothing;
  // The rounding models each backend is judged with and who declared them (flags, capabilities).
  std::vector<std::string> rounding_lines;
  nlohmann::json rounding_models = nlohmann::json::array();
  // The JSON and the JUnit report of `cases` (write_text_file: atomic). `finished`: every task
  // ran (else the report is partial: written after each task, or at an interrupt or a hang).
  auto write_files = [&](const std::vector<CaseResult>& cases, const std::string& label, int interrupted,
                         size_t tasks_not_run, size_t backends_not_run, const std::vector<std::string>& ran_nothing,
                         const std::string& hung, bool finished) {
    if (!opts.json_path.empty()) {
      nlohmann::json j = to_json(label, cases);
      j["level"] = opts.level;
      j["seed"] = opts.seed;  // 0: RapidCheck drew a seed per property (see each repro line)
      j["plugin"] = opts.plugin;
      j["version"] = DSA_VERSION;
      j["interrupted"] = interrupted ? nlohmann::json(signal_name(interrupted)) : nlohmann::json(nullptr);
      j["hung_call"] = hung.empty() ? nlohmann::json(nullptr) : nlohmann::json(hung);
      j["tasks_not_run"] = tasks_not_run;
      j["backends_not_run"] = backends_not_run;
      // Backends of which every selected case was skipped: the audit then exits 2 (no pass).
      j["backends_that_ran_no_case"] = ran_nothing;
      j["ops_that_ran_no_case"] = ops_ran_nothing;  // "backend/op" named in --ops, all skipped
      j["notes"] = notes;  // e.g. a fixture directory holding no fixture
      j["rounding_models"] = rounding_models;  // per backend: judged, by flag, by the backend
      j["finished"] = finished;  // false: a partial report (the audit still ran, or stopped early)
      write_text_file(opts.json_path, j.dump(2) + "\n");
    }
    if (!opts.junit_path.empty()) write_text_file(opts.junit_path, to_junit(label, cases));
  };
  // Report paths are checked before the run, so a typo does not cost the audit's results; from
  // here they hold a valid report ("finished": false), rewritten after each task, so that a
  // crash or SIGKILL never loses a result already computed (fresh12 F5).
  write_files({}, "", 0, 0, 0, {}, "", false);
  bool progress_write_failed = false;
  auto write_progress = [&](const std::string& label) {
    try {
      write_files(all, label, 0, 0, 0, ran_nothing, "", false);
    } catch (const std::exception& e) {  // e.g. a full disk: said once; the final write throws
      if (!progress_write_failed) std::fprintf(stderr, "\nwarning: %s; the audit goes on\n", e.what());
      progress_write_failed = true;
    }
  };
  // The summary, the JSON and the JUnit report of `cases`: at the end, and from the handler of
  // an in-process call that hung (`hung`: that call; the process then ends, CallWatchdog).
  auto write_reports = [&](const std::vector<CaseResult>& cases, const std::string& label, int interrupted,
                           size_t tasks_not_run, size_t backends_not_run, const std::vector<std::string>& ran_nothing,
                           const std::string& hung) {
    print_summary(stdout, label, cases);
    for (const auto& line : rounding_lines) std::printf("%s\n", line.c_str());
    if (interrupted)
      std::printf("audit interrupted by %s: partial report; %zu task(s) of the running backend and "
                  "%zu later backend(s) not run\n",
                  signal_name(interrupted), tasks_not_run, backends_not_run);
    if (!hung.empty())
      std::printf("audit stopped: an in-process call hung (%s, past --timeout %g s): partial report; %zu task(s) "
                  "of the running backend and %zu later backend(s) not run; the stuck call was not waited for\n",
                  hung.c_str(), opts.timeout_s, tasks_not_run, backends_not_run);
    write_files(cases, label, interrupted, tasks_not_run, backends_not_run, ran_nothing, hung,
                interrupted == 0 && hung.empty());
  };
  for (const auto& name : names) {
    std::unique_ptr<oracle::Backend> backend = oracle::make_backend(name);
    label += (label.empty() ? "" : ",") + name;
    std::string why = backend->unavailable_reason();
    if (!why.empty()) {
      CaseResult c = make_case("*", "backend " + name, "skip");
      c.message = why;
      all.push_back(c);
      ran_nothing.push_back(name + " (unavailable: " + why + ")");
      continue;
    }
    std::vector<AuditTask> tasks;
    props::Subject subject = props::backend_subject(name);
    // Task outcomes, emitted in task order; `state_mu` guards their completion, `all` and the
    // emitted count, which a hung call's handler reads (below).
    struct Outcome {
      bool ran = false, input_error = false, done = false;
      int interrupted = 0;  // the signal recorded when the task ended, else 0
      double secs = 0;
      std::vector<CaseResult> results;
    };
    std::vector<Outcome> outcomes;
    std::mutex state_mu;
    size_t emitted_upto = 0;  // tasks [0, emitted_upto) are emitted
    // An in-process backend (built-in or registered C++) gets the plugins' per-call timeout
    // (--timeout): a call still running at it ends the audit with the report of every result
    // already computed, the hung call named as a failed case (CallWatchdog). A plugin's calls
    // run in killed-at-timeout children instead.
    std::unique_ptr<CallWatchdog> watchdog;
    std::unique_ptr<WatchdogBackend> guarded;
    if (opts.plugin.empty()) {
      watchdog = std::make_unique<CallWatchdog>(per_call, [&](const std::string& what, double secs) {
        std::lock_guard<std::mutex> lock(state_mu);  // never released: the process ends below
        std::vector<CaseResult> cases = all;
        size_t not_run = 0;
        for (size_t i = emitted_upto; i < tasks.size(); ++i) {
          Outcome& o = outcomes[i];
          const std::string tl = task_label(tasks[i]);
          if (o.done) {
            for (auto& r : o.results) cases.push_back(r);
          } else if (!o.ran) {
            ++not_run;
          } else if (what.rfind(tl + ": ", 0) == 0) {
            CaseResult c = make_case(tasks[i].op, tl, "fail");
            char buf[64];
            std::snprintf(buf, sizeof buf, "%g", opts.timeout_s);
            c.message = std::string("timed out after ") + buf + " s: the " + what.substr(tl.size() + 2) +
                        " was still running after " + seconds_text(secs) +
                        " s (--timeout, per call); an in-process call cannot be killed, so the audit stopped "
                        "here and wrote this report without waiting for it (a plugin's calls run in killed "
                        "children instead)";
            c.seconds = secs;
            cases.push_back(c);
          } else {
            CaseResult c = make_case(tasks[i].op, tl, "interrupted");
            c.message = "not finished: the audit stopped at a hung call (" + what + "); not a verdict";
            cases.push_back(c);
          }
        }
        if (names.size() > 1)
          for (size_t i = all.size(); i < cases.size(); ++i) cases[i].op = name + "/" + cases[i].op;
        std::fprintf(stderr, "\n");
        const size_t later = names.size() - 1 - std::count(label.begin(), label.end(), ',');
        write_reports(cases, label, 0, not_run, later, ran_nothing, what);
        std::fflush(nullptr);
        std::_Exit(kExitDisagree);  // the stuck thread is not waited for; no destructor runs
      });
      subject.make = [name, w = watchdog.get()]() -> std::unique_ptr<oracle::Backend> {
        return std::make_unique<WatchdogBackend>(oracle::make_backend(name), *w);
      };
      guarded = std::make_unique<WatchdogBackend>(*backend, *watchdog);
    }
    oracle::Backend& judged_backend = guarded ? static_cast<oracle::Backend&>(*guarded) : *backend;

    const DeclaredRounding rounding{rounding_flags_of(opts.judge), backend->rounding_model()};
    rounding_models.push_back(rounding_json(name, rounding));
    const std::string line = rounding_line(name, rounding);
    if (!line.empty()) {
      rounding_lines.push_back(line);
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    ReproCommands repro;
    repro.audit = "dsa-verify audit " + target_flag(opts, name, rounding.judged()) + run_flags(opts);
    repro.replay = [flag = target_flag(opts, name, rounding.judged())](const std::string& file) {
      return "dsa-verify replay " + file + " " + flag;
    };
    add_property_tasks(tasks, subject, opts, repro);
    if (opts.only.empty()) {  // --only names properties: fixtures are not run
      add_fixture_tasks(tasks, dirs.golden, "golden", judged_backend, opts, repro);
      add_fixture_tasks(tasks, dirs.peer, "peer", judged_backend, opts, repro);
    }
    std::fprintf(stderr, "audit %s: %zu tasks (level %d, seed %s)\n", name.c_str(), tasks.size(),
                 opts.level, opts.seed ? std::to_string(opts.seed).c_str() : "random per property");
    Progress progress(tasks.size());
    // Tasks run concurrently (--jobs; property tasks one at a time, audit_tasks.cpp); their
    // results are emitted in task order, so the report does not depend on the thread count.
    outcomes.resize(tasks.size());
    size_t emitted = 0, judged = 0;  // judged: cases that passed or failed (not skipped)
    std::set<std::string> judged_ops;  // ops with a case that passed or failed (--ops check)
    // ops with any case, skipped ones included: an op of --ops that --only left without a
    // task is the user's own selection, not an op the backend failed to provide
    std::set<std::string> selected_ops;
    bool last_stops = false;  // the last emitted task stops the audit (fail-fast, interrupt)
    auto work = [&](int64_t i) {
      const AuditTask& task = tasks[static_cast<size_t>(i)];
      Outcome& o = outcomes[static_cast<size_t>(i)];
      if (interrupts.signal()) return;  // arrived before this task started: not run
      {
        std::lock_guard<std::mutex> lock(state_mu);
        o.ran = true;
      }
      const ScopedTaskLabel running(task_label(task));  // names the task if a call hangs
      auto t0 = std::chrono::steady_clock::now();
      try {
        o.results = task.run();
      } catch (const fixtures::FileError& e) {
        // A shipped fixture that cannot be read is an input error (exit 2), reported as a
        // failed case so that every other result is still printed and written.
        o.input_error = true;
        CaseResult c = make_case(task.op, task.property, "fail");
        c.message = std::string("input error: ") + e.what();
        o.results.push_back(c);
      } catch (const TaskResourceError& e) {
        // Out of memory judging a fixture: no verdict on the kernel, an error (exit 2) naming
        // the op and the shapes, as for an unreadable fixture; the cases judged before it stay.
        o.input_error = true;
        o.results = e.results;
        CaseResult c = make_case(task.op, task.property, "fail");
        c.message = std::string("resource error: ") + e.what();
        o.results.push_back(c);
      } catch (const oracle::ResourceError& e) {
        o.input_error = true;
        CaseResult c = make_case(task.op, task.property, "fail");
        c.message = std::string("resource error: ") + e.what();
        o.results.push_back(c);
      } catch (const std::exception& e) {
        CaseResult c = make_case(task.op, task.property, "fail");
        c.message = std::string("error: ") + e.what();
        o.results.push_back(c);
      }
      o.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      o.interrupted = interrupts.signal();
      std::lock_guard<std::mutex> lock(state_mu);
      o.done = true;
    };
    auto emit = [&](int64_t i) {
      const AuditTask& task = tasks[static_cast<size_t>(i)];
      Outcome& o = outcomes[static_cast<size_t>(i)];
      std::lock_guard<std::mutex> lock(state_mu);
      emitted_upto = static_cast<size_t>(i) + 1;
      last_stops = false;
      if (!o.ran) {  // the signal arrived before it started
        interrupted = interrupts.signal();
        last_stops = true;
        return;
      }
      ++emitted;
      if (o.interrupted) {
        interrupted = o.interrupted;
        CaseResult c = interrupted_case(task, interrupted, o.results);
        c.seconds = o.secs;
        if (names.size() > 1) c.op = name + "/" + c.op;
        all.push_back(c);
        progress.update(c);
        last_stops = true;
        return;
      }
      input_error |= o.input_error;
      // The progress line says skip when nothing ran (never pass), fail when anything failed.
      CaseResult shown = make_case(task.op, task.property, "skip");
      std::string skipped_ops;  // ops of a fixture this backend cannot run, beside a pass
      for (const auto& r : o.results)
        if (r.status == "skip") skipped_ops += (skipped_ops.empty() ? "" : ", ") + r.op;
      for (auto& r : o.results) {
        if (r.status == "pass" || r.status == "fail") judged_ops.insert(r.op);
        selected_ops.insert(r.op);
        r.seconds = o.secs / std::max<size_t>(o.results.size(), 1);
        if (names.size() > 1) r.op = name + "/" + r.op;
        judged += r.status == "pass" || r.status == "fail";
        if (r.status == "fail") {
          shown.status = "fail";
          // a property's failure shows the op whose check failed (sparse_mla_bwd inside a
          // forward property), as the table does; a fixture line stays "fixture"
          if (task.op != "fixture") shown.op = r.op;
        } else if (r.status == "pass" && shown.status == "skip") shown.status = "pass";
        // a partial pass shows what was not judged (the first result's list, e.g. one op)
        if (r.status == "pass" && shown.not_judged.empty()) shown.not_judged = r.not_judged;
        all.push_back(r);
      }
      o.results.clear();
      write_progress(label);
      if (shown.status == "pass" && !skipped_ops.empty()) shown.message = "skip: " + skipped_ops;
      progress.update(shown);
      if (opts.fail_fast && shown.status == "fail") stop = last_stops = true;
    };
    parallel_ordered(static_cast<int64_t>(tasks.size()), work, emit,
                     [&](int64_t) { return last_stops; });
    if (interrupted) tasks_not_run = tasks.size() - emitted;
    progress.finish();
    if (judged == 0 && !stop && !interrupted) ran_nothing.push_back(name);
    else if (!stop && !interrupted)
      for (const auto& op : opts.ops)
        if (selected_ops.count(op) && !judged_ops.count(op)) ops_ran_nothing.push_back(name + "/" + op);
    if (stop || interrupted) break;
  }
  const size_t backends_not_run = interrupted ? names.size() - 1 - std::count(label.begin(), label.end(), ',') : 0;
  write_reports(all, label, interrupted, tasks_not_run, backends_not_run, ran_nothing, "");
  bool failed = std::any_of(all.begin(), all.end(), [](const CaseResult& c) { return c.status == "fail"; });
  if (interrupted) return kExitInterruptedBase + interrupted;
  if (input_error) return kExitUsage;
  if (failed) return kExitDisagree;
  // An audit that judged nothing is not a pass (a typo in --ops/--only, ops the backend cannot
  // run, an unavailable backend): exit 2, naming each backend that ran no case.
  for (const auto& n : ran_nothing)
    std::fprintf(stderr, "dsa-verify: error: audit: backend %s ran no case: every selected property and "
                 "fixture was skipped (reasons in the table; check --ops, --only and what the backend "
                 "supports)\n", n.c_str());
  for (const auto& n : ops_ran_nothing) {
    const size_t slash = n.rfind('/');
    std::fprintf(stderr, "dsa-verify: error: audit: --ops names %s but backend %s judged no case of it: every "
                 "one was skipped (reasons in the table; does the backend provide that op?)\n",
                 n.substr(slash + 1).c_str(), n.substr(0, slash).c_str());
  }
  return ran_nothing.empty() && ops_ran_nothing.empty() ? kExitOk : kExitUsage;
}

}  // namespace dsa::cli

// dsa_verify._core: the C++ half of the dsa_verify Python package (issue 10). It serves a
// Python backend to the same oracle, property suite, fixture runner and report writers as
// `dsa-verify audit` (targets dsa_oracle_fixtures, dsa_property_tests, dsa_audit); the package
// (dsa_verify/*.py) adds torch conversions, the command line, isolation and the pytest plugin.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "audit_tasks.h"
#include "call_watchdog.h"
#include "cpp_backend_object.h"
#include "dsa/oracle/candidate_backend.h"
#include "judge.h"
#include "dlpack_capsule.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"
#include "py_backend.h"
#include "report.h"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace dsa::python {
namespace {

py::dict case_to_dict(const cli::CaseResult& c) {
  py::dict d;
  d["op"] = c.op;
  d["property"] = c.property;
  d["status"] = c.status;
  d["worst_ratio"] = c.has_ratio ? py::object(py::float_(c.worst_ratio)) : py::object(py::none());
  d["worst_err_over_bound"] = c.has_ratio ? py::object(py::float_(c.worst_err_over_bound)) : py::object(py::none());
  d["nonfinite_mismatches"] = c.nonfinite_mismatches;
  d["not_judged"] = c.not_judged;
  d["cases"] = c.cases;
  d["message"] = c.message;
  d["repro"] = c.repro;
  d["fixture"] = c.fixture;
  d["seconds"] = c.seconds;
  return d;
}

cli::CaseResult case_from_dict(py::handle h) {
  py::dict d = py::reinterpret_borrow<py::dict>(h);
  cli::CaseResult c = cli::make_case(d["op"].cast<std::string>(), d["property"].cast<std::string>(),
                                     d["status"].cast<std::string>());
  if (d.contains("worst_ratio") && !d["worst_ratio"].is_none()) {
    c.has_ratio = true;
    c.worst_ratio = d["worst_ratio"].cast<double>();
  }
  if (d.contains("worst_err_over_bound") && !d["worst_err_over_bound"].is_none())
    c.worst_err_over_bound = d["worst_err_over_bound"].cast<double>();
  if (d.contains("nonfinite_mismatches")) c.nonfinite_mismatches = d["nonfinite_mismatches"].cast<int64_t>();
  if (d.contains("not_judged")) c.not_judged = d["not_judged"].cast<std::vector<std::string>>();
  if (d.contains("cases")) c.cases = d["cases"].cast<int64_t>();
  if (d.contains("message")) c.message = d["message"].cast<std::string>();
  if (d.contains("repro")) c.repro = d["repro"].cast<std::string>();
  if (d.contains("fixture")) c.fixture = d["fixture"].cast<std::string>();
  if (d.contains("seconds")) c.seconds = d["seconds"].cast<double>();
  return c;
}

std::vector<cli::CaseResult> cases_from_list(const py::list& l) {
  std::vector<cli::CaseResult> v;
  for (auto h : l) v.push_back(case_from_dict(h));
  return v;
}

// Fixture directories: $DSA_FIXTURES_DIR or the source tree this module was built from.
cli::FixtureDirs fixture_dirs() {
  const char* env = std::getenv("DSA_FIXTURES_DIR");
  const std::string root = env && *env ? env : DSA_SOURCE_FIXTURES_DIR;
  return cli::FixtureDirs{root + "/golden", root + "/peer"};
}

// Everything the audit's tasks point at, kept alive while they run.
struct TaskSet {
  cli::AuditOptions opts;
  std::unique_ptr<PyBackend> backend;
  // With o["call_timeout"] (a non-isolated run): every call of the backend is watched; one still
  // running at the timeout hands the audit to dsa_verify._audit._on_hung_call, which writes the
  // report, and the process ends (CallWatchdog; the stuck call is not waited for).
  std::unique_ptr<cli::CallWatchdog> watchdog;
  std::unique_ptr<cli::WatchdogBackend> guarded;
  props::Subject subject;
  std::vector<cli::AuditTask> tasks;
  std::vector<std::string> fixture_files;  // per task; "" for properties
};

// `o`: ops, only (lists of names), level, seed, dump_dir, fixtures (bool), repro_audit (command
// prefix of a property re-run), repro_replay (command with "{fixture}" for the file).
std::unique_ptr<TaskSet> build_tasks(const py::object& bridge, const py::dict& o) {
  auto ts = std::make_unique<TaskSet>();
  ts->opts.ops = o["ops"].cast<std::vector<std::string>>();
  ts->opts.only = o["only"].cast<std::vector<std::string>>();
  ts->opts.level = o["level"].cast<int>();
  ts->opts.seed = o["seed"].cast<uint64_t>();
  ts->opts.dump_dir = o["dump_dir"].cast<std::string>();
  if (o.contains("provided_outputs") && !o["provided_outputs"].is_none())
    ts->opts.judge.outputs = cli::parse_output_names(o["provided_outputs"].cast<std::vector<std::string>>(),
                                                     "outputs");
  if (o.contains("allow_weak")) ts->opts.judge.allow_weak = o["allow_weak"].cast<bool>();
  if (o.contains("sink_after_rounding")) ts->opts.judge.sink_after_rounding = o["sink_after_rounding"].cast<bool>();
  if (o.contains("normalized_p")) ts->opts.judge.normalized_p = o["normalized_p"].cast<bool>();
  if (o.contains("unsupported") && !o["unsupported"].is_none())
    ts->opts.unsupported = o["unsupported"].cast<std::vector<std::string>>();
  // dsa_verify.audit's SIGINT/SIGTERM handling (request_stop): a property stops between draws.
  ts->opts.stop_requested = [] { return stop_requested().load(); };
  cli::validate_selection(ts->opts);
  const PyBackend::BridgeHandle shared = PyBackend::share(bridge);
  ts->backend = std::make_unique<PyBackend>(shared);
  ts->subject.name = ts->backend->name();
  ts->subject.make = [shared]() -> std::unique_ptr<oracle::Backend> { return std::make_unique<PyBackend>(shared); };
  if (o.contains("call_timeout") && !o["call_timeout"].is_none()) {
    ts->watchdog = std::make_unique<cli::CallWatchdog>(
        cli::call_timeout(o["call_timeout"].cast<double>()), [](const std::string& what, double elapsed) {
          {
            py::gil_scoped_acquire gil;  // the stuck call may hold it: then this waits (isolate=True)
            try {
              // True: handled without ending the process (the pytest plugin fails the test and
              // the session's later tests; the stuck thread keeps running). Else the report is
              // written and the process ends here.
              if (py::module_::import("dsa_verify._audit").attr("_on_hung_call")(what, elapsed).cast<bool>()) return;
            } catch (const std::exception& e) {
              std::fprintf(stderr, "dsa_verify: a call hung (%s) and the report could not be written: %s\n",
                           what.c_str(), e.what());
            }
          }
          std::fflush(nullptr);
          std::_Exit(1);  // the stuck thread is not waited for; no destructor runs
        });
    ts->guarded = std::make_unique<cli::WatchdogBackend>(*ts->backend, *ts->watchdog);
    ts->subject.make = [shared, w = ts->watchdog.get()]() -> std::unique_ptr<oracle::Backend> {
      return std::make_unique<cli::WatchdogBackend>(std::make_unique<PyBackend>(shared), *w);
    };
  }
  oracle::Backend& judged = ts->guarded ? static_cast<oracle::Backend&>(*ts->guarded) : *ts->backend;
  cli::ReproCommands repro;
  repro.audit = o["repro_audit"].cast<std::string>();
  repro.replay = [tmpl = o["repro_replay"].cast<std::string>()](const std::string& file) {
    std::string s = tmpl;
    const auto at = s.find("{fixture}");
    if (at != std::string::npos) s.replace(at, 9, file);
    return s;
  };
  cli::add_property_tasks(ts->tasks, ts->subject, ts->opts, repro);
  ts->fixture_files.assign(ts->tasks.size(), "");
  if (ts->opts.only.empty() && o["fixtures"].cast<bool>()) {
    const cli::FixtureDirs dirs = fixture_dirs();
    cli::check_fixture_dirs(dirs);  // missing, or no fixture in either: an error (its notes: check_fixture_dirs)
    for (const auto& [dir, kind] : {std::pair{dirs.golden, "golden"}, std::pair{dirs.peer, "peer"}}) {
      cli::add_fixture_tasks(ts->tasks, dir, kind, judged, ts->opts, repro);
      for (const auto& f : cli::list_fixtures(dir)) ts->fixture_files.push_back(f);
    }
  }
  return ts;
}

// The tasks as dicts: op, property, fixture ("" for properties), ops (the selected ops a
// fixture covers; [op] for properties).
py::list list_tasks(const py::object& bridge, const py::dict& o) {
  auto ts = build_tasks(bridge, o);
  py::list out;
  for (size_t i = 0; i < ts->tasks.size(); ++i) {
    py::dict d;
    d["op"] = ts->tasks[i].op;
    d["property"] = ts->tasks[i].property;
    d["fixture"] = ts->fixture_files[i];
    py::list ops;
    if (ts->fixture_files[i].empty()) {
      ops.append(ts->tasks[i].op);
    } else {
      try {
        for (oracle::Op op : oracle::fixture_ops(fixtures::load_fixture(ts->fixture_files[i])))
          if (cli::op_selected(ts->opts, oracle::to_string(op))) ops.append(oracle::to_string(op));
      } catch (const std::exception&) {
        ops.append("fixture");  // unreadable: running it reports the input error
      }
    }
    d["ops"] = ops;
    out.append(d);
  }
  return out;
}

// Runs one task as `dsa-verify audit` does (an exception is a failed case; an unreadable
// fixture an input error); returns its case dicts, each with "input_error".
py::list run_task(const py::object& bridge, const py::dict& o, const std::string& property) {
  auto ts = build_tasks(bridge, o);
  for (auto& task : ts->tasks) {
    if (task.property != property) continue;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<cli::CaseResult> results;
    bool input_error = false;
    try {
      py::gil_scoped_release nogil;  // backends take the GIL per call (any thread)
      const cli::ScopedTaskLabel running((task.op == "fixture" ? "" : "property:") + task.property);
      results = task.run();
    } catch (const fixtures::FileError& e) {
      input_error = true;
      cli::CaseResult c = cli::make_case(task.op, task.property, "fail");
      c.message = std::string("input error: ") + e.what();
      results.push_back(c);
    } catch (const cli::TaskResourceError& e) {
      input_error = true;  // out of memory: no verdict; the cases judged before it stay
      results = e.results;
      cli::CaseResult c = cli::make_case(task.op, task.property, "fail");
      c.message = std::string("resource error: ") + e.what();
      results.push_back(c);
    } catch (const std::exception& e) {
      cli::CaseResult c = cli::make_case(task.op, task.property, "fail");
      c.message = std::string("error: ") + e.what();
      results.push_back(c);
    }
    if (interrupted().exchange(false)) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
      throw py::error_already_set();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    py::list out;
    for (auto& r : results) {
      r.seconds = secs / static_cast<double>(std::max<size_t>(results.size(), 1));
      py::dict d = case_to_dict(r);
      d["input_error"] = input_error;
      out.append(d);
    }
    return out;
  }
  throw std::invalid_argument("run_task: argument 'property' got \"" + property +
                              "\", expected a task of this audit (see list_tasks)");
}

std::string format_summary(const std::string& label, const py::list& cases) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  if (!f) throw std::runtime_error("format_summary: open_memstream failed");
  cli::print_summary(f, label, cases_from_list(cases));
  std::fclose(f);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

py::dict capsules(const std::map<std::string, Tensor>& m) {
  py::dict d;
  for (const auto& [name, t] : m) d[py::str(name)] = to_capsule(std::make_shared<Tensor>(t));
  return d;
}

// A fixture as plain values: case, op, producer, notes, params (JSON text), inputs and
// expected (name -> capsule), calls (op name -> (tensors, none, scalars) as a backend's method
// of that op receives them).
py::dict load_fixture(const std::string& path) {
  const fixtures::Fixture f = fixtures::load_fixture(path);
  py::dict d;
  d["case"] = f.case_name;
  d["op"] = f.op;
  d["producer"] = f.producer;
  d["notes"] = f.notes;
  d["params"] = f.params.dump();
  d["inputs"] = capsules(f.inputs);
  d["expected"] = capsules(f.expected);
  const oracle::OpCase c = oracle::op_case_from_fixture(f);
  py::dict calls;
  for (oracle::Op op : oracle::fixture_ops(f)) {
    OpArgs a = op_args(op, c);
    py::dict tensors;
    for (auto& [name, t] : a.tensors) tensors[py::str(name)] = to_capsule(std::make_shared<Tensor>(std::move(t)));
    calls[oracle::to_string(op)] = py::make_tuple(tensors, a.none, a.scalars);
  }
  d["calls"] = calls;
  return d;
}

// The judgement of every route (judge_fixture_ops with the CLI's check_options) as a dict:
// verdict (pass/fail/skip, as the audit's status), verdict_line ("AGREES", "DISAGREES", ...),
// exit (0 agrees, 1 not), report (the op reports as printed by compare/replay) and one dict per
// op (op, verdict, reason, worst_ratio, nonfinite_mismatches, notes, details; worst_ratio is
// measured over the positions whose NaN/±inf class matches the reference's).
py::dict judged(const std::vector<oracle::OpReport>& reports) {
  py::dict d;
  d["verdict"] = cli::status_of(oracle::overall_verdict(reports));
  d["verdict_line"] = oracle::verdict_line(reports);
  d["exit"] = cli::exit_code(reports);
  std::string text;
  py::list ops;
  for (const auto& op : reports) {
    text += oracle::format_op_report(op);
    py::dict o;
    o["op"] = op.op;
    o["verdict"] = oracle::to_string(op.verdict);
    o["reason"] = op.reason;
    o["worst_ratio"] = op.tensors.empty() ? py::object(py::none()) : py::object(py::float_(cli::worst_ratio(op)));
    o["nonfinite_mismatches"] = cli::nonfinite_mismatches(op);
    o["notes"] = op.notes;
    o["details"] = oracle::format_op_report(op);
    ops.append(o);
  }
  d["report"] = text;
  d["ops"] = ops;
  return d;
}

cli::JudgeOptions judge_options(const py::object& provided, bool allow_weak, bool sink_after_rounding,
                                bool normalized_p) {
  cli::JudgeOptions j;
  if (!provided.is_none()) j.outputs = cli::parse_output_names(provided.cast<std::vector<std::string>>(), "provided_outputs");
  j.allow_weak = allow_weak;
  j.sink_after_rounding = sink_after_rounding;
  j.normalized_p = normalized_p;
  return j;
}

// `dsa-verify replay FIXTURE` for a Python backend.
py::dict replay_fixture(const py::object& bridge, const std::string& path, const py::object& provided,
                        bool allow_weak, bool sink_after_rounding, bool normalized_p) {
  const fixtures::Fixture f = fixtures::load_fixture(path);
  PyBackend backend(PyBackend::share(bridge));
  const oracle::CheckOptions opt = cli::check_options(judge_options(provided, allow_weak, sink_after_rounding, normalized_p), false);
  std::vector<oracle::OpReport> reports;
  {
    py::gil_scoped_release nogil;
    const oracle::OpCase c = oracle::op_case_from_fixture(f);
    cli::check_fixture_inputs(f, c, oracle::fixture_ops(f));  // an input error before the kernel runs
    reports = oracle::judge_fixture_ops(f, c, backend, opt);
  }
  return judged(reports);
}

// `dsa-verify compare` without files: `outputs` name -> capsule (host, contiguous) judged as
// the candidate file route judges a file (oracle::CandidateBackend, the same conventions).
py::dict compare_outputs(const std::string& golden, const py::dict& outputs,
                         const std::vector<std::string>& conventions, const py::object& provided,
                         bool allow_weak, bool sink_after_rounding, bool normalized_p) {
  const fixtures::Fixture f = fixtures::load_fixture(golden);
  std::map<std::string, Tensor> tensors;
  for (auto item : outputs) {
    const std::string name = item.first.cast<std::string>();
    tensors[name] = from_capsule(item.second, "compare: output '" + name + "'");
  }
  std::string given;  // the names given, for the error below
  for (const auto& kv : tensors) given += (given.empty() ? "'" : ", '") + kv.first + "'";
  const std::vector<fixtures::Convention> convs = fixtures::parse_conventions(conventions, "conventions");
  // A convention that converts none of the golden's ops is refused, as `dsa-verify compare
  // --convention` refuses it (fresh14 F4: one rule on every route).
  cli::check_conventions_apply(convs, oracle::fixture_ops(f), "conventions");
  oracle::CandidateBackend backend(std::move(tensors), "compare(outputs)", convs, "candidate-outputs");
  const cli::JudgeOptions judge = judge_options(provided, allow_weak, sink_after_rounding, normalized_p);
  if (judge.outputs) oracle::check_provided_outputs(*judge.outputs, oracle::fixture_ops(f), "provided_outputs");
  // No output of the golden's op at all is the wrong outputs, as `dsa-verify compare`'s "holds
  // no outputs for the golden's op" (exit 2), not INCOMPLETE (fresh14 F2).
  bool any = false;
  std::string expected;
  for (oracle::Op op : oracle::fixture_ops(f)) {
    any |= !backend.stored_outputs(op).empty();
    for (const auto& n : oracle::op_output_names(op))
      if (expected.find("'" + n + "'") == std::string::npos) expected += (expected.empty() ? "'" : ", '") + n + "'";
  }
  if (!any) {
    throw std::invalid_argument("compare: argument 'outputs' holds no output of the golden's op " + f.op + " (" +
                                golden + "); got {" + given + "}, expected some of " + expected);
  }
  const oracle::CheckOptions opt = cli::check_options(judge, true);
  std::vector<oracle::OpReport> reports;
  {
    py::gil_scoped_release nogil;
    reports = oracle::judge_fixture_ops(f, backend, opt);
  }
  py::dict d = judged(reports);
  d["conventions_applied"] = backend.adapter_notes();
  return d;
}

}  // namespace
}  // namespace dsa::python

PYBIND11_MODULE(_core, m) {
  using namespace dsa::python;
  m.doc() = "C++ half of dsa_verify: the dsa-verify oracle, property suite and reports for Python backends";
  m.attr("version") = DSA_VERSION;
  m.attr("contract_version") = DSA_CONTRACT_VERSION;
  m.def("fixture_dirs", [] {
    const auto d = fixture_dirs();
    return py::make_tuple(d.golden, d.peer);
  }, "(golden, peer) fixture directories ($DSA_FIXTURES_DIR or the source tree)");
  m.def("check_fixture_dirs", [] { return dsa::cli::check_fixture_dirs(fixture_dirs()); },
        "Notes on the fixture directories an audit judges (one that holds no fixture); raises ValueError "
        "when either is missing or neither holds a fixture (as dsa-verify audit)");
  m.def("op_names", [] {
    std::vector<std::string> v;
    for (auto op : dsa::oracle::all_ops()) v.push_back(dsa::oracle::to_string(op));
    return v;
  }, "The op names, in pipeline order");
  m.def("property_names", [] {
    std::vector<std::string> v;
    for (const auto& p : dsa::props::all_properties()) v.push_back(p.name);
    return v;
  }, "Every property of the suite");
  m.def("output_names", [](const std::string& op, bool with_sink) {
    for (auto o : dsa::oracle::all_ops())
      if (op == dsa::oracle::to_string(o)) return output_names(o, with_sink);
    throw std::invalid_argument("output_names: argument 'op' got \"" + op + "\", expected an op name");
  }, py::arg("op"), py::arg("with_sink") = true, "Output names of an op, in SPEC order");
  m.def("list_tasks", &list_tasks, py::arg("bridge"), py::arg("options"));
  m.def("run_task", &run_task, py::arg("bridge"), py::arg("options"), py::arg("property"));
  m.def("request_stop", [](bool on) { stop_requested().store(on); }, py::arg("on") = true,
        "Stops (True) or re-enables (False) every backend call of this process: a stopped call raises "
        "'not run: the audit was interrupted' without calling the kernel (dsa_verify.audit on SIGINT/SIGTERM)");
  m.def("format_summary", &format_summary, py::arg("label"), py::arg("cases"),
        "The summary table of dsa-verify audit, as text");
  m.def("to_json", [](const std::string& label, const py::list& cases, const std::string& extra_json) {
    nlohmann::json j = dsa::cli::to_json(label, cases_from_list(cases));
    const nlohmann::json extra = nlohmann::json::parse(extra_json);
    for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
    return j.dump(2) + "\n";
  }, py::arg("label"), py::arg("cases"), py::arg("extra_json") = "{}");
  m.def("to_junit", [](const std::string& label, const py::list& cases) {
    return dsa::cli::to_junit(label, cases_from_list(cases));
  }, py::arg("label"), py::arg("cases"));
  py::class_<dsa::cli::Progress>(m, "Progress", "The audit's progress on stderr (bar on a terminal, lines otherwise)")
      .def(py::init<size_t>(), py::arg("total"))
      .def("update", [](dsa::cli::Progress& p, const py::dict& c) { p.update(case_from_dict(c)); })
      .def("finish", &dsa::cli::Progress::finish);
  m.def("load_fixture", &load_fixture, py::arg("path"));
  bind_cpp_backend(m);
  m.def("mutant_names", [] {
    std::vector<std::string> v;
    for (const auto& s : dsa::props::mutant_subjects()) v.push_back(s.name);
    return v;
  }, "The property suite's mutants (reference backends with one field fault each)");
  m.def("make_mutant", [](const std::string& name) {
    for (const auto& s : dsa::props::mutant_subjects())
      if (s.name == name) return CppBackend{std::shared_ptr<dsa::oracle::Backend>(s.make())};
    throw std::invalid_argument("make_mutant: argument 'name' got \"" + name + "\", expected a mutant_names() entry");
  }, py::arg("name"));
  m.def("make_reference", [] { return CppBackend{std::shared_ptr<dsa::oracle::Backend>(dsa::oracle::make_reference_backend())}; },
        "The float64 reference backend");
  m.def("replay_fixture", &replay_fixture, py::arg("bridge"), py::arg("path"), py::arg("provided_outputs") = py::none(),
        py::arg("allow_weak") = false, py::arg("sink_after_rounding") = false,
        py::arg("normalized_p") = false);
  m.def("compare_outputs", &compare_outputs, py::arg("golden"), py::arg("outputs"), py::arg("conventions"),
        py::arg("provided_outputs") = py::none(), py::arg("allow_weak") = false,
        py::arg("sink_after_rounding") = false, py::arg("normalized_p") = false);
  m.def("output_name_list", [] { return dsa::oracle::all_output_names(); }, "Every output name of every op");
}

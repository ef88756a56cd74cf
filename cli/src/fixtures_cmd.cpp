// `dsa-verify fixtures check`, `fixtures generate`, `replay` and `backends`.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>

#include "commands.h"
#include "dsa/contract/parallel.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/fixtures/manifest.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/candidate_backend.h"
#include "dsa/plugin/plugin_backend.h"
#include "dsa/property_tests/suite.h"
#include "judge.h"
#include "report.h"

#if __has_include("dsa/fixtures/generate.h")
#include "dsa/fixtures/generate.h"
#define DSA_HAVE_GENERATOR 1
#endif

namespace fs = std::filesystem;

namespace dsa::cli {

FixtureDirs default_fixture_dirs() {
  const char* env = std::getenv("DSA_FIXTURES_DIR");
  std::string root = env ? env : DSA_SOURCE_FIXTURES_DIR;
  return FixtureDirs{root + "/golden", root + "/peer"};
}

int run_list_backends() {
  for (const auto& name : oracle::backend_names()) {
    auto b = oracle::make_backend(name);
    std::string why = b->unavailable_reason();
    std::printf("%-16s %s\n", name.c_str(), why.empty() ? "available" : ("unavailable: " + why).c_str());
  }
  return kExitOk;
}

int run_list_mutants() {
  const std::vector<props::Subject> all = props::mutant_subjects();
  std::printf("%-5s %-32s %-44s %s\n", "index", "plugin", "mutant", "fault");
  size_t plugin_index = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    // Block-level mutants (§8 replay) come last and have no ABI op (plugin/CMakeLists.txt).
    const bool block = all[i].name.rfind("block_", 0) == 0;
    const std::string lib = block ? "(in-process only)"
                                  : "libdsa_mutant_plugin_" + std::to_string(plugin_index++) + ".so";
    std::printf("%-5zu %-32s %-44s %s\n", i, lib.c_str(), all[i].name.c_str(), all[i].fault.c_str());
  }
  return kExitOk;
}

// Checks MANIFEST (ours) or SHA256SUMS (`sha256sum` format) of `dir`; returns problems.
static std::vector<std::string> verify_checksums(const std::string& dir) {
  if (fs::exists(fs::path(dir) / fixtures::kManifestName)) return fixtures::verify_manifest(dir);
  std::vector<std::string> problems;
  fs::path sums = fs::path(dir) / "SHA256SUMS";
  if (!fs::exists(sums)) return {dir + ": no MANIFEST or SHA256SUMS; checksums not verified"};
  std::ifstream in(sums);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream ls(line);
    std::string sha, file;
    ls >> sha >> file;
    if (!file.empty() && file[0] == '*') file = file.substr(1);
    fs::path p = fs::path(dir) / file;
    if (!fs::exists(p)) { problems.push_back(file + ": listed in SHA256SUMS but missing"); continue; }
    if (fixtures::sha256_file(p.string()) != sha) problems.push_back(file + ": sha256 differs from SHA256SUMS");
  }
  return problems;
}

// The `*.safetensors` files directly in `dir` (sorted; no recursion: a directory's MANIFEST
// or SHA256SUMS lists its own files only). Every other entry but the checksum list goes to
// `skipped` as "name (why)": a subdirectory, another extension (`.SAFETENSORS` included: names
// are case-sensitive, as in MANIFEST), so a run never silently judges less than the directory.
static std::vector<std::string> fixture_files(const std::string& dir, std::vector<std::string>* skipped) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    std::string ext = e.path().extension().string();
    if (!e.is_directory() && ext == ".safetensors") {
      files.push_back(e.path().string());
      continue;
    }
    if (name == fixtures::kManifestName || name == "SHA256SUMS") continue;
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    skipped->push_back(e.is_directory() ? name + "/ (a subdirectory: not searched; check it on its own)"
                       : ext == ".safetensors" ? name + " (the extension is not lower-case .safetensors)"
                                               : name + " (not a .safetensors file)");
  }
  std::sort(files.begin(), files.end());
  std::sort(skipped->begin(), skipped->end());
  return files;
}

// Result of one op of one candidate: agree; partial (a pass with outputs not judged, named);
// skip (nothing judged: the backend cannot run the op, or the producer stores none of its
// outputs), never agree; or a failure: DISAGREE, INCOMPLETE, WEAK (without --allow-weak).
// The first word is what the summary counts.
static std::string op_result(const oracle::OpReport& r, bool producer) {
  std::string list;
  for (const auto& n : r.not_judged) list += (list.empty() ? "" : ", ") + n;
  switch (r.verdict) {
    case oracle::Verdict::Pass:
      if (list.empty()) return "agree";
      return "partial: " + list + (producer ? " not stored, not judged" : " not judged");
    case oracle::Verdict::Skip:
      // A producer that stores none of the op's outputs; a check that judged nothing (an
      // empty case) says so in its reason.
      if (producer && !r.nothing_judged)
        return "skip: " + (list.empty() ? std::string("no output") : list) + " not stored";
      return "skip: " + r.reason;
    case oracle::Verdict::Weak: return "WEAK";
    case oracle::Verdict::Incomplete:
      // A declined SPEC-mandatory case names the backend's reason (the report above: the case).
      for (const auto& n : r.notes)
        if (r.declined && n.rfind("declined: ", 0) == 0) return "INCOMPLETE: " + n;
      return "INCOMPLETE";
    case oracle::Verdict::Fail: break;
  }
  return "DISAGREE";
}

int run_fixtures_check(const std::string& path, const std::vector<std::string>& backend_names,
                       bool verbose, const JudgeOptions& judge) {
  int code = kExitOk;
  std::vector<std::string> files, skipped;
  const bool dir = fs::is_directory(path);
  if (dir) {
    std::vector<std::string> problems = verify_checksums(path);
    for (const auto& p : problems) std::printf("checksum: %s\n", p.c_str());
    if (!problems.empty() && problems[0].find("not verified") == std::string::npos) code = kExitUsage;
    files = fixture_files(path, &skipped);
    for (const auto& n : skipped) std::printf("note: fixtures check: not judged: %s\n", n.c_str());
    if (files.empty())
      throw std::invalid_argument("fixtures check: " + path + " holds no .safetensors fixtures");
  } else if (fs::is_regular_file(path)) {
    files = {path};  // one file: no checksum list to verify
  } else {
    throw std::invalid_argument("fixtures check: " + path + " is neither a directory nor a file");
  }

  std::vector<std::unique_ptr<oracle::Backend>> backends;
  std::vector<std::string> names = backend_names.empty() ? oracle::backend_names() : backend_names;
  for (const auto& n : names) {
    auto b = oracle::make_backend(n);
    std::string why = b->unavailable_reason();
    if (!why.empty()) { std::printf("backend %s skipped: %s\n", n.c_str(), why.c_str()); continue; }
    backends.push_back(std::move(b));
  }
  nlohmann::json rounding_models = nlohmann::json::array();  // what each backend is judged with
  for (const auto& b : backends)
    rounding_models.push_back(announce_rounding(b->name(), {rounding_flags_of(judge), b->rounding_model()}));

  // Each row and JSON entry names its file (relative to the checked directory; the file name
  // for a single file): two files may hold the same case name.
  auto shown_name = [&](const std::string& file) {
    return dir ? fs::path(file).lexically_relative(path).string() : fs::path(file).filename().string();
  };
  int width = 28;
  for (const auto& file : files) width = std::max<int>(width, static_cast<int>(shown_name(file).size()));

  size_t pass = 0, partial = 0, fail = 0, weak = 0, incomplete = 0, skip = 0, errors = 0;
  std::vector<std::string> summary;
  const oracle::CheckOptions opt = check_options(judge, /*file_route=*/false);
  nlohmann::json json_files = nlohmann::json::array();
  // Files are judged concurrently (--jobs); each file's text, rows and JSON are kept and
  // printed in file order, so the report does not depend on the thread count.
  struct FileResult {
    std::string text;                                      // reports and errors, as printed
    std::vector<std::pair<std::string, std::string>> rows;  // (summary line, result word)
    bool usage_error = false;
    std::optional<nlohmann::json> json;
  };
  std::vector<FileResult> results(files.size());
  auto judge_file = [&](int64_t i) {
    const std::string& file = files[static_cast<size_t>(i)];
    const std::string shown = shown_name(file);
    FileResult& out = results[static_cast<size_t>(i)];
    // One row per op of the fixture and candidate: a fwd+bwd file whose producer stores only
    // the forward shows the backward as skip, never as part of an agree.
    // A file that cannot be read or judged: ERROR (unreadable input, exit 2), named by its path.
    auto error_row = [&](const std::string& op, const std::string& who) {
      char line[1024];
      std::snprintf(line, sizeof line, "%-*s %-24s %-16s %s", width, shown.c_str(), op.c_str(), who.c_str(),
                    "ERROR: unreadable input (the error above)");
      out.rows.emplace_back(line, "ERROR");
    };
    auto rows = [&](const std::string& who, const std::vector<oracle::OpReport>& reports, bool producer) {
      for (const auto& r : reports) {
        const std::string word = op_result(r, producer);
        char line[1024];
        std::snprintf(line, sizeof line, "%-*s %-24s %-16s %s", width, shown.c_str(), r.op.c_str(),
                      who.c_str(), word.c_str());
        out.rows.emplace_back(line, word.substr(0, word.find(':')));
      }
    };
    fixtures::Fixture f;
    oracle::OpCase c;  // built once: the producer and every backend share its reference results
    oracle::FixtureReport r;
    try {
      f = fixtures::load_fixture(file);  // refuses conventions of another op (fresh14 F4, fresh19)
      c = oracle::op_case_from_fixture(f);
      check_fixture_inputs(f, c, oracle::fixture_ops(f));  // an input error: one row, before any candidate
      r = oracle::check_fixture(f, c, nullptr, opt);
    } catch (const std::exception& e) {
      // FileError already names the file; anything else gets its path here. The file is a
      // row of its own (named by its path) and counted as unreadable: input error, exit 2.
      // Out of memory (ResourceError) keeps the rows of the ops judged before it.
      if (const auto* re = dynamic_cast<const oracle::ResourceError*>(&e)) rows("producer", re->partial, true);
      const std::string msg = dynamic_cast<const std::bad_alloc*>(&e)
                                  ? "out of memory (std::bad_alloc) reading the file or preparing its case: no verdict"
                                  : e.what();
      const std::string line = msg.rfind(file, 0) == 0 ? msg : file + ": " + msg;
      out.text += "error: " + line + "\n";
      out.usage_error = true;
      error_row("-", "-");
      out.json = nlohmann::json{{"path", file}, {"file", shown}, {"error", line}};
      if (const auto* re = dynamic_cast<const oracle::ResourceError*>(&e))
        (*out.json)["producer"] = reports_json(re->partial);  // the ops judged before it
      return;
    }
    {  // the producer's stored ids may be a representation its file does not declare
      const oracle::CandidateBackend producer = oracle::expected_candidate(f);
      add_convention_hints(r.producer_vs_reference, producer, &c, HintRoute::FixtureField);
    }
    const bool producer_ok = r.passed();
    if (verbose || !producer_ok) out.text += oracle::format_fixture_report(r) + "\n";
    rows("producer", r.producer_vs_reference, true);
    for (const auto& n : r.not_outputs)
      out.text += "note: " + file + ": tensor 'expected." + n + "' is not an output of op " + f.op + "; not judged\n";
    for (const auto& n : r.not_inputs)
      out.text += "note: " + file + ": tensor '" + n + "' is not an input of op " + f.op + " nor expected.*; not read\n";
    nlohmann::json jf = {{"path", file}, {"file", shown}, {"case", f.case_name},
                         {"producer", reports_json(r.producer_vs_reference)},
                         {"backends", nlohmann::json::object()}};
    if (!r.not_outputs.empty()) jf["not_outputs"] = r.not_outputs;
    if (!r.not_inputs.empty()) jf["not_inputs"] = r.not_inputs;
    for (auto& b : backends) {
      std::vector<oracle::OpReport> reports;
      try {
        reports = oracle::judge_fixture_ops(f, c, *b, opt);
      } catch (const std::exception& e) {
        if (const auto* re = dynamic_cast<const oracle::ResourceError*>(&e)) rows(b->name(), re->partial, false);
        const std::string msg = e.what();
        out.text += "error: " + (msg.rfind(file, 0) == 0 ? msg : file + ": " + msg) + "\n";
        out.usage_error = true;
        error_row("-", b->name());
        jf["backends"][b->name()] = nlohmann::json{{"error", msg}};
        if (const auto* re = dynamic_cast<const oracle::ResourceError*>(&e))
          jf["backends"][b->name()]["ops"] = reports_json(re->partial)["ops"];  // judged before it
        continue;
      }
      const oracle::Verdict v = oracle::overall_verdict(reports);
      if (verbose || (v != oracle::Verdict::Pass && v != oracle::Verdict::Skip))
        for (const auto& rep : reports) out.text += oracle::format_op_report(rep);
      rows(b->name(), reports, false);
      jf["backends"][b->name()] = reports_json(reports);
    }
    out.json = std::move(jf);
  };
  auto print_file = [&](int64_t i) {
    FileResult& out = results[static_cast<size_t>(i)];
    std::fputs(out.text.c_str(), stdout);
    std::fflush(stdout);
    if (out.usage_error) code = kExitUsage;
    for (const auto& [line, w] : out.rows) {
      summary.push_back(line);
      (w == "agree"        ? pass
       : w == "partial"    ? partial
       : w == "skip"       ? skip
       : w == "ERROR"      ? errors
       : w == "WEAK"       ? weak
       : w == "INCOMPLETE" ? incomplete
                           : fail)++;
      if (w != "agree" && w != "partial" && w != "skip" && code == kExitOk) code = kExitDisagree;
    }
    if (out.json) json_files.push_back(std::move(*out.json));
    out = FileResult{};  // free the text early
  };
  parallel_ordered(static_cast<int64_t>(files.size()), judge_file, print_file);
  if (!judge.json_path.empty())
    write_text_file(judge.json_path, nlohmann::json{{"files", json_files}, {"not_judged", skipped},
                                                    {"rounding_models", rounding_models}}.dump(2) + "\n");
  std::printf("\nfixtures check %s\n%-*s %-24s %-16s %s\n", path.c_str(), width, "file", "op", "judged", "result");
  for (const auto& s : summary) std::printf("%s\n", s.c_str());
  std::printf("\nfixtures: %zu agree, %zu partial, %zu disagree, %zu WEAK, %zu INCOMPLETE, %zu skipped, %zu "
              "unreadable (rows: one per op and candidate; an unreadable file is one row, exit 2)\n",
              pass, partial, fail, weak, incomplete, skip, errors);
  if (!skipped.empty())
    std::printf("fixtures: %zu entr%s of %s not judged (no recursion, lower-case .safetensors only): see the notes above\n",
                skipped.size(), skipped.size() == 1 ? "y" : "ies", path.c_str());
  // Nothing judged (every row a skip) is not a pass, as in the audit.
  if (code == kExitOk && pass + partial + fail + weak + incomplete + errors == 0) {
    std::fprintf(stderr, "dsa-verify: error: fixtures check %s judged nothing: every row was skipped "
                 "(no stored outputs, no backend that runs the op, or nothing to judge: the reasons are in the rows)\n",
                 path.c_str());
    return kExitUsage;
  }
  return code;
}

int run_fixtures_generate(const std::string& preset, const std::string& out_dir) {
#ifdef DSA_HAVE_GENERATOR
  fixtures::generate_preset(preset, out_dir);
  std::printf("fixtures generate: preset %s written to %s\n", preset.c_str(), out_dir.c_str());
  return kExitOk;
#else
  std::fprintf(stderr, "dsa-verify: fixtures generate is not built in this configuration\n");
  return kExitUsage;
#endif
}

int run_replay(const std::string& file, const std::string& backend_arg, const std::string& plugin_path,
               const std::string& candidate, const JudgeOptions& judge,
               const std::vector<fixtures::Convention>& conventions) {
  if (!conventions.empty() && candidate.empty())
    throw std::invalid_argument("replay: argument '--convention' converts a candidate file; it needs --candidate");
  fixtures::Fixture f = fixtures::load_fixture(file);
  if (judge.outputs) oracle::check_provided_outputs(*judge.outputs, oracle::fixture_ops(f), "--outputs");
  check_conventions_apply(conventions, oracle::fixture_ops(f), "--convention");
  std::unique_ptr<oracle::Backend> b;
  const oracle::CandidateBackend* stored = nullptr;  // --candidate: for convention hints
  bool file_route = false;
  if (!candidate.empty()) {
    std::vector<std::string> ignored;
    auto cb = oracle::load_candidate_file(candidate, conventions, &ignored);
    try {  // the file's own conventions follow the flag's rule (fresh14 F4)
      check_conventions_apply(cb->conventions(), oracle::fixture_ops(f), "metadata 'conventions'");
    } catch (const std::invalid_argument& e) {
      throw fixtures::FileError(candidate, e.what());
    }
    print_candidate_file_notes(f, *cb, ignored, check_options(judge, true), candidate);
    stored = cb.get();
    b = std::move(cb);
    file_route = true;
  } else {
    const std::string name = plugin_path.empty() ? backend_arg : plugin::register_plugin(plugin_path);
    b = oracle::make_backend(name);
  }
  std::string why = b->unavailable_reason();
  if (!why.empty()) {
    std::fprintf(stderr, "dsa-verify: backend %s unavailable: %s\n", b->name().c_str(), why.c_str());
    return kExitUsage;
  }
  const nlohmann::json rounding = announce_rounding((file_route ? "candidate " + candidate : b->name()),
                                                     {rounding_flags_of(judge), b->rounding_model()});
  const oracle::OpCase c = oracle::op_case_from_fixture(f);
  std::vector<oracle::OpReport> reports;
  try {
    check_fixture_inputs(f, c, oracle::fixture_ops(f));  // an input error before the candidate runs
    reports = oracle::judge_fixture_ops(f, c, *b, check_options(judge, file_route));
  } catch (const oracle::ResourceError& e) {
    return report_resource_error(e, judge.json_path);  // no verdict; what was judged is kept
  }
  if (stored) add_convention_hints(reports, *stored, &c, HintRoute::ConventionOption);
  for (const auto& r : reports) std::printf("%s", oracle::format_op_report(r).c_str());
  if (!judge.json_path.empty()) {
    nlohmann::json j = reports_json(reports);
    j["rounding_models"] = nlohmann::json::array({rounding});
    write_text_file(judge.json_path, j.dump(2) + "\n");
  }
  std::printf("replay: %s\n", oracle::verdict_line(reports).c_str());
  if (judged_nothing(reports))
    std::printf("replay: judged nothing: every op of '%s' was skipped (see the reasons above)\n",
                f.op.c_str());
  return exit_code(reports);
}

}  // namespace dsa::cli

// `dsa-verify compare`: an external kernel's outputs, saved as safetensors, judged against a
// golden fixture. The candidate file is served by oracle::CandidateBackend and judged by
// oracle::judge_fixture_ops, the code every other route uses (SPEC §9); conventions convert
// representations and never loosen a check.
#include <algorithm>
#include <cstdio>
#include <set>

#include "commands.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/fixture_check.h"
#include "judge.h"
#include "report.h"

namespace dsa::cli {

int run_compare(const std::string& golden, const std::string& candidate,
                const std::vector<fixtures::Convention>& conventions, const JudgeOptions& judge) {
  const fixtures::Fixture f = fixtures::load_fixture(golden);
  if (judge.outputs) oracle::check_provided_outputs(*judge.outputs, oracle::fixture_ops(f), "--outputs");
  check_conventions_apply(conventions, oracle::fixture_ops(f), "--convention");
  std::vector<std::string> ignored;
  auto backend = oracle::load_candidate_file(candidate, conventions, &ignored);
  // The file's own conventions (its metadata) follow the flag's rule: an input error naming it.
  try {
    check_conventions_apply(backend->conventions(), oracle::fixture_ops(f), "metadata 'conventions'");
  } catch (const std::invalid_argument& e) {
    throw fixtures::FileError(candidate, e.what());
  }
  for (fixtures::Convention c : backend->conventions())
    std::printf("convention: %s (converts the candidate's representation; no check is loosened)\n",
                fixtures::to_string(c));
  // A file with no output of the golden's op at all is the wrong file (usage error, exit 2);
  // one missing some outputs is INCOMPLETE (exit 1) unless --outputs names what it provides.
  bool any = false;
  for (oracle::Op op : oracle::fixture_ops(f)) any |= !backend->stored_outputs(op).empty();
  if (!any) throw fixtures::FileError(candidate, "holds no outputs for the golden's op " + f.op);
  const nlohmann::json rounding =
      announce_rounding("candidate " + candidate, {rounding_flags_of(judge), backend->rounding_model()});
  const oracle::CheckOptions opt = check_options(judge, /*file_route=*/true);
  print_candidate_file_notes(f, *backend, ignored, opt, candidate);
  const oracle::OpCase c = oracle::op_case_from_fixture(f);
  std::vector<oracle::OpReport> reports;
  try {
    reports = oracle::judge_fixture_ops(f, c, *backend, opt);
  } catch (const oracle::ResourceError& e) {
    return report_resource_error(e, judge.json_path);  // no verdict; what was judged is kept
  }
  add_convention_hints(reports, *backend, &c, HintRoute::CompareFlags);
  for (const auto& n : backend->adapter_notes()) std::printf("convention applied: %s\n", n.c_str());
  for (const auto& r : reports) std::printf("%s", oracle::format_op_report(r).c_str());
  if (!judge.json_path.empty()) {
    nlohmann::json j = reports_json(reports);
    j["rounding_models"] = nlohmann::json::array({rounding});
    write_text_file(judge.json_path, j.dump(2) + "\n");
  }
  std::printf("compare: %s\n", oracle::verdict_line(reports).c_str());
  if (judged_nothing(reports))
    std::printf("compare: judged nothing: every op of golden '%s' was skipped (see the reasons above)\n",
                f.op.c_str());
  return exit_code(reports);
}

}  // namespace dsa::cli

// `dsa-verify compare`: an external kernel's outputs, saved as safetensors, judged against a
// golden fixture. The candidate file is served by oracle::CandidateBackend and judged by
// oracle::judge_fixture_ops, the code every other route uses (SPEC §9); conventions convert
// representations and never loosen a check.
#include <cstdio>

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
  std::vector<std::string> ignored;
  auto backend = oracle::load_candidate_file(candidate, conventions, &ignored);
  for (const auto& n : ignored)
    std::printf("note: %s: tensor '%s' is not an output name; ignored\n", candidate.c_str(), n.c_str());
  for (fixtures::Convention c : backend->conventions())
    std::printf("convention: %s (converts the candidate's representation; no check is loosened)\n",
                fixtures::to_string(c));
  // A file with no output of the golden's op at all is the wrong file (usage error, exit 2);
  // one missing some outputs is INCOMPLETE (exit 1) unless --outputs names what it provides.
  bool any = false;
  for (oracle::Op op : oracle::fixture_ops(f)) any |= !backend->stored_outputs(op).empty();
  if (!any) throw fixtures::FileError(candidate, "holds no outputs for the golden's op " + f.op);
  std::vector<oracle::OpReport> reports =
      oracle::judge_fixture_ops(f, *backend, check_options(judge, /*file_route=*/true));
  add_convention_hints(reports, *backend);
  for (const auto& n : backend->adapter_notes()) std::printf("convention applied: %s\n", n.c_str());
  for (const auto& r : reports) std::printf("%s", oracle::format_op_report(r).c_str());
  if (!judge.json_path.empty()) write_text_file(judge.json_path, reports_json(reports).dump(2) + "\n");
  std::printf("compare: %s\n", oracle::verdict_line(reports).c_str());
  return exit_code(reports);
}

}  // namespace dsa::cli

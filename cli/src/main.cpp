// dsa-verify: audit DSA kernels against the float64 reference (docs/SPEC.md).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "commands.h"
#include "dsa/backends/builtin.h"

int main(int argc, char** argv) {
  using namespace dsa::cli;
  CLI::App app{"dsa-verify: verification suite for DeepSeek Sparse Attention kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("dsa-verify ") + DSA_VERSION +
                                        " (contract " + DSA_CONTRACT_VERSION + ")");

  AuditOptions audit;
  auto* audit_cmd = app.add_subcommand("audit", "Audit a backend: properties, golden and peer fixtures");
  auto* backend_opt = audit_cmd->add_option("--backend", audit.backends,
      "Backend name (repeatable; default: libtorch-cpu, plus libtorch-cuda and cuda with a GPU)");
  audit_cmd->add_option("--plugin", audit.plugin, "Plugin shared library implementing dsa/backend_abi.h")
      ->check(CLI::ExistingFile)->excludes(backend_opt);
  audit_cmd->add_option("--ops", audit.ops, "Ops to audit (comma-separated)")->delimiter(',');
  audit_cmd->add_option("--only", audit.only, "Run only these properties (comma-separated names)")->delimiter(',');
  audit_cmd->add_option("--level", audit.level, "Test level 0 (CI), 1, 2 (soak)")->check(CLI::Range(0, 2));
  audit_cmd->add_option("--seed", audit.seed, "Seed of the property runs");
  audit_cmd->add_option("--json", audit.json_path, "Write the full report as JSON");
  audit_cmd->add_option("--junit", audit.junit_path, "Write JUnit XML");
  audit_cmd->add_flag("--fail-fast", audit.fail_fast, "Stop at the first failure");
  audit_cmd->add_option("--timeout", audit.timeout_s, "Seconds per plugin call before it counts as hung")
      ->check(CLI::PositiveNumber);
  audit_cmd->add_option("--dump-dir", audit.dump_dir, "Where failing cases are dumped as fixtures");

  auto* fixtures_cmd = app.add_subcommand("fixtures", "Generate or check golden fixtures");
  fixtures_cmd->require_subcommand(1);
  std::string preset, out_dir, check_dir;
  std::vector<std::string> check_backends;
  bool verbose = false;
  auto* gen = fixtures_cmd->add_subcommand("generate", "Generate a fixture preset");
  gen->add_option("--preset", preset, "ci | glm5 | deepseek-v3.2")->required();
  gen->add_option("--out", out_dir, "Output directory")->required();
  auto* check = fixtures_cmd->add_subcommand("check", "Check a fixture directory");
  check->add_option("dir", check_dir, "Directory of .safetensors fixtures")->required()
      ->check(CLI::ExistingDirectory);
  check->add_option("--backend", check_backends, "Backends to run (default: every available)");
  check->add_flag("-v,--verbose", verbose, "Print every tensor table, not only failures");

  std::string golden, candidate;
  CompareAdapters adapters;
  auto* compare = app.add_subcommand("compare", "Compare an external kernel's outputs with a golden fixture");
  compare->add_option("--golden", golden, "Golden fixture (.safetensors)")->required()->check(CLI::ExistingFile);
  compare->add_option("--candidate", candidate, "Candidate outputs (.safetensors)")->required()->check(CLI::ExistingFile);
  compare->add_flag("--lse-base2", adapters.lse_base2, "Candidate lse/max_logits use log base 2");
  compare->add_flag("--narrowed-topk-width", adapters.narrowed_topk_width, "Candidate indices have min(k, s_kv) columns");
  compare->add_flag("--int64-ids", adapters.int64_ids, "Candidate indices are int64");
  compare->add_flag("--indices-3d", adapters.indices_3d, "Candidate indices are [s_q, 1, k]");

  std::string replay_fixture, replay_backend = "reference", replay_plugin;
  auto* replay = app.add_subcommand("replay", "Re-run one dumped failing case");
  replay->add_option("fixture", replay_fixture, "Dumped fixture (.safetensors)")->required()->check(CLI::ExistingFile);
  auto* replay_backend_opt = replay->add_option("--backend", replay_backend, "Backend to run");
  replay->add_option("--plugin", replay_plugin, "Plugin shared library to run")
      ->check(CLI::ExistingFile)->excludes(replay_backend_opt);

  auto* list = app.add_subcommand("backends", "List the registered backends");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }
  try {
    dsa::backends::register_builtin_backends();
    if (*audit_cmd) return run_audit(audit);
    if (*gen) return run_fixtures_generate(preset, out_dir);
    if (*check) return run_fixtures_check(check_dir, check_backends, verbose);
    if (*compare) return run_compare(golden, candidate, adapters);
    if (*replay) return run_replay(replay_fixture, replay_backend, replay_plugin);
    if (*list) return run_list_backends();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsa-verify: error: %s\n", e.what());
    return kExitUsage;
  }
  return kExitUsage;
}

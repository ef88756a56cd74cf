// dsa-verify: audit DSA kernels against the float64 reference (docs/SPEC.md).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>

#include "commands.h"
#include "judge.h"
#include "dsa/contract/parallel.h"
#include "numeric_options.h"
#include "dsa/backends/builtin.h"
#include "dsa/plugin/plugin_backend.h"
#include "dsa/property_tests/suite.h"

// The rule of --outputs on every route (oracle::provided_outputs_for, check_provided_outputs).
static const char* const kOutputsRule =
    "each name must be an output of a selected op (else a usage error); an op's outputs not named are "
    "not judged (partial); an op none of whose outputs is named is judged in full, except on the file "
    "routes an op of which the candidate file holds no output (not judged)";
// --sink-after-rounding on every judging route (oracle::CheckOptions::sink_after_rounding).
static const char* const kSinkAfterRoundingHelp =
    "The kernel rounds sparse MLA's out to its 16-bit dtype before applying attn_sink "
    "(out = bf16(bf16(o) * r), r = exp(lse)/(exp(lse)+exp(sink))): out's bound on sink rows adds "
    "that first rounding, r x half-ulp(out / r), and WEAK rows follow that bound (SPEC §4, §9)";
// --normalized-p on every judging route (oracle::CheckOptions::rounding).
static const char* const kNormalizedPHelp =
    "The kernel rounds the normalized probabilities softmax(P) to its 16-bit dtype before P·V "
    "(softmax in fp32, then .to(bf16) @ V), the max key's too (FlashMLA's exp(P - max) = 1 is exact): "
    "out's bound adds that rounding, u16 b(p_max)|v_c|, and WEAK rows follow that bound (SPEC §4, §9)";

int main(int argc, char** argv) {
  using namespace dsa::cli;
  CLI::App app{"dsa-verify: verification suite for DeepSeek Sparse Attention kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("dsa-verify ") + DSA_VERSION +
                                        " (contract " + DSA_CONTRACT_VERSION + ")");

  // --jobs N (audit, fixtures check): threads for concurrent cases and the reference's rows,
  // all together (dsa::set_max_threads); default all cores of this process.
  int jobs = 0;
  const std::string jobs_help = "Threads in all (concurrent cases and reference rows), an integer from 1 to " +
                                std::to_string(kMaxJobs) + " (default: all cores)";
  AuditOptions audit;
  auto* audit_cmd = app.add_subcommand("audit", "Audit a backend: properties, golden and peer fixtures");
  auto* backend_opt = audit_cmd->add_option("--backend", audit.backends,
      "Backend name (repeatable; default: libtorch-cpu, plus libtorch-cuda and cuda with a GPU)");
  audit_cmd->add_option("--plugin", audit.plugin, "Plugin shared library implementing dsa/backend_abi.h")
      ->check(CLI::ExistingFile)->excludes(backend_opt);
  audit_cmd->add_option("--ops", audit.ops, "Ops to audit (comma-separated)");
  audit_cmd->add_option("--only", audit.only, "Run only these properties (comma-separated names)");
  audit_cmd->add_option("--level", audit.level, "Test level 0 (CI), 1, 2 (soak)")
      ->check(integer_in("--level", 0, 2, "a test level"));
  // Read as text and checked here: a negative or too large number would otherwise wrap
  // silently into another seed (uint64).
  std::string seed_text;
  audit_cmd->add_option("--seed", seed_text,
      "Seed of the property runs, 0 to 18446744073709551615 (0: a random seed per property)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const std::string range = "expected an integer from 0 to 18446744073709551615";
            if (v.empty() || v.size() > 20 || v.find_first_not_of("0123456789") != std::string::npos)
              return "got \"" + v + "\", " + range;
            if (v.size() == 20 && v > "18446744073709551615") return "got " + v + ", " + range;
            return "";
          },
          "UINT64"));
  audit_cmd->add_option("--json", audit.json_path, "Write the full report as JSON")
      ->check(output_path("a file path"));
  audit_cmd->add_option("--junit", audit.junit_path, "Write JUnit XML")->check(output_path("a file path"));
  audit_cmd->add_flag("--fail-fast", audit.fail_fast, "Stop at the first failure");
  audit_cmd->add_option("--timeout", audit.timeout_s,
      "Seconds per backend call before it counts as hung: " + timeout_range() + " (default 30). A plugin's "
      "call runs in a child that is then killed (a failed case); an in-process backend's call cannot be "
      "killed: the audit then fails the case, writes the report of everything done and exits 1")
      ->check(timeout_seconds("--timeout"));
  audit_cmd->add_option("--dump-dir", audit.dump_dir, "Where failing cases are dumped as fixtures")
      ->check(output_path("a directory path"));
  std::vector<std::string> audit_outputs;
  audit_cmd->add_option("--outputs", audit_outputs, std::string("Outputs the kernel provides (comma-separated, e.g. out,lse); ") + kOutputsRule)
      ;
  audit_cmd->add_option("--unsupported", audit.unsupported,
      "What the kernel leaves out (comma-separated feature keys: invalid_ids, empty_rows, "
      "duplicate_ids, neg_inf_scores, nan_scores, ...; or property names): a backend that declines "
      "these SPEC-mandatory cases is then not INCOMPLETE, and the report says they were not judged")
      ;
  audit_cmd->add_flag("--allow-weak", audit.judge.allow_weak,
      "Accept WEAK outputs (whose bound exceeds their detection threshold) instead of failing");
  audit_cmd->add_flag("--sink-after-rounding", audit.judge.sink_after_rounding, kSinkAfterRoundingHelp);
  audit_cmd->add_flag("--normalized-p", audit.judge.normalized_p, kNormalizedPHelp);
  audit_cmd->add_option("--jobs,-j", jobs, jobs_help)->check(integer_in("--jobs", 1, kMaxJobs, "a number of threads"));

  auto* fixtures_cmd = app.add_subcommand("fixtures", "Generate or check golden fixtures");
  fixtures_cmd->require_subcommand(1);
  std::string preset, out_dir, check_dir;
  std::vector<std::string> check_backends;
  bool verbose = false;
  auto* gen = fixtures_cmd->add_subcommand("generate", "Generate a fixture preset");
  gen->add_option("--preset", preset, "ci | glm5 | deepseek-v3.2")->required();
  gen->add_option("--out", out_dir, "Output directory")->required()->check(output_path("a directory path"));
  JudgeOptions check_judge;
  auto* check = fixtures_cmd->add_subcommand("check", "Check a fixture directory or one fixture file");
  check->add_option("path", check_dir, "Directory of .safetensors fixtures, or one fixture file")
      ->required()->check(CLI::ExistingPath);
  check->add_option("--backend", check_backends, "Backends to run (default: every available)");
  std::string check_plugin;
  check->add_option("--plugin", check_plugin,
      "Plugin shared library to judge (each call isolated, as in audit and replay); alone it is the "
      "only candidate besides the producer, with --backend one more")->check(CLI::ExistingFile);
  check->add_flag("-v,--verbose", verbose, "Print every tensor table, not only failures");
  check->add_flag("--allow-weak", check_judge.allow_weak, "Accept WEAK outputs instead of failing");
  check->add_flag("--sink-after-rounding", check_judge.sink_after_rounding, kSinkAfterRoundingHelp);
  check->add_flag("--normalized-p", check_judge.normalized_p, kNormalizedPHelp);
  check->add_option("--json", check_judge.json_path, "Write per-file, per-output verdicts and bounds as JSON")
      ->check(output_path("a file path"));
  check->add_option("--unsupported", check_judge.unsupported,
      "SPEC-mandatory features the kernel leaves out (comma-separated feature keys, as audit "
      "--unsupported): a case a backend declines that holds only these is a skip, not INCOMPLETE");
  check->add_option("--jobs,-j", jobs, jobs_help)->check(integer_in("--jobs", 1, kMaxJobs, "a number of threads"));

  std::string golden, candidate;
  std::vector<std::string> convention_names, compare_outputs;
  bool lse_base2 = false, narrowed = false, int64_ids = false, indices_3d = false;
  JudgeOptions compare_judge;
  auto* compare = app.add_subcommand("compare", "Compare an external kernel's outputs with a golden fixture");
  compare->add_option("--golden", golden, "Golden fixture (.safetensors)")->required()->check(CLI::ExistingFile);
  compare->add_option("--candidate", candidate, "Candidate outputs (.safetensors)")->required()->check(CLI::ExistingFile);
  compare->add_option("--convention", convention_names,
      "How the candidate represents its outputs (repeatable or comma-separated): " +
      dsa::fixtures::convention_names());
  compare->add_flag("--lse-base2", lse_base2, "Same as --convention lse_base2");
  compare->add_flag("--narrowed-topk-width", narrowed, "Same as --convention topk_width_min_k_s_kv");
  compare->add_flag("--int64-ids", int64_ids, "Same as --convention int64_ids");
  compare->add_flag("--indices-3d", indices_3d, "Same as --convention ids_s_q_1_k");
  compare->add_option("--outputs", compare_outputs,
      std::string("Outputs the kernel provides (comma-separated, e.g. out,lse); ") + kOutputsRule +
      " (default: every output of the op is judged, a missing one is INCOMPLETE)");
  compare->add_flag("--allow-weak", compare_judge.allow_weak, "Accept WEAK outputs instead of failing");
  compare->add_flag("--sink-after-rounding", compare_judge.sink_after_rounding, kSinkAfterRoundingHelp);
  compare->add_flag("--normalized-p", compare_judge.normalized_p, kNormalizedPHelp);
  compare->add_option("--json", compare_judge.json_path, "Write per-output verdicts and bounds as JSON")
      ->check(output_path("a file path"));

  std::string replay_fixture, replay_backend = "reference", replay_plugin, replay_candidate;
  std::vector<std::string> replay_outputs;
  JudgeOptions replay_judge;
  auto* replay = app.add_subcommand("replay", "Re-run one dumped failing case");
  replay->add_option("fixture", replay_fixture, "Dumped fixture (.safetensors)")->required()->check(CLI::ExistingFile);
  auto* replay_backend_opt = replay->add_option(
      "--backend", replay_backend,
      "Backend to run (default: reference, which only re-judges the case's own float64 reference; "
      "to reproduce a failure give the --backend, --plugin or --candidate its repro line names)");
  auto* replay_plugin_opt = replay->add_option("--plugin", replay_plugin, "Plugin shared library to run")
      ->check(CLI::ExistingFile)->excludes(replay_backend_opt);
  replay->add_option("--candidate", replay_candidate, "Judge stored outputs (.safetensors) instead of running a backend")
      ->check(CLI::ExistingFile)->excludes(replay_backend_opt)->excludes(replay_plugin_opt);
  replay->add_option("--outputs", replay_outputs,
      std::string("Outputs the kernel provides (comma-separated); ") + kOutputsRule);
  std::vector<std::string> replay_conventions;
  replay->add_option("--convention", replay_conventions,
      "With --candidate: how the file represents its outputs (" + dsa::fixtures::convention_names() + ")")
      ;
  replay->add_flag("--allow-weak", replay_judge.allow_weak, "Accept WEAK outputs instead of failing");
  replay->add_flag("--sink-after-rounding", replay_judge.sink_after_rounding, kSinkAfterRoundingHelp);
  replay->add_flag("--normalized-p", replay_judge.normalized_p, kNormalizedPHelp);
  replay->add_option("--json", replay_judge.json_path, "Write per-output verdicts and bounds as JSON")
      ->check(output_path("a file path"));

  auto* list = app.add_subcommand("backends", "List the registered backends");
  auto* mutants = app.add_subcommand("mutants", "The mutants of the property suite and their plugin libraries");
  bool mutants_list = false;
  mutants->add_flag("--list", mutants_list,
                    "List index, plugin library (libdsa_mutant_plugin_N.so), name and fault of every mutant")
      ->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }
  try {
    if (jobs > 0) dsa::set_max_threads(jobs);
    dsa::backends::register_builtin_backends();
    if (!seed_text.empty()) audit.seed = std::stoull(seed_text);  // checked above
    // Comma lists are split here, not by CLI11, which drops empty items ("out,,lse").
    audit.ops = split_list_option(audit.ops, "--ops");
    audit.only = split_list_option(audit.only, "--only");
    audit.unsupported = split_list_option(audit.unsupported, "--unsupported");
    check_judge.unsupported = split_list_option(check_judge.unsupported, "--unsupported");
    dsa::props::validate_unsupported(check_judge.unsupported);
    audit_outputs = split_list_option(audit_outputs, "--outputs");
    compare_outputs = split_list_option(compare_outputs, "--outputs");
    replay_outputs = split_list_option(replay_outputs, "--outputs");
    convention_names = split_list_option(convention_names, "--convention");
    replay_conventions = split_list_option(replay_conventions, "--convention");
    if (!audit_outputs.empty()) audit.judge.outputs = parse_output_names(audit_outputs, "--outputs");
    if (!compare_outputs.empty()) compare_judge.outputs = parse_output_names(compare_outputs, "--outputs");
    if (!replay_outputs.empty()) replay_judge.outputs = parse_output_names(replay_outputs, "--outputs");
    if (*audit_cmd) return run_audit(audit);
    if (*gen) return run_fixtures_generate(preset, out_dir);
    if (*check) {
      if (!check_plugin.empty()) check_backends.push_back(dsa::plugin::register_plugin(check_plugin));
      return run_fixtures_check(check_dir, check_backends, verbose, check_judge);
    }
    if (*compare) {
      using dsa::fixtures::Convention;
      std::vector<Convention> conv = dsa::fixtures::parse_conventions(convention_names, "--convention");
      auto add = [&conv](bool on, Convention c) {
        if (on && std::find(conv.begin(), conv.end(), c) == conv.end()) conv.push_back(c);
      };
      add(lse_base2, Convention::LseBase2);
      add(narrowed, Convention::TopkWidthMinKSkv);
      add(int64_ids, Convention::Int64Ids);
      add(indices_3d, Convention::IdsSq1K);
      return run_compare(golden, candidate, conv, compare_judge);
    }
    if (*replay && replay_backend_opt->count() == 0 && replay_plugin.empty() && replay_candidate.empty())
      std::printf("note: replay: no --backend, --plugin or --candidate given: judging the built-in "
                  "'reference' backend, which reproduces no kernel's failure\n");
    if (*replay)
      return run_replay(replay_fixture, replay_backend, replay_plugin, replay_candidate, replay_judge,
                        dsa::fixtures::parse_conventions(replay_conventions, "--convention"));
    if (*list) return run_list_backends();
    if (*mutants) return run_list_mutants();
  } catch (const std::bad_alloc&) {
    // Out of memory outside a judged op (judge_fixture_ops names those): no verdict.
    std::fprintf(stderr, "dsa-verify: error: out of memory (std::bad_alloc) while reading or preparing the "
                         "inputs: no verdict; free memory or give a smaller case\n");
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsa-verify: error: %s\n", e.what());
    return kExitUsage;
  }
  return kExitUsage;
}

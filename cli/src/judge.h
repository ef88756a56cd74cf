// What every judging route of the CLI shares: CheckOptions from the flags, the verdict line,
// the exit code and the JSON of per-output verdicts and bounds (compare, replay, fixtures
// check, audit).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/op_check.h"
#include "dsa/oracle/report.h"

namespace dsa::cli {

/// The items of a comma-separated list option given once or repeated (`--outputs out,lse`,
/// `--outputs out --outputs lse`), split on ','. An empty item (`out,,lse`, `lse_base2,`, an
/// empty value) is a usage error naming `flag` and the value (std::invalid_argument), never
/// silently dropped. Source: project rule "bad input gets a clear error naming the argument".
std::vector<std::string> split_list_option(const std::vector<std::string>& values, const std::string& flag);

/// A convention named by an option (`--convention`, or compare's flag aliases such as
/// --int64-ids) must convert an output of one of `ops` (the golden's ops): lse_base2 the
/// sparse MLA forward's lse/max_logits, int64_ids, ids_s_q_1_k and topk_width_min_k_s_kv the
/// top-k ids (docs/fixtures.md conventions). One that applies to none is a usage error naming
/// `flag`, the convention and the op it applies to (std::invalid_argument), as --outputs treats
/// a name of no selected op. The rule and message are fixtures::check_conventions_apply's
/// (load_fixture applies it to a golden's own field).
void check_conventions_apply(const std::vector<fixtures::Convention>& conventions,
                             const std::vector<oracle::Op>& ops, const std::string& flag);

/// A route's answer to judging that ran out of memory (oracle::ResourceError): prints the
/// reports of the ops judged before it, then "dsa-verify: error: <what>" on stderr, writes
/// {"ops": partial, "error": what} to `json_path` when given; returns kExitUsage (no verdict).
int report_resource_error(const oracle::ResourceError& e, const std::string& json_path);

/// CheckOptions of a route: --outputs and --allow-weak; `file_route` turns the determinism
/// run off (a stored file returns the same bytes twice by construction).
oracle::CheckOptions check_options(const JudgeOptions& j, bool file_route);

/// check_options with the outputs `backend` declares it writes (Backend::provided_outputs, a
/// plugin's provided_outputs) intersected into provided_outputs: the others are not judged.
oracle::CheckOptions check_options(const JudgeOptions& j, bool file_route, const oracle::Backend& backend);

/// The rounding models a backend is judged with (SPEC §9, oracle::RoundingModel): the route's
/// flags (--sink-after-rounding, --normalized-p; Python's arguments and backend attributes) and
/// what the backend declares (Backend::rounding_model, a plugin's rounding_models). Either
/// declares: a flag adds a model the backend leaves out and never removes one it declares, since
/// only the author knows how the kernel rounds and the declaration widens out's bound by one
/// rounding only where a 16-bit out takes it.
struct DeclaredRounding {
  oracle::RoundingModel flags;    ///< from the route's options (JudgeOptions)
  oracle::RoundingModel backend;  ///< from Backend::rounding_model
  /// The models judged with: oracle::either(flags, backend).
  oracle::RoundingModel judged() const { return oracle::either(flags, backend); }
};
/// The flags of `j` as a RoundingModel. Throws nothing.
oracle::RoundingModel rounding_flags_of(const JudgeOptions& j);
/// " --sink-after-rounding --normalized-p" for the models of `m` ("" for neither): what a
/// reproduce line appends so that it judges the same way, whoever declared them.
std::string rounding_flags(const oracle::RoundingModel& m);
/// One report line naming each judged model and who declared it: "rounding models of plugin:k:
/// normalized_p (declared by the backend's capabilities)" (a plugin's rounding_models),
/// "normalized_p (--normalized-p)" for a flag, "(declared by the backend's capabilities, and
/// --normalized-p)" for both; "" when neither model is judged. `backend`: the name as reported.
std::string rounding_line(const std::string& backend, const DeclaredRounding& d);
/// {"backend": name, "sink_after_rounding": {"judged", "flag", "backend"}, "normalized_p": {...}}
/// (booleans), for the audit's JSON report.
nlohmann::json rounding_json(const std::string& backend, const DeclaredRounding& d);
/// What every judging route (compare, replay, fixtures check; audit prints its own at the start
/// and in the summary) says about the rounding models it judges `backend` with: prints
/// rounding_line(backend, d) and a newline on stdout when a model is judged (nothing otherwise),
/// and returns rounding_json(backend, d) for the route's JSON report ("rounding_models").
nlohmann::json announce_rounding(const std::string& backend, const DeclaredRounding& d);

/// How a route declares a convention, for hints: compare's flags (--narrowed-topk-width),
/// replay's --convention, or a fixture's `conventions` metadata (fixtures check).
enum class HintRoute { CompareFlags, ConventionOption, FixtureField };

/// Hints for a stored candidate whose ids look like a representation a convention converts:
/// I64 indices without int64_ids, [s_q, 1, k] indices without ids_s_q_1_k, and (with the case
/// `c`) [s_q, min(k, s_kv)] ids with s_kv < k without topk_width_min_k_s_kv (SPEC §3.6).
/// Appended to the failing top-k report's reason and its dtype / shape violation ("...; hint:
/// ... declare it: pass --narrowed-topk-width"), never changing a verdict.
void add_convention_hints(std::vector<oracle::OpReport>& reports, const oracle::CandidateBackend& candidate,
                          const oracle::OpCase* c = nullptr, HintRoute route = HintRoute::CompareFlags);

/// A fixture's inputs checked once, before any candidate runs (fresh-user F16): the float64
/// reference judges each of `ops` on `c` (check_op of the reference backend, no determinism run;
/// its results stay in c.memo for the candidates judged next), and an input it rejects
/// (dsa::reference's std::invalid_argument, or any error it throws) becomes one
/// fixtures::FileError "<file>: <op> inputs: argument '...' got ..., expected ..." (exit 2), the
/// error compare gives: never a DISAGREE of the reference backend, nor one error per backend.
/// Each op is checked once per case (c.memo). Errors: FileError as above; oracle::ResourceError
/// (out of memory) as judge_fixture_ops throws it.
void check_fixture_inputs(const fixtures::Fixture& f, const oracle::OpCase& c, const std::vector<oracle::Op>& ops);

/// True when `reports` is non-empty and every op was skipped (e.g. --outputs naming none of
/// the op's outputs, a backend that runs none of the file's ops): nothing was judged.
bool judged_nothing(const std::vector<oracle::OpReport>& reports);

/// Exit code of one candidate's op reports (compare, replay, their JSON): kExitOk when
/// overall_verdict is Pass; kExitUsage when judged_nothing (as `audit` and `fixtures check`
/// treat a run that judged nothing); kExitDisagree otherwise (a failure, INCOMPLETE, WEAK
/// without --allow-weak).
int exit_code(const std::vector<oracle::OpReport>& reports);

/// {"verdict": line, "ops": [{"op", "backend", "verdict", "reason", "notes", "outputs":
/// [{"name", "dtype", "passed", "max_abs", "bound", "baseline_err", "floor", "ratio",
/// "message"}], "topk_violations": n}]}.
nlohmann::json reports_json(const std::vector<oracle::OpReport>& reports);

/// Says which tensors of the candidate file at `candidate` this comparison will not judge, one
/// `note:` line each on stdout: `ignored` (names that are no output, from load_candidate_file),
/// outputs of an op golden `f` does not define (dkv beside a forward-only golden), dsink without
/// the golden's attn_sink, and outputs that --outputs (opt.provided_outputs) leaves out. Silence
/// there read as "judged" (fresh-user report, session 4). compare and replay --candidate alike.
/// Throws nothing.
void print_candidate_file_notes(const fixtures::Fixture& f, const oracle::CandidateBackend& backend,
                                const std::vector<std::string>& ignored, const oracle::CheckOptions& opt,
                                const std::string& candidate);

}  // namespace dsa::cli

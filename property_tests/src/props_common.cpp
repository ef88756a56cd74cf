#include "props_common.h"

#include <algorithm>
#include <filesystem>

#include "dsa/oracle/fixture_check.h"

namespace dsa::props {
namespace {
thread_local std::string g_dump_target;
thread_local std::vector<oracle::Op> g_selected_ops;  // empty: every op
thread_local std::string g_failing_op;

Tensor windows_tensor(const KeyWindows& w, bool start) {
  std::vector<int32_t> v;
  for (int64_t t = 0; t < w.s_q(); ++t) v.push_back(static_cast<int32_t>(start ? w.ks[t] : w.ke[t]));
  return Tensor::from_i32({w.s_q()}, v);
}

fixtures::Fixture base(const std::string& op, const std::string& desc) {
  fixtures::Fixture f;
  f.case_name = g_dump_target.empty()
                    ? std::string("property_case")
                    : std::filesystem::path(g_dump_target).stem().string();
  f.op = op;
  f.producer = "dsa-verify property suite (failing case dump)";
  f.notes = desc;
  return f;
}
}  // namespace

void set_dump_target(const std::string& path) { g_dump_target = path; }
void set_selected_ops(const std::vector<oracle::Op>& ops) { g_selected_ops = ops; }
bool judges(const oracle::Backend& b, oracle::Op op) {
  if (!b.supports(op)) return false;
  return g_selected_ops.empty() ||
         std::find(g_selected_ops.begin(), g_selected_ops.end(), op) != g_selected_ops.end();
}
void note_failing_op(const std::string& op) { g_failing_op = op; }
void reset_failing_op() { g_failing_op.clear(); }
const std::string& failing_op() { return g_failing_op; }
namespace {
thread_local std::string g_judged_nothing;
}  // namespace
void note_judged_nothing(const std::string& why) { g_judged_nothing = why; }
std::string take_judged_nothing() {
  std::string why;
  why.swap(g_judged_nothing);
  return why;
}
namespace {
thread_local std::vector<std::string> g_declined_for;
}  // namespace
void note_declined_for(const std::string& feature) { g_declined_for.push_back(feature); }
std::vector<std::string> take_declined_for() {
  std::vector<std::string> out;
  out.swap(g_declined_for);
  return out;
}
const std::string& dump_target() { return g_dump_target; }

namespace {
thread_local std::vector<std::string> g_unsupported;
}  // namespace
void set_unsupported_names(const std::vector<std::string>& names) { g_unsupported = names; }

void fail_if_declined_by_value(oracle::Backend& b, oracle::Op op, const oracle::OpCase& c, const std::string& why) {
  if (oracle::declared_limitation(why)) return;
  const oracle::DeclineCause cause = oracle::decline_cause(b, op, c, g_unsupported);
  if (cause.by_values) {
    note_failing_op(oracle::to_string(op));
    RC_FAIL("INCOMPLETE: backend declined this " + std::string(oracle::to_string(op)) +
            " draw but ran the same draw with " + cause.twin +
            ": the decline depends on the values, not on a limit of the kernel: " + why);
  }
  for (const auto& k : cause.depends_on) note_declined_for(k);
  for (const auto& k : cause.waived) note_declined_for(k);
}

void twin_test_if_declined(oracle::Backend& b, oracle::Op op, const oracle::OpCase& oc, const oracle::OpReport& r) {
  if (r.verdict == oracle::Verdict::Skip && r.declined) fail_if_declined_by_value(b, op, oc, r.reason);
}

namespace {
thread_local std::optional<fixtures::Fixture> g_pending_dump;
}  // namespace

DumpOnFailure::~DumpOnFailure() {
  if (g_dump_target.empty() || std::uncaught_exceptions() <= uncaught_) return;
  try {
    // Not written yet: whether the exception is a failure, a discard or a decline is known only
    // where run_property catches it.
    g_pending_dump = build_();
  } catch (...) {
    // A failed dump must not mask the property failure being reported.
  }
}

void clear_pending_dump() { g_pending_dump.reset(); }

bool save_pending_dump() {
  std::optional<fixtures::Fixture> f;
  f.swap(g_pending_dump);
  if (!f || g_dump_target.empty()) return false;
  try {
    std::filesystem::create_directories(std::filesystem::path(g_dump_target).parent_path());
    fixtures::save_fixture(g_dump_target, *f);
    return true;
  } catch (...) {
    return false;  // a failed dump must not mask the property failure being reported
  }
}

fixtures::Fixture to_fixture(const TopkCase& c) {
  auto f = base("topk", c.desc);
  f.inputs["scores"] = c.scores;
  if (c.windows) {
    f.inputs["ks"] = windows_tensor(*c.windows, true);
    f.inputs["ke"] = windows_tensor(*c.windows, false);
  }
  f.params = {{"k", c.k}, {"tie_break", to_string(c.policy.tie_break)}, {"sorted", c.policy.sorted}};
  return f;
}

fixtures::Fixture to_fixture(const IndexerCase& c, bool backward) {
  auto f = base(backward ? "indexer_scores+bwd" : "indexer_scores", c.desc);
  f.inputs["q_idx"] = c.q_idx;
  f.inputs["k_idx"] = c.k_idx;
  f.inputs["w"] = c.w;
  f.inputs["ks"] = windows_tensor(c.windows, true);
  f.inputs["ke"] = windows_tensor(c.windows, false);
  if (backward) f.inputs["d_scores"] = c.d_scores;
  return f;
}

fixtures::Fixture to_fixture(const SmlaCase& c, bool backward) {
  auto f = base(backward ? "sparse_mla_fwd+bwd" : "sparse_mla_fwd", c.desc);
  f.inputs["q"] = c.in.q;
  f.inputs["kv"] = c.in.kv;
  f.inputs["indices"] = c.in.indices;
  if (c.in.topk_length) f.inputs["topk_length"] = *c.in.topk_length;
  if (c.in.attn_sink) f.inputs["attn_sink"] = *c.in.attn_sink;
  if (backward) f.inputs["dout"] = c.dout;
  f.params = {{"sm_scale", c.in.sm_scale}, {"d_v", c.in.d_v}};
  return f;
}

fixtures::Fixture to_fixture(const KlCase& c) {
  auto f = base("indexer_kl_loss", c.desc);
  f.inputs["scores"] = c.in.scores;
  f.inputs["q"] = c.in.q;
  f.inputs["kv"] = c.in.kv;
  f.inputs["ks"] = windows_tensor(c.in.windows, true);
  f.inputs["ke"] = windows_tensor(c.in.windows, false);
  if (c.in.indices) f.inputs["indices"] = *c.in.indices;
  f.params = {{"sm_scale", c.in.sm_scale}, {"mode", to_string(c.in.mode)}, {"coeff", c.in.coeff}};
  return f;
}

fixtures::Fixture to_fixture(const BlockCase& c) {
  auto f = base("indexer_scores", "dsa block case (indexer inputs; attention inputs q, kv, dout, attn_sink when drawn)");
  f.inputs["q_idx"] = c.in.q_idx;
  f.inputs["k_idx"] = c.in.k_idx;
  f.inputs["w"] = c.in.w;
  f.inputs["ks"] = windows_tensor(c.in.windows, true);
  f.inputs["ke"] = windows_tensor(c.in.windows, false);
  f.inputs["q"] = c.in.q;
  f.inputs["kv"] = c.in.kv;
  f.inputs["dout"] = c.dout;
  if (c.in.attn_sink) f.inputs["attn_sink"] = *c.in.attn_sink;
  // The block's own scalars are no params of op indexer_scores (a closed list, fixture.h): kept
  // as a metadata key of their own, so the dumped case still loads and replays.
  f.extra_metadata["block_params"] =
      nlohmann::json{{"k", c.in.k}, {"sm_scale", c.in.sm_scale}, {"d_v", c.in.d_v}}.dump();
  return f;
}

}  // namespace dsa::props

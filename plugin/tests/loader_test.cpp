// The loader on bad libraries and misbehaving plugins (issue 6 "Bad input"): each becomes a
// clear PluginLoadError or a finding (ContractViolation, PluginCallError, IsolatedFailure),
// never a crash of the test process.
#include "dsa/plugin/plugin_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>

namespace dsa::plugin {
namespace {

using namespace std::chrono_literals;
using dsa::oracle::NotSupported;
using dsa::oracle::Op;

// What() of the exception `fn` throws as E; fails the test when it throws nothing or another type.
template <class E, class F>
std::string message_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A small top-k call every bad plugin implements (badly).
Tensor call_topk(PluginBackend& b) {
  Tensor scores = Tensor(DType::F64, {3, 5}).to(DType::F32);
  for (int64_t i = 0; i < scores.numel(); ++i) scores.set(i, static_cast<double>(i % 4));
  return b.select_topk(scores, 2, TopkPolicy{TieBreak::Small, true}, std::nullopt);
}

PluginOptions quick() {
  PluginOptions o;
  o.timeout = 5s;
  return o;
}

// ---- load-time errors -----------------------------------------------------------------

TEST(LoadPlugin, MissingFileNamesThePath) {
  std::string m = message_of<PluginLoadError>([] { load_plugin("/nonexistent/libnope.so"); });
  EXPECT_TRUE(has(m, "/nonexistent/libnope.so")) << m;
  EXPECT_TRUE(has(m, "no such file")) << m;
}

TEST(LoadPlugin, NotASharedLibrary) {
  std::string m = message_of<PluginLoadError>([] { load_plugin(DSA_NOT_A_LIBRARY); });
  EXPECT_TRUE(has(m, "cannot load it as a shared library")) << m;
  EXPECT_TRUE(has(m, "bad_plugin.c")) << m;
}

TEST(LoadPlugin, LibraryWithoutEntrySymbolIsNotAPlugin) {
  std::string m = message_of<PluginLoadError>([] { load_plugin(DSA_BAD_PLUGIN_NO_ENTRY); });
  EXPECT_TRUE(has(m, "not a dsa plugin")) << m;
  EXPECT_TRUE(has(m, "dsa_backend_get_v1")) << m;
}

TEST(LoadPlugin, WrongAbiVersion) {
  std::string m = message_of<PluginLoadError>([] { load_plugin(DSA_BAD_PLUGIN_WRONG_ABI); });
  EXPECT_TRUE(has(m, "wrong ABI version 99")) << m;
  EXPECT_TRUE(has(m, "version 1")) << m;
}

TEST(LoadPlugin, InconsistentCapabilitiesListEveryProblem) {
  std::string m = message_of<PluginLoadError>([] { load_plugin(DSA_BAD_PLUGIN_BAD_CAPS); });
  EXPECT_TRUE(has(m, "declares sparse_mla_fwd but its function is NULL")) << m;
  EXPECT_TRUE(has(m, "caps.outputs.mla_stats")) << m;
}

TEST(LoadPlugin, LoadErrorsAreInvalidArgument) {  // the CLI maps them to exit code 2
  EXPECT_THROW(load_plugin(DSA_BAD_PLUGIN_WRONG_ABI), std::invalid_argument);
}

TEST(LoadPlugin, NonIsolatedLoadGivesTheSameErrors) {
  PluginOptions o;
  o.isolate = false;
  EXPECT_THROW(load_plugin(DSA_BAD_PLUGIN_NO_ENTRY, o), PluginLoadError);
  EXPECT_THROW(load_plugin(DSA_BAD_PLUGIN_WRONG_ABI, o), PluginLoadError);
}

// ---- per-call findings ----------------------------------------------------------------

TEST(PluginCall, SegfaultIsAFindingNotACrash) {
  auto b = open_plugin(DSA_BAD_PLUGIN_SEGFAULT, quick());
  std::string m = message_of<IsolatedFailure>([&] { call_topk(*b); });
  EXPECT_TRUE(has(m, "SEGV")) << m;  // "SIGSEGV", or ASan's "SEGV" report under ASan
  EXPECT_TRUE(has(m, "topk_indices")) << m;
  EXPECT_TRUE(has(m, "plugin 'bad'")) << m;
}

TEST(PluginCall, AbortIsAFinding) {
  auto b = open_plugin(DSA_BAD_PLUGIN_ABORT, quick());
  std::string m = message_of<IsolatedFailure>([&] { call_topk(*b); });
  EXPECT_TRUE(has(m, "SIGABRT")) << m;
}

TEST(PluginCall, HangIsKilledAfterTheTimeout) {
  PluginOptions o;
  o.timeout = 300ms;
  auto b = open_plugin(DSA_BAD_PLUGIN_HANG, o);
  std::string m = message_of<IsolatedFailure>([&] { call_topk(*b); });
  EXPECT_TRUE(has(m, "timed out after 300 ms")) << m;
  // The auditor goes on with another plugin.
  auto ex = open_plugin(DSA_EXAMPLE_PLUGIN, quick());
  EXPECT_EQ(call_topk(*ex).shape(), (std::vector<int64_t>{3, 2}));
}

TEST(PluginCall, OutOfBoundsWriteIsCaughtByTheGuardZone) {
  for (bool isolate : {true, false}) {
    PluginOptions o = quick();
    o.isolate = isolate;
    auto b = open_plugin(DSA_BAD_PLUGIN_OVERRUN, o);
    std::string m = message_of<ContractViolation>([&] { call_topk(*b); });
    EXPECT_TRUE(has(m, "output 'indices': out-of-bounds write past the end")) << m;
    EXPECT_TRUE(has(m, "64 guard bytes changed")) << m;
  }
}

TEST(PluginCall, WriteBeforeTheStartIsCaughtByTheFrontGuard) {
  auto b = open_plugin(DSA_BAD_PLUGIN_UNDERRUN, quick());
  std::string m = message_of<ContractViolation>([&] { call_topk(*b); });
  EXPECT_TRUE(has(m, "output 'indices': out-of-bounds write before the start of the buffer "
                     "(4 guard bytes changed, up to 8 bytes before it)"))
      << m;
}

TEST(PluginCall, OverrunIsReportedEvenWhenTheCallFails) {
  auto b = open_plugin(DSA_BAD_PLUGIN_OVERRUN_THEN_ERROR, quick());
  std::string m = message_of<ContractViolation>([&] { call_topk(*b); });
  EXPECT_TRUE(has(m, "returned DSA_STATUS_INTERNAL_ERROR")) << m;
  EXPECT_TRUE(has(m, "4 guard bytes changed, the first at end+12")) << m;
}

TEST(PluginCall, ErrorStatusCarriesThePluginMessage) {
  auto b = open_plugin(DSA_BAD_PLUGIN_ERROR_STATUS, quick());
  try {
    call_topk(*b);
    FAIL() << "no throw";
  } catch (const PluginCallError& e) {
    EXPECT_EQ(e.status(), DSA_STATUS_INTERNAL_ERROR);
    EXPECT_TRUE(has(e.what(), "DSA_STATUS_INTERNAL_ERROR")) << e.what();
    EXPECT_TRUE(has(e.what(), "simulated device failure: out of memory")) << e.what();
  }
}

// Backward compatibility of ABI 1.1: a table built against an older header (ending before
// the §10 fields) still loads and works; the §10 ops are simply not supported.
TEST(PluginLoad, AnOlderTableLacksTheSection10Ops) {
  auto b = open_plugin(DSA_BAD_PLUGIN_OLD_HEADER, quick());
  EXPECT_TRUE(b->supports(Op::Topk));
  EXPECT_FALSE(b->supports(Op::Fp8IndexerScores));
  EXPECT_FALSE(b->supports(Op::PagedIndexerScores));
  EXPECT_FALSE(b->supports(Op::SparseMlaFp8Fwd));
  EXPECT_FALSE(b->fp8_reduced_accumulation());
  EXPECT_EQ(b->info().fp8_caps, 0u);
  EXPECT_EQ(b->info().rounding_models, 0u);
  const Tensor ids = call_topk(*b);
  EXPECT_EQ(ids.dtype(), DType::I32);
}

// Backward compatibility of ABI 1.2: a table built against the 1.1 header ends before
// rounding_models. The bytes past its struct_size hold all bits set here; the loader never reads
// them (it would reject unknown bits, and a model without a sparse MLA op), so the plugin loads,
// keeps its ABI 1.1 fields and declares no rounding model.
TEST(PluginLoad, AnAbi11TableDeclaresNoRoundingModel) {
  auto b = open_plugin(DSA_BAD_PLUGIN_ABI_1_1_HEADER, quick());
  EXPECT_EQ(b->info().rounding_models, 0u);
  EXPECT_FALSE(b->rounding_model().sink_after_rounding);
  EXPECT_FALSE(b->rounding_model().normalized_p);
  EXPECT_EQ(describe(b->info()).find("rounding"), std::string::npos) << describe(b->info());
  EXPECT_TRUE(b->supports(Op::Topk));
  EXPECT_EQ(call_topk(*b).dtype(), DType::I32);
}

// rounding_models with an unknown bit, or a model on a plugin without a sparse MLA op: a load
// error listing both, never a model silently applied or dropped.
TEST(PluginLoad, RoundingModelsAreValidated) {
  const std::string m = message_of<PluginLoadError>([] { open_plugin(DSA_BAD_PLUGIN_BAD_ROUNDING, quick()); });
  EXPECT_TRUE(has(m, "rounding_models has unknown bits")) << m;
  EXPECT_TRUE(has(m, "rounding_models declares a rounding model but caps.ops declares no sparse MLA op"))
      << m;
}

TEST(PluginCall, UnsupportedStatusIsASkip) {
  auto b = open_plugin(DSA_BAD_PLUGIN_UNSUPPORTED, quick());
  std::string m = message_of<NotSupported>([&] { call_topk(*b); });
  EXPECT_TRUE(has(m, "k > 2048 not implemented")) << m;
}

TEST(PluginCall, ChangedOutputDtypeContradictsTheCapabilities) {
  auto b = open_plugin(DSA_BAD_PLUGIN_WRONG_DTYPE, quick());
  std::string m = message_of<ContractViolation>([&] { call_topk(*b); });
  EXPECT_TRUE(has(m, "output 'indices': dtype changed from int32 to int64")) << m;
  EXPECT_TRUE(has(m, "past the end")) << m;  // int64 ids need twice the bytes
}

TEST(PluginCall, NonContiguousOutputIsAFinding) {
  auto b = open_plugin(DSA_BAD_PLUGIN_NON_CONTIGUOUS, quick());
  std::string m = message_of<ContractViolation>([&] { call_topk(*b); });
  EXPECT_TRUE(has(m, "non-contiguous")) << m;
}

TEST(PluginCall, UnwrittenOutputIsAFinding) {
  auto b = open_plugin(DSA_BAD_PLUGIN_UNWRITTEN, quick());
  std::string m = message_of<ContractViolation>([&] { call_topk(*b); });
  EXPECT_TRUE(has(m, "6 of 6 elements never written")) << m;
}

TEST(PluginCall, ModifiedInputIsAFinding) {
  auto b = open_plugin(DSA_BAD_PLUGIN_MODIFIES_INPUT, quick());
  std::string m = message_of<ContractViolation>([&] { call_topk(*b); });
  EXPECT_TRUE(has(m, "input 'scores': modified by the plugin")) << m;
}

// ---- declared capabilities ------------------------------------------------------------

TEST(PluginCapabilities, DeclaredOpsPoliciesAndDtypesGateTheCalls) {
  auto b = open_plugin(DSA_EXAMPLE_PLUGIN, quick());
  EXPECT_EQ(b->name(), "plugin:example");
  EXPECT_EQ(b->info().version, "1.0");
  EXPECT_TRUE(b->deterministic());
  EXPECT_EQ(b->unavailable_reason(), "");
  const std::string d = describe(b->info());
  EXPECT_TRUE(has(d, "plugin 'example' 1.0 (ABI 1, ")) << d;
  EXPECT_TRUE(has(d, "ops indexer_scores,topk,sparse_mla_fwd; inputs F32|BF16; devices cpu; "
                     "tie any|small|large;"))
      << d;
  EXPECT_TRUE(has(d, "outputs index_scores=F32 mla_out=as-input mla_stats=F32")) << d;
  EXPECT_TRUE(b->supports(Op::Topk));
  EXPECT_TRUE(b->supports(Op::SparseMlaFwd));
  EXPECT_FALSE(b->supports(Op::SparseMlaBwd));
  Tensor q(DType::F32, {1, 1, 4}), k(DType::F32, {2, 4}), w(DType::F32, {1, 1});
  EXPECT_THROW(b->indexer_scores_backward(q, k, w, KeyWindows::full(1, 2), Tensor(DType::F32, {1, 2})),
               NotSupported);
  // F64 scores are not declared by the example (F32 and BF16 data inputs only).
  EXPECT_THROW(b->select_topk(Tensor(DType::F64, {2, 3}), 1, TopkPolicy{}, std::nullopt),
               NotSupported);
}

TEST(PluginCapabilities, UndeclaredTiePolicyIsSkipped) {
  auto b = open_plugin(DSA_BAD_PLUGIN_OVERRUN, quick());  // declares small + sorted only
  Tensor s(DType::F32, {2, 3});
  EXPECT_THROW(b->select_topk(s, 1, TopkPolicy{TieBreak::Large, true}, std::nullopt),
               NotSupported);
}

TEST(PluginRegistry, RegisteredPluginIsABackendByName) {
  const std::string name = register_plugin(DSA_EXAMPLE_PLUGIN, quick());
  EXPECT_EQ(name, "plugin:example");
  auto names = dsa::oracle::backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), name), names.end());
  auto b = dsa::oracle::make_backend(name);
  EXPECT_EQ(call_topk(static_cast<PluginBackend&>(*b)).shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_TRUE(static_cast<PluginBackend&>(*b).options().isolate);
  EXPECT_THROW(register_plugin(DSA_BAD_PLUGIN_WRONG_ABI), PluginLoadError);
}

TEST(PluginCapabilities, BadShapesAreInvalidArgumentBeforeAnyCall) {
  auto b = open_plugin(DSA_EXAMPLE_PLUGIN, quick());
  std::string m = message_of<std::invalid_argument>([&] {
    b->select_topk(Tensor(DType::F32, {2, 3, 4}), 1, TopkPolicy{}, std::nullopt);
  });
  EXPECT_TRUE(has(m, "topk_indices")) << m;
  EXPECT_THROW(b->select_topk(Tensor(DType::F32, {2, 3}), -1, TopkPolicy{}, std::nullopt),
               std::invalid_argument);
  SparseMlaInputs in;
  in.q = Tensor(DType::F32, {2, 1, 8});
  in.kv = Tensor(DType::F32, {4, 8});
  in.indices = Tensor(DType::I32, {2, 3});
  in.d_v = 9;  // > d_qk
  EXPECT_THROW(b->sparse_mla_forward(in), std::invalid_argument);
}

}  // namespace
}  // namespace dsa::plugin

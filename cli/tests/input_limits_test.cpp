// Input validation a fresh user found missing (session 7): windows given half, sizes that only
// an allocation would reject, params the FP8 sparse MLA tensors contradict, mixed q/kv dtypes,
// empty list items, conventions of no selected op, entries `fixtures check DIR` skipped, and out
// of memory reported as a DISAGREE. Bad input is exit 2 naming the argument and the expected
// value on every route; out of memory is no verdict. Files are written here (fixtures writer)
// from the shipped golden fixtures. Label golden; about 20 s in all on a loaded 2-core machine
// (each CLI run about 0.7 s).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <string>

#include "audit_tasks.h"
#include "dsa/contract/errors.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/fixture_check.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::Scratch;
using test::golden;
using test::lines_with;
using test::expect_cli;
using test::run_cli_capture;

// `golden` with input `drop` removed, saved to `path`.
void save_without(const std::string& name, const std::string& drop, const std::string& path) {
  fixtures::Fixture f = fixtures::load_fixture(golden(name));
  ASSERT_EQ(f.inputs.erase(drop), 1u) << name << " has no " << drop;
  fixtures::save_fixture(path, f);
}

// One of ks/ke alone used to drop both windows silently: a kernel ignoring the windows agreed.
// Now every route that loads a fixture stops with exit 2 naming the one found.
TEST(InputLimits, KsOrKeAloneIsAnErrorOnEveryRoute) {
  Scratch dir("ks_ke");
  struct Case {
    const char* golden;
    const char* drop;
    const char* found;
  };
  for (const Case& c : {Case{"idx_varlen", "ks", "ke"}, Case{"topk_window_garbage", "ke", "ks"}}) {
    const std::string path = dir.file(std::string(c.golden) + "_no_" + c.drop + ".safetensors");
    save_without(c.golden, c.drop, path);
    const std::string want = std::string("ks and ke must both be given (found ") + c.found + " only";
    // the golden's own expected outputs as the candidate: agreed before (full windows twice)
    expect_cli("compare --golden " + path + " --candidate " + golden(c.golden), 2, {want});
    expect_cli("fixtures check " + path + " --backend reference", 2, {want});
    expect_cli("replay " + path + " --candidate " + golden(c.golden), 2, {want});
  }
}

// A legal but absurd top-k k (2^30 for 8 keys) made every route allocate [s_q, k] of -1
// padding (8.5 GB, then std::bad_alloc as a DISAGREE): now exit 2 naming k, s_q and s_kv
// before anything is allocated. A k above s_kv within the limit is still judged.
TEST(InputLimits, TopkPaddingPastTheKeysIsLimited) {
  Scratch dir("bigk");
  fixtures::Fixture f;
  f.case_name = "bigk";
  f.op = "topk";
  Tensor sc(DType::F32, {1, 8});
  for (int s = 0; s < 8; ++s) sc.set(s, s);  // distinct: the top 8 are 7, 6, ..., 0
  f.inputs["scores"] = sc;
  f.params = {{"k", int64_t{1} << 30}, {"tie_break", "small"}, {"sorted", true}};
  const std::string gold = dir.file("bigk.safetensors"), cand = dir.file("cand.safetensors");
  fixtures::save_fixture(gold, f);
  test::write_outputs(cand, {{"indices", Tensor::from_i32({1, 8}, {7, 6, 5, 4, 3, 2, 1, 0})}});
  std::string out = expect_cli("compare --golden " + gold + " --candidate " + cand + " --narrowed-topk-width", 2,
                               {"params.k got 1073741824, expected at most", "s_q = 1, s_kv = 8"});
  EXPECT_TRUE(lines_with(out, {"bad_alloc"}).empty()) << out;
  f.params["k"] = 12;  // k > s_kv, small: judged (the narrowed ids padded with -1)
  fixtures::save_fixture(gold, f);
  EXPECT_EQ(run_cli_capture("compare --golden " + gold + " --candidate " + cand + " --narrowed-topk-width", &out), 0);
}

// A tensor of 0 elements may still claim 2^40 rows (k_idx [2^40, 0], d_I = 0): the scores
// output [s_q, s_kv] was allocated from it (std::bad_alloc as "reference DISAGREE"). Now exit 2
// naming k_idx; below 2^31 rows the output limit names it.
TEST(InputLimits, ZeroSizedTensorWithHugeDimensionIsNamed) {
  Scratch dir("hugeidx");
  for (int64_t rows : {int64_t{1} << 40, int64_t{2147483647}}) {
    fixtures::Fixture f;
    f.case_name = "hugeidx";
    f.op = "indexer_scores";
    f.inputs["q_idx"] = Tensor(DType::BF16, {1, 1, 0});
    f.inputs["k_idx"] = Tensor(DType::BF16, {rows, 0});
    f.inputs["w"] = Tensor(DType::F32, {1, 1});
    const std::string path = dir.file("hugeidx.safetensors");
    fixtures::save_fixture(path, f);
    const std::string out = expect_cli("fixtures check " + path + " --backend reference", 2,
                                       {"k_idx", std::to_string(rows), "holds no data"});
    EXPECT_TRUE(lines_with(out, {"bad_alloc"}).empty()) << out;
    EXPECT_TRUE(lines_with(out, {"DISAGREE"}).empty()) << out;
  }
}

// max_context is -1 (derived: the largest context) or a width >= 0 within the size limit;
// -2 was read as -1, 2^31 - 1 ended in an unnamed std::bad_alloc.
TEST(InputLimits, PagedMaxContextIsChecked) {
  Scratch dir("maxctx");
  fixtures::Fixture f = fixtures::load_fixture(golden("paged_idx_mtp2"));
  const std::string path = dir.file("paged.safetensors");
  for (int64_t bad : {int64_t{-2}, int64_t{2147483647}}) {
    f.params["max_context"] = bad;
    fixtures::save_fixture(path, f);
    expect_cli("fixtures check " + path + " --backend reference", 2,
               {"params.max_context got " + std::to_string(bad), "expected -1"});
    expect_cli("compare --golden " + path + " --candidate " + golden("paged_idx_mtp2"), 2,
               {"params.max_context got " + std::to_string(bad)});
  }
}

// FP8 sparse MLA params that contradict the tensors (block_size 8 beside a kv_cache of
// blocks of 16; d_v 256 for the 512 NoPE values) agreed before; the paged indexer already
// rejected the same block_size. Now exit 2 naming the param and the value the tensors imply.
TEST(InputLimits, Fp8SparseMlaParamsMustMatchTheTensors) {
  Scratch dir("f8params");
  const fixtures::Fixture base = fixtures::load_fixture(golden("smla_fp8_decode"));
  const int64_t block_size = base.inputs.at("kv_cache").size(1);
  struct Case {
    const char* key;
    int64_t bad, good;
  };
  for (const Case& c : {Case{"block_size", block_size / 2, block_size}, Case{"d_v", 256, 512}, Case{"d_qk", 512, 576}}) {
    fixtures::Fixture f = base;
    const std::string path = dir.file(std::string(c.key) + ".safetensors");
    f.params[c.key] = c.good;  // agreeing: loads and builds its case
    fixtures::save_fixture(path, f);
    EXPECT_NO_THROW(oracle::op_case_from_fixture(fixtures::load_fixture(path))) << c.key;
    f.params[c.key] = c.bad;
    fixtures::save_fixture(path, f);
    expect_cli("compare --golden " + path + " --candidate " + golden("smla_fp8_decode"), 2,
               {"params." + std::string(c.key) + " = " + std::to_string(c.bad), std::to_string(c.good)});
  }
}

// Params a fresh user found accepted silently (session 8, FINDINGS item 6): params.s_kv = 65
// beside an FP8 cache of 4 x 16 = 64 token rows, an fp8_dtypes entry for the bf16 q, a key of no
// op. Each file compared with its own expected outputs said AGREES (exit 0). Now every route that
// loads a fixture (compare, fixtures check, replay of a backend and of a candidate file) stops
// with exit 2 naming the file, the field and the expected value; the same for the non-FP8 ops'
// params (a key of no op on top-k, a misspelt KL mode). About 10 s (14 CLI runs).
TEST(InputLimits, ParamsOutsideTheOpsListOrContradictingTheTensorsAreErrorsOnEveryRoute) {
  Scratch dir("params_closed");
  struct Case {
    const char* golden;
    const char* key;
    nlohmann::json value;
    std::vector<std::string> words;  // what the error line must say, after "<file>: "
    bool every_route;
  };
  const fixtures::Fixture mla = fixtures::load_fixture(golden("smla_fp8_decode"));
  nlohmann::json with_q = mla.params.at("fp8_dtypes");
  with_q["q"] = "e4m3fn";
  const std::vector<Case> cases = {
      {"smla_fp8_decode", "s_kv", 65, {"params.s_kv = 65 contradicts tensor 'kv_cache'", "expected 64"}, true},
      {"smla_fp8_decode", "fp8_dtypes", with_q,
       {"params.fp8_dtypes.q names no FP8 tensor of op sparse_mla_fp8_fwd", "expected only kv_cache"}, true},
      {"smla_fp8_decode", "foo", 1,
       {"params.foo is not a parameter of op sparse_mla_fp8_fwd", "expected only fp8_dtypes, sm_scale, block_size"}, true},
      {"topk_mtp", "foo", 1, {"params.foo is not a parameter of op topk", "expected only k, tie_break, sorted"}, false},
      {"kl_dense_causal", "mode", "Dense", {"params.mode got \"Dense\", expected \"dense\" or \"sparse\""}, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.golden) + " params." + c.key);
    fixtures::Fixture f = fixtures::load_fixture(golden(c.golden));
    f.params[c.key] = c.value;
    const std::string path = dir.file(std::string(c.golden) + "_" + c.key + ".safetensors");
    fixtures::save_fixture(path, f);
    std::vector<std::string> words = c.words;
    words[0] = path + ": " + words[0];
    std::vector<std::string> routes = {"compare --golden " + path + " --candidate " + golden(c.golden)};
    if (c.every_route) {
      routes.push_back("fixtures check " + path + " --backend reference");
      routes.push_back("replay " + path + " --backend reference");
      routes.push_back("replay " + path + " --candidate " + golden(c.golden));
    }
    for (const std::string& cmd : routes) {
      std::string out;
      EXPECT_EQ(run_cli_capture(cmd, &out), 2) << cmd << "\n" << out;
      EXPECT_FALSE(lines_with(out, words).empty()) << cmd << "\n" << out;
      EXPECT_TRUE(lines_with(out, {"AGREE"}).empty()) << cmd << "\n" << out;
    }
  }
  // The control: the intact golden agrees with its own outputs on the same route.
  std::string out;
  EXPECT_EQ(run_cli_capture("compare --golden " + golden("smla_fp8_decode") + " --candidate " + golden("smla_fp8_decode"), &out), 0)
      << out;
}

// q F16 beside kv BF16: the plugin ABI says kv has q's dtype (SPEC §4: one activation dtype).
TEST(InputLimits, SparseMlaQAndKvShareOneDtype) {
  Scratch dir("qkv");
  fixtures::Fixture f = fixtures::load_fixture(golden("smla_basic"));
  const Tensor& q = f.inputs.at("q");
  Tensor q16(DType::F16, q.shape());
  for (int64_t i = 0; i < q.numel(); ++i) q16.set(i, q.get(i));  // grid values: exact in F16
  f.inputs["q"] = q16;
  const std::string path = dir.file("q_f16.safetensors");
  fixtures::save_fixture(path, f);
  expect_cli("compare --golden " + path + " --candidate " + golden("smla_basic"), 2,
             {"tensor 'kv' has dtype BF16, expected F16"});
}

// Empty list items were dropped by the option parser; a convention of no selected op was
// accepted without a word. Both are usage errors naming the option, as --outputs already was
// for an output of no selected op.
TEST(InputLimits, ListOptionsAndConventionsAreChecked) {
  const std::string g = golden("smla_basic");
  expect_cli("compare --golden " + g + " --candidate " + g + " --outputs out,,lse", 2,
             {"argument '--outputs' got \"out,,lse\": an empty item"});
  expect_cli("compare --golden " + g + " --candidate " + g + " --convention lse_base2,", 2,
             {"argument '--convention' got \"lse_base2,\": an empty item"});
  expect_cli("compare --golden " + g + " --candidate " + g + " --convention int64_ids", 2,
             {"argument '--convention' names int64_ids", "topk only"});
  expect_cli("replay " + g + " --candidate " + g + " --convention int64_ids", 2,
             {"argument '--convention' names int64_ids"});
}

// `fixtures check DIR` judges the *.safetensors directly in DIR and now names what it did not
// judge (a subdirectory, an upper-case extension) instead of a silent "n agree".
TEST(InputLimits, FixturesCheckNamesWhatItSkips) {
  Scratch dir("fxdir");
  std::filesystem::copy_file(golden("topk_mtp"), dir.file("a.safetensors"));
  std::filesystem::create_directories(dir.file("sub"));
  std::filesystem::copy_file(golden("topk_mtp"), dir.file("sub/b.safetensors"));
  std::filesystem::copy_file(golden("topk_mtp"), dir.file("UPPER.SAFETENSORS"));
  Scratch json("fxdir_json");
  std::string out;
  EXPECT_EQ(run_cli_capture("fixtures check " + dir.file("") + " --backend reference --json " + json.file("r.json"), &out), 0);
  EXPECT_EQ(lines_with(out, {"not judged: sub/ (a subdirectory"}).size(), 1u) << out;
  EXPECT_EQ(lines_with(out, {"not judged: UPPER.SAFETENSORS (the extension is not lower-case"}).size(), 1u) << out;
  EXPECT_EQ(lines_with(out, {"2 entries of", "not judged"}).size(), 1u) << out;
  EXPECT_EQ(test::read_json(json.file("r.json")).at("not_judged").size(), 2u);
}

// JSON nested 100,000 deep in a file (in a header field, or in a metadata string: params,
// conventions of a golden or a candidate) crashed every route with SIGSEGV (a recursive
// dump/copy overflowed the stack; fresh19), and `fixtures check DIR` lost the good files'
// results. Now the parser stops at fixtures::kMaxJsonDepth: exit 2 naming the file and the
// limit, and the directory check keeps judging the other files.
TEST(InputLimits, DeeplyNestedJsonIsAFileErrorOnEveryRoute) {
  Scratch dir("deep_json");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string want = "nests arrays/objects more than 64 levels deep (the limit)";
  const std::string good = golden("topk_mtp");
  // a metadata string of the golden (conventions) and one of params
  for (const char* key : {"conventions", "params"}) {
    fixtures::SafetensorsFile file = fixtures::read_safetensors(good);
    file.metadata[key] = key == std::string("params") ? "{\"k\":" + deep + "}" : deep;
    const std::string path = dir.file(std::string("deep_") + key + ".safetensors");
    fixtures::write_safetensors(path, file);
    expect_cli("compare --golden " + path + " --candidate " + good, 2, {path, want});
    expect_cli("replay " + path + " --candidate " + good, 2, {path, want});
    expect_cli("fixtures check " + path + " --backend reference", 2, {path, want});
  }
  // a header field: data_offsets nested in the strict safetensors reader
  {
    std::ifstream in(good, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 8u);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
    std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
    // the first tensor's "data_offsets":[b,e] becomes "data_offsets":[[[...]]] (100,000 deep)
    const std::string field = "\"data_offsets\":";
    const size_t at = header.find(field);
    ASSERT_NE(at, std::string::npos);
    const size_t close = header.find(']', at);
    header = header.substr(0, at + field.size()) + deep + header.substr(close + 1);
    std::vector<uint8_t> out(8);
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(header.size() >> (8 * i));
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), bytes.begin() + 8 + static_cast<long>(n), bytes.end());
    const std::string path = dir.file("deep_offsets.safetensors");
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(out.data()),
                                                 static_cast<std::streamsize>(out.size()));
    expect_cli("compare --golden " + path + " --candidate " + good, 2, {path, want});
    expect_cli("compare --golden " + good + " --candidate " + path, 2, {path, want});
  }
  // the conventions of a candidate file
  {
    fixtures::SafetensorsFile cand;
    for (auto& [name, t] : fixtures::load_fixture(good).expected) cand.tensors.emplace(name, t);
    cand.metadata["conventions"] = deep;
    const std::string path = dir.file("deep_cand.safetensors");
    fixtures::write_safetensors(path, cand);
    expect_cli("compare --golden " + good + " --candidate " + path, 2, {path, want});
  }
  // one such file among good ones: the good ones are still judged and reported in the JSON
  Scratch fx("deep_json_dir");
  std::filesystem::copy_file(good, fx.file("a.safetensors"));
  std::filesystem::copy_file(dir.file("deep_params.safetensors"), fx.file("b.safetensors"));
  std::filesystem::copy_file(good, fx.file("c.safetensors"));
  Scratch json("deep_json_out");
  std::string out;
  EXPECT_EQ(run_cli_capture("fixtures check " + fx.file("") + " --backend reference --json " +
                                json.file("r.json"), &out), 2);
  EXPECT_FALSE(lines_with(out, {"b.safetensors", want}).empty()) << out;
  const nlohmann::json r = test::read_json(json.file("r.json"));
  EXPECT_NE(r.dump().find("a.safetensors"), std::string::npos) << r.dump();
  EXPECT_NE(r.dump().find("c.safetensors"), std::string::npos) << r.dump();
}

// A backend run that runs out of memory is no verdict: judge_fixture_ops throws ResourceError
// naming the op and the input shapes, keeping the reports of the ops judged before it (here the
// forward of a fwd+bwd case). Before, it was a Fail ("backend threw: std::bad_alloc").
class OutOfMemoryBackward : public oracle::CandidateBackend {
 public:
  using oracle::CandidateBackend::CandidateBackend;
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs&, const Tensor&) override { throw std::bad_alloc(); }
};

TEST(InputLimits, OutOfMemoryIsAnErrorThatKeepsEarlierResults) {
  const fixtures::Fixture f = fixtures::load_fixture(golden("smla_basic"));
  OutOfMemoryBackward b(f.expected, "oom", {}, "oom");
  try {
    oracle::judge_fixture_ops(f, b, oracle::CheckOptions{});
    ADD_FAILURE() << "no ResourceError";
  } catch (const oracle::ResourceError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("out of memory (std::bad_alloc) judging op sparse_mla_bwd of oom"), std::string::npos) << what;
    EXPECT_NE(what.find("q BF16 " + dsa::shape_str(f.inputs.at("q").shape())), std::string::npos) << what;
    ASSERT_EQ(e.partial.size(), 1u);
    EXPECT_EQ(e.partial[0].op, "sparse_mla_fwd");
    EXPECT_TRUE(e.partial[0].passed()) << e.partial[0].reason;
  }
}

// The audit's fixture task on the same backend: the forward's case is kept in the
// TaskResourceError (the audit prints it and exits 2), the backward is no failed verdict.
TEST(InputLimits, AuditFixtureTaskKeepsCasesJudgedBeforeOutOfMemory) {
  Scratch dir("oom_audit");
  std::filesystem::copy_file(golden("smla_basic"), dir.file("smla_basic.safetensors"));
  const fixtures::Fixture f = fixtures::load_fixture(golden("smla_basic"));
  OutOfMemoryBackward b(f.expected, "oom", {}, "oom");
  AuditOptions opts;
  std::vector<AuditTask> tasks;
  ReproCommands repro{"dsa-verify audit", [](const std::string& file) { return "dsa-verify replay " + file; }};
  add_fixture_tasks(tasks, dir.file(""), "golden", b, opts, repro);
  ASSERT_EQ(tasks.size(), 1u);
  try {
    tasks[0].run();
    ADD_FAILURE() << "no TaskResourceError";
  } catch (const TaskResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("judging op sparse_mla_bwd of oom"), std::string::npos) << e.what();
    ASSERT_EQ(e.results.size(), 1u);
    EXPECT_EQ(e.results[0].op, "sparse_mla_fwd");
    EXPECT_EQ(e.results[0].status, "pass") << e.results[0].message;
  }
}

}  // namespace
}  // namespace dsa::cli

// The property suite as gtest tests (label prop): every property × every registered backend
// (Highway-style: written once, instantiated per target), the mutation score and the
// multi-seed false-alarm run. DSA_TEST_LEVEL=0/1/2 scales case counts; DSA_SEED fixes the seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/property_tests/run_suites.h"
#include "dsa/property_tests/suite.h"
#include "prop_test_util.h"
#include "src/props_common.h"
#ifdef DSA_HAVE_BACKENDS
#include "dsa/backends/builtin.h"
#endif

namespace dsa::props {
namespace {

std::string g_argv0 = "dsa_prop_tests";

std::string gtest_name(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

uint64_t env_seed() {
  const char* v = std::getenv("DSA_SEED");
  return v ? std::strtoull(v, nullptr, 10) : 0;
}

class PropertyTest : public ::testing::Test {
 public:
  PropertyTest(std::string backend, const Property* p) : backend_(std::move(backend)), p_(p) {}
  void TestBody() override {
    SuiteOptions o;
    o.level = env_test_level();
    o.seed = env_seed();
    o.log = &std::cout;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    o.repro_command = g_argv0 + " --gtest_filter=" + info->test_suite_name() + "." + info->name();
    const PropertyResult r = run_property(backend_subject(backend_), *p_, o);
    if (r.verdict == oracle::Verdict::Skip) GTEST_SKIP() << backend_ << ": " << r.message;
    if (r.verdict == oracle::Verdict::Fail)
      ADD_FAILURE() << r.message << "\nrepro: " << r.repro
                    << (r.dumped.empty() ? "" : "\nfailing case: " + r.dumped);
    else
      std::cout << "  " << backend_ << " " << p_->name << ": " << r.cases << " cases passed\n";
  }

 private:
  std::string backend_;
  const Property* p_;
};

// Mutation score: every mutant must be caught (level 1 case counts, fixed seed).
TEST(Mutation, EveryMutantIsCaught) {
  SuiteOptions o;
  o.level = std::max(1, env_test_level());
  o.seed = env_seed() ? env_seed() : 1;
  const auto rows = run_mutation_analysis(o);
  std::cout << format_mutation_table(rows);
  for (const auto& r : rows) EXPECT_TRUE(r.caught) << r.mutant << " (" << r.fault << ") survived";
  // Two more seeds: a mutant must not survive by luck of the draw.
  for (uint64_t seed : {2u, 3u}) {
    o.seed = seed;
    int caught = 0;
    const auto again = run_mutation_analysis(o);
    for (const auto& r : again) {
      caught += r.caught;
      EXPECT_TRUE(r.caught) << r.mutant << " survived seed " << seed;
    }
    std::cout << "  seed " << seed << ": mutation score " << caught << "/" << again.size() << "\n";
  }
}

// Kill matrix at level 0: every mutant must be caught by a level-0 property on seed 1. The
// mutants are dealt round-robin into kKillMatrixShards tests (Mutation.KillMatrix_<i>of<n>,
// registered in main()) that ctest runs in parallel, each shard printing its mutants' rows.
// With DSA_TEST_LEVEL >= 1 each shard runs every property on every mutant (the full matrix:
// which properties catch what, printed); at level 0 (CI) a mutant's run stops at the first
// property that catches it. The assertion is the same either way: a mutant is caught iff one of
// its properties fails, the properties run in the same order on the same seed and each
// property's draws depend on the seed alone, so the rows' "caught" and "caught by (first)" are
// those of the full run (compared over all 63 mutants against the full run of the clean-clone
// CI of b94c29f, bench/results/2026-12-02-ci-time.md); the full matrix's later properties cost
// about 280 s of CPU per CI run.
constexpr int kKillMatrixShards = 8;

class KillMatrixShard : public ::testing::Test {
 public:
  explicit KillMatrixShard(int shard) : shard_(shard) {}
  void TestBody() override {
    SuiteOptions o;
    o.level = 0;
    o.seed = env_seed() ? env_seed() : 1;
    std::vector<Subject> mine;
    const auto all = mutant_subjects();
    for (size_t i = static_cast<size_t>(shard_); i < all.size(); i += kKillMatrixShards) mine.push_back(all[i]);
    const bool full_matrix = env_test_level() >= 1;
    const auto rows = run_mutation_analysis(o, full_matrix, mine);
    std::cout << format_mutation_table(rows);
    if (full_matrix) std::cout << format_kill_matrix(rows);
    else std::cout << "  (level 0: each mutant's run stops at its first failing property; DSA_TEST_LEVEL=1 prints the full kill matrix)\n";
    for (const auto& r : rows) EXPECT_TRUE(r.caught) << r.mutant;
  }

 private:
  int shard_;
};

// No false alarms: every correct backend passes the whole suite at level 1 over seeds 11, 22
// and 33. One test per seed, FalseAlarms.CorrectBackendsPassLevel1OverSeeds_seed<s> (registered
// in main(), where the backends are known), so that ctest runs the seeds in parallel. Within a
// seed every subject is judged on the same draws (run_suites): each draw's float64 reference,
// baseline and floors are computed once and shared by the subjects, not once per subject; each
// subject's verdicts, cases and messages are those run_suite gives it alone.
const uint64_t kFalseAlarmSeeds[] = {11u, 22u, 33u};

class FalseAlarmRun : public ::testing::Test {
 public:
  FalseAlarmRun(std::vector<Subject> subjects, uint64_t seed) : subjects_(std::move(subjects)), seed_(seed) {}
  void TestBody() override {
    SuiteOptions o;
    o.level = std::max(1, env_test_level());
    o.log = &std::cout;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    o.repro_command = g_argv0 + " --gtest_filter=" + info->test_suite_name() + "." + info->name();
    o.seed = seed_;
    const auto all = run_suites(subjects_, o);
    for (size_t i = 0; i < subjects_.size(); ++i) {
      const auto& rows = all[i];
      int fails = 0, skips = 0, cases = 0;
      for (const auto& r : rows) {
        fails += r.verdict == oracle::Verdict::Fail;
        skips += r.verdict == oracle::Verdict::Skip;
        cases += r.cases;
      }
      std::cout << "  " << subjects_[i].name << " seed=" << seed_ << " level=" << o.level << ": " << rows.size()
                << " properties, " << cases << " cases, " << fails << " failures, " << skips << " skipped\n";
      if (fails) std::cout << format_results(rows);
      EXPECT_EQ(fails, 0) << subjects_[i].name << " seed " << seed_;
    }
  }

 private:
  std::vector<Subject> subjects_;
  uint64_t seed_;
};

// The subjects of the false-alarm run: every registered backend and every correct control.
std::vector<Subject> false_alarm_subjects() {
  std::vector<Subject> subjects;
  for (const auto& name : oracle::backend_names()) subjects.push_back(backend_subject(name));
  for (const auto& c : control_subjects()) subjects.push_back(c);
  return subjects;
}

// A failing property prints a one-line repro and dumps the (shrunk) case as a fixture that
// `dsa-verify fixtures check` (oracle::check_fixture) replays: the mutant fails it again and
// the reference passes it.
// The properties' WEAK rule (DSA_PROP_ASSERT_DETECTABLE, issue 12 "a pass must be able to
// fail"): a WEAK draw fails the property whatever the class of its WEAK output (bf16, fp16 or
// fp32); a passed report passes; a skipped one is a skip (NotSupported).
TEST(WeakRule, AWeakDrawOfAnyClassFailsTheProperty) {
  using dsa::oracle::Verdict;
  auto fails = [](const dsa::oracle::OpReport& r) {
    try {
      DSA_PROP_ASSERT_DETECTABLE(r);
    } catch (const rc::detail::CaseResult& res) {
      return res.type == rc::detail::CaseResult::Type::Failure;
    }
    return false;
  };
  dsa::oracle::OpReport r;
  r.verdict = Verdict::Weak;
  r.tensors.resize(2);
  r.tensors[0].precision = dsa::DType::BF16;
  r.tensors[0].weak_rows = 3;
  r.tensors[1].precision = dsa::DType::F32;
  EXPECT_TRUE(fails(r));  // WEAK only at the bf16 class (accepted before issue 12)
  r.tensors[0].precision = dsa::DType::F16;
  EXPECT_TRUE(fails(r));
  r.tensors[0].weak_rows = 0;
  r.tensors[1].weak_rows = 1;
  EXPECT_TRUE(fails(r));  // WEAK at the fp32 class
  r.verdict = Verdict::Pass;
  r.tensors[1].weak_rows = 0;
  EXPECT_FALSE(fails(r));
  r.verdict = Verdict::Skip;
  EXPECT_THROW(DSA_PROP_ASSERT_DETECTABLE(r), dsa::oracle::NotSupported);
}

TEST(Repro, FailingCaseIsDumpedAsAReplayableFixture) {
  Subject mutant;
  for (const auto& m : mutant_subjects())
    if (m.name == "smla_base2_lse") mutant = m;
  ASSERT_TRUE(mutant.make);
  const Property* prop = nullptr;
  for (const auto& p : all_properties())
    if (p.name == "smla.forward_ratio") prop = &p;
  ASSERT_NE(prop, nullptr);
  SuiteOptions o;
  o.seed = 7;
  o.quiet = true;
  o.dump_dir = (std::filesystem::temp_directory_path() / "dsa_prop_repro_test").string();
  std::filesystem::remove_all(o.dump_dir);
  const PropertyResult r = run_property(mutant, *prop, o);
  ASSERT_EQ(r.verdict, oracle::Verdict::Fail);
  std::cout << "repro line: " << r.repro << "\nfixture: " << r.dumped << "\n";
  EXPECT_EQ(r.repro.rfind("RC_PARAMS=\"", 0), 0u);
  EXPECT_NE(r.repro.find("seed=7"), std::string::npos);
  EXPECT_NE(r.repro.find("reproduce="), std::string::npos);
  EXPECT_NE(r.repro.find("DSA_TEST_LEVEL="), std::string::npos);
  ASSERT_FALSE(r.dumped.empty());
  const fixtures::Fixture f = fixtures::load_fixture(r.dumped);
  EXPECT_EQ(f.op, "sparse_mla_fwd");
  auto ref = oracle::make_reference_backend();
  EXPECT_TRUE(oracle::check_fixture(f, ref.get()).passed());
  auto bad = mutant.make();
  const oracle::FixtureReport replay = oracle::check_fixture(f, bad.get());
  std::cout << oracle::format_fixture_report(replay);
  EXPECT_FALSE(replay.passed());
}

// Only a failing execution dumps its case (fresh-user F12): draws that judged nothing (top-k
// k = 0, discarded and redrawn) left "failing case" fixtures after a clean pass.
TEST(Repro, APassingPropertyDumpsNothing) {
  const Subject reference = backend_subject("reference");
  const auto dir = std::filesystem::temp_directory_path() / "dsa_prop_clean_dump_test";
  for (const std::string name : {"topk.contract_exact", "topk.nan_never_selected", "topk.neg_inf_to_minus_one"}) {
    const Property* prop = nullptr;
    for (const auto& p : all_properties())
      if (p.name == name) prop = &p;
    ASSERT_NE(prop, nullptr) << name;
    for (uint64_t seed : {1u, 2u, 7u}) {
      std::filesystem::remove_all(dir);
      SuiteOptions o;
      o.seed = seed;
      o.quiet = true;
      o.dump_dir = dir.string();
      const PropertyResult r = run_property(reference, *prop, o);
      EXPECT_EQ(r.verdict, oracle::Verdict::Pass) << name << " seed " << seed << ": " << r.message;
      EXPECT_TRUE(r.dumped.empty()) << name << " seed " << seed << ": " << r.dumped;
      EXPECT_FALSE(std::filesystem::exists(dir)) << name << " seed " << seed << " dumped a passing case";
    }
  }
  std::filesystem::remove_all(dir);
}

using test::last_field;

// A counterexample on a long row names its fields (the generator's case log) and shrinks the
// row: a fault that shows on any row (ignoring sorted) shrinks far below 32768 keys; the
// candidate-buffer overflow cannot shrink below its buffer (1024 candidates).
TEST(Repro, LongRowCounterexampleNamesFieldsAndShrinks) {
  const Property* prop = nullptr;
  for (const auto& p : all_properties())
    if (p.name == "topk.long_rows") prop = &p;
  ASSERT_NE(prop, nullptr);
  for (const std::string name : {"topk_ignores_sorted", "topk_first_1024_of_threshold_bin"}) {
    Subject mutant;
    for (const auto& m : mutant_subjects())
      if (m.name == name) mutant = m;
    ASSERT_TRUE(mutant.make) << name;
    SuiteOptions o;
    o.seed = 5;
    o.quiet = true;
    o.dump = false;
    const PropertyResult r = run_property(mutant, *prop, o);
    ASSERT_EQ(r.verdict, oracle::Verdict::Fail) << name;
    const int64_t s_kv = last_field(r.message, " s_kv="), k = last_field(r.message, " k=");
    std::cout << name << ": shrunk to s_kv=" << s_kv << " k=" << k << "\n"
              << r.message.substr(0, 600) << "\n";
    EXPECT_NE(r.message.find("case: topk long"), std::string::npos) << "fields are named";
    EXPECT_NE(r.message.find("rows="), std::string::npos);
    ASSERT_GT(s_kv, 0);
    EXPECT_LT(s_kv, 32768) << name << " did not shrink the row";
    if (name == "topk_ignores_sorted") EXPECT_LE(s_kv, 64) << "a short row shows this fault";
    else EXPECT_GT(s_kv, 1024) << "the overflow needs more than 1024 candidates";
  }
}

}  // namespace
}  // namespace dsa::props

int main(int argc, char** argv) {
  using namespace dsa;
  props::g_argv0 = argv[0];
  oracle::register_reference_backend();
#ifdef DSA_HAVE_BACKENDS
  backends::register_builtin_backends();
#endif
  for (const auto& name : oracle::backend_names())
    for (const auto& p : props::all_properties()) {
      const props::Property* pp = &p;
      ::testing::RegisterTest(("Prop_" + props::gtest_name(name)).c_str(),
                              props::gtest_name(p.name).c_str(), nullptr, nullptr, __FILE__,
                              __LINE__, [name, pp]() -> ::testing::Test* {
                                return new props::PropertyTest(name, pp);
                              });
    }
  for (uint64_t seed : props::kFalseAlarmSeeds) {
    const std::string test = "CorrectBackendsPassLevel1OverSeeds_seed" + std::to_string(seed);
    ::testing::RegisterTest("FalseAlarms", test.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [seed]() -> ::testing::Test* {
                              return new props::FalseAlarmRun(props::false_alarm_subjects(), seed);
                            });
  }
  for (int shard = 0; shard < props::kKillMatrixShards; ++shard) {
    const std::string test =
        "KillMatrix_" + std::to_string(shard + 1) + "of" + std::to_string(props::kKillMatrixShards);
    ::testing::RegisterTest("Mutation", test.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [shard]() -> ::testing::Test* { return new props::KillMatrixShard(shard); });
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

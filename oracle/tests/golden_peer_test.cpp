// Golden test (label golden): every peer fixture (fixtures/peer, FlashMLA / DeepGEMM /
// Megatron producers) through the float64 reference; prints the metrics per tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/op_check.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/reference/sparse_mla.h"

namespace dsa::oracle {
namespace {

std::vector<std::string> fixtures_in(const std::string& dir) {
  std::vector<std::string> files;
  if (!std::filesystem::is_directory(dir)) return files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}
std::vector<std::string> peer_fixtures() { return fixtures_in(DSA_PEER_FIXTURE_DIR); }
std::vector<std::string> golden_fixtures() { return fixtures_in(DSA_GOLDEN_FIXTURE_DIR); }

class PeerFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(PeerFixture, ReferenceAgreesWithProducer) {
  const fixtures::Fixture f = fixtures::load_fixture(GetParam());
  auto ref = make_reference_backend();
  const FixtureReport r = check_fixture(f, ref.get());
  std::cout << format_fixture_report(r);
  for (const auto& p : r.producer_vs_reference) EXPECT_TRUE(p.passed()) << p.reason;
  for (const auto& b : r.backend_vs_reference) EXPECT_TRUE(b.passed()) << b.reason;
}

TEST(PeerFixtures, AllFifteenArePresent) { EXPECT_EQ(peer_fixtures().size(), 15u); }

INSTANTIATE_TEST_SUITE_P(Peer, PeerFixture, ::testing::ValuesIn(peer_fixtures()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return std::filesystem::path(i.param).stem().string();
                         });

// The suite's own golden fixtures (fixtures/golden, written from the reference): the
// reference and the reference backend must reproduce them.
class GoldenFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenFixture, ReferenceReproducesGolden) {
  const fixtures::Fixture f = fixtures::load_fixture(GetParam());
  auto ref = make_reference_backend();
  const FixtureReport r = check_fixture(f, ref.get());
  std::cout << format_fixture_report(r);
  EXPECT_TRUE(r.passed()) << format_fixture_report(r);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenFixture, ::testing::ValuesIn(golden_fixtures()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return std::filesystem::path(i.param).stem().string();
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenFixture);

// smla_fp32 audits a kernel's fp32 path: its q and kv are on the 1/4096 grid, so a kernel
// that rounds them to bf16 before computing (in fp32 otherwise) must fail at the fp32 class,
// forward and backward, while the float64 reference rounded once to fp32 passes.
TEST(GoldenFp32, InputsRoundedToBf16Fail) {
  const OpCase c = op_case_from_fixture(
      fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/smla_fp32.safetensors"));
  ASSERT_EQ(c.mla.q.dtype(), DType::F32);
  ASSERT_EQ(c.mla.kv.dtype(), DType::F32);
  const SparseMlaForward f = reference::sparse_mla_forward(c.mla);
  const SparseMlaGrads g = reference::sparse_mla_backward(c.mla, c.dout);
  SparseMlaInputs r16 = c.mla;
  r16.q = c.mla.q.to(DType::BF16).to(DType::F32);
  r16.kv = c.mla.kv.to(DType::BF16).to(DType::F32);
  const SparseMlaForward f16 = reference::sparse_mla_forward(r16);
  const SparseMlaGrads g16 = reference::sparse_mla_backward(r16, c.dout);
  auto fwd = [](const SparseMlaForward& x) {
    return NamedOutputs{{"out", x.out.to(DType::F32)}, {"lse", x.lse.to(DType::F32)},
                        {"max_logits", x.max_logits.to(DType::F32)}};
  };
  auto bwd = [](const SparseMlaGrads& x, const SparseMlaForward& y) {
    return NamedOutputs{{"dq", x.dq.to(DType::F32)}, {"dkv", x.dkv.to(DType::F32)},
                        {"dsink", x.dsink->to(DType::F32)}, {"out", y.out.to(DType::F32)}};
  };
  CheckOptions opt;
  const OpReport ok_f = judge_outputs(Op::SparseMlaFwd, c, fwd(f), opt, "fp32");
  const OpReport ok_b = judge_outputs(Op::SparseMlaBwd, c, bwd(g, f), opt, "fp32");
  EXPECT_EQ(ok_f.verdict, Verdict::Pass) << format_op_report(ok_f);
  EXPECT_EQ(ok_b.verdict, Verdict::Pass) << format_op_report(ok_b);
  const OpReport bad_f = judge_outputs(Op::SparseMlaFwd, c, fwd(f16), opt, "bf16 inputs");
  const OpReport bad_b = judge_outputs(Op::SparseMlaBwd, c, bwd(g16, f16), opt, "bf16 inputs");
  EXPECT_EQ(bad_f.verdict, Verdict::Fail) << format_op_report(bad_f);
  EXPECT_EQ(bad_b.verdict, Verdict::Fail) << format_op_report(bad_b);
}

}  // namespace
}  // namespace dsa::oracle

// Golden test (label golden): every peer fixture (fixtures/peer, FlashMLA / DeepGEMM /
// Megatron producers) through the float64 reference; prints the metrics per tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"

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

}  // namespace
}  // namespace dsa::oracle

// Top-k reports a user can act on (issue 12 item 8): values print so that they round-trip,
// with their bits when two would look equal, and contract violations name their rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "dsa/oracle/topk_check.h"

namespace dsa::oracle {
namespace {

std::string details(const std::vector<TopkViolation>& v, const std::string& rule) {
  std::string s;
  for (const auto& x : v)
    if (x.rule == rule) s += x.detail + "\n";
  return s;
}

// Two adjacent fp32 scores differ in the 8th significant digit: both must be printed apart.
TEST(TopkMessages, AdjacentFloatScoresPrintDifferently) {
  const float a = 10.0f, b = std::nextafter(a, 11.0f);
  const Tensor scores = Tensor::from_f64({1, 3}, {a, b, 1.0}).to(DType::F32);
  const TopkPolicy p{TieBreak::Any, true};
  const auto v = check_topk(Tensor::from_i32({1, 1}, {0}), scores, 1, p, std::nullopt);
  const std::string d = details(v, "below_vstar");
  ASSERT_FALSE(d.empty());
  // 6 digits would print "10 < v*=10"; 9 significant digits tell them apart.
  EXPECT_NE(d.find("score 10 < v*=10.000001"), std::string::npos) << d;
}

// F64 scores print with 17 significant digits, so values 1e-12 apart print apart and need
// no bits; signed zeros are equal (IEEE) and never a violation.
TEST(TopkMessages, RoundTripDigitsTellValuesApart) {
  const double a = 1.0, b = 1.0 + 1e-12;  // F64 scores print with 17 digits: distinct
  const Tensor scores = Tensor::from_f64({1, 2}, {a, b});
  const TopkPolicy p{TieBreak::Any, true};
  const auto v = check_topk(Tensor::from_i32({1, 2}, {0, 1}), scores, 2, p, std::nullopt);
  const std::string d = details(v, "unsorted");
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d.find("0x"), std::string::npos) << "17 digits already tell them apart: " << d;
  // -0.0 and +0.0 are equal (IEEE) and print apart ("-0.0", "0"): no bits either.
  const Tensor z = Tensor::from_f64({1, 3}, {-0.0, 0.0, -1.0}).to(DType::F32);
  EXPECT_TRUE(check_topk(Tensor::from_i32({1, 2}, {0, 1}), z, 2, p, std::nullopt).empty());
}

// A tie order broken between -0.0 and +0.0 shows both values (they print apart and are equal).
TEST(TopkMessages, SignedZeroTieOrderShowsBothValues) {
  const Tensor z = Tensor::from_f64({1, 3}, {0.0, -0.0, -1.0}).to(DType::F32);
  const TopkPolicy small{TieBreak::Small, true};
  const auto v = check_topk(Tensor::from_i32({1, 2}, {1, 0}), z, 2, small, std::nullopt);
  const std::string d = details(v, "tie_order");
  EXPECT_NE(d.find("equal scores -0.0 and 0 (IEEE equal): id 1 before 0"), std::string::npos) << d;
}

TEST(TopkMessages, ContractViolationsNameTheirRows) {
  Tensor s = Tensor::from_f64({4, 3}, {NAN, 1, 2, 1, 2, 3, NAN, 1, 2, 3, 2, 1}).to(DType::F32);
  const TopkPolicy p{TieBreak::Any, false};
  // Rows 0 and 2 select their NaN; row 3 repeats an id.
  const Tensor ids = Tensor::from_i32({4, 2}, {0, 2, 2, 1, 0, 2, 0, 0});
  const std::string why = summarize_topk_violations(check_topk(ids, s, 2, p, std::nullopt));
  EXPECT_EQ(why.rfind("deviates from the contract: selected NaN in rows 0, 2; duplicate id in row 3", 0), 0u)
      << why;
}

}  // namespace
}  // namespace dsa::oracle

// The `dsa` operator library as registered with the dispatcher: schemas with SPEC names, and
// top-k output layout (int32, contiguous, [s_q, k] even for k > s_kv). Label prop.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <limits>
#include <sstream>

#include "dsa/optimized/topk.h"

namespace dsa::torch_props {
namespace {

std::string schema_of(const char* name) {
  (void)optimized::topk_indices(at::zeros({1, 1}), 1);  // make sure the library is linked
  const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
  if (!op.has_value()) return {};
  std::ostringstream os;
  os << op->schema();
  return os.str();
}

TEST(OperatorLibrary, RegistersEveryOpWithSpecArgumentNames) {
  const std::pair<const char*, std::vector<const char*>> ops[] = {
      {"dsa::indexer_scores", {"q_idx", "k_idx", "w", "ks", "ke"}},
      {"dsa::indexer_scores_backward", {"d_scores", "dq_idx", "dk_idx", "dw"}},
      {"dsa::topk_indices", {"scores", "int k", "tie_break", "sorted"}},
      {"dsa::sparse_mla_fwd", {"q", "kv", "indices", "sm_scale", "d_v", "topk_length", "attn_sink",
                               "lse", "max_logits"}},
      {"dsa::sparse_mla_bwd", {"dout", "dq", "dkv", "dsink"}},
      {"dsa::indexer_kl_loss", {"scores", "mode", "indices", "coeff", "d_scores"}},
  };
  for (const auto& [name, args] : ops) {
    const std::string s = schema_of(name);
    ASSERT_FALSE(s.empty()) << name << " is not registered";
    for (const char* a : args) EXPECT_NE(s.find(a), std::string::npos) << s << " lacks " << a;
  }
}

TEST(OperatorLibrary, TopkOutputIsInt32ContiguousWithMinusOnePadding) {
  auto scores = at::tensor({3.0f, -0.0f, 0.0f, std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity(), 0.0f})
                    .view({2, 3});
  const auto ids = optimized::topk_indices(scores, 5);
  EXPECT_EQ(ids.scalar_type(), at::kInt);
  EXPECT_TRUE(ids.is_contiguous());
  ASSERT_EQ(ids.sizes(), (at::IntArrayRef{2, 5}));
  // Row 0: 3 first, then the tied zeros (-0.0 == +0.0) by id ascending; row 1: NaN and -inf
  // are never selected.
  const std::vector<int> want{0, 1, 2, -1, -1, 2, -1, -1, -1, -1};
  const auto got = std::vector<int>(ids.data_ptr<int>(), ids.data_ptr<int>() + ids.numel());
  EXPECT_EQ(got, want);
  const auto large = optimized::topk_indices(scores, 2, c10::nullopt, c10::nullopt, "large");
  EXPECT_EQ(large[0][1].item<int>(), 2);  // tie at v* = 0: the larger id
}

}  // namespace
}  // namespace dsa::torch_props

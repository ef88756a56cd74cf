// The CUDA dispatch of dsa::topk_indices (libdsa_torch_ops, SPEC §3) from C++: the dispatcher
// has a CUDA kernel for the op, and on CUDA tensors it returns what the ATen composite returns
// on the same tensors (bytes for sorted small/large, sets for unsorted) for random, plateau
// and NaN/±inf/±0 rows, windows, k from 1 to past s_kv and rows over one CTA and a cluster;
// repeated calls are bitwise identical; bad input raises the composite's error. Skips
// without a CUDA device.
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include "dsa/cuda/kernels.h"
#include "dsa/cuda/torch_ops.h"
#include "dsa/optimized/topk.h"
#include "kernels.h"  // optimized/src: the composite, reachable on its own

namespace {

class TorchOpsCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dsa::cuda::torch_ops_registered());
    if (dsa::cuda::device_count() == 0 || !at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  }
};

at::Tensor make_rows(int64_t s_q, int64_t s_kv, int fill, uint64_t seed) {
  at::manual_seed(seed);
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  if (fill == 0) return at::randn({s_q, s_kv}, opts);
  if (fill == 1) return at::randint(0, 4, {s_q, s_kv}, opts);  // plateaus
  auto x = at::randn({s_q, s_kv}, opts);
  auto pick = at::randint(0, 8, {s_q, s_kv}, opts.dtype(at::kLong));
  const float inf = std::numeric_limits<float>::infinity();
  x.masked_fill_(pick.eq(0), std::numeric_limits<float>::quiet_NaN());
  x.masked_fill_(pick.eq(1), -inf);
  x.masked_fill_(pick.eq(2), inf);
  x.masked_fill_(pick.eq(3), -0.0f);
  x.masked_fill_(pick.eq(4), 0.0f);
  return x;
}

TEST_F(TorchOpsCudaTest, DispatcherHasTheCudaKernel) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("dsa::topk_indices", "");
  EXPECT_TRUE(op.hasKernelForDispatchKey(c10::DispatchKey::CUDA));
}

TEST_F(TorchOpsCudaTest, MatchesTheCompositeOnCudaTensors) {
  uint64_t seed = 1;
  int cases = 0;
  for (int64_t s_kv : {int64_t{1000}, int64_t{40001}, int64_t{131072}}) {
    for (int fill : {0, 1, 2}) {
      const auto x = make_rows(3, s_kv, fill, seed++).cuda();
      for (int64_t k : {int64_t{1}, int64_t{300}, int64_t{2048}, s_kv + 5}) {
        for (const char* tb : {"small", "large"}) {
          for (bool sorted : {true, false}) {
            for (bool windows : {false, true}) {
              c10::optional<at::Tensor> ks, ke;
              if (windows) {
                ks = at::tensor({int64_t{0}, s_kv / 3, s_kv - 7}, at::kLong).cuda();
                ke = at::tensor({s_kv, s_kv / 2, s_kv + 9}, at::kLong).cuda();
              }
              const auto got = dsa::optimized::topk_indices(x, k, ks, ke, tb, sorted);
              const auto again = dsa::optimized::topk_indices(x, k, ks, ke, tb, sorted);
              const auto ref = dsa::optimized::kernels::topk_indices(x, k, ks, ke, tb, sorted);
              const std::string label = "s_kv=" + std::to_string(s_kv) + " fill=" +
                                        std::to_string(fill) + " k=" + std::to_string(k) +
                                        " tie=" + tb + " sorted=" + std::to_string(sorted) +
                                        " windows=" + std::to_string(windows);
              ASSERT_TRUE(got.is_cuda()) << label;
              ASSERT_EQ(got.scalar_type(), at::kInt) << label;
              EXPECT_TRUE(at::equal(got, again)) << "run to run: " << label;
              if (sorted) {
                EXPECT_TRUE(at::equal(got, ref)) << label;
              } else {
                EXPECT_TRUE(at::equal(std::get<0>(got.sort(1)), std::get<0>(ref.sort(1)))) << label;
              }
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 3 * 3 * 4 * 2 * 2 * 2);
}

TEST_F(TorchOpsCudaTest, BadInputRaisesTheCompositeError) {
  const auto ints = at::ones({2, 5}, at::TensorOptions().dtype(at::kInt)).cuda();
  EXPECT_THROW(dsa::optimized::topk_indices(ints, 2), c10::Error);
  const auto x = at::randn({2, 5}).cuda();
  EXPECT_THROW(dsa::optimized::topk_indices(x, -1), c10::Error);
  EXPECT_THROW(dsa::optimized::topk_indices(x, 2, c10::nullopt, c10::nullopt, "median"), c10::Error);
  const auto ks = at::zeros({2}, at::kLong).cuda();
  EXPECT_THROW(dsa::optimized::topk_indices(x, 2, ks, c10::nullopt), c10::Error);
}

}  // namespace

// The CUDA dispatch of dsa::indexer_scores (+ backward) on integer grids equals the composite
// bit for bit (every product and sum exact), windows int32/int64, d_I padded, H_I 37.
// The CUDA dispatch of dsa::topk_indices, dsa::sparse_mla_fwd and dsa::sparse_mla_bwd
// (libdsa_torch_ops, SPEC §3-§5; with the autograd function) from C++. Top-k: the dispatcher
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
#include "dsa/optimized/autograd.h"
#include "dsa/optimized/indexer.h"
#include "dsa/optimized/sparse_mla.h"
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

// dsa::sparse_mla_fwd on CUDA tensors runs the one-pass kernel: the dispatcher's result is
// bitwise what sparse_mla_forward_device(OnePassWgmma) returns on the same device tensors (its
// accuracy is judged by the oracle in dsa_cuda_tests), repeated calls are bitwise identical,
// empty rows give 0 / +inf / -inf, and inputs the kernel does not take go to the composite.
TEST_F(TorchOpsCudaTest, SparseMlaFwdRunsTheOnePassKernel) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("dsa::sparse_mla_fwd", "");
  EXPECT_TRUE(op.hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  at::manual_seed(7);
  const int64_t s_q = 6, h_q = 128, d_qk = 576, d_v = 512, s_kv = 300, k = 150;
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const auto q = at::randn({s_q, h_q, d_qk}, bf);
  const auto kv = at::randn({s_kv, d_qk}, bf);
  auto idx = at::randint(-3, s_kv + 3, {s_q, k}, at::TensorOptions().dtype(at::kInt));
  idx[2].fill_(-1);  // an empty row
  idx = idx.cuda();
  const auto len = at::tensor({150, 0, 150, 70, 1, 149}, at::kInt).cuda();
  const auto sink = at::randn({h_q}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  const double scale = 1.0 / 24.0;
  const auto got = dsa::optimized::sparse_mla_fwd(q, kv, idx, scale, d_v, len, sink);
  const auto again = dsa::optimized::sparse_mla_fwd(q, kv, idx, scale, d_v, len, sink);
  auto out = at::empty({s_q, h_q, d_v}, bf);
  auto lse = at::empty({s_q, h_q}, bf.dtype(at::kFloat));
  auto mx = at::empty({s_q, h_q}, bf.dtype(at::kFloat));
  dsa::cuda::sparse_mla_forward_device(
      reinterpret_cast<const uint16_t*>(q.data_ptr()), reinterpret_cast<const uint16_t*>(kv.data_ptr()),
      idx.data_ptr<int32_t>(), len.data_ptr<int32_t>(), sink.data_ptr<float>(), s_q, h_q, d_qk,
      s_kv, k, d_v, static_cast<float>(scale), reinterpret_cast<uint16_t*>(out.data_ptr()),
      lse.data_ptr<float>(), mx.data_ptr<float>(), nullptr, dsa::cuda::SparseMlaKernel::OnePassWgmma);
  ASSERT_TRUE(std::get<0>(got).is_cuda());
  EXPECT_EQ(std::get<0>(got).scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(std::get<0>(got), out));
  EXPECT_TRUE(at::equal(std::get<1>(got), lse));
  EXPECT_TRUE(at::equal(std::get<2>(got), mx));
  EXPECT_TRUE(at::equal(std::get<0>(got), std::get<0>(again))) << "run to run";
  EXPECT_TRUE(at::equal(std::get<1>(got), std::get<1>(again))) << "run to run";
  EXPECT_TRUE(at::equal(std::get<2>(got), std::get<2>(again))) << "run to run";
  for (int64_t row : {int64_t{1}, int64_t{2}}) {  // topk_length 0, all ids -1
    EXPECT_EQ(std::get<0>(got)[row].abs().max().item<float>(), 0.0f) << row;
    EXPECT_TRUE(std::get<1>(got)[row].isposinf().all().item<bool>()) << row;
    EXPECT_TRUE(std::get<2>(got)[row].isneginf().all().item<bool>()) << row;
  }
  EXPECT_GT(std::get<0>(got)[0].abs().max().item<float>(), 0.0f);
  // Not taken by the kernel (a float64 sink): the composite runs, and its errors are raised.
  const auto via_composite =
      dsa::optimized::sparse_mla_fwd(q, kv, idx, scale, d_v, len, sink.to(at::kDouble));
  EXPECT_EQ(std::get<0>(via_composite).sizes(), std::get<0>(got).sizes());
  EXPECT_THROW(dsa::optimized::sparse_mla_fwd(q, kv, idx, scale, d_qk + 1, len, sink), c10::Error);
}

// dsa::sparse_mla_bwd on CUDA tensors runs the deterministic backward kernel (its accuracy is
// judged by the oracle in dsa_cuda_tests): dkv and dsink are bitwise what
// sparse_mla_backward_device(Deterministic) returns on the same device tensors and dq is its
// fp32 dq in q's dtype (the composite's dtypes); repeated calls are bitwise identical; an fp32
// dout holding bf16 values gives the bf16 dout's grads, a general fp32 dout is not rounded to
// bf16; the autograd function (dsa::optimized::autograd::sparse_mla) returns the op's grads on
// CUDA; inputs the kernel does not take go to the composite, whose errors are raised.
TEST_F(TorchOpsCudaTest, SparseMlaBwdRunsTheDeterministicKernel) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("dsa::sparse_mla_bwd", "");
  EXPECT_TRUE(op.hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  at::manual_seed(11);
  const int64_t s_q = 6, h_q = 128, d_qk = 576, d_v = 512, s_kv = 300, k = 150;
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const auto f32 = bf.dtype(at::kFloat);
  const auto q = at::randn({s_q, h_q, d_qk}, bf);
  const auto kv = at::randn({s_kv, d_qk}, bf);
  auto idx = at::randint(-3, s_kv + 3, {s_q, k}, at::TensorOptions().dtype(at::kInt));
  idx[2].fill_(-1);  // an empty row
  idx[4].narrow(0, 0, 75).fill_(7);  // duplicates
  idx = idx.cuda();
  const auto len = at::tensor({150, 0, 150, 70, 140, 149}, at::kInt).cuda();
  const auto sink = at::randn({h_q}, f32);
  const double scale = 1.0 / 24.0;
  const auto f = dsa::optimized::sparse_mla_fwd(q, kv, idx, scale, d_v, len, sink);
  const auto& out = std::get<0>(f);
  const auto& lse = std::get<1>(f);
  const auto dout = at::randn({s_q, h_q, d_v}, bf);
  const auto g = dsa::optimized::sparse_mla_bwd(q, kv, idx, out, lse, dout, scale, d_v, len, sink);
  const auto again =
      dsa::optimized::sparse_mla_bwd(q, kv, idx, out, lse, dout, scale, d_v, len, sink);
  auto dq = at::empty({s_q, h_q, d_qk}, f32), dkv = at::empty({s_kv, d_qk}, f32);
  auto dsink = at::empty({h_q}, f32);
  const auto mode = dsa::cuda::SparseMlaBwdMode::Deterministic;
  auto scratch = at::empty(
      {static_cast<int64_t>(dsa::cuda::sparse_mla_backward_scratch_bytes(s_q, h_q, d_qk, s_kv, k, mode))},
      bf.dtype(at::kByte));
  dsa::cuda::sparse_mla_backward_device(
      reinterpret_cast<const uint16_t*>(q.data_ptr()), reinterpret_cast<const uint16_t*>(kv.data_ptr()),
      idx.data_ptr<int32_t>(), len.data_ptr<int32_t>(), sink.data_ptr<float>(),
      reinterpret_cast<const uint16_t*>(out.data_ptr()), lse.data_ptr<float>(),
      reinterpret_cast<const uint16_t*>(dout.data_ptr()), s_q, h_q, d_qk, s_kv, k, d_v,
      static_cast<float>(scale), dq.data_ptr<float>(), dkv.data_ptr<float>(),
      dsink.data_ptr<float>(), scratch.data_ptr(), nullptr, mode);
  ASSERT_TRUE(std::get<0>(g).is_cuda());
  EXPECT_EQ(std::get<0>(g).scalar_type(), at::kBFloat16);
  EXPECT_EQ(std::get<1>(g).scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(std::get<0>(g), dq.to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(std::get<1>(g), dkv));
  EXPECT_TRUE(at::equal(std::get<2>(g), dsink));
  EXPECT_GT(dkv.abs().max().item<float>(), 0.0f);
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(at::equal(i == 0 ? std::get<0>(g) : i == 1 ? std::get<1>(g) : std::get<2>(g),
                          i == 0 ? std::get<0>(again) : i == 1 ? std::get<1>(again) : std::get<2>(again)))
        << "run to run, output " << i;
  // fp32 dout: bf16 values -> the same grads; general values -> not the grads of bf16(dout).
  const auto g_same = dsa::optimized::sparse_mla_bwd(q, kv, idx, out, lse, dout.to(at::kFloat),
                                                     scale, d_v, len, sink);
  EXPECT_TRUE(at::equal(std::get<1>(g_same), dkv));
  EXPECT_TRUE(at::equal(std::get<0>(g_same), std::get<0>(g)));
  const auto dout32 = at::randn({s_q, h_q, d_v}, f32);
  const auto g32 = dsa::optimized::sparse_mla_bwd(q, kv, idx, out, lse, dout32, scale, d_v, len, sink);
  const auto g16 = dsa::optimized::sparse_mla_bwd(q, kv, idx, out, lse, dout32.to(at::kBFloat16),
                                                  scale, d_v, len, sink);
  EXPECT_FALSE(at::equal(std::get<1>(g32), std::get<1>(g16))) << "fp32 dout rounded to bf16";
  // The autograd function on CUDA: forward and backward through the dispatcher's kernels.
  {
    const auto qa = q.detach().requires_grad_(true);
    const auto kva = kv.detach().requires_grad_(true);
    const auto sinka = sink.detach().requires_grad_(true);
    const auto r = dsa::optimized::autograd::sparse_mla(qa, kva, idx, scale, d_v, len, sinka);
    EXPECT_TRUE(at::equal(std::get<0>(r), out));
    std::get<0>(r).backward(dout);
    ASSERT_TRUE(qa.grad().defined() && kva.grad().defined() && sinka.grad().defined());
    EXPECT_TRUE(at::equal(qa.grad(), std::get<0>(g)));
    EXPECT_TRUE(at::equal(kva.grad(), dkv.to(at::kBFloat16)));
    EXPECT_TRUE(at::equal(sinka.grad(), dsink));
  }
  // Not taken by the kernel (a float64 sink): the composite runs; bad input raises its error.
  const auto via_composite = dsa::optimized::sparse_mla_bwd(q, kv, idx, out, lse, dout, scale, d_v,
                                                            len, sink.to(at::kDouble));
  EXPECT_EQ(std::get<1>(via_composite).sizes(), dkv.sizes());
  EXPECT_THROW(dsa::optimized::sparse_mla_bwd(q, kv, idx, out, lse, dout, scale, d_v, len,
                                              sink.narrow(0, 0, h_q - 1)),
               c10::Error);
}

TEST_F(TorchOpsCudaTest, IndexerDispatcherHasTheCudaKernels) {
  for (const char* name : {"dsa::indexer_scores", "dsa::indexer_scores_backward"}) {
    const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
    EXPECT_TRUE(op.hasKernelForDispatchKey(c10::DispatchKey::CUDA)) << name;
  }
}

// Integer grids in [-3, 3]: products, head sums and gradient sums are exact in fp32, so the
// kernels and the composite agree bit for bit (scores, -inf outside windows, dq/dk/dw).
TEST_F(TorchOpsCudaTest, IndexerMatchesTheCompositeOnIntegerGrids) {
  struct Shape {
    int64_t s_q, s_kv, h, d;
    bool windows;
    at::ScalarType window_dtype;
  };
  const Shape shapes[] = {{9, 700, 64, 128, true, at::kLong},
                          {7, 257, 37, 24, true, at::kInt},
                          {4, 130, 16, 64, false, at::kLong}};
  int64_t seed = 3;
  for (const Shape& s : shapes) {
    at::manual_seed(seed++);
    const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
    const auto q = at::randint(-3, 4, {s.s_q, s.h, s.d}, bf);
    const auto k = at::randint(-3, 4, {s.s_kv, s.d}, bf);
    const auto w = at::randint(-2, 3, {s.s_q, s.h}, f32);
    const auto ds = at::randint(-2, 3, {s.s_q, s.s_kv}, f32);
    c10::optional<at::Tensor> ks, ke;
    if (s.windows) {
      const auto lo = at::randint(0, s.s_kv / 2, {s.s_q}, at::kLong);
      ks = lo.to(s.window_dtype).cuda();
      ke = (lo + at::randint(-3, s.s_kv, {s.s_q}, at::kLong)).to(s.window_dtype).cuda();
    }
    const std::string label = "s_q=" + std::to_string(s.s_q) + " s_kv=" + std::to_string(s.s_kv) +
                              " H_I=" + std::to_string(s.h) + " d_I=" + std::to_string(s.d);
    const auto got = dsa::optimized::indexer_scores(q, k, w, ks, ke);
    const auto ref = dsa::optimized::kernels::indexer_scores(q, k, w, ks, ke);
    ASSERT_TRUE(got.is_cuda()) << label;
    ASSERT_GT(at::isfinite(ref).sum().item<int64_t>(), 0) << label;  // not a trivial case
    EXPECT_TRUE(at::equal(got, ref)) << label;
    EXPECT_TRUE(at::equal(got, dsa::optimized::indexer_scores(q, k, w, ks, ke))) << "run to run: " << label;
    const auto g = dsa::optimized::indexer_scores_backward(q, k, w, ds, ks, ke);
    const auto r = dsa::optimized::kernels::indexer_scores_backward(q, k, w, ds, ks, ke);
    ASSERT_GT(std::get<0>(r).abs().sum().item<double>(), 0) << label;
    EXPECT_TRUE(at::equal(std::get<0>(g), std::get<0>(r))) << "dq_idx " << label;
    EXPECT_TRUE(at::equal(std::get<1>(g), std::get<1>(r))) << "dk_idx " << label;
    EXPECT_TRUE(at::equal(std::get<2>(g), std::get<2>(r))) << "dw " << label;
  }
}

TEST_F(TorchOpsCudaTest, IndexerBadInputRaisesTheCompositeError) {
  const auto bf = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const auto q = at::ones({2, 4, 16}, bf), k = at::ones({5, 16}, bf);
  const auto w_bad = at::ones({2, 3}, at::TensorOptions().device(at::kCUDA));
  EXPECT_THROW(dsa::optimized::indexer_scores(q, k, w_bad), c10::Error);
  const auto w = at::ones({2, 4}, at::TensorOptions().device(at::kCUDA));
  const auto ks = at::zeros({2}, at::kLong).cuda();
  EXPECT_THROW(dsa::optimized::indexer_scores(q, k, w, ks, c10::nullopt), c10::Error);
}

}  // namespace

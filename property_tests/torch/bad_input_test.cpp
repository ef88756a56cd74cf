// Bad input: every `dsa` op TORCH_CHECKs its arguments and the message names the argument
// and the expected shape / dtype / value (one case per kind of mistake). Label prop (CPU).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "dsa/optimized/block.h"
#include "dsa/optimized/indexer.h"
#include "dsa/optimized/kl_loss.h"
#include "dsa/optimized/sparse_mla.h"
#include "dsa/optimized/topk.h"

namespace dsa::torch_props {
namespace {

namespace opt = dsa::optimized;

// Runs `f`, requires a c10::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no c10::Error thrown (expected a message with '" << *parts.begin() << "')";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg;
  }
}

const auto f32 = at::TensorOptions().dtype(at::kFloat);
const auto i32 = at::TensorOptions().dtype(at::kInt);
const auto i64 = at::TensorOptions().dtype(at::kLong);

struct Indexer {
  at::Tensor q_idx = at::randn({4, 2, 8}, f32), k_idx = at::randn({6, 8}, f32),
             w = at::randn({4, 2}, f32), d = at::randn({4, 6}, f32);
};

TEST(BadInput, IndexerScores) {
  Indexer x;
  const char* op = "dsa::indexer_scores";
  expect_error([&] { opt::indexer_scores(x.q_idx.view({4, 16}), x.k_idx, x.w); },
               {op, "'q_idx'", "[s_q, H_I, d_I]"});
  expect_error([&] { opt::indexer_scores(x.q_idx, at::randn({6, 7}, f32), x.w); },
               {op, "'k_idx'", "[s_kv, d_I]"});
  expect_error([&] { opt::indexer_scores(x.q_idx, x.k_idx, at::randn({4, 3}, f32)); },
               {op, "'w'", "[s_q, H_I]"});
  expect_error([&] { opt::indexer_scores(x.q_idx.to(at::kInt), x.k_idx, x.w); },
               {op, "'q_idx'", "dtype"});
  expect_error([&] { opt::indexer_scores(x.q_idx, x.k_idx, x.w.to(at::kBFloat16)); },
               {op, "'w'", "float32 or float64"});
  expect_error([&] { opt::indexer_scores(x.q_idx, x.k_idx, x.w, at::zeros({4}, i64)); },
               {op, "'ks' and 'ke'"});
  expect_error(
      [&] { opt::indexer_scores(x.q_idx, x.k_idx, x.w, at::zeros({3}, i64), at::ones({3}, i64)); },
      {op, "'ks'", "[s_q]"});
  expect_error(
      [&] { opt::indexer_scores(x.q_idx, x.k_idx, x.w, at::zeros({4}, f32), at::ones({4}, f32)); },
      {op, "'ks'", "int32 or int64"});
}

TEST(BadInput, IndexerScoresBackward) {
  Indexer x;
  const char* op = "dsa::indexer_scores_backward";
  expect_error([&] { opt::indexer_scores_backward(x.q_idx, x.k_idx, x.w, at::randn({4, 5}, f32)); },
               {op, "'d_scores'", "[s_q, s_kv]"});
  expect_error([&] { opt::indexer_scores_backward(x.q_idx, x.k_idx, x.w, x.d.to(at::kInt)); },
               {op, "'d_scores'", "float32 or float64"});
  expect_error([&] { opt::indexer_scores_backward(x.q_idx, at::randn({6}, f32), x.w, x.d); },
               {op, "'k_idx'", "[s_kv, d_I]"});
}

TEST(BadInput, TopkIndices) {
  const auto s = at::randn({4, 6}, f32);
  const char* op = "dsa::topk_indices";
  expect_error([&] { opt::topk_indices(s.view({24}), 2); }, {op, "'scores'", "[s_q, s_kv]"});
  expect_error([&] { opt::topk_indices(s.to(at::kHalf), 2); }, {op, "'scores'", "float32"});
  expect_error([&] { opt::topk_indices(s, -1); }, {op, "'k'", "k >= 0"});
  expect_error([&] { opt::topk_indices(s, 2, c10::nullopt, c10::nullopt, "largest"); },
               {op, "'tie_break'", "\"small\""});
  expect_error([&] { opt::topk_indices(s, 2, at::zeros({4}, i32), c10::nullopt); },
               {op, "'ks' and 'ke'"});
  expect_error([&] { opt::topk_indices(s, 2, at::zeros({4, 1}, i32), at::ones({4, 1}, i32)); },
               {op, "'ks'", "[s_q]"});
}

struct Mla {
  at::Tensor q = at::randn({3, 2, 8}, f32), kv = at::randn({5, 8}, f32),
             ids = at::zeros({3, 4}, i32), out = at::randn({3, 2, 6}, f32),
             lse = at::randn({3, 2}, f32), dout = at::randn({3, 2, 6}, f32);
};

TEST(BadInput, SparseMlaForward) {
  Mla x;
  const char* op = "dsa::sparse_mla_fwd";
  expect_error([&] { opt::sparse_mla_fwd(x.q.view({3, 16}), x.kv, x.ids, 1.0, 6); },
               {op, "'q'", "[s_q, h_q, d_qk]"});
  expect_error([&] { opt::sparse_mla_fwd(x.q, at::randn({5, 7}, f32), x.ids, 1.0, 6); },
               {op, "'kv'", "[s_kv, d_qk]"});
  expect_error([&] { opt::sparse_mla_fwd(x.q, x.kv, x.ids.to(at::kLong), 1.0, 6); },
               {op, "'indices'", "int32"});
  expect_error([&] { opt::sparse_mla_fwd(x.q, x.kv, at::zeros({3, 2, 4}, i32), 1.0, 6); },
               {op, "'indices'", "[s_q, k] or [s_q, 1, k]"});
  expect_error([&] { opt::sparse_mla_fwd(x.q, x.kv, at::zeros({2, 4}, i32), 1.0, 6); },
               {op, "'indices'", "[s_q, k]"});
  expect_error([&] { opt::sparse_mla_fwd(x.q, x.kv, x.ids, 1.0, 9); },
               {op, "'d_v'", "0 < d_v <= d_qk"});
  expect_error([&] { opt::sparse_mla_fwd(x.q, x.kv, x.ids, 1.0, 0); }, {op, "'d_v'"});
  expect_error(
      [&] { opt::sparse_mla_fwd(x.q, x.kv, x.ids, std::numeric_limits<double>::infinity(), 6); },
      {op, "'sm_scale'", "finite"});
  expect_error([&] { opt::sparse_mla_fwd(x.q, x.kv, x.ids, 1.0, 6, at::zeros({2}, i32)); },
               {op, "'topk_length'", "[s_q]"});
  expect_error([&] { opt::sparse_mla_fwd(x.q, x.kv, x.ids, 1.0, 6, at::zeros({3}, i64)); },
               {op, "'topk_length'", "int32"});
  expect_error(
      [&] { opt::sparse_mla_fwd(x.q, x.kv, x.ids, 1.0, 6, c10::nullopt, at::zeros({3}, f32)); },
      {op, "'attn_sink'", "[h_q]"});
  expect_error([&] { opt::sparse_mla_fwd(x.q.to(at::kLong), x.kv, x.ids, 1.0, 6); },
               {op, "'q'", "dtype"});
}

TEST(BadInput, SparseMlaBackward) {
  Mla x;
  const char* op = "dsa::sparse_mla_bwd";
  expect_error(
      [&] { opt::sparse_mla_bwd(x.q, x.kv, x.ids, x.out, x.lse, at::randn({3, 2, 5}, f32), 1.0, 6); },
      {op, "'dout'", "[s_q, h_q, d_v]"});
  expect_error(
      [&] { opt::sparse_mla_bwd(x.q, x.kv, x.ids, at::randn({3, 6}, f32), x.lse, x.dout, 1.0, 6); },
      {op, "'out'", "[s_q, h_q, d_v]"});
  expect_error(
      [&] { opt::sparse_mla_bwd(x.q, x.kv, x.ids, x.out, at::randn({3, 3}, f32), x.dout, 1.0, 6); },
      {op, "'lse'", "[s_q, h_q]"});
  expect_error(
      [&] { opt::sparse_mla_bwd(x.q, x.kv, x.ids, x.out, x.lse.to(at::kHalf), x.dout, 1.0, 6); },
      {op, "'lse'", "float32 or float64"});
  expect_error(
      [&] { opt::sparse_mla_bwd(x.q, x.kv, x.ids.to(at::kFloat), x.out, x.lse, x.dout, 1.0, 6); },
      {op, "'indices'", "int32"});
}

TEST(BadInput, IndexerKlLoss) {
  const auto s = at::randn({3, 5}, f32), q = at::randn({3, 2, 8}, f32), kv = at::randn({5, 8}, f32);
  const char* op = "dsa::indexer_kl_loss";
  expect_error([&] { opt::indexer_kl_loss(s.view({15}), q, kv, 1.0); },
               {op, "'scores'", "[s_q, s_kv]"});
  expect_error([&] { opt::indexer_kl_loss(s, q, at::randn({4, 8}, f32), 1.0); },
               {op, "'kv'", "[s_kv, d_qk]"});
  expect_error([&] { opt::indexer_kl_loss(s, at::randn({2, 2, 8}, f32), kv, 1.0); },
               {op, "'q'", "[s_q, h_q, d_qk]"});
  expect_error([&] { opt::indexer_kl_loss(s, q, kv, 1.0, c10::nullopt, c10::nullopt, "sparse"); },
               {op, "'indices'", "sparse"});
  expect_error([&] { opt::indexer_kl_loss(s, q, kv, 1.0, c10::nullopt, c10::nullopt, "full"); },
               {op, "'mode'", "\"dense\" or \"sparse\""});
  expect_error(
      [&] {
        opt::indexer_kl_loss(s, q, kv, 1.0, c10::nullopt, c10::nullopt, "sparse",
                             at::zeros({3, 2}, i64));
      },
      {op, "'indices'", "int32"});
  expect_error([&] { opt::indexer_kl_loss(s.to(at::kBFloat16), q, kv, 1.0); },
               {op, "'scores'", "float32 or float64"});
  expect_error(
      [&] {
        opt::indexer_kl_loss(s, q, kv, 1.0, c10::nullopt, c10::nullopt, "dense", c10::nullopt,
                             std::numeric_limits<double>::quiet_NaN());
      },
      {op, "'coeff'", "finite"});
}

TEST(BadInput, DsaBlock) {
  opt::DsaBlockInputs in;
  in.q = at::randn({3, 2, 8}, f32);
  in.kv = at::randn({5, 8}, f32);
  opt::DsaBlockConfig cfg;
  cfg.d_v = 6;
  cfg.topk = 2;
  expect_error([&] { opt::dsa_block(in, cfg); }, {"dsa::dsa_block", "'q_idx'", "shared ids"});
  auto no_q = in;
  no_q.q = at::Tensor();
  expect_error([&] { opt::dsa_block(no_q, cfg, at::zeros({3, 2}, i32)); },
               {"dsa::dsa_block", "'q'"});
  cfg.topk = -3;
  expect_error([&] { opt::dsa_block(in, cfg, at::zeros({3, 2}, i32)); },
               {"dsa::dsa_block", "'topk'"});
}

}  // namespace
}  // namespace dsa::torch_props

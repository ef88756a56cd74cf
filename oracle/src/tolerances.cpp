// THE tolerance table (SPEC §9). Edit here only; every row carries its reason.
#include "dsa/oracle/tolerances.h"

#include <stdexcept>

#include "dsa/oracle/metrics.h"

namespace dsa::oracle {
namespace {

std::vector<Tolerance> build_table() {
  std::vector<Tolerance> t;
  // Adds one row per dtype in `dtypes` with the same ρ and reason. The floor is in units of
  // eps(dtype)·scale: `floor_eps` for F64/F32; 16-bit outputs get kHalfFloorEps, because their
  // own rounding already sits in the rounded baseline and one eps(bf16) is 2^16 eps(fp32).
  constexpr double kHalfFloorEps = 0.5;  // half an ulp of the largest value: one rounding flip
  auto rows = [&t](const char* op, const char* output, std::initializer_list<DType> dtypes,
                   double rho, double floor_eps, const char* reason) {
    for (DType d : dtypes)
      t.push_back({op, output, d, rho,
                   (d == DType::BF16 || d == DType::F16) ? kHalfFloorEps : floor_eps, reason});
  };
  const auto kFloat = {DType::F64, DType::F32, DType::F16, DType::BF16};

  // §2 indexer.
  rows("indexer_scores", "scores", kFloat, 2.0, 8.0,
       "FlashAttention's rho=2; floor covers a different fp32 summation order over d_I and H_I");
  for (const char* g : {"dq_idx", "dk_idx", "dw"})
    rows("indexer_scores_backward", g, kFloat, 2.0, 16.0,
         "rho=2; floor covers reordered fp32 sums over s_kv (dq_idx, dw) and s_q*H_I (dk_idx)");
  // §4 sparse MLA forward.
  rows("sparse_mla_fwd", "out", kFloat, 2.0, 8.0,
       "rho=2; floor covers online-softmax rescaling order and the final rounding to q's dtype");
  rows("sparse_mla_fwd", "lse", kFloat, 2.0, 8.0,
       "rho=2; natural-log LSE of fp32 logits, floor covers log/exp library ulps");
  rows("sparse_mla_fwd", "max_logits", kFloat, 2.0, 4.0,
       "rho=2; a max of fp32 dot products, floor covers the dot-product order only");
  // §5 sparse MLA backward.
  for (const char* g : {"dq", "dkv", "dsink"})
    rows("sparse_mla_bwd", g, kFloat, 2.0, 16.0,
         "rho=2; floor covers atomic/reordered fp32 accumulation over queries, heads and slots");
  // §7 KL loss.
  rows("indexer_kl_loss", "loss", kFloat, 2.0, 16.0,
       "rho=2; floor covers fp32 log-softmax and the mean over rows in another order");
  rows("indexer_kl_loss", "d_scores", kFloat, 2.0, 16.0,
       "rho=2; softmax(I) - p differences, floor covers fp32 exp/normalisation order");

  // Peer producers (fixtures/peer): fp32 PyTorch references; expected values carry fp32
  // rounding (~1e-7 relative) in the producer's own order, judged like an fp32 candidate.
  const auto kPeer = {DType::F32, DType::BF16};
  rows("peer:indexer_scores", "scores", kPeer, 4.0, 8.0,
       "fp32 producer (DeepGEMM ref) with its own einsum order: fp32 rounding only");
  for (const char* g : {"dq_idx", "dk_idx", "dw"})
    rows("peer:indexer_scores_backward", g, kPeer, 4.0, 8.0,
         "fp32 autograd through the producer's einsum: fp32 rounding only");
  for (const char* g : {"out", "out_bf16", "lse", "max_logits"})
    rows("peer:sparse_mla_fwd", g, kPeer, 4.0, 8.0,
         "fp32 FlashMLA ref.py (dense masked softmax over 576-wide dots): fp32 rounding only");
  for (const char* g : {"dq", "dkv", "dsink"})
    rows("peer:sparse_mla_bwd", g, kPeer, 4.0, 8.0,
         "fp32 autograd through FlashMLA ref.py; scatter-add order differs: fp32 rounding only");
  for (const char* g : {"loss", "d_scores"})
    rows("peer:indexer_kl_loss", g, kPeer, 4.0, 8.0,
         "fp32 Megatron loss and autograd gradient: fp32 rounding only");
  return t;
}

}  // namespace

const std::vector<Tolerance>& tolerance_table() {
  static const std::vector<Tolerance> table = build_table();
  return table;
}

const Tolerance& tolerance(const std::string& op, const std::string& output, DType dtype) {
  for (const auto& t : tolerance_table())
    if (t.op == op && t.output == output && t.dtype == dtype) return t;
  throw std::out_of_range("tolerance: no entry for (" + op + ", " + output + ", " +
                          dtype_name(dtype) + ") in oracle/src/tolerances.cpp");
}

double floor_abs(const Tolerance& tol, double scale) {
  return tol.floor_eps * dtype_epsilon(tol.dtype) * scale;
}

}  // namespace dsa::oracle

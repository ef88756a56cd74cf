// THE tolerance table (SPEC §9). Edit here only; every row carries its reason.
#include "dsa/oracle/tolerances.h"

#include <algorithm>
#include <stdexcept>

#include "dsa/oracle/metrics.h"

namespace dsa::oracle {
namespace {

std::vector<Tolerance> build_table() {
  std::vector<Tolerance> t;
  // Adds one row per dtype in `dtypes` with the same ρ, accumulation floor and reason;
  // 16-bit outputs also get one ulp of their own dtype (a rounding flip of the output).
  constexpr double kHalfOutUlps = 1.0;
  auto rows = [&t](const char* op, const char* output, std::initializer_list<DType> dtypes,
                   double rho, double floor_eps, const char* reason) {
    for (DType d : dtypes)
      t.push_back({op, output, d, rho, floor_eps,
                   (d == DType::BF16 || d == DType::F16) ? kHalfOutUlps : 0.0, reason});
  };
  const auto kFloat = {DType::F64, DType::F32, DType::F16, DType::BF16};

  // §2 indexer.
  rows("indexer_scores", "scores", kFloat, 2.0, 4.0,
       "FlashAttention's rho=2; floor: 4 fp32 ulps of sum|w·ReLU(q·k)| (summation order over d_I, H_I)");
  for (const char* g : {"dq_idx", "dk_idx", "dw"})
    rows("indexer_scores_backward", g, kFloat, 2.0, 4.0,
         "rho=2; floor: 4 fp32 ulps of the summed |terms| (reordered sums over s_kv or s_q*H_I)");
  // §4 sparse MLA forward.
  rows("sparse_mla_fwd", "out", kFloat, 2.0, 4.0,
       "rho=2; floor: 4 fp32 ulps of max|v|·(1+|logits|) (online-softmax rescaling order)");
  rows("sparse_mla_fwd", "lse", kFloat, 2.0, 4.0,
       "rho=2; floor: 4 fp32 ulps of |logits|+ln k (fp32 dot order, log/exp library ulps)");
  rows("sparse_mla_fwd", "max_logits", kFloat, 2.0, 4.0,
       "rho=2; a max of fp32 dot products, floor: 4 fp32 ulps of sm_scale·d_qk·|q|·|kv|");
  // §5 sparse MLA backward.
  for (const char* g : {"dq", "dkv", "dsink"})
    rows("sparse_mla_bwd", g, kFloat, 2.0, 4.0,
         "rho=2; floor: 4 fp32 ulps of the summed |terms| (dS cancellation, atomic add order)");
  // §7 KL loss.
  rows("indexer_kl_loss", "loss", kFloat, 2.0, 4.0,
       "rho=2; floor: 4 fp32 ulps of coeff·(|scores|+|logits|+ln s_kv) (log-softmax, row mean)");
  rows("indexer_kl_loss", "d_scores", kFloat, 2.0, 4.0,
       "rho=2; softmax(I) - p cancels, floor: 4 fp32 ulps of coeff/n_rows");

  // §10 FP8 / paged inference ops. Baseline: exact fp8 products (8-bit significands: exact
  // in fp32), fp32 accumulation; sparse MLA: kv dequantized to q's dtype, then §4's baseline.
  for (const char* op : {"fp8_indexer_scores", "paged_indexer_scores"})
    rows(op, "scores", kFloat, 2.0, 4.0,
         "rho=2 over the exact-product fp32 baseline; floor: 4 fp32 ulps of sum|w·ReLU(k_scale·q·k)|");
  // Hopper FP8 tensor cores keep about 14 significant bits of the accumulator between
  // promotions to fp32 (DeepSeek-V3 technical report §3.3.2, "Increasing Accumulation
  // Precision"); used only for a backend that declares fp8_reduced_accumulation().
  for (const char* op : {"fp8_indexer_scores:fp8_tensor_core", "paged_indexer_scores:fp8_tensor_core"})
    rows(op, "scores", kFloat, 2.0, 4.0 * 512.0,
         "FP8 tensor-core accumulation (~14 bits, DeepSeek-V3 report §3.3.2): floor 4 units of "
         "2^-14 (= 2048 fp32 ulps) of sum|terms|");
  rows("sparse_mla_fp8_fwd", "out", kFloat, 2.0, 4.0,
       "rho=2 over the baseline with kv dequantized to q's dtype (FlashMLA); floor as sparse_mla_fwd out");
  rows("sparse_mla_fp8_fwd", "lse", kFloat, 2.0, 4.0,
       "rho=2; floor: 4 fp32 ulps of |logits|+ln k (as sparse_mla_fwd)");
  rows("sparse_mla_fp8_fwd", "max_logits", kFloat, 2.0, 4.0,
       "rho=2; a max of fp32 dot products (as sparse_mla_fwd)");

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

double floor_abs(const Tolerance& tol, double scale, double term_scale) {
  return tol.floor_eps * dtype_epsilon(DType::F32) * std::max(scale, term_scale) +
         tol.out_ulps * dtype_epsilon(tol.dtype) * scale;
}

}  // namespace dsa::oracle

// dsa_gpu_bench: the hand-written CUDA kernels (dsa/cuda/kernels.h) against a LibTorch peer
// measured in the same run on the same inputs. (a) top-k, k 2048, [s_q, s_kv] = [128, 131072],
// [4096, 32768], [4096, 131072], [4096, 4096]: select_topk_device (cluster with the row sort
// kernel or the fused sort, persistent, persistent wide, two-read, radix) vs torch::topk sorted
// and unsorted; effective GB/s counts the scores read
// once plus the int32 ids written (DSA_BENCH_MLA_ONLY=1 leaves (a) out); (b) sparse MLA
// forward at the GLM-5 shape (s_q 4096, d_qk 576, d_v 512, k 2048; h_q 64 and 128, s_kv 8192
// and 32768; the one-pass wgmma variants and mma.sync kernel and the two-pass tensor-core
// kernel, plus timing variants of the wgmma kernel at h_q 128 that leave the gather, S or P V
// out, results wrong, to place the time): sparse_mla_forward_device vs a
// gathered attention composed from ATen ops (index_select + bmm + logsumexp + exp + bmm, bf16
// operands, fp32 accumulation inside cuBLAS). CUDA events on the default stream, warm-up,
// medians, inputs rotated so each timed call reads data not left in the 60 MB L2, random
// (never zero) inputs; (c) the indexer (bench_indexer). DSA_BENCH_INDEXER_ONLY=1 runs (c) alone;
// (d) the sparse MLA backward (bench_mla_backward). DSA_BENCH_SMLA_BWD_ONLY=1 runs (d) alone
// (the cheapest device call that times the backward against its same-run peer).
// Prints a table; writes it to $OUT/gpu_bench.md when OUT is set.
// Roofline figures (measured on this card, shared/GPU.md): 790 TFLOP/s bf16, 4.3 TB/s copy.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include "dsa/cuda/kernels.h"
#include "sparse_mla_internal.h"  // optimized/cuda/src: the wgmma timing variants

namespace {

constexpr double kBf16Tflops = 790.0;
constexpr double kCopyTBs = 4.3;
constexpr double kL2Bytes = 60e6;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

/// Median milliseconds of one fn(i) call over `iters` timed samples after `warmup` calls; a
/// sample times `batch` back-to-back calls (so launch latency does not count for short
/// kernels) and divides; i rotates inputs.
double median_ms(const std::function<void(int)>& fn, int warmup, int iters, int batch = 1) {
  for (int i = 0; i < warmup; ++i) fn(i);
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(a, 0), "record");
    for (int j = 0; j < batch; ++j) fn(warmup + i * batch + j);
    check(cudaEventRecord(b, 0), "record");
    check(cudaEventSynchronize(b), "sync");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t / batch);
  }
  check(cudaGetLastError(), "timed launches");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int rotations(double bytes_per_set) {
  return std::max(2, static_cast<int>(std::ceil(3 * kL2Bytes / bytes_per_set)));
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// (c) indexer scores (SPEC §2), s_q = s_kv = 8192 causal, H_I 64, d_I 128, bf16 q_idx/k_idx,
// fp32 w: indexer_scores_device (wgmma, mma.sync) and its backward against ATen compositions
// on the same inputs (bf16 cuBLAS GEMM with fp32 accumulation and bf16 logits, then relu, *w,
// sum over heads, -inf outside the causal mask; the backward from the same logits). TFLOP/s
// count only visible (t, s) pairs: 2·H_I·d_I flops per pair per product (1 forward, 3 backward).
void bench_indexer(std::ostringstream& table) {
  const int64_t s = 8192, h = 64, d = 128;
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  const double pairs = static_cast<double>(s) * (s + 1) / 2;
  const double flops = 2.0 * h * d * pairs;
  const int r = rotations(2.0 * s * h * d);
  std::vector<torch::Tensor> q, w;
  for (int i = 0; i < r; ++i) {
    q.push_back(torch::randn({s, h, d}, f32).to(torch::kBFloat16));
    w.push_back(torch::randn({s, h}, f32).mul_(1.0 / std::sqrt(static_cast<double>(h * d))));
  }
  const auto k = torch::randn({s, d}, f32).to(torch::kBFloat16);
  const auto ke = torch::arange(1, s + 1, f32.dtype(torch::kInt64));
  const auto ks = torch::zeros({s}, f32.dtype(torch::kInt64));
  const auto ds = torch::randn({s, s}, f32);
  auto out = torch::empty({s, s}, f32);
  auto dq = torch::empty({s, h, d}, f32.dtype(torch::kBFloat16));
  auto dk = torch::empty({s, d}, f32.dtype(torch::kBFloat16));
  auto dw = torch::empty({s, h}, f32);
  dsa::cuda::IndexerKernel kernel = dsa::cuda::IndexerKernel::Wgmma;
  auto mine = [&](int i) {
    dsa::cuda::indexer_scores_device(
        reinterpret_cast<const uint16_t*>(q[i % r].data_ptr()),
        reinterpret_cast<const uint16_t*>(k.data_ptr()), w[i % r].data_ptr<float>(),
        ks.data_ptr<int64_t>(), ke.data_ptr<int64_t>(), s, h, d, s, out.data_ptr<float>(),
        nullptr, kernel);
  };
  dsa::cuda::IndexerBwdKernel bwd_kernel = dsa::cuda::IndexerBwdKernel::Wgmma;
  auto mine_bwd = [&](int i) {
    dsa::cuda::indexer_scores_backward_device(
        reinterpret_cast<const uint16_t*>(q[i % r].data_ptr()),
        reinterpret_cast<const uint16_t*>(k.data_ptr()), w[i % r].data_ptr<float>(),
        ks.data_ptr<int64_t>(), ke.data_ptr<int64_t>(), ds.data_ptr<float>(), s, h, d, s,
        reinterpret_cast<uint16_t*>(dq.data_ptr()), reinterpret_cast<uint16_t*>(dk.data_ptr()),
        dw.data_ptr<float>(), nullptr, bwd_kernel);
  };
  const auto visible = torch::ones({s, s}, f32.dtype(torch::kBool)).tril();
  torch::Tensor pout;
  auto peer = [&](int i) {
    auto logits = torch::matmul(q[i % r], k.t());  // [s, h, s] bf16 (fp32 accumulation)
    pout = logits.relu_().mul_(w[i % r].unsqueeze(2)).sum(1, false, torch::kFloat32);
    pout.masked_fill_(visible.logical_not(), -INFINITY);
  };
  torch::Tensor pdq, pdk, pdw;
  auto peer_bwd = [&](int i) {
    auto logits = torch::matmul(q[i % r], k.t());  // [s, h, s] bf16
    auto dI = ds.masked_fill(visible.logical_not(), 0).unsqueeze(1);  // [s, 1, s]
    pdw = (dI * logits.relu()).sum(2);
    auto g = (dI * w[i % r].unsqueeze(2) * logits.gt(0)).to(torch::kBFloat16);
    pdq = torch::matmul(g, k);
    pdk = torch::matmul(g.reshape({s * h, s}).t(), q[i % r].reshape({s * h, d}));
  };
  auto row = [&](const char* op, const std::string& impl, double t, double fl,
                 const std::string& note) {
    const double tf = fl / (t * 1e-3) / 1e12;
    table << "| " << op << " | s_q = s_kv 8192 causal, H_I 64, d_I 128 | " << impl << " | "
          << fmt("%.3f", t) << " | " << fmt("%.1f", tf) << " | "
          << fmt("%.1f%%", 100.0 * tf / kBf16Tflops) << " | - | - | " << note << " |\n";
  };
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    const auto fin = torch::isfinite(b);
    const auto x = a.masked_select(fin).to(torch::kFloat32), y = b.masked_select(fin).to(torch::kFloat32);
    return ((x - y).norm() / y.norm()).item<double>();
  };
  const double t_peer = median_ms(peer, 1, 5);
  peer(0);
  check(cudaDeviceSynchronize(), "indexer peer");
  torch::Tensor ref_mma;
  using IK = dsa::cuda::IndexerKernel;
  const std::pair<IK, const char*> kernels[] = {
      {IK::Mma, "dsa cuda mma.sync m16n8k16, 2 rows/block"},
      {IK::Wgmma, "dsa cuda wgmma m64n128k16, q in registers, 2 rows/block"},
      {IK::Wgmma3, "dsa cuda wgmma m64n128k16, q in smem, 3 rows/block"},
      {IK::ProbeNoEpilogue, "probe: Wgmma without the epilogue (not valid scores)"},
      {IK::ProbeNoEpilogue3, "probe: Wgmma3 without the epilogue (not valid scores)"}};
  for (const auto& [kern, name] : kernels) {
    kernel = kern;
    const double t = median_ms(mine, 3, 15);
    const bool probe = kern == IK::ProbeNoEpilogue || kern == IK::ProbeNoEpilogue3;
    std::string note = "timing probe: products, loads and pipeline only";
    if (!probe) {
      out.fill_(0);
      mine(0);
      check(cudaDeviceSynchronize(), "indexer check run");
      const bool inf_ok = torch::equal(torch::isinf(out), visible.logical_not());
      note = "rel-Frobenius vs peer " + fmt("%.2e", rel(out, pout)) +
             (inf_ok ? ", -inf exactly outside the mask" : ", -inf PATTERN WRONG");
      if (kern == IK::Mma)
        ref_mma = out.clone();
      else
        note += ", max |this - mma| " +
                fmt("%.2e", (out - ref_mma).abs().nan_to_num(0, 0, 0).max().item<double>());
    }
    row("indexer_scores", name, t, flops, note);
    std::printf("indexer %s done (%.3f ms)\n", name, t);
    std::fflush(stdout);
  }
  row("indexer_scores", "ATen matmul (bf16 logits) + relu + *w + sum, full product", t_peer, flops,
      "peer (computes all s_q·s_kv pairs; TFLOP/s on visible pairs)");
  const double tbp = median_ms(peer_bwd, 1, 3);
  peer_bwd(0);
  check(cudaDeviceSynchronize(), "indexer backward peer");
  using BK = dsa::cuda::IndexerBwdKernel;
  const std::pair<BK, const char*> bwd_kernels[] = {
      {BK::Mma, "dsa cuda mma.sync (dq/dw + dk kernels, G in 3 bf16 parts)"},
      {BK::Wgmma, "dsa cuda wgmma (S m64n64, G·k / Gᵀ·q m64n128 with G as register A, 3 bf16 parts)"},
      {BK::ProbeDqOnly, "probe: wgmma, dq/dw kernel only (dk not written)"},
      {BK::ProbeDkOnly, "probe: wgmma, dk kernel only (dq/dw not written)"},
      {BK::ProbeNoGradProducts, "probe: wgmma without the G products (not valid gradients)"},
      {BK::WgmmaFactored, "dsa cuda wgmma, w factored out of dq's key sum, split on bf16x2 pairs"},
      {BK::ProbeFactoredDqOnly, "probe: wgmma factored, dq/dw kernel only (dk not written)"},
      {BK::ProbeFactoredDkOnly, "probe: wgmma factored, dk kernel only (dq/dw not written)"},
      {BK::WgmmaOverlap, "dsa cuda wgmma factored, epilogue per k16 step overlapping the previous tile's G products"},
      {BK::ProbeOverlapDqOnly, "probe: wgmma overlap, dq/dw kernel only (dk not written)"},
      {BK::ProbeOverlapDkOnly, "probe: wgmma overlap, dk kernel only (dq/dw not written)"}};
  torch::Tensor mma_dq, mma_dk, mma_dw, wg_dq, wg_dk, wg_dw, fa_dq, fa_dk, fa_dw;
  for (const auto& [kern, name] : bwd_kernels) {
    bwd_kernel = kern;
    const double tb = median_ms(mine_bwd, 2, 7);
    std::string note = "timing probe";
    if (kern == BK::Mma || kern == BK::Wgmma || kern == BK::WgmmaFactored ||
        kern == BK::WgmmaOverlap) {
      dq.fill_(0);
      dk.fill_(0);
      dw.fill_(0);
      mine_bwd(0);
      check(cudaDeviceSynchronize(), "indexer backward");
      note = "rel-Frobenius vs peer: dq " + fmt("%.2e", rel(dq, pdq)) + ", dk " +
             fmt("%.2e", rel(dk, pdk)) + ", dw " + fmt("%.2e", rel(dw, pdw));
      if (kern == BK::Mma) {
        mma_dq = dq.clone(), mma_dk = dk.clone(), mma_dw = dw.clone();
      } else if (kern == BK::WgmmaOverlap) {
        note += "; vs wgmma factored: max |diff| dq " +
                fmt("%.1e", (dq.to(torch::kFloat32) - fa_dq.to(torch::kFloat32)).abs().max().item<double>()) +
                ", dk " +
                fmt("%.1e", (dk.to(torch::kFloat32) - fa_dk.to(torch::kFloat32)).abs().max().item<double>()) +
                ", dw " + fmt("%.1e", (dw - fa_dw).abs().max().item<double>()) + "; peer / this " +
                fmt("%.2f", tbp / tb) + "x";
      } else if (kern == BK::WgmmaFactored) {
        fa_dq = dq.clone(), fa_dk = dk.clone(), fa_dw = dw.clone();
        note += "; vs wgmma: dq " + fmt("%.2e", rel(dq, wg_dq)) + ", dk " +
                fmt("%.2e", rel(dk, wg_dk)) + ", dw " + fmt("%.2e", rel(dw, wg_dw)) +
                " (dk, dw max |diff| " +
                fmt("%.1e", std::max((dk.to(torch::kFloat32) - wg_dk.to(torch::kFloat32)).abs().max().item<double>(),
                                     (dw - wg_dw).abs().max().item<double>())) +
                "); peer / this " + fmt("%.2f", tbp / tb) + "x";
      } else {
        wg_dq = dq.clone(), wg_dk = dk.clone(), wg_dw = dw.clone();
        note += "; vs mma.sync: dq " + fmt("%.2e", rel(dq, mma_dq)) + ", dk " +
                fmt("%.2e", rel(dk, mma_dk)) + ", dw " + fmt("%.2e", rel(dw, mma_dw)) +
                "; peer / this " + fmt("%.2f", tbp / tb) + "x";
      }
    }
    row("indexer_scores_backward", name, tb, 3 * flops, note);
    std::printf("indexer backward %s done (%.3f ms)\n", name, tb);
    std::fflush(stdout);
  }
  row("indexer_scores_backward", "ATen (bf16 logits, bf16 G, 3 matmuls)", tbp, 3 * flops, "peer");
}


// (d) sparse MLA backward (SPEC §5) at s_q 1024, h_q 128, d_qk 576, d_v 512, k 2048, s_kv 8192,
// every slot valid: sparse_mla_backward_device (deterministic and fast; P / dS rounded once to
// bf16 and as hi + lo pairs; timing variants of the fast Bf16 kernel that leave S / dP, dq,
// dkv or its atomics out, results wrong) from the one-pass forward's out and lse, against the same backward composed from ATen ops (index_select, bmm
// with bf16 operands and fp32 accumulation, exp, index_add_ of fp32 dkv rows). TFLOP/s count
// 2.5x the forward's 2·s_q·h_q·k·(d_qk+d_v) (issue 16). Errors are caught and written to the
// table (this section runs last, after the table so far has been written).
void bench_mla_backward(std::ostringstream& table) {
  const int64_t s_q = 1024, h_q = 128, d_qk = 576, d_v = 512, s_kv = 8192, k = 2048;
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(d_qk));
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  const auto i32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kInt32);
  const auto u8 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8);
  const std::string shape = "s_q 1024, h_q 128, d_qk 576, d_v 512, k 2048, s_kv 8192";
  const double flops = 2.5 * 2.0 * s_q * h_q * k * (d_qk + d_v);
  auto row = [&](const std::string& impl, double t, const std::string& note) {
    const double tf = flops / (t * 1e-3) / 1e12;
    table << "| sparse_mla_bwd | " << shape << " | " << impl << " | " << fmt("%.3f", t) << " | "
          << fmt("%.1f", tf) << " | " << fmt("%.1f%%", 100.0 * tf / kBf16Tflops) << " | - | - | "
          << note << " |\n";
  };
  try {
    auto q = torch::randn({s_q, h_q, d_qk}, f32).to(torch::kBFloat16);
    auto kv = torch::randn({s_kv, d_qk}, f32).to(torch::kBFloat16);
    auto idx = torch::randint(0, s_kv, {s_q, k}, i32);
    auto dout = torch::randn({s_q, h_q, d_v}, f32).to(torch::kBFloat16);
    auto out = torch::empty({s_q, h_q, d_v}, q.options());
    auto lse = torch::empty({s_q, h_q}, f32);
    auto mx = torch::empty({s_q, h_q}, f32);
    const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr());
    const auto* kvp = reinterpret_cast<const uint16_t*>(kv.data_ptr());
    dsa::cuda::sparse_mla_forward_device(qp, kvp, idx.data_ptr<int32_t>(), nullptr, nullptr, s_q,
                                         h_q, d_qk, s_kv, k, d_v, sm_scale,
                                         reinterpret_cast<uint16_t*>(out.data_ptr()),
                                         lse.data_ptr<float>(), mx.data_ptr<float>(), nullptr,
                                         dsa::cuda::SparseMlaKernel::OnePassWgmma);
    check(cudaDeviceSynchronize(), "backward bench forward");
    auto dq = torch::empty({s_q, h_q, d_qk}, f32);
    auto dkv = torch::empty({s_kv, d_qk}, f32);
    dsa::cuda::SparseMlaBwdMode mode = dsa::cuda::SparseMlaBwdMode::Deterministic;
    dsa::cuda::SparseMlaBwdRounding rounding = dsa::cuda::SparseMlaBwdRounding::Bf16;
    const size_t scratch_bytes = std::max(
        dsa::cuda::sparse_mla_backward_scratch_bytes(s_q, h_q, d_qk, s_kv, k,
                                                     dsa::cuda::SparseMlaBwdMode::Deterministic),
        dsa::cuda::sparse_mla_backward_scratch_bytes(s_q, h_q, d_qk, s_kv, k,
                                                     dsa::cuda::SparseMlaBwdMode::Fast));
    auto scratch = torch::empty({static_cast<int64_t>(scratch_bytes)}, u8);
    auto mine = [&](int) {
      dsa::cuda::sparse_mla_backward_device(
          qp, kvp, idx.data_ptr<int32_t>(), nullptr, nullptr,
          reinterpret_cast<const uint16_t*>(out.data_ptr()), lse.data_ptr<float>(),
          reinterpret_cast<const uint16_t*>(dout.data_ptr()), s_q, h_q, d_qk, s_kv, k, d_v,
          sm_scale, dq.data_ptr<float>(), dkv.data_ptr<float>(), nullptr, scratch.data_ptr(),
          nullptr, mode, rounding);
    };
    torch::Tensor pdq, pdkv;
    auto peer = [&](int) {
      const auto ids = idx.to(torch::kLong).view({-1});
      auto kvg = kv.index_select(0, ids).view({s_q, k, d_qk});
      auto logits = torch::bmm(q, kvg.transpose(1, 2)).to(torch::kFloat32).mul_(sm_scale);
      auto p = (logits - lse.unsqueeze(-1)).exp_();
      auto dp = torch::bmm(dout, kvg.narrow(2, 0, d_v).transpose(1, 2)).to(torch::kFloat32);
      auto delta = (out.to(torch::kFloat32) * dout.to(torch::kFloat32)).sum(-1, true);
      auto ds = (p * (dp - delta)).mul_(sm_scale).to(torch::kBFloat16);  // [s_q, h_q, k]
      pdq = torch::bmm(ds, kvg).to(torch::kFloat32);
      auto dkvg = torch::bmm(ds.transpose(1, 2), q).to(torch::kFloat32);  // [s_q, k, d_qk]
      dkvg.narrow(2, 0, d_v).add_(
          torch::bmm(p.to(torch::kBFloat16).transpose(1, 2), dout).to(torch::kFloat32));
      pdkv = torch::zeros({s_kv, d_qk}, f32).index_add_(0, ids, dkvg.view({-1, d_qk}));
    };
    const double t_peer = median_ms(peer, 1, 5);
    peer(0);
    check(cudaDeviceSynchronize(), "backward peer check run");
    auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
      return ((a - b).norm() / b.norm()).item<double>();
    };
    // Both roundings of P / dS (Bf16: once, the default; HiLo: hi + lo pairs, sessions 9-11),
    // fast then deterministic each.
    double t_fast_hilo = 0;
    for (const auto rd : {dsa::cuda::SparseMlaBwdRounding::Bf16, dsa::cuda::SparseMlaBwdRounding::HiLo}) {
      rounding = rd;
      const bool hilo = rd == dsa::cuda::SparseMlaBwdRounding::HiLo;
      const std::string pds = hilo ? "P/dS bf16 hi+lo" : "P/dS rounded once to bf16";
      mode = dsa::cuda::SparseMlaBwdMode::Fast;
      const double t_fast = median_ms(mine, 1, 5);
      mine(0);
      check(cudaDeviceSynchronize(), "backward fast check run");
      const double fast_dq = rel(dq, pdq), fast_dkv = rel(dkv, pdkv);
      const auto dkv_fast = dkv.clone();
      mode = dsa::cuda::SparseMlaBwdMode::Deterministic;
      const double t_det = median_ms(mine, 1, 5);
      mine(0);
      check(cudaDeviceSynchronize(), "backward deterministic check run");
      const auto dq1 = dq.clone(), dkv1 = dkv.clone();
      mine(0);
      check(cudaDeviceSynchronize(), "backward deterministic second run");
      const bool same = torch::equal(dq, dq1) && torch::equal(dkv, dkv1);
      if (hilo) t_fast_hilo = t_fast;
      row("dsa cuda backward, deterministic (mma.sync, " + pds +
              "; dkv rows reduced per key over a sorted pair list)",
          t_det,
          "dq rel-Frobenius vs peer " + fmt("%.2e", rel(dq, pdq)) + ", dkv " +
              fmt("%.2e", rel(dkv, pdkv)) + ", two runs " + (same ? "bitwise equal" : "DIFFER") +
              ", " + fmt("%.2fx", t_det / t_fast) + " the fast mode's time");
      row(std::string("dsa cuda backward, fast (mma.sync, ") + pds +
              (hilo ? "; fp32 atomicAdd dkv)"
                    : "; one pass for S and dP; dkv by 16-byte red.global.add.v4.f32; "
                      "staggered products; L2 policies)"),
          t_fast,
          "dq rel-Frobenius vs peer " + fmt("%.2e", fast_dq) + ", dkv " + fmt("%.2e", fast_dkv) +
              ", dkv vs deterministic " + fmt("%.2e", rel(dkv_fast, dkv)));
      std::printf("sparse_mla_bwd %s done (deterministic %.3f ms, fast %.3f ms)\n", pds.c_str(),
                  t_det, t_fast);
      std::fflush(stdout);
    }
    // The fast Bf16 kernel without one or both of its speed options (same arithmetic: dq
    // bitwise and dkv to the order of the fp32 adds equal to the deterministic Bf16 mode's).
    rounding = dsa::cuda::SparseMlaBwdRounding::Bf16;
    mode = dsa::cuda::SparseMlaBwdMode::Deterministic;
    mine(0);
    check(cudaDeviceSynchronize(), "backward deterministic Bf16 reference run");
    const auto dkv_det = dkv.clone(), dq_det = dq.clone();
    const std::pair<int, const char*> options[] = {
        {64, "without its speed options (no staggered products, no L2 policies)"},
        {16, "staggered products only (no L2 policies)"},
        {32, "L2 policies only (no staggered products)"}};
    for (const auto& [v, what] : options) {
      auto variant = [&, v = v](int) {
        dsa::cuda::detail::sparse_mla_backward_timing_variant(
            v, qp, kvp, idx.data_ptr<int32_t>(), reinterpret_cast<const uint16_t*>(out.data_ptr()),
            lse.data_ptr<float>(), reinterpret_cast<const uint16_t*>(dout.data_ptr()), s_q, h_q,
            d_qk, s_kv, k, d_v, sm_scale, dq.data_ptr<float>(), dkv.data_ptr<float>(), nullptr);
      };
      const double t = median_ms(variant, 1, 5);
      variant(0);
      check(cudaDeviceSynchronize(), "backward option check run");
      row(std::string("dsa cuda backward, fast (mma.sync, P/dS once; v4 reductions), ") + what,
          t,
          "dq " + std::string(torch::equal(dq, dq_det) ? "bitwise equal to" : "DIFFERS from") +
              " the deterministic mode's, dkv vs deterministic " + fmt("%.2e", rel(dkv, dkv_det)));
    }
    // Timing variants of the fast Bf16 kernel (results wrong; where the time goes).
    const std::pair<int, const char*> variants[] = {{1, "no S = Q K^T and dP = dout V^T products"},
                                                    {2, "no dq product"},
                                                    {4, "no dkv product (and no dkv stores)"},
                                                    {8, "no dkv stores (atomics)"}};
    for (const auto& [v, what] : variants) {
      auto variant = [&, v = v](int) {
        dsa::cuda::detail::sparse_mla_backward_timing_variant(
            v, qp, kvp, idx.data_ptr<int32_t>(), reinterpret_cast<const uint16_t*>(out.data_ptr()),
            lse.data_ptr<float>(), reinterpret_cast<const uint16_t*>(dout.data_ptr()), s_q, h_q,
            d_qk, s_kv, k, d_v, sm_scale, dq.data_ptr<float>(), dkv.data_ptr<float>(), nullptr);
      };
      row(std::string("timing variant of the fast backward (P/dS once), results wrong: ") + what,
          median_ms(variant, 1, 5), "timing only");
    }
    row("ATen gathered backward (index_select+bmm, bf16 dS/P, index_add_ fp32)", t_peer, "peer");
    std::printf("sparse_mla_bwd done (fast hi+lo %.3f ms, peer %.3f ms)\n", t_fast_hilo, t_peer);
  } catch (const std::exception& e) {
    table << "| sparse_mla_bwd | " << shape << " | - | - | - | - | - | - | ERROR: "
          << std::string(e.what()).substr(0, 300) << " |\n";
    std::printf("sparse_mla_bwd failed: %s\n", e.what());
  }
  std::fflush(stdout);
}
}  // namespace

int main() {
  if (!torch::cuda::is_available() || dsa::cuda::device_count() == 0) {
    std::printf("dsa_gpu_bench: no CUDA device, nothing measured\n");
    return 0;
  }
  torch::NoGradGuard no_grad;
  torch::manual_seed(1234);
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const auto i32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kInt32);
  std::ostringstream table;
  table << "card: " << prop.name << ", " << prop.multiProcessorCount << " SMs, L2 "
        << prop.l2CacheSize / (1 << 20) << " MiB\n\n";
  table << "| op | shape | impl | median ms | speed-up vs torch::topk (same sortedness) | effective GB/s | % of 4.3 TB/s | check |\n";
  table << "|---|---|---|---|---|---|---|---|\n";

  // (a) top-k, k 2048, against torch::topk (sorted and unsorted) on the same inputs.
  const int64_t k = 2048;
  const int64_t shapes[][2] = {{128, 131072}, {4096, 32768}, {4096, 131072}, {4096, 4096}};
  const bool indexer_only = std::getenv("DSA_BENCH_INDEXER_ONLY") != nullptr;  // (c) alone
  const bool bwd_only = std::getenv("DSA_BENCH_SMLA_BWD_ONLY") != nullptr;     // (d) alone
  for (const auto& sh : shapes) {
    if (std::getenv("DSA_BENCH_MLA_ONLY") || indexer_only || bwd_only) break;  // not (a)
    const int64_t s_q = sh[0], s_kv = sh[1];
    const double in_bytes = 4.0 * s_q * s_kv;
    const int r = rotations(in_bytes);
    std::vector<torch::Tensor> x;
    for (int i = 0; i < r; ++i) x.push_back(torch::randn({s_q, s_kv}, f32));
    auto out = torch::empty({s_q, k}, i32);
    auto scratch = torch::empty(
        {static_cast<int64_t>(std::max<size_t>(8, dsa::cuda::topk_scratch_bytes(s_q, s_kv, k)))},
        torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8));
    dsa::TopkPolicy policy{dsa::TieBreak::Small, true};
    dsa::cuda::TopkKernel variant = dsa::cuda::TopkKernel::Radix;
    auto mine = [&](int i) {
      dsa::cuda::select_topk_device(x[i % r].data_ptr<float>(), s_q, s_kv, k, nullptr, nullptr,
                                    policy, out.data_ptr<int32_t>(), scratch.data_ptr(), nullptr,
                                    variant);
    };
    torch::Tensor pv, pi;
    bool peer_sorted = true;
    auto peer = [&](int i) { std::tie(pv, pi) = torch::topk(x[i % r], k, 1, true, peer_sorted); };
    const int iters = in_bytes > 1e9 ? 9 : 21;
    const int batch = in_bytes > 1e9 ? 1 : 10;  // short kernels: time 10 calls per sample
    const double t_peer_unsorted = (peer_sorted = false, median_ms(peer, 3, iters, batch));
    const double t_peer = (peer_sorted = true, median_ms(peer, 3, iters, batch));
    peer(0);  // sorted ids of input 0 (random normal: ties unlikely)
    check(cudaDeviceSynchronize(), "peer check run");
    const auto peer_set = std::get<0>(pi.sort(1));
    const double bytes = in_bytes + 4.0 * s_q * k;
    const std::string shape = "[" + std::to_string(s_q) + ", " + std::to_string(s_kv) + "], k 2048";
    auto row = [&](const std::string& impl, double t, double t_ref, const std::string& note) {
      const double gbs = bytes / (t * 1e-3) / 1e9;
      table << "| topk | " << shape << " | " << impl << " | " << fmt("%.4f", t) << " | "
            << (t_ref > 0 ? fmt("%.2fx", t_ref / t) : std::string("-")) << " | "
            << fmt("%.0f", gbs) << " | " << fmt("%.1f%%", 100.0 * gbs / (kCopyTBs * 1e3)) << " | "
            << note << " |\n";
    };
    struct Variant {
      dsa::cuda::TopkKernel kernel;
      bool sorted;
      const char* name;
    };
    const Variant variants[] = {
        {dsa::cuda::TopkKernel::Cluster, true, "dsa cuda cluster + row sort kernel, sorted, small"},
        {dsa::cuda::TopkKernel::ClusterFusedSort, true, "dsa cuda cluster, fused sort (round 2), sorted, small"},
        {dsa::cuda::TopkKernel::Cluster, false, "dsa cuda cluster, unsorted, small"},
        {dsa::cuda::TopkKernel::Persistent, true, "dsa cuda persistent + row sort kernel, sorted, small"},
        {dsa::cuda::TopkKernel::Persistent, false, "dsa cuda persistent, unsorted, small"},
        {dsa::cuda::TopkKernel::PersistentWide, true, "dsa cuda persistent wide (16-CTA) + row sort kernel, sorted, small"},
        {dsa::cuda::TopkKernel::PersistentWide, false, "dsa cuda persistent wide (16-CTA), unsorted, small"},
        {dsa::cuda::TopkKernel::TwoRead, false, "dsa cuda two-read, unsorted, small"},
        {dsa::cuda::TopkKernel::Radix, true, "dsa cuda radix (5 reads), sorted, small"},
    };
    struct Result {
      const Variant* v;
      double t;
      int64_t mism;
    };
    std::vector<Result> results;
    double t_cluster = 0;
    for (const Variant& v : variants) {
      // A failing variant is recorded as an error; the others are still measured (a sticky
      // CUDA error ends every later measurement the same way, with the table kept).
      try {
        variant = v.kernel;
        policy.sorted = v.sorted;
        const double t_mine = median_ms(mine, 3, iters, batch);
        out.fill_(-7);
        mine(0);
        check(cudaDeviceSynchronize(), "check run");
        const auto ids = out.to(torch::kLong);
        const int64_t mism = v.sorted ? (ids != pi).sum().item<int64_t>()
                                      : (std::get<0>(ids.sort(1)) != peer_set).sum().item<int64_t>();
        results.push_back({&v, t_mine, mism});
        if (v.kernel == dsa::cuda::TopkKernel::Cluster && v.sorted) t_cluster = t_mine;
      } catch (const std::exception& e) {
        std::printf("topk variant '%s' failed: %s\n", v.name, e.what());
        results.push_back({&v, -1.0, -1});
      }
    }
    // The peer again after our kernels (its timing can differ from one measurement to the
    // next); speed-ups use the faster of its two medians.
    double t_peer_unsorted2 = t_peer_unsorted, t_peer2 = t_peer;
    try {
      t_peer_unsorted2 = (peer_sorted = false, median_ms(peer, 3, iters, batch));
      t_peer2 = (peer_sorted = true, median_ms(peer, 3, iters, batch));
    } catch (const std::exception& e) {
      std::printf("torch::topk after our kernels failed: %s\n", e.what());
    }
    const double ref_sorted = std::min(t_peer, t_peer2);
    const double ref_unsorted = std::min(t_peer_unsorted, t_peer_unsorted2);
    for (const Result& res : results) {
      if (res.t < 0) {
        table << "| topk | " << shape << " | " << res.v->name << " | error | - | - | - | see bench.txt |\n";
        continue;
      }
      row(res.v->name, res.t, res.v->sorted ? ref_sorted : ref_unsorted,
          std::to_string(res.mism) + " of " + std::to_string(s_q * k) +
              (res.v->sorted ? " ids differ from torch::topk sorted"
                             : " ids differ from torch::topk's set"));
    }
    row("torch::topk sorted (values + int64 ids)", ref_sorted, 0,
        "peer (medians " + fmt("%.4f", t_peer) + " before, " + fmt("%.4f", t_peer2) + " after)");
    row("torch::topk unsorted (values + int64 ids)", ref_unsorted, 0,
        "peer (medians " + fmt("%.4f", t_peer_unsorted) + " before, " +
            fmt("%.4f", t_peer_unsorted2) + " after)");
    std::printf("topk [%lld, %lld] done (cluster sorted %.4f ms vs torch %.4f ms)\n",
                (long long)s_q, (long long)s_kv, t_cluster, t_peer);
    std::fflush(stdout);
    if (const char* o = std::getenv("OUT")) {  // the table so far (a later fault keeps it)
      std::ofstream f(std::string(o) + "/gpu_bench.md");
      f << table.str();
    }
  }
  table << "\n| op | shape | impl | median ms | TFLOP/s | % of 790 TFLOP/s | GB/s | % of 4.3 TB/s | check |\n";
  table << "|---|---|---|---|---|---|---|---|---|\n";

  // (b) sparse MLA forward, every slot valid (the peer has no masking), at h_q 64 and 128,
  // s_kv 8192 and 32768. DSA_BENCH_TOPK_ONLY=1 leaves it out; DSA_BENCH_MLA_CUDA_CORE=1 adds
  // the CUDA-core kernel (slow).
  if (!std::getenv("DSA_BENCH_TOPK_ONLY") && !indexer_only && !bwd_only) {
    const int64_t shapes_mla[][2] = {{64, 8192}, {128, 8192}, {128, 32768}};  // {h_q, s_kv}
    for (const auto& sh : shapes_mla) {
      const int64_t s_q = 4096, h_q = sh[0], d_qk = 576, d_v = 512, s_kv = sh[1];
      const float sm_scale = 1.0f / std::sqrt(static_cast<float>(d_qk));
      const double set_bytes = 2.0 * s_q * h_q * d_qk + 4.0 * s_q * k;
      const int r = rotations(set_bytes);
      std::vector<torch::Tensor> q, idx;
      for (int i = 0; i < r; ++i) {
        q.push_back(torch::randn({s_q, h_q, d_qk}, f32).to(torch::kBFloat16));
        idx.push_back(torch::randint(0, s_kv, {s_q, k}, i32));
      }
      auto kv = torch::randn({s_kv, d_qk}, f32).to(torch::kBFloat16);
      auto out = torch::empty({s_q, h_q, d_v}, bf16);
      auto lse = torch::empty({s_q, h_q}, f32);
      auto mx = torch::empty({s_q, h_q}, f32);
      dsa::cuda::SparseMlaKernel kernel = dsa::cuda::SparseMlaKernel::OnePass;
      auto mine = [&](int i) {
        dsa::cuda::sparse_mla_forward_device(
            reinterpret_cast<const uint16_t*>(q[i % r].data_ptr()),
            reinterpret_cast<const uint16_t*>(kv.data_ptr()), idx[i % r].data_ptr<int32_t>(),
            nullptr, nullptr, s_q, h_q, d_qk, s_kv, k, d_v, sm_scale,
            reinterpret_cast<uint16_t*>(out.data_ptr()), lse.data_ptr<float>(),
            mx.data_ptr<float>(), nullptr, kernel);
      };
      torch::Tensor pout, plse;
      auto peer = [&](int i) {
        auto kvg = kv.index_select(0, idx[i % r].to(torch::kLong).view({-1})).view({s_q, k, d_qk});
        auto logits = torch::bmm(q[i % r], kvg.transpose(1, 2)).to(torch::kFloat32).mul_(sm_scale);
        plse = logits.logsumexp(-1);
        auto p = (logits - plse.unsqueeze(-1)).exp_().to(torch::kBFloat16);
        pout = torch::bmm(p, kvg.narrow(2, 0, d_v));
      };
      const double flops = 2.0 * s_q * h_q * k * (d_qk + d_v);
      const double t_peer = median_ms(peer, 2, 7);
      peer(0);
      check(cudaDeviceSynchronize(), "peer check run");
      const std::string shape = "s_q 4096, h_q " + std::to_string(h_q) +
                                ", d_qk 576, d_v 512, k 2048, s_kv " + std::to_string(s_kv);
      auto row = [&](const std::string& impl, double t, const std::string& note) {
        const double tf = flops / (t * 1e-3) / 1e12;
        table << "| sparse_mla_fwd | " << shape << " | " << impl << " | " << fmt("%.3f", t)
              << " | " << fmt("%.1f", tf) << " | " << fmt("%.1f%%", 100.0 * tf / kBf16Tflops)
              << " | - | - | " << note << " |\n";
      };
      std::vector<dsa::cuda::SparseMlaKernel> kernels = {dsa::cuda::SparseMlaKernel::OnePassWgmmaOwnHalfFirst,
                                                         dsa::cuda::SparseMlaKernel::OnePassWgmmaSplitD,
                                                         dsa::cuda::SparseMlaKernel::OnePassWgmma,
                                                         dsa::cuda::SparseMlaKernel::OnePass,
                                                         dsa::cuda::SparseMlaKernel::TensorCore};
      if (std::getenv("DSA_BENCH_MLA_CUDA_CORE")) kernels.push_back(dsa::cuda::SparseMlaKernel::CudaCore);
      for (auto kern : kernels) {
        kernel = kern;
        const double t_mine = median_ms(mine, 2, 7);
        out.fill_(0);
        mine(0);
        check(cudaDeviceSynchronize(), "check run");
        const double rel = ((out.to(torch::kFloat32) - pout.to(torch::kFloat32)).norm() /
                            pout.to(torch::kFloat32).norm()).item<double>();
        const double lse_diff = (lse - plse).abs().max().item<double>();
        const char* name = kern == dsa::cuda::SparseMlaKernel::OnePassWgmmaOwnHalfFirst
                               ? "dsa cuda, one pass (wgmma m64n32 / m64n256, own half of P first, rescale skip)"
                           : kern == dsa::cuda::SparseMlaKernel::OnePassWgmmaSplitD
                               ? "dsa cuda, one pass (wgmma, S split over d_qk m64n64 / P V m64n256, cp.async gather, P bf16)"
                           : kern == dsa::cuda::SparseMlaKernel::OnePassWgmma
                               ? "dsa cuda, one pass (wgmma m64n32 / m64n256, cp.async gather, P bf16)"
                           : kern == dsa::cuda::SparseMlaKernel::OnePass
                               ? "dsa cuda, one pass (mma.sync bf16, cp.async gather, online softmax, P bf16)"
                           : kern == dsa::cuda::SparseMlaKernel::TensorCore
                               ? "dsa cuda, tensor cores (wmma bf16, 2 passes, P hi+lo)"
                               : "dsa cuda, CUDA cores (fp32 FMA)";
        row(name, t_mine,
            "out rel-Frobenius vs peer " + fmt("%.2e", rel) + ", max |lse diff| " + fmt("%.2e", lse_diff));
        std::printf("sparse_mla h_q %lld s_kv %lld %s done (%.3f ms)\n", (long long)h_q,
                    (long long)s_kv, name, t_mine);
        std::fflush(stdout);
      }
      if (h_q == 128 && s_kv == 8192) {
        // Timing variants of the OnePassWgmma kernel (results wrong; where the time goes).
        const char* what[] = {"no gather after the first tile", "no S = Q K^T products",
                              "no P V products"};
        for (int v = 0; v < 3; ++v) {
          auto variant = [&](int i) {
            dsa::cuda::detail::launch_sparse_mla_wgmma(
                s_q, nullptr, reinterpret_cast<const uint16_t*>(q[i % r].data_ptr()),
                reinterpret_cast<const uint16_t*>(kv.data_ptr()), idx[i % r].data_ptr<int32_t>(),
                nullptr, nullptr, h_q, d_qk, s_kv, k, d_v, sm_scale,
                reinterpret_cast<uint16_t*>(out.data_ptr()), lse.data_ptr<float>(),
                mx.data_ptr<float>(), 10 + v);
          };
          row(std::string("timing variant of one pass (wgmma m64n32 / m64n256), results wrong: ") +
                  what[v],
              median_ms(variant, 2, 7), "timing only");
        }
      }
      row("ATen gathered (index_select+bmm+logsumexp+bmm, bf16 logits)", t_peer, "peer");
    }
  }
  if (!std::getenv("DSA_BENCH_TOPK_ONLY") && !std::getenv("DSA_BENCH_MLA_ONLY") && !bwd_only)
    bench_indexer(table);
  auto write_table = [&table] {
    if (const char* o = std::getenv("OUT")) {
      std::ofstream f(std::string(o) + "/gpu_bench.md");
      f << table.str();
    }
  };
  // (d) last, with the table so far written first (a fault there leaves the rest on record).
  if (!std::getenv("DSA_BENCH_TOPK_ONLY") && !indexer_only) {
    write_table();
    bench_mla_backward(table);
  }
  const std::string text = table.str();
  std::printf("\n%s", text.c_str());
  write_table();
  return 0;
}

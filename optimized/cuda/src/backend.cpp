// The `cuda` backend: validates host tensors, copies them to device 0, runs the kernels of
// dsa/cuda/kernels.h and copies the outputs back (SPEC §2, §3, §4, §6).
#include "dsa/cuda/backend.h"

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "dsa/contract/checks.h"
#include "dsa/contract/errors.h"
#include "dsa/cuda/kernels.h"

namespace dsa::cuda {
namespace {

/// Owns one cudaMalloc allocation (none for 0 bytes).
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, const char* where) : bytes_(bytes) {
    if (bytes_) DSA_CUDA_CHECK(where, cudaMalloc(&ptr_, bytes_));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  template <class T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  void upload(const void* src, const char* where) {
    if (bytes_) DSA_CUDA_CHECK(where, cudaMemcpy(ptr_, src, bytes_, cudaMemcpyHostToDevice));
  }
  void download(void* dst, const char* where) const {
    if (bytes_) DSA_CUDA_CHECK(where, cudaMemcpy(dst, ptr_, bytes_, cudaMemcpyDeviceToHost));
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

DeviceBuffer upload(const Tensor& t, const char* where) {
  DeviceBuffer b(t.nbytes(), where);
  b.upload(t.raw(), where);
  return b;
}

struct IndexerShape {
  int64_t s_q, h, d, s_kv, d_pad;  // d_pad: d rounded up to 8 (16-byte rows; zero columns)
};

struct IndexerDevice {
  DeviceBuffer q, k, w, ks, ke;
};

// Rows of `d` 16-bit values into rows of `d_pad` (zero padding: the dot products are unchanged).
std::vector<uint16_t> pad_rows(const Tensor& t, int64_t rows, int64_t d, int64_t d_pad) {
  std::vector<uint16_t> out(static_cast<size_t>(rows * d_pad), 0);
  const auto* src = reinterpret_cast<const uint16_t*>(t.raw());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(&out[static_cast<size_t>(r * d_pad)], src + r * d, sizeof(uint16_t) * d);
  return out;
}

DeviceBuffer upload_vec(const std::vector<uint16_t>& v, const char* where) {
  DeviceBuffer b(sizeof(uint16_t) * v.size(), where);
  b.upload(v.data(), where);
  return b;
}

// Device rows of d_pad values back into the host tensor's rows of d.
void unpad(const DeviceBuffer& b, int64_t rows, int64_t d, int64_t d_pad, Tensor& out,
           const char* where) {
  std::vector<uint16_t> tmp(static_cast<size_t>(rows * d_pad));
  b.download(tmp.data(), where);
  auto* dst = reinterpret_cast<uint16_t*>(out.raw());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * d, &tmp[static_cast<size_t>(r * d_pad)], sizeof(uint16_t) * d);
}

// Device rows of d_pad floats into an F32 host tensor's rows of d: stored (add == false) or
// added to what it holds (add == true, one fp32 add per element).
void accumulate_f32(const DeviceBuffer& b, int64_t rows, int64_t d, int64_t d_pad, Tensor& out,
                    bool add, const char* where) {
  std::vector<float> tmp(static_cast<size_t>(rows * d_pad));
  b.download(tmp.data(), where);
  auto* dst = reinterpret_cast<float*>(out.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) {
      const float v = tmp[static_cast<size_t>(r * d_pad + c)];
      dst[r * d + c] = add ? dst[r * d + c] + v : v;
    }
}

// dout as bf16 tensors whose sum is dout exactly (SPEC §5 backward of a BF16-only kernel):
// BF16 itself; F32 / F16 split into hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid)
// (each difference exact in float64; 3 x 8 significant bits hold every fp32 value down to
// bf16's subnormal range), all-zero parts after the first left out.
std::vector<Tensor> bf16_parts(const Tensor& dout) {
  if (dout.dtype() == DType::BF16) return {dout};
  std::vector<Tensor> parts;
  Tensor rest = dout.to(DType::F64);
  for (int p = 0; p < 3; ++p) {
    Tensor part(DType::BF16, dout.shape());
    bool nonzero = false;
    for (int64_t i = 0; i < rest.numel(); ++i) {
      const double x = rest.get(i);
      part.set(i, x);
      const double hb = part.get(i);
      rest.set(i, x - hb);
      nonzero = nonzero || hb != 0.0;
    }
    if (p == 0 || nonzero) parts.push_back(std::move(part));
  }
  return parts;
}

// SPEC §2 argument checks of the indexer ops; q_idx/k_idx dtypes other than BF16 and w other
// than F32, H_I > 64 and d_I > 128 are NotSupported (kernel limits), bad shapes invalid_argument.
IndexerShape check_indexer(const char* where, const Tensor& q_idx, const Tensor& k_idx,
                           const Tensor& w, const KeyWindows& windows) {
  check_rank(where, "q_idx", q_idx, 3);
  check_rank(where, "k_idx", k_idx, 2);
  check_rank(where, "w", w, 2);
  for (const Tensor* t : {&q_idx, &k_idx})
    if (t->dtype() != DType::BF16 && (t->dtype() == DType::F32 || t->dtype() == DType::F16 ||
                                      t->dtype() == DType::F64))
      throw oracle::NotSupported(std::string(where) + ": " + (t == &q_idx ? "q_idx" : "k_idx") +
                                 " dtype " + dtype_name(t->dtype()) + " not supported (BF16 only)");
  check_dtype(where, "q_idx", q_idx, {DType::BF16});
  check_dtype(where, "k_idx", k_idx, {DType::BF16});
  if (w.dtype() == DType::F64)
    throw oracle::NotSupported(std::string(where) + ": w dtype F64 not supported (F32 only)");
  check_dtype(where, "w", w, {DType::F32});
  IndexerShape s{q_idx.size(0), q_idx.size(1), q_idx.size(2), k_idx.size(0), 0};
  check_shape(where, "k_idx", k_idx, {-1, s.d});
  check_shape(where, "w", w, {s.s_q, s.h});
  check_arg(windows.s_q() == s.s_q && static_cast<int64_t>(windows.ke.size()) == s.s_q, where,
            "windows", "s_q=" + str(windows.s_q()), "s_q=" + str(s.s_q));
  check_arg(windows.s_kv == s.s_kv, where, "windows", "s_kv=" + str(windows.s_kv),
            "s_kv=" + str(s.s_kv));
  if (s.h > indexer_max_heads() || s.d > indexer_max_dim())
    throw oracle::NotSupported(std::string(where) + ": H_I=" + str(s.h) + ", d_I=" + str(s.d) +
                               " not supported (cuda kernel limits H_I <= " +
                               str(indexer_max_heads()) + ", d_I <= " + str(indexer_max_dim()) + ")");
  check_arg(s.s_q <= INT32_MAX && s.s_kv <= INT32_MAX - 128, where, "q_idx/k_idx",
            "s_q=" + str(s.s_q) + " s_kv=" + str(s.s_kv), "s_q <= 2^31-1, s_kv <= 2^31-129");
  s.d_pad = (s.d + 7) / 8 * 8;
  return s;
}

IndexerDevice upload_indexer(const char* where, const IndexerShape& s, const Tensor& q_idx,
                             const Tensor& k_idx, const Tensor& w, const KeyWindows& windows) {
  IndexerDevice dev{upload_vec(pad_rows(q_idx, s.s_q * s.h, s.d, s.d_pad), where),
                    upload_vec(pad_rows(k_idx, s.s_kv, s.d, s.d_pad), where), upload(w, where),
                    DeviceBuffer(sizeof(int64_t) * s.s_q, where),
                    DeviceBuffer(sizeof(int64_t) * s.s_q, where)};
  dev.ks.upload(windows.ks.data(), where);
  dev.ke.upload(windows.ke.data(), where);
  return dev;
}

struct MlaDims {
  int64_t s_q, h_q, d_qk, s_kv, k;
  Tensor sink32;  // attn_sink as F32 (undefined without a sink)
};

// SPEC §4 argument checks of the sparse MLA ops (shared by forward and backward): q/kv BF16
// (F32/F16/F64 NotSupported), indices I32 [s_q,k] or [s_q,1,k], topk_length I32 [s_q],
// attn_sink F32/F64 [h_q], finite sm_scale, 0 < d_v <= d_qk, the forward kernel's limits.
MlaDims check_mla(const char* where, const SparseMlaInputs& in) {
  check_rank(where, "q", in.q, 3);
  check_rank(where, "kv", in.kv, 2);
  for (const Tensor* t : {&in.q, &in.kv})
    if (t->dtype() == DType::F32 || t->dtype() == DType::F16 || t->dtype() == DType::F64)
      throw oracle::NotSupported(std::string(where) + ": " + (t == &in.q ? "q" : "kv") +
                                 " dtype " + dtype_name(t->dtype()) +
                                 " not supported (BF16 only)");
  check_dtype(where, "q", in.q, {DType::BF16});
  check_dtype(where, "kv", in.kv, {DType::BF16});
  const int64_t s_q = in.q.size(0), h_q = in.q.size(1), d_qk = in.q.size(2);
  const int64_t s_kv = in.kv.size(0);
  check_shape(where, "kv", in.kv, {-1, d_qk});
  check_dtype(where, "indices", in.indices, {DType::I32});
  int64_t k = 0;
  if (in.indices.dim() == 3) {
    check_shape(where, "indices", in.indices, {s_q, 1, -1});
    k = in.indices.size(2);
  } else {
    check_rank(where, "indices", in.indices, 2);
    check_shape(where, "indices", in.indices, {s_q, -1});
    k = in.indices.size(1);
  }
  if (in.topk_length) {
    check_dtype(where, "topk_length", *in.topk_length, {DType::I32});
    check_shape(where, "topk_length", *in.topk_length, {s_q});
  }
  Tensor sink32;
  if (in.attn_sink) {
    check_dtype(where, "attn_sink", *in.attn_sink, {DType::F32, DType::F64});
    check_shape(where, "attn_sink", *in.attn_sink, {h_q});
    sink32 = in.attn_sink->to(DType::F32);
  }
  check_arg(std::isfinite(in.sm_scale), where, "sm_scale", str(in.sm_scale), "a finite value");
  check_arg(in.d_v > 0 && in.d_v <= d_qk, where, "d_v", str(in.d_v),
            "0 < d_v <= d_qk = " + str(d_qk));
  check_arg(d_qk <= sparse_mla_max_d_qk(), where, "q", shape_str(in.q.shape()),
            "d_qk <= " + str(sparse_mla_max_d_qk()) + " (cuda kernel limit)");
  check_arg(in.d_v <= sparse_mla_max_d_v(), where, "d_v", str(in.d_v),
            "d_v <= " + str(sparse_mla_max_d_v()) + " (cuda kernel limit)");
  return MlaDims{s_q, h_q, d_qk, s_kv, k, sink32};
}

class CudaBackend final : public oracle::Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}
  std::string name() const override { return "cuda"; }
  std::string unavailable_reason() const override {
    return device_count() > 0 ? std::string() : std::string("no CUDA device");
  }
  bool deterministic() const override { return options_.mla_bwd != SparseMlaBwdPath::KernelFast; }
  bool supports(oracle::Op op) const override {
    return op == oracle::Op::Topk || op == oracle::Op::SparseMlaFwd ||
           op == oracle::Op::IndexerScores || op == oracle::Op::IndexerScoresBackward ||
           (op == oracle::Op::SparseMlaBwd && options_.mla_bwd != SparseMlaBwdPath::Fallback);
  }

  Tensor indexer_scores(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                        const KeyWindows& windows) override {
    const char* where = "cuda indexer_scores";
    const IndexerShape s = check_indexer(where, q_idx, k_idx, w, windows);
    require_device(where);
    Tensor out(DType::F32, {s.s_q, s.s_kv});
    if (s.s_q == 0 || s.s_kv == 0) return out;
    const IndexerDevice dev = upload_indexer(where, s, q_idx, k_idx, w, windows);
    DeviceBuffer d_out(out.nbytes(), where);
    indexer_scores_device(dev.q.get<uint16_t>(), dev.k.get<uint16_t>(), dev.w.get<float>(),
                          dev.ks.get<int64_t>(), dev.ke.get<int64_t>(), s.s_q, s.h, s.d_pad,
                          s.s_kv, d_out.get<float>(), nullptr, options_.indexer_kernel);
    DSA_CUDA_CHECK(where, cudaDeviceSynchronize());
    d_out.download(out.raw(), where);
    return out;
  }

  IndexerGrads indexer_scores_backward(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                       const KeyWindows& windows,
                                       const Tensor& d_scores) override {
    const char* where = "cuda indexer_scores_backward";
    const IndexerShape s = check_indexer(where, q_idx, k_idx, w, windows);
    check_rank(where, "d_scores", d_scores, 2);
    if (d_scores.dtype() == DType::F64)
      throw oracle::NotSupported(std::string(where) + ": d_scores dtype F64 not supported (F32 only)");
    check_dtype(where, "d_scores", d_scores, {DType::F32});
    check_shape(where, "d_scores", d_scores, {s.s_q, s.s_kv});
    require_device(where);
    IndexerGrads g{Tensor(DType::BF16, {s.s_q, s.h, s.d}), Tensor(DType::BF16, {s.s_kv, s.d}),
                   Tensor(DType::F32, {s.s_q, s.h})};
    const IndexerDevice dev = upload_indexer(where, s, q_idx, k_idx, w, windows);
    DeviceBuffer d_ds = upload(d_scores, where);
    DeviceBuffer d_dq(sizeof(uint16_t) * s.s_q * s.h * s.d_pad, where);
    DeviceBuffer d_dk(sizeof(uint16_t) * s.s_kv * s.d_pad, where);
    DeviceBuffer d_dw(g.dw.nbytes(), where);
    indexer_scores_backward_device(dev.q.get<uint16_t>(), dev.k.get<uint16_t>(), dev.w.get<float>(),
                                   dev.ks.get<int64_t>(), dev.ke.get<int64_t>(),
                                   d_ds.get<float>(), s.s_q, s.h, s.d_pad, s.s_kv,
                                   d_dq.get<uint16_t>(), d_dk.get<uint16_t>(), d_dw.get<float>(),
                                   nullptr, options_.indexer_bwd_kernel);
    DSA_CUDA_CHECK(where, cudaDeviceSynchronize());
    unpad(d_dq, s.s_q * s.h, s.d, s.d_pad, g.dq_idx, where);
    unpad(d_dk, s.s_kv, s.d, s.d_pad, g.dk_idx, where);
    d_dw.download(g.dw.raw(), where);
    return g;
  }

  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                     const std::optional<KeyWindows>& windows) override {
    const char* where = "cuda select_topk";
    check_rank(where, "scores", scores, 2);
    if (scores.dtype() == DType::F64)
      throw oracle::NotSupported(std::string(where) + ": scores dtype F64 not supported (F32 only)");
    check_dtype(where, "scores", scores, {DType::F32});
    const int64_t s_q = scores.size(0), s_kv = scores.size(1);
    check_arg(k >= 0 && k <= INT32_MAX, where, "k", str(k), "0 <= k <= 2^31-1");
    check_arg(s_kv <= INT32_MAX, where, "scores", shape_str(scores.shape()), "s_kv <= 2^31-1");
    if (windows) {
      check_arg(windows->s_q() == s_q && (int64_t)windows->ke.size() == s_q, where, "windows",
                "s_q=" + str(windows->s_q()), "s_q=" + str(s_q));
      check_arg(windows->s_kv == s_kv, where, "windows", "s_kv=" + str(windows->s_kv),
                "s_kv=" + str(s_kv));
    }
    require_device(where);
    Tensor out(DType::I32, {s_q, k});
    if (s_q == 0 || k == 0) return out;
    DeviceBuffer d_scores = upload(scores, where);
    DeviceBuffer d_ks(windows ? sizeof(int64_t) * s_q : 0, where);
    DeviceBuffer d_ke(windows ? sizeof(int64_t) * s_q : 0, where);
    if (windows) {
      d_ks.upload(windows->ks.data(), where);
      d_ke.upload(windows->ke.data(), where);
    }
    DeviceBuffer d_out(out.nbytes(), where);
    DeviceBuffer d_scratch(topk_scratch_bytes(s_q, s_kv, k), where);
    select_topk_device(d_scores.get<float>(), s_q, s_kv, k, d_ks.get<int64_t>(),
                       d_ke.get<int64_t>(), policy, d_out.get<int32_t>(), d_scratch.get<void>(),
                       nullptr, options_.topk_kernel);
    DSA_CUDA_CHECK(where, cudaDeviceSynchronize());
    d_out.download(out.raw(), where);
    return out;
  }

  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    const char* where = "cuda sparse_mla_forward";
    const MlaDims md = check_mla(where, in);
    const int64_t s_q = md.s_q, h_q = md.h_q, d_qk = md.d_qk, s_kv = md.s_kv, k = md.k;
    const Tensor& sink32 = md.sink32;
    require_device(where);

    SparseMlaForward r{Tensor(DType::BF16, {s_q, h_q, in.d_v}), Tensor(DType::F32, {s_q, h_q}),
                       Tensor(DType::F32, {s_q, h_q})};
    if (s_q == 0 || h_q == 0) return r;
    DeviceBuffer d_q = upload(in.q, where);
    DeviceBuffer d_kv = upload(in.kv, where);
    DeviceBuffer d_idx = upload(in.indices, where);
    DeviceBuffer d_len(in.topk_length ? in.topk_length->nbytes() : 0, where);
    if (in.topk_length) d_len.upload(in.topk_length->raw(), where);
    DeviceBuffer d_sink(in.attn_sink ? sink32.nbytes() : 0, where);
    if (in.attn_sink) d_sink.upload(sink32.raw(), where);
    DeviceBuffer d_out(r.out.nbytes(), where), d_lse(r.lse.nbytes(), where),
        d_max(r.max_logits.nbytes(), where);
    sparse_mla_forward_device(d_q.get<uint16_t>(), d_kv.get<uint16_t>(), d_idx.get<int32_t>(),
                              in.topk_length ? d_len.get<int32_t>() : nullptr,
                              in.attn_sink ? d_sink.get<float>() : nullptr, s_q, h_q, d_qk, s_kv,
                              k, in.d_v, static_cast<float>(in.sm_scale), d_out.get<uint16_t>(),
                              d_lse.get<float>(), d_max.get<float>(), nullptr, options_.mla_kernel);
    DSA_CUDA_CHECK(where, cudaDeviceSynchronize());
    d_out.download(r.out.raw(), where);
    d_lse.download(r.lse.raw(), where);
    d_max.download(r.max_logits.raw(), where);
    return r;
  }


  // SPEC §5: the backend's own forward (options_.mla_kernel) gives out (bf16) and lse; Δ is
  // taken from that out. d_qk and d_v are zero-padded to multiples of 8 for the kernel (zero
  // columns change no dot product; the padded columns of dq/dkv are dropped). dout BF16 runs
  // the kernel once; F32 / F16 dout (the properties draw F32) is split exactly into bf16
  // parts hi + mid + lo (8 significant bits each: every fp32 value, subnormals aside), the
  // kernel runs once per nonzero part and the grads are added in that order: the backward is
  // linear in dout (dS, dq, dkv, dsink all are, Δ = out·dout included), so the sum is the
  // backward of the fp32 dout to fp32 rounding, and deterministic. F64 dout: NotSupported.
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    const char* where = "cuda sparse_mla_backward";
    if (options_.mla_bwd == SparseMlaBwdPath::Fallback)
      throw oracle::NotSupported(std::string(where) +
                                 ": the backward kernel is off (CudaBackendOptions::mla_bwd = "
                                 "Fallback, or DSA_CUDA_SMLA_BWD=fallback)");
    const MlaDims md = check_mla(where, in);
    const int64_t s_q = md.s_q, h_q = md.h_q, d_qk = md.d_qk, s_kv = md.s_kv, k = md.k;
    const int64_t d_v = in.d_v;
    check_rank(where, "dout", dout, 3);
    if (dout.dtype() == DType::F64)
      throw oracle::NotSupported(std::string(where) + ": dout dtype F64 not supported (BF16, "
                                 "F16 or F32)");
    check_dtype(where, "dout", dout, {DType::BF16, DType::F16, DType::F32});
    check_shape(where, "dout", dout, {s_q, h_q, d_v});
    const int64_t dq8 = (d_qk + 7) / 8 * 8, dv8 = (d_v + 7) / 8 * 8;
    if (dq8 > sparse_mla_backward_max_d_qk() || dv8 > sparse_mla_backward_max_d_v())
      throw oracle::NotSupported(std::string(where) + ": d_qk=" + str(d_qk) + ", d_v=" +
                                 str(d_v) + " not supported (backward kernel limits d_qk <= " +
                                 str(sparse_mla_backward_max_d_qk()) + ", d_v <= " +
                                 str(sparse_mla_backward_max_d_v()) + ")");
    check_arg(s_q * k <= INT32_MAX, where, "indices", shape_str(in.indices.shape()),
              "s_q * k <= 2^31-1 (backward pair list)");
    require_device(where);
    SparseMlaGrads g{Tensor(DType::F32, {s_q, h_q, d_qk}), Tensor(DType::F32, {s_kv, d_qk}),
                     std::nullopt};
    if (in.attn_sink) g.dsink = Tensor(DType::F32, {h_q});
    if (s_q == 0 || h_q == 0) return g;
    const SparseMlaBwdMode mode = options_.mla_bwd == SparseMlaBwdPath::KernelFast
                                      ? SparseMlaBwdMode::Fast
                                      : SparseMlaBwdMode::Deterministic;
    DeviceBuffer d_q = upload_vec(pad_rows(in.q, s_q * h_q, d_qk, dq8), where);
    DeviceBuffer d_kv = upload_vec(pad_rows(in.kv, s_kv, d_qk, dq8), where);
    DeviceBuffer d_idx = upload(in.indices, where);
    DeviceBuffer d_len(in.topk_length ? in.topk_length->nbytes() : 0, where);
    if (in.topk_length) d_len.upload(in.topk_length->raw(), where);
    DeviceBuffer d_sink(in.attn_sink ? md.sink32.nbytes() : 0, where);
    if (in.attn_sink) d_sink.upload(md.sink32.raw(), where);
    const int32_t* len = in.topk_length ? d_len.get<int32_t>() : nullptr;
    const float* sink = in.attn_sink ? d_sink.get<float>() : nullptr;
    // SPEC §5: Δ from the out the forward returns on this case (sparse_mla_forward, unpadded;
    // the forward kernel on the padded q/kv rounded some out elements differently, and the
    // oracle takes Δ from the returned out: H200, 2026-12-01), with its lse. out's columns are
    // zero-padded to d_v8 (zero columns leave Δ unchanged).
    const SparseMlaForward f = sparse_mla_forward(in);
    DeviceBuffer d_out = upload_vec(pad_rows(f.out, s_q * h_q, d_v, dv8), where);
    DeviceBuffer d_lse = upload(f.lse, where);
    DeviceBuffer d_dq(sizeof(float) * s_q * h_q * dq8, where);
    DeviceBuffer d_dkv(sizeof(float) * s_kv * dq8, where);
    DeviceBuffer d_dsink(in.attn_sink ? sizeof(float) * h_q : 0, where);
    DeviceBuffer d_scratch(sparse_mla_backward_scratch_bytes(s_q, h_q, dq8, s_kv, k, mode), where);
    const std::vector<Tensor> parts = bf16_parts(dout);
    // One bf16 rounding of dS per run is what the SPEC §9 floors model; a dout split into
    // several parts would add one rounding per part, of each part's dS, which cancellation can
    // make larger than the whole dS (H200, 2026-12-01: smla.empty_rows, F32 dout, dkv at 1.01x
    // its bound with Bf16), so a split dout runs the hi + lo kernel.
    const SparseMlaBwdRounding rounding =
        parts.size() > 1 ? SparseMlaBwdRounding::HiLo : options_.mla_bwd_rounding;
    for (size_t i = 0; i < parts.size(); ++i) {
      DeviceBuffer d_dout = upload_vec(pad_rows(parts[i], s_q * h_q, d_v, dv8), where);
      sparse_mla_backward_device(
          d_q.get<uint16_t>(), d_kv.get<uint16_t>(), d_idx.get<int32_t>(), len, sink,
          d_out.get<uint16_t>(), d_lse.get<float>(),
          d_dout.get<uint16_t>(), s_q, h_q, dq8, s_kv, k, dv8, static_cast<float>(in.sm_scale),
          d_dq.get<float>(), d_dkv.get<float>(), in.attn_sink ? d_dsink.get<float>() : nullptr,
          d_scratch.get<void>(), nullptr, mode, rounding);
      DSA_CUDA_CHECK(where, cudaDeviceSynchronize());
      // Part 0 writes the grads; later parts add in order (hi + mid + lo).
      accumulate_f32(d_dq, s_q * h_q, d_qk, dq8, g.dq, i > 0, where);
      accumulate_f32(d_dkv, s_kv, d_qk, dq8, g.dkv, i > 0, where);
      if (in.attn_sink) accumulate_f32(d_dsink, 1, h_q, h_q, *g.dsink, i > 0, where);
    }
    return g;
  }

 private:
  CudaBackendOptions options_;
  static void require_device(const char* where) {
    if (device_count() <= 0)
      throw std::runtime_error(std::string(where) + ": no CUDA device");
  }
};

}  // namespace

SparseMlaKernel sparse_mla_kernel_from_env() {
  const char* v = std::getenv("DSA_CUDA_SMLA_FWD");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "wgmma") == 0)
    return SparseMlaKernel::OnePassWgmma;
  if (std::strcmp(v, "mma") == 0) return SparseMlaKernel::OnePass;
  throw std::invalid_argument(std::string("DSA_CUDA_SMLA_FWD: got '") + v +
                              "', expected 'wgmma' or 'mma' (or unset)");
}

SparseMlaBwdPath sparse_mla_bwd_path_from_env() {
  const char* v = std::getenv("DSA_CUDA_SMLA_BWD");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "kernel") == 0)
    return SparseMlaBwdPath::Kernel;
  if (std::strcmp(v, "fallback") == 0) return SparseMlaBwdPath::Fallback;
  if (std::strcmp(v, "fast") == 0) return SparseMlaBwdPath::KernelFast;
  throw std::invalid_argument(std::string("DSA_CUDA_SMLA_BWD: got '") + v +
                              "', expected 'kernel', 'fast' or 'fallback' (or unset)");
}

SparseMlaBwdRounding sparse_mla_bwd_rounding_from_env() {
  const char* v = std::getenv("DSA_CUDA_SMLA_BWD_PDS");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "bf16") == 0) return SparseMlaBwdRounding::Bf16;
  if (std::strcmp(v, "hilo") == 0) return SparseMlaBwdRounding::HiLo;
  throw std::invalid_argument(std::string("DSA_CUDA_SMLA_BWD_PDS: got '") + v +
                              "', expected 'bf16' or 'hilo' (or unset)");
}

TopkKernel topk_kernel_from_env() {
  const char* v = std::getenv("DSA_CUDA_TOPK");
  if (v == nullptr || *v == '\0') return TopkKernel::Cluster;
  const std::pair<const char*, TopkKernel> names[] = {
      {"radix", TopkKernel::Radix},
      {"two-read", TopkKernel::TwoRead},
      {"cluster", TopkKernel::Cluster},
      {"cluster-fused-sort", TopkKernel::ClusterFusedSort},
      {"persistent", TopkKernel::Persistent},
      {"persistent-wide", TopkKernel::PersistentWide}};
  for (const auto& [name, kernel] : names)
    if (std::strcmp(v, name) == 0) return kernel;
  throw std::invalid_argument(std::string("DSA_CUDA_TOPK: got '") + v +
                              "', expected 'radix', 'two-read', 'cluster', 'cluster-fused-sort', "
                              "'persistent' or 'persistent-wide' (or unset)");
}

std::unique_ptr<oracle::Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

void register_cuda_backend() {
  static std::once_flag once;
  std::call_once(once, [] { oracle::register_backend("cuda", [] { return make_cuda_backend(); }); });
}

}  // namespace dsa::cuda

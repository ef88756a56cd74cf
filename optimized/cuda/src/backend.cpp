// The `cuda` backend: validates host tensors, copies them to device 0, runs the kernels of
// dsa/cuda/kernels.h and copies the outputs back (SPEC §3, §4, §6).
#include "dsa/cuda/backend.h"

#include <climits>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
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

class CudaBackend final : public oracle::Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}
  std::string name() const override { return "cuda"; }
  std::string unavailable_reason() const override {
    return device_count() > 0 ? std::string() : std::string("no CUDA device");
  }
  bool deterministic() const override { return true; }
  bool supports(oracle::Op op) const override {
    return op == oracle::Op::Topk || op == oracle::Op::SparseMlaFwd;
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

 private:
  CudaBackendOptions options_;
  static void require_device(const char* where) {
    if (device_count() <= 0)
      throw std::runtime_error(std::string(where) + ": no CUDA device");
  }
};

}  // namespace

std::unique_ptr<oracle::Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

void register_cuda_backend() {
  static std::once_flag once;
  std::call_once(once, [] { oracle::register_backend("cuda", [] { return make_cuda_backend(); }); });
}

}  // namespace dsa::cuda

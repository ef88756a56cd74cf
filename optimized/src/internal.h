// Shared argument checks and window helpers of the composite LibTorch ops (not installed).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>

namespace dsa::optimized::detail {

/// "[a, b, c]" for messages.
std::string sizes_str(at::IntArrayRef sizes);

/// TORCH_CHECK that `t` is defined, has rank `rank`; message names op, arg, expected shape.
void check_rank(const char* op, const char* arg, const at::Tensor& t, int64_t rank,
                const char* expected_shape);
/// TORCH_CHECK t.size(dim) == size.
void check_dim(const char* op, const char* arg, const at::Tensor& t, int64_t dim, int64_t size,
               const char* expected_shape);
/// TORCH_CHECK t is a floating type among f16/bf16/f32/f64 (`allow_half` false: f32/f64 only).
void check_float(const char* op, const char* arg, const at::Tensor& t, bool allow_half);
/// TORCH_CHECK t is int32 (or int64 when allow_i64).
void check_int(const char* op, const char* arg, const at::Tensor& t, bool allow_i64);
/// TORCH_CHECK t lives on `device`.
void check_device(const char* op, const char* arg, const at::Tensor& t, const at::Device& device);

/// Validates optional windows ks/ke ([s_q], int32/int64, same device) and returns the
/// [s_q, s_kv] bool mask of visible keys (clamped to [0, s_kv], SPEC §1). Absent windows
/// mean every key is visible. ks and ke must both be given or both absent.
at::Tensor window_mask(const char* op, const c10::optional<at::Tensor>& ks,
                       const c10::optional<at::Tensor>& ke, int64_t s_q, int64_t s_kv,
                       const at::Device& device);

/// Compute dtype: f64 when any input is f64, else f32 (SPEC §2: at least fp32 accumulation).
at::ScalarType compute_dtype(std::initializer_list<at::Tensor> ts);

/// Per-slot validity of an indices tensor [s_q, k] (SPEC §4): 0 <= id < s_kv and
/// slot < topk_length[t]. Returns {valid [s_q,k] bool, safe_ids [s_q,k] int64 (invalid → 0)}.
std::pair<at::Tensor, at::Tensor> valid_slots(const at::Tensor& ids2d, int64_t s_kv,
                                              const c10::optional<at::Tensor>& topk_length);

}  // namespace dsa::optimized::detail

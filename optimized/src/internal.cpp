// Argument checks and window/slot helpers shared by the composite ops.
#include "internal.h"

#include <sstream>

namespace dsa::optimized::detail {

std::string sizes_str(at::IntArrayRef sizes) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << "]";
  return os.str();
}

void check_rank(const char* op, const char* arg, const at::Tensor& t, int64_t rank,
                const char* expected_shape) {
  TORCH_CHECK(t.defined(), op, ": argument '", arg, "' is undefined, expected shape ",
              expected_shape);
  TORCH_CHECK(t.dim() == rank, op, ": argument '", arg, "' has shape ", sizes_str(t.sizes()),
              ", expected shape ", expected_shape);
}

void check_dim(const char* op, const char* arg, const at::Tensor& t, int64_t dim, int64_t size,
               const char* expected_shape) {
  TORCH_CHECK(t.size(dim) == size, op, ": argument '", arg, "' has shape ", sizes_str(t.sizes()),
              ", expected shape ", expected_shape, " with size ", size, " at dim ", dim);
}

void check_float(const char* op, const char* arg, const at::Tensor& t, bool allow_half) {
  const auto s = t.scalar_type();
  const bool ok = s == at::kFloat || s == at::kDouble ||
                  (allow_half && (s == at::kHalf || s == at::kBFloat16));
  TORCH_CHECK(ok, op, ": argument '", arg, "' has dtype ", s, ", expected dtype ",
              allow_half ? "bfloat16, float16, float32 or float64" : "float32 or float64");
}

void check_int(const char* op, const char* arg, const at::Tensor& t, bool allow_i64) {
  const auto s = t.scalar_type();
  TORCH_CHECK(s == at::kInt || (allow_i64 && s == at::kLong), op, ": argument '", arg,
              "' has dtype ", s, ", expected dtype ", allow_i64 ? "int32 or int64" : "int32");
}

void check_device(const char* op, const char* arg, const at::Tensor& t, const at::Device& device) {
  TORCH_CHECK(t.device() == device, op, ": argument '", arg, "' is on device ", t.device(),
              ", expected device ", device, " (all arguments on one device)");
}

at::Tensor window_mask(const char* op, const c10::optional<at::Tensor>& ks,
                       const c10::optional<at::Tensor>& ke, int64_t s_q, int64_t s_kv,
                       const at::Device& device) {
  const bool has_ks = ks.has_value() && ks->defined();
  const bool has_ke = ke.has_value() && ke->defined();
  TORCH_CHECK(has_ks == has_ke, op, ": arguments 'ks' and 'ke' must be given together");
  auto opts = at::TensorOptions().device(device);
  if (!has_ks) return at::ones({s_q, s_kv}, opts.dtype(at::kBool));
  for (const auto* p : {&ks, &ke}) {
    const char* name = p == &ks ? "ks" : "ke";
    const at::Tensor& t = **p;
    check_rank(op, name, t, 1, "[s_q]");
    check_dim(op, name, t, 0, s_q, "[s_q]");
    check_int(op, name, t, true);
    check_device(op, name, t, device);
  }
  auto lo = ks->to(at::kLong).clamp(0, s_kv).unsqueeze(1);
  auto hi = ke->to(at::kLong).clamp(0, s_kv).unsqueeze(1);
  auto col = at::arange(s_kv, opts.dtype(at::kLong)).unsqueeze(0);
  return col.ge(lo).logical_and(col.lt(hi));
}

at::ScalarType compute_dtype(std::initializer_list<at::Tensor> ts) {
  for (const auto& t : ts)
    if (t.defined() && t.scalar_type() == at::kDouble) return at::kDouble;
  return at::kFloat;
}

std::pair<at::Tensor, at::Tensor> valid_slots(const at::Tensor& ids2d, int64_t s_kv,
                                              const c10::optional<at::Tensor>& topk_length) {
  auto ids = ids2d.to(at::kLong);
  auto valid = ids.ge(0).logical_and(ids.lt(s_kv));
  if (topk_length.has_value() && topk_length->defined()) {
    auto slot = at::arange(ids.size(1), ids.options()).unsqueeze(0);
    valid = valid.logical_and(slot.lt(topk_length->to(at::kLong).unsqueeze(1)));
  }
  auto safe = at::where(valid, ids, at::zeros_like(ids));
  return {valid, safe};
}

}  // namespace dsa::optimized::detail

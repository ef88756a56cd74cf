#include "support.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "dsa/contract/errors.h"

namespace dsa::torch_props {

int test_level() {
  const char* v = std::getenv("DSA_TEST_LEVEL");
  if (v == nullptr || *v == '\0') return 0;
  return std::clamp(std::atoi(v), 0, 2);
}

int scaled_cases(int base_cases) {
  static const int factor[] = {1, 5, 50};
  return base_cases * factor[test_level()];
}

void report_property_failure(const std::string& message) { ADD_FAILURE() << message; }

void require_pass(const oracle::OpReport& r) {
  if (r.verdict == oracle::Verdict::Weak)
    RC_DISCARD("WEAK draw redrawn (not judged, SPEC §9): " + r.op + ": " + r.reason);
  // An empty draw (s_q = 0, k = 0) judges nothing: a skip, never a pass (OpReport::nothing_judged);
  // it is redrawn as the main properties do, not counted.
  if (r.nothing_judged) RC_DISCARD("judged nothing, redrawn: " + r.op + ": " + r.reason);
  if (r.verdict != oracle::Verdict::Pass) RC_FAIL(oracle::format_op_report(r));
}

Tensor random_normal(std::mt19937_64& rng, DType dtype, std::vector<int64_t> shape,
                     double scale) {
  Tensor t(dtype, std::move(shape));
  std::normal_distribution<double> d(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, d(rng));
  return t;
}

Tensor integer_grid(std::mt19937_64& rng, DType dtype, std::vector<int64_t> shape, int lo,
                    int hi) {
  Tensor t(dtype, std::move(shape));
  std::uniform_int_distribution<int> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, d(rng));
  return t;
}

KeyWindows random_windows(std::mt19937_64& rng, int64_t s_q, int64_t s_kv) {
  std::vector<int64_t> ks(s_q), ke(s_q);
  std::uniform_int_distribution<int> kind(0, 5);
  std::uniform_int_distribution<int64_t> pos(0, s_kv + 2);
  for (int64_t t = 0; t < s_q; ++t) {
    switch (kind(rng)) {
      case 0: ks[t] = 0; ke[t] = s_kv; break;                                   // full
      case 1: ks[t] = 0; ke[t] = std::max<int64_t>(0, s_kv - s_q) + t + 1; break;  // causal
      case 2: ks[t] = pos(rng); ke[t] = ks[t]; break;                           // empty
      default: ks[t] = pos(rng) / 2; ke[t] = pos(rng); break;                    // arbitrary
    }
  }
  return KeyWindows::explicit_windows(ks, ke, s_kv);
}

Tensor random_indices(std::mt19937_64& rng, int64_t s_q, int64_t s_kv, int64_t k) {
  std::vector<int32_t> v(s_q * k);
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<int32_t> id(0, std::max<int64_t>(0, s_kv - 1));
  for (int64_t t = 0; t < s_q; ++t) {
    const bool all_invalid = kind(rng) == 0;
    const int lead = kind(rng) < 2 ? kind(rng) % 3 : 0;  // leading padding
    for (int64_t j = 0; j < k; ++j) {
      int32_t x = id(rng);
      const int c = kind(rng);
      if (all_invalid || j < lead || c == 1) x = -1;
      else if (c == 2) x = -7 - static_cast<int32_t>(j);
      else if (c == 3) x = static_cast<int32_t>(s_kv + j);
      else if (c == 4 && j > 0) x = v[t * k + j - 1] >= 0 ? v[t * k + j - 1] : x;  // duplicate
      if (s_kv == 0 && x >= 0) x = -1;
      v[t * k + j] = x;
    }
  }
  return Tensor::from_i32({s_q, k}, v);
}

std::string bitwise_difference(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    return std::string("dtype ") + dtype_name(a.dtype()) + " vs " + dtype_name(b.dtype());
  if (a.shape() != b.shape()) return "shape " + shape_str(a.shape()) + " vs " + shape_str(b.shape());
  const size_t esz = dtype_size(a.dtype());
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(a.raw() + i * esz, b.raw() + i * esz, esz) != 0) {
      std::ostringstream os;
      os.precision(17);
      os << "flat " << i << " of " << shape_str(a.shape()) << ": " << a.get(i) << " vs " << b.get(i);
      return os.str();
    }
  }
  return {};
}

std::string exact_difference(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    return std::string("dtype ") + dtype_name(a.dtype()) + " vs " + dtype_name(b.dtype());
  if (a.shape() != b.shape()) return "shape " + shape_str(a.shape()) + " vs " + shape_str(b.shape());
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (x == y || (std::isnan(x) && std::isnan(y))) continue;
    std::ostringstream os;
    os.precision(17);
    os << "flat " << i << " of " << shape_str(a.shape()) << ": " << x << " vs " << y;
    return os.str();
  }
  return {};
}

}  // namespace dsa::torch_props

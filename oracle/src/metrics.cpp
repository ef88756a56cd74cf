#include "dsa/oracle/metrics.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "dsa/contract/errors.h"

namespace dsa::oracle {
namespace {
int nf_class(double v) {
  if (std::isnan(v)) return 1;
  if (std::isinf(v)) return v > 0 ? 2 : 3;
  return 0;
}
const char* nf_name(int c) {
  switch (c) {
    case 1: return "NaN";
    case 2: return "+inf";
    case 3: return "-inf";
    default: return "finite";
  }
}
}  // namespace

NonFinitePositions nonfinite_positions(const Tensor& t) {
  NonFinitePositions p;
  if (!is_floating(t.dtype())) return p;
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (nf_class(t.get(i))) {
      case 1: p.nan.push_back(i); break;
      case 2: p.pos_inf.push_back(i); break;
      case 3: p.neg_inf.push_back(i); break;
      default: break;
    }
  }
  return p;
}

TensorMetrics compare_tensors(const Tensor& candidate, const Tensor& reference) {
  TensorMetrics m;
  if (candidate.shape() != reference.shape()) {
    m.shape_ok = false;
    m.first_mismatch = "shape " + shape_str(candidate.shape()) + " vs reference " +
                       shape_str(reference.shape());
    return m;
  }
  m.numel = reference.numel();
  double diff2 = 0, ref2 = 0, cand2 = 0, dot = 0;
  for (int64_t i = 0; i < m.numel; ++i) {
    const double c = candidate.get(i), r = reference.get(i);
    const int cc = nf_class(c), rc = nf_class(r);
    if (cc != rc) {
      if (m.nonfinite_mismatches++ == 0) {
        std::ostringstream os;
        os << "flat " << i << ": candidate " << nf_name(cc) << " (" << c << "), reference "
           << nf_name(rc) << " (" << r << ")";
        m.first_mismatch = os.str();
      }
      continue;
    }
    if (cc != 0) continue;
    const double d = c - r;
    m.max_abs = std::max(m.max_abs, std::abs(d));
    m.ref_max_abs = std::max(m.ref_max_abs, std::abs(r));
    m.cand_max_abs = std::max(m.cand_max_abs, std::abs(c));
    diff2 += d * d;
    ref2 += r * r;
    cand2 += c * c;
    dot += c * r;
  }
  if (ref2 > 0) m.rel_fro = std::sqrt(diff2 / ref2);
  else m.rel_fro = diff2 > 0 ? INFINITY : 0.0;
  if (ref2 > 0 && cand2 > 0) m.cosine = dot / (std::sqrt(ref2) * std::sqrt(cand2));
  else m.cosine = (ref2 == 0 && cand2 == 0) ? 1.0 : 0.0;
  return m;
}

double max_abs_error(const Tensor& a, const Tensor& b) {
  check_arg(a.shape() == b.shape(), "max_abs_error", "b", shape_str(b.shape()),
            shape_str(a.shape()));
  double e = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(i);
    if (std::isfinite(x) && std::isfinite(y)) e = std::max(e, std::abs(x - y));
  }
  return e;
}

double dtype_epsilon(DType dtype) {
  switch (dtype) {
    case DType::F64: return std::ldexp(1.0, -52);
    case DType::F32: return std::ldexp(1.0, -23);
    case DType::F16: return std::ldexp(1.0, -10);
    case DType::BF16: return std::ldexp(1.0, -7);
    default: break;
  }
  throw std::invalid_argument(std::string("dtype_epsilon: argument 'dtype' got ") +
                              dtype_name(dtype) + ", expected a floating dtype");
}

}  // namespace dsa::oracle

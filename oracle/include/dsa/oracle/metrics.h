// Per-tensor error metrics between a candidate and the float64 reference (SPEC §9).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsa/contract/tensor.h"

namespace dsa::oracle {

/// Flat (row-major) positions of NaN, +inf and -inf in a floating tensor (integer tensors:
/// all empty).
struct NonFinitePositions {
  std::vector<int64_t> nan;
  std::vector<int64_t> pos_inf;
  std::vector<int64_t> neg_inf;
};
NonFinitePositions nonfinite_positions(const Tensor& t);

/// Metrics of `candidate` against `reference` (any floating dtypes; values read exactly).
/// max_abs, rel_fro (‖c−r‖_F/‖r‖_F; 0 when both are zero, +inf when only r is) and cosine
/// (1 when both are zero, 0 when exactly one is) are computed over positions finite in both.
/// nonfinite_mismatches counts positions whose NaN/+inf/-inf class differs (SPEC §9: must be 0);
/// first_mismatch describes the first such position. shape_ok is false on a shape mismatch
/// (then nothing else is computed).
struct TensorMetrics {
  bool shape_ok = true;
  int64_t numel = 0;
  double max_abs = 0.0;
  double rel_fro = 0.0;
  double cosine = 1.0;
  double ref_max_abs = 0.0;   ///< scale: max |reference| over finite positions
  double cand_max_abs = 0.0;  ///< max |candidate| over finite positions
  int64_t nonfinite_mismatches = 0;
  std::string first_mismatch;
};
TensorMetrics compare_tensors(const Tensor& candidate, const Tensor& reference);

/// max |a - b| over positions finite in both (shapes must match; 0 for empty tensors).
double max_abs_error(const Tensor& a, const Tensor& b);

/// Machine epsilon of a floating dtype: F64 2^-52, F32 2^-23, F16 2^-10, BF16 2^-7.
/// Throws std::invalid_argument for integer dtypes.
double dtype_epsilon(DType dtype);

}  // namespace dsa::oracle

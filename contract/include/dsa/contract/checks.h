// Shape and dtype checks for public functions taking dsa::Tensor. Each throws
// std::invalid_argument naming the function, the argument, what it got and what it expected.
#pragma once

#include <initializer_list>
#include <vector>

#include "dsa/contract/tensor.h"

namespace dsa {

/// Requires t.shape() == shape; -1 in `shape` matches any size.
void check_shape(const char* where, const char* arg, const Tensor& t,
                 const std::vector<int64_t>& shape);
/// Requires t.dtype() to be one of `allowed`.
void check_dtype(const char* where, const char* arg, const Tensor& t,
                 std::initializer_list<DType> allowed);
/// Requires t.dim() == rank.
void check_rank(const char* where, const char* arg, const Tensor& t, int64_t rank);

}  // namespace dsa

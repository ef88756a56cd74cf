#include "dsa/contract/errors.h"

#include "dsa/contract/checks.h"

namespace dsa {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i] < 0 ? std::string("*") : std::to_string(shape[i]);
  }
  return s + "]";
}

void check_arg(bool ok, const char* where, const char* arg, const std::string& got,
               const std::string& expected) {
  if (ok) return;
  throw std::invalid_argument(std::string(where) + ": argument '" + arg + "' got " + got +
                              ", expected " + expected);
}

void check_rank(const char* where, const char* arg, const Tensor& t, int64_t rank) {
  check_arg(t.dim() == rank, where, arg, "shape " + shape_str(t.shape()),
            std::to_string(rank) + " dimensions");
}

void check_shape(const char* where, const char* arg, const Tensor& t,
                 const std::vector<int64_t>& shape) {
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || shape[i] == t.shape()[i];
  check_arg(ok, where, arg, "shape " + shape_str(t.shape()), "shape " + shape_str(shape));
}

void check_dtype(const char* where, const char* arg, const Tensor& t,
                 std::initializer_list<DType> allowed) {
  std::string names;
  for (DType d : allowed) {
    if (d == t.dtype()) return;
    names += names.empty() ? "" : " or ";
    names += dtype_name(d);
  }
  check_arg(false, where, arg, std::string("dtype ") + dtype_name(t.dtype()), "dtype " + names);
}

}  // namespace dsa

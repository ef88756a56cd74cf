// Argument checking shared by every target. Rule: STYLE.md "bad input gets a clear error
// naming the argument and the expected value".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dsa {

/// Formats a shape as "[a, b, c]" for error messages.
std::string shape_str(const std::vector<int64_t>& shape);

/// Throws std::invalid_argument("<where>: argument '<arg>' got <got>, expected <expected>")
/// when `ok` is false. `where` names the public function (e.g. "sparse_mla_forward").
void check_arg(bool ok, const char* where, const char* arg, const std::string& got,
               const std::string& expected);

/// Streams any printable value into a string (helper for check_arg messages).
template <class T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace dsa

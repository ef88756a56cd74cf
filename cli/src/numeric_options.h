// Validators of the CLI's numeric options: every number is checked as text before CLI11
// converts it, so nan, inf, a negative, a fraction or an out-of-range value is a usage error
// (exit 2) naming the option, the value and the accepted range in plain terms, e.g.
// "--timeout: got nan, expected a positive decimal number of seconds from 0.001 to 86400". Without this a
// NaN or huge --timeout reached the plugin runner as a negative millisecond count and every
// case failed, blaming the kernel (fresh-user report F7/F8).
#pragma once

#include <CLI/CLI.hpp>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace dsa::cli {

/// --timeout range, seconds: at least one millisecond (the plugin runner counts whole
/// milliseconds), at most one day (a per-call limit beyond it is no limit).
constexpr double kMinTimeoutS = 0.001;
constexpr double kMaxTimeoutS = 86400.0;
/// The accepted --timeout range in words (help text and errors).
inline std::string timeout_range() { return "a positive decimal number of seconds from 0.001 to 86400"; }

/// True when `v` is written as a plain decimal number: digits with at most one '.', at least one
/// digit, then an optional exponent (e, E, an optional sign, digits); no sign, space, hex
/// ("0x10", which strtod reads as 16), "inf" or "nan". Throws nothing.
inline bool decimal_text(const std::string& v) {
  size_t i = 0, digits = 0;
  bool dot = false;
  for (; i < v.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(v[i]))) ++digits;
    else if (v[i] == '.' && !dot) dot = true;
    else break;
  }
  if (digits == 0) return false;
  if (i == v.size()) return true;
  if (v[i] != 'e' && v[i] != 'E') return false;
  if (++i < v.size() && (v[i] == '+' || v[i] == '-')) ++i;
  if (i == v.size()) return false;
  for (; i < v.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(v[i]))) return false;
  return true;
}
/// Largest --jobs: threads in all (dsa::set_max_threads).
constexpr int64_t kMaxJobs = 4096;

/// `option` takes an integer from lo to hi (`what`: e.g. "a number of threads"). Checks the
/// text: digits with an optional sign, nothing else.
inline CLI::Validator integer_in(const std::string& option, int64_t lo, int64_t hi, const std::string& what) {
  (void)option;  // CLI11 prefixes the option's name ("--jobs: got 0, ...")
  return CLI::Validator(
      [lo, hi, what](std::string& v) -> std::string {
        const std::string range = "expected " + what + ", an integer from " + std::to_string(lo) + " to " +
                                  std::to_string(hi);
        const char* s = v.c_str();
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(s, &end, 10);
        if (v.empty() || end != s + v.size() || std::isspace(static_cast<unsigned char>(v[0])))
          return "got \"" + v + "\", " + range;
        if (errno == ERANGE || x < lo || x > hi) return "got " + v + ", " + range;
        return "";
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

/// `option` takes a decimal number of seconds (decimal_text: "0x10" is refused, not read as 16)
/// in [kMinTimeoutS, kMaxTimeoutS].
inline CLI::Validator timeout_seconds(const std::string& option) {
  (void)option;
  return CLI::Validator(
      [](std::string& v) -> std::string {
        const std::string range = "expected " + timeout_range();
        const char* s = v.c_str();
        char* end = nullptr;
        // A sign, "inf", "nan" or an out-of-range decimal is a value outside the range; any
        // other text (hex, spaces, letters) is not a decimal number.
        const char* num = (v[0] == '-' || v[0] == '+') ? s + 1 : s;
        const bool number = decimal_text(num) || std::string(num) == "inf" || std::string(num) == "nan";
        const double x = std::strtod(s, &end);
        if (v.empty() || !number || end != s + v.size()) return "got \"" + v + "\", " + range;
        if (!std::isfinite(x) || !(x >= kMinTimeoutS) || x > kMaxTimeoutS) return "got " + v + ", " + range;
        return "";
      },
      "SECONDS in [0.001, 86400]");
}

/// `option` names a path to write (a report file or a dump directory; `what`: e.g. "a file path").
/// An empty value is a usage error: a CI line `--json $REPORT` with REPORT unset must not run
/// and silently write no report (fresh-user report F1). The path itself is checked when written.
inline CLI::Validator output_path(const std::string& what) {
  return CLI::Validator(
      [what](std::string& v) -> std::string {
        if (v.empty()) return "got \"\" (empty), expected " + what;
        return "";
      },
      "PATH");
}

}  // namespace dsa::cli

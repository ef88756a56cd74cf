// Errors raised by the plugin loader (plugin/). Two families: PluginLoadError (the library
// cannot be used at all: a usage/input error, CLI exit code 2) and PluginFinding (one call
// broke the ABI or the SPEC: the oracle reports the case as failed and goes on).
// Rules they enforce: dsa/backend_abi.h; issue 6 "Bad input".
#pragma once

#include <stdexcept>
#include <string>

namespace dsa::plugin {

/// The library cannot be loaded as a plugin: missing file, not a shared object, no entry
/// symbol, wrong ABI version, or an inconsistent capabilities record. what() names the path.
class PluginLoadError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Base of every per-call failure that is the kernel's fault; what() names the plugin, the
/// op and what went wrong. The audit turns it into a failed case (never a crash).
class PluginFinding : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The call broke the ABI's memory rules: output descriptor changed (dtype, shape, strides:
/// non-contiguous), an out-of-bounds write into a guard zone, a modified input, or output
/// elements left unwritten.
class ContractViolation : public PluginFinding {
 public:
  using PluginFinding::PluginFinding;
};

/// The plugin returned DSA_STATUS_INVALID_ARGUMENT or DSA_STATUS_INTERNAL_ERROR (or an
/// unknown status); what() carries its message.
class PluginCallError : public PluginFinding {
 public:
  PluginCallError(const std::string& what, int status) : PluginFinding(what), status_(status) {}
  /// The dsa_status the plugin returned.
  int status() const { return status_; }

 private:
  int status_;
};

/// The isolated child running the call crashed (signal, abort, exit) or hung past its
/// timeout and was killed; timed_out() tells which.
class IsolatedFailure : public PluginFinding {
 public:
  explicit IsolatedFailure(const std::string& what, bool timed_out = false)
      : PluginFinding(what), timed_out_(timed_out) {}
  /// True when the call was killed at its timeout (hung), false when it crashed or exited.
  bool timed_out() const { return timed_out_; }

 private:
  bool timed_out_;
};

}  // namespace dsa::plugin

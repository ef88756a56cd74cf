// Runs one piece of work (a plugin call, or a whole audit case) in a forked child process
// with a timeout, so a crash, abort or hang becomes a result instead of killing the caller.
// Outputs come back over a pipe as contract Tensors (dtype, shape, raw bytes). The child never
// outlives its caller: it dies with it (PR_SET_PDEATHSIG), and under InterruptHandlers a
// SIGINT or SIGTERM kills it at once.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "dsa/contract/tensor.h"

namespace dsa::plugin {

/// How the isolated work ended.
enum class IsolatedStatus {
  Ok,        ///< fn returned; `outputs` holds its tensors
  Crashed,   ///< killed by a signal (SIGSEGV, SIGABRT, ...) or exited without a result
  TimedOut,  ///< still running at the deadline; killed with SIGKILL (its process group too)
  Threw,     ///< fn threw; `thrown` and `message` describe the exception
  Interrupted,  ///< SIGINT/SIGTERM under InterruptHandlers: killed with SIGKILL, or not started
};
/// "ok" | "crashed" | "timed_out" | "threw" | "interrupted".
const char* to_string(IsolatedStatus status);

/// Exception families recognised across the process boundary (so the parent can rethrow
/// the same kind; see rethrow_in_parent).
enum class ThrownKind {
  NotSupported,       ///< dsa::oracle::NotSupported (a skip)
  PluginLoadError,    ///< dsa::plugin::PluginLoadError
  ContractViolation,  ///< dsa::plugin::ContractViolation
  PluginCallError,    ///< dsa::plugin::PluginCallError
  IsolatedFailure,    ///< dsa::plugin::IsolatedFailure (nested isolation)
  InvalidArgument,    ///< std::invalid_argument (other than PluginLoadError)
  Other,              ///< any other std::exception, or a non-std exception
};

/// Outcome of run_isolated.
struct IsolatedResult {
  IsolatedStatus status = IsolatedStatus::Crashed;
  int signal = 0;                ///< terminating signal when Crashed by a signal, else 0
  int exit_code = -1;            ///< child's exit code when it exited normally, else -1
  ThrownKind thrown = ThrownKind::Other;  ///< exception family when Threw
  int call_status = 0;           ///< PluginCallError::status() when thrown is PluginCallError;
                                 ///< 1 for a timed-out nested IsolatedFailure
  std::string message;           ///< one-paragraph description; empty when Ok
  std::string output_tail;       ///< last 4 KiB the child wrote to stdout/stderr
  std::vector<Tensor> outputs;   ///< fn's result when Ok

  bool ok() const { return status == IsolatedStatus::Ok; }
};

/// Forks; the child runs fn() and sends its tensors back, then _exit()s (no atexit handlers,
/// no destructors of the parent's objects). The child's stdout/stderr are captured
/// (output_tail), not printed. Never throws for anything fn does; throws std::runtime_error
/// only when fork/pipe themselves fail, and std::invalid_argument for timeout <= 0.
/// Before fn runs, the child asks for SIGKILL when the forking thread ends
/// (prctl(PR_SET_PDEATHSIG), Linux) and exits at once if its parent is already gone; it runs
/// in its own process group with SIGINT/SIGTERM at their default action. Once an
/// InterruptHandlers signal was recorded, the running child is killed (SIGKILL, its process
/// group too) and the result is Interrupted; later calls return Interrupted without forking.
/// A child that had already sent its whole result keeps it (status Ok).
/// Caveats: a parent that already initialised CUDA cannot use CUDA in the child; threads of
/// the parent do not exist in the child, so a lock another thread held at the fork (other
/// than glibc's malloc and stdio, which fork resets) stays held there: such a child hangs
/// and is reported as TimedOut. Processes fn starts in a new session or process group are
/// not covered by the kill nor by the parent-death signal.
IsolatedResult run_isolated(const std::function<std::vector<Tensor>()>& fn,
                            std::chrono::milliseconds timeout);

/// Rethrows a non-Ok result in the parent as the same exception family (NotSupported,
/// PluginLoadError, ContractViolation, PluginCallError, std::invalid_argument,
/// std::runtime_error); Crashed/TimedOut/Interrupted become IsolatedFailure. `context` (e.g.
/// "plugin 'x': topk_indices") prefixes messages of Crashed/TimedOut/Interrupted. No-op when Ok.
void rethrow_in_parent(const IsolatedResult& result, const std::string& context);

/// While an instance lives, SIGINT and SIGTERM do not end the process: the first one is
/// recorded (signal()), the child run_isolated is waiting for is killed with SIGKILL (its
/// process group too) from the handler, and run_isolated returns Interrupted from then on;
/// the caller is expected to stop, report what it has and exit. A second signal (SIGINT or
/// SIGTERM) ends the process the default way. A signal the process inherited as ignored
/// (nohup, a background job of a script) stays ignored. The destructor restores the previous handlers and
/// clears the record. At most one instance at a time: a second throws std::logic_error.
/// Use: `dsa-verify audit` (partial report on Ctrl-C or a CI timeout; issue 14).
class InterruptHandlers {
 public:
  InterruptHandlers();
  ~InterruptHandlers();
  InterruptHandlers(const InterruptHandlers&) = delete;
  InterruptHandlers& operator=(const InterruptHandlers&) = delete;
  /// SIGINT or SIGTERM if one arrived since construction, else 0.
  int signal() const;
};

/// The signal recorded by the live InterruptHandlers (SIGINT or SIGTERM), or 0 when none
/// arrived or no instance lives.
int interrupt_signal();

}  // namespace dsa::plugin

#include "dsa/plugin/isolation.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "dsa/oracle/backend.h"
#include "dsa/plugin/findings.h"

namespace dsa::plugin {
namespace {

// ---- interruption (InterruptHandlers). Lock-free atomics only: the handler may run on any
// thread, between any two instructions of run_isolated.
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");
std::atomic<int> g_interrupt_signal{0};  // SIGINT/SIGTERM once recorded, else 0
// Pids (= process groups) that run_isolated calls wait for, one slot per concurrent call
// (the audit runs cases on several threads, --jobs); 0 = free slot.
constexpr int kChildSlots = 1024;
std::atomic<int> g_running_children[kChildSlots] = {};
std::atomic<bool> g_handlers_live{false};
struct sigaction g_previous_int, g_previous_term;

void on_interrupt_signal(int sig) {
  const int saved_errno = errno;
  int none = 0;
  g_interrupt_signal.compare_exchange_strong(none, sig);
  ::signal(SIGINT, SIG_DFL);  // a second signal, of either kind, ends the process
  ::signal(SIGTERM, SIG_DFL);
  // Set after the fork and cleared before the child is reaped, so this pid is ours (alive or
  // a zombie). If the fork is newer than this read, run_isolated sees the flag and kills it.
  for (auto& slot : g_running_children) {
    const int child = slot.load();
    if (child > 0) {
      ::kill(-child, SIGKILL);
      ::kill(child, SIGKILL);
    }
  }
  errno = saved_errno;
}

std::string signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal " + std::to_string(sig);
}

IsolatedResult interrupted_result(bool started, const std::string& tail) {
  IsolatedResult r;
  r.status = IsolatedStatus::Interrupted;
  r.signal = started ? SIGKILL : 0;
  r.output_tail = tail;
  r.message = "interrupted by " + signal_name(g_interrupt_signal.load()) +
              (started ? ": the child was killed with SIGKILL" : ": the call was not started");
  return r;
}

// Wire format child → parent (native byte order; both sides are the same binary):
//   "DSAISO1\n" u8 tag
//   tag 0 (ok):    u32 count, then per tensor: u8 dtype, u32 ndim, i64 shape[ndim],
//                  u64 nbytes, bytes
//   tag 1 (threw): u8 kind, i32 call_status, u32 len, message bytes
//   "END\n"
constexpr char kMagic[] = "DSAISO1\n";
constexpr char kTrailer[] = "END\n";
constexpr size_t kTailBytes = 4096;

template <class T>
void put(std::string& buf, T v) {
  buf.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

std::string serialize_outputs(const std::vector<Tensor>& outputs) {
  std::string buf(kMagic);
  put<uint8_t>(buf, 0);
  put<uint32_t>(buf, static_cast<uint32_t>(outputs.size()));
  for (const Tensor& t : outputs) {
    put<uint8_t>(buf, t.defined() ? 1 : 0);  // an output the plugin does not provide: undefined
    if (!t.defined()) continue;
    put<uint8_t>(buf, static_cast<uint8_t>(t.dtype()));
    put<uint32_t>(buf, static_cast<uint32_t>(t.dim()));
    for (int64_t s : t.shape()) put<int64_t>(buf, s);
    put<uint64_t>(buf, t.nbytes());
    if (t.nbytes()) buf.append(reinterpret_cast<const char*>(t.raw()), t.nbytes());
  }
  buf += kTrailer;
  return buf;
}

std::string serialize_exception(ThrownKind kind, int call_status, const std::string& message) {
  std::string buf(kMagic);
  put<uint8_t>(buf, 1);
  put<uint8_t>(buf, static_cast<uint8_t>(kind));
  put<int32_t>(buf, call_status);
  put<uint32_t>(buf, static_cast<uint32_t>(message.size()));
  buf += message;
  buf += kTrailer;
  return buf;
}

// Reads the wire format; returns false when the stream is truncated or malformed.
class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <class T>
  bool get(T& v) {
    if (pos_ + sizeof(T) > s_.size()) return false;
    std::memcpy(&v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool bytes(void* dst, size_t n) {
    if (n > s_.size() - pos_) return false;
    if (n) std::memcpy(dst, s_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool literal(const char* lit) {
    size_t n = std::strlen(lit);
    if (s_.compare(pos_, n, lit) != 0) return false;
    pos_ += n;
    return true;
  }
  bool at_end() const { return pos_ == s_.size(); }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

bool parse_payload(const std::string& payload, IsolatedResult& r) {
  Reader in(payload);
  uint8_t tag = 0;
  if (!in.literal(kMagic) || !in.get(tag)) return false;
  if (tag == 0) {
    uint32_t count = 0;
    if (!in.get(count)) return false;
    std::vector<Tensor> outputs;
    for (uint32_t i = 0; i < count; ++i) {
      uint8_t defined = 0;
      if (!in.get(defined) || defined > 1) return false;
      if (!defined) {
        outputs.emplace_back();
        continue;
      }
      uint8_t dtype = 0;
      uint32_t ndim = 0;
      if (!in.get(dtype) || !in.get(ndim) || dtype > static_cast<uint8_t>(DType::Bool) ||
          ndim > 64)
        return false;
      std::vector<int64_t> shape(ndim);
      for (auto& s : shape)
        if (!in.get(s) || s < 0) return false;
      uint64_t nbytes = 0;
      if (!in.get(nbytes)) return false;
      Tensor t(static_cast<DType>(dtype), shape);
      if (nbytes != t.nbytes() || !in.bytes(t.raw(), nbytes)) return false;
      outputs.push_back(std::move(t));
    }
    if (!in.literal(kTrailer) || !in.at_end()) return false;
    r.status = IsolatedStatus::Ok;
    r.outputs = std::move(outputs);
    return true;
  }
  if (tag == 1) {
    uint8_t kind = 0;
    int32_t call_status = 0;
    uint32_t len = 0;
    if (!in.get(kind) || !in.get(call_status) || !in.get(len)) return false;
    std::string msg(len, '\0');
    if (!in.bytes(msg.data(), len) || !in.literal(kTrailer) || !in.at_end()) return false;
    if (kind > static_cast<uint8_t>(ThrownKind::Other)) return false;
    r.status = IsolatedStatus::Threw;
    r.thrown = static_cast<ThrownKind>(kind);
    r.call_status = call_status;
    r.message = std::move(msg);
    return true;
  }
  return false;
}

bool write_all(int fd, const std::string& buf) {
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = ::write(fd, buf.data() + done, buf.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// Runs in the child: never returns.
[[noreturn]] void child_main(const std::function<std::vector<Tensor>()>& fn, int result_fd,
                             int output_fd, pid_t parent) {
  // Die with the parent (a killed auditor must not leave a hung kernel behind); the check
  // after prctl covers a parent that died before it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(4);
  ::signal(SIGINT, SIG_DFL);  // the parent's InterruptHandlers are not ours
  ::signal(SIGTERM, SIG_DFL);
  ::setpgid(0, 0);  // own process group, so the parent can kill anything we spawn
  struct rlimit no_core = {0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);  // a crash should not spend seconds writing a core
  ::dup2(output_fd, STDOUT_FILENO);
  ::dup2(output_fd, STDERR_FILENO);
  ::close(output_fd);
  std::string buf;
  try {
    buf = serialize_outputs(fn());
  } catch (const dsa::oracle::NotSupported& e) {
    buf = serialize_exception(ThrownKind::NotSupported, 0, e.what());
  } catch (const PluginLoadError& e) {
    buf = serialize_exception(ThrownKind::PluginLoadError, 0, e.what());
  } catch (const ContractViolation& e) {
    buf = serialize_exception(ThrownKind::ContractViolation, 0, e.what());
  } catch (const PluginCallError& e) {
    buf = serialize_exception(ThrownKind::PluginCallError, e.status(), e.what());
  } catch (const IsolatedFailure& e) {
    buf = serialize_exception(ThrownKind::IsolatedFailure, e.timed_out() ? 1 : 0, e.what());
  } catch (const std::invalid_argument& e) {
    buf = serialize_exception(ThrownKind::InvalidArgument, 0, e.what());
  } catch (const std::exception& e) {
    buf = serialize_exception(ThrownKind::Other, 0, e.what());
  } catch (...) {
    buf = serialize_exception(ThrownKind::Other, 0, "non-standard exception");
  }
  ::fflush(stdout);
  ::fflush(stderr);
  bool ok = write_all(result_fd, buf);
  ::close(result_fd);
  ::_exit(ok ? 0 : 3);
}

const char* signal_abbrev(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGTRAP: return "SIGTRAP";
    case SIGPIPE: return "SIGPIPE";
    default: return "signal";
  }
}

void append_tail(std::string& tail, const char* data, size_t n) {
  tail.append(data, n);
  if (tail.size() > 2 * kTailBytes) tail.erase(0, tail.size() - kTailBytes);
}

std::string with_tail(std::string msg, const std::string& tail) {
  if (!tail.empty()) msg += "; child output (tail): " + tail;
  return msg;
}

}  // namespace

const char* to_string(IsolatedStatus status) {
  switch (status) {
    case IsolatedStatus::Ok: return "ok";
    case IsolatedStatus::Crashed: return "crashed";
    case IsolatedStatus::TimedOut: return "timed_out";
    case IsolatedStatus::Threw: return "threw";
    case IsolatedStatus::Interrupted: return "interrupted";
  }
  return "unknown";
}

IsolatedResult run_isolated(const std::function<std::vector<Tensor>()>& fn,
                            std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0)
    throw std::invalid_argument("run_isolated: argument 'timeout' got " +
                                std::to_string(timeout.count()) + " ms, expected > 0");
  int result_pipe[2];
  int output_pipe[2];
  if (::pipe2(result_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("run_isolated: pipe failed: ") + std::strerror(errno));
  if (::pipe2(output_pipe, O_CLOEXEC) != 0) {
    int err = errno;
    ::close(result_pipe[0]);
    ::close(result_pipe[1]);
    throw std::runtime_error(std::string("run_isolated: pipe failed: ") + std::strerror(err));
  }
  if (g_interrupt_signal.load() != 0) {
    for (int fd : {result_pipe[0], result_pipe[1], output_pipe[0], output_pipe[1]}) ::close(fd);
    return interrupted_result(false, "");
  }
  ::fflush(nullptr);  // nothing buffered in the parent is written twice
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    for (int fd : {result_pipe[0], result_pipe[1], output_pipe[0], output_pipe[1]}) ::close(fd);
    throw std::runtime_error(std::string("run_isolated: fork failed: ") + std::strerror(err));
  }
  if (pid == 0) {
    ::close(result_pipe[0]);
    ::close(output_pipe[0]);
    child_main(fn, result_pipe[1], output_pipe[1], parent);
  }
  ::setpgid(pid, pid);  // also done by the child; whichever runs first wins, same effect
  // From here the signal handler kills it. More concurrent calls than slots (never with
  // thread counts up to 1024) would leave this child to the interrupt check below.
  std::atomic<int>* slot = nullptr;
  for (auto& s : g_running_children) {
    int free_slot = 0;
    if (s.compare_exchange_strong(free_slot, pid)) {
      slot = &s;
      break;
    }
  }
  ::close(result_pipe[1]);
  ::close(output_pipe[1]);

  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  std::string payload;
  std::string tail;
  bool timed_out = false;
  bool interrupted = false;
  struct pollfd fds[2] = {{result_pipe[0], POLLIN, 0}, {output_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char chunk[65536];
  while (open_fds > 0) {
    if (g_interrupt_signal.load() != 0) {  // after the store above: no signal is missed
      interrupted = true;
      break;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    int n = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t got = ::read(fds[i].fd, chunk, sizeof chunk);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else if (i == 0) {
        payload.append(chunk, static_cast<size_t>(got));
      } else {
        append_tail(tail, chunk, static_cast<size_t>(got));
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);

  // The pipes are closed; wait for the child itself (it may still hang after closing them).
  // The handler no longer kills it: once reaped, its pid may belong to another process.
  if (slot) slot->store(0);
  int wstatus = 0;
  while (!timed_out && !interrupted) {
    pid_t w = ::waitpid(pid, &wstatus, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (Clock::now() >= deadline) {
      timed_out = true;
      break;
    }
    if (g_interrupt_signal.load() != 0) {
      interrupted = true;
      break;
    }
    ::usleep(1000);
  }
  if (timed_out || interrupted) {
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
  }
  if (tail.size() > kTailBytes) tail.erase(0, tail.size() - kTailBytes);

  if (interrupted) return interrupted_result(true, tail);
  IsolatedResult r;
  r.output_tail = tail;
  if (timed_out) {
    r.status = IsolatedStatus::TimedOut;
    r.signal = SIGKILL;
    r.message = with_tail("timed out after " + std::to_string(timeout.count()) +
                              " ms; killed with SIGKILL",
                          tail);
    return r;
  }
  if (WIFSIGNALED(wstatus)) {
    if (WTERMSIG(wstatus) == SIGKILL && g_interrupt_signal.load() != 0)
      return interrupted_result(true, tail);  // the handler killed it
    r.status = IsolatedStatus::Crashed;
    r.signal = WTERMSIG(wstatus);
    r.message = with_tail(std::string("crashed with ") + signal_abbrev(r.signal) + " (" +
                              std::to_string(r.signal) + ", " + ::strsignal(r.signal) + ")",
                          tail);
    return r;
  }
  r.exit_code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  if (r.exit_code == 0 && parse_payload(payload, r)) return r;  // done before any signal
  if (g_interrupt_signal.load() != 0) return interrupted_result(true, tail);  // killed by it
  r.status = IsolatedStatus::Crashed;
  r.outputs.clear();
  r.message = with_tail("exited with code " + std::to_string(r.exit_code) +
                            " without returning a complete result",
                        tail);
  return r;
}

void rethrow_in_parent(const IsolatedResult& r, const std::string& context) {
  switch (r.status) {
    case IsolatedStatus::Ok:
      return;
    case IsolatedStatus::Crashed:
    case IsolatedStatus::TimedOut:
    case IsolatedStatus::Interrupted:
      throw IsolatedFailure(context + ": " + r.message, r.status == IsolatedStatus::TimedOut);
    case IsolatedStatus::Threw:
      break;
  }
  switch (r.thrown) {
    case ThrownKind::NotSupported: throw dsa::oracle::NotSupported(r.message);
    case ThrownKind::PluginLoadError: throw PluginLoadError(r.message);
    case ThrownKind::ContractViolation: throw ContractViolation(r.message);
    case ThrownKind::PluginCallError: throw PluginCallError(r.message, r.call_status);
    case ThrownKind::IsolatedFailure: throw IsolatedFailure(r.message, r.call_status != 0);
    case ThrownKind::InvalidArgument: throw std::invalid_argument(r.message);
    case ThrownKind::Other: throw std::runtime_error(r.message);
  }
  throw std::runtime_error(r.message);
}

InterruptHandlers::InterruptHandlers() {
  if (g_handlers_live.exchange(true))
    throw std::logic_error("InterruptHandlers: an instance is already live");
  g_interrupt_signal.store(0);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_interrupt_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  sa.sa_flags = SA_RESETHAND;  // no SA_RESTART: a blocking poll returns EINTR and rechecks
  // A signal ignored by whoever started us (nohup; `cmd &` in a script ignores SIGINT) stays
  // ignored.
  for (auto [sig, previous] : {std::pair{SIGINT, &g_previous_int}, std::pair{SIGTERM, &g_previous_term}}) {
    ::sigaction(sig, nullptr, previous);
    if (previous->sa_handler != SIG_IGN) ::sigaction(sig, &sa, nullptr);
  }
}

InterruptHandlers::~InterruptHandlers() {
  ::sigaction(SIGINT, &g_previous_int, nullptr);
  ::sigaction(SIGTERM, &g_previous_term, nullptr);
  g_interrupt_signal.store(0);
  g_handlers_live.store(false);
}

int InterruptHandlers::signal() const { return g_interrupt_signal.load(); }

int interrupt_signal() { return g_interrupt_signal.load(); }

}  // namespace dsa::plugin

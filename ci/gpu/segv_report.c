/* Where a process dies on SIGSEGV/SIGBUS when no debugger is installed (the GPU machine has no
   gdb): LD_PRELOAD this library and the handler prints the faulting instruction as
   library+offset (symbol+offset when dladdr knows it), then every word of the stack above the
   faulting frame that points into a loaded library's code, as a frame-pointer-free "stack scan"
   (candidates, not a verified backtrace: the unwinder itself may be what crashed). Build:
     gcc -shared -fPIC -O1 -o segv_report.so segv_report.c -ldl
   Diagnostic only (ci/gpu/py_crash_probe.sh); not part of the product. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static void where(const char* tag, uintptr_t pc) {
  Dl_info info;
  char line[512];
  int n;
  if (dladdr((void*)pc, &info) && info.dli_fname) {
    const char* base = strrchr(info.dli_fname, '/');
    n = snprintf(line, sizeof line, "%s %#lx %s+%#lx %s+%#lx\n", tag, (unsigned long)pc,
                 base ? base + 1 : info.dli_fname, (unsigned long)(pc - (uintptr_t)info.dli_fbase),
                 info.dli_sname ? info.dli_sname : "?",
                 (unsigned long)(info.dli_saddr ? pc - (uintptr_t)info.dli_saddr : 0));
  } else {
    n = snprintf(line, sizeof line, "%s %#lx (no library)\n", tag, (unsigned long)pc);
  }
  if (n > 0) (void)!write(2, line, (size_t)n);
}

static void handler(int sig, siginfo_t* si, void* ctx) {
  ucontext_t* uc = (ucontext_t*)ctx;
  char line[128];
  int n = snprintf(line, sizeof line, "segv_report: signal %d at address %p\n", sig, si->si_addr);
  (void)!write(2, line, (size_t)n);
  where("segv_report: pc", (uintptr_t)uc->uc_mcontext.gregs[REG_RIP]);
  uintptr_t* sp = (uintptr_t*)uc->uc_mcontext.gregs[REG_RSP];
  int shown = 0;
  for (int i = 0; i < 4096 && shown < 60; ++i) {
    Dl_info info;
    if (dladdr((void*)sp[i], &info) && info.dli_fname && sp[i] > (uintptr_t)info.dli_fbase + 0x1000) {
      where("segv_report: stack", sp[i]);
      ++shown;
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  static char stack[1 << 16];
  stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0};
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
}

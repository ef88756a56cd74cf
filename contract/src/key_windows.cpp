#include "dsa/contract/key_windows.h"

#include <algorithm>
#include <string>

#include "dsa/contract/errors.h"

namespace dsa {

static int64_t clamp_key(int64_t v, int64_t s_kv) { return std::min(std::max<int64_t>(v, 0), s_kv); }

KeyWindows KeyWindows::full(int64_t s_q, int64_t s_kv) {
  check_arg(s_q >= 0, "KeyWindows::full", "s_q", std::to_string(s_q), ">= 0");
  check_arg(s_kv >= 0, "KeyWindows::full", "s_kv", std::to_string(s_kv), ">= 0");
  return KeyWindows{std::vector<int64_t>(s_q, 0), std::vector<int64_t>(s_q, s_kv), s_kv};
}

KeyWindows KeyWindows::causal(int64_t s_q, int64_t s_kv, int64_t offset) {
  check_arg(s_q >= 0, "KeyWindows::causal", "s_q", std::to_string(s_q), ">= 0");
  check_arg(s_kv >= 0, "KeyWindows::causal", "s_kv", std::to_string(s_kv), ">= 0");
  if (offset < 0) offset = s_kv - s_q;
  KeyWindows w{std::vector<int64_t>(s_q, 0), std::vector<int64_t>(s_q), s_kv};
  for (int64_t t = 0; t < s_q; ++t) w.ke[t] = clamp_key(offset + t + 1, s_kv);
  return w;
}

KeyWindows KeyWindows::varlen(const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k) {
  const char* where = "KeyWindows::varlen";
  check_arg(!cu_q.empty() && cu_q.size() == cu_k.size(), where, "cu_seqlens_k",
            std::to_string(cu_k.size()) + " entries",
            std::to_string(cu_q.size()) + " entries (same as cu_seqlens_q, at least 1)");
  check_arg(cu_q[0] == 0, where, "cu_seqlens_q[0]", std::to_string(cu_q[0]), "0");
  check_arg(cu_k[0] == 0, where, "cu_seqlens_k[0]", std::to_string(cu_k[0]), "0");
  KeyWindows w;
  w.s_kv = cu_k.back();
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) {
    int64_t len_q = cu_q[b + 1] - cu_q[b], len_k = cu_k[b + 1] - cu_k[b];
    check_arg(len_q >= 0, where, "cu_seqlens_q", "a decrease at " + std::to_string(b), "non-decreasing");
    check_arg(len_k >= len_q, where, "cu_seqlens_k",
              "segment " + std::to_string(b) + " with " + std::to_string(len_k) + " keys",
              "at least len_q = " + std::to_string(len_q));
    for (int64_t i = 0; i < len_q; ++i) {
      w.ks.push_back(cu_k[b]);
      w.ke.push_back(clamp_key(cu_k[b] + (len_k - len_q) + i + 1, w.s_kv));
    }
  }
  return w;
}

KeyWindows KeyWindows::mtp(const std::vector<int64_t>& context_lens, int64_t next_n) {
  const char* where = "KeyWindows::mtp";
  check_arg(next_n >= 1, where, "next_n", std::to_string(next_n), ">= 1");
  KeyWindows w;
  int64_t start = 0;
  for (size_t b = 0; b < context_lens.size(); ++b) start += context_lens[b];
  w.s_kv = start;
  start = 0;
  for (size_t b = 0; b < context_lens.size(); ++b) {
    int64_t L = context_lens[b];
    check_arg(L >= next_n, where, "context_lens", "request " + std::to_string(b) + " of " +
              std::to_string(L) + " keys", "at least next_n = " + std::to_string(next_n));
    for (int64_t i = 0; i < next_n; ++i) {
      w.ks.push_back(start);
      w.ke.push_back(clamp_key(start + L - next_n + i + 1, w.s_kv));
    }
    start += L;
  }
  return w;
}

KeyWindows KeyWindows::explicit_windows(std::vector<int64_t> ks, std::vector<int64_t> ke,
                                        int64_t s_kv) {
  const char* where = "KeyWindows::explicit_windows";
  check_arg(ks.size() == ke.size(), where, "ke", std::to_string(ke.size()) + " rows",
            std::to_string(ks.size()) + " rows (as ks)");
  check_arg(s_kv >= 0, where, "s_kv", std::to_string(s_kv), ">= 0");
  for (auto& v : ks) v = clamp_key(v, s_kv);
  for (auto& v : ke) v = clamp_key(v, s_kv);
  return KeyWindows{std::move(ks), std::move(ke), s_kv};
}

}  // namespace dsa

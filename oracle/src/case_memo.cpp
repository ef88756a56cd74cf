#include "dsa/oracle/case_memo.h"
#include "dsa/oracle/scoped_case_memo.h"

#include <cstdio>
#include <cstring>
#include <vector>

namespace dsa::oracle {

CaseMemo::Entry& CaseMemo::entry(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Entry>& e = entries_[key];
  if (!e) e = std::make_unique<Entry>();
  return *e;
}

// Entry locks are taken after mu_ is released: make() may itself ask the memo for another
// key while holding its entry's lock.
int CaseMemo::computations(const std::string& key) const {
  Entry* e = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return 0;
    e = it->second.get();
  }
  std::lock_guard<std::mutex> entry_lock(e->mu);
  return e->computations;
}

int CaseMemo::total_computations() const {
  std::vector<Entry*> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, e] : entries_) all.push_back(e.get());
  }
  int n = 0;
  for (Entry* e : all) {
    std::lock_guard<std::mutex> entry_lock(e->mu);
    n += e->computations;
  }
  return n;
}

std::map<std::string, int> CaseMemo::counts() const {
  std::vector<std::pair<std::string, Entry*>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, e] : entries_) all.emplace_back(key, e.get());
  }
  std::map<std::string, int> out;
  for (const auto& [key, e] : all) {
    std::lock_guard<std::mutex> entry_lock(e->mu);
    out[key] = e->computations;
  }
  return out;
}

namespace {
thread_local CaseMemo* g_scoped_memo = nullptr;
}  // namespace

CaseMemo* scoped_case_memo() { return g_scoped_memo; }

ScopedCaseMemo::ScopedCaseMemo(std::shared_ptr<CaseMemo> memo)
    : memo_(std::move(memo)), previous_(g_scoped_memo) {
  g_scoped_memo = memo_.get();
}

ScopedCaseMemo::~ScopedCaseMemo() { g_scoped_memo = previous_; }

// Fingerprint: each 8-byte word goes through a multiply-xorshift round (the finalizer of
// MurmurHash3 / SplitMix64 style); four lanes keep the multiplies independent.
void Fingerprint::mix(uint64_t w) {
  uint64_t h = h_ ^ (w + 0x9e3779b97f4a7c15ull + (h_ << 6) + (h_ >> 2));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h_ = h;
}

Fingerprint& Fingerprint::add(const Tensor& t) {
  mix(static_cast<uint64_t>(t.defined()));
  mix(static_cast<uint64_t>(t.dtype()));
  mix(static_cast<uint64_t>(t.dim()));
  for (int64_t d : t.shape()) mix(static_cast<uint64_t>(d));
  const size_t n = t.nbytes();
  const unsigned char* p = reinterpret_cast<const unsigned char*>(t.raw());
  uint64_t lane[4] = {1, 2, 3, 4};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      uint64_t x = lane[l] ^ w;
      x *= 0x9e3779b97f4a7c15ull;
      lane[l] = x ^ (x >> 29);
    }
  for (uint64_t x : lane) mix(x);
  for (; i < n; ++i) mix(p[i]);
  mix(n);
  return *this;
}

Fingerprint& Fingerprint::add(const std::optional<Tensor>& t) {
  mix(t.has_value());
  if (t) add(*t);
  return *this;
}

Fingerprint& Fingerprint::add(const KeyWindows& w) {
  mix(static_cast<uint64_t>(w.s_kv));
  mix(w.ks.size());
  for (int64_t v : w.ks) mix(static_cast<uint64_t>(v));
  for (int64_t v : w.ke) mix(static_cast<uint64_t>(v));
  return *this;
}

Fingerprint& Fingerprint::add(double v) {
  uint64_t w;
  std::memcpy(&w, &v, 8);
  mix(w);
  return *this;
}

Fingerprint& Fingerprint::add(int64_t v) {
  mix(static_cast<uint64_t>(v));
  return *this;
}

std::string Fingerprint::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
  return buf;
}

namespace {
std::mutex counts_mu;
std::map<std::string, int64_t>& counts_map() {
  static std::map<std::string, int64_t> m;
  return m;
}
}  // namespace

std::map<std::string, int64_t> computation_counts() {
  std::lock_guard<std::mutex> lock(counts_mu);
  return counts_map();
}

namespace detail {
void count_computation(const std::string& kind) {
  std::lock_guard<std::mutex> lock(counts_mu);
  ++counts_map()[kind];
}
}  // namespace detail

}  // namespace dsa::oracle

// Results computed once per case and shared by every backend, route and output judged on
// that case (issue 13): the float64 reference, the baseline at each precision, the floor
// inputs of the local bounds. Thread-safe, so cases and backends may be judged concurrently.
#pragma once

#include <any>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsa/contract/key_windows.h"
#include "dsa/contract/tensor.h"

namespace dsa::oracle {

class CaseMemo {
 public:
  /// The value stored under `key`, computing it with make() on first use (later callers of
  /// the key wait for that result, then share it). make() returns T; every call with one key
  /// must use the same T (std::logic_error naming the key otherwise). When make() throws,
  /// the exception propagates and nothing is stored (the next caller computes again).
  /// The reference stays valid as long as the memo lives.
  template <class T, class Make>
  const T& get(const std::string& key, Make&& make) {
    Entry& e = entry(key);
    std::lock_guard<std::mutex> lock(e.mu);
    if (!e.value.has_value()) {
      ++e.computations;
      e.value = T(make());
    }
    const T* v = std::any_cast<T>(&e.value);
    if (!v) throw std::logic_error("CaseMemo: key '" + key + "' was stored with another type");
    return *v;
  }

  /// How many times make() ran for `key` (0 when never asked; 1 once computed). For tests.
  int computations(const std::string& key) const;
  /// make() runs over every key of this memo.
  int total_computations() const;
  /// computations() of every key asked so far, by key. For tests.
  std::map<std::string, int> counts() const;

 private:
  struct Entry {
    std::mutex mu;
    std::any value;
    int computations = 0;
  };
  Entry& entry(const std::string& key);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> entries_;
};

/// A 64-bit digest of the inputs a memoized result depends on (dtypes, shapes, bytes, scalar
/// parameters, in the order added), so that a copy of a case whose inputs were changed does not
/// share the original's results: memo keys end with "@" + hex(). Not cryptographic: only
/// inputs of the case go in, never a candidate's outputs (those results are not memoized).
class Fingerprint {
 public:
  Fingerprint& add(const Tensor& t);
  Fingerprint& add(const std::optional<Tensor>& t);
  Fingerprint& add(const KeyWindows& w);
  Fingerprint& add(double v);
  Fingerprint& add(int64_t v);
  /// 16 lowercase hex digits.
  std::string hex() const;

 private:
  void mix(uint64_t w);
  uint64_t h_ = 0x6a09e667f3bcc908ull;
};

/// Process-wide count of computations made through shared_result, by kind (e.g.
/// "sparse_mla_fwd/reference"), memoized or not. For the tests of issue 13 (each computation
/// once per case): compare two snapshots.
std::map<std::string, int64_t> computation_counts();
namespace detail {
void count_computation(const std::string& kind);
}

/// The result of make() (a T) for `kind` on inputs with fingerprint `fp`: computed once per
/// memo and shared when `memo` is not null (key kind + "@" + fp), else computed on every call.
/// Each run of make() is counted under `kind` (computation_counts). Exceptions of make()
/// propagate (nothing stored).
template <class T, class Make>
std::shared_ptr<const T> shared_result(CaseMemo* memo, const std::string& kind,
                                       const Fingerprint& fp, Make&& make) {
  auto run = [&]() -> std::shared_ptr<const T> {
    detail::count_computation(kind);
    return std::make_shared<const T>(make());
  };
  if (!memo) return run();
  return memo->get<std::shared_ptr<const T>>(kind + "@" + fp.hex(), run);
}

}  // namespace dsa::oracle

// Results computed once per case and shared by every backend, route and output judged on
// that case (issue 13): the float64 reference, the baseline at each precision, the floor
// inputs of the local bounds. Thread-safe, so cases and backends may be judged concurrently.
#pragma once

#include <any>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

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

}  // namespace dsa::oracle

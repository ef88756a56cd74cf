#include "dsa/oracle/case_memo.h"

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

}  // namespace dsa::oracle

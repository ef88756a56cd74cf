// Global RecordFunction callback feeding every live TopkCounter (SPEC §8 op-level counting).
#include "dsa/optimized/topk_counter.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <cstring>
#include <mutex>

namespace dsa::optimized {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<std::atomic<int64_t>>> live;
  at::CallbackHandle handle = 0;
  bool installed = false;
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: callbacks may run during exit
  return *r;
}

bool is_topk(const char* name) {
  if (name == nullptr) return false;
  for (const char* n : counted_topk_ops())
    if (std::strcmp(name, n) == 0) return true;
  return false;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (is_topk(fn.name())) {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& c : r.live) c->fetch_add(1);
  }
  return nullptr;
}

}  // namespace

const std::vector<const char*>& counted_topk_ops() {
  static const std::vector<const char*> names{"dsa::topk_indices", "aten::topk"};
  return names;
}

TopkCounter::TopkCounter() : count_(std::make_shared<std::atomic<int64_t>>(0)) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.live.push_back(count_);
  if (!r.installed) {
    r.handle = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_start).scopes({at::RecordScope::FUNCTION}));
    r.installed = true;
  }
}

TopkCounter::~TopkCounter() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.live.erase(std::remove(r.live.begin(), r.live.end(), count_), r.live.end());
  if (r.live.empty() && r.installed) {
    at::removeCallback(r.handle);
    r.installed = false;
  }
}

}  // namespace dsa::optimized

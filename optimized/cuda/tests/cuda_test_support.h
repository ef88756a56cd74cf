// Helpers shared by the `cuda` backend's GoogleTest files (cuda_backend_test.cpp,
// indexer_test.cpp): the device-skipping fixture and the random key-window generator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dsa/contract/key_windows.h"
#include "dsa/cuda/backend.h"

namespace dsa::cuda::test {

/// Fixture of every device test: backend_ is the default `cuda` backend; the test is skipped
/// (GTEST_SKIP, with the backend's reason) when it is unavailable (no device, no driver).
class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_cuda_backend();
    const std::string why = backend_->unavailable_reason();
    if (!why.empty()) GTEST_SKIP() << "cuda backend unavailable: " << why;
  }
  std::unique_ptr<dsa::oracle::Backend> backend_;
};

/// Explicit key windows (SPEC §1) of s_q rows over s_kv keys, ks and ke uniform in [0, s_kv]
/// from a mt19937_64 seeded with `seed`; ordered ks <= ke except on every third row (t % 3 ==
/// 2), which may be empty (ke < ks).
inline KeyWindows random_windows(int64_t s_q, int64_t s_kv, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pos(0, s_kv);
  std::vector<int64_t> ks(s_q), ke(s_q);
  for (int64_t t = 0; t < s_q; ++t) {
    ks[t] = pos(rng);
    ke[t] = pos(rng);
    if (t % 3 != 2 && ks[t] > ke[t]) std::swap(ks[t], ke[t]);  // every third row may be empty
  }
  return KeyWindows::explicit_windows(ks, ke, s_kv);
}

}  // namespace dsa::cuda::test

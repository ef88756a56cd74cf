// CaseMemo (case_memo.h): one computation per key, shared by concurrent callers.
#include "dsa/oracle/case_memo.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dsa::oracle {
namespace {

TEST(CaseMemo, ComputesEachKeyOnceAcrossThreads) {
  CaseMemo memo;
  std::atomic<int> calls{0};
  std::vector<std::thread> threads;
  std::vector<const std::vector<double>*> seen(8);
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      seen[static_cast<size_t>(i)] = &memo.get<std::vector<double>>("ref", [&] {
        ++calls;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return std::vector<double>{1.0, 2.0};
      });
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(memo.computations("ref"), 1);
  for (const auto* p : seen) EXPECT_EQ(p, seen[0]) << "callers got different copies";
  EXPECT_EQ(memo.get<std::vector<double>>("base", [] { return std::vector<double>{3.0}; }).size(), 1u);
  EXPECT_EQ(memo.total_computations(), 2);
  EXPECT_EQ(memo.computations("never"), 0);
}

TEST(CaseMemo, AFailedComputationIsNotStoredAndTypesMustMatch) {
  CaseMemo memo;
  EXPECT_THROW(memo.get<int>("k", []() -> int { throw std::invalid_argument("bad input"); }),
               std::invalid_argument);
  EXPECT_EQ(memo.get<int>("k", [] { return 7; }), 7);
  EXPECT_EQ(memo.computations("k"), 2);
  EXPECT_THROW(memo.get<double>("k", [] { return 1.0; }), std::logic_error);
  // make() may ask the memo for another key (no deadlock).
  EXPECT_EQ(memo.get<int>("outer", [&] { return memo.get<int>("inner", [] { return 2; }) + 1; }), 3);
}

}  // namespace
}  // namespace dsa::oracle

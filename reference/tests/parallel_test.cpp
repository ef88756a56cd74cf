// parallel_for (contract/parallel.h) and the reference's thread-count independence
// (issue 13): every op returns the same bytes with 1 and 4 threads (sparse MLA: 2, 3, 4, 7).
#include "dsa/contract/parallel.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "dsa/reference/indexer.h"
#include "dsa/reference/kl_loss.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/reference/topk.h"
#include "test_support.h"

namespace dsa {
namespace {

using reference::Precision;

// Restores the thread budget a test changed.
struct ThreadsGuard {
  int saved = max_threads();
  ~ThreadsGuard() { set_max_threads(saved); }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// Distinct thread ids that ran chunks of a loop of n slow items.
std::set<std::thread::id> threads_used(int64_t n) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  parallel_for(n, 1e9, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  return ids;
}

TEST(ParallelFor, CoversEachIndexOnceAndUsesHelperThreads) {
  ThreadsGuard guard;
  set_max_threads(4);
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(1000, 1e9, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
  });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
  EXPECT_GT(threads_used(16).size(), 1u) << "a budget of 4 threads ran the loop on one thread";
  set_max_threads(1);
  EXPECT_EQ(threads_used(16).size(), 1u) << "a budget of 1 thread started helpers";
}

TEST(ParallelFor, SmallLoopsAndForkedChildrenRunSerially) {
  ThreadsGuard guard;
  set_max_threads(4);
  std::set<std::thread::id> ids;
  parallel_for(64, 1.0, [&](int64_t, int64_t) { ids.insert(std::this_thread::get_id()); });
  EXPECT_EQ(ids.size(), 1u) << "64 flops of work started helper threads";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(threads_used(16).size() == 1 ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a forked child started helper threads";
}

TEST(ParallelFor, RethrowsTheFirstErrorAndRejectsABadBudget) {
  ThreadsGuard guard;
  set_max_threads(4);
  EXPECT_THROW(parallel_for(100, 1e9,
                            [](int64_t b, int64_t) {
                              if (b >= 0) throw std::runtime_error("chunk failed");
                            }),
               std::runtime_error);
  // The budget is whole again after a failed loop.
  EXPECT_GT(threads_used(16).size(), 1u);
  EXPECT_THROW(set_max_threads(0), std::invalid_argument);
}

TEST(ParallelOrdered, EmitsInIndexOrderWhateverFinishesFirst) {
  ThreadsGuard guard;
  set_max_threads(4);
  std::vector<int64_t> emitted;
  std::set<std::thread::id> ids;
  std::mutex mu;
  parallel_ordered(
      12,
      [&](int64_t i) {  // early items are the slowest: they finish last
        std::this_thread::sleep_for(std::chrono::milliseconds(2 * (12 - i)));
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      },
      [&](int64_t i) { emitted.push_back(i); });
  EXPECT_EQ(emitted, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_GT(ids.size(), 1u) << "items ran on one thread with a budget of 4";
  emitted.clear();
  parallel_ordered(
      100, [](int64_t) {}, [&](int64_t i) { emitted.push_back(i); },
      [](int64_t i) { return i == 3; });
  EXPECT_EQ(emitted, (std::vector<int64_t>{0, 1, 2, 3})) << "fail_fast at item 3";
  EXPECT_THROW(parallel_ordered(
                   8, [](int64_t i) { if (i == 5) throw std::runtime_error("item 5"); },
                   [](int64_t) {}),
               std::runtime_error);
}

// Runs `op` with 1 thread and with each of `counts` threads and expects equal bytes in every
// output tensor.
template <class Op>
void expect_thread_independent(const char* what, Op op, std::initializer_list<int> counts = {4}) {
  ThreadsGuard guard;
  set_max_threads(1);
  const std::vector<Tensor> one = op();
  for (int n : counts) {
    set_max_threads(n);
    const std::vector<Tensor> many = op();
    ASSERT_EQ(one.size(), many.size());
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(same_bytes(one[i], many[i]))
          << what << ": output " << i << " differs between 1 and " << n << " threads";
  }
}

SparseMlaInputs mla_inputs(bool sink) {
  const int64_t s_q = 37, h_q = 8, d_qk = 80, s_kv = 150, k = 64;
  SparseMlaInputs in;
  in.q = test::random_f64({s_q, h_q, d_qk}, 1).to(DType::BF16);
  in.kv = test::random_f64({s_kv, d_qk}, 2).to(DType::BF16);
  std::vector<int32_t> ids(static_cast<size_t>(s_q * k));
  std::vector<int32_t> len(static_cast<size_t>(s_q));
  for (int64_t t = 0; t < s_q; ++t) {
    for (int64_t j = 0; j < k; ++j)  // repeats (separate terms), -1 holes, out of range
      ids[static_cast<size_t>(t * k + j)] =
          j % 13 == 5 ? -1 : (j % 17 == 3 ? static_cast<int32_t>(s_kv) : static_cast<int32_t>((t * 7 + j * 5) % s_kv));
    len[static_cast<size_t>(t)] = t % 5 == 1 ? 0 : static_cast<int32_t>(k - t % 9);
  }
  in.indices = Tensor::from_i32({s_q, k}, ids);
  in.topk_length = Tensor::from_i32({s_q}, len);
  in.sm_scale = 0.11;
  in.d_v = 64;
  if (sink) in.attn_sink = test::random_f64({h_q}, 3);
  return in;
}

TEST(ThreadCount, SparseMlaForwardAndBackwardBytesDoNotDepend) {
  for (bool sink : {false, true})
    for (Precision p : {Precision::Reference, Precision::Baseline}) {
      const SparseMlaInputs in = mla_inputs(sink);
      const Tensor dout = test::random_f64({in.q.size(0), in.q.size(1), in.d_v}, 4);
      // 2, 3, 4 and 7 threads: the backward's ring (2 slots per thread, reused across the 37
      // rows) and key chunks (4 per thread) change with the count; the sums must not.
      expect_thread_independent(
          "sparse_mla_forward",
          [&] {
            const SparseMlaForward f = reference::sparse_mla_forward(in, p);
            return std::vector<Tensor>{f.out, f.lse, f.max_logits};
          },
          {2, 3, 4, 7});
      expect_thread_independent(
          "sparse_mla_backward",
          [&] {
            const SparseMlaGrads g = reference::sparse_mla_backward(in, dout, p);
            std::vector<Tensor> v{g.dq, g.dkv};
            if (g.dsink) v.push_back(*g.dsink);
            return v;
          },
          {2, 3, 4, 7});
    }
}

TEST(ThreadCount, IndexerTopkAndKlBytesDoNotDepend) {
  const int64_t s_q = 41, h_i = 4, d_i = 32, s_kv = 300, k = 24;
  const Tensor q = test::random_f64({s_q, h_i, d_i}, 5).to(DType::BF16);
  const Tensor kk = test::random_f64({s_kv, d_i}, 6).to(DType::BF16);
  const Tensor w = test::random_f64({s_q, h_i}, 7).to(DType::F32);
  std::vector<int64_t> ks(static_cast<size_t>(s_q)), ke(static_cast<size_t>(s_q));
  for (int64_t t = 0; t < s_q; ++t) {
    ks[static_cast<size_t>(t)] = (t * 3) % 40;
    ke[static_cast<size_t>(t)] = t % 7 == 2 ? ks[static_cast<size_t>(t)] : s_kv - (t * 11) % 90;
  }
  const KeyWindows win = KeyWindows::explicit_windows(ks, ke, s_kv);
  const Tensor d_scores = test::random_f64({s_q, s_kv}, 8);
  for (Precision p : {Precision::Reference, Precision::Baseline}) {
    expect_thread_independent("indexer_scores", [&] {
      return std::vector<Tensor>{reference::indexer_scores(q, kk, w, win, p)};
    });
    expect_thread_independent("indexer_scores_backward", [&] {
      const IndexerGrads g = reference::indexer_scores_backward(q, kk, w, win, d_scores, p);
      return std::vector<Tensor>{g.dq_idx, g.dk_idx, g.dw};
    });
  }
  const Tensor scores = reference::indexer_scores(q, kk, w, win);
  expect_thread_independent("select_topk", [&] {
    return std::vector<Tensor>{reference::select_topk(scores, k, TopkPolicy{}, win)};
  });
  const SparseMlaInputs mla = mla_inputs(false);
  IndexerKlInputs kl;
  kl.scores = test::random_f64({mla.q.size(0), mla.kv.size(0)}, 9);
  kl.q = mla.q;
  kl.kv = mla.kv;
  kl.sm_scale = mla.sm_scale;
  kl.windows = KeyWindows::full(mla.q.size(0), mla.kv.size(0));
  for (KlMode mode : {KlMode::Dense, KlMode::Sparse}) {
    kl.mode = mode;
    if (mode == KlMode::Sparse) kl.indices = mla.indices;
    for (Precision p : {Precision::Reference, Precision::Baseline})
      expect_thread_independent("indexer_kl_loss", [&] {
        const IndexerKlResult r = reference::indexer_kl_loss(kl, p);
        return std::vector<Tensor>{r.loss, r.d_scores};
      });
  }
}

}  // namespace
}  // namespace dsa

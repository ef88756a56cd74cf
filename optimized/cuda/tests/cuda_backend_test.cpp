// The `cuda` backend against the float64 reference through the oracle (SPEC §9): top-k
// bit-exact (§3) on random, plateau, NaN/-inf/±0 and window cases at tile-edge sizes; sparse
// MLA forward (§4, §6) by the ratio rule with invalid ids, topk_length, sinks, duplicates,
// empty rows and leading invalid blocks. Every test skips (with the reason) without a device.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dsa/contract/key_windows.h"
#include "dsa/cuda/backend.h"
#include "dsa/cuda/kernels.h"
#include "dsa/oracle/op_check.h"
#include "dsa/oracle/report.h"
#include "mla_case.h"

#include "cuda_test_support.h"

namespace {

using dsa::DType;
using dsa::KeyWindows;
using dsa::Tensor;
using dsa::TieBreak;
using dsa::TopkPolicy;
using dsa::cuda::test::random_windows;
using dsa::oracle::Op;
using dsa::oracle::OpCase;
using dsa::oracle::Verdict;
using dsa_cuda_test::make_mla;
using dsa_cuda_test::MlaShape;

class CudaBackendTest : public dsa::cuda::test::CudaDeviceTest {};

// Sets an environment variable for a scope, then restores its previous value (or unsets it).
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv(name, value, 1);
  }
  ~EnvGuard() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

enum class Fill { Random, Plateau, Special };

Tensor make_scores(int64_t s_q, int64_t s_kv, Fill fill, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> small(0, 3);
  std::uniform_int_distribution<int> pick(0, 15);
  Tensor t(DType::F32, {s_q, s_kv});
  float* p = t.data<float>();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (fill) {
      case Fill::Random: p[i] = normal(rng); break;
      case Fill::Plateau: p[i] = static_cast<float>(small(rng)); break;
      case Fill::Special: {
        const int c = pick(rng);
        p[i] = c == 0   ? std::numeric_limits<float>::quiet_NaN()
               : c == 1 ? -inf
               : c == 2 ? inf
               : c == 3 ? -0.0f
               : c == 4 ? 0.0f
               : c < 8  ? static_cast<float>(small(rng)) - 1.5f
                        : normal(rng);
        break;
      }
    }
  }
  return t;
}

const char* kernel_name(dsa::cuda::TopkKernel k) {
  switch (k) {
    case dsa::cuda::TopkKernel::Radix: return "[radix] ";
    case dsa::cuda::TopkKernel::TwoRead: return "[two-read] ";
    case dsa::cuda::TopkKernel::Cluster: return "[cluster] ";
    case dsa::cuda::TopkKernel::ClusterFusedSort: return "[cluster, fused sort] ";
    case dsa::cuda::TopkKernel::Persistent: return "[persistent] ";
    case dsa::cuda::TopkKernel::PersistentWide: return "[persistent wide] ";
  }
  return "[?] ";
}

// The one-read kernels: cluster (sort afterwards), cluster with the fused sort, persistent
// (default and wide).
const std::vector<dsa::cuda::TopkKernel> kOneRead = {
    dsa::cuda::TopkKernel::Cluster, dsa::cuda::TopkKernel::ClusterFusedSort,
    dsa::cuda::TopkKernel::Persistent, dsa::cuda::TopkKernel::PersistentWide};

// Every top-k kernel (radix, two-read, the one-read kernels) is checked on every case unless
// `kernels` narrows it.
void expect_topk_pass(dsa::oracle::Backend&, const OpCase& c, const std::string& label,
                      std::vector<dsa::cuda::TopkKernel> kernels = {
                          dsa::cuda::TopkKernel::Radix, dsa::cuda::TopkKernel::TwoRead,
                          dsa::cuda::TopkKernel::Cluster, dsa::cuda::TopkKernel::ClusterFusedSort,
                          dsa::cuda::TopkKernel::Persistent,
                          dsa::cuda::TopkKernel::PersistentWide}) {
  for (auto kernel : kernels) {
    dsa::cuda::CudaBackendOptions o;
    o.topk_kernel = kernel;
    auto b = dsa::cuda::make_cuda_backend(o);
    const dsa::oracle::OpReport r = dsa::oracle::check_op(*b, Op::Topk, c);
    EXPECT_EQ(r.verdict, Verdict::Pass)
        << kernel_name(kernel) << label << "\n"
        << dsa::oracle::format_op_report(r);
  }
}

TEST_F(CudaBackendTest, TopkRandomPlateauSpecialAtTileEdges) {
  const std::vector<int64_t> kvs = {1, 63, 64, 65, 511, 512, 513, 2047, 2049};
  uint64_t seed = 1;
  for (int64_t s_kv : kvs) {
    for (int64_t k : {int64_t{1}, int64_t{64}, int64_t{2048}, s_kv + 5}) {
      for (Fill fill : {Fill::Random, Fill::Plateau, Fill::Special}) {
        for (TieBreak tb : {TieBreak::Small, TieBreak::Large, TieBreak::Any}) {
          for (bool sorted : {true, false}) {
            OpCase c;
            c.scores = make_scores(5, s_kv, fill, seed++);
            c.k = k;
            c.policy = TopkPolicy{tb, sorted};
            expect_topk_pass(*backend_, c,
                             "s_kv=" + std::to_string(s_kv) + " k=" + std::to_string(k) +
                                 " fill=" + std::to_string(static_cast<int>(fill)) +
                                 " tie=" + dsa::to_string(tb) + " sorted=" + std::to_string(sorted));
          }
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, TopkWindowsCausalAndRandom) {
  uint64_t seed = 100;
  for (int64_t s_kv : {65, 2049}) {
    for (Fill fill : {Fill::Random, Fill::Plateau, Fill::Special}) {
      for (TieBreak tb : {TieBreak::Small, TieBreak::Large}) {
        OpCase c;
        c.scores = make_scores(17, s_kv, fill, seed++);
        c.k = 64;
        c.policy = TopkPolicy{tb, true};
        c.topk_windows = KeyWindows::causal(17, s_kv);
        expect_topk_pass(*backend_, c, "causal s_kv=" + std::to_string(s_kv));
        c.topk_windows = random_windows(17, s_kv, seed++);
        expect_topk_pass(*backend_, c, "random windows s_kv=" + std::to_string(s_kv));
      }
    }
  }
}

TEST_F(CudaBackendTest, TopkProductionWidthsAndScratchPath) {
  // k = 2048 over 65536 keys (shared-memory sort), and k = 10000 (global scratch sort).
  for (Fill fill : {Fill::Random, Fill::Plateau}) {
    OpCase c;
    c.scores = make_scores(3, 65536, fill, 7 + static_cast<int>(fill));
    c.k = 2048;
    c.policy = TopkPolicy{TieBreak::Small, true};
    expect_topk_pass(*backend_, c, "65536/2048");
    c.scores = make_scores(2, 20000, fill, 9 + static_cast<int>(fill));
    c.k = 10000;
    c.policy = TopkPolicy{TieBreak::Large, true};
    expect_topk_pass(*backend_, c, "20000/10000");
  }
}

// Long rows split over a cluster of CTAs (131072 keys: 8 CTAs per row), with the rows whose
// boundary holds more candidates than any buffer: 131072 equal values, a narrow band of a few
// ulps (one bin of every radix digit but the last), a ReLU plateau of zeros; random rows too.
// Then an unaligned row length (40001 keys, 4-byte copies, partial last chunk) with windows.
TEST_F(CudaBackendTest, TopkClusterLongRowsPlateausBandsAndWindows) {
  const int64_t s_kv = 131072;
  Tensor scores(DType::F32, {4, s_kv});
  std::mt19937_64 rng(4242);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> ulps(0, 5);
  float* p = scores.data<float>();
  for (int64_t i = 0; i < s_kv; ++i) {
    p[i] = normal(rng);                                   // random
    p[s_kv + i] = 0.75f;                                  // 131072 equal values
    float b = 1.0f;                                       // narrow band: 1.0 + 0..5 ulps
    for (int u = ulps(rng); u > 0; --u) b = std::nextafter(b, 2.0f);
    p[2 * s_kv + i] = b;
    p[3 * s_kv + i] = std::max(0.0f, normal(rng) - 2.5f);  // ReLU: ~99% exact zeros
  }
  for (TieBreak tb : {TieBreak::Small, TieBreak::Large, TieBreak::Any}) {
    for (bool sorted : {true, false}) {
      for (int64_t k : {int64_t{2048}, int64_t{1}, int64_t{5000}}) {
        OpCase c;
        c.scores = scores;
        c.k = k;
        c.policy = TopkPolicy{tb, sorted};
        expect_topk_pass(*backend_, c,
                         "131072 k=" + std::to_string(k) + " tie=" + dsa::to_string(tb) +
                             " sorted=" + std::to_string(sorted),
                         kOneRead);
      }
    }
  }
  {
    OpCase c;  // the other kernels on the same rows, once
    c.scores = scores;
    c.k = 2048;
    c.policy = TopkPolicy{TieBreak::Small, true};
    expect_topk_pass(*backend_, c, "131072 k=2048 small sorted",
                     {dsa::cuda::TopkKernel::Radix, dsa::cuda::TopkKernel::TwoRead});
  }
  uint64_t seed = 900;
  for (Fill fill : {Fill::Random, Fill::Plateau, Fill::Special}) {
    for (TieBreak tb : {TieBreak::Small, TieBreak::Large}) {
      for (bool sorted : {true, false}) {
        OpCase c;
        c.scores = make_scores(6, 40001, fill, seed++);
        c.k = 3000;
        c.policy = TopkPolicy{tb, sorted};
        c.topk_windows = random_windows(6, 40001, seed++);
        expect_topk_pass(*backend_, c, "40001 windows fill=" + std::to_string(static_cast<int>(fill)),
                         kOneRead);
        c.topk_windows = std::nullopt;
        c.k = 50000;  // k > s_kv
        expect_topk_pass(*backend_, c, "40001 k=50000 fill=" + std::to_string(static_cast<int>(fill)),
                         kOneRead);
      }
    }
  }
}

// Small cases for compute-sanitizer (memcheck, racecheck: ci/gpu/test.sh, whose racecheck has
// 100 s for every sanitizer case; no more work than the round-2 version, which passed there):
// radix, two-read and cluster (with its row sort kernel) on a one-CTA row (700 keys) and on 2
// rows of 16384 keys (4-CTA clusters, odd chunk stride), random and plateau rows, sorted and
// unsorted, with windows; the cluster kernel on one 131072-key row (8 swizzled chunks a
// thread), random, and plateau unsorted (plateau rows are slow under racecheck: same-address
// shared atomics). The other one-read kernels: TopkPersistentSanitizerCases.
TEST_F(CudaBackendTest, TopkSanitizerSmall) {
  uint64_t seed = 500;
  for (int64_t s_kv : {int64_t{700}, int64_t{16384}, int64_t{131072}}) {
    for (Fill fill : {Fill::Random, Fill::Plateau}) {
      for (bool sorted : {true, false}) {
        if (s_kv > 65536 && fill == Fill::Plateau && sorted) continue;
        OpCase c;
        const int64_t rows = s_kv > 65536 ? 1 : 2;
        c.scores = make_scores(rows, s_kv, fill, seed++);
        c.k = 300;
        c.policy = TopkPolicy{TieBreak::Large, sorted};
        c.topk_windows = random_windows(rows, s_kv, seed++);
        expect_topk_pass(*backend_, c, "sanitizer s_kv=" + std::to_string(s_kv),
                         s_kv > 65536 ? std::vector<dsa::cuda::TopkKernel>{dsa::cuda::TopkKernel::Cluster}
                                      : std::vector<dsa::cuda::TopkKernel>{
                                            dsa::cuda::TopkKernel::Radix,
                                            dsa::cuda::TopkKernel::TwoRead,
                                            dsa::cuda::TopkKernel::Cluster});
      }
    }
  }
}

// Sanitizer cases of the other one-read kernels (cluster with the fused sort, persistent,
// persistent wide), kept out of TopkSanitizerSmall: under racecheck they took over 60 s on the
// H200 (2026-11-30 17:13 UTC call, no hazard reported before the timeout); memcheck passes.
// 700 keys and 2 rows of 16384 keys, random and plateau, sorted and unsorted, with windows;
// the persistent kernels with one cluster for every row (each cluster copies row i+1 while it
// selects row i and reuses its histograms and counts) on 3 rows of 16384 keys and 2 of 131072.
TEST_F(CudaBackendTest, TopkPersistentSanitizerCases) {
  const std::vector<dsa::cuda::TopkKernel> others = {dsa::cuda::TopkKernel::ClusterFusedSort,
                                                     dsa::cuda::TopkKernel::Persistent,
                                                     dsa::cuda::TopkKernel::PersistentWide};
  uint64_t seed = 600;
  for (int64_t s_kv : {int64_t{700}, int64_t{16384}}) {
    for (Fill fill : {Fill::Random, Fill::Plateau}) {
      for (bool sorted : {true, false}) {
        OpCase c;
        c.scores = make_scores(2, s_kv, fill, seed++);
        c.k = 300;
        c.policy = TopkPolicy{TieBreak::Large, sorted};
        c.topk_windows = random_windows(2, s_kv, seed++);
        expect_topk_pass(*backend_, c, "sanitizer s_kv=" + std::to_string(s_kv), others);
      }
    }
  }
  const EnvGuard one_cluster("DSA_CUDA_TOPK_MAX_CLUSTERS", "1");
  for (Fill fill : {Fill::Random, Fill::Plateau}) {
    for (bool sorted : {true, false}) {
      OpCase c;
      c.scores = make_scores(3, 16384, fill, seed++);
      c.k = 300;
      c.policy = TopkPolicy{TieBreak::Large, sorted};
      c.topk_windows = random_windows(3, 16384, seed++);
      expect_topk_pass(*backend_, c, "sanitizer, one cluster, 3x16384",
                       {dsa::cuda::TopkKernel::Persistent, dsa::cuda::TopkKernel::PersistentWide});
    }
  }
  OpCase c;
  c.scores = make_scores(2, 131072, Fill::Random, seed++);
  c.k = 300;
  c.policy = TopkPolicy{TieBreak::Small, false};
  expect_topk_pass(*backend_, c, "sanitizer, one cluster, 2x131072",
                   {dsa::cuda::TopkKernel::Persistent});
}

// The persistent kernels with several rows a cluster: the grid capped at 1 and 2 clusters
// (DSA_CUDA_TOPK_MAX_CLUSTERS) over rows of 131072 keys (random, 131072 equal values, a 6-ulp
// band, a ReLU plateau, repeated), over 40 rows of 4096 keys with windows and special values,
// and over unaligned 40001-key rows; then 300 rows of 4096 keys on the uncapped grid (more
// rows than clusters fit). Sorted and unsorted, every tie-break, k below and above the row.
TEST_F(CudaBackendTest, TopkPersistentSeveralRowsPerCluster) {
  const std::vector<dsa::cuda::TopkKernel> persistent = {dsa::cuda::TopkKernel::Persistent,
                                                         dsa::cuda::TopkKernel::PersistentWide};
  const int64_t s_kv = 131072;
  Tensor scores(DType::F32, {6, s_kv});
  std::mt19937_64 rng(777);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> ulps(0, 5);
  float* p = scores.data<float>();
  for (int64_t i = 0; i < s_kv; ++i) {
    p[i] = normal(rng);
    p[s_kv + i] = 0.75f;
    float b = 1.0f;
    for (int u = ulps(rng); u > 0; --u) b = std::nextafter(b, 2.0f);
    p[2 * s_kv + i] = b;
    p[3 * s_kv + i] = std::max(0.0f, normal(rng) - 2.5f);
    p[4 * s_kv + i] = normal(rng);
    p[5 * s_kv + i] = p[i];  // row 0 again: the same ids
  }
  uint64_t seed = 3000;
  for (const char* cap : {"1", "2"}) {
    const EnvGuard g("DSA_CUDA_TOPK_MAX_CLUSTERS", cap);
    for (TieBreak tb : {TieBreak::Small, TieBreak::Large}) {
      for (bool sorted : {true, false}) {
        for (int64_t k : {int64_t{2048}, int64_t{1}}) {
          OpCase c;
          c.scores = scores;
          c.k = k;
          c.policy = TopkPolicy{tb, sorted};
          expect_topk_pass(*backend_, c,
                           std::string("cap ") + cap + " 6x131072 k=" + std::to_string(k) +
                               " tie=" + dsa::to_string(tb) + " sorted=" + std::to_string(sorted),
                           persistent);
        }
        OpCase c;
        c.scores = make_scores(40, 4096, sorted ? Fill::Special : Fill::Plateau, seed++);
        c.k = 2048;
        c.policy = TopkPolicy{tb, sorted};
        c.topk_windows = random_windows(40, 4096, seed++);
        expect_topk_pass(*backend_, c, std::string("cap ") + cap + " 40x4096 windows", persistent);
        c.topk_windows = std::nullopt;
        c.k = 5000;  // k > s_kv
        expect_topk_pass(*backend_, c, std::string("cap ") + cap + " 40x4096 k=5000", persistent);
        c.scores = make_scores(5, 40001, Fill::Random, seed++);
        c.k = 2048;
        c.topk_windows = random_windows(5, 40001, seed++);
        expect_topk_pass(*backend_, c, std::string("cap ") + cap + " 5x40001 windows", persistent);
      }
    }
  }
  OpCase c;
  c.scores = make_scores(300, 4096, Fill::Random, 4242);
  c.k = 2048;
  for (bool sorted : {true, false}) {
    c.policy = TopkPolicy{TieBreak::Small, sorted};
    expect_topk_pass(*backend_, c, "300x4096 uncapped sorted=" + std::to_string(sorted),
                     persistent);
  }
}

TEST_F(CudaBackendTest, TopkAllUnselectableRowsAndEmptyShapes) {
  OpCase c;
  c.scores = Tensor(DType::F32, {3, 70});
  float* p = c.scores.data<float>();
  for (int64_t i = 0; i < 70; ++i) {
    p[i] = std::numeric_limits<float>::quiet_NaN();
    p[70 + i] = -std::numeric_limits<float>::infinity();
    p[140 + i] = (i % 2) ? -0.0f : 0.0f;  // one zero plateau with both signs
  }
  c.k = 80;
  for (TieBreak tb : {TieBreak::Small, TieBreak::Large}) {
    c.policy = TopkPolicy{tb, true};
    expect_topk_pass(*backend_, c, "unselectable rows");
  }
  dsa::cuda::CudaBackendOptions two_read;
  two_read.topk_kernel = dsa::cuda::TopkKernel::TwoRead;  // radix and cluster: expect_topk_pass
  const Tensor out = dsa::cuda::make_cuda_backend(two_read)->select_topk(c.scores, 80, TopkPolicy{}, std::nullopt);
  EXPECT_EQ(out.data<int32_t>()[0], -1);
  EXPECT_EQ(out.data<int32_t>()[80 + 79], -1);
  EXPECT_EQ(out.data<int32_t>()[160], 0);  // smallest id of the zero plateau
  EXPECT_EQ(backend_->select_topk(Tensor(DType::F32, {0, 5}), 3, TopkPolicy{}, std::nullopt)
                .shape(),
            (std::vector<int64_t>{0, 3}));
  const Tensor none = backend_->select_topk(Tensor(DType::F32, {2, 0}), 3, TopkPolicy{}, std::nullopt);
  EXPECT_EQ(none.data<int32_t>()[5], -1);
}

// ---------------------------------------------------------------- sparse MLA forward

const char* kernel_name(dsa::cuda::SparseMlaKernel k) {
  switch (k) {
    case dsa::cuda::SparseMlaKernel::CudaCore: return "[cuda cores] ";
    case dsa::cuda::SparseMlaKernel::TensorCore: return "[tensor cores, 2 passes] ";
    case dsa::cuda::SparseMlaKernel::OnePass: return "[one pass, mma.sync] ";
    case dsa::cuda::SparseMlaKernel::OnePassWgmma: return "[one pass, wgmma] ";
    case dsa::cuda::SparseMlaKernel::OnePassWgmmaSplitD: return "[one pass, wgmma, S split over d_qk] ";
    case dsa::cuda::SparseMlaKernel::OnePassWgmmaOwnHalfFirst: return "[one pass, wgmma, own half of P first] ";
  }
  return "[?] ";
}

// Every sparse MLA kernel (CUDA cores, tensor cores in 2 passes, one pass on mma.sync and the
// three wgmma variants) is checked on every case; DSA_MLA_ONEPASS_ONLY=1 checks the one-pass kernels only
// (short GPU runs).
// WEAK fails (SPEC §9; issue 12): the cases are conditioned (make_mla, condition_case) so that
// no row's bound exceeds θ of its scale for a bf16-output kernel; before that 1 of 8 and 1 of
// 256 rows were weak on the H200 for every kernel (a case property, not the kernels').
void expect_mla_pass(dsa::oracle::Backend&, const OpCase& c, const std::string& label) {
  const dsa::oracle::CheckOptions& opt = dsa::oracle::default_check_options();
  std::vector<dsa::cuda::SparseMlaKernel> kernels = {dsa::cuda::SparseMlaKernel::OnePassWgmmaOwnHalfFirst,
                                                     dsa::cuda::SparseMlaKernel::OnePassWgmmaSplitD,
                                                     dsa::cuda::SparseMlaKernel::OnePassWgmma,
                                                     dsa::cuda::SparseMlaKernel::OnePass};
  if (!std::getenv("DSA_MLA_ONEPASS_ONLY")) {
    kernels.push_back(dsa::cuda::SparseMlaKernel::CudaCore);
    kernels.push_back(dsa::cuda::SparseMlaKernel::TensorCore);
  }
  for (auto kernel : kernels) {
    dsa::cuda::CudaBackendOptions o;
    o.mla_kernel = kernel;
    auto b = dsa::cuda::make_cuda_backend(o);
    const dsa::oracle::OpReport r = dsa::oracle::check_op(*b, Op::SparseMlaFwd, c, opt);
    EXPECT_EQ(r.verdict, Verdict::Pass) << kernel_name(kernel) << label << "\n"
                                        << dsa::oracle::format_op_report(r);
  }
}

TEST_F(CudaBackendTest, SparseMlaForwardShapesAndEdges) {
  const std::vector<MlaShape> shapes = {
      {8, 1, 64, 32, 50, 33},      {8, 16, 64, 64, 100, 64},   {8, 20, 96, 80, 300, 65},
      {4, 64, 576, 512, 700, 257}, {4, 3, 63, 17, 40, 31},     {4, 16, 576, 512, 2049, 2048},
      {4, 2, 128, 128, 33, 1},     {8, 17, 320, 300, 200, 100}, {2, 16, 1024, 1000, 64, 70},
      // one-pass kernel: two 64-head groups (h_q 128), a padded second group, d_qk 512.
      {4, 128, 576, 512, 400, 200}, {4, 100, 576, 512, 300, 129}, {4, 64, 512, 512, 500, 130},
      {4, 64, 576, 448, 300, 100},  {3, 64, 520, 510, 90, 70}};
  uint64_t seed = 500;
  for (const MlaShape& s : shapes) {
    for (int variant = 0; variant < 3; ++variant) {
      OpCase c = make_mla(s, seed++, variant == 1, variant);
      expect_mla_pass(*backend_, c,
                      "s_q=" + std::to_string(s.s_q) + " h_q=" + std::to_string(s.h_q) +
                          " d_qk=" + std::to_string(s.d_qk) + " d_v=" + std::to_string(s.d_v) +
                          " s_kv=" + std::to_string(s.s_kv) + " k=" + std::to_string(s.k) +
                          " variant=" + std::to_string(variant));
    }
  }
}

class CudaMlaKernelTest : public CudaBackendTest,
                          public ::testing::WithParamInterface<dsa::cuda::SparseMlaKernel> {};

TEST_P(CudaMlaKernelTest, SparseMlaForwardEmptyRowsAreExact) {
  OpCase c = make_mla({4, 16, 64, 64, 10, 8}, 42, false, 2);
  std::vector<int32_t> idx(4 * 8, -1);
  idx[8 * 2 + 5] = 3;  // row 2 has one valid slot, the others none
  c.mla.indices = Tensor::from_i32({4, 8}, idx);
  dsa_cuda_test::condition_case(c, 42);
  dsa::cuda::CudaBackendOptions o;
  o.mla_kernel = GetParam();
  const dsa::SparseMlaForward r = dsa::cuda::make_cuda_backend(o)->sparse_mla_forward(c.mla);
  for (int64_t h = 0; h < 16; ++h) {
    EXPECT_EQ(r.lse.data<float>()[h], std::numeric_limits<float>::infinity());
    EXPECT_EQ(r.max_logits.data<float>()[h], -std::numeric_limits<float>::infinity());
    for (int64_t d = 0; d < 64; ++d) EXPECT_EQ(r.out.get(h * 64 + d), 0.0);
  }
  bool nonzero = false;
  for (int64_t i = 2 * 16 * 64; i < 3 * 16 * 64; ++i) nonzero |= r.out.get(i) != 0.0;
  EXPECT_TRUE(nonzero) << "row 2 (one valid slot) came back all zero";
  expect_mla_pass(*backend_, c, "empty rows");
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaMlaKernelTest,
                         ::testing::Values(dsa::cuda::SparseMlaKernel::CudaCore,
                                           dsa::cuda::SparseMlaKernel::TensorCore,
                                           dsa::cuda::SparseMlaKernel::OnePass,
                                           dsa::cuda::SparseMlaKernel::OnePassWgmma,
                                           dsa::cuda::SparseMlaKernel::OnePassWgmmaSplitD,
                                           dsa::cuda::SparseMlaKernel::OnePassWgmmaOwnHalfFirst));

// The wgmma kernel needs d_qk in (448, 576]: with d_qk 64 the empty-rows test above ran the
// mma.sync fallback, so the same exact checks run here at d_qk 576.
TEST_F(CudaBackendTest, SparseMlaWgmmaEmptyRowsAreExact) {
  OpCase c = make_mla({4, 64, 576, 512, 10, 70}, 43, false, 2);
  std::vector<int32_t> idx(4 * 70, -1);
  idx[70 * 2 + 66] = 3;  // row 2: one valid slot, in its second tile; the others none
  c.mla.indices = Tensor::from_i32({4, 70}, idx);
  dsa_cuda_test::condition_case(c, 43);
  for (auto kernel : {dsa::cuda::SparseMlaKernel::OnePassWgmma,
                      dsa::cuda::SparseMlaKernel::OnePassWgmmaSplitD,
                      dsa::cuda::SparseMlaKernel::OnePassWgmmaOwnHalfFirst}) {
    dsa::cuda::CudaBackendOptions o;
    o.mla_kernel = kernel;
    const dsa::SparseMlaForward r = dsa::cuda::make_cuda_backend(o)->sparse_mla_forward(c.mla);
    for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{3}}) {
      for (int64_t h = 0; h < 64; ++h) {
        EXPECT_EQ(r.lse.data<float>()[t * 64 + h], std::numeric_limits<float>::infinity());
        EXPECT_EQ(r.max_logits.data<float>()[t * 64 + h], -std::numeric_limits<float>::infinity());
      }
      for (int64_t i = t * 64 * 512; i < (t + 1) * 64 * 512; ++i)
        ASSERT_EQ(r.out.get(i), 0.0) << kernel_name(kernel) << i;
    }
    bool nonzero = false;
    for (int64_t i = 2 * 64 * 512; i < 3 * 64 * 512; ++i) nonzero |= r.out.get(i) != 0.0;
    EXPECT_TRUE(nonzero) << kernel_name(kernel) << "row 2 (one valid slot) came back all zero";
  }
  expect_mla_pass(*backend_, c, "empty rows, d_qk 576");
}

// The sanitizer case (compute-sanitizer memcheck / racecheck in ci/gpu/test.sh): the
// production head count and width on a few rows full of invalid ids of every kind,
// duplicates, a leading invalid block longer than a tile, empty rows, topk_length and a sink.
TEST_F(CudaBackendTest, SparseMlaSanitizerSmall) {
  OpCase c = make_mla({4, 128, 576, 512, 300, 150}, 91, true, 2);
  expect_mla_pass(*backend_, c, "sanitizer case");
}

TEST_F(CudaBackendTest, SparseMlaForwardIndexView3d) {
  OpCase c = make_mla({4, 16, 64, 64, 90, 40}, 77, true, 1);
  c.mla.indices = c.mla.indices.reshaped({4, 1, 40});
  expect_mla_pass(*backend_, c, "[s_q,1,k] view");
}

std::unique_ptr<dsa::oracle::Backend> bwd_backend(dsa::cuda::SparseMlaBwdPath path) {
  dsa::cuda::CudaBackendOptions o;
  o.mla_bwd = path;
  return dsa::cuda::make_cuda_backend(o);
}

TEST(CudaBackendArgs, BadArgumentsNameTheArgument) {
  auto b = dsa::cuda::make_cuda_backend();
  EXPECT_EQ(b->name(), "cuda");
  EXPECT_TRUE(b->supports(Op::Topk));
  EXPECT_TRUE(b->supports(Op::SparseMlaFwd));
  // The backward is supported unless the switch turns it off (default: the deterministic
  // kernel; DSA_CUDA_SMLA_BWD=fallback leaves it unsupported).
  EXPECT_EQ(b->supports(Op::SparseMlaBwd),
            dsa::cuda::sparse_mla_bwd_path_from_env() != dsa::cuda::SparseMlaBwdPath::Fallback);
  EXPECT_FALSE(bwd_backend(dsa::cuda::SparseMlaBwdPath::Fallback)->supports(Op::SparseMlaBwd));
  try {
    b->select_topk(Tensor(DType::F32, {2, 3, 4}), 1, TopkPolicy{}, std::nullopt);
    ADD_FAILURE() << "rank-3 scores accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("scores"), std::string::npos) << e.what();
  }
  dsa::SparseMlaInputs in;
  in.q = Tensor(DType::BF16, {2, 4, 64});
  in.kv = Tensor(DType::BF16, {10, 32});
  in.indices = Tensor(DType::I32, {2, 4});
  in.d_v = 16;
  try {
    b->sparse_mla_forward(in);
    ADD_FAILURE() << "kv with a wrong d_qk accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kv"), std::string::npos) << e.what();
  }
  in.q = Tensor(DType::F32, {2, 4, 64});
  EXPECT_THROW(b->sparse_mla_forward(in), dsa::oracle::NotSupported);
  EXPECT_THROW(b->sparse_mla_backward(in, Tensor()), dsa::oracle::NotSupported);
  EXPECT_THROW(bwd_backend(dsa::cuda::SparseMlaBwdPath::Kernel)->sparse_mla_backward(in, Tensor()),
               dsa::oracle::NotSupported);  // F32 q
  in.q = Tensor(DType::BF16, {2, 4, 32});
  in.kv = Tensor(DType::BF16, {10, 32});
  try {
    bwd_backend(dsa::cuda::SparseMlaBwdPath::Kernel)
        ->sparse_mla_backward(in, Tensor(DType::BF16, {2, 4, 15}));
    ADD_FAILURE() << "dout of a wrong shape accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("dout"), std::string::npos) << e.what();
  }
  // dout F64 is not taken (the kernel's parts are bf16: F16/F32 split exactly, F64 not).
  EXPECT_THROW(bwd_backend(dsa::cuda::SparseMlaBwdPath::Kernel)
                   ->sparse_mla_backward(in, Tensor(DType::F64, {2, 4, 16})),
               dsa::oracle::NotSupported);
}

}  // namespace

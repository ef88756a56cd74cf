// The oracle's floor inputs of sparse MLA (local_bounds.h, SPEC §9) at the glm5 preset's
// shape (h_q 64, d_qk 576, d_v 512, k 2048 of s_kv 4096, bf16 inputs), per query row: the
// forward floors and the forward + backward floors (with dout), with 1 and 2..16 threads up
// to the machine's (wall-clock). Issue 13: a glm5 `fixtures check` computes them once per
// sparse MLA case (64 query rows).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "dsa/contract/parallel.h"
#include "dsa/oracle/local_bounds.h"

namespace {

constexpr int64_t kSq = 8, kSkv = 4096, kHq = 64, kDqk = 576, kDv = 512, kTopk = 2048;

struct Case {
  dsa::SparseMlaInputs in;
  dsa::Tensor dout;
};

// N(0,1) bf16 q, kv, dout; kTopk distinct random ids per row; a sink per head.
const Case& glm5_case() {
  static const Case c = [] {
    std::mt19937_64 rng(20261130);
    std::normal_distribution<double> normal(0.0, 1.0);
    Case x;
    x.in.q = dsa::Tensor(dsa::DType::BF16, {kSq, kHq, kDqk});
    x.in.kv = dsa::Tensor(dsa::DType::BF16, {kSkv, kDqk});
    x.dout = dsa::Tensor(dsa::DType::BF16, {kSq, kHq, kDv});
    for (dsa::Tensor* t : {&x.in.q, &x.in.kv, &x.dout})
      for (int64_t i = 0; i < t->numel(); ++i) t->set(i, normal(rng));
    x.in.indices = dsa::Tensor(dsa::DType::I32, {kSq, kTopk});
    std::vector<int32_t> perm(kSkv);
    std::iota(perm.begin(), perm.end(), 0);
    int32_t* ids = x.in.indices.data<int32_t>();
    for (int64_t t = 0; t < kSq; ++t) {
      std::shuffle(perm.begin(), perm.end(), rng);
      std::copy(perm.begin(), perm.begin() + kTopk, ids + t * kTopk);
    }
    x.in.attn_sink = dsa::Tensor(dsa::DType::F32, {kHq});
    for (int64_t h = 0; h < kHq; ++h) x.in.attn_sink->set(h, normal(rng));
    x.in.sm_scale = 1.0 / std::sqrt(static_cast<double>(kDqk));
    x.in.d_v = kDv;
    return x;
  }();
  return c;
}

void run(benchmark::State& state, bool backward) {
  dsa::set_max_threads(static_cast<int>(state.range(0)));
  const Case& c = glm5_case();
  for (auto _ : state) {
    dsa::oracle::CaseFloors f =
        dsa::oracle::sparse_mla_floors(c.in, backward ? &c.dout : nullptr, dsa::DType::BF16);
    benchmark::DoNotOptimize(f.size());
  }
  state.counters["threads"] = static_cast<double>(state.range(0));
  // seconds per query row (all 64 heads): x 64 for one glm5 case
  state.counters["s/row"] = benchmark::Counter(
      static_cast<double>(kSq), benchmark::Counter::kIsIterationInvariantRate |
                                    benchmark::Counter::kInvert);
}

void BM_SparseMlaFloorsForward(benchmark::State& state) { run(state, false); }
void BM_SparseMlaFloorsForwardBackward(benchmark::State& state) { run(state, true); }

void thread_counts(benchmark::internal::Benchmark* b) {
  const int hw = dsa::max_threads();
  for (int t : {1, 2, 4, 8, 16})
    if (t <= hw) b->Arg(t);
}

}  // namespace

BENCHMARK(BM_SparseMlaFloorsForward)->Apply(thread_counts)->UseRealTime()
    ->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_SparseMlaFloorsForwardBackward)->Apply(thread_counts)->UseRealTime()
    ->Unit(benchmark::kMillisecond)->Iterations(1);

BENCHMARK_MAIN();

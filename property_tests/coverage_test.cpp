// Coverage of the level-0 suite (the default `dsa-verify audit`): faults that show only at
// production head counts or on rows with more than 2^16 keys must fail at level 0 (fresh-user
// finding F2). Small in-process faulty backends, written like the mutants in mutants/.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "dsa/oracle/reference_backend.h"
#include "dsa/property_tests/suite.h"

namespace dsa::props {
namespace {

using oracle::Backend;
using oracle::Op;
using oracle::Verdict;

// Forwards every op to the reference; a faulty backend overrides the one it breaks.
class RefWrap : public Backend {
 public:
  explicit RefWrap(std::string name) : name_(std::move(name)), ref_(oracle::make_reference_backend()) {}
  std::string name() const override { return name_; }
  bool supports(Op op) const override { return ref_->supports(op); }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return ref_->indexer_scores(q, k, w, win);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    return ref_->indexer_scores_backward(q, k, w, win, d);
  }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p,
                     const std::optional<KeyWindows>& win) override {
    return ref_->select_topk(s, k, p, win);
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override { return ref_->sparse_mla_forward(in); }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    return ref_->sparse_mla_backward(in, dout);
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override { return ref_->indexer_kl_loss(in); }

 protected:
  std::string name_;
  std::unique_ptr<Backend> ref_;
};

// Multiplies x[t, h, :] (x [s_q, h_q, d]) by `f` for every head h >= 16.
void scale_heads_from_16(Tensor& x, double f) {
  const int64_t s_q = x.size(0), h_q = x.size(1), d = x.size(2);
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t h = 16; h < h_q; ++h)
      for (int64_t c = 0; c < d; ++c) x.set((t * h_q + h) * d + c, x.get((t * h_q + h) * d + c) * f);
}

// A head-tiling fault that shows only for h_q > 16: out of heads >= 16 halved (forward).
class HalvesOutFromHead16 final : public RefWrap {
 public:
  HalvesOutFromHead16() : RefWrap("halves_out_from_head_16") {}
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    SparseMlaForward f = ref_->sparse_mla_forward(in);
    scale_heads_from_16(f.out, 0.5);
    return f;
  }
};

// The same fault in the backward only: dq of heads >= 16 zero.
class ZeroDqFromHead16 final : public RefWrap {
 public:
  ZeroDqFromHead16() : RefWrap("zero_dq_from_head_16") {}
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    SparseMlaGrads g = ref_->sparse_mla_backward(in, dout);
    scale_heads_from_16(g.dq, 0.0);
    return g;
  }
};

// A top-k that keeps ids in 16 bits: on rows of more than 65536 keys ids come back mod 65536.
class TopkIds16Bit final : public RefWrap {
 public:
  TopkIds16Bit() : RefWrap("topk_ids_mod_65536") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p,
                     const std::optional<KeyWindows>& win) override {
    Tensor ids = ref_->select_topk(s, k, p, win);
    if (s.size(1) > 65536)
      for (int64_t i = 0; i < ids.numel(); ++i)
        if (ids.get(i) >= 0) ids.set(i, static_cast<double>(static_cast<int64_t>(ids.get(i)) % 65536));
    return ids;
  }
};

template <class B>
Subject subject_of() {
  Subject s;
  s.make = [] { return std::unique_ptr<Backend>(new B()); };
  s.name = s.make()->name();
  return s;
}

SuiteOptions level0(uint64_t seed) {
  SuiteOptions o;
  o.level = 0;
  o.seed = seed;
  o.shrink = false;
  o.dump = false;
  o.quiet = true;
  return o;
}

// The level-0 suite over the properties or families `only`: the number of failing properties.
int failures_at_level0(const Subject& s, const std::vector<std::string>& only, uint64_t seed,
                       std::string* first) {
  SuiteOptions o = level0(seed);
  o.only = only;
  int n = 0;
  for (const auto& r : run_suite(s, o))
    if (r.verdict == Verdict::Fail) {
      if (!n && first) *first = r.property + ": " + r.message.substr(0, 300);
      ++n;
    }
  return n;
}

constexpr uint64_t kSeeds[] = {7, 11, 22, 33, 44};

TEST(Level0Coverage, HeadCountFaultInForwardFails) {
  for (uint64_t seed : kSeeds) {
    std::string first;
    EXPECT_GE(failures_at_level0(subject_of<HalvesOutFromHead16>(), {"smla.production_shapes"}, seed, &first), 1)
        << "seed " << seed << ": out halved for heads >= 16 passed smla.production_shapes at level 0";
    std::cout << "  seed " << seed << ": " << first.substr(0, 160) << "\n";
  }
}

TEST(Level0Coverage, HeadCountFaultInBackwardFails) {
  for (uint64_t seed : kSeeds)
    EXPECT_GE(failures_at_level0(subject_of<ZeroDqFromHead16>(), {"smla.production_shapes"}, seed, nullptr), 1)
        << "seed " << seed << ": dq zeroed for heads >= 16 passed smla.production_shapes at level 0";
}

TEST(Level0Coverage, SixteenBitTopkIdsFail) {
  for (uint64_t seed : kSeeds) {
    std::string first;
    EXPECT_GE(failures_at_level0(subject_of<TopkIds16Bit>(), {"topk"}, seed, &first), 1)
        << "seed " << seed << ": top-k ids mod 65536 passed the level-0 topk properties";
    std::cout << "  seed " << seed << ": " << first.substr(0, 160) << "\n";
  }
}

}  // namespace
}  // namespace dsa::props

// A test backend that returns fixed FP8 indexer scores and declares fp8_reduced_accumulation()
// (FP8 tensor cores keeping ~14 bits of the accumulator, DeepSeek-V3 report §3.3.2), so the
// oracle judges them by the ":fp8_tensor_core" tolerance rows. Shared by the detection tests
// and DominantTerms.* (one test binary).
#pragma once

#include <string>
#include <utility>

#include "dsa/oracle/backend.h"

namespace dsa::oracle::testing {

class DeclaredTensorCore final : public Backend {
 public:
  explicit DeclaredTensorCore(Tensor scores) : scores_(std::move(scores)) {}
  std::string name() const override { return "declared-fp8-tensor-core"; }
  bool supports(Op op) const override { return op == Op::Fp8IndexerScores || op == Op::PagedIndexerScores; }
  bool fp8_reduced_accumulation() const override { return true; }
  Tensor fp8_indexer_scores(const Fp8IndexerInputs&) override { return scores_; }
  Tensor paged_indexer_scores(const PagedIndexerInputs&) override { return scores_; }  // poisoned runs too

 private:
  Tensor scores_;
};

}  // namespace dsa::oracle::testing

// A backend that forwards every op to the float64 reference backend: the base of the
// deliberately faulty backends of the mutants (mutants/) and of the coverage tests, each of
// which overrides the one op it breaks.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "dsa/oracle/reference_backend.h"

namespace dsa::props {

/// Forwards every op to oracle::make_reference_backend(); supports() is the reference's.
/// Throws what the reference throws (e.g. dsa::ArgumentError on contract violations).
class ReferenceWrap : public oracle::Backend {
 public:
  explicit ReferenceWrap(std::string name) : name_(std::move(name)), ref_(oracle::make_reference_backend()) {}
  std::string name() const override { return name_; }
  bool supports(oracle::Op op) const override { return ref_->supports(op); }
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
  std::unique_ptr<oracle::Backend> ref_;
};

}  // namespace dsa::props

// Indexer KL loss properties (SPEC §7): loss and d_scores by the ratio rule.
#include "src/props_common.h"

namespace dsa::props {
namespace {

void loss_and_gradient_ratio(oracle::Backend& b, const oracle::BlockFactory&) {
  const KlCase c = draw_kl_case();
  DumpOnFailure dump([&] { return to_fixture(c); });
  RC_ASSERT(!all_zero(c.in.q));
  RC_ASSERT(!all_zero(c.in.kv));
  oracle::OpCase oc;
  oc.kl = c.in;
  DSA_PROP_ASSERT_PASSED(oracle::check_indexer_kl_loss(b, oc));
}

}  // namespace

void add_kl_loss_properties(std::vector<Property>& out) {
  out.push_back({"kl.loss_and_gradient_ratio", {oracle::Op::IndexerKlLoss}, 1, loss_and_gradient_ratio});
}

}  // namespace dsa::props

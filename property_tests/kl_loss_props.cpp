// Indexer KL loss properties (SPEC §7): loss and d_scores by the ratio rule, and -inf scores,
// over fp32 and bf16 q/kv.
#include <cmath>
#include <optional>
#include <random>

#include "src/props_common.h"

namespace dsa::props {
namespace {

// q/kv dtype of a KL property's draw: bf16 on the run's first draw, whatever the seed, else
// fp32 or bf16 drawn (KlCase). A teacher formed from 16-bit logits instead of fp32 ones
// (fresh-user F17; Megatron-LM forms fp32 logits from bf16 activations) fails every KL
// property on every seed; the outputs are judged at their fp32 class (SPEC §7/§9).
std::optional<DType> kl_dtype() {
  return draw_index() == 0 ? std::optional<DType>(DType::BF16) : std::nullopt;
}

// Judges a drawn KL case by the ratio rule (SPEC §7/§9), dumping it when it fails; q and kv
// must not be all zero (a trivial teacher).
void judge_kl(oracle::Backend& b, const KlCase& c) {
  DumpOnFailure dump([&] { return to_fixture(c); });
  RC_ASSERT(!all_zero(c.in.q));
  RC_ASSERT(!all_zero(c.in.kv));
  oracle::OpCase oc;
  oc.kl = c.in;
  DSA_PROP_JUDGE_DETECTABLE(b, oracle::Op::IndexerKlLoss, oc, oracle::check_indexer_kl_loss);
}

void loss_and_gradient_ratio(oracle::Backend& b, const oracle::BlockFactory&) { judge_kl(b, draw_kl_case(kl_dtype())); }

// SPEC §7: a key whose indexer score is -inf is not in S_t. One drawn row gets -inf on every
// key (an empty S_t: out of the mean, d_scores 0); the other rows lose a drawn share of their
// keys (the teacher renormalises over the rest). Besides the ratio rule (the reference follows
// the rule), the backend's own outputs must be finite with d_scores 0 on every -inf key, so a
// NaN there fails even where the reference would also give NaN.
void neg_inf_scores(oracle::Backend& b, const oracle::BlockFactory&) {
  KlCase c = draw_kl_case(kl_dtype(), false);
  const int64_t s_q = c.in.scores.size(0), s_kv = c.in.scores.size(1);
  const int64_t dead_row = *rc::gen::inRange<int64_t>(0, s_q);
  const int share = *rc::gen::inRange(1, 4);  // each other key is -inf with probability share/4
  std::mt19937_64 r(*rc::gen::arbitrary<uint64_t>());
  int64_t partial = 0;  // keys set to -inf in rows other than the dead one
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t s = 0; s < s_kv; ++s) {
      const bool dead = t == dead_row || static_cast<int>(r() % 4) < share;
      if (!dead || !c.in.windows.contains(t, s)) continue;
      c.in.scores.set(t * s_kv + s, -INFINITY);
      partial += t != dead_row;
    }
  c.desc += " -inf: row " + std::to_string(dead_row) + " all, " + std::to_string(partial) +
            " keys elsewhere";
  put_kl_finite_sentinels(c, draw_index() == 0);  // in the rows the -inf keys left (fresh18 F2)
  shift_kl_scores(c, draw_index() == 1);  // after the -inf keys: the shift stays detectable
  DumpOnFailure dump([&] { return to_fixture(c); });
  RC_ASSERT(!all_zero(c.in.q));
  RC_ASSERT(!all_zero(c.in.kv));

  oracle::OpCase oc;
  oc.kl = c.in;
  const IndexerKlResult got = call_twin_tested(b, oracle::Op::IndexerKlLoss, oc, [&] { return b.indexer_kl_loss(c.in); });
  RC_ASSERT(got.loss.numel() == 1);
  RC_ASSERT(got.d_scores.shape() == c.in.scores.shape());
  if (!std::isfinite(got.loss.get(0))) RC_FAIL("loss is " + std::to_string(got.loss.get(0)));
  for (int64_t i = 0; i < got.d_scores.numel(); ++i) {
    const double g = got.d_scores.get(i), score = c.in.scores.get(i);
    if (!std::isfinite(g) || (std::isinf(score) && score < 0 && g != 0.0))
      RC_FAIL("d_scores[" + std::to_string(i / s_kv) + ", " + std::to_string(i % s_kv) +
              "] is " + std::to_string(g) + " for score " + std::to_string(score) +
              ", expected finite and 0 where the score is -inf (not in S_t)");
  }
  DSA_PROP_JUDGE_DETECTABLE(b, oracle::Op::IndexerKlLoss, oc, oracle::check_indexer_kl_loss);
}

// Many query rows (prefill; fresh-user finding F7: d_scores rows past 128 left 0 passed).
void many_rows(oracle::Backend& b, const oracle::BlockFactory&) { judge_kl(b, draw_kl_many_rows_case(kl_dtype())); }

// Production shapes (h_q 128, keys past 1024; finding F8: a teacher ignoring heads past 64
// and a kernel ignoring keys past 1024 passed).
void production_shapes(oracle::Backend& b, const oracle::BlockFactory&) {
  judge_kl(b, draw_kl_production_case(kl_dtype()));
}

}  // namespace

void add_kl_loss_properties(std::vector<Property>& out) {
  out.push_back({"kl.loss_and_gradient_ratio", {oracle::Op::IndexerKlLoss}, 1, loss_and_gradient_ratio});
  out.push_back({"kl.neg_inf_scores", {oracle::Op::IndexerKlLoss}, 1, neg_inf_scores});
  out.push_back({"kl.many_rows", {oracle::Op::IndexerKlLoss}, 8, many_rows});
  out.push_back({"kl.production_shapes", {oracle::Op::IndexerKlLoss}, 34, production_shapes});
}

}  // namespace dsa::props

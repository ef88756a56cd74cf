// Sparse MLA properties (SPEC §4-§6): ratio rule forward and backward, invalid slots never
// read, empty rows, masked leading blocks, topk_length, duplicate ids accumulating in dkv.
#include <cmath>

#include "dsa/oracle/metrics.h"
#include "dsa/reference/sparse_mla.h"
#include "src/props_common.h"

namespace dsa::props {
namespace {

using oracle::Backend;
using oracle::BlockFactory;
using oracle::Op;

oracle::OpCase as_op_case(const SmlaCase& c) {
  oracle::OpCase oc;
  oc.mla = c.in;
  oc.dout = c.dout;
  return oc;
}

// Judges op (forward or backward) on draw c (DSA_PROP_ASSERT_DETECTABLE). A declined draw is
// redrawn unless the decline depends on its values: then the draw fails
// (fail_if_declined_by_value: the twin test, one twin per mandatory feature, or one id set to -1).
void judge(Backend& b, Op op, const SmlaCase& c) {
  const oracle::OpCase oc = as_op_case(c);
  const oracle::OpReport r = op == Op::SparseMlaFwd ? oracle::check_sparse_mla_forward(b, oc)
                                                    : oracle::check_sparse_mla_backward(b, oc);
  twin_test_if_declined(b, op, oc, r);
  DSA_PROP_ASSERT_DETECTABLE(r);
}

// b's forward / backward of draw c, called directly; a decline as judge's.
SparseMlaForward run_forward(Backend& b, const SmlaCase& c) {
  return call_twin_tested(b, Op::SparseMlaFwd, as_op_case(c), [&] { return b.sparse_mla_forward(c.in); });
}
SparseMlaGrads run_backward(Backend& b, const SmlaCase& c) {
  return call_twin_tested(b, Op::SparseMlaBwd, as_op_case(c), [&] { return b.sparse_mla_backward(c.in, c.dout); });
}

bool has_nan(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(t.get(i))) return true;
  return false;
}

// True when slot j of row t is valid (SPEC §4).
bool valid_slot(const SparseMlaInputs& in, int64_t t, int64_t j) {
  const int64_t k = in.indices.size(-1), s_kv = in.kv.size(0);
  const int64_t id = static_cast<int64_t>(in.indices.get(t * k + j));
  if (in.topk_length && j >= static_cast<int64_t>(in.topk_length->get(t))) return false;
  return id >= 0 && id < s_kv;
}

void check_inputs(const SmlaCase& c) {
  RC_ASSERT(!all_zero(c.in.q));
  RC_ASSERT(!all_zero(c.in.kv));
}

void forward_ratio(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_case();
  DumpOnFailure dump([&] { return to_fixture(c, false); });
  check_inputs(c);
  // Not trivially zero: with a valid slot and a finite sink, the reference output is nonzero.
  bool any_valid = false;
  for (int64_t t = 0; t < c.in.q.size(0); ++t)
    for (int64_t j = 0; j < c.in.indices.size(-1); ++j) any_valid = any_valid || valid_slot(c.in, t, j);
  bool finite_sink = !c.in.attn_sink || oracle::nonfinite_positions(*c.in.attn_sink).pos_inf.empty();
  if (any_valid && finite_sink) RC_ASSERT(!all_zero(reference::sparse_mla_forward(c.in).out));
  judge(b, Op::SparseMlaFwd, c);
}

// kv rows 0 and s_kv-1 hold NaN and no valid slot points at them: reading through an invalid
// id (-1 wrap, clamping, trusting topk_length, 0 padding) surfaces as NaN.
void invalid_slots_never_read(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_case("poison");
  DumpOnFailure dump([&] { return to_fixture(c, false); });
  const SparseMlaForward f = run_forward(b, c);
  RC_ASSERT(!has_nan(f.out));
  RC_ASSERT(!has_nan(f.lse));
  judge(b, Op::SparseMlaFwd, c);
}

// Empty rows: out 0, lse +inf, max_logits -inf, dq 0, nothing NaN (SPEC §6). The backward
// part runs when the backend has one (a forward-only kernel still gets the forward checks).
void empty_rows(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_case("empty");
  DumpOnFailure dump([&] { return to_fixture(c, true); });
  check_inputs(c);
  const bool with_bwd = judges(b, Op::SparseMlaBwd);
  const SparseMlaForward f = run_forward(b, c);
  // A backward that throws, or a backward assertion below, fails under sparse_mla_bwd.
  if (with_bwd) note_failing_op("sparse_mla_bwd");
  const SparseMlaGrads g = with_bwd ? run_backward(b, c) : SparseMlaGrads{};
  reset_failing_op();
  const int64_t s_q = c.in.q.size(0), h = c.in.q.size(1), k = c.in.indices.size(-1);
  const int64_t d_v = c.in.d_v, d_qk = c.in.q.size(2);
  for (int64_t t = 0; t < s_q; ++t) {
    bool empty = true;
    for (int64_t j = 0; j < k; ++j) empty = empty && !valid_slot(c.in, t, j);
    if (!empty) continue;
    // An output the backend does not provide (undefined; CheckOptions::provided_outputs
    // decides whether that is allowed, in the checks below) is not read here.
    for (int64_t hh = 0; hh < h; ++hh) {
      if (f.lse.defined()) RC_ASSERT(f.lse.get(t * h + hh) == INFINITY);
      if (f.max_logits.defined()) RC_ASSERT(f.max_logits.get(t * h + hh) == -INFINITY);
      if (f.out.defined())
        for (int64_t d = 0; d < d_v; ++d) RC_ASSERT(f.out.get((t * h + hh) * d_v + d) == 0.0);
      if (with_bwd && g.dq.defined()) {
        note_failing_op("sparse_mla_bwd");
        for (int64_t d = 0; d < d_qk; ++d) RC_ASSERT(g.dq.get((t * h + hh) * d_qk + d) == 0.0);
        reset_failing_op();
      }
    }
  }
  RC_ASSERT(!has_nan(f.out));
  judge(b, Op::SparseMlaFwd, c);
  if (!with_bwd) return;
  note_failing_op("sparse_mla_bwd");
  RC_ASSERT(!has_nan(g.dq));
  RC_ASSERT(!has_nan(g.dkv));
  judge(b, Op::SparseMlaBwd, c);
}

// The first 64 slots are invalid: a fully masked leading block must not poison an online
// softmax with exp(-inf - -inf).
void leading_masked_block(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_case("leading_block");
  DumpOnFailure dump([&] { return to_fixture(c, false); });
  check_inputs(c);
  judge(b, Op::SparseMlaFwd, c);
}

// Valid-looking ids past topk_length are ignored, forward and (when present) backward.
void topk_length_respected(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_case("topk_length");
  DumpOnFailure dump([&] { return to_fixture(c, true); });
  check_inputs(c);
  judge(b, Op::SparseMlaFwd, c);
  if (judges(b, Op::SparseMlaBwd))
    judge(b, Op::SparseMlaBwd, c);
}

// Gradient parity (dq, dkv, dsink) for the same dout; determinism of a second run. One draw in
// eight the extreme rows, one in eight fp32 q/kv (regular or extreme rows): the backward alone
// meets them too (fresh-user finding F6; a backend without fp32 inputs declines those draws).
void backward_parity(Backend& b, const BlockFactory&) {
  const int roll = *rc::gen::inRange(0, 8);
  const SmlaCase c = roll == 0   ? draw_smla_extreme_case()
                     : roll == 1 ? (*rc::gen::inRange(0, 4) == 0 ? draw_smla_extreme_case(DType::F32)
                                                                  : draw_smla_case("", DType::F32))
                                 : draw_smla_case(*rc::gen::element<std::string>("mixed", "empty", "topk_length"));
  DumpOnFailure dump([&] { return to_fixture(c, true); });
  check_inputs(c);
  RC_ASSERT(!all_zero(c.dout));
  judge(b, Op::SparseMlaBwd, c);
}

// Few keys selected many times (heads, rows, duplicate slots): every add lands in dkv.
void duplicates_accumulate_in_dkv(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_case("dups");
  DumpOnFailure dump([&] { return to_fixture(c, true); });
  check_inputs(c);
  judge(b, Op::SparseMlaBwd, c);
}

// Extreme rows inside an ordinary batch (logits +-2^18 on one-key rows, empty rows, a hot
// key, large RoPE columns, sinks +-80/+-inf): forward and (when present) backward.
void extreme_rows_in_batch(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_extreme_case();
  DumpOnFailure dump([&] { return to_fixture(c, judges(b, Op::SparseMlaBwd)); });
  check_inputs(c);
  judge(b, Op::SparseMlaFwd, c);
  if (judges(b, Op::SparseMlaBwd))
    judge(b, Op::SparseMlaBwd, c);
}

// A kernel's fp32 path (SPEC §4: q and kv in fp32, out in fp32, judged at the fp32 class):
// the regular layouts and, one draw in eight, the extreme rows; forward and (when present)
// backward. A backend without fp32 inputs answers NotSupported: the property is a skip.
void fp32_inputs(Backend& b, const BlockFactory&) {
  const SmlaCase c = *rc::gen::inRange(0, 8) == 0 ? draw_smla_extreme_case(DType::F32)
                                                   : draw_smla_case("", DType::F32);
  DumpOnFailure dump([&] { return to_fixture(c, judges(b, Op::SparseMlaBwd)); });
  check_inputs(c);
  RC_ASSERT(c.in.q.dtype() == DType::F32 && c.in.kv.dtype() == DType::F32);
  judge(b, Op::SparseMlaFwd, c);
  if (judges(b, Op::SparseMlaBwd))
    judge(b, Op::SparseMlaBwd, c);
}

// Production head counts at every level (h_q 64/128, d_qk 576/512; at level 0 small s_q and k,
// at levels >= 1 k 2048; 3 cases at levels 0 and 1): the forward. The backward of the same
// draws is smla.backward_production_shapes, which runs whenever the backward is selected (a
// backward judged here too cost ~5 s CPU more a level-1 run).
void production_shapes(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_production_case();
  DumpOnFailure dump([&] { return to_fixture(c, false); });
  check_inputs(c);
  judge(b, Op::SparseMlaFwd, c);
}

// Many query rows (s_q 257-1100; the first draw of a run > 1024) over few keys and
// heads (finding 7: a kernel returning empty rows from row 128 on passed the audit): the
// forward by the ratio rule. The backward of the same draws is smla.backward_many_rows, so a
// fault of one direction fails the property of that direction only.
void many_rows(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_case(*rc::gen::element<std::string>("mixed", "poison", "topk_length", "dups"),
                                    DType::BF16, "many_rows");
  DumpOnFailure dump([&] { return to_fixture(c, false); });
  check_inputs(c);
  judge(b, Op::SparseMlaFwd, c);
}

// The backward alone over many query rows and at production shapes (fresh-user finding F6:
// these draws lived only in forward properties, so a backward-only kernel, or --ops
// sparse_mla_bwd, never met more than 65 rows nor h_q 64/128; a backward dropping rows past a
// 128-row tile passed). The draws of smla.many_rows and smla.production_shapes.
void backward_many_rows(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_case(*rc::gen::element<std::string>("mixed", "poison", "topk_length", "dups"),
                                    DType::BF16, "many_rows");
  DumpOnFailure dump([&] { return to_fixture(c, true); });
  check_inputs(c);
  RC_ASSERT(!all_zero(c.dout));
  judge(b, Op::SparseMlaBwd, c);
}

void backward_production_shapes(Backend& b, const BlockFactory&) {
  const SmlaCase c = draw_smla_production_case();
  DumpOnFailure dump([&] { return to_fixture(c, true); });
  check_inputs(c);
  RC_ASSERT(!all_zero(c.dout));
  judge(b, Op::SparseMlaBwd, c);
}

}  // namespace

void add_sparse_mla_properties(std::vector<Property>& out) {
  out.push_back({"smla.forward_ratio", {Op::SparseMlaFwd}, 1, forward_ratio});
  out.push_back({"smla.invalid_slots_never_read", {Op::SparseMlaFwd}, 1, invalid_slots_never_read});
  out.push_back({"smla.empty_rows", {Op::SparseMlaFwd}, 1, empty_rows});
  out.push_back({"smla.leading_masked_block", {Op::SparseMlaFwd}, 1, leading_masked_block});
  out.push_back({"smla.topk_length_respected", {Op::SparseMlaFwd}, 1, topk_length_respected});
  out.push_back({"smla.backward_parity", {Op::SparseMlaBwd}, 1, backward_parity});
  out.push_back({"smla.duplicates_accumulate_in_dkv", {Op::SparseMlaBwd}, 1, duplicates_accumulate_in_dkv});
  out.push_back({"smla.extreme_rows_in_batch", {Op::SparseMlaFwd}, 1, extreme_rows_in_batch});
  out.push_back({"smla.fp32_inputs", {Op::SparseMlaFwd}, 1, fp32_inputs});
  out.push_back({"smla.many_rows", {Op::SparseMlaFwd}, 8, many_rows});
  out.push_back({"smla.production_shapes", {Op::SparseMlaFwd}, 34, production_shapes});
  out.push_back({"smla.backward_many_rows", {Op::SparseMlaBwd}, 8, backward_many_rows});
  out.push_back({"smla.backward_production_shapes", {Op::SparseMlaBwd}, 34, backward_production_shapes});
}

}  // namespace dsa::props

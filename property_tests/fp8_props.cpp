// Properties of the SPEC §10 inference ops: FP8 indexer (ratio rule, exact tier, invalid
// scales rejected), paged FP8 indexer (ratio rule with poisoned unread table entries, exact
// tier, MTP windows exact at ke, bad tables and invalid read scales rejected), sparse MLA over the FP8
// cache (ratio rule with poisoned unread tokens, empty rows, invalid read scales rejected).
// A rejection is the documented argument error only (assert_rejected), never a crash, a hang
// or a write past a buffer.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <vector>

#include "dsa/fixtures/fp8_fixture.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/fp8_check.h"
#include "dsa/oracle/metrics.h"
#include "dsa/property_tests/fp8_generators.h"
#include "dsa/reference/fp8_indexer.h"
#include "dsa/reference/paged_indexer.h"
#include "src/fp8_props_common.h"
#include "src/props_common.h"

namespace dsa::props {

// ---- poisoned-but-valid inputs (SPEC §10: unread parts may hold anything) -----------------
// A clean twin is the draw with every part no valid read uses made ordinary (FP8 bytes 0,
// scales 1, table entries past a context block 0): a backend that declines a draw but runs its
// twin declined the poisoned unread parts, a mandatory case (feature poisoned_unread, fresh-user
// F4b). Read parts (bad ones of the rejection properties included) are left as they are.

namespace {
Tensor copy_of(const Tensor& t) {
  Tensor out(t.dtype(), t.shape());
  if (t.nbytes() > 0) std::memcpy(out.raw(), t.raw(), t.nbytes());
  return out;
}
// The oracle's check re-runs a draw with its unread tokens poisoned: the draw has poisoned
// unread parts exactly when some token is unread (slot j < topk_length, id in range; SPEC §10).
bool has_unread_tokens(const SparseMlaFp8Inputs& in) {
  const std::vector<char> read = read_mask(in);
  return std::find(read.begin(), read.end(), 0) != read.end();
}
}  // namespace

// The clean twins and the poisoned_unread test are the oracle's (oracle::clean_unread,
// oracle::holds_poisoned_unread), the twin test of every route.
Fp8IndexerInputs clean_twin(const Fp8IndexerInputs& in) { return oracle::clean_unread(in); }
PagedIndexerInputs clean_twin(const PagedIndexerInputs& in) { return oracle::clean_unread(in); }
SparseMlaFp8Inputs clean_twin(const SparseMlaFp8Inputs& in) { return oracle::clean_unread(in); }
bool poisoned(const Fp8IndexerInputs& in) { return oracle::holds_poisoned_unread(in); }
bool poisoned(const PagedIndexerInputs& in) { return oracle::holds_poisoned_unread(in); }
bool poisoned(const SparseMlaFp8Inputs& in) { return oracle::holds_poisoned_unread(in); }

namespace {
// Valid twins (the rejection properties): the clean twin with every bad value a read uses made
// valid too (scales 1, contexts cut to their table row, read entries outside the cache block
// 0), to tell a backend that declines bad input (it computes this twin) from one that declines
// the draw's shape.
bool scale_ok(float s) { return s > 0.0f && std::isfinite(s); }

Fp8IndexerInputs valid_twin(const Fp8IndexerInputs& in) {
  Fp8IndexerInputs out = clean_twin(in);
  for (int64_t s = 0; s < out.k_scale.numel(); ++s)
    if (!scale_ok(out.k_scale.data<float>()[s])) out.k_scale.data<float>()[s] = 1.0f;
  return out;
}

PagedIndexerInputs valid_twin(const PagedIndexerInputs& in) {
  PagedIndexerInputs out = clean_twin(in);
  const int64_t num_blocks = in.k_cache.size(0), bs = in.k_cache.size(1);
  const int64_t batch = in.block_table.size(0), max_blocks = in.block_table.size(1);
  out.context_lens = copy_of(in.context_lens);
  int32_t* lens = out.context_lens.data<int32_t>();
  int32_t* table = out.block_table.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    lens[b] = static_cast<int32_t>(std::clamp<int64_t>(lens[b], 0, max_blocks * bs));
    for (int64_t p = 0; p < lens[b]; ++p) {
      int32_t& blk = table[b * max_blocks + p / bs];
      if ((blk < 0 || blk >= num_blocks) && num_blocks > 0) blk = 0;
      if (blk >= 0 && blk < num_blocks && !scale_ok(out.k_scale_cache.data<float>()[blk * bs + p % bs]))
        out.k_scale_cache.data<float>()[blk * bs + p % bs] = 1.0f;
    }
  }
  return out;
}

SparseMlaFp8Inputs valid_twin(const SparseMlaFp8Inputs& in) {
  SparseMlaFp8Inputs out = clean_twin(in);
  const int64_t tokens = out.kv_cache.numel() / kMlaFp8TokenBytes;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t tile = 0; tile < kMlaFp8NumTiles; ++tile) {
      uint8_t* p = out.kv_cache.data<uint8_t>() + t * kMlaFp8TokenBytes + kMlaFp8ScalesOffset + 4 * tile;
      float v;
      std::memcpy(&v, p, sizeof v);
      if (!scale_ok(v)) {
        v = 1.0f;
        std::memcpy(p, &v, sizeof v);
      }
    }
  return out;
}
}  // namespace

namespace {

using oracle::Backend;
using oracle::BlockFactory;
using oracle::Op;

std::string case_name() {
  return dump_target().empty() ? std::string("property_case")
                               : std::filesystem::path(dump_target()).stem().string();
}
template <class F>
fixtures::Fixture described(F make, const std::string& desc) {
  fixtures::Fixture f = make();
  f.producer = "dsa-verify property suite (failing case dump)";
  f.notes = desc;
  return f;
}

oracle::OpCase op_case(const Fp8IndexerInputs& in) {
  oracle::OpCase c;
  c.fp8_indexer = in;
  return c;
}
oracle::OpCase op_case(const PagedIndexerInputs& in) {
  oracle::OpCase c;
  c.paged_indexer = in;
  return c;
}
oracle::OpCase op_case(const SparseMlaFp8Inputs& in) {
  oracle::OpCase c;
  c.mla_fp8 = in;
  return c;
}

// A decline the route made for the kernel (CallFailure::RejectedByRoute): the kernel was not
// called, so the draw is a skip, never probed with twins.
class NotApplicable : public oracle::NotSupported {
 public:
  using oracle::NotSupported::NotSupported;
};

// True when the backend ran `f`: it returned, or (`or_threw`) threw anything but a decline.
template <class F>
bool ran(F f, bool or_threw) {
  try {
    f();
    return true;
  } catch (const oracle::NotSupported&) {
    return false;
  } catch (const std::exception&) {
    return or_threw;
  }
}

// Runs `call` on a draw with one bad value the kernel reads (`bad` names it; `where` is the
// draw), which must end in the rejection the backend's interface documents
// (oracle::CallFailure::ArgumentError: std::invalid_argument or c10::ValueError in C++,
// DSA_STATUS_INVALID_ARGUMENT from a plugin, ValueError from Python), promptly and without
// writing outside its buffers. Anything else fails the draw, saying what happened: a result
// ("accepted"), a crash, a hang (an isolated call killed at its timeout), a write past a buffer
// (the plugin route's guard zones; also with DSA_STATUS_INVALID_ARGUMENT), another error. A
// route that refused the input itself, before the kernel ran (RejectedByRoute), makes the draw
// a skip: the kernel was not judged. A decline (NotSupported) is probed: when the backend runs
// the draw's clean twin (`clean`: unread parts ordinary, the bad value kept) it declined the
// poisoned unread parts (`poisoned`; mandatory feature poisoned_unread, fresh-user F4b); else
// when it computes the valid twin (`valid`: the bad value made valid too) it declined the bad
// value instead of rejecting it: a failure; else it declines the draw's shape (a skip).
template <class Call, class Clean, class Valid>
void assert_rejected(Backend& b, bool poisoned, Call call, Clean clean, Valid valid, const std::string& bad,
                     const std::string& where) {
  if (poisoned) note_draw_feature("poisoned_unread");
  std::string fault;
  const std::string documented =
      " instead of rejecting it with the documented argument error (std::invalid_argument, "
      "DSA_STATUS_INVALID_ARGUMENT, Python ValueError): ";
  try {
    call();
    fault = "accepted " + bad + ": returned a result instead of an argument error";
  } catch (const oracle::NotSupported& e) {
    if (poisoned && ran(clean, true)) {
      note_declined_for("poisoned_unread");
      throw;
    }
    if (!ran(valid, false)) throw;
    fault = "declined " + bad + documented + e.what() + "; it computes the same draw with valid values";
  } catch (const std::exception& e) {
    const oracle::CallFailure how = b.classify_failure(e);
    const std::string msg = e.what();
    switch (how) {
      case oracle::CallFailure::ArgumentError: return;
      case oracle::CallFailure::RejectedByRoute:
        throw NotApplicable("not applicable on this route: the kernel was not called (the route refused " + bad +
                            " itself: " + msg.substr(0, 200) + ")");
      case oracle::CallFailure::Crashed: fault = "crashed on " + bad; break;
      case oracle::CallFailure::TimedOut: fault = "hung on " + bad + " (killed at its timeout)"; break;
      case oracle::CallFailure::MemoryViolation: fault = "wrote outside its buffers on " + bad; break;
      case oracle::CallFailure::OtherError: fault = "failed with another error on " + bad; break;
    }
    fault += documented + msg;
  }
  RC_FAIL("[FAIL] " + b.name() + ": " + fault + " (" + where + ")");
}

// A scale no valid read may use (SPEC §10: "anything else is an invalid argument").
float draw_bad_scale() {
  return *rc::gen::element<float>(0.0f, -0.0f, -1.0f, -0.25f, std::numeric_limits<float>::quiet_NaN(),
                                   std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity());
}

// Judges a draw (`body`) whose unread parts hold anything when `poisoned` (the draw itself, or
// the oracle's poisoned re-runs of it): notes the mandatory feature poisoned_unread and, when
// the backend declines the draw, runs its clean twin (`run_twin`); a twin the backend runs
// (returns, rejects or fails: anything but a decline) proves the decline was about the poison.
template <class Body, class Twin>
void judge_poisoned(bool poisoned, Body body, Twin run_twin) {
  if (poisoned) note_draw_feature("poisoned_unread");
  try {
    body();
  } catch (const oracle::NotSupported&) {
    if (poisoned && ran(run_twin, true)) note_declined_for("poisoned_unread");
    throw;
  }
}

// ---- FP8 indexer --------------------------------------------------------------------------

void fp8_indexer_ratio(Backend& b, const BlockFactory&) {
  // Draw 3 of a run with its keys past 65535 (outside tester F3).
  const Fp8IndexerCase c = draw_fp8_indexer_case("", true);
  DumpOnFailure dump([&] { return described([&] { return fixtures::fp8_indexer_fixture(c.in, case_name()); }, c.desc); });
  RC_ASSERT(!all_zero(c.in.q_idx));
  RC_ASSERT(!all_zero(c.in.w));
  judge_poisoned(
      poisoned(c.in), [&] { DSA_PROP_JUDGE_DETECTABLE(b, Op::Fp8IndexerScores, op_case(c.in), oracle::check_fp8_indexer_scores); },
      [&] { b.fp8_indexer_scores(clean_twin(c.in)); });
}

// ---- exact tier (FP8 indexer and paged FP8 indexer) ---------------------------------------
// Power-of-two scales and small integers (the "exact" flavor of both generators): every
// product and sum is exact in fp32, and in a ~14-bit FP8 tensor-core accumulator, so the
// candidate equals the float64 reference bit for bit. A backend that declares
// fp8_reduced_accumulation is judged by a 1024x looser bound elsewhere (the ":fp8_tensor_core"
// rows); here nothing is loosened, so the declaration is checked: a kernel wrong by less than
// that bound fails (fresh-user F4). `run` calls the op on its inputs; `ref` is the reference.
template <class Inputs, class Run>
void judge_exact_tier(Backend& b, Op op, const Inputs& in, const Tensor& ref, Run run) {
  Tensor got;
  judge_poisoned(poisoned(in), [&] { got = call_twin_tested(b, op, op_case(in), [&] { return run(in); }); },
                 [&] { run(clean_twin(in)); });
  const auto m = oracle::compare_tensors(got, ref);
  RC_ASSERT(m.shape_ok);
  if (m.nonfinite_mismatches == 0 && m.max_abs == 0.0) return;
  note_failing_op(oracle::to_string(op));
  RC_FAIL("[FAIL] " + b.name() + " " + oracle::to_string(op) +
          ": exact tier (integer FP8 values, power-of-two scales: every product and sum exact in fp32) not "
          "bit-exact: max |candidate - reference| " + std::to_string(m.max_abs) + " (max |reference| " +
          std::to_string(m.ref_max_abs) + "), " + std::to_string(m.nonfinite_mismatches) +
          " non-finite mismatch(es)" + (m.first_mismatch.empty() ? "" : " (first: " + m.first_mismatch + ")") +
          (b.fp8_reduced_accumulation()
               ? "; the backend declares fp8_reduced_accumulation, which loosens the bound of the other cases "
                 "1024-fold: these sums are exact in a 14-bit accumulator too, so the declaration does not "
                 "cover this error"
               : ""));
}

void fp8_indexer_exact_tier(Backend& b, const BlockFactory&) {
  const Fp8IndexerCase c = draw_fp8_indexer_case("exact", true);  // draw 3: keys past 65535
  DumpOnFailure dump([&] { return described([&] { return fixtures::fp8_indexer_fixture(c.in, case_name()); }, c.desc); });
  judge_exact_tier(b, Op::Fp8IndexerScores, c.in, reference::fp8_indexer_scores(c.in),
                   [&](const Fp8IndexerInputs& in) { return b.fp8_indexer_scores(in); });
}

void paged_indexer_exact_tier(Backend& b, const BlockFactory&) {
  // draw 3: blocks past 65535; draw 5: a context past 65536 keys
  const PagedIndexerCase c = draw_paged_indexer_case("exact", true);
  DumpOnFailure dump([&] { return described([&] { return fixtures::paged_indexer_fixture(c.in, case_name()); }, c.desc); });
  judge_exact_tier(b, Op::PagedIndexerScores, c.in, reference::paged_indexer_scores(c.in),
                   [&](const PagedIndexerInputs& in) { return b.paged_indexer_scores(in); });
}

// A key some window reads with a scale <= 0, NaN or inf is an invalid argument (SPEC §10):
// an error, never a silent result (a negative scale moved outside the ReLU flips signs).
void fp8_invalid_scale_rejected(Backend& b, const BlockFactory&) {
  const Fp8IndexerCase c = draw_fp8_indexer_case("bad_scale");
  DumpOnFailure dump([&] { return described([&] { return fixtures::fp8_indexer_fixture(c.in, case_name()); }, c.desc); });
  assert_rejected(
      b, poisoned(c.in), [&] { b.fp8_indexer_scores(c.in); }, [&] { b.fp8_indexer_scores(clean_twin(c.in)); },
      [&] { b.fp8_indexer_scores(valid_twin(c.in)); },
      "k_scale[" + std::to_string(c.bad_key) + "] = " + std::to_string(c.in.k_scale.get(c.bad_key)) +
          " of a key inside a window",
      c.desc);
}

// ---- paged FP8 indexer --------------------------------------------------------------------

void paged_indexer_ratio(Backend& b, const BlockFactory&) {
  // Draw 3 of a run with its physical blocks past 65535 (outside tester F3; the context past
  // 65536 keys is paged.indexer_exact_tier's draw 5: three runs of it here cost ~1.5 s CPU).
  const PagedIndexerCase c = draw_paged_indexer_case("", true);
  DumpOnFailure dump([&] { return described([&] { return fixtures::paged_indexer_fixture(c.in, case_name()); }, c.desc); });
  // The check re-runs the draw with entries past every context poisoned: always poisoned.
  judge_poisoned(
      true, [&] { DSA_PROP_JUDGE_DETECTABLE(b, Op::PagedIndexerScores, op_case(c.in), oracle::check_paged_indexer_scores); },
      [&] { b.paged_indexer_scores(clean_twin(c.in)); });
}

// next_n >= 2: row b·next_n+i sees exactly [0, L-next_n+i+1): key ke-1 finite, key ke -inf.
void paged_mtp_window_exact_at_ke(Backend& b, const BlockFactory&) {
  const PagedIndexerCase c = draw_paged_indexer_case("mtp");
  DumpOnFailure dump([&] { return described([&] { return fixtures::paged_indexer_fixture(c.in, case_name()); }, c.desc); });
  const reference::PagedGather g = reference::gather_paged_indexer(c.in);
  Tensor got;
  judge_poisoned(true, [&] { got = call_twin_tested(b, Op::PagedIndexerScores, op_case(c.in), [&] { return b.paged_indexer_scores(c.in); }); }, [&] { b.paged_indexer_scores(clean_twin(c.in)); });
  const int64_t rows = g.windows.s_q(), width = g.max_context;
  RC_ASSERT(got.shape() == std::vector<int64_t>({rows, width}));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t ke = g.windows.ke[r];
    if (ke > 0) RC_ASSERT(std::isfinite(got.get(r * width + ke - 1)));
    if (ke < width) RC_ASSERT(got.get(r * width + ke) == -INFINITY);
  }
  judge_poisoned(
      true, [&] { DSA_PROP_JUDGE_DETECTABLE(b, Op::PagedIndexerScores, op_case(c.in), oracle::check_paged_indexer_scores); },
      [&] { b.paged_indexer_scores(clean_twin(c.in)); });
}

// A table entry a context reads that is out of range, or a context longer than its table
// row holds: an error naming the problem, never a read of memory outside the cache.
void paged_bad_table_rejected(Backend& b, const BlockFactory&) {
  const PagedIndexerCase c = draw_paged_indexer_case("bad_table");
  DumpOnFailure dump([&] { return described([&] { return fixtures::paged_indexer_fixture(c.in, case_name()); }, c.desc); });
  bool bad = false;
  try {
    reference::paged_indexer_scores(c.in);
  } catch (const std::invalid_argument&) {
    bad = true;
  }
  RC_ASSERT(bad);  // the case is bad
  assert_rejected(
      b, poisoned(c.in), [&] { b.paged_indexer_scores(c.in); }, [&] { b.paged_indexer_scores(clean_twin(c.in)); },
      [&] { b.paged_indexer_scores(valid_twin(c.in)); }, "a bad block table / context length", c.desc);
}

// A scale of a key some context reads (k_scale_cache[block, slot]) that is <= 0, NaN or inf:
// an invalid argument (SPEC §10), rejected as fp8.invalid_scale_rejected is (fresh-user F2).
void paged_invalid_scale_rejected(Backend& b, const BlockFactory&) {
  PagedIndexerCase c = draw_paged_indexer_case();
  const int64_t bs = c.in.k_cache.size(1), max_blocks = c.in.block_table.size(1);
  std::vector<std::pair<int64_t, int64_t>> read;  // (request, logical key)
  for (int64_t r = 0; r < c.in.context_lens.numel(); ++r)
    for (int64_t p = 0; p < c.in.context_lens.get(r); ++p) read.push_back({r, p});
  RC_PRE(!read.empty());
  const std::pair<int64_t, int64_t> pick = read[*rc::gen::inRange<size_t>(0, read.size())];
  const int64_t req = pick.first, key = pick.second;
  const int64_t row = static_cast<int64_t>(c.in.block_table.get(req * max_blocks + key / bs)) * bs + key % bs;
  const float v = draw_bad_scale();
  c.in.k_scale_cache.data<float>()[row] = v;
  c.desc += " bad_scale=k_scale_cache[" + std::to_string(row / bs) + ", " + std::to_string(row % bs) + "] (key " +
            std::to_string(key) + " of request " + std::to_string(req) + ")";
  DumpOnFailure dump([&] { return described([&] { return fixtures::paged_indexer_fixture(c.in, case_name()); }, c.desc); });
  const std::string bad = "k_scale_cache[" + std::to_string(row / bs) + ", " + std::to_string(row % bs) + "] = " +
                          std::to_string(v) + " (key " + std::to_string(key) + " of request " + std::to_string(req) + ")";
  assert_rejected(
      b, poisoned(c.in), [&] { b.paged_indexer_scores(c.in); }, [&] { b.paged_indexer_scores(clean_twin(c.in)); },
      [&] { b.paged_indexer_scores(valid_twin(c.in)); }, bad, c.desc);
}

// ---- sparse MLA over the FP8 cache --------------------------------------------------------

void smla_fp8_forward_ratio(Backend& b, const BlockFactory&) {
  // The regular draws; draw 3 of a run with its tokens past 65535 (outside tester F3).
  const SmlaFp8Case c = draw_smla_fp8_case("wide_ids");
  DumpOnFailure dump([&] { return described([&] { return fixtures::sparse_mla_fp8_fixture(c.in, case_name()); }, c.desc); });
  SparseMlaForward f;
  // The check re-runs the draw with its unread tokens poisoned: poisoned when it has any (a
  // draw whose every token is read judges no poisoned unread part, so it does not count as one
  // that did: with it counted, declining every poisoned draw got a skip, not INCOMPLETE).
  const bool unread = has_unread_tokens(c.in);
  judge_poisoned(unread, [&] { f = call_twin_tested(b, Op::SparseMlaFp8Fwd, op_case(c.in), [&] { return b.sparse_mla_fp8_forward(c.in); }); }, [&] { b.sparse_mla_fp8_forward(clean_twin(c.in)); });
  // Empty rows (SPEC §6): out 0, lse +inf, max_logits -inf, no NaN.
  const int64_t s_q = c.in.q.size(0), h = c.in.q.size(1), k = c.in.indices.size(-1);
  const int64_t tokens = c.in.kv_cache.numel() / kMlaFp8TokenBytes;
  // Outputs a kernel does not provide (provided_outputs) are judged by the oracle as such.
  if (f.out.defined()) RC_ASSERT(f.out.shape() == std::vector<int64_t>({s_q, h, kMlaFp8NopeDim}));
  for (const Tensor* stat : {&f.lse, &f.max_logits})
    if (stat->defined()) RC_ASSERT(stat->shape() == std::vector<int64_t>({s_q, h}));
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = c.in.topk_length ? c.in.topk_length->get(t) : k;
    bool empty = true;
    for (int64_t j = 0; j < std::min(k, len); ++j) {
      const double id = c.in.indices.get(t * k + j);
      empty = empty && !(id >= 0 && id < static_cast<double>(tokens));
    }
    if (!empty) continue;
    for (int64_t hh = 0; hh < h; ++hh) {
      if (f.lse.defined()) RC_ASSERT(f.lse.get(t * h + hh) == INFINITY);
      if (f.max_logits.defined()) RC_ASSERT(f.max_logits.get(t * h + hh) == -INFINITY);
      if (f.out.defined())
        for (int64_t d = 0; d < kMlaFp8NopeDim; ++d)
          RC_ASSERT(f.out.get((t * h + hh) * kMlaFp8NopeDim + d) == 0.0);
    }
  }
  judge_poisoned(
      unread, [&] { DSA_PROP_JUDGE_DETECTABLE(b, Op::SparseMlaFp8Fwd, op_case(c.in), oracle::check_sparse_mla_fp8_forward); },
      [&] { b.sparse_mla_fp8_forward(clean_twin(c.in)); });
}

// A tile scale of a token some valid slot reads that is <= 0, NaN or inf: an invalid argument
// (SPEC §10), rejected as fp8.invalid_scale_rejected is (fresh-user F2).
void smla_fp8_invalid_scale_rejected(Backend& b, const BlockFactory&) {
  SmlaFp8Case c = draw_smla_fp8_case();
  const int64_t s_q = c.in.q.size(0), k = c.in.indices.size(-1);
  const int64_t tokens = c.in.kv_cache.numel() / kMlaFp8TokenBytes;
  std::vector<int64_t> read;
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = c.in.topk_length ? c.in.topk_length->get(t) : k;
    for (int64_t j = 0; j < std::min(k, len); ++j) {
      const double id = c.in.indices.get(t * k + j);
      if (id >= 0 && id < static_cast<double>(tokens)) read.push_back(static_cast<int64_t>(id));
    }
  }
  RC_PRE(!read.empty());
  const int64_t token = read[*rc::gen::inRange<size_t>(0, read.size())];
  const int64_t tile = *rc::gen::inRange<int64_t>(0, kMlaFp8NumTiles);
  const float v = draw_bad_scale();
  std::memcpy(c.in.kv_cache.data<uint8_t>() + token * kMlaFp8TokenBytes + kMlaFp8ScalesOffset + 4 * tile, &v,
              sizeof v);
  c.desc += " bad_scale=token " + std::to_string(token) + " tile " + std::to_string(tile);
  DumpOnFailure dump([&] { return described([&] { return fixtures::sparse_mla_fp8_fixture(c.in, case_name()); }, c.desc); });
  const std::string bad = "the scale of tile " + std::to_string(tile) + " of token " + std::to_string(token) +
                          " = " + std::to_string(v) + " (read by a valid slot)";
  assert_rejected(
      b, poisoned(c.in), [&] { b.sparse_mla_fp8_forward(c.in); },
      [&] { b.sparse_mla_fp8_forward(clean_twin(c.in)); }, [&] { b.sparse_mla_fp8_forward(valid_twin(c.in)); },
      bad, c.desc);
}

// ---- row and width limits (fresh-user finding F8) ----------------------------------------
// Many query rows (s_q >= 257, the first draw > 1024) and production shapes (H_I 64, d_I 128,
// keys past 128; paged contexts past 192; FP8 sparse MLA h_q 128, slots past 128), each op
// alone: a kernel dropping rows past a 128-row (paged: 64-row) tile, heads past 32 (indexer)
// or 64 (sparse MLA), keys past 128 or 192, or slots past 128 passed every audit.

void fp8_indexer_judged(Backend& b, const Fp8IndexerCase& c) {
  DumpOnFailure dump([&] { return described([&] { return fixtures::fp8_indexer_fixture(c.in, case_name()); }, c.desc); });
  RC_ASSERT(!all_zero(c.in.q_idx));
  RC_ASSERT(!all_zero(c.in.w));
  DSA_PROP_JUDGE_DETECTABLE(b, Op::Fp8IndexerScores, op_case(c.in), oracle::check_fp8_indexer_scores);
}
void fp8_indexer_many_rows(Backend& b, const BlockFactory&) { fp8_indexer_judged(b, draw_fp8_indexer_case("many_rows")); }
void fp8_indexer_production(Backend& b, const BlockFactory&) { fp8_indexer_judged(b, draw_fp8_indexer_case("production")); }

void paged_judged(Backend& b, const PagedIndexerCase& c) {
  DumpOnFailure dump([&] { return described([&] { return fixtures::paged_indexer_fixture(c.in, case_name()); }, c.desc); });
  DSA_PROP_JUDGE_DETECTABLE(b, Op::PagedIndexerScores, op_case(c.in), oracle::check_paged_indexer_scores);
}
void paged_many_rows(Backend& b, const BlockFactory&) { paged_judged(b, draw_paged_indexer_case("many_rows")); }
void paged_production(Backend& b, const BlockFactory&) { paged_judged(b, draw_paged_indexer_case("production")); }

void smla_fp8_judged(Backend& b, const SmlaFp8Case& c) {
  DumpOnFailure dump([&] { return described([&] { return fixtures::sparse_mla_fp8_fixture(c.in, case_name()); }, c.desc); });
  DSA_PROP_JUDGE_DETECTABLE(b, Op::SparseMlaFp8Fwd, op_case(c.in), oracle::check_sparse_mla_fp8_forward);
}
void smla_fp8_many_rows(Backend& b, const BlockFactory&) { smla_fp8_judged(b, draw_smla_fp8_case("many_rows")); }
void smla_fp8_production(Backend& b, const BlockFactory&) { smla_fp8_judged(b, draw_smla_fp8_case("production")); }

}  // namespace

void add_fp8_properties(std::vector<Property>& out) {
  out.push_back({"fp8.indexer_ratio", {Op::Fp8IndexerScores}, 1, fp8_indexer_ratio});
  out.push_back({"fp8.indexer_exact_tier", {Op::Fp8IndexerScores}, 1, fp8_indexer_exact_tier});
  out.push_back({"fp8.invalid_scale_rejected", {Op::Fp8IndexerScores}, 1, fp8_invalid_scale_rejected});
  out.push_back({"paged.indexer_ratio", {Op::PagedIndexerScores}, 1, paged_indexer_ratio});
  out.push_back({"paged.indexer_exact_tier", {Op::PagedIndexerScores}, 1, paged_indexer_exact_tier});
  out.push_back({"paged.mtp_window_exact_at_ke", {Op::PagedIndexerScores}, 1, paged_mtp_window_exact_at_ke});
  out.push_back({"paged.bad_table_rejected", {Op::PagedIndexerScores}, 1, paged_bad_table_rejected});
  out.push_back({"paged.invalid_scale_rejected", {Op::PagedIndexerScores}, 1, paged_invalid_scale_rejected});
  out.push_back({"smla_fp8.forward_ratio", {Op::SparseMlaFp8Fwd}, 1, smla_fp8_forward_ratio});
  out.push_back({"smla_fp8.invalid_scale_rejected", {Op::SparseMlaFp8Fwd}, 4, smla_fp8_invalid_scale_rejected});

  out.push_back({"fp8.indexer_many_rows", {Op::Fp8IndexerScores}, 8, fp8_indexer_many_rows});
  out.push_back({"fp8.indexer_production_shapes", {Op::Fp8IndexerScores}, 34, fp8_indexer_production});
  out.push_back({"paged.many_rows", {Op::PagedIndexerScores}, 8, paged_many_rows});
  out.push_back({"paged.production_shapes", {Op::PagedIndexerScores}, 34, paged_production});
  out.push_back({"smla_fp8.many_rows", {Op::SparseMlaFp8Fwd}, 8, smla_fp8_many_rows});
  out.push_back({"smla_fp8.production_shapes", {Op::SparseMlaFp8Fwd}, 34, smla_fp8_production});
}

}  // namespace dsa::props

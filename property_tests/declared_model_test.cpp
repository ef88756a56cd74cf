// The declared rounding models' exact tiers (declared_model_props.cpp): honest kernels of each
// model pass them, kernels declaring a model they do not follow fail them, and the liar mutants
// (smla_declares_*) pass every other sparse MLA property under their declaration: the tier is
// what catches them. docs/what-a-pass-means.md, Limits ("A declared model checked").
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>

#include "dsa/property_tests/flash_style_kernel.h"
#include "dsa/property_tests/suite.h"

namespace dsa::props {
namespace {

using oracle::Verdict;

const char* const kTierNp = "smla.normalized_p_exact_tier";
const char* const kTierSar = "smla.sink_after_rounding_exact_tier";

const Property& property_named(const std::string& name) {
  for (const auto& p : all_properties())
    if (p.name == name) return p;
  throw std::invalid_argument("no property " + name);
}

// A FlashAttention-style sparse MLA kernel (flash_style_kernel.h) computing as `o` says (P
// rounded to q's dtype, out in q's dtype; liar factors with 16-bit q only) and declaring
// `declares`.
class FlashStyleDeclaring final : public oracle::Backend {
 public:
  FlashStyleDeclaring(std::string name, FlashStyleOptions o, oracle::RoundingModel declares)
      : name_(std::move(name)), o_(o), declares_(declares) {}
  std::string name() const override { return name_; }
  bool supports(oracle::Op op) const override { return op == oracle::Op::SparseMlaFwd || op == oracle::Op::SparseMlaBwd; }
  oracle::RoundingModel rounding_model() const override { return declares_; }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    return flash_style_sparse_mla(in, nullptr, with_dtype(in)).fwd;
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    return flash_style_sparse_mla(in, &dout, with_dtype(in)).grads;
  }

 private:
  FlashStyleOptions with_dtype(const SparseMlaInputs& in) const {
    FlashStyleOptions o = o_;
    o.work = o.out_dtype = in.q.dtype();
    if (in.q.dtype() != DType::BF16 && in.q.dtype() != DType::F16) o.liar_pmax_factor = o.liar_presink_factor = 1.0f;
    return o;
  }
  std::string name_;
  FlashStyleOptions o_;
  oracle::RoundingModel declares_;
};

oracle::RoundingModel model(bool normalized_p, bool sink_after_rounding) {
  oracle::RoundingModel m;
  m.normalized_p = normalized_p;
  m.sink_after_rounding = sink_after_rounding;
  return m;
}

// Honest kernels: normalized P (p = exp(P - L) rounded, the sink in L) and the sink after
// rounding (P = exp(P - max) rounded, o rounded, then r), each in two fp32 summation orders.
Subject honest(bool normalized_p, SumOrder order, oracle::RoundingModel declares) {
  FlashStyleOptions o;
  o.order = order;
  o.round_p_before_pv = true;
  o.normalized_p = normalized_p;
  o.sink_after_rounding = !normalized_p;
  const std::string name = std::string(normalized_p ? "flash_normalized_p" : "flash_sink_after_rounding") +
                           (order == SumOrder::Slot ? "" : "_reversed") +
                           (declares.normalized_p ? "_declares_np" : "") +
                           (declares.sink_after_rounding ? "_declares_sar" : "");
  Subject s;
  s.name = name;
  s.make = [=] { return std::unique_ptr<oracle::Backend>(new FlashStyleDeclaring(name, o, declares)); };
  return s;
}

Subject mutant_named(const std::string& name) {
  for (const auto& m : mutant_subjects())
    if (m.name == name) return m;
  throw std::invalid_argument("no mutant " + name);
}

SuiteOptions options(int level, uint64_t seed) {
  SuiteOptions o;
  o.level = level;
  o.seed = seed;
  o.dump = false;
  o.quiet = true;
  return o;
}

// Each model's honest kernel passes its tier at levels 1 and 2 (seeds 11, 22), declaring its
// model or both, summing in slot order (and at level 1 reversed too).
TEST(DeclaredModelTier, HonestKernelsPassTheirTierAtLevels1And2) {
  for (int level : {1, 2})
    for (uint64_t seed : {11u, 22u})
      for (SumOrder order : {SumOrder::Slot, SumOrder::Reversed}) {
        if (level == 2 && order == SumOrder::Reversed) continue;  // (cost: level 2 is 400 draws)
        for (const Subject& s : {honest(true, order, model(true, false)), honest(true, order, model(true, true))}) {
          const PropertyResult r = run_property(s, property_named(kTierNp), options(level, seed));
          EXPECT_EQ(r.verdict, Verdict::Pass) << s.name << " level " << level << " seed " << seed << ": " << r.message;
          EXPECT_GT(r.cases, 0) << s.name;
        }
        const Subject s = honest(false, order, model(false, true));
        const PropertyResult r = run_property(s, property_named(kTierSar), options(level, seed));
        EXPECT_EQ(r.verdict, Verdict::Pass) << s.name << " level " << level << " seed " << seed << ": " << r.message;
        EXPECT_GT(r.cases, 0) << s.name;
      }
}

// A kernel of one model declaring the other fails that model's tier, and the FlashMLA-style
// kernel (the default model) declaring either fails it: the tiers tell the models apart.
TEST(DeclaredModelTier, AKernelDeclaringAModelItDoesNotFollowFails) {
  const SuiteOptions o = options(0, 1);
  FlashStyleOptions flash;
  flash.round_p_before_pv = true;
  for (const auto& [s, prop] : std::vector<std::pair<Subject, const char*>>{
           {honest(false, SumOrder::Slot, model(true, false)), kTierNp},  // sink after rounding declaring normalized P
           {honest(true, SumOrder::Slot, model(false, true)), kTierSar},  // normalized P declaring the sink after rounding
       }) {
    const PropertyResult r = run_property(s, property_named(prop), o);
    EXPECT_EQ(r.verdict, Verdict::Fail) << s.name << " " << prop << ": " << r.message;
    EXPECT_NE(r.message.find("not followed on its exact tier"), std::string::npos) << r.message;
  }
  for (const auto& [m, prop] : std::vector<std::pair<oracle::RoundingModel, const char*>>{
           {model(true, false), kTierNp}, {model(false, true), kTierSar}}) {
    Subject s;
    s.name = "flashmla_style_declaring";
    s.make = [m = m, flash] { return std::unique_ptr<oracle::Backend>(new FlashStyleDeclaring("flashmla_style_declaring", flash, m)); };
    const PropertyResult r = run_property(s, property_named(prop), o);
    EXPECT_EQ(r.verdict, Verdict::Fail) << prop << ": " << r.message;
    // every differing element is the default model's value
    EXPECT_NE(r.message.find("of them equal the default model's"), std::string::npos) << r.message;
  }
}

// A backend declaring nothing: both tiers are skips that say so (the audit makes no task of
// them, cli/src/audit_tasks.cpp).
TEST(DeclaredModelTier, ABackendDeclaringNothingSkips) {
  for (const char* prop : {kTierNp, kTierSar}) {
    const PropertyResult r = run_property(backend_subject("reference"), property_named(prop), options(0, 1));
    EXPECT_EQ(r.verdict, Verdict::Skip) << r.message;
    EXPECT_NE(r.message.find("which the backend does not declare"), std::string::npos) << r.message;
  }
}

// The liar mutants: each fails its tier at level 0 on seeds 1-3, and passes every other sparse
// MLA property under its declaration (level 0, seed 1): before the tiers nothing caught them.
// Without the declaration (the same kernel declaring nothing) a sparse MLA property fails: the
// declaration is what hid the error. ~60 s.
TEST(DeclaredModelTier, LiarsFailOnlyTheirTier) {
  for (const auto& [name, prop] : std::vector<std::pair<std::string, const char*>>{
           {"smla_declares_normalized_p_max_key_biased", kTierNp},
           {"smla_declares_sink_after_rounding_presink_biased", kTierSar}}) {
    const Subject liar = mutant_named(name);
    for (uint64_t seed : {1u, 2u, 3u}) {
      const PropertyResult r = run_property(liar, property_named(prop), options(0, seed));
      EXPECT_EQ(r.verdict, Verdict::Fail) << name << " seed " << seed << ": " << r.message;
      std::cout << "  " << name << " " << prop << " seed " << seed << ": " << oracle::to_string(r.verdict) << " "
                << r.message.substr(0, 300) << "\n";
    }
    int others = 0;
    for (const auto& p : all_properties()) {
      if (p.name.rfind("smla.", 0) != 0 || p.name == kTierNp || p.name == kTierSar) continue;
      const PropertyResult r = run_property(liar, p, options(0, 1));
      EXPECT_NE(r.verdict, Verdict::Fail) << name << " " << p.name << ": " << r.message;
      others += r.verdict == Verdict::Pass;
    }
    EXPECT_GT(others, 8) << name;
    std::cout << "  " << name << ": " << others << " other sparse MLA properties passed declared\n";
  }
}

// The liars' kernels declaring nothing: some sparse MLA property fails (level 0, seeds 1-3),
// so the hidden error is what the declaration hid. Prints which properties fail.
TEST(DeclaredModelTier, TheLiarsErrorFailsWithoutTheDeclaration) {
  for (bool np : {true, false}) {
    FlashStyleOptions o;
    o.round_p_before_pv = true;
    Subject s;
    s.name = np ? "max_key_biased_undeclared" : "presink_biased_undeclared";
    s.make = [o, np, name = s.name] {
      FlashStyleOptions x = o;
      (np ? x.liar_pmax_factor : x.liar_presink_factor) = 1.0f + 0x1p-9f;  // bf16 draws only here
      return std::unique_ptr<oracle::Backend>(new FlashStyleDeclaring(name, x, model(false, false)));
    };
    int failed = 0;
    std::string which;
    for (uint64_t seed : {1u, 2u, 3u})
      for (const auto& p : all_properties()) {
        if (p.name.rfind("smla.", 0) != 0 || !p.declared_model.empty()) continue;
        const PropertyResult r = run_property(s, p, options(0, seed));
        if (r.verdict != Verdict::Fail) continue;
        ++failed;
        which += " " + p.name + "@" + std::to_string(seed);
      }
    std::cout << "  " << s.name << ": failed" << which << "\n";
    EXPECT_GT(failed, 0) << s.name;
  }
}

}  // namespace
}  // namespace dsa::props

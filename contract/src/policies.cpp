#include "dsa/contract/policies.h"

#include <stdexcept>

namespace dsa {

namespace {
[[noreturn]] void bad(const char* what, const std::string& text, const char* expected) {
  throw std::invalid_argument(std::string("parse: argument '") + what + "' got \"" + text +
                              "\", expected " + expected);
}
}  // namespace

const char* to_string(TieBreak v) {
  switch (v) {
    case TieBreak::Any: return "any";
    case TieBreak::Small: return "small";
    case TieBreak::Large: return "large";
  }
  return "?";
}
TieBreak parse_tie_break(const std::string& s) {
  if (s == "any") return TieBreak::Any;
  if (s == "small") return TieBreak::Small;
  if (s == "large") return TieBreak::Large;
  bad("tie_break", s, "any, small or large");
}

const char* to_string(RecomputePolicy v) {
  switch (v) {
    case RecomputePolicy::None: return "none";
    case RecomputePolicy::Full: return "full";
    case RecomputePolicy::SaveDsaIndexer: return "save_dsa_indexer";
  }
  return "?";
}
RecomputePolicy parse_recompute_policy(const std::string& s) {
  if (s == "none") return RecomputePolicy::None;
  if (s == "full") return RecomputePolicy::Full;
  if (s == "save_dsa_indexer") return RecomputePolicy::SaveDsaIndexer;
  bad("recompute_policy", s, "none, full or save_dsa_indexer");
}

const char* to_string(KlMode v) { return v == KlMode::Dense ? "dense" : "sparse"; }
KlMode parse_kl_mode(const std::string& s) {
  if (s == "dense") return KlMode::Dense;
  if (s == "sparse") return KlMode::Sparse;
  bad("mode", s, "dense or sparse");
}

}  // namespace dsa

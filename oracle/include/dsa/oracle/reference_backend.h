// The `reference` backend: the float64 reference (dsa::reference) behind the Backend
// interface, so every property and fixture check can run on it like on any kernel.
#pragma once

#include <memory>

#include "dsa/oracle/backend.h"

namespace dsa::oracle {

/// Backend "reference": every op of SPEC §2-§7 computed by dsa::reference at
/// Precision::Reference. Outputs are F64 (the exact truth, not rounded to a kernel dtype), so
/// its error against the reference is zero by construction; Topk returns I32. Deterministic.
/// computes_reference(): the checks take its results from the case's memo (one computation
/// per case, shared with the judge's reference).
/// Errors: whatever dsa::reference throws (std::invalid_argument naming the argument).
std::unique_ptr<Backend> make_reference_backend();

/// Registers make_reference_backend under the name "reference" (idempotent).
void register_reference_backend();

}  // namespace dsa::oracle

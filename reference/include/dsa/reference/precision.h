// The two precisions every reference op runs at (SPEC §9).
#pragma once

namespace dsa::reference {

/// Reference: float64 from the exact input values (the truth).
/// Baseline: the same algorithm with fp32 accumulation; outputs returned as F32, unrounded.
/// BF16/F16/F32 inputs are read exactly; an F64 input is rounded once to fp32.
/// The oracle rounds a baseline output to the candidate's output dtype (bf16/fp16) before
/// measuring its error, giving "the reference algorithm at the candidate's precision".
enum class Precision { Reference, Baseline };

}  // namespace dsa::reference

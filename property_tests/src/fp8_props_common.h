// The §10 (FP8 / paged) part of the property suite: its properties and its mutants, kept in
// their own files (fp8_props.cpp, mutants/fp8_mutants.cpp) and hooked into all_properties()
// and mutant_subjects().
#pragma once

#include <vector>

#include "dsa/property_tests/suite.h"

namespace dsa::props {

/// fp8.*, paged.*, smla_fp8.* properties.
void add_fp8_properties(std::vector<Property>& out);
/// Mutants of the §10 ops (tile scales swapped, a block read past the context, next_n rows
/// sharing one window, k scale after ReLU with negative scales accepted, RoPE read as FP8).
std::vector<Subject> fp8_mutant_subjects();
/// Correct FP8 kernels for the false-alarm run (control_subjects()): the FlashMLA-style FP8
/// decode kernel with the tile scale rounded to bf16 and with the fp32 scale
/// (flashmla_fp8_forward, fp8_generators.h).
std::vector<Subject> fp8_control_subjects();

}  // namespace dsa::props

// The §10 (FP8 / paged) part of the property suite: its properties and its mutants, kept in
// their own files (fp8_props.cpp, mutants/fp8_mutants.cpp) and hooked into all_properties()
// and mutant_subjects().
#pragma once

#include <vector>

#include "dsa/contract/fp8_op_types.h"
#include "dsa/property_tests/suite.h"

namespace dsa::props {

/// Clean twins (SPEC §10: parts no valid read uses may hold anything): the draw with every
/// unread part made ordinary (FP8 bytes 0, scales 1, table entries past a context block 0); read
/// parts, bad ones included, as they were. poisoned(): the twin differs from the input. The §10
/// properties run a declined draw's twin: a backend that runs it declined the poisoned unread
/// parts, a mandatory case (feature poisoned_unread, fresh-user F4b).
Fp8IndexerInputs clean_twin(const Fp8IndexerInputs& in);
PagedIndexerInputs clean_twin(const PagedIndexerInputs& in);
SparseMlaFp8Inputs clean_twin(const SparseMlaFp8Inputs& in);
bool poisoned(const Fp8IndexerInputs& in);
bool poisoned(const PagedIndexerInputs& in);
bool poisoned(const SparseMlaFp8Inputs& in);

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

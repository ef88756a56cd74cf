// Internal: the autograd Function types of autograd.cpp, visible to block.cpp's saved-bytes walk.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <vector>

namespace dsa::optimized::detail {

/// When `node` is one of the dsa autograd nodes (indexer, sparse MLA, KL loss), appends the
/// tensors it saved for backward to `saved` and returns true; false otherwise.
bool saved_tensors_of_op_node(torch::autograd::Node* node, std::vector<at::Tensor>* saved);

}  // namespace dsa::optimized::detail

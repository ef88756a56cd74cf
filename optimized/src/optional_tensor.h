// Possibly-undefined tensor arguments of autograd functions travel as optionals:
// LibTorch 1.13's Function::apply cannot record an undefined at::Tensor input.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

namespace dsa::optimized {

using OptT = c10::optional<at::Tensor>;

/// An optional holding `t`, or empty when `t` is undefined.
inline OptT opt(const at::Tensor& t) { return t.defined() ? OptT(t) : c10::nullopt; }
/// The held tensor, or an undefined one.
inline at::Tensor val(const OptT& t) { return t.has_value() ? *t : at::Tensor(); }

}  // namespace dsa::optimized

// Element types that cross the suite's boundaries, with exact upcasts and IEEE
// round-to-nearest-even downcasts. Source: safetensors dtype names; IEEE 754 binary16;
// bfloat16 = the top 16 bits of binary32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace dsa {

/// Storage types. Names follow safetensors ("F64", "BF16", ...).
enum class DType : uint8_t { F64, F32, F16, BF16, I64, I32, U8, Bool };

/// Bytes per element (F64 8, F32 4, F16/BF16 2, I64 8, I32 4, U8/Bool 1).
size_t dtype_size(DType dtype);
/// safetensors name, e.g. "BF16".
const char* dtype_name(DType dtype);
/// Parses a safetensors name; throws std::invalid_argument naming `text` when unknown.
DType parse_dtype(const std::string& text);
/// True for F64, F32, F16, BF16.
bool is_floating(DType dtype);

/// bfloat16 bits. Upcast to float is exact; downcast rounds to nearest even, NaN stays NaN.
struct bf16 {
  uint16_t bits = 0;
};
/// IEEE binary16 bits. Upcast is exact (subnormals included); downcast rounds to nearest even.
struct f16 {
  uint16_t bits = 0;
};

float bf16_to_float(bf16 v);
bf16 float_to_bf16(float v);
/// Rounds a double to bf16 with a single rounding (no double rounding through float).
bf16 double_to_bf16(double v);
float f16_to_float(f16 v);
/// Rounds a double to binary16 with a single rounding; overflow gives ±inf.
f16 double_to_f16(double v);

}  // namespace dsa

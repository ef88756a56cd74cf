#include "dsa/contract/dtype.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace dsa {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::U8: case DType::Bool: return 1;
  }
  return 0;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
    case DType::Bool: return "BOOL";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  for (DType d : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32,
                  DType::U8, DType::Bool})
    if (s == dtype_name(d)) return d;
  throw std::invalid_argument("parse_dtype: argument 'dtype' got \"" + s +
                              "\", expected one of F64, F32, F16, BF16, I64, I32, U8, BOOL");
}

bool is_floating(DType d) {
  return d == DType::F64 || d == DType::F32 || d == DType::F16 || d == DType::BF16;
}

float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rounds a finite double to the nearest value with `mant_bits` explicit mantissa bits and
// minimum normal exponent `emin` (subnormals below it), ties to even. Returns the rounded
// double (exactly representable in the target format, or ±inf past `max_finite`).
static double round_to_format(double v, int mant_bits, int emin, double max_finite) {
  if (!std::isfinite(v) || v == 0.0) return v;
  int e;
  std::frexp(std::fabs(v), &e);  // |v| = m * 2^e, m in [0.5, 1)
  int exp = std::max(e - 1, emin);
  double quantum = std::ldexp(1.0, exp - mant_bits);
  double r = std::nearbyint(v / quantum) * quantum;  // default rounding mode: ties to even
  // Overflow: values at or past max_finite + half an ulp round to inf.
  double half_ulp_past = max_finite + std::ldexp(1.0, static_cast<int>(std::log2(max_finite)) -
                                                          mant_bits - 1);
  if (std::fabs(v) >= half_ulp_past) return std::copysign(std::numeric_limits<double>::infinity(), v);
  return r;
}

bf16 double_to_bf16(double v) {
  if (std::isnan(v)) return bf16{static_cast<uint16_t>(std::signbit(v) ? 0xFFC0 : 0x7FC0)};
  // bf16: 7 explicit mantissa bits, min normal exponent -126, max finite (2 - 2^-7) * 2^127.
  double r = round_to_format(v, 7, -126, std::ldexp(255.0 / 128.0, 127));
  float f = static_cast<float>(r);  // exact: r is representable in bf16 hence in float
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

bf16 float_to_bf16(float v) { return double_to_bf16(static_cast<double>(v)); }

float f16_to_float(f16 v) {
  uint32_t sign = (v.bits >> 15) & 1u, exp = (v.bits >> 10) & 0x1Fu, man = v.bits & 0x3FFu;
  float mag;
  if (exp == 0) mag = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) mag = man ? std::numeric_limits<float>::quiet_NaN()
                                : std::numeric_limits<float>::infinity();
  else mag = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -mag : mag;
}

f16 double_to_f16(double v) {
  uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  if (std::isnan(v)) return f16{static_cast<uint16_t>(sign | 0x7E00)};
  double r = std::fabs(round_to_format(v, 10, -14, 65504.0));
  if (std::isinf(r)) return f16{static_cast<uint16_t>(sign | 0x7C00)};
  if (r == 0.0) return f16{sign};
  int e;
  std::frexp(r, &e);
  int exp = e - 1;
  if (exp < -14) {  // subnormal: r = man * 2^-24
    return f16{static_cast<uint16_t>(sign | static_cast<uint16_t>(std::ldexp(r, 24)))};
  }
  uint16_t man = static_cast<uint16_t>(std::ldexp(r, 10 - exp) - 1024.0);
  return f16{static_cast<uint16_t>(sign | ((exp + 15) << 10) | man)};
}

}  // namespace dsa

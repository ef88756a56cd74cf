#include "dsa/contract/fp8.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>
#include <limits>
#include <stdexcept>

#include "dsa/contract/checks.h"
#include "dsa/contract/errors.h"

namespace dsa {
namespace {

struct Fp8Spec {
  int exp_bits, mant_bits, bias;
};
Fp8Spec spec(Fp8Format f) {
  return f == Fp8Format::E4M3FN ? Fp8Spec{4, 3, 7} : Fp8Spec{5, 2, 15};
}

}  // namespace

const char* to_string(Fp8Format f) { return f == Fp8Format::E4M3FN ? "e4m3fn" : "e5m2"; }

Fp8Format parse_fp8_format(const std::string& s) {
  if (s == "e4m3fn") return Fp8Format::E4M3FN;
  if (s == "e5m2") return Fp8Format::E5M2;
  throw std::invalid_argument("parse_fp8_format: argument 'format' got \"" + s +
                              "\", expected e4m3fn or e5m2");
}

double fp8_max(Fp8Format f) { return f == Fp8Format::E4M3FN ? 448.0 : 57344.0; }
double fp8_min_subnormal(Fp8Format f) {
  return f == Fp8Format::E4M3FN ? std::ldexp(1.0, -9) : std::ldexp(1.0, -16);
}

double fp8_to_double(uint8_t byte, Fp8Format f) {
  const Fp8Spec s = spec(f);
  const bool neg = (byte & 0x80u) != 0;
  const int exp = (byte >> s.mant_bits) & ((1 << s.exp_bits) - 1);
  const int man = byte & ((1 << s.mant_bits) - 1);
  const int exp_all_ones = (1 << s.exp_bits) - 1;
  double mag;
  if (f == Fp8Format::E4M3FN && exp == exp_all_ones && man == (1 << s.mant_bits) - 1) {
    mag = std::numeric_limits<double>::quiet_NaN();
  } else if (f == Fp8Format::E5M2 && exp == exp_all_ones) {
    mag = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {  // subnormal: man · 2^(1 - bias - mant_bits)
    mag = std::ldexp(static_cast<double>(man), 1 - s.bias - s.mant_bits);
  } else {
    mag = std::ldexp(static_cast<double>(man | (1 << s.mant_bits)), exp - s.bias - s.mant_bits);
  }
  return neg ? -mag : mag;
}

uint8_t double_to_fp8(double v, Fp8Format f, Fp8Overflow overflow) {
  const Fp8Spec s = spec(f);
  const uint8_t sign = std::signbit(v) ? 0x80u : 0u;
  if (std::isnan(v)) return static_cast<uint8_t>(sign | 0x7Fu);
  const double max = fp8_max(f);
  auto overflowed = [&]() -> uint8_t {
    if (overflow == Fp8Overflow::Saturate) return static_cast<uint8_t>(sign | double_to_fp8(max, f));
    return f == Fp8Format::E4M3FN ? static_cast<uint8_t>(sign | 0x7Fu) : static_cast<uint8_t>(sign | 0x7Cu);
  };
  if (std::isinf(v)) return overflowed();
  const double a = std::fabs(v);
  if (a == 0.0) return sign;
  // Round to nearest even with an unbounded exponent above the minimum normal one, so a
  // value rounding past max is detected as overflow (e4m3fn 464 → 448 (tie to even);
  // e5m2 61440 → 65536 → overflow).
  const int emin = 1 - s.bias;
  int e;
  std::frexp(a, &e);  // a = m · 2^e, m in [0.5, 1)
  const int exp = std::max(e - 1, emin);
  const double quantum = std::ldexp(1.0, exp - s.mant_bits);
  const double r = std::nearbyint(a / quantum) * quantum;  // default mode: ties to even
  if (r > max) return overflowed();
  if (r == 0.0) return sign;
  int re;
  std::frexp(r, &re);
  const int rexp = re - 1;
  if (rexp < emin)  // subnormal: r = man · 2^(emin - mant_bits)
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::ldexp(r, s.mant_bits - emin)));
  const int man = static_cast<int>(std::ldexp(r, s.mant_bits - rexp)) - (1 << s.mant_bits);
  return static_cast<uint8_t>(sign | ((rexp + s.bias) << s.mant_bits) | man);
}

Tensor fp8_decode(const Tensor& bytes, Fp8Format f) {
  check_dtype("fp8_decode", "bytes", bytes, {DType::U8});
  Tensor out(DType::F64, bytes.shape());
  const uint8_t* b = bytes.data<uint8_t>();
  double* o = out.data<double>();
  for (int64_t i = 0; i < bytes.numel(); ++i) o[i] = fp8_to_double(b[i], f);
  return out;
}

Tensor fp8_encode(const Tensor& values, Fp8Format f, Fp8Overflow overflow) {
  Tensor out(DType::U8, values.shape());
  uint8_t* o = out.data<uint8_t>();
  for (int64_t i = 0; i < values.numel(); ++i) o[i] = double_to_fp8(values.get(i), f, overflow);
  return out;
}

void check_fp8_scale(const char* where, const char* arg, int64_t index, double scale) {
  // (the message is formatted only for a bad scale: callers check every key a window reads)
  if (!(std::isfinite(scale) && scale > 0.0))
    check_arg(false, where, arg, std::string(arg) + "[" + std::to_string(index) + "] = " + str(scale),
              "a positive finite fp32 scale (SPEC §10)");
}

float fp8_tile_scale(double amax, Fp8Format f, Fp8ScaleRule rule) {
  if (!(amax > 0.0) || !std::isfinite(amax)) return 1.0f;
  const double ratio = amax / fp8_max(f);
  double s = ratio;
  if (rule == Fp8ScaleRule::Pow2) {
    int e;
    const double m = std::frexp(ratio, &e);  // ratio = m · 2^e, m in [0.5, 1)
    s = std::ldexp(1.0, m == 0.5 ? e - 1 : e);
  }
  // fp32 rounding may put amax / s just above fp8_max; saturation keeps the byte finite.
  // Clamped into the positive finite fp32 range so the scale is always valid.
  s = std::min(s, static_cast<double>(std::numeric_limits<float>::max()));
  const float out = static_cast<float>(s);
  return out > 0.0f ? out : std::numeric_limits<float>::denorm_min();
}

Fp8Quantized fp8_quantize_rows(const Tensor& values, int64_t tile, Fp8Format f,
                               Fp8ScaleRule rule) {
  const char* where = "fp8_quantize_rows";
  check_arg(values.dim() >= 1, where, "values", "shape " + shape_str(values.shape()), "rank >= 1");
  const int64_t d = values.size(-1);
  check_arg(tile >= 1 && d % tile == 0, where, "tile", str(tile),
            "a positive divisor of the last dimension " + str(d));
  const int64_t rows = d == 0 ? 0 : values.numel() / d, tiles = d / tile;
  std::vector<int64_t> scale_shape = values.shape();
  scale_shape.back() = tiles;
  Fp8Quantized q{Tensor(DType::U8, values.shape()), Tensor(DType::F32, scale_shape)};
  uint8_t* b = q.bytes.data<uint8_t>();
  float* sc = q.scales.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < tiles; ++i) {
      double amax = 0;
      for (int64_t c = i * tile; c < (i + 1) * tile; ++c)
        amax = std::max(amax, std::fabs(values.get(r * d + c)));
      const float s = fp8_tile_scale(amax, f, rule);
      sc[r * tiles + i] = s;
      for (int64_t c = i * tile; c < (i + 1) * tile; ++c)
        b[r * d + c] = double_to_fp8(values.get(r * d + c) / s, f, Fp8Overflow::Saturate);
    }
  return q;
}

float MlaFp8TokenView::tile_scale(int64_t i) const {
  float s;
  std::memcpy(&s, p_ + kMlaFp8ScalesOffset + 4 * i, 4);  // little-endian host (x86, aarch64)
  return s;
}

bf16 MlaFp8TokenView::rope(int64_t i) const {
  bf16 v;
  std::memcpy(&v.bits, p_ + kMlaFp8RopeOffset + 2 * i, 2);
  return v;
}

double MlaFp8TokenView::value(int64_t c) const {
  if (c < kMlaFp8NopeDim)
    return fp8_to_double(p_[c], Fp8Format::E4M3FN) *
           static_cast<double>(tile_scale(c / kMlaFp8TileSize));
  return static_cast<double>(bf16_to_float(rope(c - kMlaFp8NopeDim)));
}

void MlaFp8TokenView::check_scales(const char* where, const char* arg, int64_t token_row) const {
  for (int64_t i = 0; i < kMlaFp8NumTiles; ++i) {
    const double s = tile_scale(i);
    check_arg(std::isfinite(s) && s > 0.0, where, arg,
              "token row " + str(token_row) + " tile " + str(i) + " scale " + str(s),
              "a positive finite fp32 scale in every tile a kernel reads (SPEC §10)");
  }
}

void encode_mla_fp8_token(const double* kv_row, Fp8ScaleRule rule, uint8_t* token) {
  for (int64_t i = 0; i < kMlaFp8NumTiles; ++i) {
    double amax = 0;
    for (int64_t c = i * kMlaFp8TileSize; c < (i + 1) * kMlaFp8TileSize; ++c)
      amax = std::max(amax, std::fabs(kv_row[c]));
    const float s = fp8_tile_scale(amax, Fp8Format::E4M3FN, rule);
    std::memcpy(token + kMlaFp8ScalesOffset + 4 * i, &s, 4);
    for (int64_t c = i * kMlaFp8TileSize; c < (i + 1) * kMlaFp8TileSize; ++c)
      token[c] = double_to_fp8(kv_row[c] / s, Fp8Format::E4M3FN, Fp8Overflow::Saturate);
  }
  for (int64_t i = 0; i < kMlaFp8RopeDim; ++i) {
    const bf16 v = double_to_bf16(kv_row[kMlaFp8NopeDim + i]);
    std::memcpy(token + kMlaFp8RopeOffset + 2 * i, &v.bits, 2);
  }
}

Tensor encode_mla_fp8_cache(const Tensor& kv, Fp8ScaleRule rule) {
  check_shape("encode_mla_fp8_cache", "kv", kv, {-1, kMlaFp8Dqk});
  const int64_t n = kv.size(0);
  Tensor out(DType::U8, {n, kMlaFp8TokenBytes});
  std::vector<double> row(static_cast<size_t>(kMlaFp8Dqk));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < kMlaFp8Dqk; ++c) row[static_cast<size_t>(c)] = kv.get(t * kMlaFp8Dqk + c);
    encode_mla_fp8_token(row.data(), rule, out.data<uint8_t>() + t * kMlaFp8TokenBytes);
  }
  return out;
}

}  // namespace dsa

// FP8 element types (SPEC §10): exact decoding of e4m3fn and e5m2 bytes to float64, the
// encoding used only to GENERATE cases (round to nearest even, documented overflow), scale
// rules, per-tile quantization, and the 656-byte FlashMLA FP8 sparse-MLA token layout.
// Sources: OCP 8-bit Floating Point Specification (OFP8) rev. 1.0 (e4m3fn: bias 7, no inf,
// NaN = S.1111.111, max 448; e5m2: bias 15, IEEE-like inf/NaN, max 57344); FlashMLA V3.2
// sparse decode KV cache layout (512 e4m3 NoPE + 4 fp32 tile scales + 64 bf16 RoPE).
// FP8 tensors are U8 dsa::Tensor bytes plus an Fp8Format tag (there is no FP8 DType).
#pragma once

#include <cstdint>
#include <string>

#include "dsa/contract/dtype.h"
#include "dsa/contract/tensor.h"

namespace dsa {

/// The two OCP FP8 formats.
enum class Fp8Format : uint8_t { E4M3FN, E5M2 };
/// "e4m3fn" / "e5m2" (the tag written in fixtures).
const char* to_string(Fp8Format f);
/// Parses "e4m3fn" or "e5m2"; throws std::invalid_argument naming `text` otherwise.
Fp8Format parse_fp8_format(const std::string& text);
/// Largest finite magnitude: 448 (e4m3fn), 57344 (e5m2).
double fp8_max(Fp8Format f);
/// Smallest positive subnormal: 2^-9 (e4m3fn), 2^-16 (e5m2).
double fp8_min_subnormal(Fp8Format f);

/// Exact value of one FP8 byte: NaN for NaN codes (e4m3fn 0x7F/0xFF; e5m2 exponent 31 with a
/// non-zero mantissa), ±inf for e5m2 0x7C/0xFC, -0.0 for 0x80. Never throws.
double fp8_to_double(uint8_t byte, Fp8Format f);

/// What encoding does with a value whose RNE rounding exceeds fp8_max (and with ±inf).
/// Saturate: ±fp8_max (CUDA's __NV_SATFINITE, what case generators use).
/// NoSaturate: e4m3fn gives NaN (it has no inf), e5m2 gives ±inf (OFP8 §5.2).
enum class Fp8Overflow : uint8_t { Saturate, NoSaturate };

/// One FP8 byte for `v`, rounded to nearest, ties to even (subnormals included), one rounding
/// from the double. NaN → 0x7F (sign kept). Overflow per `overflow`. Used to generate cases
/// only: the oracle always judges on the bytes a kernel was given.
uint8_t double_to_fp8(double v, Fp8Format f, Fp8Overflow overflow = Fp8Overflow::Saturate);

/// Every byte of a U8 tensor decoded exactly: F64 tensor of the same shape.
/// Throws std::invalid_argument naming 'bytes' when its dtype is not U8.
Tensor fp8_decode(const Tensor& bytes, Fp8Format f);
/// Every element (any dtype, read exactly) encoded by double_to_fp8: U8 tensor, same shape.
Tensor fp8_encode(const Tensor& values, Fp8Format f, Fp8Overflow overflow = Fp8Overflow::Saturate);

/// Throws std::invalid_argument("<where>: argument '<arg>' got <arg>[i] = v, expected a
/// positive finite fp32 scale") unless `scale` is positive and finite (SPEC §10).
void check_fp8_scale(const char* where, const char* arg, int64_t index, double scale);

/// How a generator picks a tile's scale from its largest magnitude `amax` (SPEC §10):
/// Amax: fp32(amax / fp8_max); Pow2: the smallest power of two >= amax / fp8_max ("UE8M0").
/// An all-zero tile gets scale 1.
enum class Fp8ScaleRule : uint8_t { Amax, Pow2 };
/// The scale of a tile with largest magnitude `amax` under `rule` (a positive finite fp32).
float fp8_tile_scale(double amax, Fp8Format f, Fp8ScaleRule rule);

/// Quantized rows: bytes U8 [rows, d] and scales F32 [rows, d / tile].
struct Fp8Quantized {
  Tensor bytes;
  Tensor scales;
};
/// Quantizes `values` (rank >= 1, last dimension d, any float dtype) per row in tiles of
/// `tile` columns (d % tile == 0): scale = fp8_tile_scale(tile amax), byte = saturating RNE of
/// value / scale. bytes keep `values`' shape; scales have shape [..., d / tile].
/// Generators only (SPEC §10). Throws std::invalid_argument naming 'tile' or 'values'.
Fp8Quantized fp8_quantize_rows(const Tensor& values, int64_t tile, Fp8Format f, Fp8ScaleRule rule);

// ---- FlashMLA FP8 sparse-MLA KV cache: one token = 656 bytes (SPEC §10) -------------------

inline constexpr int64_t kMlaFp8NopeDim = 512;    ///< e4m3fn NoPE values (= d_v)
inline constexpr int64_t kMlaFp8TileSize = 128;   ///< NoPE values per scale
inline constexpr int64_t kMlaFp8NumTiles = 4;     ///< fp32 scales after the NoPE bytes
inline constexpr int64_t kMlaFp8RopeDim = 64;     ///< bf16 RoPE values after the scales
inline constexpr int64_t kMlaFp8Dqk = kMlaFp8NopeDim + kMlaFp8RopeDim;  ///< 576
inline constexpr int64_t kMlaFp8ScalesOffset = kMlaFp8NopeDim;          ///< byte 512
inline constexpr int64_t kMlaFp8RopeOffset = kMlaFp8ScalesOffset + 4 * kMlaFp8NumTiles;  ///< 528
inline constexpr int64_t kMlaFp8TokenBytes = kMlaFp8RopeOffset + 2 * kMlaFp8RopeDim;     ///< 656

/// Read-only typed view of one 656-byte token (little-endian fp32 scales and bf16 RoPE).
/// Bytes [0,512): e4m3fn NoPE; [512,528): 4 fp32 scales, tile i covers NoPE [128i, 128i+128);
/// [528,656): 64 bf16 RoPE values (not quantized, no scale).
class MlaFp8TokenView {
 public:
  explicit MlaFp8TokenView(const uint8_t* token) : p_(token) {}
  /// NoPE byte i (0 <= i < 512).
  uint8_t nope_byte(int64_t i) const { return p_[i]; }
  /// Scale of tile i (0 <= i < 4), as stored (may be invalid in unread tokens).
  float tile_scale(int64_t i) const;
  /// RoPE value i (0 <= i < 64), bf16 bits.
  bf16 rope(int64_t i) const;
  /// Dequantized value c of the token's 576-wide kv row: c < 512: fp8(nope_byte(c)) ·
  /// tile_scale(c / 128); c >= 512: rope(c - 512). Exact in float64.
  double value(int64_t c) const;
  /// Throws std::invalid_argument naming `arg` and `token_row` unless all 4 scales are
  /// positive finite (call it for tokens a kernel must read).
  void check_scales(const char* where, const char* arg, int64_t token_row) const;

 private:
  const uint8_t* p_;
};

/// Writes one token for a 576-wide kv row (values read as doubles): NoPE quantized per
/// 128-tile with fp8_tile_scale(rule), RoPE rounded once to bf16. Generators only.
void encode_mla_fp8_token(const double* kv_row, Fp8ScaleRule rule, uint8_t* token);
/// Encodes every row of `kv` ([n, 576], any float dtype) into a U8 cache [n, 656].
/// Throws std::invalid_argument naming 'kv' on another shape.
Tensor encode_mla_fp8_cache(const Tensor& kv, Fp8ScaleRule rule);

}  // namespace dsa

#include "dsa/plugin/plugin_backend.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "dsa/contract/checks.h"
#include "dsa/contract/errors.h"
#include "dsa/oracle/second_run.h"
#include "dsa/plugin/dlpack_tensor.h"
#include "dsa/reference/fp8_indexer.h"
#include "dsa/reference/paged_indexer.h"
#include "dsa/reference/sparse_mla_fp8.h"

namespace dsa::plugin {

using dsa::oracle::NotSupported;
using dsa::oracle::Op;

uint32_t op_bit(Op op) {
  switch (op) {
    case Op::IndexerScores: return DSA_OP_INDEXER_SCORES;
    case Op::IndexerScoresBackward: return DSA_OP_INDEXER_SCORES_BACKWARD;
    case Op::Topk: return DSA_OP_TOPK_INDICES;
    case Op::SparseMlaFwd: return DSA_OP_SPARSE_MLA_FWD;
    case Op::SparseMlaBwd: return DSA_OP_SPARSE_MLA_BWD;
    case Op::IndexerKlLoss: return DSA_OP_INDEXER_KL_LOSS;
    case Op::Fp8IndexerScores: return DSA_OP_FP8_INDEXER_SCORES;
    case Op::PagedIndexerScores: return DSA_OP_PAGED_INDEXER_SCORES;
    case Op::SparseMlaFp8Fwd: return DSA_OP_SPARSE_MLA_FP8_FWD;
  }
  return 0;
}

namespace {

// ---------------------------------------------------------------------------------------
// Loading and validating the function table
// ---------------------------------------------------------------------------------------

struct Library {
  void* handle = nullptr;
  /// The loader's copy of the plugin's table: the plugin's struct_size bytes, zero beyond
  /// (an ABI 1.0 table lacks the 1.1 fields; they read as 0 / NULL here).
  std::unique_ptr<dsa_backend_v1> copy;
  const dsa_backend_v1* table = nullptr;
  std::string path;
};

/// True when the table carries the ABI 1.1 fields (fp8_caps and the §10 ops).
bool has_abi_1_1(const dsa_backend_v1& t) { return t.struct_size >= DSA_BACKEND_V1_PRE_ROUNDING_SIZE; }

std::optional<DType> dtype_of_code(int32_t code) {
  switch (code) {
    case DSA_DTYPE_F64: return DType::F64;
    case DSA_DTYPE_F32: return DType::F32;
    case DSA_DTYPE_F16: return DType::F16;
    case DSA_DTYPE_BF16: return DType::BF16;
    default: return std::nullopt;
  }
}

std::string dtype_bits_str(uint32_t bits) {
  std::string s;
  for (int32_t code : {DSA_DTYPE_F64, DSA_DTYPE_F32, DSA_DTYPE_F16, DSA_DTYPE_BF16})
    if (bits & DSA_DTYPE_BIT(code)) s += std::string(s.empty() ? "" : "|") + dtype_name(*dtype_of_code(code));
  return s.empty() ? "none" : s;
}

// Size of the table of the first ABI 1 header (before provided_outputs was appended).
constexpr size_t kFirstTableSize = offsetof(dsa_backend_v1, provided_outputs);

// provided_outputs as declared; 0 (every output) for tables of the first ABI 1 header.
uint32_t declared_outputs(const dsa_backend_v1& t) {
  return t.struct_size >= offsetof(dsa_backend_v1, provided_outputs) + sizeof(uint32_t)
             ? t.provided_outputs
             : 0u;
}

// rounding_models as declared; 0 (nothing declared) for tables of an ABI 1.1 or older header,
// which end before the field: it is never read past struct_size.
uint32_t declared_rounding(const dsa_backend_v1& t) {
  return t.struct_size >= offsetof(dsa_backend_v1, rounding_models) + sizeof(uint32_t) ? t.rounding_models
                                                                                       : 0u;
}

// The DSA_OUTPUT_* bits of each op's outputs, with their names (oracle output names).
struct OutputBit {
  uint32_t op_bit, bit;
  const char* name;
};
const std::vector<OutputBit>& output_bits() {
  static const std::vector<OutputBit> bits = {
      {DSA_OP_INDEXER_SCORES, DSA_OUTPUT_SCORES, "scores"},
      {DSA_OP_INDEXER_SCORES_BACKWARD, DSA_OUTPUT_DQ_IDX, "dq_idx"},
      {DSA_OP_INDEXER_SCORES_BACKWARD, DSA_OUTPUT_DK_IDX, "dk_idx"},
      {DSA_OP_INDEXER_SCORES_BACKWARD, DSA_OUTPUT_DW, "dw"},
      {DSA_OP_TOPK_INDICES, DSA_OUTPUT_INDICES, "indices"},
      {DSA_OP_SPARSE_MLA_FWD, DSA_OUTPUT_OUT, "out"},
      {DSA_OP_SPARSE_MLA_FWD, DSA_OUTPUT_LSE, "lse"},
      {DSA_OP_SPARSE_MLA_FWD, DSA_OUTPUT_MAX_LOGITS, "max_logits"},
      {DSA_OP_SPARSE_MLA_BWD, DSA_OUTPUT_DQ, "dq"},
      {DSA_OP_SPARSE_MLA_BWD, DSA_OUTPUT_DKV, "dkv"},
      {DSA_OP_SPARSE_MLA_BWD, DSA_OUTPUT_DSINK, "dsink"},
      {DSA_OP_INDEXER_KL_LOSS, DSA_OUTPUT_LOSS, "loss"},
      {DSA_OP_INDEXER_KL_LOSS, DSA_OUTPUT_D_SCORES, "d_scores"},
      // SPEC §10 ops share the output bits of their §2 / §4 counterparts.
      {DSA_OP_FP8_INDEXER_SCORES, DSA_OUTPUT_SCORES, "scores"},
      {DSA_OP_PAGED_INDEXER_SCORES, DSA_OUTPUT_SCORES, "scores"},
      {DSA_OP_SPARSE_MLA_FP8_FWD, DSA_OUTPUT_OUT, "out"},
      {DSA_OP_SPARSE_MLA_FP8_FWD, DSA_OUTPUT_LSE, "lse"},
      {DSA_OP_SPARSE_MLA_FP8_FWD, DSA_OUTPUT_MAX_LOGITS, "max_logits"}};
  return bits;
}

// Problems of a function table, one line each; empty when the table is consistent.
std::vector<std::string> table_problems(const dsa_backend_v1& t) {
  std::vector<std::string> p;
  if (t.struct_size < kFirstTableSize)
    p.push_back("struct_size " + std::to_string(t.struct_size) + " < " +
                std::to_string(kFirstTableSize) + " (built against an older header?)");
  if (t.name == nullptr || t.name[0] == '\0') {
    p.push_back("name is empty");
  } else {
    for (const char* c = t.name; *c; ++c)
      if (*c <= ' ' || *c > '~') {
        p.push_back("name contains a space or non-printable character");
        break;
      }
  }
  const dsa_capabilities& c = t.caps;
  if (c.ops == 0) p.push_back("caps.ops declares no op");
  const bool v11 = has_abi_1_1(t);
  if (c.ops & ~DSA_OP_ALL_V1_1) p.push_back("caps.ops has unknown bits");
  else if (!v11 && (c.ops & ~DSA_OP_ALL_V1))
    p.push_back("caps.ops declares a SPEC §10 op but struct_size " +
                std::to_string(t.struct_size) + " ends before the §10 fields (an older header)");
  struct OpFn {
    uint32_t bit;
    const char* name;
    bool present;
  };
  const OpFn fns[] = {
      {DSA_OP_INDEXER_SCORES, "indexer_scores", t.indexer_scores != nullptr},
      {DSA_OP_INDEXER_SCORES_BACKWARD, "indexer_scores_backward",
       t.indexer_scores_backward != nullptr},
      {DSA_OP_TOPK_INDICES, "topk_indices", t.topk_indices != nullptr},
      {DSA_OP_SPARSE_MLA_FWD, "sparse_mla_fwd", t.sparse_mla_fwd != nullptr},
      {DSA_OP_SPARSE_MLA_BWD, "sparse_mla_bwd", t.sparse_mla_bwd != nullptr},
      {DSA_OP_INDEXER_KL_LOSS, "indexer_kl_loss", t.indexer_kl_loss != nullptr},
      {DSA_OP_FP8_INDEXER_SCORES, "fp8_indexer_scores", v11 && t.fp8_indexer_scores != nullptr},
      {DSA_OP_PAGED_INDEXER_SCORES, "paged_indexer_scores", v11 && t.paged_indexer_scores != nullptr},
      {DSA_OP_SPARSE_MLA_FP8_FWD, "sparse_mla_fp8_fwd", v11 && t.sparse_mla_fp8_fwd != nullptr}};
  for (const OpFn& f : fns)
    if ((c.ops & f.bit) && !f.present)
      p.push_back(std::string("caps.ops declares ") + f.name + " but its function is NULL");
  const uint32_t float_bits = DSA_DTYPE_BIT(DSA_DTYPE_F64) | DSA_DTYPE_BIT(DSA_DTYPE_F32) |
                              DSA_DTYPE_BIT(DSA_DTYPE_F16) | DSA_DTYPE_BIT(DSA_DTYPE_BF16);
  if ((c.input_dtypes & float_bits) == 0) p.push_back("caps.input_dtypes declares no dtype");
  if (c.input_dtypes & ~float_bits) p.push_back("caps.input_dtypes has unknown bits");
  if (c.devices == 0) p.push_back("caps.devices declares no device");
  if (c.devices & ~(DSA_DEVICE_CPU | DSA_DEVICE_CUDA)) p.push_back("caps.devices has unknown bits");
  if (c.ops & DSA_OP_TOPK_INDICES) {
    if ((c.tie_policies & (DSA_TIE_ANY | DSA_TIE_SMALL | DSA_TIE_LARGE)) == 0)
      p.push_back("topk_indices is declared but caps.tie_policies is empty");
    if ((c.topk_orders & (DSA_TOPK_SORTED | DSA_TOPK_UNSORTED)) == 0)
      p.push_back("topk_indices is declared but caps.topk_orders is empty");
  }
  if (c.tie_policies & ~(DSA_TIE_ANY | DSA_TIE_SMALL | DSA_TIE_LARGE))
    p.push_back("caps.tie_policies has unknown bits");
  if (c.topk_orders & ~(DSA_TOPK_SORTED | DSA_TOPK_UNSORTED))
    p.push_back("caps.topk_orders has unknown bits");
  if (c.deterministic > 1) p.push_back("caps.deterministic is not 0 or 1");
  if (v11) {
    const uint32_t fp8_bits = DSA_FP8_CAP_E4M3FN | DSA_FP8_CAP_E5M2 | DSA_FP8_REDUCED_ACCUMULATION;
    if (t.fp8_caps & ~fp8_bits) p.push_back("fp8_caps has unknown bits");
    if ((c.ops & (DSA_OP_FP8_INDEXER_SCORES | DSA_OP_PAGED_INDEXER_SCORES)) &&
        !(t.fp8_caps & (DSA_FP8_CAP_E4M3FN | DSA_FP8_CAP_E5M2)))
      p.push_back("an FP8 indexer op is declared but fp8_caps declares no FP8 format");
  }
  // Output dtype families: which codes are legal, and whether a declared op uses them.
  auto check_family = [&](const char* field, int32_t code, bool used, bool any_float,
                          bool as_input) {
    if (!used) return;
    bool ok = code == DSA_DTYPE_F32 || code == DSA_DTYPE_F64 ||
              (any_float && dtype_of_code(code).has_value()) ||
              (as_input && code == DSA_DTYPE_AS_INPUT);
    if (!ok)
      p.push_back(std::string("caps.outputs.") + field + " = " + std::to_string(code) +
                  " is not a legal dtype code for it");
  };
  const dsa_output_dtypes& o = c.outputs;
  check_family("index_scores", o.index_scores,
               c.ops & (DSA_OP_INDEXER_SCORES | DSA_OP_FP8_INDEXER_SCORES | DSA_OP_PAGED_INDEXER_SCORES),
               false, false);
  check_family("indexer_grads", o.indexer_grads, c.ops & DSA_OP_INDEXER_SCORES_BACKWARD, true, true);
  bool mla = c.ops & (DSA_OP_SPARSE_MLA_FWD | DSA_OP_SPARSE_MLA_BWD | DSA_OP_SPARSE_MLA_FP8_FWD);
  check_family("mla_out", o.mla_out, mla, true, true);
  check_family("mla_stats", o.mla_stats, mla, false, false);
  check_family("mla_grads", o.mla_grads, c.ops & DSA_OP_SPARSE_MLA_BWD, true, true);
  check_family("kl", o.kl, c.ops & DSA_OP_INDEXER_KL_LOSS, false, true);
  const uint32_t provided = declared_outputs(t);
  if (provided & ~DSA_OUTPUT_ALL_V1) p.push_back("provided_outputs has unknown bits");
  if (provided != 0) {
    for (const OpFn& f : fns) {
      if (!(c.ops & f.bit)) continue;
      bool any = false;
      for (const OutputBit& o : output_bits()) any |= o.op_bit == f.bit && (provided & o.bit);
      if (!any) p.push_back(std::string("provided_outputs declares no output of ") + f.name);
    }
  }
  const uint32_t rounding = declared_rounding(t);
  if (rounding & ~DSA_ROUNDING_ALL_V1_2) p.push_back("rounding_models has unknown bits");
  if (rounding != 0 && !(c.ops & (DSA_OP_SPARSE_MLA_FWD | DSA_OP_SPARSE_MLA_BWD | DSA_OP_SPARSE_MLA_FP8_FWD)))
    p.push_back("rounding_models declares a rounding model but caps.ops declares no sparse MLA op (sparse_mla_fwd, "
                "sparse_mla_bwd, sparse_mla_fp8_fwd): the models describe a 16-bit sparse MLA out");
  return p;
}

Library load_library(const std::string& path_in) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path path = fs::absolute(path_in, ec);
  const std::string where = "plugin '" + path_in + "'";
  if (ec || !fs::exists(path, ec))
    throw PluginLoadError(where + ": no such file");
  if (!fs::is_regular_file(path, ec)) throw PluginLoadError(where + ": not a regular file");
  Library lib;
  lib.path = path.string();
  ::dlerror();
  lib.handle = ::dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (lib.handle == nullptr) {
    const char* e = ::dlerror();
    throw PluginLoadError(where + ": cannot load it as a shared library: " +
                          (e ? e : "unknown dlopen error"));
  }
  ::dlerror();
  void* sym = ::dlsym(lib.handle, DSA_BACKEND_ENTRY_SYMBOL);
  if (sym == nullptr) {
    ::dlclose(lib.handle);
    throw PluginLoadError(where + ": not a dsa plugin (no exported symbol '" +
                          DSA_BACKEND_ENTRY_SYMBOL + "'; see dsa/backend_abi.h)");
  }
  auto get = reinterpret_cast<dsa_backend_get_v1_fn>(sym);
  const dsa_backend_v1* plugin_table = get(DSA_BACKEND_ABI_VERSION);
  lib.table = plugin_table;
  if (lib.table == nullptr) {
    ::dlclose(lib.handle);
    throw PluginLoadError(where + ": " + DSA_BACKEND_ENTRY_SYMBOL + "(" +
                          std::to_string(DSA_BACKEND_ABI_VERSION) +
                          ") returned NULL (the plugin cannot serve this ABI version)");
  }
  if (lib.table->abi_version != DSA_BACKEND_ABI_VERSION) {
    uint32_t v = lib.table->abi_version;
    ::dlclose(lib.handle);
    throw PluginLoadError(where + ": wrong ABI version " + std::to_string(v) +
                          "; this loader speaks version " +
                          std::to_string(DSA_BACKEND_ABI_VERSION) +
                          " (rebuild the plugin against this dsa/backend_abi.h)");
  }
  // Copy only the bytes the plugin's table has (struct_size): an ABI 1.0 plugin's static
  // table is shorter than this header's struct, so the 1.1 fields must not be read from it.
  lib.copy = std::make_unique<dsa_backend_v1>();
  std::memset(lib.copy.get(), 0, sizeof(dsa_backend_v1));
  std::memcpy(lib.copy.get(), plugin_table,
              std::min<size_t>(plugin_table->struct_size, sizeof(dsa_backend_v1)));
  lib.table = lib.copy.get();
  std::vector<std::string> problems = table_problems(*lib.table);
  if (!problems.empty()) {
    std::string msg = where + ": inconsistent function table / capabilities:";
    for (const auto& s : problems) msg += "\n  - " + s;
    ::dlclose(lib.handle);
    throw PluginLoadError(msg);
  }
  return lib;
}

// ---------------------------------------------------------------------------------------
// Guarded host buffers: what the plugin sees as DLTensors
// ---------------------------------------------------------------------------------------

constexpr size_t kGuardBytes = 256;  // also the data alignment (DLPack's 256 bytes)
constexpr unsigned char kGuardByte = 0xCD;
constexpr unsigned char kFloatPoison = 0xFF;  // NaN in every float width
constexpr unsigned char kIntPoison = 0x7F;    // 0x7F7F7F7F: never a legal id

class GuardedBuffer {
 public:
  GuardedBuffer(std::string name, bool is_output, DType dtype, std::vector<int64_t> shape)
      : name_(std::move(name)), is_output_(is_output), dtype_(dtype), shape_(std::move(shape)) {
    nbytes_ = dtype_size(dtype_);
    for (int64_t s : shape_) nbytes_ *= static_cast<size_t>(s);
    size_t total = (kGuardBytes + nbytes_ + kGuardBytes + kGuardBytes - 1) / kGuardBytes * kGuardBytes;
    total_ = total;
    storage_ = static_cast<unsigned char*>(std::aligned_alloc(kGuardBytes, total));
    if (storage_ == nullptr) throw std::bad_alloc();
    std::memset(storage_, kGuardByte, total);
    data_ = storage_ + kGuardBytes;
    if (is_output_)
      std::memset(data_, is_floating(dtype_) ? kFloatPoison : kIntPoison, nbytes_);
    dl_shape_ = shape_;
    dl_ = DLTensor{};
    dl_.data = data_;
    dl_.device = DLDevice{kDLCPU, 0};
    dl_.ndim = static_cast<int>(shape_.size());
    dl_.dtype = to_dl_dtype(dtype_);
    dl_.shape = dl_shape_.empty() ? nullptr : dl_shape_.data();
    dl_.strides = nullptr;
    dl_.byte_offset = 0;
    original_dl_ = dl_;
  }
  ~GuardedBuffer() { std::free(storage_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  static std::unique_ptr<GuardedBuffer> input(std::string name, const Tensor& t) {
    auto b = std::make_unique<GuardedBuffer>(std::move(name), false, t.dtype(), t.shape());
    if (t.nbytes()) std::memcpy(b->data_, t.raw(), t.nbytes());
    b->original_ = &t;
    return b;
  }

  DLTensor* dl() { return &dl_; }

  // Appends one line per broken rule; `completed`: the call reported success, so every
  // output element must have been written.
  void check(std::vector<std::string>& violations, bool completed) const {
    const std::string who = std::string(is_output_ ? "output '" : "input '") + name_ + "'";
    const DLTensor& d = dl_;
    const DLTensor& o = original_dl_;
    if (d.dtype.code != o.dtype.code || d.dtype.bits != o.dtype.bits || d.dtype.lanes != o.dtype.lanes)
      violations.push_back(who + ": dtype changed from " + dl_dtype_name(o.dtype) + " to " +
                           dl_dtype_name(d.dtype) + " (the declared dtype is " +
                           dl_dtype_name(o.dtype) + ")");
    if (d.ndim != o.ndim || d.shape != o.shape || dl_shape_ != shape_) {
      std::vector<int64_t> now;
      if (d.shape != nullptr && d.ndim >= 0 && d.ndim < 16) now.assign(d.shape, d.shape + d.ndim);
      violations.push_back(who + ": shape changed from " + shape_str(shape_) + " to " +
                           shape_str(now) + " (ndim " + std::to_string(d.ndim) + ")");
    }
    if (d.strides != nullptr)
      violations.push_back(who + ": strides set (non-contiguous layout); the ABI requires "
                                 "compact row-major tensors with strides NULL");
    if (d.data != o.data || d.byte_offset != o.byte_offset)
      violations.push_back(who + ": data pointer or byte_offset changed; the plugin must write "
                                 "into the buffer it was given");
    if (d.device.device_type != o.device.device_type || d.device.device_id != o.device.device_id)
      violations.push_back(who + ": device changed");
    // Guard zones.
    size_t front = 0, farthest = 0;
    for (size_t i = 0; i < kGuardBytes; ++i)
      if (storage_[i] != kGuardByte) {
        ++front;
        farthest = std::max(farthest, kGuardBytes - i);
      }
    if (front)
      violations.push_back(who + ": out-of-bounds write before the start of the buffer (" +
                           std::to_string(front) + " guard bytes changed, up to " +
                           std::to_string(farthest) + " bytes before it)");
    size_t back = 0;
    size_t first_back = 0;
    const unsigned char* end = data_ + nbytes_;
    const size_t back_len = total_ - kGuardBytes - nbytes_;
    for (size_t i = 0; i < back_len; ++i)
      if (end[i] != kGuardByte) {
        if (back == 0) first_back = i;
        ++back;
      }
    if (back)
      violations.push_back(who + ": out-of-bounds write past the end of the buffer of " +
                           std::to_string(nbytes_) + " bytes (" + std::to_string(back) +
                           " guard bytes changed, the first at end+" +
                           std::to_string(first_back) + ")");
    if (!is_output_ && original_ != nullptr && nbytes_ &&
        std::memcmp(data_, original_->raw(), nbytes_) != 0) {
      size_t changed = 0;
      for (size_t i = 0; i < nbytes_; ++i)
        changed += data_[i] != reinterpret_cast<const unsigned char*>(original_->raw())[i];
      violations.push_back(who + ": modified by the plugin (" + std::to_string(changed) +
                           " bytes changed); inputs are read-only");
    }
    if (is_output_ && completed) {
      const size_t esize = dtype_size(dtype_);
      const unsigned char poison = is_floating(dtype_) ? kFloatPoison : kIntPoison;
      size_t unwritten = 0;
      for (size_t e = 0; e < nbytes_ / (esize ? esize : 1); ++e) {
        bool all = true;
        for (size_t b = 0; b < esize && all; ++b) all = data_[e * esize + b] == poison;
        unwritten += all;
      }
      if (unwritten)
        violations.push_back(who + ": " + std::to_string(unwritten) + " of " +
                             std::to_string(nbytes_ / esize) +
                             " elements never written (output buffers are not zeroed; the "
                             "plugin must write every element)");
    }
  }

  Tensor to_tensor() const {
    Tensor t(dtype_, shape_);
    if (nbytes_) std::memcpy(t.raw(), data_, nbytes_);
    return t;
  }

 private:
  std::string name_;
  bool is_output_;
  DType dtype_;
  std::vector<int64_t> shape_;
  std::vector<int64_t> dl_shape_;
  size_t nbytes_ = 0;
  size_t total_ = 0;
  unsigned char* storage_ = nullptr;
  unsigned char* data_ = nullptr;
  DLTensor dl_{};
  DLTensor original_dl_{};
  const Tensor* original_ = nullptr;
};

const char* status_name(dsa_status s) {
  switch (s) {
    case DSA_STATUS_OK: return "DSA_STATUS_OK";
    case DSA_STATUS_UNSUPPORTED: return "DSA_STATUS_UNSUPPORTED";
    case DSA_STATUS_INVALID_ARGUMENT: return "DSA_STATUS_INVALID_ARGUMENT";
    case DSA_STATUS_INTERNAL_ERROR: return "DSA_STATUS_INTERNAL_ERROR";
    case DSA_STATUS_UNAVAILABLE: return "DSA_STATUS_UNAVAILABLE";
    default: return "an unknown status";
  }
}

constexpr size_t kErrBytes = 4096;

// True on this thread while PluginBackend::Impl::run makes the decoy call of a determinism
// re-run (see there): Call::in then passes every floating input rolled by one element.
thread_local bool decoy_call = false;

// `t` with its elements rolled by one position (row-major: element i goes to i+1, the last to
// 0): the same shape, dtype and multiset of values, so every per-element rule of an input
// (finite or not, -inf masks, positive scales) still holds, but values sit at other places.
Tensor rolled_by_one(const Tensor& t) {
  Tensor r(t.dtype(), t.shape());
  const size_t n = static_cast<size_t>(t.numel()), bytes = t.nbytes();
  if (n < 2) {
    if (bytes) std::memcpy(r.raw(), t.raw(), bytes);
    return r;
  }
  const size_t e = bytes / n;
  const std::byte* src = t.raw();
  std::byte* dst = r.raw();
  std::memcpy(dst + e, src, bytes - e);
  std::memcpy(dst, src + bytes - e, e);
  return r;
}

// One call into the plugin: owns the buffers, checks the rules afterwards.
class Call {
 public:
  // `provided`: DSA_OUTPUT_* bits of the outputs the plugin writes (0: every output).
  Call(std::string context, uint32_t provided) : provided_bits_(provided), context_(std::move(context)) {
    err_.assign(kErrBytes, '\0');
  }

  const DLTensor* in(const char* name, const Tensor& t) {
    if (decoy_call && is_floating(t.dtype())) {  // integer inputs (ids, windows) stay as given
      decoys_.push_back(std::make_unique<Tensor>(rolled_by_one(t)));
      inputs_.push_back(GuardedBuffer::input(name, *decoys_.back()));
      return inputs_.back()->dl();
    }
    inputs_.push_back(GuardedBuffer::input(name, t));
    return inputs_.back()->dl();
  }
  const DLTensor* in_opt(const char* name, const std::optional<Tensor>& t) {
    return t ? in(name, *t) : nullptr;
  }
  // An output the plugin does not provide (provided_outputs) is passed as NULL and comes
  // back as an undefined Tensor in its position.
  DLTensor* out(const char* name, DType dtype, std::vector<int64_t> shape) {
    if (!provided(name)) {
      outputs_.push_back(nullptr);
      return nullptr;
    }
    outputs_.push_back(std::make_unique<GuardedBuffer>(name, true, dtype, std::move(shape)));
    return outputs_.back()->dl();
  }

  char* err() { return err_.data(); }
  size_t err_size() const { return err_.size() - 1; }  // last byte stays NUL

  // Checks every rule for status `st`; throws the matching exception, else returns outputs.
  std::vector<Tensor> finish(dsa_status st) {
    std::string msg(err_.data(), ::strnlen(err_.data(), err_.size()));
    std::vector<std::string> violations;
    for (const auto& b : inputs_) b->check(violations, st == DSA_STATUS_OK);
    for (const auto& b : outputs_)
      if (b) b->check(violations, st == DSA_STATUS_OK);
    if (!violations.empty()) {
      std::string m = context_ + " broke the ABI's memory rules (dsa/backend_abi.h)";
      if (st != DSA_STATUS_OK) m += " and returned " + std::string(status_name(st));
      m += ":";
      for (const auto& v : violations) m += "\n  - " + v;
      throw ContractViolation(m);
    }
    if (st == DSA_STATUS_UNSUPPORTED)
      throw NotSupported(context_ + ": plugin returned DSA_STATUS_UNSUPPORTED" +
                         (msg.empty() ? std::string() : ": " + msg));
    if (st != DSA_STATUS_OK)
      throw PluginCallError(context_ + ": plugin returned " + status_name(st) + " (" +
                                std::to_string(st) + "): " +
                                (msg.empty() ? std::string("(no message)") : msg),
                            st);
    std::vector<Tensor> res;
    for (const auto& b : outputs_) res.push_back(b ? b->to_tensor() : Tensor());
    return res;
  }

 private:
  bool provided(const char* name) const {
    if (provided_bits_ == 0) return true;
    for (const OutputBit& o : output_bits())
      if (std::strcmp(o.name, name) == 0) return (provided_bits_ & o.bit) != 0;
    return true;
  }

  uint32_t provided_bits_ = 0;
  std::string context_;
  std::vector<char> err_;
  std::vector<std::unique_ptr<Tensor>> decoys_;  // the decoy call's inputs (stable addresses)
  std::vector<std::unique_ptr<GuardedBuffer>> inputs_;
  std::vector<std::unique_ptr<GuardedBuffer>> outputs_;
};

Tensor windows_tensor(const std::vector<int64_t>& v) {
  Tensor t(DType::I64, {static_cast<int64_t>(v.size())});
  if (!v.empty()) std::memcpy(t.raw(), v.data(), t.nbytes());
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// PluginBackend
// ---------------------------------------------------------------------------------------

struct PluginBackend::Impl {
  Library lib;
  PluginInfo info;
  PluginOptions options;
  mutable std::optional<std::string> unavailable;

  std::string context(const char* op) const {
    return "plugin '" + info.name + "' (" + info.path + "): " + op;
  }

  // Runs fn directly or in a child, per options. Under the oracle's determinism re-run
  // (oracle::SecondRunScope, SPEC §3.5) fn runs twice in that one process: first as a decoy
  // call (every floating input rolled by one element: same shapes and dtypes, other values at
  // each place; its result and any error are discarded), then as given. A kernel whose result
  // depends on an earlier call in its process (a CUDA graph captured on the first call and
  // replayed with a stale input buffer, a plan or output cached by shape) returns the decoy's
  // result, or another one, on the second call, and the re-run's bytes differ from the first
  // run's (made alone in a fresh child): the determinism check fails, saying so. Every op
  // goes through here (the §2-§7 ops and the §10 FP8/paged ops). A crash or hang of the decoy
  // call is the re-run's failure (one child).
  std::vector<Tensor> run(const char* op, const std::function<std::vector<Tensor>()>& fn) const {
    const bool second_run = dsa::oracle::SecondRunScope::active();
    const std::function<std::vector<Tensor>()> twice = [&fn]() {
      decoy_call = true;
      try {
        fn();
      } catch (...) {  // the decoy's outcome is not judged
      }
      decoy_call = false;
      return fn();
    };
    if (second_run)
      dsa::oracle::SecondRunScope::note(
          std::string("the plugin route made this run the second call in one ") +
          (options.isolate ? "child process" : "process") +
          ", after a call on the same shapes with every floating input rolled by one element: a kernel "
          "whose result differs there carries state between calls, e.g. a CUDA graph or a cache "
          "replayed for a later call of the same shape");
    if (!options.isolate) return second_run ? twice() : fn();
    IsolatedResult r = run_isolated(second_run ? twice : fn, options.timeout);
    rethrow_in_parent(r, context(op));
    return std::move(r.outputs);
  }

  void require_op(uint32_t bit, const char* op) const {
    if (!(info.caps.ops & bit)) throw NotSupported(context(op) + ": op not declared in caps.ops");
  }

  // "Data" inputs (q_idx, k_idx, q, kv): a declared input dtype.
  void require_data_dtype(const char* op, const char* arg, const Tensor& t) const {
    check_arg(is_floating(t.dtype()), op, arg, dtype_name(t.dtype()), "a floating dtype");
    int32_t code = t.dtype() == DType::F64   ? DSA_DTYPE_F64
                   : t.dtype() == DType::F32 ? DSA_DTYPE_F32
                   : t.dtype() == DType::F16 ? DSA_DTYPE_F16
                                             : DSA_DTYPE_BF16;
    if (!(info.caps.input_dtypes & DSA_DTYPE_BIT(code)))
      throw NotSupported(context(op) + ": input '" + arg + "' has dtype " +
                         dtype_name(t.dtype()) + ", not among the declared input dtypes " +
                         dtype_bits_str(info.caps.input_dtypes));
  }
  // fp32-by-contract inputs (w, attn_sink, d_scores, scores): F32, or F64 when declared.
  void require_aux_dtype(const char* op, const char* arg, const Tensor& t) const {
    check_arg(t.dtype() == DType::F32 || t.dtype() == DType::F64, op, arg,
              dtype_name(t.dtype()), "F32 or F64");
    if (t.dtype() == DType::F64 && !(info.caps.input_dtypes & DSA_DTYPE_BIT(DSA_DTYPE_F64)))
      throw NotSupported(context(op) + ": input '" + arg +
                         "' is F64 but the plugin does not declare F64 inputs");
  }
  // Output dtype of a family code; AS_INPUT resolves to `like`.
  static DType out_dtype(int32_t code, DType like) {
    if (code == DSA_DTYPE_AS_INPUT) return like;
    return *dtype_of_code(code);
  }
};

PluginBackend::PluginBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PluginBackend::~PluginBackend() {
  if (impl_ && impl_->lib.handle) ::dlclose(impl_->lib.handle);  // RTLD_NODELETE: stays mapped
}

std::string PluginBackend::name() const { return "plugin:" + impl_->info.name; }
bool PluginBackend::deterministic() const { return impl_->info.caps.deterministic == 1; }
bool PluginBackend::supports(Op op) const { return (impl_->info.caps.ops & op_bit(op)) != 0; }
const PluginInfo& PluginBackend::info() const { return impl_->info; }
std::optional<std::set<std::string>> PluginBackend::provided_outputs() const {
  return provided_output_names(impl_->info);
}
dsa::oracle::RoundingModel PluginBackend::rounding_model() const { return rounding_model_of(impl_->info); }

dsa::oracle::RoundingModel rounding_model_of(const PluginInfo& info) {
  dsa::oracle::RoundingModel m;
  m.sink_after_rounding = (info.rounding_models & DSA_ROUNDING_SINK_AFTER_ROUNDING) != 0;
  m.normalized_p = (info.rounding_models & DSA_ROUNDING_NORMALIZED_P) != 0;
  return m;
}
const PluginOptions& PluginBackend::options() const { return impl_->options; }

std::string PluginBackend::unavailable_reason() const {
  if (impl_->unavailable) return *impl_->unavailable;
  auto fn = impl_->lib.table->is_available;
  if (fn == nullptr) return *(impl_->unavailable = std::string());
  std::string reason;
  try {
    impl_->run("is_available", [fn]() -> std::vector<Tensor> {
      std::vector<char> err(kErrBytes, '\0');
      dsa_status st = fn(err.data(), err.size() - 1);
      if (st != DSA_STATUS_OK)
        throw std::runtime_error(std::string(status_name(st)) + ": " +
                                 std::string(err.data(), ::strnlen(err.data(), err.size())));
      return {};
    });
  } catch (const std::exception& e) {
    reason = std::string("is_available: ") + e.what();
  }
  impl_->unavailable = reason;
  return reason;
}

// Shapes of the indexer inputs (SPEC §2): q_idx [s_q,H_I,d_I], k_idx [s_kv,d_I], w [s_q,H_I],
// windows of s_q rows over s_kv keys. Returns {s_q, s_kv}; throws std::invalid_argument.
std::pair<int64_t, int64_t> check_indexer_inputs(const char* op, const Tensor& q_idx,
                                                 const Tensor& k_idx, const Tensor& w,
                                                 const KeyWindows& windows) {
  check_rank(op, "q_idx", q_idx, 3);
  check_rank(op, "k_idx", k_idx, 2);
  const int64_t s_q = q_idx.size(0), h = q_idx.size(1), d = q_idx.size(2), s_kv = k_idx.size(0);
  check_shape(op, "k_idx", k_idx, {s_kv, d});
  check_shape(op, "w", w, {s_q, h});
  check_arg(windows.s_q() == s_q && windows.s_kv == s_kv, op, "windows",
            str(windows.s_q()) + " rows over " + str(windows.s_kv) + " keys",
            str(s_q) + " rows over " + str(s_kv) + " keys");
  return {s_q, s_kv};
}

Tensor PluginBackend::indexer_scores(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                     const KeyWindows& windows) {
  const char* op = "indexer_scores";
  Impl& I = *impl_;
  I.require_op(DSA_OP_INDEXER_SCORES, op);
  const auto dims = check_indexer_inputs(op, q_idx, k_idx, w, windows);
  const int64_t s_q = dims.first, s_kv = dims.second;
  I.require_data_dtype(op, "q_idx", q_idx);
  I.require_data_dtype(op, "k_idx", k_idx);
  I.require_aux_dtype(op, "w", w);
  const Tensor ks = windows_tensor(windows.ks), ke = windows_tensor(windows.ke);
  const DType odt = Impl::out_dtype(I.info.caps.outputs.index_scores, DType::F32);
  auto fn = I.lib.table->indexer_scores;
  auto res = I.run(op, [&]() {
    Call c(I.context(op), I.info.provided_outputs);
    dsa_indexer_scores_args a{};
    a.q_idx = c.in("q_idx", q_idx);
    a.k_idx = c.in("k_idx", k_idx);
    a.w = c.in("w", w);
    a.ks = c.in("ks", ks);
    a.ke = c.in("ke", ke);
    a.scores = c.out("scores", odt, {s_q, s_kv});
    return c.finish(fn(&a, c.err(), c.err_size()));
  });
  return std::move(res.at(0));
}

IndexerGrads PluginBackend::indexer_scores_backward(const Tensor& q_idx, const Tensor& k_idx,
                                                    const Tensor& w, const KeyWindows& windows,
                                                    const Tensor& d_scores) {
  const char* op = "indexer_scores_backward";
  Impl& I = *impl_;
  I.require_op(DSA_OP_INDEXER_SCORES_BACKWARD, op);
  const auto dims = check_indexer_inputs(op, q_idx, k_idx, w, windows);
  const int64_t s_q = dims.first, s_kv = dims.second, h = q_idx.size(1), d = q_idx.size(2);
  check_shape(op, "d_scores", d_scores, {s_q, s_kv});
  I.require_data_dtype(op, "q_idx", q_idx);
  I.require_data_dtype(op, "k_idx", k_idx);
  I.require_aux_dtype(op, "w", w);
  I.require_aux_dtype(op, "d_scores", d_scores);
  const Tensor ks = windows_tensor(windows.ks), ke = windows_tensor(windows.ke);
  const int32_t code = I.info.caps.outputs.indexer_grads;
  auto fn = I.lib.table->indexer_scores_backward;
  auto res = I.run(op, [&]() {
    Call c(I.context(op), I.info.provided_outputs);
    dsa_indexer_scores_backward_args a{};
    a.q_idx = c.in("q_idx", q_idx);
    a.k_idx = c.in("k_idx", k_idx);
    a.w = c.in("w", w);
    a.ks = c.in("ks", ks);
    a.ke = c.in("ke", ke);
    a.d_scores = c.in("d_scores", d_scores);
    a.dq_idx = c.out("dq_idx", Impl::out_dtype(code, q_idx.dtype()), {s_q, h, d});
    a.dk_idx = c.out("dk_idx", Impl::out_dtype(code, k_idx.dtype()), {s_kv, d});
    a.dw = c.out("dw", Impl::out_dtype(code, w.dtype()), {s_q, h});
    return c.finish(fn(&a, c.err(), c.err_size()));
  });
  return IndexerGrads{std::move(res.at(0)), std::move(res.at(1)), std::move(res.at(2))};
}

Tensor PluginBackend::select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                                  const std::optional<KeyWindows>& windows) {
  const char* op = "topk_indices";
  Impl& I = *impl_;
  I.require_op(DSA_OP_TOPK_INDICES, op);
  check_rank(op, "scores", scores, 2);
  check_arg(k >= 0, op, "k", str(k), ">= 0");
  const int64_t s_q = scores.size(0), s_kv = scores.size(1);
  if (windows)
    check_arg(windows->s_q() == s_q && windows->s_kv == s_kv, op, "windows",
              str(windows->s_q()) + " rows over " + str(windows->s_kv) + " keys",
              str(s_q) + " rows over " + str(s_kv) + " keys");
  I.require_aux_dtype(op, "scores", scores);
  const uint32_t ties = I.info.caps.tie_policies, orders = I.info.caps.topk_orders;
  int32_t tie = DSA_TIE_BREAK_ANY;
  switch (policy.tie_break) {
    case TieBreak::Small:
      if (!(ties & DSA_TIE_SMALL)) throw NotSupported(I.context(op) + ": tie_break small not declared");
      tie = DSA_TIE_BREAK_SMALL;
      break;
    case TieBreak::Large:
      if (!(ties & DSA_TIE_LARGE)) throw NotSupported(I.context(op) + ": tie_break large not declared");
      tie = DSA_TIE_BREAK_LARGE;
      break;
    case TieBreak::Any:  // small or large are valid "any" fills
      tie = (ties & DSA_TIE_ANY) ? DSA_TIE_BREAK_ANY
            : (ties & DSA_TIE_SMALL) ? DSA_TIE_BREAK_SMALL
                                     : DSA_TIE_BREAK_LARGE;
      break;
  }
  int32_t sorted = policy.sorted ? 1 : 0;
  if (policy.sorted && !(orders & DSA_TOPK_SORTED))
    throw NotSupported(I.context(op) + ": sorted output not declared");
  if (!policy.sorted && !(orders & DSA_TOPK_UNSORTED)) sorted = 1;  // sorted is a valid "any order"
  std::optional<Tensor> ks, ke;
  if (windows) {
    ks = windows_tensor(windows->ks);
    ke = windows_tensor(windows->ke);
  }
  auto fn = I.lib.table->topk_indices;
  auto res = I.run(op, [&]() {
    Call c(I.context(op), I.info.provided_outputs);
    dsa_topk_args a{};
    a.scores = c.in("scores", scores);
    a.k = k;
    a.tie_break = tie;
    a.sorted = sorted;
    a.ks = c.in_opt("ks", ks);
    a.ke = c.in_opt("ke", ke);
    a.indices = c.out("indices", DType::I32, {s_q, k});
    return c.finish(fn(&a, c.err(), c.err_size()));
  });
  return std::move(res.at(0));
}

namespace {

struct MlaShapes {
  int64_t s_q, h_q, d_qk, s_kv, k;
  Tensor indices;  // [s_q, k]
};

MlaShapes check_mla(const char* op, const SparseMlaInputs& in) {
  check_rank(op, "q", in.q, 3);
  check_rank(op, "kv", in.kv, 2);
  MlaShapes s{in.q.size(0), in.q.size(1), in.q.size(2), in.kv.size(0), 0, {}};
  check_shape(op, "kv", in.kv, {s.s_kv, s.d_qk});
  check_arg(in.indices.dtype() == DType::I32, op, "indices", dtype_name(in.indices.dtype()), "I32");
  const bool three = in.indices.dim() == 3 && in.indices.size(1) == 1;
  check_arg(in.indices.dim() == 2 || three, op, "indices", shape_str(in.indices.shape()),
            "[s_q, k] or [s_q, 1, k]");
  s.k = in.indices.size(-1);
  check_arg(in.indices.size(0) == s.s_q, op, "indices", shape_str(in.indices.shape()),
            "s_q = " + str(s.s_q) + " rows");
  s.indices = three ? in.indices.reshaped({s.s_q, s.k}) : in.indices;
  if (in.topk_length) {
    check_shape(op, "topk_length", *in.topk_length, {s.s_q});
    check_arg(in.topk_length->dtype() == DType::I32, op, "topk_length",
              dtype_name(in.topk_length->dtype()), "I32");
  }
  if (in.attn_sink) check_shape(op, "attn_sink", *in.attn_sink, {s.h_q});
  check_arg(std::isfinite(in.sm_scale), op, "sm_scale", str(in.sm_scale), "a finite value");
  check_arg(in.d_v > 0 && in.d_v <= s.d_qk, op, "d_v", str(in.d_v),
            "0 < d_v <= d_qk = " + str(s.d_qk));
  return s;
}

// Passes the sparse MLA inputs shared by the forward and backward argument records.
template <class Args>
void pass_mla_inputs(Call& c, Args& a, const SparseMlaInputs& in, const MlaShapes& s) {
  a.q = c.in("q", in.q);
  a.kv = c.in("kv", in.kv);
  a.indices = c.in("indices", s.indices);
  a.topk_length = c.in_opt("topk_length", in.topk_length);
  a.attn_sink = c.in_opt("attn_sink", in.attn_sink);
  a.sm_scale = in.sm_scale;
  a.d_v = in.d_v;
}

// One plugin sparse_mla_fwd call (SPEC §4): returns out [s_q,h_q,d_v] in out_dt and lse,
// max_logits [s_q,h_q] in stat_dt, or throws the call's finding.
std::vector<Tensor> run_sparse_mla_fwd(Call& c, decltype(dsa_backend_v1::sparse_mla_fwd) fn,
                                       const SparseMlaInputs& in, const MlaShapes& s,
                                       DType out_dt, DType stat_dt) {
  dsa_sparse_mla_fwd_args a{};
  pass_mla_inputs(c, a, in, s);
  a.out = c.out("out", out_dt, {s.s_q, s.h_q, in.d_v});
  a.lse = c.out("lse", stat_dt, {s.s_q, s.h_q});
  a.max_logits = c.out("max_logits", stat_dt, {s.s_q, s.h_q});
  return c.finish(fn(&a, c.err(), c.err_size()));
}


}  // namespace

SparseMlaForward PluginBackend::sparse_mla_forward(const SparseMlaInputs& in) {
  const char* op = "sparse_mla_fwd";
  Impl& I = *impl_;
  I.require_op(DSA_OP_SPARSE_MLA_FWD, op);
  const MlaShapes s = check_mla(op, in);
  I.require_data_dtype(op, "q", in.q);
  I.require_data_dtype(op, "kv", in.kv);
  if (in.kv.dtype() != in.q.dtype())
    throw NotSupported(I.context(op) + ": kv dtype differs from q dtype (the ABI passes one dtype)");
  if (in.attn_sink) I.require_aux_dtype(op, "attn_sink", *in.attn_sink);
  const DType out_dt = Impl::out_dtype(I.info.caps.outputs.mla_out, in.q.dtype());
  const DType stat_dt = Impl::out_dtype(I.info.caps.outputs.mla_stats, DType::F32);
  auto fn = I.lib.table->sparse_mla_fwd;
  auto res = I.run(op, [&]() {
    Call c(I.context(op), I.info.provided_outputs);
    return run_sparse_mla_fwd(c, fn, in, s, out_dt, stat_dt);
  });
  return SparseMlaForward{std::move(res.at(0)), std::move(res.at(1)), std::move(res.at(2))};
}

SparseMlaGrads PluginBackend::sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) {
  const char* op = "sparse_mla_bwd";
  Impl& I = *impl_;
  I.require_op(DSA_OP_SPARSE_MLA_BWD, op);
  const MlaShapes s = check_mla(op, in);
  check_shape(op, "dout", dout, {s.s_q, s.h_q, in.d_v});
  I.require_data_dtype(op, "q", in.q);
  I.require_data_dtype(op, "kv", in.kv);
  if (in.kv.dtype() != in.q.dtype())
    throw NotSupported(I.context(op) + ": kv dtype differs from q dtype (the ABI passes one dtype)");
  if (dout.dtype() != DType::F32) I.require_data_dtype(op, "dout", dout);
  if (in.attn_sink) I.require_aux_dtype(op, "attn_sink", *in.attn_sink);
  const dsa_output_dtypes& od = I.info.caps.outputs;
  const bool with_fwd = (I.info.caps.ops & DSA_OP_SPARSE_MLA_FWD) != 0;
  const DType out_dt = Impl::out_dtype(od.mla_out, in.q.dtype());
  const DType stat_dt = Impl::out_dtype(od.mla_stats, DType::F32);
  auto fwd = I.lib.table->sparse_mla_fwd;
  auto bwd = I.lib.table->sparse_mla_bwd;
  auto res = I.run(op, [&]() {
    std::optional<Tensor> out, lse;
    if (with_fwd) {  // the plugin's own forward, judged as part of this call
      Call c(I.context("sparse_mla_fwd (run for sparse_mla_bwd)"), I.info.provided_outputs);
      auto r = run_sparse_mla_fwd(c, fwd, in, s, out_dt, stat_dt);
      // An output the plugin does not provide is passed to its backward as NULL.
      if (r.at(0).defined()) out = std::move(r.at(0));
      if (r.at(1).defined()) lse = std::move(r.at(1));
    }
    Call c(I.context(op), I.info.provided_outputs);
    dsa_sparse_mla_bwd_args a{};
    pass_mla_inputs(c, a, in, s);
    a.out = c.in_opt("out", out);
    a.lse = c.in_opt("lse", lse);
    a.dout = c.in("dout", dout);
    a.dq = c.out("dq", Impl::out_dtype(od.mla_grads, in.q.dtype()), {s.s_q, s.h_q, s.d_qk});
    a.dkv = c.out("dkv", Impl::out_dtype(od.mla_grads, in.kv.dtype()), {s.s_kv, s.d_qk});
    if (in.attn_sink)
      a.dsink = c.out("dsink", Impl::out_dtype(od.mla_grads, in.attn_sink->dtype()), {s.h_q});
    return c.finish(bwd(&a, c.err(), c.err_size()));
  });
  SparseMlaGrads g{std::move(res.at(0)), std::move(res.at(1)), std::nullopt};
  if (res.size() > 2) g.dsink = std::move(res[2]);
  return g;
}

IndexerKlResult PluginBackend::indexer_kl_loss(const IndexerKlInputs& in) {
  const char* op = "indexer_kl_loss";
  Impl& I = *impl_;
  I.require_op(DSA_OP_INDEXER_KL_LOSS, op);
  check_rank(op, "scores", in.scores, 2);
  check_rank(op, "q", in.q, 3);
  check_rank(op, "kv", in.kv, 2);
  const int64_t s_q = in.scores.size(0), s_kv = in.scores.size(1);
  check_shape(op, "q", in.q, {s_q, -1, -1});
  check_shape(op, "kv", in.kv, {s_kv, in.q.size(2)});
  check_arg(in.windows.s_q() == s_q && in.windows.s_kv == s_kv, op, "windows",
            str(in.windows.s_q()) + " rows over " + str(in.windows.s_kv) + " keys",
            str(s_q) + " rows over " + str(s_kv) + " keys");
  check_arg(std::isfinite(in.sm_scale), op, "sm_scale", str(in.sm_scale), "a finite value");
  std::optional<Tensor> indices;
  if (in.mode == KlMode::Sparse) {
    check_arg(in.indices.has_value(), op, "indices", "none", "[s_q, k] I32 in sparse mode");
    check_arg(in.indices->dtype() == DType::I32, op, "indices", dtype_name(in.indices->dtype()), "I32");
    check_arg(in.indices->dim() == 2 && in.indices->size(0) == s_q, op, "indices",
              shape_str(in.indices->shape()), "[s_q, k]");
    indices = in.indices;
  }
  I.require_aux_dtype(op, "scores", in.scores);
  I.require_data_dtype(op, "q", in.q);
  I.require_data_dtype(op, "kv", in.kv);
  const Tensor ks = windows_tensor(in.windows.ks), ke = windows_tensor(in.windows.ke);
  const DType odt = Impl::out_dtype(I.info.caps.outputs.kl, in.scores.dtype());
  auto fn = I.lib.table->indexer_kl_loss;
  auto res = I.run(op, [&]() {
    Call c(I.context(op), I.info.provided_outputs);
    dsa_indexer_kl_loss_args a{};
    a.scores = c.in("scores", in.scores);
    a.q = c.in("q", in.q);
    a.kv = c.in("kv", in.kv);
    a.sm_scale = in.sm_scale;
    a.ks = c.in("ks", ks);
    a.ke = c.in("ke", ke);
    a.mode = in.mode == KlMode::Sparse ? DSA_KL_SPARSE : DSA_KL_DENSE;
    a.indices = c.in_opt("indices", indices);
    a.coeff = in.coeff;
    a.loss = c.out("loss", odt, {1});
    a.d_scores = c.out("d_scores", odt, {s_q, s_kv});
    return c.finish(fn(&a, c.err(), c.err_size()));
  });
  return IndexerKlResult{std::move(res.at(0)), std::move(res.at(1))};
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

std::optional<std::set<std::string>> provided_output_names(const PluginInfo& info) {
  if (info.provided_outputs == 0) return std::nullopt;
  std::set<std::string> names;
  for (const OutputBit& o : output_bits())
    if (info.provided_outputs & o.bit) names.insert(o.name);
  return names;
}

// ---- SPEC §10 inference ops (ABI 1.1) ----------------------------------------------------

namespace {
int32_t fp8_format_code(const PluginBackend::Impl& I, const char* op, Fp8Format f) {
  const uint32_t bit = f == Fp8Format::E4M3FN ? DSA_FP8_CAP_E4M3FN : DSA_FP8_CAP_E5M2;
  if (!(I.info.fp8_caps & bit))
    throw NotSupported(I.context(op) + ": FP8 format " + to_string(f) + " not declared in fp8_caps");
  return f == Fp8Format::E4M3FN ? DSA_FP8_FORMAT_E4M3FN : DSA_FP8_FORMAT_E5M2;
}
}  // namespace

bool PluginBackend::fp8_reduced_accumulation() const {
  return (impl_->info.fp8_caps & DSA_FP8_REDUCED_ACCUMULATION) != 0;
}

dsa::oracle::CallFailure PluginBackend::classify_failure(const std::exception& e) const {
  using dsa::oracle::CallFailure;
  if (dynamic_cast<const ContractViolation*>(&e)) return CallFailure::MemoryViolation;
  if (const auto* f = dynamic_cast<const IsolatedFailure*>(&e))
    return f->timed_out() ? CallFailure::TimedOut : CallFailure::Crashed;
  if (const auto* c = dynamic_cast<const PluginCallError*>(&e))
    return c->status() == DSA_STATUS_INVALID_ARGUMENT ? CallFailure::ArgumentError : CallFailure::OtherError;
  if (dynamic_cast<const std::invalid_argument*>(&e)) return CallFailure::RejectedByRoute;
  return CallFailure::OtherError;
}

Tensor PluginBackend::fp8_indexer_scores(const Fp8IndexerInputs& in) {
  const char* op = "fp8_indexer_scores";
  Impl& I = *impl_;
  I.require_op(DSA_OP_FP8_INDEXER_SCORES, op);
  // Structure only (shapes, dtypes, windows): the reference validates a copy whose windows
  // are empty (so no scale is read); the scale values go to the plugin as given, which must
  // reject a read scale that is not positive finite itself (SPEC §10).
  check_arg(in.windows.ks.size() == in.windows.ke.size(), op, "windows",
            str(in.windows.ks.size()) + " starts and " + str(in.windows.ke.size()) + " ends",
            "as many starts as ends");
  Fp8IndexerInputs structure = in;
  structure.windows.ke = structure.windows.ks;
  reference::fp8_indexer_scores(structure);
  const int32_t fmt = fp8_format_code(I, op, in.format);
  I.require_aux_dtype(op, "w", in.w);
  const int64_t s_q = in.q_idx.size(0), s_kv = in.k_idx.size(0);
  const Tensor ks = windows_tensor(in.windows.ks), ke = windows_tensor(in.windows.ke);
  const DType odt = Impl::out_dtype(I.info.caps.outputs.index_scores, DType::F32);
  auto fn = I.lib.table->fp8_indexer_scores;
  auto res = I.run(op, [&]() {
    Call c(I.context(op), I.info.provided_outputs);
    dsa_fp8_indexer_scores_args a{};
    a.q_idx = c.in("q_idx", in.q_idx);
    a.k_idx = c.in("k_idx", in.k_idx);
    a.k_scale = c.in("k_scale", in.k_scale);
    a.w = c.in("w", in.w);
    a.ks = c.in("ks", ks);
    a.ke = c.in("ke", ke);
    a.fp8_format = fmt;
    a.scores = c.out("scores", odt, {s_q, s_kv});
    return c.finish(fn(&a, c.err(), c.err_size()));
  });
  return std::move(res.at(0));
}

Tensor PluginBackend::paged_indexer_scores(const PagedIndexerInputs& in) {
  const char* op = "paged_indexer_scores";
  Impl& I = *impl_;
  I.require_op(DSA_OP_PAGED_INDEXER_SCORES, op);
  // Structure (shapes, dtypes): the reference validates a copy with empty contexts, so no
  // table entry or scale is read. The scale values go to the plugin as given, which must
  // reject invalid read scales itself. Table entries a context reads and context lengths
  // address memory: in this process the loader rejects bad ones itself; isolated they go to
  // the plugin as given (a read outside the cache can only crash the child), which must
  // reject them with DSA_STATUS_INVALID_ARGUMENT (SPEC §10; paged.bad_table_rejected).
  PagedIndexerInputs shape_only = in;
  if (in.context_lens.dtype() == DType::I32 && in.context_lens.dim() == 1) {
    shape_only.context_lens = Tensor(DType::I32, in.context_lens.shape());
    for (int64_t b = 0; b < shape_only.context_lens.numel(); ++b) shape_only.context_lens.data<int32_t>()[b] = 0;
  }
  if (in.k_scale_cache.dtype() == DType::F32) {
    shape_only.k_scale_cache = Tensor(DType::F32, in.k_scale_cache.shape());
    for (int64_t i = 0; i < shape_only.k_scale_cache.numel(); ++i)
      shape_only.k_scale_cache.data<float>()[i] = 1.0f;
  }
  const reference::PagedGather g = reference::gather_paged_indexer(shape_only);
  int64_t longest = 0;
  for (int64_t b = 0; b < in.context_lens.numel(); ++b)
    longest = std::max<int64_t>(longest, in.context_lens.data<int32_t>()[b]);
  check_arg(in.max_context < 0 || in.max_context >= longest, op, "max_context", str(in.max_context),
            ">= every context length (" + str(longest) + ")");
  if (!I.options.isolate) {
    PagedIndexerInputs table_only = shape_only;
    table_only.context_lens = in.context_lens;
    reference::gather_paged_indexer(table_only);  // std::invalid_argument naming the entry
  }
  const int32_t fmt = fp8_format_code(I, op, in.format);
  I.require_aux_dtype(op, "w", in.w);
  const int64_t rows = g.windows.s_q(), width = in.max_context < 0 ? longest : in.max_context;
  const DType odt = Impl::out_dtype(I.info.caps.outputs.index_scores, DType::F32);
  auto fn = I.lib.table->paged_indexer_scores;
  auto res = I.run(op, [&]() {
    Call c(I.context(op), I.info.provided_outputs);
    dsa_paged_indexer_scores_args a{};
    a.q_idx = c.in("q_idx", in.q_idx);
    a.k_cache = c.in("k_cache", in.k_cache);
    a.k_scale_cache = c.in("k_scale_cache", in.k_scale_cache);
    a.w = c.in("w", in.w);
    a.block_table = c.in("block_table", in.block_table);
    a.context_lens = c.in("context_lens", in.context_lens);
    a.fp8_format = fmt;
    a.scores = c.out("scores", odt, {rows, width});
    return c.finish(fn(&a, c.err(), c.err_size()));
  });
  return std::move(res.at(0));
}

SparseMlaForward PluginBackend::sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) {
  const char* op = "sparse_mla_fp8_fwd";
  Impl& I = *impl_;
  I.require_op(DSA_OP_SPARSE_MLA_FP8_FWD, op);
  // Structure only (shapes, dtypes); the tokens' scale values go to the plugin as given.
  check_rank(op, "q", in.q, 3);
  check_shape(op, "q", in.q, {-1, -1, kMlaFp8Dqk});
  check_arg(in.indices.dtype() == DType::I32, op, "indices", dtype_name(in.indices.dtype()), "I32");
  check_arg((in.indices.dim() == 2 || (in.indices.dim() == 3 && in.indices.size(1) == 1)) &&
                in.indices.size(0) == in.q.size(0),
            op, "indices", shape_str(in.indices.shape()), "[s_q, k] or [s_q, 1, k]");
  if (in.topk_length) {
    check_shape(op, "topk_length", *in.topk_length, {in.q.size(0)});
    check_arg(in.topk_length->dtype() == DType::I32, op, "topk_length",
              dtype_name(in.topk_length->dtype()), "I32");
  }
  if (in.attn_sink) check_shape(op, "attn_sink", *in.attn_sink, {in.q.size(1)});
  check_arg(std::isfinite(in.sm_scale), op, "sm_scale", str(in.sm_scale), "a finite value");
  I.require_data_dtype(op, "q", in.q);
  if (in.attn_sink) I.require_aux_dtype(op, "attn_sink", *in.attn_sink);
  const int64_t s_q = in.q.size(0), h_q = in.q.size(1), k = in.indices.size(-1);
  const int64_t tokens = reference::mla_fp8_cache_tokens(op, in.kv_cache);
  const Tensor ids = in.indices.reshaped({s_q, k});
  // The ABI passes a rank-3 cache; [tokens,656] and [blocks,bs,1,656] become [tokens,1,656].
  const Tensor cache = in.kv_cache.dim() == 3 ? in.kv_cache
                                              : in.kv_cache.reshaped({tokens, 1, kMlaFp8TokenBytes});
  const DType out_dt = Impl::out_dtype(I.info.caps.outputs.mla_out, in.q.dtype());
  const DType stat_dt = Impl::out_dtype(I.info.caps.outputs.mla_stats, DType::F32);
  auto fn = I.lib.table->sparse_mla_fp8_fwd;
  auto res = I.run(op, [&]() {
    Call c(I.context(op), I.info.provided_outputs);
    dsa_sparse_mla_fp8_fwd_args a{};
    a.q = c.in("q", in.q);
    a.kv_cache = c.in("kv_cache", cache);
    a.indices = c.in("indices", ids);
    a.topk_length = c.in_opt("topk_length", in.topk_length);
    a.attn_sink = c.in_opt("attn_sink", in.attn_sink);
    a.sm_scale = in.sm_scale;
    a.out = c.out("out", out_dt, {s_q, h_q, kMlaFp8NopeDim});
    a.lse = c.out("lse", stat_dt, {s_q, h_q});
    a.max_logits = c.out("max_logits", stat_dt, {s_q, h_q});
    return c.finish(fn(&a, c.err(), c.err_size()));
  });
  return SparseMlaForward{std::move(res.at(0)), std::move(res.at(1)), std::move(res.at(2))};
}

std::string describe(const PluginInfo& info) {
  const dsa_capabilities& c = info.caps;
  auto join = [](std::initializer_list<std::pair<bool, const char*>> items) {
    std::string s;
    for (const auto& [on, name] : items)
      if (on) s += std::string(s.empty() ? "" : "|") + name;
    return s.empty() ? std::string("none") : s;
  };
  auto code = [](int32_t v) -> std::string {
    if (v == DSA_DTYPE_AS_INPUT) return "as-input";
    auto d = dtype_of_code(v);
    return d ? dtype_name(*d) : "?";
  };
  std::string ops;
  for (Op op : dsa::oracle::all_ops())
    if (c.ops & op_bit(op)) ops += std::string(ops.empty() ? "" : ",") + dsa::oracle::to_string(op);
  std::string s = "plugin '" + info.name + "'" + (info.version.empty() ? "" : " " + info.version) +
                  " (ABI " + std::to_string(info.abi_version) + ", " + info.path + "): ops " + ops +
                  "; inputs " + dtype_bits_str(c.input_dtypes) + "; devices " +
                  join({{(c.devices & DSA_DEVICE_CPU) != 0, "cpu"},
                        {(c.devices & DSA_DEVICE_CUDA) != 0, "cuda"}});
  if (c.ops & DSA_OP_TOPK_INDICES)
    s += "; tie " + join({{(c.tie_policies & DSA_TIE_ANY) != 0, "any"},
                          {(c.tie_policies & DSA_TIE_SMALL) != 0, "small"},
                          {(c.tie_policies & DSA_TIE_LARGE) != 0, "large"}}) +
         "; order " + join({{(c.topk_orders & DSA_TOPK_SORTED) != 0, "sorted"},
                            {(c.topk_orders & DSA_TOPK_UNSORTED) != 0, "unsorted"}});
  s += c.deterministic ? "; deterministic" : "; non-deterministic";
  std::string outs;
  auto add = [&](bool used, const char* name, int32_t v) {
    if (used) outs += std::string(" ") + name + "=" + code(v);
  };
  const dsa_output_dtypes& o = c.outputs;
  add(c.ops & DSA_OP_INDEXER_SCORES, "index_scores", o.index_scores);
  add(c.ops & DSA_OP_INDEXER_SCORES_BACKWARD, "indexer_grads", o.indexer_grads);
  add(c.ops & (DSA_OP_SPARSE_MLA_FWD | DSA_OP_SPARSE_MLA_BWD), "mla_out", o.mla_out);
  add(c.ops & (DSA_OP_SPARSE_MLA_FWD | DSA_OP_SPARSE_MLA_BWD), "mla_stats", o.mla_stats);
  add(c.ops & DSA_OP_SPARSE_MLA_BWD, "mla_grads", o.mla_grads);
  add(c.ops & DSA_OP_INDEXER_KL_LOSS, "kl", o.kl);
  if (!outs.empty()) s += "; outputs" + outs;
  if (auto names = provided_output_names(info)) {
    std::string list;
    for (const auto& n : *names) list += (list.empty() ? "" : ",") + n;
    s += "; provides only " + list;
  }

  if (c.ops & ~DSA_OP_ALL_V1)
    s += "; fp8 " + join({{(info.fp8_caps & DSA_FP8_CAP_E4M3FN) != 0, "e4m3fn"},
                          {(info.fp8_caps & DSA_FP8_CAP_E5M2) != 0, "e5m2"},
                          {(info.fp8_caps & DSA_FP8_REDUCED_ACCUMULATION) != 0, "reduced-accumulation"}});
  if (info.rounding_models)
    s += "; rounding " + join({{(info.rounding_models & DSA_ROUNDING_SINK_AFTER_ROUNDING) != 0, "sink-after-rounding"},
                               {(info.rounding_models & DSA_ROUNDING_NORMALIZED_P) != 0, "normalized-p"}});
  return s;
}

std::unique_ptr<PluginBackend> open_plugin(const std::string& path, const PluginOptions& options) {
  if (options.isolate) {  // probe in a child first: a crashing constructor stays there
    IsolatedResult r = run_isolated(
        [&]() -> std::vector<Tensor> {
          load_library(path);
          return {};
        },
        options.load_timeout);
    if (r.status == IsolatedStatus::Crashed || r.status == IsolatedStatus::TimedOut)
      throw PluginLoadError("plugin '" + path + "': loading it " +
                            (r.status == IsolatedStatus::TimedOut ? "hung: " : "crashed: ") +
                            r.message);
    rethrow_in_parent(r, "plugin '" + path + "'");
  }
  auto impl = std::make_unique<PluginBackend::Impl>();
  impl->lib = load_library(path);
  impl->options = options;
  const dsa_backend_v1& t = *impl->lib.table;
  impl->info.path = impl->lib.path;
  impl->info.name = t.name;
  impl->info.version = t.version ? t.version : "";
  impl->info.abi_version = t.abi_version;
  impl->info.caps = t.caps;
  impl->info.provided_outputs = declared_outputs(t);
  impl->info.fp8_caps = has_abi_1_1(t) ? t.fp8_caps : 0;
  impl->info.rounding_models = declared_rounding(t);
  return std::unique_ptr<PluginBackend>(new PluginBackend(std::move(impl)));
}

std::unique_ptr<dsa::oracle::Backend> load_plugin(const std::string& path,
                                                  const PluginOptions& options) {
  return open_plugin(path, options);
}

std::string register_plugin(const std::string& path, const PluginOptions& options) {
  std::unique_ptr<PluginBackend> first = open_plugin(path, options);
  const std::string name = first->name();
  const std::string abs_path = first->info().path;
  PluginOptions again = options;
  dsa::oracle::register_backend(name, [abs_path, again]() -> std::unique_ptr<dsa::oracle::Backend> {
    PluginOptions o = again;
    o.isolate = false;  // skip the load probe: the library loaded fine above ...
    auto b = open_plugin(abs_path, o);
    b->impl_->options.isolate = again.isolate;  // ... but keep isolated calls
    return b;
  });
  return name;
}

}  // namespace dsa::plugin

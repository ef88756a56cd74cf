/* dsa/backend_abi.h: the C ABI through which an external kernel library (a "plugin") is
 * audited by dsa-verify. Version 1. Plain C99; also valid C++ (extern "C").
 *
 * A plugin is a shared library exporting one symbol, DSA_BACKEND_ENTRY_SYMBOL:
 *     const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version);
 * It returns a pointer to a static function table (or NULL when it cannot serve that ABI
 * version). The table carries the ABI version it was built against, a name, a capabilities
 * record and one function per op. Walk-through: docs/auditing-a-kernel.md; a complete
 * example: plugin/examples/example_plugin.c.
 *
 * Memory and ownership (ABI v1):
 * - Every tensor is a DLPack DLTensor in HOST memory (device kDLCPU, id 0), dense row-major:
 *   strides == NULL, byte_offset == 0, lanes == 1, data aligned to 256 bytes.
 *   A GPU kernel copies inputs to its device and results back inside the call.
 * - The caller (the loader) allocates every output with the shape of the SPEC section and
 *   the dtype that the capabilities record declares (dsa_output_dtypes). Output memory is
 *   NOT zeroed: it is filled with a poison pattern, so the plugin must write every element.
 * - The plugin must not modify any descriptor (data, ndim, dtype, shape, strides,
 *   byte_offset) and must not write to inputs. The loader checks descriptors, inputs and
 *   guard zones around each output after every call and reports a violation as a finding.
 * - Pointers passed to a call are valid only during that call; the plugin keeps none.
 * - The auditor runs each call in a forked child process. Do not initialise a device in a
 *   library constructor or in dsa_backend_get_v1; do it lazily inside the op functions.
 *
 * Errors: every op returns a dsa_status. On anything but DSA_STATUS_OK the plugin writes a
 * NUL-terminated message (truncated to fit) into err[0 .. err_size-1]; the loader turns it
 * into an error naming the plugin, the op and the status. DSA_STATUS_UNSUPPORTED means
 * "this input combination is outside what I implement" and is reported as a skip.
 *
 * Shapes, dtypes and rules of each op: /work/shared/SPEC.md (docs/SPEC.md) §2-§7, §10 and
 * contract/include/dsa/contract/op_types.h, fp8_op_types.h.
 *
 * Revisions of version 1: 1.0 (six ops), then provided_outputs appended; 1.1 appends fp8_caps
 * and the §10 inference ops at the end of dsa_backend_v1 (backward compatible: older plugins
 * keep loading and lack the new ops); 1.2 appends rounding_models (an older table reads as 0:
 * nothing declared). Symbols: s_q query rows, s_kv key rows,
 * H_I/d_I indexer heads/width, h_q heads, d_qk q/k width, d_v value width, k top-k width.
 */
#ifndef DSA_BACKEND_ABI_H_
#define DSA_BACKEND_ABI_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------
 * Versioning and the entry point
 * ------------------------------------------------------------------------------------- */

/** ABI version described by this header. Bumped on any incompatible change. */
#define DSA_BACKEND_ABI_VERSION 1u

/** Name of the exported entry point (see dsa_backend_get_v1_fn). */
#define DSA_BACKEND_ENTRY_SYMBOL "dsa_backend_get_v1"

/** Symbol visibility helper for the entry point (plugins are often built with
 *  -fvisibility=hidden). */
#if defined(_WIN32)
#define DSA_BACKEND_EXPORT __declspec(dllexport)
#else
#define DSA_BACKEND_EXPORT __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------- */

/** Result of every plugin function. */
typedef int32_t dsa_status;
/** Success; every output element has been written. */
#define DSA_STATUS_OK 0
/** The op, dtype, policy or size is not implemented; the auditor reports a skip. */
#define DSA_STATUS_UNSUPPORTED 1
/** The plugin rejects its inputs as violating the SPEC (a bug report against the caller). */
#define DSA_STATUS_INVALID_ARGUMENT 2
/** Any internal failure (out of memory, device error, ...); the auditor reports a failure. */
#define DSA_STATUS_INTERNAL_ERROR 3
/** The plugin cannot run here (no device, missing driver); only from is_available. */
#define DSA_STATUS_UNAVAILABLE 4

/* ---------------------------------------------------------------------------------------
 * Capabilities
 * ------------------------------------------------------------------------------------- */

/** Op bits for dsa_capabilities.ops (one per function of dsa_backend_v1). */
#define DSA_OP_INDEXER_SCORES (1u << 0)          /**< SPEC §2 forward */
#define DSA_OP_INDEXER_SCORES_BACKWARD (1u << 1) /**< SPEC §2 backward */
#define DSA_OP_TOPK_INDICES (1u << 2)            /**< SPEC §3 */
#define DSA_OP_SPARSE_MLA_FWD (1u << 3)          /**< SPEC §4 */
#define DSA_OP_SPARSE_MLA_BWD (1u << 4)          /**< SPEC §5 */
#define DSA_OP_INDEXER_KL_LOSS (1u << 5)         /**< SPEC §7 */
#define DSA_OP_ALL_V1 0x3Fu
/* Added in ABI 1.1 (SPEC §10 inference ops; table fields after indexer_kl_loss). */
#define DSA_OP_FP8_INDEXER_SCORES (1u << 6)   /**< SPEC §10 FP8 indexer */
#define DSA_OP_PAGED_INDEXER_SCORES (1u << 7) /**< SPEC §10 paged FP8 indexer */
#define DSA_OP_SPARSE_MLA_FP8_FWD (1u << 8)   /**< SPEC §10 sparse MLA over the FP8 cache */
#define DSA_OP_ALL_V1_1 0x1FFu

/** Values of the fp8_format field of the §10 args (OCP FP8; bytes arrive as kDLUInt 8). */
#define DSA_FP8_FORMAT_E4M3FN 0
#define DSA_FP8_FORMAT_E5M2 1

/** Bits of dsa_backend_v1.fp8_caps (ABI 1.1): FP8 formats the plugin accepts (at least one
 *  when a §10 indexer op is declared), and DSA_FP8_REDUCED_ACCUMULATION when FP8 products are
 *  accumulated on tensor cores with fewer mantissa bits than fp32 between promotions (the
 *  oracle then judges by the table row for that accumulation and says so in the report). */
#define DSA_FP8_CAP_E4M3FN (1u << 0)
#define DSA_FP8_CAP_E5M2 (1u << 1)
#define DSA_FP8_REDUCED_ACCUMULATION (1u << 2)

/** Bits of dsa_backend_v1.rounding_models (ABI 1.2): how a 16-bit sparse MLA kernel rounds
 *  where SPEC §4 leaves it free, the plugin's own declaration of the CLI's --sink-after-rounding
 *  and --normalized-p (oracle::RoundingModel). The audit judges with a model when either the
 *  flag or this bit declares it, and its report and reproduce lines name it (SPEC §9). */
/** out rounded to 16 bits before attn_sink is applied: out = fl16(fl32(fl16(o) * r)). */
#define DSA_ROUNDING_SINK_AFTER_ROUNDING (1u << 0)
/** softmax(P) rounded to 16 bits before P*V, the max key's probability too (FlashMLA's
 *  exp(P - max) keeps that one exactly 1 and needs no bit). */
#define DSA_ROUNDING_NORMALIZED_P (1u << 1)
#define DSA_ROUNDING_ALL_V1_2 0x3u

/** Element type codes used by this ABI (values of dsa_output_dtypes fields). */
#define DSA_DTYPE_F64 1
#define DSA_DTYPE_F32 2
#define DSA_DTYPE_F16 3
#define DSA_DTYPE_BF16 4
/** Output dtype code: "the dtype of the input this output corresponds to" (out ← q,
 *  dq ← q, dkv ← kv, dsink ← attn_sink, dq_idx ← q_idx, dk_idx ← k_idx, dw ← w,
 *  d_scores/loss ← scores). */
#define DSA_DTYPE_AS_INPUT 16
/** Bit of a dtype code in dsa_capabilities.input_dtypes. */
#define DSA_DTYPE_BIT(code) (1u << (code))

/** Device bits for dsa_capabilities.devices: where the kernel computes. */
#define DSA_DEVICE_CPU (1u << 0)
#define DSA_DEVICE_CUDA (1u << 1)

/** Tie-policy bits for dsa_capabilities.tie_policies (SPEC §3.3). */
#define DSA_TIE_ANY (1u << 0)
#define DSA_TIE_SMALL (1u << 1)
#define DSA_TIE_LARGE (1u << 2)

/** Prefix-order bits for dsa_capabilities.topk_orders (SPEC §3.4). */
#define DSA_TOPK_UNSORTED (1u << 0)
#define DSA_TOPK_SORTED (1u << 1)

/** Values of dsa_topk_args.tie_break. */
#define DSA_TIE_BREAK_ANY 0
#define DSA_TIE_BREAK_SMALL 1
#define DSA_TIE_BREAK_LARGE 2

/** Values of dsa_indexer_kl_loss_args.mode (SPEC §7). */
#define DSA_KL_DENSE 0
#define DSA_KL_SPARSE 1

/** Output bits for dsa_backend_v1.provided_outputs (SPEC §9 "complete outputs"): the outputs
 *  a plugin writes. An output whose bit is not set is passed as NULL and reported as "not
 *  judged" (the verdict reads "AGREES (partial: max_logits not judged)"). */
#define DSA_OUTPUT_SCORES (1u << 0)     /**< indexer_scores: scores */
#define DSA_OUTPUT_DQ_IDX (1u << 1)     /**< indexer_scores_backward: dq_idx */
#define DSA_OUTPUT_DK_IDX (1u << 2)     /**< indexer_scores_backward: dk_idx */
#define DSA_OUTPUT_DW (1u << 3)         /**< indexer_scores_backward: dw */
#define DSA_OUTPUT_INDICES (1u << 4)    /**< topk_indices: indices */
#define DSA_OUTPUT_OUT (1u << 5)        /**< sparse_mla_fwd: out */
#define DSA_OUTPUT_LSE (1u << 6)        /**< sparse_mla_fwd: lse */
#define DSA_OUTPUT_MAX_LOGITS (1u << 7) /**< sparse_mla_fwd: max_logits */
#define DSA_OUTPUT_DQ (1u << 8)         /**< sparse_mla_bwd: dq */
#define DSA_OUTPUT_DKV (1u << 9)        /**< sparse_mla_bwd: dkv */
#define DSA_OUTPUT_DSINK (1u << 10)     /**< sparse_mla_bwd: dsink */
#define DSA_OUTPUT_LOSS (1u << 11)      /**< indexer_kl_loss: loss */
#define DSA_OUTPUT_D_SCORES (1u << 12)  /**< indexer_kl_loss: d_scores */
#define DSA_OUTPUT_ALL_V1 0x1FFFu

/** Dtype code of each output family; the loader allocates outputs with these dtypes. */
typedef struct dsa_output_dtypes {
  /** indexer_scores I: DSA_DTYPE_F32 (SPEC §2) or DSA_DTYPE_F64. */
  int32_t index_scores;
  /** dq_idx, dk_idx, dw: any float code or DSA_DTYPE_AS_INPUT. */
  int32_t indexer_grads;
  /** sparse_mla_fwd out: any float code or DSA_DTYPE_AS_INPUT (SPEC §4: q's dtype). */
  int32_t mla_out;
  /** sparse_mla_fwd lse and max_logits: DSA_DTYPE_F32 (SPEC §4) or DSA_DTYPE_F64. */
  int32_t mla_stats;
  /** dq, dkv, dsink: any float code or DSA_DTYPE_AS_INPUT. */
  int32_t mla_grads;
  /** indexer_kl_loss loss and d_scores: DSA_DTYPE_F32, DSA_DTYPE_F64 or DSA_DTYPE_AS_INPUT. */
  int32_t kl;
} dsa_output_dtypes;

/** What the plugin implements. The loader rejects a library whose record is inconsistent
 *  (unknown bits, a declared op without its function, an illegal output dtype code, ...). */
typedef struct dsa_capabilities {
  /** DSA_OP_* bits; non-zero. Only declared ops are called and audited. */
  uint32_t ops;
  /** DSA_DTYPE_BIT() of every accepted dtype of the "data" inputs q_idx, k_idx, q, kv,
   *  dout; non-zero. The fp32-by-contract inputs (w, attn_sink, d_scores, the scores of
   *  topk and kl) always arrive as F32, or as F64 when DSA_DTYPE_F64 is accepted here.
   *  Calls with other dtypes are skipped by the loader, never passed to the plugin. */
  uint32_t input_dtypes;
  /** DSA_DEVICE_* bits; non-zero. Informational: where the kernel computes. */
  uint32_t devices;
  /** DSA_TIE_* bits; non-zero when DSA_OP_TOPK_INDICES is declared. */
  uint32_t tie_policies;
  /** DSA_TOPK_* bits; non-zero when DSA_OP_TOPK_INDICES is declared. */
  uint32_t topk_orders;
  /** 1 when identical inputs give bitwise-identical outputs (SPEC §3.5), else 0. */
  uint32_t deterministic;
  /** Output dtype of each output family (only the families of declared ops matter). */
  dsa_output_dtypes outputs;
} dsa_capabilities;

/* ---------------------------------------------------------------------------------------
 * Op arguments. Inputs are `const DLTensor*`; optional inputs are NULL when absent.
 * Outputs are `DLTensor*` allocated by the caller (see the memory rules above).
 * Windows (SPEC §1) arrive as two I64 tensors ks, ke of shape [s_q]: row t sees key
 * columns [ks[t], ke[t]), already clamped to [0, s_kv]; ks >= ke is an empty window.
 * ------------------------------------------------------------------------------------- */

/** SPEC §2 forward: I[t,s] = Σ_j w[t,j]·ReLU(q_idx[t,j,:]·k_idx[s,:]) in window, else -inf. */
typedef struct dsa_indexer_scores_args {
  const DLTensor* q_idx; /**< [s_q, H_I, d_I], dtype from input_dtypes */
  const DLTensor* k_idx; /**< [s_kv, d_I], dtype from input_dtypes */
  const DLTensor* w;     /**< [s_q, H_I] F32 (F64 if accepted); may be negative */
  const DLTensor* ks;    /**< [s_q] I64 window starts */
  const DLTensor* ke;    /**< [s_q] I64 window ends (exclusive) */
  DLTensor* scores;      /**< out [s_q, s_kv], dtype outputs.index_scores */
} dsa_indexer_scores_args;

/** SPEC §2 backward for upstream d_scores (entries outside the window ignored). */
typedef struct dsa_indexer_scores_backward_args {
  const DLTensor* q_idx;    /**< [s_q, H_I, d_I] */
  const DLTensor* k_idx;    /**< [s_kv, d_I] */
  const DLTensor* w;        /**< [s_q, H_I] F32 (F64 if accepted) */
  const DLTensor* ks;       /**< [s_q] I64 */
  const DLTensor* ke;       /**< [s_q] I64 */
  const DLTensor* d_scores; /**< [s_q, s_kv] F32 (F64 if accepted) */
  DLTensor* dq_idx;         /**< out [s_q, H_I, d_I], dtype outputs.indexer_grads */
  DLTensor* dk_idx;         /**< out [s_kv, d_I], dtype outputs.indexer_grads */
  DLTensor* dw;             /**< out [s_q, H_I], dtype outputs.indexer_grads */
} dsa_indexer_scores_backward_args;

/** SPEC §3: top-k column ids per row; k_eff valid ids as a compact prefix, then -1. */
typedef struct dsa_topk_args {
  const DLTensor* scores; /**< [s_q, s_kv] F32 (F64 if accepted); may hold NaN and ±inf */
  int64_t k;              /**< >= 0; k > s_kv is legal */
  int32_t tie_break;      /**< DSA_TIE_BREAK_*; only declared tie_policies are requested */
  int32_t sorted;         /**< 1: prefix sorted by score desc, ties by the tie order; 0: any */
  const DLTensor* ks;     /**< [s_q] I64, or NULL: every row sees all s_kv columns */
  const DLTensor* ke;     /**< [s_q] I64, or NULL (both NULL or both set) */
  DLTensor* indices;      /**< out [s_q, k] I32 (always int32, SPEC §3) */
} dsa_topk_args;

/** SPEC §4 sparse MLA forward (MQA/absorbed, one KV head); natural-log lse. */
typedef struct dsa_sparse_mla_fwd_args {
  const DLTensor* q;           /**< [s_q, h_q, d_qk], dtype from input_dtypes */
  const DLTensor* kv;          /**< [s_kv, d_qk], same dtype as q; V = first d_v columns */
  const DLTensor* indices;     /**< [s_q, k] I32; any value (invalid slots contribute 0) */
  const DLTensor* topk_length; /**< [s_q] I32, or NULL; slot j valid only if j < length */
  const DLTensor* attn_sink;   /**< [h_q] F32 (F64 if accepted), or NULL; ±inf allowed */
  double sm_scale;             /**< finite softmax scale applied to q·k */
  int64_t d_v;                 /**< 0 < d_v <= d_qk */
  DLTensor* out;               /**< out [s_q, h_q, d_v], dtype outputs.mla_out */
  DLTensor* lse;               /**< out [s_q, h_q], dtype outputs.mla_stats; +inf empty rows */
  DLTensor* max_logits;        /**< out [s_q, h_q], dtype outputs.mla_stats; -inf empty */
} dsa_sparse_mla_fwd_args;

/** SPEC §5 sparse MLA backward; uses the given indices (never reselects). */
typedef struct dsa_sparse_mla_bwd_args {
  const DLTensor* q;           /**< [s_q, h_q, d_qk] */
  const DLTensor* kv;          /**< [s_kv, d_qk] */
  const DLTensor* indices;     /**< [s_q, k] I32 */
  const DLTensor* topk_length; /**< [s_q] I32, or NULL */
  const DLTensor* attn_sink;   /**< [h_q] F32 (F64 if accepted), or NULL */
  double sm_scale;             /**< as in the forward */
  int64_t d_v;                 /**< as in the forward */
  /** [s_q, h_q, d_v], dtype outputs.mla_out, or NULL: this plugin's own forward output for
   *  the same inputs (passed when DSA_OP_SPARSE_MLA_FWD is declared). */
  const DLTensor* out;
  /** [s_q, h_q], dtype outputs.mla_stats, or NULL: this plugin's own forward lse. */
  const DLTensor* lse;
  const DLTensor* dout; /**< [s_q, h_q, d_v], dtype from input_dtypes (or F32) */
  DLTensor* dq;         /**< out [s_q, h_q, d_qk], dtype outputs.mla_grads */
  DLTensor* dkv;        /**< out [s_kv, d_qk], dtype outputs.mla_grads; NOT pre-zeroed */
  DLTensor* dsink;      /**< out [h_q], dtype outputs.mla_grads; NULL when no attn_sink */
} dsa_sparse_mla_bwd_args;

/** SPEC §7 indexer KL loss; the teacher is detached, gradient flows only into scores. */
typedef struct dsa_indexer_kl_loss_args {
  const DLTensor* scores;  /**< [s_q, s_kv] F32 (F64 if accepted): indexer output I */
  const DLTensor* q;       /**< [s_q, h_q, d_qk], dtype from input_dtypes */
  const DLTensor* kv;      /**< [s_kv, d_qk] */
  double sm_scale;         /**< softmax scale of the teacher logits */
  const DLTensor* ks;      /**< [s_q] I64 */
  const DLTensor* ke;      /**< [s_q] I64 */
  int32_t mode;            /**< DSA_KL_DENSE or DSA_KL_SPARSE */
  const DLTensor* indices; /**< [s_q, k] I32 (DSA_KL_SPARSE), else NULL */
  double coeff;            /**< loss coefficient */
  DLTensor* loss;          /**< out [1], dtype outputs.kl */
  DLTensor* d_scores;      /**< out [s_q, s_kv], dtype outputs.kl; zero outside S_t */
} dsa_indexer_kl_loss_args;

/* ABI 1.1: SPEC §10 inference ops. FP8 tensors are U8 (kDLUInt, 8 bits) bytes. */

/** SPEC §10 FP8 indexer (DeepGEMM fp8_mqa_logits): I[t,s] = Σ_j w[t,j]·ReLU(k_scale[s]·
 *  (q_idx[t,j,:]·k_idx[s,:])) inside the window, -inf outside. Keys outside every window may
 *  hold NaN bytes and invalid scales and must not influence anything. */
typedef struct dsa_fp8_indexer_scores_args {
  const DLTensor* q_idx;   /**< [s_q, H_I, d_I] U8 fp8 bytes */
  const DLTensor* k_idx;   /**< [s_kv, d_I] U8 fp8 bytes */
  const DLTensor* k_scale; /**< [s_kv] F32, positive finite for keys a window reads */
  const DLTensor* w;       /**< [s_q, H_I] F32; carries q's scale; may be negative */
  const DLTensor* ks;      /**< [s_q] I64 */
  const DLTensor* ke;      /**< [s_q] I64 */
  int32_t fp8_format;      /**< DSA_FP8_FORMAT_* of q_idx and k_idx */
  DLTensor* scores;        /**< out [s_q, s_kv], dtype outputs.index_scores */
} dsa_fp8_indexer_scores_args;

/** SPEC §10 paged FP8 indexer (DeepGEMM fp8_paged_mqa_logits). Logical key p of request b is
 *  k_cache[block_table[b, p / block_size], p % block_size]; row b·next_n+i sees keys
 *  [0, L_b - next_n + i + 1) (clamped), -inf elsewhere. Table entries, slots and scales past
 *  a context may hold -1, out-of-range ids or NaN and must never be read. */
typedef struct dsa_paged_indexer_scores_args {
  const DLTensor* q_idx;         /**< [batch, next_n, H_I, d_I] U8 */
  const DLTensor* k_cache;       /**< [num_blocks, block_size, d_I] U8 */
  const DLTensor* k_scale_cache; /**< [num_blocks, block_size] F32 */
  const DLTensor* w;             /**< [batch·next_n, H_I] F32 */
  const DLTensor* block_table;   /**< [batch, max_blocks] I32 */
  const DLTensor* context_lens;  /**< [batch] I32, 0 <= L <= max_blocks·block_size */
  int32_t fp8_format;            /**< DSA_FP8_FORMAT_* of q_idx and k_cache */
  DLTensor* scores; /**< out [batch·next_n, max_context], dtype outputs.index_scores */
} dsa_paged_indexer_scores_args;

/** SPEC §10 + §4-§6: sparse MLA forward over FlashMLA's FP8 KV cache, 656 bytes per token
 *  (512 e4m3fn NoPE, 4 fp32 tile scales, 64 bf16 RoPE); d_qk 576, d_v 512. Ids address
 *  token rows (block·block_size + slot); tokens no valid slot reads may hold NaN bytes. */
typedef struct dsa_sparse_mla_fp8_fwd_args {
  const DLTensor* q;           /**< [s_q, h_q, 576], dtype from input_dtypes */
  const DLTensor* kv_cache;    /**< [num_blocks, block_size, 656] U8 */
  const DLTensor* indices;     /**< [s_q, k] I32 */
  const DLTensor* topk_length; /**< [s_q] I32, or NULL */
  const DLTensor* attn_sink;   /**< [h_q] F32, or NULL */
  double sm_scale;
  DLTensor* out;        /**< out [s_q, h_q, 512], dtype outputs.mla_out */
  DLTensor* lse;        /**< out [s_q, h_q], dtype outputs.mla_stats */
  DLTensor* max_logits; /**< out [s_q, h_q], dtype outputs.mla_stats */
} dsa_sparse_mla_fp8_fwd_args;

/* ---------------------------------------------------------------------------------------
 * The function table
 * ------------------------------------------------------------------------------------- */

/** What dsa_backend_get_v1 returns. Static storage; the loader never frees it. */
typedef struct dsa_backend_v1 {
  /** Must equal DSA_BACKEND_ABI_VERSION of the header the plugin was built with. Stays
   *  the first field in every ABI version, so any loader can read it. */
  uint32_t abi_version;
  /** sizeof(dsa_backend_v1) as the plugin saw it (guards against stale headers). */
  uint32_t struct_size;
  /** Short identifier, e.g. "my-fp8-kernel"; printable ASCII without spaces, non-empty. */
  const char* name;
  /** Free-form plugin version or build id (may be NULL). Printed in reports. */
  const char* version;
  /** What the plugin implements. */
  dsa_capabilities caps;
  /** Optional (may be NULL = always available): DSA_STATUS_OK when the plugin can run on
   *  this machine, else DSA_STATUS_UNAVAILABLE with the reason in err (reported as skip). */
  dsa_status (*is_available)(char* err, size_t err_size);
  /** One function per op; NULL for ops not declared in caps.ops. Each gets its args and an
   *  error buffer err[err_size] (err_size > 0) for a message when it returns non-OK. */
  dsa_status (*indexer_scores)(const dsa_indexer_scores_args* args, char* err,
                               size_t err_size);
  dsa_status (*indexer_scores_backward)(const dsa_indexer_scores_backward_args* args,
                                        char* err, size_t err_size);
  dsa_status (*topk_indices)(const dsa_topk_args* args, char* err, size_t err_size);
  dsa_status (*sparse_mla_fwd)(const dsa_sparse_mla_fwd_args* args, char* err,
                               size_t err_size);
  dsa_status (*sparse_mla_bwd)(const dsa_sparse_mla_bwd_args* args, char* err,
                               size_t err_size);
  dsa_status (*indexer_kl_loss)(const dsa_indexer_kl_loss_args* args, char* err,
                                size_t err_size);
  /** DSA_OUTPUT_* bits of the outputs this plugin writes; 0 = every output of each declared
   *  op. Outputs not declared are passed as NULL and not judged; each declared op keeps at
   *  least one output. Added after the first release of ABI 1: a table whose struct_size
   *  ends before this field (an older header) is read as 0, so older plugins keep loading. */
  uint32_t provided_outputs;
  /* ---- ABI 1.1 (SPEC §10). Appended after provided_outputs: a plugin built against an
   * older header has a struct_size of at most DSA_BACKEND_V1_PRE_FP8_SIZE, keeps loading and
   * simply lacks these ops. The loader reads the fields below only when struct_size covers
   * them. ---- */
  /** DSA_FP8_* bits (formats, reduced accumulation). */
  uint32_t fp8_caps;
  dsa_status (*fp8_indexer_scores)(const dsa_fp8_indexer_scores_args* args, char* err,
                                   size_t err_size);
  dsa_status (*paged_indexer_scores)(const dsa_paged_indexer_scores_args* args, char* err,
                                     size_t err_size);
  dsa_status (*sparse_mla_fp8_fwd)(const dsa_sparse_mla_fp8_fwd_args* args, char* err,
                                   size_t err_size);
  /* ---- ABI 1.2. Appended after the §10 ops: a table whose struct_size ends before it (at most
   * DSA_BACKEND_V1_PRE_ROUNDING_SIZE, an older header) keeps loading and declares nothing. It
   * extends the capabilities record, which cannot grow in place (fields follow it). ---- */
  /** DSA_ROUNDING_* bits; 0 = neither model. Only with a sparse MLA op declared
   *  (sparse_mla_fwd, sparse_mla_bwd or sparse_mla_fp8_fwd); unknown bits fail the load. */
  uint32_t rounding_models;
} dsa_backend_v1;

/** struct_size of a table built before the §10 fields (everything up to provided_outputs). */
#define DSA_BACKEND_V1_PRE_FP8_SIZE (offsetof(dsa_backend_v1, fp8_caps))
/** struct_size of a table built before rounding_models (an ABI 1.1 header). */
#define DSA_BACKEND_V1_PRE_ROUNDING_SIZE (offsetof(dsa_backend_v1, rounding_models))

/** Type of the exported entry point. `loader_abi_version` is the loader's
 *  DSA_BACKEND_ABI_VERSION; return NULL if the plugin cannot serve it. Must be cheap and
 *  side-effect free (no device initialisation). */
typedef const dsa_backend_v1* (*dsa_backend_get_v1_fn)(uint32_t loader_abi_version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DSA_BACKEND_ABI_H_ */

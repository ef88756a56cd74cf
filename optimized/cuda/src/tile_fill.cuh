// Device helpers shared by the sparse MLA forward kernels: the validity of one slot, and the
// compaction of the next valid ids of one query row into shared memory (SPEC §4: slot j valid
// iff 0 <= id < s_kv and j < topk_length, the latter folded into `lim`). Invalid slots
// anywhere are skipped and never read through.
#pragma once

#include <cstdint>

namespace dsa::cuda::detail {

/// The kv id of slot `slot` of the row irow, or -1 when the slot is invalid (slot >= lim, id < 0
/// or id >= s_kv; SPEC §4). lim: min(k, topk_length[t]).
__device__ __forceinline__ int slot_id(const int32_t* irow, int64_t slot, int64_t lim, int s_kv) {
  if (slot >= lim) return -1;
  const int v = irow[slot];
  return (v >= 0 && v < s_kv) ? v : -1;
}

/// Warp-level (call from one whole warp): fills ids_s with up to kTileRows valid ids taken in
/// slot order from *sh_cursor on, then lane 0 stores the count in *sh_cnt and the next slot
/// in *sh_cursor. irow: the row's indices; lim: min(k, topk_length[t]).
template <int kTileRows>
__device__ __forceinline__ void fill_valid_id_tile(const int32_t* irow, int64_t lim, int64_t s_kv,
                                                   int lane, int* ids_s, int* sh_cnt,
                                                   int64_t* sh_cursor) {
  int cnt = 0;
  int64_t cur = *sh_cursor;
  while (cnt < kTileRows && cur < lim) {
    const int64_t slot = cur + lane;
    int32_t id = -1;
    bool valid = false;
    if (slot < lim) {
      id = irow[slot];
      valid = id >= 0 && (int64_t)id < s_kv;
    }
    const uint32_t m = __ballot_sync(0xffffffffu, valid);
    const int room = kTileRows - cnt;
    const int rank = __popc(m & ((1u << lane) - 1u));
    if (valid && rank < room) ids_s[cnt + rank] = id;
    const int nv = __popc(m);
    if (nv <= room) {
      cnt += nv;
      cur += 32;
    } else {
      // The tile fills inside this group of 32 slots: resume after the last slot taken.
      const uint32_t last = __ballot_sync(0xffffffffu, valid && rank == room - 1);
      cur += __ffs(last);
      cnt = kTileRows;
    }
  }
  __syncwarp();
  if (lane == 0) {
    *sh_cnt = cnt;
    *sh_cursor = cur;
  }
}

}  // namespace dsa::cuda::detail

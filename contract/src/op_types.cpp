#include "dsa/contract/op_types.h"

#include <algorithm>

namespace dsa {

void valid_slot_ids(const SparseMlaInputs& in, int64_t t, std::vector<int64_t>& ids) {
  ids.clear();
  const int64_t k = in.indices.size(-1), s_kv = in.kv.size(0);
  int64_t limit = k;
  if (in.topk_length) limit = std::min<int64_t>(limit, static_cast<int64_t>(in.topk_length->get(t)));
  for (int64_t j = 0; j < limit; ++j) {
    const double id = in.indices.get(t * k + j);
    if (id >= 0 && id < static_cast<double>(s_kv)) ids.push_back(static_cast<int64_t>(id));
  }
}

}  // namespace dsa

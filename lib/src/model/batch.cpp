// Micro-batch inputs from cu_seqlens (batch.hpp). Built on the host (a few
// integers per token), copied to the device once.
#include "wlb4d/model/batch.hpp"

#include <limits>
#include <stdexcept>
#include <string>

namespace wlb::model {

namespace {

void ensure(IntVec& v, std::int64_t n, const char* label) {
  if (std::int64_t(v.extent(0)) < n) v = IntVec(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
}

void upload(const IntVec& dst, const std::vector<std::int32_t>& src) {
  if (src.empty()) return;
  Kokkos::View<const std::int32_t*, Layout, HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(src.data(),
                                                                                                   src.size());
  // Unmanaged window of exact extent: deep_copy across memory spaces needs
  // equal extents and contiguous layouts.
  Kokkos::deep_copy(IntVec(dst.data(), src.size()), h);
}

}  // namespace

void fill_micro_batch(MicroBatchInput& mb, const std::vector<std::int64_t>& cu, const std::vector<token_t>& ids) {
  if (cu.size() < 2 || cu.front() != 0)
    throw std::invalid_argument("wlb::model::fill_micro_batch: cu_seqlens must start at 0 and hold >= 2 entries");
  for (std::size_t i = 1; i < cu.size(); ++i)
    if (cu[i] <= cu[i - 1])
      throw std::invalid_argument("wlb::model::fill_micro_batch: cu_seqlens must be strictly increasing (entry " +
                                  std::to_string(i) + ")");
  const std::int64_t T = cu.back();
  if (T > std::numeric_limits<std::int32_t>::max())
    throw std::invalid_argument("wlb::model::fill_micro_batch: T=" + std::to_string(T) + " exceeds int32");
  if (!ids.empty() && std::int64_t(ids.size()) != T)
    throw std::invalid_argument("wlb::model::fill_micro_batch: " + std::to_string(ids.size()) +
                                " token ids for T=" + std::to_string(T) + " tokens");
  std::vector<std::int32_t> pos(T), lo(T), hi(T), lab, tok;
  if (!ids.empty()) {
    lab.assign(T, -1);
    tok.resize(T);
  }
  std::int64_t pairs = 0, targets = 0;
  for (std::size_t d = 0; d + 1 < cu.size(); ++d) {
    for (std::int64_t i = cu[d]; i < cu[d + 1]; ++i) {
      pos[i] = std::int32_t(i - cu[d]);
      lo[i] = std::int32_t(cu[d]);
      hi[i] = std::int32_t(i);
      pairs += i - cu[d] + 1;
      if (!ids.empty()) {
        if (ids[i] > token_t(std::numeric_limits<std::int32_t>::max()))
          throw std::invalid_argument("wlb::model::fill_micro_batch: token id " + std::to_string(ids[i]) +
                                      " exceeds int32");
        tok[i] = std::int32_t(ids[i]);
        if (i + 1 < cu[d + 1]) {
          lab[i] = std::int32_t(ids[i + 1]);
          ++targets;
        }
      }
    }
  }
  ensure(mb.positions, T, "wlb::model::positions");
  ensure(mb.kv_lo, T, "wlb::model::kv_lo");
  ensure(mb.kv_hi, T, "wlb::model::kv_hi");
  upload(mb.positions, pos);
  upload(mb.kv_lo, lo);
  upload(mb.kv_hi, hi);
  if (!ids.empty()) {
    ensure(mb.token_ids, T, "wlb::model::token_ids");
    ensure(mb.labels, T, "wlb::model::labels");
    upload(mb.token_ids, tok);
    upload(mb.labels, lab);
  }
  mb.tokens = T;
  mb.target_tokens = targets;
  mb.attention_pairs = pairs;
}

MicroBatchInput make_micro_batch(const std::vector<std::int64_t>& cu, const std::vector<token_t>& ids) {
  MicroBatchInput mb;
  fill_micro_batch(mb, cu, ids);
  return mb;
}

}  // namespace wlb::model

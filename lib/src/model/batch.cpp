// Micro-batch inputs from cu_seqlens (batch.hpp). Built on the host (a few
// integers per token), copied to the device once.
#include "wlb4d/model/batch.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace wlb::model {

namespace {

void check_cu_seqlens(const std::vector<std::int64_t>& cu, const std::vector<token_t>& ids) {
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
  for (token_t id : ids)
    if (id > token_t(std::numeric_limits<std::int32_t>::max()))
      throw std::invalid_argument("wlb::model::fill_micro_batch: token id " + std::to_string(id) + " exceeds int32");
}

}  // namespace

HostMicroBatch build_host_micro_batch(const std::vector<std::int64_t>& cu, const std::vector<token_t>& ids,
                                      const std::vector<std::int64_t>* local,
                                      const std::vector<std::uint8_t>* loss_mask) {
  check_cu_seqlens(cu, ids);
  const std::int64_t T = cu.back();
  if (loss_mask && std::int64_t(loss_mask->size()) != T)
    throw std::invalid_argument("wlb::model::build_host_micro_batch: loss mask of " +
                                std::to_string(loss_mask->size()) + " values for T=" + std::to_string(T) + " tokens");
  // Document start of every packed token (the mask and the positions need it).
  std::vector<std::int32_t> start(static_cast<std::size_t>(T));
  std::vector<bool> last(static_cast<std::size_t>(T), false);
  for (std::size_t d = 0; d + 1 < cu.size(); ++d) {
    for (std::int64_t i = cu[d]; i < cu[d + 1]; ++i) start[std::size_t(i)] = std::int32_t(cu[d]);
    last[std::size_t(cu[d + 1] - 1)] = true;
  }
  HostMicroBatch h;
  h.has_ids = !ids.empty();
  auto take = [&](std::int64_t i) {
    if (i < 0 || i >= T)
      throw std::invalid_argument("wlb::model::build_host_micro_batch: local token " + std::to_string(i) +
                                  " outside [0, " + std::to_string(T) + ")");
    const std::int32_t s = start[std::size_t(i)];
    h.positions.push_back(std::int32_t(i - s));
    h.kv_lo.push_back(s);
    h.kv_hi.push_back(std::int32_t(i));
    h.attention_pairs += i - s + 1;
    if (!ids.empty()) {
      h.token_ids.push_back(std::int32_t(ids[std::size_t(i)]));
      // Labels never cross a document boundary; a masked next token is no target.
      const bool target = !last[std::size_t(i)] && (!loss_mask || (*loss_mask)[std::size_t(i) + 1] != 0);
      h.labels.push_back(target ? std::int32_t(ids[std::size_t(i) + 1]) : -1);
      h.target_tokens += target ? 1 : 0;
    }
  };
  if (local) {
    for (std::int64_t i : *local) take(i);
  } else {
    for (std::int64_t i = 0; i < T; ++i) take(i);
  }
  return h;
}

void upload_ints(IntVec& dst, const std::vector<std::int32_t>& src, const char* label) {
  if (dst.extent(0) < src.size() || dst.extent(0) == 0)
    dst = IntVec(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                 std::max<std::size_t>(1, src.size()));
  if (src.empty()) return;
  Kokkos::View<const std::int32_t*, Layout, HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(src.data(),
                                                                                                   src.size());
  // Unmanaged window of exact extent: deep_copy across memory spaces needs
  // equal extents and contiguous layouts.
  Kokkos::deep_copy(IntVec(dst.data(), src.size()), h);
}

void upload_micro_batch(MicroBatchInput& mb, const HostMicroBatch& h) {
  upload_ints(mb.positions, h.positions, "wlb::model::positions");
  upload_ints(mb.kv_lo, h.kv_lo, "wlb::model::kv_lo");
  upload_ints(mb.kv_hi, h.kv_hi, "wlb::model::kv_hi");
  if (h.has_ids) {
    upload_ints(mb.token_ids, h.token_ids, "wlb::model::token_ids");
    upload_ints(mb.labels, h.labels, "wlb::model::labels");
  }
  mb.tokens = h.size();
  mb.target_tokens = h.target_tokens;
  mb.attention_pairs = h.attention_pairs;
}

void fill_micro_batch(MicroBatchInput& mb, const std::vector<std::int64_t>& cu, const std::vector<token_t>& ids) {
  upload_micro_batch(mb, build_host_micro_batch(cu, ids));
}

MicroBatchInput make_micro_batch(const std::vector<std::int64_t>& cu, const std::vector<token_t>& ids) {
  MicroBatchInput mb;
  fill_micro_batch(mb, cu, ids);
  return mb;
}

}  // namespace wlb::model

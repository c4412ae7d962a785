#pragma once
/// \file cp_exchange.hpp
/// \brief Context-parallel K/V exchange (DESIGN §5; WLB-LLM §5, Llama 3's
/// all-gather CP): the KvExchange a Transformer uses when cp > 1.
///
/// Per layer, the K and V of this rank's local tokens ([T][Hkv_l][D], in this
/// rank's token order) are all-gathered over the CP group and permuted into
/// the packed micro-batch order ([S][Hkv_l][D], S = tokens of the whole
/// micro-batch), so the queries' kv_lo/kv_hi (packed indices) index them
/// directly under the document-causal mask. In the backward, dK/dV of the
/// gathered keys are permuted back to gathered order and reduce-scattered, so
/// each rank receives the sum over CP ranks for its own tokens.
///
/// The micro-batch is bound with bind() before each forward/backward of it.
/// Communication goes through comm (device buffers: NCCL where attached).

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/clock.hpp"
#include "wlb4d/core/types.hpp"
#include "wlb4d/model/transformer.hpp"

#include <cstdint>
#include <utility>
#include <vector>

namespace wlb::model {

class CpKvExchange final : public KvExchange<float> {
 public:
  /// \param cp    the CP group (this rank's tokens are its rank's shard)
  /// \param cap   most tokens of one micro-batch (S), the buffers' rows
  /// \param hkv   KV heads on this rank (kv_heads / tp); \param hd head_dim
  CpKvExchange(comm::Communicator cp, std::int64_t cap, std::int64_t hkv, std::int64_t hd);

  /// Binds a micro-batch: counts[r] tokens on CP rank r; gathered_to_packed[q]
  /// is the packed index of the q-th gathered token (ranks concatenated in
  /// rank order); total = S = Σ counts.
  /// \throws std::invalid_argument if counts has not one entry per CP rank or
  ///         total exceeds the capacity.
  void bind(const std::vector<std::int64_t>& counts, const IntVec& gathered_to_packed, std::int64_t total);

  std::pair<View3<float>, View3<float>> gather(int layer, int slot, const View3<float>& k,
                                               const View3<float>& v) override;
  std::pair<View3<float>, View3<float>> grad_buffers(int layer, int slot, const View3<float>& dk,
                                                     const View3<float>& dv) override;
  void reduce_scatter(int layer, int slot, const View3<float>& dk_all, const View3<float>& dv_all,
                      const View3<float>& dk, const View3<float>& dv) override;

  /// Wall seconds spent in CP communication (and its permutes) since reset.
  double comm_seconds() const { return seconds_; }
  void reset_comm_seconds() { seconds_ = 0; }
  /// Appends each gather's and reduce_scatter's interval (as counted in
  /// comm_seconds) to `log` from now on (nullptr: off, the default); the
  /// caller keeps `log` alive until it sets nullptr again (log.trace_step).
  void set_span_log(std::vector<core::TimeSpan>* log) { spans_ = log; }

 private:
  View3<float> first_rows(const View3<float>& b) const;

  comm::Communicator cp_;
  std::int64_t width_ = 0;  // Hkv_l · D floats per token
  std::int64_t cap_ = 0;
  View3<float> kg_, vg_, dkg_, dvg_, tmp_;
  std::vector<int> counts_, displs_;  // floats per CP rank, for the v-collectives
  IntVec perm_;
  std::int64_t total_ = 0;
  double seconds_ = 0;
  std::vector<core::TimeSpan>* spans_ = nullptr;
};

/// Row permutation between gathered order and packed order, `width` floats a
/// row, rows [0, n): to_packed: dst[perm[q]] = src[q]; else dst[q] =
/// src[perm[q]]. A free function (not a private member) so nvcc accepts its
/// device lambda.
void permute_rows(const View3<float>& src, const View3<float>& dst, const IntVec& perm, std::int64_t n,
                  std::int64_t width, bool to_packed);

}  // namespace wlb::model

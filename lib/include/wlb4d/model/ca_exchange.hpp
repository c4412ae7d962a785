#pragma once
/// \file ca_exchange.hpp
/// \brief Core-attention disaggregation, the execution side (DistCA: Zhuang,
/// Chen et al., arXiv 2510.18121, §3): the CoreAttention a
/// Transformer uses with balance.attention = disaggregated.
///
/// The plan (balance::assign_attention_tasks, made identically on every rank
/// by pipeline::Executor) moves some query blocks of this rank's micro-batch
/// to other ranks of the *attention group* (DP×CP of one pipeline stage and
/// TP rank) and brings some of theirs here. Per layer:
///
///   forward:  pack Q rows + the span's K/V rows of each exported block →
///             ialltoallv → the first half of the local rows runs
///             attention_forward (exported rows masked empty), hiding the
///             send → the imported blocks run attention_forward from the
///             receive buffer (one call per source rank) → O and LSE back
///             (ialltoallv), hidden behind the second half of the local rows
///             (DistCA's ping-pong) → written into this rank's out/lse rows.
///   backward: the same (two halves) with Q, K, V, O, dO, LSE out and dQ, dK, dV back;
///             dQ rows are written, dK/dV rows are added to this rank's
///             (gathered) dk/dv, in source-rank order (deterministic).
///
/// Stateless: the backward sends Q/K/V again rather than keeping the forward's
/// imports per (layer, slot), so recompute (which re-runs the forward) and
/// every schedule work unchanged; the price is bytes (see exchange_floats).
/// The numbers are the local kernel's: each moved row attends the same keys
/// through the same kernel; only the key-tile boundaries and the order in
/// which dK/dV partial sums are added differ (rounding, ~1e-7 relative).
///
/// Buffers are grow-only Views in MemSpace. The two all-to-alls of a layer
/// take one of three paths:
/// - the group has a device backend attached (comm.backend=nccl:
///   Communicator::ialltoallv_device, ncclSend/ncclRecv in one group): device
///   to device, no host copies; blocking, so each trip is exposed time (the
///   ping-pong halves still run, but after the trip instead of under it);
/// - host builds: Communicator::ialltoallv (nonblocking, MPI) on the Views,
///   hidden behind the local rows;
/// - CUDA build without NCCL: staged through host mirrors (MPICH is not
///   CUDA-aware), the MPI part hidden as on the host.
/// Communication goes through comm (polite waits, watchdog).
///
/// Units: rows are tokens; bytes are bytes; seconds are wall seconds.

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/types.hpp"
#include "wlb4d/model/transformer.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace wlb::model {

/// One query block computed away from its home rank.
struct CaMove {
  int home = 0;                ///< group rank holding the query rows
  int dest = 0;                ///< group rank computing them (!= home)
  std::int64_t q_row = 0;      ///< first query row in home's local rows [T]
  std::int64_t rows = 0;       ///< query rows (>= 1)
  std::int64_t key_begin = 0;  ///< home's key index [S] of the span's first token
  std::int64_t prefix = 0;     ///< the block starts `prefix` tokens into its span
  std::int32_t span = 0;       ///< span index (K/V rows are sent once per home, span, dest)
  /// Keys the block attends: [key_begin, key_begin + prefix + rows) (causal).
  std::int64_t key_rows() const { return prefix + rows; }
};

/// A micro-batch's exchange, prepared once per step (CoreAttentionExchange::prepare).
struct CaLayout;

/// What one rank moved in the exchanges since reset_stats.
struct CaStats {
  double exposed_s = 0;        ///< wall seconds waited for exchanges (after local compute)
  double bytes_sent = 0;       ///< bytes this rank sent (forward + backward, both directions)
  double bytes_received = 0;   ///< bytes it received
  std::int64_t rows_exported = 0, rows_imported = 0;  ///< query rows, summed over calls
};

class CoreAttentionExchange final : public CoreAttention<float> {
 public:
  /// \param group  the attention group (DP×CP ranks of this stage and TP
  ///               rank; a communicator of its own, so its collectives never
  ///               interleave with the gradient buckets on DP×CP); a device
  ///               backend attached to it carries the exchange
  /// \param hq, hkv query / KV heads on this rank; \param hd head dim
  CoreAttentionExchange(comm::Communicator group, std::int64_t hq, std::int64_t hkv, std::int64_t hd);
  ~CoreAttentionExchange() override;

  /// Layout of one micro-batch's exchange for this rank. `moves` are all
  /// moves of the group for that slot (identical on every rank); `tokens` is
  /// T, this rank's query rows of the micro-batch.
  /// \throws std::invalid_argument if a move names a rank outside the group,
  ///         has home == dest or rows < 1, or exceeds T on its home.
  /// `into` is reused (its device arrays grow only, so a steady state allocates nothing).
  void prepare(const std::vector<CaMove>& moves, std::int64_t tokens, CaLayout& into) const;
  /// An empty layout for prepare.
  static std::shared_ptr<CaLayout> make_layout();

  /// Binds the micro-batch about to run (nullptr: attention stays local).
  void bind(std::shared_ptr<const CaLayout> layout) { bound_ = std::move(layout); }
  /// Whether the bound layout (if any) moves anything.
  bool bound_moves() const;

  /// Same contract as CoreAttention (transformer.hpp). Collective over the
  /// group whenever the bound layout has moves on any rank.
  /// \throws std::logic_error if q has another row count than the bound
  ///         layout's T; std::invalid_argument from the attention kernel on
  ///         inconsistent extents or from a count above INT_MAX floats;
  ///         core::CommError (watchdog included) from the exchange.
  void forward(int layer, int slot, const View3<float>& q, const View3<float>& k, const View3<float>& v,
               const View1<const std::int32_t>& kv_lo, const View1<const std::int32_t>& kv_hi, float scale,
               const View3<float>& out, const View2<float>& lse) override;
  void backward(int layer, int slot, const View3<float>& q, const View3<float>& k, const View3<float>& v,
                const View3<float>& out, const View3<float>& dout, const View2<float>& lse,
                const View1<const std::int32_t>& kv_lo, const View1<const std::int32_t>& kv_hi, float scale,
                const View3<float>& dq, const View3<float>& dk, const View3<float>& dv) override;

  const CaStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CaStats{}; }

  /// Floats a moved query row and a sent K/V row cost over forward + backward
  /// (both directions): query row 6·Hq·D + 2·Hq (Q, O+LSE back; Q, O, dO,
  /// LSE out, dQ back), key row 6·Hkv·D (K, V out twice, dK, dV back). The
  /// assignment's traffic model (balance::AttentionTraffic) uses these × 4 bytes.
  static double query_row_floats(std::int64_t hq, std::int64_t hd) { return 6.0 * hq * hd + 2.0 * hq; }
  static double key_row_floats(std::int64_t hkv, std::int64_t hd) { return 6.0 * hkv * hd; }

 private:
  struct Buffers;
  void exchange(const std::vector<int>& send_counts, const std::vector<int>& recv_counts, bool forward_dir);
  /// MPI counts (floats per peer: per_q a query row, per_k a key row) of the
  /// send and receive side of one trip (forward_dir: out, else the return),
  /// its two buffers grown to fit.
  std::pair<std::vector<int>, std::vector<int>> size_exchange(const CaLayout& L, bool forward_dir, std::int64_t per_q,
                                                              std::int64_t per_k);
  /// The bound layout when it moves anything, else nullptr (the local kernel
  /// runs). \throws std::logic_error when T is not the layout's row count.
  const CaLayout* moving_layout(std::int64_t T, const char* fn) const;
  comm::Communicator group_;
  std::int64_t hq_, hkv_, hd_;
  std::shared_ptr<const CaLayout> bound_;
  std::unique_ptr<Buffers> buf_;
  CaStats stats_;
};

}  // namespace wlb::model

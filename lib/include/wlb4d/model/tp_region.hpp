#pragma once
/// \file tp_region.hpp
/// \brief The tensor-parallel regions of a linear layer, entered and left in
/// one place (the roles of Megatron-LM's ColumnParallelLinear /
/// RowParallelLinear and TorchTitan's colwise / rowwise plans).
///
/// A column-parallel GEMM (Wq, Wk, Wv, W_gate, W_up, the vocab-parallel LM
/// head) reads a replicated input and writes this rank's output columns; a
/// row-parallel GEMM (Wo, W_down, and the vocab-parallel embedding, whose
/// rows are partial sums too) writes a partial sum of the full output. The
/// collectives at their edges (Megatron-LM, Shoeybi et al. 2019, §3, Fig. 3;
/// sequence parallelism: Korthikanti et al. 2022, §4.2.2):
///
///   region            forward (no SP / SP)            backward (no SP / SP)
///   enter_column      identity / all-gather (g)       all-reduce (f) / reduce-scatter (ḡ)
///   leave_row         all-reduce (g) / reduce-scatter (ḡ)   identity / all-gather
///
/// Under SP the replicated side holds this rank's rows [t0, t0+Ts) =
/// split_range(T, tp, tp_rank) of a [T][width] tensor (local_rows). Every
/// collective is skipped when the TP communicator has size 1 (and SP is off
/// then). Scalar = float uses the device-aware collectives of
/// comm::Communicator; double (tests) calls MPI on the buffers directly.
///
/// Time: every blocking collective's wall seconds (after a Kokkos::fence) add
/// to comm_seconds(); a nonblocking reduction adds its wait, and the part of
/// its flight beyond the wait to overlapped_seconds(). With a span log set
/// (set_span_log, a traced step), each of those intervals is also appended
/// to it as a core::TimeSpan of core::wall_seconds().
///
/// Errors: what comm::Communicator throws (comm::CommError) on an MPI failure.

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/clock.hpp"
#include "wlb4d/core/types.hpp"

#include <cstdint>
#include <utility>
#include <vector>

namespace wlb::model {

template <class Scalar>
class TpRegion {
 public:
  TpRegion() = default;
  /// \param tp    tensor-parallel communicator
  /// \param sequence_parallel parallel.sequence_parallel; ignored when tp.size() == 1
  /// \param width columns of every [T][width] tensor that crosses a region edge (d_model)
  TpRegion(comm::Communicator tp, bool sequence_parallel, std::int64_t width)
      : tp_(std::move(tp)), sp_(sequence_parallel && tp_.size() > 1), width_(width) {}

  bool sequence_parallel() const { return sp_; }
  /// More than one TP rank: the region edges communicate.
  bool parallel() const { return tp_.size() > 1; }
  /// Rows (offset, count) of a T-token tensor this rank holds on the
  /// replicated side: split_range(T, tp, tp_rank) under SP, else (0, T).
  std::pair<std::int64_t, std::int64_t> local_rows(std::int64_t T) const;

  /// Forward entry of a column-parallel region: the GEMM input [T][width].
  /// SP: all-gathers this rank's rows `local` into `buf` (room for T·width)
  /// and returns that view; otherwise returns `local` (identity).
  View2<Scalar> enter_column(const View2<Scalar>& local, std::int64_t T, Scalar* buf) const;
  /// Backward of enter_column: sums the input gradient `dx` ([T][width],
  /// partial per rank) over TP. SP: reduce-scatter into this rank's rows
  /// `dx_local`; otherwise an all-reduce of `dx` in place (dx_local is dx).
  void enter_column_backward(const View2<Scalar>& dx, std::int64_t T, const View2<Scalar>& dx_local) const;
  /// enter_column_backward, nonblocking (the fused backward's dW GEMMs run
  /// while it is in flight); finish() waits. Needs parallel().
  comm::Request start_enter_column_backward(const View2<Scalar>& dx, std::int64_t T,
                                            const View2<Scalar>& dx_local) const;
  /// Waits for a started reduction and books its exposed and overlapped seconds.
  void finish(comm::Request& r) const;

  /// Where a row-parallel GEMM writes its partial output: SP `buf` viewed as
  /// [T][width] (full T before the reduce-scatter), otherwise `out` itself.
  View2<Scalar> row_partial(const View2<Scalar>& out, std::int64_t T, Scalar* buf) const;
  /// Forward exit of a row-parallel region: sums `partial` (from
  /// row_partial) over TP into `out`. SP: reduce-scatter into this rank's
  /// rows; otherwise an all-reduce of out in place.
  void leave_row(const View2<Scalar>& partial, std::int64_t T, const View2<Scalar>& out) const;
  /// Backward of leave_row: the gradient of the partial output [T][width].
  /// SP: all-gathers this rank's rows `dout` into `buf`; otherwise `dout`.
  View2<Scalar> leave_row_backward(const View2<Scalar>& dout, std::int64_t T, Scalar* buf) const;

  /// Sum over TP in place (partial gradients of TP-replicated weights); no-op on one rank.
  void allreduce(const View2<Scalar>& x) const;

  /// Wall seconds in TP collectives since the last reset (see the file comment).
  double comm_seconds() const { return comm_seconds_; }
  double overlapped_seconds() const { return overlapped_seconds_; }
  void reset_seconds() { comm_seconds_ = overlapped_seconds_ = 0; }
  /// Appends every collective's exposed interval to `log` from now on
  /// (nullptr: off, the default). The caller keeps `log` alive until it
  /// sets nullptr again.
  void set_span_log(std::vector<core::TimeSpan>* log) { spans_ = log; }

 private:
  void book(double t0, double t1) const {  // one blocking interval: seconds and span log
    comm_seconds_ += t1 - t0;
    if (spans_) spans_->push_back({t0, t1});
  }
  View2<Scalar> allgather(const View2<Scalar>& local, std::int64_t T, Scalar* buf) const;
  void reduce_scatter(const View2<Scalar>& full, std::int64_t T, const View2<Scalar>& local) const;
  void counts(std::int64_t T) const;  // fills counts_/displs_ (elements) for T tokens

  comm::Communicator tp_;
  bool sp_ = false;
  std::int64_t width_ = 0;
  mutable std::vector<int> counts_, displs_;
  mutable double comm_seconds_ = 0;
  mutable double overlapped_seconds_ = 0;
  std::vector<core::TimeSpan>* spans_ = nullptr;
};

}  // namespace wlb::model

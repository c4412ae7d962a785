#pragma once
/// \file optimizer.hpp
/// \brief The optimizer step of one rank (DESIGN §2 step 6): gradient
/// reduction over DP×CP, the global gradient norm, the NaN/inf check, clipping
/// and AdamW over this rank's model chunks, with the AdamW moments it owns.
///
/// One entry point per phase, called by the trainer in this order every step:
/// reduce_gradients() (collective over grid.dpcp()), then step() (collective
/// over grid.dpcp(), grid.tp() and grid.pp()).
///
/// ZeRO-1 (parallel.zero = 1; Rajbhandari et al., "ZeRO: Memory Optimizations
/// Toward Training Trillion Parameter Models", SC'20, stage P_os; laid out as
/// Megatron-LM's distributed optimizer): the AdamW moments are sharded over
/// the DP×CP gradient group G (size |G| = dp·cp, rank g = dp_rank·cp +
/// cp_rank) in contiguous ranges of each chunk's flat parameter buffer: rank g
/// owns elements zero_range(N_c, |G|, g) = model::split_range(N_c, |G|, g) of
/// chunk c (N_c = chunk->local_numel()), so a range may start or end inside a
/// tensor. reduce_gradients() reduce-scatters the gradients into a receive
/// buffer of the owned range and copies the sums into the owned range of
/// grads() (only that range is the reduced sum afterwards; the rest keeps
/// this rank's local sum until the next zero_grad()), step() updates the
/// owned range and all-gathers the parameters in place, so every replica
/// again holds the same values. Memory: the moments take 2·4·N_c/|G| bytes
/// instead of 2·4·N_c, plus the 4·N_c/|G|-byte receive buffer ("grad_shard").
/// Not in place because MPICH's in-place reduce-scatter aborts on the uneven
/// counts of a bucket (comm::Communicator::reduce_scatterv explains).
///
/// Global norm: ‖g‖ = sqrt(Σ over every parameter element of g²), each element
/// counted once: tensors replicated over TP (norm weights) only on tp rank 0,
/// stage sums added over PP; with zero = 0 the DP×CP replicas hold the same
/// reduced gradient and are not summed; with zero = 1 each replica sums its
/// owned range and the sums are added over DP×CP (every element once: the
/// ranges tile the buffer; llm.c PR #524 is the known failure of counting
/// shards |G| times or not at all). The gradients are the sums over
/// micro-batches already scaled by 1 / (target tokens of the step), so ‖g‖ is
/// the norm of the gradient of the token-level mean loss (DESIGN §3).
///
/// Bucketed reduction (comm.bucket_mib > 0; the buckets of PyTorch DDP,
/// bucket_cap_mb = 25, and Megatron-LM's overlap_grad_reduce, whose
/// default is max(4e7, 1e6·dp) parameters): each chunk's flat gradient
/// buffer is cut into buckets of about bucket_mib MiB, whole tensors, taken
/// in reverse registry order (the order the backward finishes them: head
/// first, embedding last), so bucket k of a chunk is [begin_k, end_k) with
/// end_0 = N_c and begin_k = end_{k+1}. When the executor reports that
/// elements [from, N_c) of a chunk hold their final value of the step
/// (grads_ready, called during the chunk's last W or fused backward), every
/// bucket lying wholly in that range is started nonblocking: an in-place
/// all-reduce, or under ZeRO-1 a reduce-scatter of the bucket with
/// per-rank counts |[begin_k, end_k) ∩ zero_range(g)| (a ZeRO range may cut
/// through a bucket, or hold none of it). reduce_gradients() starts what is
/// left and waits for all. Every group rank starts the same buckets in the
/// same order (the same action list and layers), as MPI's collective order
/// requires. Each element is the same sum of the same dp·cp addends as the
/// unbucketed reduction; only the collective's internal order may differ
/// with its size (bit-identical on a group of 2).
///
/// Tied embeddings (model.tie_embeddings) on pp > 1: the first stage holds
/// embed.weight and the last stage a replica (model::Param::tied_replica)
/// used as the LM head. Each computes a partial gradient; reduce_gradients()
/// first sums the two over the embedding group (the pp ranks 0 and P-1 of
/// one (dp, cp, tp) coordinate; Megatron-LM's embedding group, Narayanan et
/// al. SC'21 §3.2 fn.), then reduces over DP×CP as usual, so both copies
/// take the same update and stay bit-identical. A bucket holding the tensor
/// is therefore never started early by grads_ready(). The replica is left
/// out of the global norm (each element counted once).
///
/// bf16 reduction (comm.grad_reduce_dtype = bf16, zero = 0 only): after the
/// backward each chunk's fp32 gradient sum (micro-batches accumulated in
/// fp32) is rounded to bf16 (round to nearest even) into a 2-byte buffer,
/// all-reduced with comm::Communicator::allreduce_bf16_sum (each pairwise sum
/// in fp32, then rounded: half the bytes of the fp32 all-reduce) and widened
/// back into the fp32 gradient, on which norm, clipping and AdamW run in
/// fp32. One reduction after the backward (no buckets). Error: relative
/// ≈ 2^-8 per element per rounding (the ranks' addends, then each sum), the
/// bf16 noise of the GEMM gradients themselves. The option halves DP×CP
/// bytes where the network is the limit (Megatron-LM's --grad-reduce-in-bf16;
/// the default stays fp32).

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/types.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/model/params.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

namespace wlb::optim {

/// What one update did (identical on every rank).
struct UpdateResult {
  double grad_norm = 0;    ///< global L2 norm before clipping
  double clip_factor = 1;  ///< min(1, grad_clip / grad_norm); 1 when clipping is off
  double lr = 0;           ///< learning rate used (optim::lr_at)
  bool skipped = false;    ///< the update was skipped (step()'s `skip` said so): weights and moments unchanged
};

class Optimizer {
 public:
  /// \param chunks this rank's parameter registries (one per local virtual
  ///        stage); they must outlive the Optimizer. Allocates one fp32 m and
  ///        v per chunk, flat like chunk->values() (elements), zero.
  /// \param total_steps train.steps (the LR schedule's length).
  /// \param zero  ZeRO stage (parallel.zero): 0 replicated moments, 1 moments
  ///        sharded over grid.dpcp() (see the file comment). On a group of one
  ///        both are the same computation.
  /// \throws core::ConfigError if zero is not 0 or 1, or a shard holds 2^31
  ///        elements or more (the collectives count in int).
  /// \param bucket_mib comm.bucket_mib: bucket size (MiB of fp32 gradient,
  ///        >= 0; 0: one blocking reduction per chunk in reduce_gradients()).
  /// \param bf16_reduce comm.grad_reduce_dtype = bf16 (see the file comment;
  ///        ignores bucket_mib). \throws core::ConfigError with zero = 1.
  Optimizer(const core::OptimConfig& cfg, int total_steps, const grid::ProcessGrid& grid,
            std::vector<model::ParamRegistry<float>*> chunks, int zero = 0, double bucket_mib = 0,
            bool bf16_reduce = false);

  /// Elements [from, N_c) of chunk c's gradient buffer are final for this
  /// step: starts every not yet started bucket of chunk c that lies wholly in
  /// that range (nonblocking, collective over grid.dpcp()). A no-op without
  /// buckets or on a group of one. Call it with the same arguments in the
  /// same order on every rank of grid.dpcp().
  void grads_ready(std::size_t c, std::int64_t from);
  /// Tests the outstanding bucket reductions (MPI progress; never blocks).
  void progress();
  /// Buckets of chunk c as [begin, end) element ranges, in start order.
  std::vector<std::pair<std::int64_t, std::int64_t>> buckets(std::size_t c) const;

  /// DP×CP gradient communication of the last reduce_gradients() (wall
  /// seconds): in_flight = the union of the intervals from each reduction's
  /// start to its observed completion, exposed = the time reduce_gradients()
  /// and progress() spent waiting (exposed <= in_flight; without buckets
  /// both are the blocking reduction's time).
  double dp_in_flight_seconds() const { return dp_in_flight_s_; }
  double dp_exposed_seconds() const { return dp_exposed_s_; }

  /// Sums every chunk's gradients over the DP×CP group (each replica holds
  /// partial sums of its own tokens): an all-reduce (zero = 0) or an in-place
  /// reduce-scatter onto the owned ranges (zero = 1). Collective over
  /// grid.dpcp(); a no-op on a group of one. With buckets: starts the
  /// buckets grads_ready() has not started and waits for every bucket.
  void reduce_gradients();

  /// Global gradient norm, NaN/inf check, clip and AdamW of optimizer step
  /// `step` (0-based; bias correction uses step + 1). Collective over
  /// grid.tp() and grid.pp().
  /// \param loss the step's token-level loss (already reduced): checked for
  ///        NaN/inf together with the norm.
  /// \throws core::NumericsError naming the step (step + 1: counted from 1,
  ///         as on the progress lines) and, where a gradient is
  ///         non-finite, the first such tensor on this rank ("gradient of
  ///         layers.0.attn.wq"; under zero = 1, within the owned range), else
  ///         "the loss" or "the global gradient norm".
  /// \param skip when given, asked with the norm, clip factor and lr once
  ///        they are known (after the NaN/inf check): true skips the update
  ///        (no AdamW, no parameter all-gather; the result has skipped set).
  ///        It must answer the same on every rank (the loss-spike guard
  ///        agrees over the world first).
  UpdateResult step(std::int64_t step, double loss, const std::function<bool(const UpdateResult&)>& skip = {});

  /// Global L2 norm of the current gradients (collective over tp and pp, and
  /// over dpcp under zero = 1). Call after reduce_gradients().
  double global_grad_norm() const;

  /// AdamW first and second moments, one flat fp32 View per chunk: the whole
  /// chunk (zero = 0) or the owned range [shard_begin(c), +extent) (zero = 1).
  /// The checkpoint stores them at global shape (train::CheckpointState
  /// gathers the ranges).
  const std::vector<Vec>& exp_avg() const { return m_; }
  const std::vector<Vec>& exp_avg_sq() const { return v_; }
  /// ZeRO stage in use (0 or 1).
  int zero() const { return zero_; }
  /// First element of chunk c's owned range (0 under zero = 0).
  std::int64_t shard_begin(std::size_t c) const { return shards_[c].begin; }

 private:
  /// Chunk c's owned range and the partition of the chunk over the group.
  struct Shard {
    std::int64_t begin = 0, end = 0;  ///< owned flat range [begin, end) (elements)
    std::vector<int> counts, displs;  ///< per group rank (elements), for the collectives
  };
  /// Calls f(param, lo, hi) for every parameter's part [lo, hi) (chunk-flat
  /// elements) inside chunk c's owned range, in registry order.
  template <class F> void for_each_owned(std::size_t c, F&& f) const;
  void check_finite(std::int64_t step, double loss, double gnorm) const;
  void apply_adamw(std::int64_t step, double lr, double grad_scale);
  void allgather_parameters() const;

  /// One bucket of a chunk: [begin, end) and, under ZeRO-1, its per-rank counts.
  struct Bucket {
    std::int64_t begin = 0, end = 0;
    std::vector<int> counts;
  };
  void start_bucket(std::size_t c, std::size_t k);

  std::vector<std::vector<Bucket>> buckets_;  // per chunk, in start order (reverse layout)
  std::vector<std::size_t> next_bucket_;      // per chunk: buckets started this step
  std::vector<comm::Request> inflight_;
  double dp_in_flight_s_ = 0, dp_exposed_s_ = 0;
  bool bf16_reduce_ = false;
  View1<std::uint16_t> red16_;       // bf16 reduction: the largest chunk's gradient in bf16 bits
  HostView1<std::uint16_t> red16_h_;  // its host copy where MPI cannot read MemSpace
  core::OptimConfig cfg_;
  int total_steps_ = 0;
  const grid::ProcessGrid& grid_;
  std::vector<model::ParamRegistry<float>*> chunks_;
  int zero_ = 0;
  std::vector<Shard> shards_;
  std::vector<Vec> m_, v_;
  std::vector<Vec> grad_shard_;  // ZeRO-1 on |G| > 1: the reduce-scatter's receive buffer (owned range)
  /// ZeRO-1: copies the reduced sums from grad_shard_ into the owned range of grads().
  void take_reduced_shards();
  /// Tied embeddings on pp > 1: sums embed.weight's gradient over embed_group_.
  void sum_tied_embedding_grads();
  std::optional<comm::Communicator> embed_group_;  // pp ranks 0 and P-1 (tied embeddings, pp > 1)
  const model::Param<float>* tied_ = nullptr;      // this rank's embed.weight when it is in embed_group_
  std::size_t tied_chunk_ = 0;
  bool tied_summed_ = false;  // this step's sum is done: the tied bucket may start
};

}  // namespace wlb::optim

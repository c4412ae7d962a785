#pragma once
/// \file checkpoint_state.hpp
/// \brief The adapter from this rank's model chunks
/// (model::ParamRegistry<float>, one per local virtual stage) and their AdamW
/// moments to the neutral io::TensorRef list that io::save_checkpoint() and
/// io::load_checkpoint() take. It lives in train, above both: io knows files
/// and tensors, not layers (tests/unit/arch forbids io -> model).
///
/// The full model list (every parameter of every pipeline stage, in the
/// registry's fixed order) is obtained WITHOUT allocating the full model: each
/// rank's chunk descriptions (name, global shape, shard_dim) are all-gathered
/// over grid.pp() and the chunks ordered by their first parameter
/// (embed.weight first, then by first layer index; params.hpp guarantees each
/// chunk is a contiguous run of the fixed order). Collective over grid.pp()
/// (construct on every rank together).
///
/// Writers: the rank with dp = 0 and cp = 0 writes its TP shard; for
/// TP-replicated tensors (norm weights) only tp = 0 of those (one writer per
/// element, DESIGN §3).
///
/// Staging: values and moments live in MemSpace; the adapter keeps host
/// mirrors (the same memory on a host backend, so pull()/push() cost nothing
/// there). Call pull() before save_checkpoint() and push() after
/// load_checkpoint().
///
/// Errors: \throws core::CheckpointError if m/v do not match the chunks'
/// sizes, or the gathered lists are inconsistent (a parameter held by two
/// stages).

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/types.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/io/checkpoint.hpp"
#include "wlb4d/model/params.hpp"

namespace wlb::train {

class CheckpointState {
 public:
  /// \param chunks this rank's registries (local virtual stages, any order).
  /// \param m, v   AdamW moments per chunk, flat like chunk->values() (same
  ///               length); may be empty vectors when no optimizer state
  ///               exists (then load skips the moments and save refuses).
  /// \param zero_group ZeRO-1 (optim::Optimizer with parallel.zero = 1): the
  ///               group the moments are sharded over (grid.dpcp()); m[c] and
  ///               v[c] then hold only this rank's range
  ///               model::split_range(N_c, |G|, g) of chunk c (N_c elements,
  ///               g = zero_group->rank()). The checkpoint still holds the
  ///               moments at global shape: pull() all-gathers them into host
  ///               staging buffers of the whole chunk (transient: 2·4·N_c
  ///               bytes of host memory from pull() to release(), or from
  ///               prepare_load() to push()). nullptr or a group of one: m and
  ///               v are whole and no staging exists.
  CheckpointState(const grid::ProcessGrid& grid, const std::vector<const model::ParamRegistry<float>*>& chunks,
                  const std::vector<Vec>& m, const std::vector<Vec>& v, const comm::Communicator* zero_group = nullptr);

  /// The full model's tensors, this rank's shards filled in (pointers into
  /// the host mirrors; under ZeRO-1 the moment pointers are null while no
  /// staging exists).
  const std::vector<io::TensorRef>& tensors() const { return tensors_; }

  /// Device -> host mirrors (before save_checkpoint). Under ZeRO-1 also
  /// allocates the staging and all-gathers the moments over the group
  /// (collective over zero_group); call release() after the save.
  void pull();
  /// Under ZeRO-1: allocates the staging that load_checkpoint() reads the
  /// whole moments into (call before it; push() frees it). Else a no-op.
  void prepare_load();
  /// Host mirrors -> device (after load_checkpoint); under ZeRO-1 each rank
  /// keeps its own range of the loaded moments and the staging is freed.
  void push();
  /// Copies the host values (only) into the model: checkpoint.init_from,
  /// which loads weights and keeps the fresh optimizer state.
  void push_values();
  /// Frees the ZeRO-1 staging (after save_checkpoint). Else a no-op.
  void release();

  /// Device -> host mirrors of the values only (before gather_tensor()).
  void pull_values();
  /// The whole fp32 tensor `name` (row-major, global shape) on world rank
  /// `root`, assembled from the shards of its writers (one writer per element,
  /// the checkpoint's rule; a tied-embedding replica is not one); other ranks
  /// get an empty vector. Collective over `world`: every rank calls it with
  /// the same names in the same order. Peak memory on root: one tensor.
  /// \throws core::InternalError for a name outside tensors().
  std::vector<float> gather_tensor(const std::string& name, const comm::Communicator& world, int root) const;

 private:
  using HostVec = Kokkos::View<float*, Kokkos::HostSpace>;
  struct Shard {
    std::int64_t begin = 0,
                 count = 0;           ///< this rank's range of the chunk (elements)
    std::vector<int> counts, displs;  ///< the partition over the group
  };
  struct Entry {
    std::string name;
    std::vector<std::int64_t> shape;
    int shard_dim = -1;
  };

  static std::string describe(const model::ParamRegistry<float>& reg);
  /// -1 for the chunk holding embed.weight, else its first layer index
  /// (INT_MAX if it has no layer: cannot happen, validate_shard forbids it).
  static long long order_key(const std::vector<Entry>& chunk);
  /// ZeRO-1 staging: whole-chunk host buffers for the moments.
  void stage();
  /// (Re)points every held tensor's m/v into the moment mirrors (null when
  /// none).
  void point_moments();
  /// The full model list: chunk descriptions all-gathered over grid.pp(),
  /// ordered by first parameter; this rank's shards filled in.
  void build(const grid::ProcessGrid& grid);

  std::vector<const model::ParamRegistry<float>*> chunks_;
  std::vector<Vec> m_, v_;
  const comm::Communicator* zero_ = nullptr;  ///< ZeRO-1 group (size > 1), else nullptr
  bool moments_ = false;
  std::vector<Shard> shards_;  ///< per chunk (ZeRO-1 only)
  std::vector<typename Vec::HostMirror> hv_;
  std::vector<HostVec> hm_,
      hvv_;                                                 ///< moment mirrors (ZeRO-1: the staging, when allocated)
  std::vector<std::pair<std::size_t, std::size_t>> where_;  ///< per tensor: (chunk, flat offset) if held
  std::vector<io::TensorRef> tensors_;
};

}  // namespace wlb::train

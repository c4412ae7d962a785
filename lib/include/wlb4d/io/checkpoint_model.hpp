#pragma once
/// \file checkpoint_model.hpp
/// \brief Header-only adapter from this rank's model chunks
/// (model::ParamRegistry<float>, one per local virtual stage) and their AdamW
/// moments to the neutral io::TensorRef list that save_checkpoint() and
/// load_checkpoint() take. Header-only on purpose: wlb4d_io does not link
/// wlb4d_model; whoever includes this (the trainer, tests) links both.
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

#include "wlb4d/core/error.hpp"
#include "wlb4d/core/types.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/io/checkpoint.hpp"
#include "wlb4d/model/params.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace wlb::io {

class ModelCheckpointState {
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
  ModelCheckpointState(const grid::ProcessGrid& grid, const std::vector<const model::ParamRegistry<float>*>& chunks,
                       const std::vector<Vec>& m, const std::vector<Vec>& v,
                       const comm::Communicator* zero_group = nullptr)
      : chunks_(chunks), m_(m), v_(v), zero_(zero_group && zero_group->size() > 1 ? zero_group : nullptr) {
    const bool moments = !m.empty() || !v.empty();
    if (moments && (m.size() != chunks.size() || v.size() != chunks.size()))
      throw core::CheckpointError("ModelCheckpointState: " + std::to_string(chunks.size()) + " chunks but " +
                                  std::to_string(m.size()) + " m and " + std::to_string(v.size()) + " v moments");
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const auto numel = chunks[c]->local_numel();
      std::size_t n = std::size_t(numel);
      if (zero_) {
        Shard sh;
        for (int r = 0; r < zero_->size(); ++r) {
          const auto [off, cnt] = model::split_range(numel, zero_->size(), r);
          sh.counts.push_back(int(cnt));
          sh.displs.push_back(int(off));
          if (r == zero_->rank()) sh.begin = off, sh.count = cnt;
        }
        n = std::size_t(sh.count);
        shards_.push_back(std::move(sh));
      }
      if (moments && (m[c].extent(0) != n || v[c].extent(0) != n))
        throw core::CheckpointError("ModelCheckpointState: chunk " + std::to_string(c) + " has " + std::to_string(n) +
                                    " values" + (zero_ ? " in this rank's ZeRO-1 range" : "") +
                                    " but its moments have " + std::to_string(m[c].extent(0)) + " / " +
                                    std::to_string(v[c].extent(0)) + " elements");
      hv_.push_back(Kokkos::create_mirror_view(chunks[c]->values()));
      if (moments && !zero_) {
        hm_.push_back(Kokkos::create_mirror_view(m[c]));
        hvv_.push_back(Kokkos::create_mirror_view(v[c]));
      }
    }
    moments_ = moments;
    build(grid);
    point_moments();
  }

  /// The full model's tensors, this rank's shards filled in (pointers into
  /// the host mirrors; under ZeRO-1 the moment pointers are null while no
  /// staging exists).
  const std::vector<TensorRef>& tensors() const { return tensors_; }

  /// Device -> host mirrors (before save_checkpoint). Under ZeRO-1 also
  /// allocates the staging and all-gathers the moments over the group
  /// (collective over zero_group); call release() after the save.
  void pull() {
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      Kokkos::deep_copy(hv_[c], chunks_[c]->values());
      if (!moments_) continue;
      if (!zero_) {
        Kokkos::deep_copy(hm_[c], m_[c]);
        Kokkos::deep_copy(hvv_[c], v_[c]);
      }
    }
    if (!moments_ || !zero_) return;
    stage();
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const auto& sh = shards_[c];
      const auto own_m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m_[c]);
      const auto own_v = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v_[c]);
      zero_->allgatherv(own_m.data(), std::size_t(sh.count), hm_[c].data(), sh.counts, sh.displs);
      zero_->allgatherv(own_v.data(), std::size_t(sh.count), hvv_[c].data(), sh.counts, sh.displs);
    }
  }
  /// Under ZeRO-1: allocates the staging that load_checkpoint() reads the
  /// whole moments into (call before it; push() frees it). Else a no-op.
  void prepare_load() {
    if (moments_ && zero_) stage();
  }
  /// Host mirrors -> device (after load_checkpoint); under ZeRO-1 each rank
  /// keeps its own range of the loaded moments and the staging is freed.
  void push() {
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      Kokkos::deep_copy(chunks_[c]->values(), hv_[c]);
      if (!moments_ || hm_.empty()) continue;
      if (!zero_) {
        Kokkos::deep_copy(m_[c], hm_[c]);
        Kokkos::deep_copy(v_[c], hvv_[c]);
      } else {
        const auto r = std::make_pair(std::size_t(shards_[c].begin), std::size_t(shards_[c].begin + shards_[c].count));
        Kokkos::deep_copy(m_[c], Kokkos::subview(hm_[c], r));
        Kokkos::deep_copy(v_[c], Kokkos::subview(hvv_[c], r));
      }
    }
    release();
  }
  /// Frees the ZeRO-1 staging (after save_checkpoint). Else a no-op.
  void release() {
    if (!zero_) return;
    hm_.clear();
    hvv_.clear();
    point_moments();
  }

 private:
  using HostVec = Kokkos::View<float*, Kokkos::HostSpace>;
  struct Shard {
    std::int64_t begin = 0, count = 0;  ///< this rank's range of the chunk (elements)
    std::vector<int> counts, displs;    ///< the partition over the group
  };
  struct Entry {
    std::string name;
    std::vector<std::int64_t> shape;
    int shard_dim = -1;
  };

  static std::string describe(const model::ParamRegistry<float>& reg) {
    std::ostringstream o;
    o << "C\n";
    for (const auto& p : reg) {
      o << p.name << ' ' << p.shard_dim << ' ' << p.global_shape.size();
      for (auto e : p.global_shape) o << ' ' << e;
      o << '\n';
    }
    return o.str();
  }

  /// -1 for the chunk holding embed.weight, else its first layer index
  /// (INT_MAX if it has no layer: cannot happen, validate_shard forbids it).
  static long long order_key(const std::vector<Entry>& chunk) {
    if (chunk.empty()) return LLONG_MAX;
    const std::string& n = chunk.front().name;
    if (n == "embed.weight") return -1;
    if (n.rfind("layers.", 0) == 0) return std::stoll(n.substr(7, n.find('.', 7) - 7));
    return LLONG_MAX;
  }

  /// ZeRO-1 staging: whole-chunk host buffers for the moments.
  void stage() {
    if (!hm_.empty()) return;
    for (const auto* c : chunks_) {
      hm_.push_back(HostVec(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ckpt_stage_m"), c->local_numel()));
      hvv_.push_back(HostVec(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ckpt_stage_v"), c->local_numel()));
    }
    point_moments();
  }
  /// (Re)points every held tensor's m/v into the moment mirrors (null when none).
  void point_moments() {
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto [c, off] = where_[i];
      const bool have = tensors_[i].held && !hm_.empty();
      tensors_[i].m = have ? hm_[c].data() + off : nullptr;
      tensors_[i].v = have ? hvv_[c].data() + off : nullptr;
    }
  }

  void build(const grid::ProcessGrid& grid) {
    std::string mine;
    for (const auto* c : chunks_) mine += describe(*c);
    const auto& pp = grid.pp();
    std::vector<int> counts(std::size_t(pp.size()), 0), displs(std::size_t(pp.size()), 0);
    const int len = int(mine.size());
    pp.allgather(&len, counts.data(), 1);
    int total = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      displs[r] = total;
      total += counts[r];
    }
    std::string all(std::size_t(total), '\0');
    pp.allgatherv(mine.data(), mine.size(), all.data(), counts, displs);

    std::vector<std::vector<Entry>> gathered;
    std::istringstream in(all);
    std::string line;
    while (std::getline(in, line)) {
      if (line == "C") {
        gathered.emplace_back();
        continue;
      }
      std::istringstream ls(line);
      Entry e;
      std::size_t rank = 0;
      ls >> e.name >> e.shard_dim >> rank;
      e.shape.resize(rank);
      for (auto& x : e.shape) ls >> x;
      gathered.back().push_back(std::move(e));
    }
    std::stable_sort(gathered.begin(), gathered.end(),
                     [](const auto& a, const auto& b) { return order_key(a) < order_key(b); });

    std::map<std::string, std::pair<std::size_t, const model::Param<float>*>> local;
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      for (const auto& p : *chunks_[c]) local[p.name] = {c, &p};
    std::map<std::string, int> seen;
    const bool replica0 = grid.dp_rank() == 0 && grid.cp_rank() == 0;
    for (const auto& chunk : gathered)
      for (const auto& e : chunk) {
        if (seen[e.name]++)
          throw core::CheckpointError("ModelCheckpointState: parameter " + e.name +
                                      " is held by two pipeline chunks of one model replica");
        TensorRef t;
        t.name = e.name;
        t.global_shape = e.shape;
        t.shard_dim = e.shard_dim;
        const auto it = local.find(e.name);
        if (it != local.end()) {
          const auto c = it->second.first;
          const auto& p = *it->second.second;
          t.held = true;
          t.writer = replica0 && (!p.tp_replicated || grid.tp_rank() == 0);
          t.start.assign(p.global_shape.size(), 0);
          if (p.shard_dim >= 0) t.start[std::size_t(p.shard_dim)] = p.shard_offset;
          t.count = p.local_shape;
          t.value = hv_[c].data() + p.offset;
          where_.emplace_back(c, p.offset);
        } else {
          where_.emplace_back(0, 0);
        }
        tensors_.push_back(std::move(t));
      }
  }

  std::vector<const model::ParamRegistry<float>*> chunks_;
  std::vector<Vec> m_, v_;
  const comm::Communicator* zero_ = nullptr;  ///< ZeRO-1 group (size > 1), else nullptr
  bool moments_ = false;
  std::vector<Shard> shards_;                 ///< per chunk (ZeRO-1 only)
  std::vector<typename Vec::HostMirror> hv_;
  std::vector<HostVec> hm_, hvv_;              ///< moment mirrors (ZeRO-1: the staging, when allocated)
  std::vector<std::pair<std::size_t, std::size_t>> where_;  ///< per tensor: (chunk, flat offset) if held
  std::vector<TensorRef> tensors_;
};

}  // namespace wlb::io

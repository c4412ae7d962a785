// The model chunks' checkpoint view. See checkpoint_state.hpp.
#include "wlb4d/train/checkpoint_state.hpp"

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>
#include <utility>

#include "wlb4d/core/error.hpp"

namespace wlb::train {

using io::TensorRef;

CheckpointState::CheckpointState(const grid::ProcessGrid& grid,
                                 const std::vector<const model::ParamRegistry<float>*>& chunks,
                                 const std::vector<Vec>& m, const std::vector<Vec>& v,
                                 const comm::Communicator* zero_group)
    : chunks_(chunks), m_(m), v_(v), zero_(zero_group && zero_group->size() > 1 ? zero_group : nullptr) {
  const bool moments = !m.empty() || !v.empty();
  if (moments && (m.size() != chunks.size() || v.size() != chunks.size()))
    throw core::CheckpointError("checkpoint state: " + std::to_string(chunks.size()) + " chunks but " +
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
      throw core::CheckpointError("checkpoint state: chunk " + std::to_string(c) + " has " + std::to_string(n) +
                                  " values" + (zero_ ? " in this rank's ZeRO-1 range" : "") + " but its moments have " +
                                  std::to_string(m[c].extent(0)) + " / " + std::to_string(v[c].extent(0)) +
                                  " elements");
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

void CheckpointState::pull() {
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

void CheckpointState::pull_values() {
  for (std::size_t c = 0; c < chunks_.size(); ++c) Kokkos::deep_copy(hv_[c], chunks_[c]->values());
}

std::vector<float> CheckpointState::gather_tensor(const std::string& name, const comm::Communicator& world,
                                                  int root) const {
  const auto it = std::find_if(tensors_.begin(), tensors_.end(), [&](const io::TensorRef& t) { return t.name == name; });
  if (it == tensors_.end()) throw core::InternalError("gather_tensor: no tensor " + name);
  const io::TensorRef& t = *it;
  const int me = world.rank(), n = world.size();
  std::vector<int> writes(std::size_t(n), 0);
  const int mine = t.writer ? 1 : 0;
  world.allgather(&mine, writes.data(), 1);
  // A slab: 2-D start and count (a vector is one row), then its values.
  const auto slab = [&](std::vector<std::int64_t>& hdr) {
    hdr = t.global_shape.size() == 1 ? std::vector<std::int64_t>{0, t.start[0], 1, t.count[0]}
                                     : std::vector<std::int64_t>{t.start[0], t.start[1], t.count[0], t.count[1]};
  };
  constexpr int kTag = 7301;
  if (me != root) {
    if (t.writer) {
      std::vector<std::int64_t> hdr;
      slab(hdr);
      world.send(hdr.data(), 4, root, kTag);
      world.send(t.value, std::size_t(hdr[2] * hdr[3]), root, kTag + 1);
    }
    return {};
  }
  const std::int64_t cols = t.global_shape.back(), rows = t.global_shape.size() == 1 ? 1 : t.global_shape[0];
  std::vector<float> full(std::size_t(rows * cols), 0.0f), buf;
  const auto place = [&](const std::vector<std::int64_t>& hdr, const float* src) {
    for (std::int64_t r = 0; r < hdr[2]; ++r)
      std::copy(src + r * hdr[3], src + (r + 1) * hdr[3], full.begin() + (hdr[0] + r) * cols + hdr[1]);
  };
  for (int r = 0; r < n; ++r) {
    if (!writes[std::size_t(r)]) continue;
    std::vector<std::int64_t> hdr(4);
    if (r == me) {
      slab(hdr);
      place(hdr, t.value);
      continue;
    }
    world.recv(hdr.data(), 4, r, kTag);
    buf.resize(std::size_t(hdr[2] * hdr[3]));
    world.recv(buf.data(), buf.size(), r, kTag + 1);
    place(hdr, buf.data());
  }
  return full;
}

void CheckpointState::prepare_load() {
  if (moments_ && zero_) stage();
}

void CheckpointState::push() {
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

void CheckpointState::push_values() {
  for (std::size_t c = 0; c < chunks_.size(); ++c) Kokkos::deep_copy(chunks_[c]->values(), hv_[c]);
}

void CheckpointState::release() {
  if (!zero_) return;
  hm_.clear();
  hvv_.clear();
  point_moments();
}

std::string CheckpointState::describe(const model::ParamRegistry<float>& reg) {
  std::ostringstream o;
  o << "C\n";
  for (const auto& p : reg) {
    if (p.tied_replica) continue;  // listed once, in the first stage's chunk
    o << p.name << ' ' << p.shard_dim << ' ' << p.global_shape.size();
    for (auto e : p.global_shape) o << ' ' << e;
    o << '\n';
  }
  return o.str();
}

long long CheckpointState::order_key(const std::vector<Entry>& chunk) {
  if (chunk.empty()) return LLONG_MAX;
  const std::string& n = chunk.front().name;
  if (n == "embed.weight") return -1;
  if (n.rfind("layers.", 0) == 0) return std::stoll(n.substr(7, n.find('.', 7) - 7));
  return LLONG_MAX;
}

void CheckpointState::stage() {
  if (!hm_.empty()) return;
  for (const auto* c : chunks_) {
    hm_.push_back(HostVec(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ckpt_stage_m"), c->local_numel()));
    hvv_.push_back(HostVec(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ckpt_stage_v"), c->local_numel()));
  }
  point_moments();
}

void CheckpointState::point_moments() {
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const auto [c, off] = where_[i];
    const bool have = tensors_[i].held && !hm_.empty();
    tensors_[i].m = have ? hm_[c].data() + off : nullptr;
    tensors_[i].v = have ? hvv_[c].data() + off : nullptr;
  }
}

void CheckpointState::build(const grid::ProcessGrid& grid) {
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
        throw core::CheckpointError("checkpoint state: parameter " + e.name +
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
        // A tied-embedding replica (last stage) reads the tensor but never
        // writes it: the first stage is its one writer.
        t.writer = replica0 && (!p.tp_replicated || grid.tp_rank() == 0) && !p.tied_replica;
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

}  // namespace wlb::train

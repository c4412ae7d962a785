// Pipeline executor + context-parallel K/V exchange. See executor.hpp.
#include "wlb4d/train/executor.hpp"

#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/core/clock.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/pipeline/schedule.hpp"
#include "wlb4d/train/batch.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace wlb::train {

namespace {
using core::wall_seconds;
double now() { return wall_seconds(); }

// Model buffers are host memory (Serial/OpenMP Kokkos): MPI sends them directly.
constexpr bool kHostBuffers = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;

// CPU seconds of compute: process CPU time minus what communication used.
double compute_cpu_now() { return core::process_cpu_seconds() - comm::comm_cpu_seconds(); }

// Grow-only device int vector filled from a host vector.
void upload(IntVec& dst, const std::vector<std::int32_t>& src) {
  if (dst.extent(0) < src.size() || dst.extent(0) == 0)
    dst = IntVec(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mb_int"), std::max<std::size_t>(1, src.size()));
  auto h = Kokkos::create_mirror_view(dst);
  std::copy(src.begin(), src.end(), h.data());
  Kokkos::deep_copy(dst, h);
}

template <class V> V grow(V v, std::int64_t rows, std::int64_t cols, const char* label) {
  if (std::int64_t(v.extent(0)) < rows || std::int64_t(v.extent(1)) != cols)
    v = V(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), std::max<std::int64_t>(rows, 1), cols);
  return v;
}
}  // namespace

/// K/V exchange over the CP group for the micro-batch bound with bind().
/// Gathered keys are permuted into packed micro-batch order so kv_lo/kv_hi
/// (which are in that order) index them directly.
class CpKvExchange final : public model::KvExchange<float> {
 public:
  CpKvExchange(comm::Communicator cp, std::int64_t cap, std::int64_t hkv, std::int64_t hd)
      : cp_(std::move(cp)), width_(hkv * hd) {
    for (auto* b : {&kg_, &vg_, &dkg_, &dvg_, &tmp_}) *b = View3<float>("cp_kv", cap, hkv, hd);
  }
  /// counts[r]: tokens of CP rank r; gathered_global[q]: packed index of the
  /// q-th gathered token (ranks concatenated in order).
  void bind(const std::vector<std::int64_t>& counts, const IntVec& gathered_global, std::int64_t total) {
    counts_.assign(counts.size(), 0);
    displs_.assign(counts.size(), 0);
    int acc = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      counts_[r] = int(counts[r] * width_);
      displs_[r] = acc;
      acc += counts_[r];
    }
    perm_ = gathered_global;
    total_ = total;
  }
  std::pair<View3<float>, View3<float>> gather(int, int, const View3<float>& k, const View3<float>& v) override {
    const double t0 = now();
    const std::size_t mine = std::size_t(counts_[std::size_t(cp_.rank())]);
    for (auto pr : {std::make_pair(k, kg_), std::make_pair(v, vg_)}) {
      Kokkos::fence();
      cp_.allgatherv_device(pr.first.data(), mine, tmp_.data(), counts_, displs_);
      permute(tmp_, pr.second, /*to_packed=*/true);
    }
    Kokkos::fence();
    seconds += now() - t0;
    return {sub(kg_), sub(vg_)};
  }
  std::pair<View3<float>, View3<float>> grad_buffers(int, int, const View3<float>&, const View3<float>&) override {
    return {sub(dkg_), sub(dvg_)};
  }
  void reduce_scatter(int, int, const View3<float>& dk_all, const View3<float>& dv_all, const View3<float>& dk,
                      const View3<float>& dv) override {
    const double t0 = now();
    for (auto pr : {std::make_pair(dk_all, dk), std::make_pair(dv_all, dv)}) {
      permute(pr.first, tmp_, /*to_packed=*/false);
      Kokkos::fence();
      cp_.reduce_scatterv_device(tmp_.data(), pr.second.data(), counts_);
    }
    Kokkos::fence();
    seconds += now() - t0;
  }
  double seconds = 0;  ///< time spent in CP communication (and its permutes)

 private:
  View3<float> sub(const View3<float>& b) const {
    return Kokkos::subview(b, std::pair<std::int64_t, std::int64_t>(0, total_), Kokkos::ALL, Kokkos::ALL);
  }
  // to_packed: dst[perm[q]] = src[q]; else dst[q] = src[perm[q]].
  void permute(const View3<float>& src, const View3<float>& dst, bool to_packed) const {
    const auto perm = perm_;
    const std::int64_t w = width_;
    float* s = src.data();
    float* d = dst.data();
    Kokkos::parallel_for(
        "wlb::train::cp_permute", Kokkos::RangePolicy<ExecSpace>(0, total_), KOKKOS_LAMBDA(const std::int64_t q) {
          const std::int64_t g = perm(q);
          const std::int64_t from = to_packed ? q : g, to = to_packed ? g : q;
          for (std::int64_t j = 0; j < w; ++j) d[to * w + j] = s[from * w + j];
        });
  }
  comm::Communicator cp_;
  std::int64_t width_ = 0;
  View3<float> kg_, vg_, dkg_, dvg_, tmp_;
  std::vector<int> counts_, displs_;
  IntVec perm_;
  std::int64_t total_ = 0;
};

/// Everything staged for the current set of micro-batches.
struct Executor::Loaded {
  std::vector<model::MicroBatchInput> inputs;            // per mb (device, grow-only)
  std::vector<std::vector<std::int64_t>> cp_counts;      // per mb, per CP rank
  std::vector<IntVec> cp_perm;                           // per mb: gathered -> packed index
  std::vector<std::int64_t> mb_tokens;                   // per mb, whole micro-batch
  std::size_t count = 0;                                 // micro-batches loaded
  // p2p buffers [vs][mb] (grow-only)
  std::vector<std::vector<View2<float>>> recv_act, recv_grad, send_grad;
  std::vector<std::vector<View2<float>>> out_act;         // forward outputs awaiting SendAct
};

Executor::Executor(const core::Config& cfg, const grid::ProcessGrid& grid, std::int64_t vocab)
    : cfg_(cfg), grid_(grid), loaded_(std::make_unique<Loaded>()) {
  cap_ = std::max<std::int64_t>(cfg.train.max_seq_len, cfg.balance.max_tokens);
  const int p = grid.pp_size(), v = cfg.parallel.virtual_stages;
  const int m = cfg.train.micro_batches / grid.dp_size();
  const auto kind = pipeline::parse_schedule_kind(cfg.parallel.schedule);
  // In 1F1B at most p - r micro-batches are in flight on rank r, and they are
  // consecutive, so slot = mb mod (p - r) never collides. Other schedules keep
  // up to all m forwards pending.
  slots_ = (kind == pipeline::ScheduleKind::OneFOneB) ? std::min(m, p - grid.pp_rank()) : m;
  slots_ = std::max(slots_, 1);
  for (int vs = 0; vs < v; ++vs) {
    const auto lr = pipeline::stage_layers(cfg.model.layers, p, v, grid.pp_rank(), vs);
    model::ModelShard sh;
    sh.layer_begin = lr.begin;
    sh.layer_end = lr.end;
    sh.embedding = (pipeline::global_chunk(grid.pp_rank(), vs, p) == 0);
    sh.head = (pipeline::global_chunk(grid.pp_rank(), vs, p) == p * v - 1);
    sh.tp_rank = grid.tp_rank();
    sh.tp_size = grid.tp_size();
    chunks_.push_back(std::make_unique<model::Transformer<float>>(cfg.model, vocab, sh, grid.tp(), slots_, cap_));
    chunks_.back()->params().init_parameters(cfg.train.seed);
  }
  if (grid.cp_size() > 1) {
    const std::int64_t hkv_l = cfg.model.kv_heads / grid.tp_size();
    kvx_ = std::make_shared<CpKvExchange>(grid.cp(), cap_, hkv_l, cfg.model.head_dim());
    for (auto& c : chunks_) c->set_kv_exchange(kvx_);
  }
}

Executor::~Executor() = default;

void Executor::load(const data::TokenDataset& ds, const std::vector<balance::MicroBatch>& mbs,
                    const std::vector<balance::Sharding>& sharding) {
  auto& L = *loaded_;
  const int cp = grid_.cp_size();
  L.count = mbs.size();
  if (L.inputs.size() < mbs.size()) {
    L.inputs.resize(mbs.size());
    L.cp_counts.resize(mbs.size());
    L.cp_perm.resize(mbs.size());
    L.mb_tokens.resize(mbs.size());
  }
  local_tokens_ = 0;
  for (std::size_t i = 0; i < mbs.size(); ++i) {
    if (mbs[i].tokens() > cap_)
      throw std::logic_error("micro-batch of " + std::to_string(mbs[i].tokens()) + " tokens exceeds the capacity " +
                             std::to_string(cap_));
    HostBatch hb;
    if (cp == 1) {
      hb = build_batch(ds, mbs[i]);
      L.cp_counts[i] = {hb.size()};
    } else {
      const auto shards = balance::shard_tokens(mbs[i], cp, sharding.at(i));
      hb = build_batch(ds, mbs[i], shards[std::size_t(grid_.cp_rank())]);
      L.cp_counts[i].clear();
      std::vector<std::int32_t> perm;
      for (const auto& s : shards) {
        L.cp_counts[i].push_back(std::int64_t(s.size()));
        for (auto g : s) perm.push_back(std::int32_t(g));
      }
      upload(L.cp_perm[i], perm);
    }
    L.mb_tokens[i] = mbs[i].tokens();
    auto& in = L.inputs[i];
    in.tokens = hb.size();
    in.target_tokens = hb.target_tokens;
    in.attention_pairs = 0;
    for (std::size_t t = 0; t < hb.kv_lo.size(); ++t) in.attention_pairs += hb.kv_hi[t] - hb.kv_lo[t] + 1;
    upload(in.token_ids, hb.tokens);
    upload(in.labels, hb.labels);
    upload(in.positions, hb.positions);
    upload(in.kv_lo, hb.kv_lo);
    upload(in.kv_hi, hb.kv_hi);
    local_tokens_ += hb.size();
  }
}

double Executor::run(bool backward, double grad_scale, io::TimingRecord& rec) {
  auto& L = *loaded_;
  const int p = grid_.pp_size(), v = cfg_.parallel.virtual_stages;
  const int m = int(L.count);
  if (m == 0) return 0.0;
  const std::int64_t d = cfg_.model.d_model;
  auto kind = pipeline::parse_schedule_kind(cfg_.parallel.schedule);
  // Evaluation rounds may hold fewer micro-batches than training (the last
  // one), and interleaved needs m % pp == 0: run forwards breadth-first then
  // (same looped placement; interleaved keeps one slot per micro-batch).
  if (!backward && kind == pipeline::ScheduleKind::Interleaved && m % p != 0)
    kind = pipeline::ScheduleKind::BreadthFirst;
  std::vector<pipeline::Action> actions = pipeline::build_schedule(kind, grid_.pp_rank(), p, m, v);
  if (!backward) {
    // A consistent projection of the global event order stays deadlock-free.
    actions.erase(std::remove_if(actions.begin(), actions.end(),
                                 [](const pipeline::Action& a) {
                                   return a.type == pipeline::ActionType::Backward ||
                                          a.type == pipeline::ActionType::SendGrad ||
                                          a.type == pipeline::ActionType::RecvGrad;
                                 }),
                  actions.end());
  }
  for (auto* b : {&L.recv_act, &L.recv_grad, &L.send_grad, &L.out_act}) {
    b->resize(std::size_t(v));
    for (auto& row : *b) row.resize(std::size_t(std::max<int>(m, int(row.size()))));
  }
  const auto& pp = grid_.pp();
  double loss = 0;
  if (kvx_) kvx_->seconds = 0;
  auto bind = [&](int mb) {
    if (kvx_) kvx_->bind(L.cp_counts[std::size_t(mb)], L.cp_perm[std::size_t(mb)], L.mb_tokens[std::size_t(mb)]);
  };
  for (const auto& a : actions) {
    const std::size_t vs = std::size_t(a.virtual_stage), mb = std::size_t(a.micro_batch);
    auto& in = L.inputs[mb];
    const std::int64_t T = in.tokens;
    auto& chunk = *chunks_[vs];
    const int slot = a.micro_batch % slots_;
    double t0 = 0, c0 = 0;
    switch (a.type) {
      case pipeline::ActionType::Forward: {
        Kokkos::fence();
        t0 = now();
        c0 = compute_cpu_now();
        bind(a.micro_batch);
        auto out = chunk.forward(slot, in, L.recv_act[vs][mb]);
        if (chunk.stage().head) loss += out.loss;
        L.out_act[vs][mb] = out.hidden;
        // pp = 1 with virtual stages: the next chunk is on this rank and the
        // schedule has no message for the hand-off (out.hidden stays valid
        // until this slot's next forward, after the consumer has copied it).
        if (p == 1 && !chunk.stage().head) L.recv_act[vs + 1][mb] = out.hidden;
        if (!backward) chunk.discard(slot);
        Kokkos::fence();
        rec.time[io::kForward] += now() - t0;
        rec.compute_cpu += compute_cpu_now() - c0;
        break;
      }
      case pipeline::ActionType::Backward: {
        Kokkos::fence();
        t0 = now();
        c0 = compute_cpu_now();
        bind(a.micro_batch);
        auto gin = chunk.backward(slot, in, L.recv_grad[vs][mb], grad_scale);
        if (!chunk.stage().embedding) {
          auto& buf = L.send_grad[vs][mb] = grow(L.send_grad[vs][mb], T, d, "pp_send_grad");
          Kokkos::deep_copy(Kokkos::subview(buf, std::pair<std::int64_t, std::int64_t>(0, T), Kokkos::ALL),
                            Kokkos::subview(gin, std::pair<std::int64_t, std::int64_t>(0, T), Kokkos::ALL));
          if (p == 1) L.recv_grad[vs - 1][mb] = buf;  // local hand-off to the previous chunk
        }
        Kokkos::fence();
        rec.time[io::kBackward] += now() - t0;
        rec.compute_cpu += compute_cpu_now() - c0;
        break;
      }
      case pipeline::ActionType::SendAct:
      case pipeline::ActionType::SendGrad: {
        t0 = now();
        const auto& buf = a.type == pipeline::ActionType::SendAct ? L.out_act[vs][mb] : L.send_grad[vs][mb];
        Kokkos::fence();
        const int tag = pipeline::p2p_tag(a, grid_.pp_rank(), p);
        if constexpr (kHostBuffers) {
          pp.send(buf.data(), std::size_t(T * d), a.peer, tag);
        } else {  // MPI on host memory: stage through a host buffer (NCCL p2p matches by order, not tag)
          auto h = staging(T * d);
          Kokkos::deep_copy(h, View1<float>(buf.data(), std::size_t(T * d)));
          pp.send(h.data(), std::size_t(T * d), a.peer, tag);
        }
        rec.time[io::kP2PWait] += now() - t0;
        break;
      }
      case pipeline::ActionType::RecvAct:
      case pipeline::ActionType::RecvGrad: {
        t0 = now();
        auto& buf = a.type == pipeline::ActionType::RecvAct ? L.recv_act[vs][mb] : L.recv_grad[vs][mb];
        buf = grow(buf, T, d, "pp_recv");
        const int tag = pipeline::p2p_tag(a, grid_.pp_rank(), p);
        if constexpr (kHostBuffers) {
          pp.recv(buf.data(), std::size_t(T * d), a.peer, tag);
        } else {
          auto h = staging(T * d);
          pp.recv(h.data(), std::size_t(T * d), a.peer, tag);
          Kokkos::deep_copy(View1<float>(buf.data(), std::size_t(T * d)), h);
        }
        rec.time[io::kP2PWait] += now() - t0;
        break;
      }
    }
  }
  // TP and CP communication happen inside forward/backward: report them in
  // their own categories and the compute without them.
  double tp_s = 0;
  for (auto& c : chunks_) {
    tp_s += c->tp_comm_seconds();
    c->reset_tp_comm_seconds();
  }
  if (tp_s > 0) {
    rec.time[io::kTPComm] += tp_s;
    const double f = rec.time[io::kForward] + rec.time[io::kBackward];
    if (f > 0) {
      const double share = rec.time[io::kForward] / f;
      rec.time[io::kForward] -= tp_s * share;
      rec.time[io::kBackward] -= tp_s * (1 - share);
    }
  }
  if (kvx_) {
    rec.time[io::kCPComm] += kvx_->seconds;
    // CP time was measured inside forward/backward: report compute without it.
    const double f = rec.time[io::kForward] + rec.time[io::kBackward];
    if (f > 0) {
      const double share = rec.time[io::kForward] / f;
      rec.time[io::kForward] -= kvx_->seconds * share;
      rec.time[io::kBackward] -= kvx_->seconds * (1 - share);
    }
  }
  return loss;
}

}  // namespace wlb::train

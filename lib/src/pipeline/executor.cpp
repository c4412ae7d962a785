// Pipeline executor. See executor.hpp.
#include "wlb4d/pipeline/executor.hpp"

#include "wlb4d/balance/attention_tasks.hpp"
#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/clock.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/fault.hpp"
#include "wlb4d/core/profiling.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/model/attention.hpp"
#include "wlb4d/pipeline/memory_model.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <string>

namespace wlb::pipeline {

namespace {
using core::wall_seconds;

// Model buffers are host memory (Serial/OpenMP Kokkos): MPI sends them directly.
constexpr bool kHostBuffers = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;

// CPU seconds of compute: process CPU time minus what communication used.
double compute_cpu_now() { return core::process_cpu_seconds() - comm::comm_cpu_seconds(); }

template <class V> V grow(V v, std::int64_t rows, std::int64_t cols, const char* label) {
  if (std::int64_t(v.extent(0)) < rows || std::int64_t(v.extent(1)) != cols)
    v = V(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), std::max<std::int64_t>(rows, 1), cols);
  return v;
}

/// Kokkos Tools region of an action (core::ProfileRegion): constant names,
/// so an untraced step builds no string.
const char* region_name(ActionType t) {
  switch (t) {
    case ActionType::Forward: return "wlb4d:F";
    case ActionType::Backward: return "wlb4d:B";
    case ActionType::Weight: return "wlb4d:W";
    case ActionType::SendAct: return "wlb4d:SendAct";
    case ActionType::RecvAct: return "wlb4d:RecvAct";
    case ActionType::SendGrad: return "wlb4d:SendGrad";
    case ActionType::RecvGrad: return "wlb4d:RecvGrad";
  }
  return "wlb4d:action";
}

View2<float> first_rows(const View2<float>& b, std::int64_t n) {
  return Kokkos::subview(b, std::pair<std::int64_t, std::int64_t>(0, n), Kokkos::ALL);
}

/// Times one compute action: wall seconds into `wall`, compute CPU into `cpu`.
template <class F> void timed_compute(double& wall, double& cpu, F&& f) {
  Kokkos::fence();
  const double t0 = wall_seconds(), c0 = compute_cpu_now();
  f();
  Kokkos::fence();
  wall += wall_seconds() - t0;
  cpu += compute_cpu_now() - c0;
}
}  // namespace

model::HostMicroBatch read_micro_batch(const data::TokenDataset& ds, const balance::MicroBatch& mb,
                                       const std::vector<std::int64_t>* local) {
  std::vector<token_t> ids(std::size_t(mb.tokens()));
  std::vector<std::int64_t> cu{0};
  std::vector<std::uint8_t> mask(ds.has_loss_mask() ? ids.size() : 0);
  for (const auto& s : mb.spans) {
    if (s.length < 1 || s.offset < 0 || s.offset + s.length > ds.doc_length(s.doc_id))
      throw core::DataError("step plan span (doc " + std::to_string(s.doc_id) + ", offset " +
                            std::to_string(s.offset) + ", length " + std::to_string(s.length) +
                            ") lies outside the document in '" + ds.path() + "'");
    ds.read(s.doc_id, s.offset, s.length, ids.data() + cu.back());
    if (!mask.empty()) ds.read_loss_mask(s.doc_id, s.offset, s.length, mask.data() + cu.back());
    cu.push_back(cu.back() + s.length);
  }
  return model::build_host_micro_batch(cu, ids, local, mask.empty() ? nullptr : &mask);
}

/// Everything staged for the current set of micro-batches.
struct Executor::Loaded {
  std::vector<model::MicroBatchInput> inputs;        // per mb (device, grow-only)
  std::vector<std::vector<std::int64_t>> cp_counts;  // per mb, per CP rank
  std::vector<IntVec> cp_perm;                       // per mb: gathered -> packed index
  std::vector<std::int64_t> mb_tokens;               // per mb, whole micro-batch
  std::size_t count = 0;                             // micro-batches loaded
  // p2p buffers [vs][mb] (grow-only)
  std::vector<std::vector<View2<float>>> recv_act, recv_grad, send_grad;
  std::vector<std::vector<View2<float>>> out_act;  // forward outputs awaiting SendAct
  double loss_sum = 0;                             // of the current run
};

Executor::Executor(const core::Config& cfg, const grid::ProcessGrid& grid, std::int64_t vocab)
    : cfg_(cfg), grid_(grid), loaded_(std::make_unique<Loaded>()) {
  cap_ = std::max<std::int64_t>(cfg.train.max_seq_len, cfg.balance.max_tokens);
  const int p = grid.pp_size(), v = cfg.parallel.virtual_stages;
  const int m = cfg.train.micro_batches / grid.dp_size();
  // Workspace slots: the most micro-batches held on one chunk in this rank's
  // own action list, from its forward to its W (memory_model.hpp), so the
  // memory model and the allocation agree. B and W run apart under ZB-H1 (W
  // delayed, stashes for recomputed layers) and without recompute (W after
  // B's send: the previous stage gets its gradient sooner, at no memory);
  // with recompute the other schedules run the fused backward at B, since a
  // stage-level W would need every recomputed layer's operands stashed.
  core::ParallelConfig par = cfg.parallel;
  par.pp = p;
  slots_ = micro_batches_in_flight(par, grid.pp_rank(), std::max(m, 1));
  split_w_ = parse_schedule_kind(cfg.parallel.schedule) == ScheduleKind::ZeroBubbleH1 || cfg.model.recompute == "none";
  wslots_ = split_w_ ? std::max(weight_stashes(par, grid.pp_rank(), std::max(m, 1)), 1) : 0;
  for (int vs = 0; vs < v; ++vs) {
    const auto lr = stage_layers(cfg.model.layers, p, v, grid.pp_rank(), vs);
    model::ModelShard sh;
    sh.layer_begin = lr.begin;
    sh.layer_end = lr.end;
    sh.embedding = (global_chunk(grid.pp_rank(), vs, p) == 0);
    sh.head = (global_chunk(grid.pp_rank(), vs, p) == p * v - 1);
    sh.tp_rank = grid.tp_rank();
    sh.tp_size = grid.tp_size();
    chunks_.push_back(std::make_unique<model::Transformer<float>>(cfg.model, vocab, sh, grid.tp(), slots_, cap_,
                                                                  cfg.parallel.sequence_parallel, wslots_,
                                                                  cfg.train.precision == "bf16"));
    chunks_.back()->params().init_parameters(cfg.train.seed);
  }
  if (grid.cp_size() > 1) {
    const std::int64_t hkv_l = cfg.model.kv_heads / grid.tp_size();
    kvx_ = std::make_shared<model::CpKvExchange>(grid.cp(), cap_, hkv_l, cfg.model.head_dim());
    for (auto& c : chunks_) c->set_kv_exchange(kvx_);
  }
}

Executor::~Executor() = default;

void Executor::set_grad_hooks(GradHooks h) {
  hooks_ = std::move(h);
  for (std::size_t vs = 0; vs < chunks_.size(); ++vs) {
    if (!hooks_.ready) {
      chunks_[vs]->set_grads_ready_hook({});
      continue;
    }
    chunks_[vs]->set_grads_ready_hook([this, vs](std::int64_t from) {
      if (armed_ == int(vs)) hooks_.ready(vs, from);
    });
  }
}

void Executor::load(const data::TokenDataset& ds, const std::vector<balance::MicroBatch>& mbs,
                    const std::vector<balance::Sharding>& sharding, const balance::StepPlan* plan) {
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
  local_targets_ = 0;
  for (std::size_t i = 0; i < mbs.size(); ++i) {
    if (mbs[i].tokens() > cap_)
      throw core::InternalError("micro-batch of " + std::to_string(mbs[i].tokens()) +
                                " tokens exceeds the executor's capacity " + std::to_string(cap_));
    model::HostMicroBatch hb;
    if (cp == 1) {
      hb = read_micro_batch(ds, mbs[i]);
      L.cp_counts[i] = {hb.size()};
    } else {
      const auto shards = balance::shard_tokens(mbs[i], cp, sharding.at(i));
      hb = read_micro_batch(ds, mbs[i], &shards[std::size_t(grid_.cp_rank())]);
      L.cp_counts[i].clear();
      std::vector<std::int32_t> perm;
      for (const auto& s : shards) {
        L.cp_counts[i].push_back(std::int64_t(s.size()));
        for (auto g : s) perm.push_back(std::int32_t(g));
      }
      model::upload_ints(L.cp_perm[i], perm, "cp_perm");
    }
    L.mb_tokens[i] = mbs[i].tokens();
    model::upload_micro_batch(L.inputs[i], hb);
    local_tokens_ += hb.size();
    local_targets_ += hb.target_tokens;
  }
  ca_bound_ = 0;
  ca_plan_stats_ = AttentionStats{};
  if (cax_ && plan) {
    plan_attention(*plan);
    ca_bound_ = L.count;
  }
}

void Executor::enable_disaggregated_attention(const balance::CostModel& cost) {
  const auto& g = grid_.dpcp();
  if (g.size() <= 1) return;
  // A communicator of its own: the exchanges never interleave with the
  // gradient buckets (comm.bucket_mib) started on DP×CP during the backward.
  auto group = g.split(0, g.rank());
  if (!group) throw core::InternalError("attention group: communicator split gave no communicator");
  group->set_name("attention group (DP×CP)");
  // split() does not carry the device backend over: with NCCL on DP×CP the
  // exchange gets its own NCCL communicator (device to device, no staging).
  if (g.has_device()) group->attach_device(g.device()->make_for(*group));
  const std::int64_t hq = cfg_.model.heads / grid_.tp_size(), hkv = cfg_.model.kv_heads / grid_.tp_size();
  cax_ = std::make_shared<model::CoreAttentionExchange>(*group, hq, hkv, cfg_.model.head_dim());
  ca_cost_ = std::make_unique<balance::CostModel>(cost);
  // Tasks are cut at, and padded to, the query tile of this build's kernel
  // (64 on the host, 32 on CUDA) rather than the cost model's 128 of
  // FlashAttention on Hopper: that is the granularity the exchange runs at.
  ca_cost_->tile = model::attention_tiles<float>(int(cfg_.model.head_dim())).queries;
  for (auto& c : chunks_) c->set_core_attention(cax_);
}

model::CaStats Executor::take_attention_exchange_stats() {
  if (!cax_) return {};
  const model::CaStats s = cax_->stats();
  cax_->reset_stats();
  return s;
}

void Executor::plan_attention(const balance::StepPlan& plan) {
  auto& L = *loaded_;
  const int cp = grid_.cp_size(), dp = grid_.dp_size(), G = dp * cp;
  const int me = grid_.dp_rank() * cp + grid_.cp_rank();  // DP×CP rank (process_grid.cpp's split key)
  const std::int64_t hq = cfg_.model.heads / grid_.tp_size(), hkv = cfg_.model.kv_heads / grid_.tp_size();
  const std::int64_t hd = cfg_.model.head_dim();
  // The exchange sends K/V to every destination (also a CP peer of the same
  // replica), so each rank is its own "replica" for the traffic model.
  const balance::AttentionTraffic traffic{4.0 * model::CoreAttentionExchange::query_row_floats(hq, hd),
                                          4.0 * model::CoreAttentionExchange::key_row_floats(hkv, hd)};
  std::vector<int> self(static_cast<std::size_t>(G));
  for (int r = 0; r < G; ++r) self[std::size_t(r)] = r;
  while (ca_layouts_.size() < L.count) ca_layouts_.push_back(model::CoreAttentionExchange::make_layout());
  ca_plan_stats_ = AttentionStats{};
  for (std::size_t j = 0; j < L.count; ++j) {
    std::vector<std::vector<balance::Piece>> pieces(static_cast<std::size_t>(G));
    for (int d = 0; d < dp; ++d) {
      const auto& mb = plan.micro_batches.at(std::size_t(d)).at(j);
      const auto sh = plan.sharding.at(std::size_t(d)).at(j);
      auto ps = balance::shard_pieces(mb, cp, sh);
      for (int c = 0; c < cp; ++c) pieces[std::size_t(d * cp + c)] = std::move(ps[std::size_t(c)]);
    }
    const auto tasks = balance::make_attention_tasks(pieces, self, *ca_cost_, cfg_.balance.ca_task_tokens);
    const auto a = balance::assign_attention_tasks(tasks, G, self, traffic, cfg_.balance.ca_tolerance);
    std::vector<model::CaMove> moves;
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      const auto& t = tasks[i];
      if (a.owner[i] == t.home) continue;
      model::CaMove m;
      m.home = t.home;
      m.dest = a.owner[i];
      m.q_row = t.row;
      m.rows = t.length;
      m.key_begin = t.key_begin();
      m.prefix = t.prefix;
      m.span = t.span;
      moves.push_back(m);
    }
    cax_->prepare(moves, L.inputs[j].tokens, *ca_layouts_[j]);
    auto& st = ca_plan_stats_;
    st.cost_before += a.cost_before[std::size_t(me)];
    st.cost_after += a.cost_after[std::size_t(me)];
    st.group_max_before += *std::max_element(a.cost_before.begin(), a.cost_before.end());
    st.group_max_after += *std::max_element(a.cost_after.begin(), a.cost_after.end());
    double sum = 0;
    for (double c : a.cost_before) sum += c;
    st.group_mean += sum / double(G);
    st.moved += a.moved;
  }
}

std::vector<Action> Executor::action_list(bool backward) const {
  core::ParallelConfig par = cfg_.parallel;
  par.pp = grid_.pp_size();
  return training_action_list(par, grid_.pp_rank(), int(loaded_->count), backward);
}

std::int64_t Executor::hidden_rows(std::size_t mb) const {
  return chunks_.front()->residual_rows(loaded_->inputs[mb].tokens).second;
}

void Executor::bind_cp(int mb) {
  const auto& L = *loaded_;
  if (kvx_) kvx_->bind(L.cp_counts[std::size_t(mb)], L.cp_perm[std::size_t(mb)], L.mb_tokens[std::size_t(mb)]);
  if (cax_) cax_->bind(std::size_t(mb) < ca_bound_ ? ca_layouts_[std::size_t(mb)] : nullptr);
}

void Executor::forward(const Action& a, bool backward, RunStats& st) {
  auto& L = *loaded_;
  const std::size_t vs = std::size_t(a.virtual_stage), mb = std::size_t(a.micro_batch);
  auto& chunk = *chunks_[vs];
  const int slot = a.micro_batch % slots_;
  timed_compute(st.forward_s, st.compute_cpu_s, [&] {
    core::fault_point("forward");  // tests only (WLB4D_FAULT; a delay here is a slow device)
    bind_cp(a.micro_batch);
    auto out = chunk.forward(slot, L.inputs[mb], L.recv_act[vs][mb]);
    if (chunk.stage().head) L.loss_sum += out.loss;
    L.out_act[vs][mb] = out.hidden;
    // pp = 1 with virtual stages: the next chunk is on this rank and the
    // schedule has no message for the hand-off (out.hidden stays valid
    // until this slot's next forward, after the consumer has copied it).
    if (grid_.pp_size() == 1 && !chunk.stage().head) L.recv_act[vs + 1][mb] = out.hidden;
    if (!backward) chunk.discard(slot);
  });
}

void Executor::backward(const Action& a, double grad_scale, RunStats& st) {
  auto& L = *loaded_;
  const std::size_t vs = std::size_t(a.virtual_stage), mb = std::size_t(a.micro_batch);
  auto& chunk = *chunks_[vs];
  const std::int64_t T = hidden_rows(mb), d = cfg_.model.d_model;
  timed_compute(st.backward_s, st.compute_cpu_s, [&] {
    core::fault_point("backward");  // tests only (WLB4D_FAULT; a delay here is a slow device)
    bind_cp(a.micro_batch);
    auto gin = split_w_ ? chunk.backward_input(a.micro_batch % slots_, a.micro_batch % wslots_, L.inputs[mb],
                                               L.recv_grad[vs][mb], grad_scale)
                        : chunk.backward(a.micro_batch % slots_, L.inputs[mb], L.recv_grad[vs][mb], grad_scale);
    if (chunk.stage().embedding) return;
    auto& buf = L.send_grad[vs][mb] = grow(L.send_grad[vs][mb], T, d, "pp_send_grad");
    Kokkos::deep_copy(first_rows(buf, T), first_rows(gin, T));
    if (grid_.pp_size() == 1) L.recv_grad[vs - 1][mb] = buf;  // local hand-off to the previous chunk
  });
}

void Executor::weight(const Action& a, RunStats& st) {
  if (!split_w_) return;  // the fused backward ran this W inside B
  auto& chunk = *chunks_[std::size_t(a.virtual_stage)];
  // W is backward compute (its TP gathers under SP are split off as TP time).
  timed_compute(st.backward_s, st.compute_cpu_s,
                [&] { chunk.backward_weight(a.micro_batch % slots_, a.micro_batch % wslots_); });
}

HostView1<float> Executor::staging(std::int64_t n) {
  if (std::int64_t(pp_host_.extent(0)) < n)
    pp_host_ = HostView1<float>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pp_host"), n);
  return Kokkos::subview(pp_host_, std::pair<std::int64_t, std::int64_t>(0, n));
}

void Executor::send(const Action& a, RunStats& st) {
  auto& L = *loaded_;
  const std::size_t vs = std::size_t(a.virtual_stage), mb = std::size_t(a.micro_batch);
  const std::size_t n = std::size_t(hidden_rows(mb) * cfg_.model.d_model);
  const double t0 = wall_seconds();
  const auto& buf = a.type == ActionType::SendAct ? L.out_act[vs][mb] : L.send_grad[vs][mb];
  if (n > 0 && buf.data() == nullptr)
    throw core::InternalError("pipeline: " + to_string(a) + " before the buffer it sends was produced");
  Kokkos::fence();
  const int tag = p2p_tag(a, grid_.pp_rank(), grid_.pp_size());
  if (grid_.pp().has_device()) {
    // A device backend (NCCL) matches messages between two stages by posting
    // order, not by tag. That is safe for every schedule: the action lists
    // are projections of one global sequence of send/recv pairs
    // (pipeline/schedule.hpp), so between two stages the sender's sends and
    // the receiver's receives come in the same order, and blocking
    // (rendezvous) point-to-point cannot deadlock.
    if (n > 0) grid_.pp().send_device(buf.data(), n, a.peer, tag);
  } else if constexpr (kHostBuffers) {
    grid_.pp().send(buf.data(), n, a.peer, tag);
  } else {
    // Device buffers without a device backend (comm.backend=mpi on a CUDA
    // build): MPICH is not CUDA-aware, so stage through a host buffer.
    auto h = staging(std::int64_t(n));
    Kokkos::deep_copy(h, View1<float>(buf.data(), n));
    grid_.pp().send(h.data(), n, a.peer, tag);
  }
  st.p2p_s += wall_seconds() - t0;
}

void Executor::receive(const Action& a, RunStats& st) {
  auto& L = *loaded_;
  const std::size_t vs = std::size_t(a.virtual_stage), mb = std::size_t(a.micro_batch);
  const std::int64_t T = hidden_rows(mb), d = cfg_.model.d_model;
  const std::size_t n = std::size_t(T * d);
  const double t0 = wall_seconds();
  auto& buf = a.type == ActionType::RecvAct ? L.recv_act[vs][mb] : L.recv_grad[vs][mb];
  buf = grow(buf, T, d, "pp_recv");
  const int tag = p2p_tag(a, grid_.pp_rank(), grid_.pp_size());
  if (grid_.pp().has_device()) {
    // Order matching, as in send(); both stages know the size (hidden_rows),
    // so both skip an empty message alike.
    if (n > 0) grid_.pp().recv_device(buf.data(), n, a.peer, tag);
  } else if constexpr (kHostBuffers) {
    grid_.pp().recv(buf.data(), n, a.peer, tag);
  } else {
    auto h = staging(T * d);
    grid_.pp().recv(h.data(), n, a.peer, tag);
    Kokkos::deep_copy(View1<float>(buf.data(), n), h);
  }
  st.p2p_s += wall_seconds() - t0;
}

void Executor::collect_comm_times(RunStats& st) {
  for (auto& c : chunks_) {
    st.tp_comm_s += c->tp_comm_seconds();
    st.tp_overlapped_s += c->tp_overlapped_seconds();
    c->reset_tp_comm_seconds();
  }
  if (kvx_) st.cp_comm_s += kvx_->comm_seconds();
  // TP and CP communication were timed inside forward/backward: report the
  // compute without them, split in proportion to forward and backward time.
  const double comm_s = st.tp_comm_s + st.cp_comm_s, f = st.forward_s + st.backward_s;
  if (comm_s > 0 && f > 0) {
    const double share = st.forward_s / f;
    st.forward_s -= comm_s * share;
    st.backward_s -= comm_s * (1 - share);
  }
}

RunStats Executor::run(bool backward, double grad_scale, bool trace) {
  auto& L = *loaded_;
  RunStats st;
  const int m = int(L.count), v = cfg_.parallel.virtual_stages;
  if (m == 0) return st;
  const std::vector<Action> actions = action_list(backward);
  for (auto* b : {&L.recv_act, &L.recv_grad, &L.send_grad, &L.out_act}) {
    b->resize(std::size_t(v));
    for (auto& row : *b) row.resize(std::size_t(std::max<int>(m, int(row.size()))));
  }
  L.loss_sum = 0;
  if (kvx_) kvx_->reset_comm_seconds();
  if (trace) st.trace.reserve(actions.size());
  // A traced run logs every TP/CP collective's interval (the chunks' and the
  // exchange's span logs, detached again however run() ends).
  std::vector<core::TimeSpan> tp_spans, cp_spans;
  struct SpanLogs {
    Executor& e;
    bool on;
    ~SpanLogs() {
      if (!on) return;
      for (auto& c : e.chunks_) c->set_tp_span_log(nullptr);
      if (e.kvx_) e.kvx_->set_span_log(nullptr);
    }
  } span_logs{*this, trace};
  if (trace) {
    for (auto& c : chunks_) c->set_tp_span_log(&tp_spans);
    if (kvx_) kvx_->set_span_log(&cp_spans);
  }
  // Each chunk's last gradient action: its last W when B and W run apart,
  // else its last (fused) B. After it the chunk's gradients are final.
  std::vector<std::ptrdiff_t> last_grad(std::size_t(v), -1);
  if (backward && hooks_.ready)
    for (std::size_t i = 0; i < actions.size(); ++i)
      if (actions[i].type == (split_w_ ? ActionType::Weight : ActionType::Backward))
        last_grad[std::size_t(actions[i].virtual_stage)] = std::ptrdiff_t(i);
  armed_ = -1;
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const core::ProfileRegion region(region_name(a.type));  // an NVTX range under nvtx-connector
    const double t0 = trace ? wall_seconds() : 0.0;
    const bool last = last_grad[std::size_t(a.virtual_stage)] == std::ptrdiff_t(i);
    if (last) armed_ = a.virtual_stage;
    switch (a.type) {
      case ActionType::Forward: forward(a, backward, st); break;
      case ActionType::Backward: this->backward(a, grad_scale, st); break;
      case ActionType::Weight: weight(a, st); break;
      case ActionType::SendAct:
      case ActionType::SendGrad: send(a, st); break;
      case ActionType::RecvAct:
      case ActionType::RecvGrad: receive(a, st); break;
    }
    if (last) {
      armed_ = -1;
      Kokkos::fence();
      hooks_.ready(std::size_t(a.virtual_stage), 0);
    }
    if (backward && hooks_.progress) hooks_.progress();
    if (trace) {
      st.trace.push_back({a, t0, wall_seconds()});
      for (const auto& [spans, kind] : {std::make_pair(&tp_spans, CommTiming::Tp),
                                        std::make_pair(&cp_spans, CommTiming::Cp)}) {
        for (const auto& x : *spans) st.comm_trace.push_back({kind, a.micro_batch, a.virtual_stage, x.t0, x.t1});
        spans->clear();
      }
    }
  }
  collect_comm_times(st);
  st.loss_sum = L.loss_sum;
  return st;
}

}  // namespace wlb::pipeline

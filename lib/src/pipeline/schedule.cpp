// wlb::pipeline — schedule builders, layer map and the schedule simulator
// (the one schedule implementation: the trainer runs these lists, the planner
// simulates them).
#include "wlb4d/pipeline/schedule.hpp"

#include "wlb4d/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>
#include <utility>

namespace wlb::pipeline {

namespace {

using core::ConfigError;
using core::InternalError;

// ---- data identities ------------------------------------------------------------
// act(mb, c): output activation of global chunk c; grad(mb, c): gradient w.r.t.
// the input of chunk c (output of its backward).
struct Key {
  bool grad = false;
  int mb = 0;
  int c = 0;
  bool operator==(const Key& o) const { return grad == o.grad && mb == o.mb && c == o.c; }
};

struct Geometry {
  int p = 1, m = 1, v = 1;
  int chunks() const { return p * v; }
  int owner(int c) const { return c % p; }
  int local(int c) const { return c / p; }
  int gchunk(int rank, int vs) const { return vs * p + rank; }
  int index(const Key& k) const { return ((k.grad ? 1 : 0) * m + k.mb) * chunks() + k.c; }
  int n_keys() const { return 2 * m * chunks(); }
};

void check_args(int pp_size, int m, int v) {
  if (pp_size < 1) throw ConfigError(fmt::format("pipeline schedule: pp_size={} must be >= 1", pp_size));
  if (m < 1) throw ConfigError(fmt::format("pipeline schedule: num_micro_batches={} must be >= 1", m));
  if (v < 1) throw ConfigError(fmt::format("pipeline schedule: virtual_stages={} must be >= 1", v));
}

/// The per-rank order of Forward/Backward actions of each schedule.
std::vector<Action> compute_order(ScheduleKind kind, int r, int p, int m, int v) {
  std::vector<Action> out;
  out.reserve(static_cast<std::size_t>(2 * m * v));
  auto F = [&](int mb, int vs) { out.push_back({ActionType::Forward, mb, vs, -1}); };
  auto B = [&](int mb, int vs) { out.push_back({ActionType::Backward, mb, vs, -1}); };
  auto W = [&](int mb, int vs) { out.push_back({ActionType::Weight, mb, vs, -1}); };
  switch (kind) {
    case ScheduleKind::GPipe:
      for (int i = 0; i < m; ++i) F(i, 0);
      for (int i = 0; i < m; ++i) B(i, 0);
      break;
    case ScheduleKind::OneFOneB: {
      const int warm = std::min(p - r - 1, m);
      for (int i = 0; i < warm; ++i) F(i, 0);
      for (int i = 0; i < m - warm; ++i) {
        F(warm + i, 0);
        B(i, 0);
      }
      for (int i = m - warm; i < m; ++i) B(i, 0);
      break;
    }
    case ScheduleKind::Interleaved: {
      // Megatron-LM forward_backward_pipelining_with_interleaving.
      const int total = m * v;
      const int warm = (m == p) ? total : std::min((p - r - 1) * 2 + (v - 1) * p, total);
      auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
      auto chunk_of = [&](int k, bool fwd) {
        const int c = (k % (p * v)) / p;
        return fwd ? c : v - 1 - c;
      };
      for (int k = 0; k < warm; ++k) F(mb_of(k), chunk_of(k, true));
      for (int i = 0; i < total - warm; ++i) {
        F(mb_of(warm + i), chunk_of(warm + i, true));
        B(mb_of(i), chunk_of(i, false));
      }
      for (int k = total - warm; k < total; ++k) B(mb_of(k), chunk_of(k, false));
      break;
    }
    case ScheduleKind::BreadthFirst:
      for (int vs = 0; vs < v; ++vs)
        for (int i = 0; i < m; ++i) F(i, vs);
      for (int vs = v - 1; vs >= 0; --vs)
        for (int i = 0; i < m; ++i) B(i, vs);
      break;
    case ScheduleKind::ZeroBubbleH1: {
      // 1F1B's F/B order; W of micro-batch k - r after the k-th B (ZB-H1).
      const int warm = std::min(p - r - 1, m);
      int nb = 0, nw = 0;
      auto BW = [&](int mb) {
        B(mb, 0);
        if (nb++ >= r) W(nw++, 0);
      };
      for (int i = 0; i < warm; ++i) F(i, 0);
      for (int i = 0; i < m - warm; ++i) {
        F(warm + i, 0);
        BW(i);
      }
      for (int i = m - warm; i < m; ++i) BW(i);
      while (nw < m) W(nw++, 0);
      break;
    }
  }
  return out;
}

/// What a message action carries: the data key and the partner rank.
Key message_key(const Action& a, int rank, const Geometry& g) {
  const int c = g.gchunk(rank, a.virtual_stage);
  switch (a.type) {
    case ActionType::SendAct: return {false, a.micro_batch, c};
    case ActionType::RecvAct: return {false, a.micro_batch, c - 1};
    case ActionType::SendGrad: return {true, a.micro_batch, c};
    case ActionType::RecvGrad: return {true, a.micro_batch, c + 1};
    default: break;
  }
  throw InternalError(fmt::format("pipeline: {} is not a message", to_string(a)));
}

bool is_send(ActionType t) { return t == ActionType::SendAct || t == ActionType::SendGrad; }
bool is_recv(ActionType t) { return t == ActionType::RecvAct || t == ActionType::RecvGrad; }

/// Sender-side and receiver-side actions of a message with key k.
Action send_action(const Key& k, const Geometry& g) {
  return {k.grad ? ActionType::SendGrad : ActionType::SendAct, k.mb, g.local(k.c),
          g.owner(k.grad ? k.c - 1 : k.c + 1)};
}
Action recv_action(const Key& k, const Geometry& g) {
  const int consumer = k.grad ? k.c - 1 : k.c + 1;
  return {k.grad ? ActionType::RecvGrad : ActionType::RecvAct, k.mb, g.local(consumer), g.owner(k.c)};
}

/// Builds every rank's list by a joint simulation (see schedule.hpp): compute
/// orders from compute_order(), messages inserted as rendezvous pairs in one
/// global event sequence (uniform times F = 1, B = 2 per chunk).
class ListBuilder {
 public:
  ListBuilder(ScheduleKind kind, int p, int m, int v) : kind_(kind), g_{p, m, v} {
    // Uniform costs of the joint simulation: the fused backward costs 2 (B
    // then W, W inserted afterwards); a split schedule's B and W 1 each.
    if (kind == ScheduleKind::ZeroBubbleH1) b_cost_ = 1.0;
    R_.resize(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) R_[r].ops = compute_order(kind, r, p, m, v);
    available_.assign(static_cast<std::size_t>(g_.n_keys()), 0);
    fwd_done_.assign(static_cast<std::size_t>(m * g_.chunks()), 0);
    bwd_done_ = fwd_done_;
  }

  std::vector<std::vector<Action>> build() {
    for (;;) {
      const int r = next_active();
      if (r < 0) {
        if (all_done()) break;
        throw InternalError(fmt::format("pipeline: schedule {} (p={}, m={}, v={}) has a cyclic dependency",
                                        to_string(kind_), g_.p, g_.m, g_.v));
      }
      hand_off_pending(r);
      advance(r);
    }
    std::vector<std::vector<Action>> lists(static_cast<std::size_t>(g_.p));
    for (int r = 0; r < g_.p; ++r) lists[r] = std::move(R_[r].out);
    return lists;
  }

 private:
  enum State { Active, Blocked, Done };
  struct Rank {
    std::vector<Action> ops;
    std::size_t idx = 0;
    double clock = 0;
    State state = Active;
    int waiting = -1;          // key index while Blocked
    std::vector<Key> pending;  // produced, not yet sent
    std::vector<Action> out;
  };

  /// The active rank with the smallest clock (-1: none).
  int next_active() const {
    int r = -1;
    for (int i = 0; i < g_.p; ++i)
      if (R_[i].state == Active && (r < 0 || R_[i].clock < R_[r].clock)) r = i;
    return r;
  }

  bool all_done() const {
    bool done = true;
    for (const auto& x : R_) done = done && x.state == Done && x.pending.empty();
    return done;
  }

  /// One rendezvous event: s sends k to q.
  void pair(int s, int q, const Key& k) {
    auto& S = R_[s];
    auto& Q = R_[q];
    const double t = std::max(S.clock, Q.clock);
    S.out.push_back(send_action(k, g_));
    Q.out.push_back(recv_action(k, g_));
    S.pending.erase(std::find(S.pending.begin(), S.pending.end(), k));
    available_[g_.index(k)] = 1;
    S.clock = std::max(S.clock, t);
    Q.clock = t;
    if (Q.state == Blocked && Q.waiting == g_.index(k)) {
      Q.state = Active;
      Q.waiting = -1;
    }
  }

  /// The remote input rank q needs before its next compute (-1: none / has it).
  int next_need(int q) const {
    const auto& Q = R_[q];
    if (Q.state == Blocked) return Q.waiting;
    if (Q.idx >= Q.ops.size()) return -1;
    const Action& x = Q.ops[Q.idx];
    if (x.type == ActionType::Weight) return -1;  // local: needs only its own B
    const int c = g_.gchunk(q, x.virtual_stage);
    const bool fwd = x.type == ActionType::Forward;
    const int src = fwd ? c - 1 : c + 1;
    if (src < 0 || src >= g_.chunks() || g_.owner(src) == q) return -1;
    const int k = g_.index({!fwd, x.micro_batch, src});
    return available_[k] ? -1 : k;
  }

  /// (a) Before computing, hand pending outputs of r to ranks that need them
  /// now (blocked on them, or idle up to this time with it as their next input).
  void hand_off_pending(int r) {
    auto& me = R_[r];
    for (std::size_t i = 0; i < me.pending.size();) {
      const Key k = me.pending[i];
      const int q = g_.owner(k.grad ? k.c - 1 : k.c + 1);
      if ((R_[q].state == Blocked || R_[q].clock <= me.clock) && next_need(q) == g_.index(k))
        pair(r, q, k);  // erases pending[i]
      else
        ++i;
    }
  }

  /// (b) The next compute of r, or the message that must come first, or block.
  void advance(int r) {
    auto& me = R_[r];
    if (me.idx == me.ops.size()) {
      me.state = Done;
      return;
    }
    const Action& x = me.ops[me.idx];
    const int C = g_.chunks();
    const int c = g_.gchunk(r, x.virtual_stage);
    if (x.type == ActionType::Weight) {
      if (!bwd_done_[x.micro_batch * C + c]) throw InternalError("pipeline: W before its B");
      me.out.push_back(x);
      me.clock += w_cost_;
      ++me.idx;
      return;
    }
    const bool fwd = x.type == ActionType::Forward;
    if (!fwd && !fwd_done_[x.micro_batch * C + c]) throw InternalError("pipeline: backward before its forward");
    const bool remote_input = fwd ? c > 0 : c < C - 1;
    if (remote_input) {
      const Key need = fwd ? Key{false, x.micro_batch, c - 1} : Key{true, x.micro_batch, c + 1};
      if (!available_[g_.index(need)]) {
        wait_for(r, need);
        return;
      }
    }
    me.out.push_back(x);
    me.clock += fwd ? 1.0 : b_cost_;
    ++me.idx;
    (fwd ? fwd_done_ : bwd_done_)[x.micro_batch * C + c] = 1;
    const Key prod{!fwd, x.micro_batch, c};
    const int consumer = fwd ? c + 1 : c - 1;
    if (consumer >= 0 && consumer < C) {
      if (g_.owner(consumer) == r)
        available_[g_.index(prod)] = 1;  // local hand-off (p = 1)
      else if (!(fwd && c == C - 1))
        me.pending.push_back(prod);
    }
  }

  /// r needs `need` (not yet delivered): pair it now if its sender holds it
  /// and can send, else block r on it.
  void wait_for(int r, const Key& need) {
    auto& me = R_[r];
    const int s = g_.owner(need.c);
    if (s == r) throw InternalError("pipeline: local input not produced before use");
    auto& S = R_[s];
    const bool pend = std::find(S.pending.begin(), S.pending.end(), need) != S.pending.end();
    if (pend && (S.state != Active || S.clock <= me.clock)) {
      pair(s, r, need);
    } else {
      me.state = Blocked;
      me.waiting = g_.index(need);
    }
  }

  ScheduleKind kind_;
  Geometry g_;
  std::vector<Rank> R_;
  std::vector<char> available_;  // at its consumer
  std::vector<char> fwd_done_, bwd_done_;
  double b_cost_ = 2.0, w_cost_ = 1.0;
};

/// Fused schedules: W right after its B and the sends that directly follow
/// it (the B's gradient leaves first). W is local, so the lists stay a
/// projection of one global event order: still deadlock-free.
std::vector<Action> insert_weights(const std::vector<Action>& list) {
  std::vector<Action> out;
  out.reserve(list.size() + list.size() / 2);
  for (std::size_t i = 0; i < list.size(); ++i) {
    out.push_back(list[i]);
    if (list[i].type != ActionType::Backward) continue;
    const Action b = list[i];
    while (i + 1 < list.size() && is_send(list[i + 1].type)) out.push_back(list[++i]);
    out.push_back({ActionType::Weight, b.micro_batch, b.virtual_stage, -1});
  }
  return out;
}

std::vector<std::vector<Action>> build_lists(ScheduleKind kind, int p, int m, int v) {
  auto lists = ListBuilder(kind, p, m, v).build();
  if (kind != ScheduleKind::ZeroBubbleH1)
    for (auto& l : lists) l = insert_weights(l);
  return lists;
}

void validate(ScheduleKind kind, int pp_size, int m, int v) {
  check_args(pp_size, m, v);
  if (v > 1 && (kind == ScheduleKind::GPipe || kind == ScheduleKind::OneFOneB || kind == ScheduleKind::ZeroBubbleH1))
    throw ConfigError(fmt::format("pipeline schedule {}: virtual_stages={} needs schedule interleaved or bfs",
                                  to_string(kind), v));
  if (kind == ScheduleKind::Interleaved && v > 1 && m % pp_size != 0)
    throw ConfigError(fmt::format(
        "pipeline schedule interleaved: num_micro_batches={} must be a multiple of pp={} (Megatron interleaved "
        "1F1B; use 1f1b, gpipe or bfs, or change train.micro_batches)",
        m, pp_size));
}

}  // namespace

// ---- names ----------------------------------------------------------------------

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "interleaved") return ScheduleKind::Interleaved;
  if (name == "bfs") return ScheduleKind::BreadthFirst;
  if (name == "zb1") return ScheduleKind::ZeroBubbleH1;
  throw ConfigError(fmt::format("parallel.schedule='{}' is not one of gpipe, 1f1b, interleaved, bfs, zb1", name));
}

const char* to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::BreadthFirst: return "bfs";
    case ScheduleKind::ZeroBubbleH1: return "zb1";
  }
  return "?";
}

const char* to_string(ActionType t) {
  switch (t) {
    case ActionType::Forward: return "F";
    case ActionType::Backward: return "B";
    case ActionType::SendAct: return "SendAct";
    case ActionType::RecvAct: return "RecvAct";
    case ActionType::SendGrad: return "SendGrad";
    case ActionType::RecvGrad: return "RecvGrad";
    case ActionType::Weight: return "W";
  }
  return "?";
}

std::string to_string(const Action& a) {
  std::string s = fmt::format("{}(mb={},vs={})", to_string(a.type), a.micro_batch, a.virtual_stage);
  if (is_send(a.type)) s += fmt::format("->{}", a.peer);
  if (is_recv(a.type)) s += fmt::format("<-{}", a.peer);
  return s;
}

// ---- builders -------------------------------------------------------------------

std::vector<std::vector<Action>> build_all_schedules(ScheduleKind kind, int pp_size, int num_micro_batches,
                                                     int virtual_stages) {
  validate(kind, pp_size, num_micro_batches, virtual_stages);
  ScheduleKind k = kind;
  if (virtual_stages == 1 && kind == ScheduleKind::Interleaved) k = ScheduleKind::OneFOneB;
  if (virtual_stages == 1 && kind == ScheduleKind::BreadthFirst) k = ScheduleKind::GPipe;
  return build_lists(k, pp_size, num_micro_batches, virtual_stages);
}

std::vector<Action> build_schedule(ScheduleKind kind, int pp_rank, int pp_size, int num_micro_batches,
                                   int virtual_stages) {
  validate(kind, pp_size, num_micro_batches, virtual_stages);
  if (pp_rank < 0 || pp_rank >= pp_size)
    throw ConfigError(fmt::format("pipeline schedule: pp_rank={} out of range [0, {})", pp_rank, pp_size));
  return build_all_schedules(kind, pp_size, num_micro_batches, virtual_stages)[pp_rank];
}

std::vector<Action> training_action_list(const core::ParallelConfig& par, int pp_rank, int m, bool backward) {
  auto kind = parse_schedule_kind(par.schedule);
  if (!backward && kind == ScheduleKind::Interleaved && m % par.pp != 0) kind = ScheduleKind::BreadthFirst;
  std::vector<Action> actions = build_schedule(kind, pp_rank, par.pp, m, par.virtual_stages);
  if (!backward)
    actions.erase(std::remove_if(actions.begin(), actions.end(),
                                 [](const Action& a) {
                                   return a.type == ActionType::Backward || a.type == ActionType::Weight ||
                                          a.type == ActionType::SendGrad || a.type == ActionType::RecvGrad;
                                 }),
                  actions.end());
  return actions;
}

InFlight peak_in_flight(const std::vector<Action>& list, int virtual_stages) {
  const bool split = std::any_of(list.begin(), list.end(), [](const Action& a) { return a.type == ActionType::Weight; });
  std::vector<int> act(std::size_t(std::max(virtual_stages, 1)), 0), wp(act.size(), 0);
  InFlight peak;
  for (const Action& a : list) {
    if (a.virtual_stage < 0 || a.virtual_stage >= int(act.size()))
      throw InternalError(fmt::format("peak_in_flight: {} outside {} virtual stages", to_string(a), act.size()));
    const std::size_t vs = std::size_t(a.virtual_stage);
    switch (a.type) {
      case ActionType::Forward: ++act[vs]; break;
      case ActionType::Backward:
        if (split) {
          ++wp[vs];
        } else {
          peak.weight_pending = std::max(peak.weight_pending, 1);
          --act[vs];
        }
        break;
      case ActionType::Weight:
        --wp[vs];
        --act[vs];
        break;
      default: break;
    }
    peak.activations = std::max(peak.activations, act[vs]);
    peak.weight_pending = std::max(peak.weight_pending, wp[vs]);
  }
  return peak;
}

int p2p_tag(const Action& a, int pp_rank, int pp_size) {
  if (!is_send(a.type) && !is_recv(a.type))
    throw InternalError(fmt::format("pipeline: p2p_tag of compute action {}", to_string(a)));
  // Boundary b between chunks b and b+1; activations even, gradients odd.
  const int c = a.virtual_stage * pp_size + pp_rank;
  int boundary = 0;
  switch (a.type) {
    case ActionType::SendAct: boundary = c; break;
    case ActionType::RecvAct: boundary = c - 1; break;
    case ActionType::SendGrad: boundary = c - 1; break;
    case ActionType::RecvGrad: boundary = c; break;
    default: break;
  }
  const bool grad = a.type == ActionType::SendGrad || a.type == ActionType::RecvGrad;
  return 2 * boundary + (grad ? 1 : 0);
}

// ---- layers ---------------------------------------------------------------------

LayerRange chunk_layers(int num_layers, int num_chunks, int chunk) {
  if (num_chunks < 1) throw ConfigError(fmt::format("layer split: {} chunks (must be >= 1)", num_chunks));
  if (num_layers < num_chunks)
    throw ConfigError(fmt::format("layer split: model.layers={} < parallel.pp*virtual_stages={} chunks (every "
                                  "stage needs a layer)",
                                  num_layers, num_chunks));
  if (chunk < 0 || chunk >= num_chunks)
    throw ConfigError(fmt::format("layer split: chunk {} out of range [0, {})", chunk, num_chunks));
  const int base = num_layers / num_chunks, extra = num_layers % num_chunks;
  LayerRange lr;
  lr.begin = chunk * base + std::min(chunk, extra);
  lr.end = lr.begin + base + (chunk < extra ? 1 : 0);
  return lr;
}

LayerRange stage_layers(int num_layers, int pp_size, int virtual_stages, int pp_rank, int vs) {
  if (pp_size < 1 || virtual_stages < 1 || pp_rank < 0 || pp_rank >= pp_size || vs < 0 || vs >= virtual_stages)
    throw ConfigError(fmt::format("layer split: pp_rank={} of {}, virtual stage {} of {}: out of range", pp_rank,
                                  pp_size, vs, virtual_stages));
  return chunk_layers(num_layers, pp_size * virtual_stages, vs * pp_size + pp_rank);
}

// ---- simulation -----------------------------------------------------------------

StageTimes StageTimes::uniform(int num_micro_batches, int num_chunks, double f, double b, double w) {
  StageTimes t;
  t.forward.assign(static_cast<std::size_t>(num_micro_batches), std::vector<double>(num_chunks, f));
  t.backward.assign(static_cast<std::size_t>(num_micro_batches), std::vector<double>(num_chunks, b));
  if (w != 0) t.weight.assign(static_cast<std::size_t>(num_micro_batches), std::vector<double>(num_chunks, w));
  return t;
}

double SimResult::bubble_fraction() const {
  if (makespan <= 0 || busy.empty()) return 0;
  double s = 0;
  for (double b : busy) s += b;
  return 1.0 - s / (static_cast<double>(busy.size()) * makespan);
}

namespace {

/// Executes every rank's action list against compute durations (see
/// simulate_schedule in schedule.hpp): each rank runs its list in order; a
/// compute starts when the rank is free and its input has arrived; messages
/// complete as rendezvous pairs or through eager FIFO channels.
class ListSimulator {
 public:
  ListSimulator(const std::vector<std::vector<Action>>& lists, int p, int v, const StageTimes& times,
                double p2p_latency, P2PMode mode)
      : lists_(lists), times_(times), mode_(mode), default_latency_(p2p_latency) {
    check_shapes(p, v);
    pos_.assign(std::size_t(p), 0);
    clock_.assign(std::size_t(p), 0.0);
    res_.busy.assign(std::size_t(p), 0.0);
    arrived_.assign(std::size_t(g_.n_keys()), -1.0);
    fwd_done_.assign(std::size_t(g_.m * g_.chunks()), 0);
    bwd_done_ = fwd_done_;
    w_done_ = fwd_done_;
  }

  SimResult run() {
    const int p = g_.p;
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < p; ++r)
        while (step(r)) progress = true;
    }
    std::string stuck;
    for (int r = 0; r < p; ++r)
      if (pos_[r] < lists_[r].size()) stuck += (stuck.empty() ? "" : "; ") + where(r);
    if (!stuck.empty()) throw InternalError("simulate_schedule: the action lists deadlock: " + stuck);
    res_.finish = clock_;
    res_.makespan = *std::max_element(clock_.begin(), clock_.end());
    return res_;
  }

 private:
  void check_shapes(int p, int v) {
    if (p < 1 || v < 1 || static_cast<int>(lists_.size()) != p)
      throw InternalError(fmt::format("simulate_schedule: {} action lists for pp={} (v={})", lists_.size(), p, v));
    const int m = static_cast<int>(times_.forward.size());
    if (m < 1 || times_.backward.size() != times_.forward.size())
      throw InternalError("simulate_schedule: times.forward and times.backward need one row per micro-batch");
    g_ = Geometry{p, m, v};
    const int C = g_.chunks();
    if (!times_.weight.empty() && times_.weight.size() != times_.forward.size())
      throw InternalError("simulate_schedule: times.weight needs one row per micro-batch (or none)");
    for (int i = 0; i < m; ++i)
      if (static_cast<int>(times_.forward[i].size()) != C || static_cast<int>(times_.backward[i].size()) != C ||
          (!times_.weight.empty() && static_cast<int>(times_.weight[i].size()) != C))
        throw InternalError(fmt::format("simulate_schedule: micro-batch {} needs {} chunk durations", i, C));
    if (!times_.p2p.empty() && static_cast<int>(times_.p2p.size()) != m)
      throw InternalError(fmt::format("simulate_schedule: times.p2p holds {} latencies for {} micro-batches",
                                      times_.p2p.size(), m));
  }

  double latency(int mb) const { return times_.p2p.empty() ? default_latency_ : times_.p2p[std::size_t(mb)]; }

  std::string where(int r) const {
    return pos_[r] < lists_[r].size() ? fmt::format("rank {} at #{} {}", r, pos_[r], to_string(lists_[r][pos_[r]]))
                                      : fmt::format("rank {} finished", r);
  }

  Key check_msg(const Action& a, int r) const {
    const Key k = message_key(a, r, g_);
    const int C = g_.chunks();
    if (k.mb < 0 || k.mb >= g_.m || k.c < 0 || k.c >= C)
      throw InternalError(fmt::format("simulate_schedule: {} on rank {} names no existing data", to_string(a), r));
    const Action expect = is_send(a.type) ? send_action(k, g_) : recv_action(k, g_);
    if (!(expect == a) || g_.owner(k.grad ? k.c - 1 : k.c + 1) == g_.owner(k.c))
      throw InternalError(fmt::format("simulate_schedule: rank {}: {} has the wrong partner or is a local hand-off "
                                      "(expected {})",
                                      r, to_string(a), to_string(expect)));
    return k;
  }

  /// One action of rank r; false if it must wait.
  bool step(int r) {
    if (pos_[r] >= lists_[r].size()) return false;
    const Action& a = lists_[r][pos_[r]];
    if (a.type == ActionType::Forward || a.type == ActionType::Backward) return compute(r, a);
    if (a.type == ActionType::Weight) return weight(r, a);
    const Key k = check_msg(a, r);
    return is_send(a.type) ? send(r, a, k) : receive(r, a, k);
  }

  bool compute(int r, const Action& a) {
    const int C = g_.chunks();
    if (a.micro_batch < 0 || a.micro_batch >= g_.m || a.virtual_stage < 0 || a.virtual_stage >= g_.v)
      throw InternalError(fmt::format("simulate_schedule: rank {}: {} out of range", r, to_string(a)));
    const int c = g_.gchunk(r, a.virtual_stage);
    const bool fwd = a.type == ActionType::Forward;
    double start = clock_[r];
    const int src = fwd ? c - 1 : c + 1;
    if (!fwd && !fwd_done_[a.micro_batch * C + c])
      throw InternalError(fmt::format("simulate_schedule: rank {}: {} before its forward", r, to_string(a)));
    if (src >= 0 && src < C) {
      const double t = arrived_[g_.index({!fwd, a.micro_batch, src})];
      if (t < 0)
        throw InternalError(fmt::format("simulate_schedule: rank {}: {} runs before its input ({} of mb {} from "
                                        "chunk {}) was received",
                                        r, to_string(a), fwd ? "activation" : "gradient", a.micro_batch, src));
      start = std::max(start, t);
    }
    const double d = fwd ? times_.forward[a.micro_batch][c] : times_.backward[a.micro_batch][c];
    clock_[r] = start + d;
    res_.busy[r] += d;
    (fwd ? fwd_done_ : bwd_done_)[a.micro_batch * C + c] = 1;
    const int dst = fwd ? c + 1 : c - 1;
    if (dst >= 0 && dst < C && g_.owner(dst) == r) arrived_[g_.index({!fwd, a.micro_batch, c})] = clock_[r];
    ++pos_[r];
    return true;
  }

  /// W: local, after its B; no input, no product.
  bool weight(int r, const Action& a) {
    const int C = g_.chunks();
    if (a.micro_batch < 0 || a.micro_batch >= g_.m || a.virtual_stage < 0 || a.virtual_stage >= g_.v)
      throw InternalError(fmt::format("simulate_schedule: rank {}: {} out of range", r, to_string(a)));
    const int i = a.micro_batch * C + g_.gchunk(r, a.virtual_stage);
    if (!bwd_done_[i] || w_done_[i])
      throw InternalError(fmt::format("simulate_schedule: rank {}: {} {}", r, to_string(a),
                                      w_done_[i] ? "runs twice" : "before its B"));
    const double d = times_.weight.empty() ? 0.0 : times_.weight[a.micro_batch][g_.gchunk(r, a.virtual_stage)];
    clock_[r] += d;
    res_.busy[r] += d;
    w_done_[i] = 1;
    ++pos_[r];
    return true;
  }

  bool send(int r, const Action& a, const Key& k) {
    const int p = g_.p, C = g_.chunks();
    if (!(k.grad ? bwd_done_ : fwd_done_)[k.mb * C + k.c])
      throw InternalError(fmt::format("simulate_schedule: rank {}: {} before the data was computed", r, to_string(a)));
    if (mode_ == P2PMode::Eager) {
      channels_[{r, a.peer, p2p_tag(a, r, p)}].emplace_back(k, clock_[r] + latency(k.mb));
      ++pos_[r];
      return true;
    }
    const int q = a.peer;
    if (pos_[q] >= lists_[q].size()) return false;
    const Action& b = lists_[q][pos_[q]];
    if (!is_recv(b.type) || b.peer != r) return false;  // partner busy with something else
    const Key kq = check_msg(b, q);
    if (!(kq == k)) {
      if (p2p_tag(a, r, p) == p2p_tag(b, q, p))
        throw InternalError(fmt::format("simulate_schedule: message mismatch: {} sends {}, {} expects {}", where(r),
                                        to_string(a), where(q), to_string(b)));
      return false;
    }
    const double t = std::max(clock_[r], clock_[q]) + latency(k.mb);
    clock_[r] = clock_[q] = t;
    arrived_[g_.index(k)] = t;
    ++pos_[r];
    ++pos_[q];
    return true;
  }

  bool receive(int r, const Action& a, const Key& k) {
    if (mode_ != P2PMode::Eager) return false;  // rendezvous receives complete from the sender's side
    auto& ch = channels_[{a.peer, r, p2p_tag(a, r, g_.p)}];
    if (ch.empty()) return false;
    if (!(ch.front().first == k))
      throw InternalError(fmt::format("simulate_schedule: message mismatch: {} expects mb {} of chunk {}, the "
                                      "oldest message from rank {} is mb {} of chunk {}",
                                      where(r), k.mb, k.c, a.peer, ch.front().first.mb, ch.front().first.c));
    const double t = ch.front().second;
    ch.pop_front();
    clock_[r] = std::max(clock_[r], t);
    arrived_[g_.index(k)] = clock_[r];
    ++pos_[r];
    return true;
  }

  const std::vector<std::vector<Action>>& lists_;
  const StageTimes& times_;
  P2PMode mode_;
  double default_latency_;
  Geometry g_;
  std::vector<std::size_t> pos_;
  std::vector<double> clock_;
  SimResult res_;
  // Data state: when an input reached its consumer (-1: not yet), compute done flags.
  std::vector<double> arrived_;
  std::vector<char> fwd_done_, bwd_done_, w_done_;
  // Eager mode: FIFO channels (src, dst, tag) of (data, time available at the receiver),
  // matched like MPI: a receive takes the oldest message of its (src, tag).
  std::map<std::tuple<int, int, int>, std::deque<std::pair<Key, double>>> channels_;
};

}  // namespace

SimResult simulate_schedule(const std::vector<std::vector<Action>>& schedules, int pp_size, int virtual_stages,
                            const StageTimes& times, double p2p_latency, P2PMode mode) {
  return ListSimulator(schedules, pp_size, virtual_stages, times, p2p_latency, mode).run();
}

SimResult simulate_schedule(ScheduleKind kind, int pp_size, int num_micro_batches, int virtual_stages,
                            const StageTimes& times, double p2p_latency, P2PMode mode) {
  return simulate_schedule(build_all_schedules(kind, pp_size, num_micro_batches, virtual_stages), pp_size,
                           virtual_stages, times, p2p_latency, mode);
}

}  // namespace wlb::pipeline

#pragma once
/// \file schedule.hpp
/// \brief wlb::pipeline — pipeline schedules as data, the layer -> stage map,
/// and a timing simulator of the action lists. There is one schedule
/// implementation: the trainer's executor runs build_schedule()'s lists and
/// the planner (plan/simulate.hpp, wlb4d-plan) simulates the same lists.
///
/// Terms. p = pp_size pipeline ranks, v = virtual_stages model chunks per rank,
/// m = num_micro_batches per step (per DP replica). The model is cut into
/// C = p·v chunks of consecutive layers; global chunk c lives on rank c mod p as
/// its local chunk (virtual stage) c / p ("looped" placement: rank r holds
/// chunks r, r+p, r+2p, ...). Forward of chunk c needs the activation from
/// chunk c-1 (c > 0); backward of chunk c needs the gradient from chunk c+1
/// (c < C-1), and its own forward.
///
/// Schedules (ScheduleKind), as the per-rank order of compute:
/// - GPipe: all forwards (mb 0..m-1), then all backwards (mb 0..m-1). v = 1.
/// - OneFOneB (PipeDream-flush, Megatron non-interleaved): min(p-r-1, m)
///   warm-up forwards, then steady F/B pairs, then cool-down backwards. v = 1.
/// - Interleaved (Megatron virtual pipeline, Narayanan et al. 2021): warm-up of
///   min((p-r-1)·2 + (v-1)·p, m·v) chunk-forwards, then 1F1B over chunks; the
///   k-th forward (backward) of a rank runs micro-batch (k / (p·v))·p + k mod p
///   on local chunk (k mod p·v) / p (backward: v-1 minus that). Requires
///   m % p == 0 when v > 1 (ConfigError otherwise); with v = 1 it is OneFOneB.
/// - BreadthFirst (BFS-PP, Lamy-Poirier 2022, arXiv 2211.05953): looped
///   placement; every micro-batch passes a local chunk before the next local
///   chunk: forwards for vs = 0..v-1 (mb 0..m-1 each), then backwards for
///   vs = v-1..0 (mb 0..m-1 each). With v = 1 it is GPipe.
/// - ZeroBubbleH1 (ZB-H1, Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
///   2024, arXiv 2401.10241, §3.1 "handcrafted schedules"): 1F1B's order of F
///   and B, with the backward split into B (input gradient, on the critical
///   path) and W (weight gradient, needed only by the optimizer). Rank r
///   delays its W's by r micro-batches: after its k-th B it runs W of
///   micro-batch k − r (k ≥ r), and the remaining W's after its last B, so
///   the W's of the later stages fill the cool-down bubble. Peak activations
///   (micro-batches whose F ran and whose W has not) are min(p, m) on every
///   rank, 1F1B's peak (rank 0). Bubble for uniform micro-batches (per rank
///   idle time; the simulator reproduces it, tests/unit/pipeline):
///     ZB-H1 (p−1)·(T_F + T_B − T_W)   vs   1F1B (p−1)·(T_F + T_B + T_W)
///   (1F1B with a fused backward; valid for T_W ≤ T_F; at the paper's
///   T_F = T_B = T_W a third of 1F1B's bubble). 1F1B with the split, which
///   sends each gradient before its W, idles (p−1)·(T_F + T_B). v = 1.
/// Every other schedule runs each W right after its B (and after the sends
/// that directly follow that B, so the previous stage gets its gradient
/// first): the compute order of their forwards and backwards is unchanged.
///
/// Fewer micro-batches than stages (m < p): GPipe, 1F1B, ZB-H1 and BFS are correct
/// (no deadlock; the bubble grows). Interleaved with v > 1 needs m % p == 0, so
/// m >= p (ConfigError otherwise).
///
/// Communication is explicit. An action list holds Forward/Backward and the
/// point-to-point messages that feed them, in the order the rank executes them
/// with *blocking* sends and receives (rendezvous: a send returns when the
/// matching receive has taken the message). A receive always precedes the
/// compute that needs it; a send follows the compute that produced it. The
/// builder places messages by simulating all ranks together (uniform times
/// F = 1, B = 2 per chunk — ZB-H1: F = B = W = 1 —, zero latency) and recording one global sequence of
/// events in which every send/recv pair is a single event: each rank's list is
/// a projection of that sequence, which makes the set of lists deadlock-free
/// under blocking semantics for any compute durations, and MPI's
/// non-overtaking order matches every pair (the tags of p2p_tag() suffice).
/// It also means that between two ranks the sender posts its sends in the
/// order the receiver posts the matching receives, so transports that match
/// by order only (NCCL send/recv, pipeline::Executor with a device backend)
/// pair them correctly too; training_action_list's forward-only lists (all
/// gradient messages dropped) keep both properties.
/// With p = 1 every hand-off is local and lists hold compute only.

#include "wlb4d/core/config.hpp"

#include <string>
#include <vector>

namespace wlb::pipeline {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, BreadthFirst, ZeroBubbleH1 };

/// "gpipe" | "1f1b" | "interleaved" | "bfs" | "zb1" (the values of parallel.schedule).
/// \throws ConfigError naming the accepted values.
ScheduleKind parse_schedule_kind(const std::string& name);
const char* to_string(ScheduleKind k);

/// Compute and message actions. For messages, `virtual_stage` is the local
/// chunk that produced (Send*) or will consume (Recv*) the data:
/// - SendAct:  output activation of local chunk vs (global c) -> rank of c+1;
/// - RecvAct:  input activation of local chunk vs (global c) <- rank of c-1;
/// - SendGrad: gradient w.r.t. the input of local chunk vs   -> rank of c-1;
/// - RecvGrad: gradient w.r.t. the output of local chunk vs  <- rank of c+1.
/// Backward is B, the input-gradient part of the backward (it produces what
/// SendGrad sends); Weight is W, the weight-gradient part (local, after its
/// B; model::Transformer::backward_input / backward_weight).
enum class ActionType { Forward, Backward, SendAct, RecvAct, SendGrad, RecvGrad, Weight };
const char* to_string(ActionType t);

struct Action {
  ActionType type = ActionType::Forward;
  int micro_batch = 0;    ///< in [0, m)
  int virtual_stage = 0;  ///< local model chunk index in [0, v)
  int peer = -1;          ///< pipeline rank of the partner (messages); -1 for compute
  bool operator==(const Action& o) const {
    return type == o.type && micro_batch == o.micro_batch && virtual_stage == o.virtual_stage && peer == o.peer;
  }
};
std::string to_string(const Action& a);  ///< e.g. "F(mb=3,vs=1)", "W(mb=2,vs=0)", "SendAct(mb=0,vs=0)->2"

/// Global chunk index of (pp_rank, local chunk vs): vs·p + pp_rank.
inline int global_chunk(int pp_rank, int vs, int pp_size) { return vs * pp_size + pp_rank; }

/// Action list of one pipeline rank (see the file comment).
/// \throws ConfigError: pp_size < 1, pp_rank outside [0, pp_size),
///         num_micro_batches < 1, virtual_stages < 1, v > 1 with GPipe/1F1B,
///         interleaved with v > 1 and m % p != 0.
std::vector<Action> build_schedule(ScheduleKind kind, int pp_rank, int pp_size, int num_micro_batches,
                                   int virtual_stages = 1);
/// Action lists of every pipeline rank ([pp_rank][i]); same errors.
std::vector<std::vector<Action>> build_all_schedules(ScheduleKind kind, int pp_size, int num_micro_batches,
                                                     int virtual_stages = 1);

/// The action list the trainer's executor runs on pipeline rank pp_rank for m
/// micro-batches of one replica, and the list the planner simulates
/// (simulate.hpp): build_schedule(parallel.schedule, pp_rank, pp, m,
/// virtual_stages). With backward = false (evaluation) the Backward, Weight,
/// SendGrad and RecvGrad actions are dropped — a consistent projection of the global
/// event order, so still deadlock-free — and interleaved with m % pp != 0 (a
/// short last evaluation round) runs breadth-first (same looped placement).
/// \throws ConfigError as build_schedule.
std::vector<Action> training_action_list(const core::ParallelConfig& par, int pp_rank, int m, bool backward);

/// Peak micro-batches a rank holds while running `list` (max over the list
/// and over local chunks): `activations` = forward done, W not yet (the
/// saved activations W still reads); `weight_pending` = B done, W not yet.
/// In a list without Weight actions a Backward counts as B and W together.
/// 1F1B: activations = min(p − r, m), weight_pending = 1; ZB-H1:
/// activations = min(p, m), weight_pending = min(r + 1, m).
struct InFlight {
  int activations = 0;
  int weight_pending = 0;
};
InFlight peak_in_flight(const std::vector<Action>& list, int virtual_stages = 1);

/// MPI tag for a message action: equal on the sending and the receiving side of
/// one pair; distinct for activations vs gradients and per chunk boundary (at
/// most 2·p·v + 1, far below MPI_TAG_UB). Micro-batches of one boundary share
/// a tag and rely on the lists' matching order. \throws core::InternalError
/// for a compute action.
int p2p_tag(const Action& a, int pp_rank, int pp_size);

/// Layers [begin, end) of one chunk.
struct LayerRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
};
/// Contiguous split of num_layers over num_chunks: the first num_layers mod
/// num_chunks chunks get one layer more (5 layers on 2 chunks: [0,3), [3,5)).
/// \throws ConfigError if num_layers < num_chunks ("every stage needs a layer")
///         or chunk out of range.
LayerRange chunk_layers(int num_layers, int num_chunks, int chunk);
/// Layers of local chunk vs on pp_rank: chunk_layers(L, p·v, vs·p + pp_rank).
LayerRange stage_layers(int num_layers, int pp_size, int virtual_stages, int pp_rank, int vs);

// ---- simulation ------------------------------------------------------------------

/// How a send completes in simulate_schedule.
enum class P2PMode {
  Rendezvous,  ///< send and receive complete together (blocking MPI_Send of large messages)
  Eager        ///< a send never waits; the receive waits for the data (buffered / Isend)
};

/// Per-micro-batch, per-global-chunk durations (seconds, or any unit):
/// forward[mb][c], backward[mb][c] (B) and weight[mb][c] (W), c in [0, p·v).
struct StageTimes {
  std::vector<std::vector<double>> forward;
  std::vector<std::vector<double>> backward;
  /// W durations; empty: every W takes 0 (backward then holds B + W).
  std::vector<std::vector<double>> weight;
  /// Optional latency of each message of micro-batch mb (seconds); empty:
  /// every message takes simulate_schedule's p2p_latency.
  std::vector<double> p2p;
  /// Every micro-batch and chunk takes f (forward), b (B) and w (W; 0: weight left empty).
  static StageTimes uniform(int num_micro_batches, int num_chunks, double f, double b, double w = 0);
};

struct SimResult {
  double makespan = 0;              ///< time from 0 until the last action ends
  std::vector<double> busy;         ///< per pipeline rank: Σ compute time
  std::vector<double> finish;       ///< per pipeline rank: end of its last action
  /// 1 - Σ busy / (p · makespan): idle share of the pipeline.
  double bubble_fraction() const;
};

/// Executes the action lists of all ranks (schedules[pp_rank]) with compute
/// durations from `times` and `p2p_latency` per message (added at the receiver;
/// under Rendezvous the sender is released at the same time). A message pairs
/// the head send of one rank with the head receive of its peer when they name
/// the same data.
/// \throws core::InternalError if the times do not match the lists' shape, a
///         list is inconsistent (a message names a different micro-batch/chunk
///         than its partner expects, a compute lacks its input, a W precedes
///         its B) or the lists
///         deadlock; the message names the stuck actions.
SimResult simulate_schedule(const std::vector<std::vector<Action>>& schedules, int pp_size, int virtual_stages,
                            const StageTimes& times, double p2p_latency = 0.0,
                            P2PMode mode = P2PMode::Rendezvous);
/// build_all_schedules + simulate_schedule.
SimResult simulate_schedule(ScheduleKind kind, int pp_size, int num_micro_batches, int virtual_stages,
                            const StageTimes& times, double p2p_latency = 0.0, P2PMode mode = P2PMode::Rendezvous);

}  // namespace wlb::pipeline

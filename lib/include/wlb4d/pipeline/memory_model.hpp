#pragma once
/// \file memory_model.hpp
/// \brief The memory model (DESIGN §10): predicted peak bytes per rank, by
/// named term, of what the trainer allocates in the model's memory space
/// (MemSpace: device memory on a CUDA build, host memory otherwise). The
/// trainer's start-up report, its upper-bound check and wlb4d-plan all call
/// predict_memory(); the trainer compares it with the measured Kokkos
/// high-water mark (core/memory.hpp).
///
/// Symbols (per rank): d = d_model, D = head_dim, Hq_l = heads/tp, Hkv_l =
/// kv_heads/tp, qd = Hq_l·D, kd = Hkv_l·D, F_l and V_l = this TP rank's share
/// of ffn_hidden and the vocabulary (split_range), C = max(train.max_seq_len,
/// balance.max_tokens) = the largest micro-batch the plan can produce and the
/// capacity of every workspace, C_cp = 2·⌈C/(2·cp)⌉ (cp > 1; else C) the
/// largest CP shard, m = train.micro_batches/dp, s = micro-batches in flight
/// per chunk (micro_batches_in_flight), b = bytes per element (4: fp32),
/// G = dp·cp (the gradient group), SP = parallel.sequence_parallel and
/// C_sp = ⌈C/tp⌉ under SP (else C). Every count is a double: no overflow.
///
/// Terms (each the sum over this rank's model chunks c; the allocation
/// named in brackets):
///   parameters          P_c·b                     [model::param_values]
///   gradients           P_c·b                     [model::param_grads]
///   optimizer_state     2·P_c·4, ZeRO-1: 2·⌈P_c/G⌉·4 (fp32 AdamW m, v)
///   grad_shard          ZeRO-1 with G > 1: ⌈P_c/G⌉·4 (the reduce-scatter's
///                       receive buffer)  [optim::grad_shard]
///   activations         s·(Σ_layers kept fields + stage top)·b    [model::activations]
///                       fields per token (transformer.cpp LayerViews):
///                       x_in d, rstd1 1, xn1 d, q qd, k kd, v kd, o qd,
///                       lse Hq_l, h1 d, rstd2 1, xn2 d, gate F_l, up F_l, act F_l;
///                       recompute none keeps all, selective drops rstd1,
///                       xn1, rstd2, xn2, act, full keeps x_in only (first
///                       model.recompute_layers local layers, 0 = all);
///                       top: x_out d, last stage + rstd_f 1, xn_f d, logits
///                       V_l, ce_lse 1. Under SP the residual-region fields
///                       (x_in, rstd1, xn1, h1, rstd2, xn2, x_out, rstd_f,
///                       xn_f) hold C_sp tokens, the others C. Under bf16
///                       xn1, xn2, act and xn_f are 2 bytes per element
///                       (their bf16 bits), the rest b.
///   recompute_workspace C·Σ widths·bytes of the fields some layer drops  [model::recompute]
///   grad_workspace      C·b·(2d + 2qd + 2kd + 3F_l + 3), bf16: + C·b·max(d, F_l)
///                       (the fp32 staging of the 2-byte operands)  [model::grad_scratch]
///   sp_gather           SP: 2·C·d·b (all-gathered norm output and its
///                       gradient before the column-parallel GEMMs; a model
///                       until the SP branch measures it)
///   cp_kv_buffers       cp > 1: 5·C·Hkv_l·D·b (gathered K, V, dK, dV, temp) [cp_kv]
///   p2p_buffers         m·C_p2p·d·b per activation/gradient buffer kept per
///                       micro-batch: recv_act (chunks c > 0, pp > 1),
///                       recv_grad (c < last, pp > 1), send_grad (c > 0);
///                       C_p2p = C_cp, ⌈C_cp/tp⌉ under SP  [pp_recv, pp_send_grad]
///   bf16_weights        train.precision = bf16, sbgemm path: P_mm,c·2 (the
///                       chunk's GEMM weights: layers·(2qd·d + 2kd·d + 3F_l·d)
///                       + V_l·d on the last chunk); 0 on the widen path (no
///                       copies, bf16_gemm.hpp) [model::bf16_weights]
///   bf16_operands       bf16: C·(max(d, qd, F_l, min(out_max, 4096)) + max(d, qd, F_l))·b16,
///                       out_max the widest GEMM output of the chunk (V_l with
///                       the head), b16 = 2 (sbgemm) or 4 (widen); widen also
///                       max over the chunk's weights of min(rows, 4096)·cols·4
///                       and, if out_max > 4096, C·4096·4 [model::bf16_operands]
///   grad_reduce_bf16    comm.grad_reduce_dtype = bf16 and dp·cp > 1: max_c P_c·2
///                       (the bf16 copy of the largest chunk's gradient) [optim::grad_bf16]
///   batch_inputs        m·5·C_cp·4 (int32 ids, labels, positions, kv_lo,
///                       kv_hi) + cp > 1: m·C·4 (cp_perm)
/// The sum is the predicted peak: the workspaces are allocated once at
/// start-up and live through every step, so the high-water mark is their sum.
/// Not counted: Kokkos' allocation headers, host staging and checkpoint
/// mirrors of a device build (host memory), MPI's own buffers.
///
/// In flight (executor.hpp): s = the largest number of forwards pending their
/// backward on one local chunk in the rank's own action list
/// (training_action_list): GPipe and BFS m, 1F1B min(m, p − r), interleaved
/// as its list says. Schedules whose lists keep each chunk's pending
/// micro-batches consecutive (all four) use slot = mb mod s.
///
/// Sources: activation bytes per layer per token as Korthikanti et al. 2022,
/// "Reducing Activation Recomputation in Large Transformer Models" §4 (here
/// counted from this code's own allocations); ZeRO-1 partitioning as
/// Rajbhandari et al. 2020, "ZeRO", §5.1.

#include "wlb4d/core/config.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/pipeline/schedule.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::pipeline {

/// One named term of the estimate.
struct MemoryTerm {
  std::string name;    ///< parameters, gradients, optimizer_state, activations, ...
  double bytes = 0;    ///< bytes on this rank
  std::string fields;  ///< the allocations / fields it stands for
};

/// Predicted peak memory of one rank.
struct MemoryEstimate {
  int pp_rank = 0, tp_rank = 0;
  int slots = 0;               ///< micro-batches in flight per chunk (s)
  double capacity_tokens = 0;  ///< C
  std::vector<MemoryTerm> terms;
  double total() const;                       ///< Σ terms (bytes)
  double term(const std::string& name) const; ///< bytes of a term, 0 if absent
};

struct MemoryOptions {
  int bytes_per_element = 4;  ///< activations, parameters, gradients (4: fp32; 2 for bf16 later)
  int dpcp_rank = 0;          ///< this rank in the DP×CP group (ZeRO-1 shard; 0 holds the largest)
  /// train.precision = bf16: bytes per element of the weight copies and the
  /// operand workspace (2: sbgemm, 4: widen); 0: this process's path
  /// (model::bf16_operand_bytes()).
  int bf16_operand_bytes = 0;
};

/// s of the file comment: the most micro-batches held on one local chunk of
/// pipeline rank pp_rank's action list for m micro-batches — from its forward
/// to its W (the workspace slot is free only then; for schedules that do not
/// delay W this is F to B) — when every chunk's held micro-batches stay
/// consecutive (then slot = mb mod s is safe), else m. For
/// m·pp·virtual_stages above 2^22 the lists are not built: 1F1B gives
/// min(m, p − r), ZB-H1 min(m, p), the others m (an upper bound).
/// \throws core::ConfigError as training_action_list.
int micro_batches_in_flight(const core::ParallelConfig& par, int pp_rank, int m);

/// W stashes the executor allocates per chunk (model::Transformer
/// weight_slots): the most W's pending at once on one chunk of the rank's
/// list under ZB-H1 (min(r + 1, m)); 0 for the other schedules, which run the
/// fused backward.
int weight_stashes(const core::ParallelConfig& par, int pp_rank, int m);

/// The estimate of pipeline rank pp_rank, TP rank tp_rank for `vocab` (the
/// model's vocabulary: padded model.vocab_size or the dataset's).
/// \throws core::ConfigError for a layout the schedule rejects (fewer layers
///         than pp·virtual_stages, unknown schedule or recompute mode).
MemoryEstimate predict_memory(const core::Config& cfg, std::int64_t vocab, int pp_rank, int tp_rank = 0,
                              const MemoryOptions& opt = {});

/// The estimate of every pipeline rank (TP rank 0, the largest shard).
std::vector<MemoryEstimate> predict_memory_stages(const core::Config& cfg, std::int64_t vocab,
                                                  const MemoryOptions& opt = {});

/// The stage whose total is largest.
MemoryEstimate max_memory(const std::vector<MemoryEstimate>& stages);

/// One line: "total 1.23 GiB = parameters 10.0 MiB + gradients ... (s=4, C=2048)".
std::string format_memory(const MemoryEstimate& e);

/// Where the ranks of a run live, as check_memory_fits found it.
struct HostPlacement {
  bool one_host = false;  ///< every rank of the world on one host (host builds only)
  std::string host;       ///< this rank's host name
  int host_ranks = 0;     ///< ranks on this rank's host (host builds only; 0: not counted)
};

/// The upper bound of DESIGN §10: `mine` (bytes, this rank's predict_memory
/// total) against what it can get, before any large allocation. Host memory
/// (MemSpace host-accessible): the ranks sharing a host together against its
/// MemAvailable (no bound where /proc/meminfo is unreadable). Device memory:
/// this rank against core::device_memory_budget (plan.device_memory_gib, else
/// plan.device's memory, else the device's detected total). Collective over
/// grid.world() (it splits the world by host name).
/// \throws core::ConfigError on every rank, naming both numbers and what to
///         change, when some rank's need exceeds what it has.
HostPlacement check_memory_fits(const core::Config& cfg, const grid::ProcessGrid& grid, double mine);

}  // namespace wlb::pipeline

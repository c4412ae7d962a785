// The memory model: predicted peak bytes per rank by named term. See
// memory_model.hpp for the formulas; the widths below mirror the
// allocations of model/transformer.cpp, model/cp_exchange.cpp and
// pipeline/executor.cpp (change them together).
#include "wlb4d/pipeline/memory_model.hpp"

#include "wlb4d/core/device_table.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/memory.hpp"
#include "wlb4d/core/types.hpp"
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/model/attention.hpp"
#include "wlb4d/model/bf16_gemm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <unistd.h>
#include <cmath>
#include <map>

namespace wlb::pipeline {

double MemoryEstimate::total() const {
  double t = 0;
  for (const auto& x : terms) t += x.bytes;
  return t;
}

double MemoryEstimate::term(const std::string& name) const {
  for (const auto& x : terms)
    if (x.name == name) return x.bytes;
  return 0;
}

int micro_batches_in_flight(const core::ParallelConfig& par, int pp_rank, int m) {
  const auto kind = parse_schedule_kind(par.schedule);
  if (m < 1) return 1;
  if (double(m) * par.pp * par.virtual_stages > double(1 << 22)) {
    if (kind == ScheduleKind::OneFOneB) return std::min(m, par.pp - pp_rank);
    if (kind == ScheduleKind::ZeroBubbleH1) return std::min(m, par.pp);
    return m;
  }
  const auto actions = training_action_list(par, pp_rank, m, /*backward=*/true);
  // A slot is released by W when the schedule delays W, else by B.
  const ActionType release = kind == ScheduleKind::ZeroBubbleH1 ? ActionType::Weight : ActionType::Backward;
  const int v = par.virtual_stages;
  std::vector<int> next_f(std::size_t(v), -1), next_r(std::size_t(v), -1), held(std::size_t(v), 0);
  int most = 1;
  bool consecutive = true;
  for (const auto& a : actions) {
    const std::size_t c = std::size_t(a.virtual_stage);
    if (a.type == ActionType::Forward) {
      consecutive = consecutive && a.micro_batch == next_f[c] + 1;
      next_f[c] = a.micro_batch;
      most = std::max(most, ++held[c]);
    } else if (a.type == release) {
      consecutive = consecutive && a.micro_batch == next_r[c] + 1;
      next_r[c] = a.micro_batch;
      --held[c];
    }
  }
  return consecutive ? most : m;
}

int weight_stashes(const core::ParallelConfig& par, int pp_rank, int m) {
  if (parse_schedule_kind(par.schedule) != ScheduleKind::ZeroBubbleH1) return 0;
  if (m < 1) return 1;
  if (double(m) * par.pp * par.virtual_stages > double(1 << 22)) return std::min(m, pp_rank + 1);
  const auto peak = peak_in_flight(training_action_list(par, pp_rank, m, /*backward=*/true), par.virtual_stages);
  return std::max(peak.weight_pending, 1);
}

namespace {

// Field order of transformer.cpp (Field enum) and what each mode keeps.
enum Field { kXin, kRstd1, kXn1, kQ, kK, kV, kO, kLse, kH1, kRstd2, kXn2, kG, kU, kA, kNumFields };
const char* const kFieldName[kNumFields] = {"x_in", "rstd1", "xn1", "q", "k", "v", "o",
                                             "lse", "h1", "rstd2", "xn2", "gate", "up", "act"};
bool residual_region(int f) { return f == kXin || f == kRstd1 || f == kXn1 || f == kH1 || f == kRstd2 || f == kXn2; }

bool keeps(const std::string& mode, int f) {
  if (mode == "none") return true;
  if (mode == "full") return f == kXin;
  if (mode == "selective") return f != kRstd1 && f != kXn1 && f != kRstd2 && f != kXn2 && f != kA;
  throw core::ConfigError("model.recompute='" + mode + "' must be none, selective or full");
}

double split_count(double n, int parts, int rank) {  // split_range's count, in doubles
  const double base = std::floor(n / parts), rem = n - base * parts;
  return base + (rank < rem ? 1 : 0);
}

}  // namespace

MemoryEstimate predict_memory(const core::Config& cfg, std::int64_t vocab, int pp_rank, int tp_rank,
                              const MemoryOptions& opt) {
  const auto& mc = cfg.model;
  const auto& par = cfg.parallel;
  const int p = par.pp, v = par.virtual_stages, tp = par.tp, cp = par.cp;
  const double b = opt.bytes_per_element;
  const double d = mc.d_model, D = mc.head_dim();
  const double qd = double(mc.heads / tp) * D, kd = double(mc.kv_heads / tp) * D, hq = double(mc.heads / tp);
  const double F = split_count(mc.ffn_hidden, tp, tp_rank), V = split_count(double(vocab), tp, tp_rank);
  const double C = double(std::max<std::int64_t>(cfg.train.max_seq_len, cfg.balance.max_tokens));
  const double C_cp = cp > 1 ? 2.0 * std::ceil(C / (2.0 * cp)) : C;
  const bool sp = par.sequence_parallel && tp > 1;
  const double C_sp = sp ? std::ceil(C / tp) : C;
  const int m = std::max(1, cfg.train.micro_batches / std::max(1, par.dp));
  const int G = par.dp * cp;
  if (mc.recompute_layers < 0)
    throw core::ConfigError(fmt::format("model.recompute_layers={} must be >= 0", mc.recompute_layers));

  MemoryEstimate e;
  e.pp_rank = pp_rank;
  e.tp_rank = tp_rank;
  e.slots = micro_batches_in_flight(par, pp_rank, m);
  e.capacity_tokens = C;
  const double s = e.slots;

  const double width[kNumFields] = {d, 1, d, qd, kd, kd, qd, hq, d, 1, d, F, F, F};
  // train.precision = bf16: weight copies and the operand workspace (bf16_gemm.hpp);
  // the GEMM-only saved operands xn1, xn2, act (and the final-norm output) in 2 bytes (transformer.hpp).
  const bool bf16 = cfg.train.precision == "bf16";
  auto elem_bytes = [&](int f) { return bf16 && (f == kXn1 || f == kXn2 || f == kA) ? 2.0 : b; };
  auto field_bytes = [&](int f) { return width[f] * (sp && residual_region(f) ? C_sp : C) * elem_bytes(f); };
  double params = 0, moments = 0, grad_shard = 0, acts = 0, rec = 0, grad_ws = 0, p2p_bufs = 0, wstash = 0;
  const double bb = opt.bf16_operand_bytes > 0 ? opt.bf16_operand_bytes : model::bf16_operand_bytes();
  const bool widen = bb == 4;  // no weight copies; weight-row and output-column blocks instead (bf16_gemm.hpp)
  double bf16_w = 0, bf16_ws = 0, chunk_max = 0;
  const double wslots = weight_stashes(par, pp_rank, m);
  std::string kept;
  for (int vs = 0; vs < v; ++vs) {
    const auto lr = stage_layers(mc.layers, p, v, pp_rank, vs);
    const int c = global_chunk(pp_rank, vs, p);
    const bool embedding = c == 0, head = c == p * v - 1;
    const double nl = lr.size();
    const double layer_params = 2 * d + 2 * qd * d + 2 * kd * d + 3 * F * d;
    // Tied embeddings: one table when the embedding and the head share a chunk;
    // on a last stage of its own, the head is a replica of the table.
    const double head_table = mc.tie_embeddings && embedding ? 0 : V * d;
    const double P = nl * layer_params + (embedding ? V * d : 0) + (head ? d + head_table : 0);
    params += P;
    chunk_max = std::max(chunk_max, P);
    if (bf16) {
      const double blk = model::kBf16Block;
      if (!widen) bf16_w += (nl * (2 * qd * d + 2 * kd * d + 3 * F * d) + (head ? V * d : 0)) * bb;
      const double wmax = std::max({d, qd, F});
      const double out_max = std::max(nl > 0 ? std::max({qd, kd, d, F}) : 0.0, head ? V : 0.0);
      bf16_ws += C * (std::max(wmax, std::min(out_max, blk)) + wmax) * bb;
      if (widen) {  // a rounded block of weight rows; the LM head's block of output columns
        const double w_block = std::max({nl > 0 ? std::max({std::min(qd, blk) * d, std::min(kd, blk) * d,
                                                             std::min(d, blk) * qd, std::min(F, blk) * d,
                                                             std::min(d, blk) * F})
                                                : 0.0,
                                         head ? std::min(V, blk) * d : 0.0});
        bf16_ws += (w_block + (out_max > blk ? C * blk : 0.0)) * bb;
      }
    }
    moments += 2 * (par.zero == 1 ? std::ceil(P / G) : P);
    if (par.zero == 1 && G > 1) grad_shard += std::ceil(P / G);
    // Layers that recompute: the first recompute_layers local ones (0: all).
    const bool any = mc.recompute != "none";
    const double n_rc = !any ? 0 : (mc.recompute_layers > 0 ? std::min<double>(mc.recompute_layers, nl) : nl);
    double stored = 0, rec_c = 0, wst_c = 0;
    for (int f = 0; f < kNumFields; ++f) {
      const bool k = keeps(mc.recompute, f);
      stored += ((nl - n_rc) + (k ? n_rc : 0)) * field_bytes(f);
      if (!k && n_rc > 0) rec_c += width[f] * C * elem_bytes(f);  // rec_ is sized C (transformer.cpp)
      // ZB-H1 W stashes: the W operands a recomputed layer does not keep.
      const bool w_operand = f == kXn1 || f == kO || f == kXn2 || f == kA || f == kH1 || f == kQ || f == kK ||
                             f == kV || f == kG || f == kU;
      if (!k && w_operand) wst_c += n_rc * field_bytes(f);
    }
    wstash += wslots * wst_c;
    // Stage top: x_out (every chunk); last chunk: rstd_f, xn_f, logits, ce_lse.
    const double top = d * C_sp * b + (head ? C_sp * b + d * C_sp * (bf16 ? 2.0 : b) + (V + 1) * C * b : 0);
    acts += s * (stored + top);
    rec += rec_c;
    grad_ws += (2 * d + 2 * qd + 2 * kd + 3 * F + 3 + (bf16 ? std::max(d, F) : 0.0)) * C * b;  // bf16: + kWide
    // Per-micro-batch p2p buffers (executor.cpp: grow-only, one per mb).
    const double C_p2p = sp ? std::ceil(C_cp / tp) : C_cp;
    const int nbuf = (p > 1 ? (c > 0) + (c < p * v - 1) : 0) + (c > 0);
    p2p_bufs += double(nbuf) * m * C_p2p * d * b;
  }
  for (int f = 0; f < kNumFields; ++f)
    if (keeps(mc.recompute, f)) kept += std::string(kept.empty() ? "" : " ") + kFieldName[f];

  e.terms.push_back({"parameters", params * b, "model::param_values"});
  e.terms.push_back({"gradients", params * b, "model::param_grads"});
  e.terms.push_back({"optimizer_state", moments * 4.0,
                     par.zero == 1 ? fmt::format("AdamW m, v (fp32) / G={}", G) : "AdamW m, v (fp32)"});
  if (grad_shard > 0)
    e.terms.push_back({"grad_shard", grad_shard * 4.0,
                       fmt::format("optim::grad_shard: the ZeRO-1 reduce-scatter's receive buffer / G={}", G)});
  e.terms.push_back({"activations", acts,
                     fmt::format("model::activations: {} slots x ({} per layer{}, x_out, last stage: logits)", e.slots,
                                 kept, mc.recompute_layers > 0 ? " in recomputed layers" : "")});
  if (bf16) {
    e.terms.push_back({"bf16_weights", bf16_w,
                       widen ? std::string("model::bf16_weights: none on the widen path (blocks rounded from the "
                                           "master into bf16_operands)")
                             : fmt::format("model::bf16_weights: bf16 copies of the GEMM weights ({} B/element, "
                                           "sbgemm / cublasGemmEx path)", bb)});
    e.terms.push_back({"bf16_operands", bf16_ws, "model::bf16_operands: rounded GEMM operands (bf16_gemm.hpp)"});
  }
  if (cfg.comm.grad_reduce_dtype == "bf16" && G > 1)
    e.terms.push_back({"grad_reduce_bf16", chunk_max * 2,
                       "optim::grad_bf16: the largest chunk's gradient in bf16 for comm.grad_reduce_dtype=bf16"});
  e.terms.push_back({"recompute_workspace", rec, "model::recompute (one layer's dropped fields)"});
  if (wstash > 0)
    e.terms.push_back({"weight_grad_stash", wstash, "model::weight_grad_stash: ZB-H1's delayed-W operands of recomputed layers"});
  e.terms.push_back({"grad_workspace", grad_ws,
                     bf16 ? "model::grad_scratch (dres dxn dq dk dv do da dg du ce, bf16 staging)"
                          : "model::grad_scratch (dres dxn dq dk dv do da dg du ce)"});
  if (sp) e.terms.push_back({"sp_gather", 2 * C * d * b * v, "SP all-gathered norm output and its gradient"});
  if (cp > 1) e.terms.push_back({"cp_kv_buffers", 5 * C * kd * b, "cp_kv: gathered K, V, dK, dV, temp"});
  {
    // Team scratch of the attention kernels: a host backend keeps one
    // allocation of the largest kernel's per thread (Kokkos::Serial::
    // scratch_mem); on a GPU level-0 scratch is on-chip, not a Kokkos allocation.
    constexpr bool host = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;
    const auto t = model::attention_tiles<float>(int(D));
    const double bytes =
        host ? double(ExecSpace().concurrency()) * double(std::max({t.forward_bytes, t.dkdv_bytes, t.dq_bytes})) : 0.0;
    e.terms.push_back({"attention_scratch", bytes, "Kokkos team scratch of the attention kernels (host backends)"});
  }
  e.terms.push_back({"p2p_buffers", p2p_bufs, "pp_recv, pp_send_grad (one per micro-batch)"});
  e.terms.push_back({"batch_inputs", m * 5.0 * C_cp * 4.0 + (cp > 1 ? m * C * 4.0 : 0.0),
                     "token_ids labels positions kv_lo kv_hi (int32), cp_perm"});
  return e;
}

std::vector<MemoryEstimate> predict_memory_stages(const core::Config& cfg, std::int64_t vocab,
                                                  const MemoryOptions& opt) {
  std::vector<MemoryEstimate> out;
  for (int r = 0; r < cfg.parallel.pp; ++r) out.push_back(predict_memory(cfg, vocab, r, 0, opt));
  return out;
}

MemoryEstimate max_memory(const std::vector<MemoryEstimate>& stages) {
  MemoryEstimate best;
  for (const auto& e : stages)
    if (best.terms.empty() || e.total() > best.total()) best = e;
  return best;
}

std::string format_memory(const MemoryEstimate& e) {
  std::string out = "total " + core::format_bytes(e.total()) + " =";
  bool first = true;
  for (const auto& t : e.terms) {
    if (t.bytes <= 0) continue;
    out += fmt::format("{} {} {}", first ? "" : " +", t.name, core::format_bytes(t.bytes));
    first = false;
  }
  out += fmt::format(" ({} in flight, capacity {:.0f} tokens)", e.slots, e.capacity_tokens);
  return out;
}

HostPlacement check_memory_fits(const core::Config& cfg, const grid::ProcessGrid& grid, double mine) {
  constexpr bool host = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;
  HostPlacement where_ranks;
  double need = mine, have = 0;
  std::string where;
  if (host) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    where_ranks.host = name;
    const int color = int(std::hash<std::string>{}(name) & 0x3fffffff);
    const auto node = grid.world().split(color, grid.rank());
    need = node->allreduce_value(mine);
    const double avail = double(core::available_host_bytes());
    have = node->allreduce_value(avail, comm::ReduceOp::Min);
    where = fmt::format("MemAvailable of host {} (/proc/meminfo), shared by its {} ranks", name, node->size());
    where_ranks.host_ranks = node->size();
    where_ranks.one_host =
        grid.world().allreduce_value(node->size() == grid.world_size() ? 1 : 0, comm::ReduceOp::Min) == 1;
    if (avail < 0) return where_ranks;  // unknown: no bound
  } else {
    // Without plan.device_memory_gib / plan.device: this rank's device's total.
    const auto budget = core::device_memory_budget(cfg, core::detected_device_memory_bytes());
    have = budget.bytes;
    where = budget.source;
  }
  const int over = grid.world().allreduce_value(need > have ? 1 : 0, comm::ReduceOp::Max);
  if (over == 0) return where_ranks;
  const double worst = grid.world().allreduce_value(mine, comm::ReduceOp::Max);
  throw core::ConfigError(fmt::format(
      "the memory model predicts {} on this rank (pp rank {}, tp rank {}; {} needed{}; max over ranks {}), but "
      "only {} is available ({}): reduce train.micro_batches, train.max_seq_len/balance.max_tokens or "
      "model size, or use more ranks, model.recompute, parallel.zero=1",
      core::format_bytes(mine), grid.pp_rank(), grid.tp_rank(), core::format_bytes(need),
      host ? " by the ranks of this host" : "", core::format_bytes(worst), core::format_bytes(have), where));
}

}  // namespace wlb::pipeline

// Rank 0's reports of a run. See report.hpp.
#include "wlb4d/train/report.hpp"

#include "wlb4d/core/memory.hpp"
#include "wlb4d/core/types.hpp"
#include "wlb4d/model/transformer.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <ctime>

namespace wlb::train {

std::string tp_host_advice(int tp, int world, int host_ranks, int host_cores) {
  if (tp <= 1 || host_ranks != world || world < 1 || host_cores >= kTpAdviceCoresPerRank * world) return {};
  return fmt::format(
      "parallel.tp={} with all {} ranks on one host of {} cores (fewer than {} per rank): tensor parallelism is not "
      "advised here. Every layer all-reduces its activations over TP in the forward and its input gradients in the "
      "backward, and at these sizes that costs about what the split GEMMs save: measured on "
      "inputs/bench-quickstart.ini, 2 ranks on 2 shared cores, tp=2 ran at 0.80x of 1 rank's tokens/s (0.74-0.84x; "
      "313-340 ms of a 655-715 ms step in TP collectives, 286-312 ms computing), dp=2 at 1.27x. Prefer parallel.dp (or pp) over tp on this host; "
      "tp pays across GPUs or hosts with many cores per rank.",
      tp, world, host_cores, kTpAdviceCoresPerRank);
}

std::string hms(double seconds) {
  const auto t = std::int64_t(std::max(0.0, seconds) + 0.5);
  return fmt::format("{}:{:02d}:{:02d}", t / 3600, int(t / 60 % 60), int(t % 60));
}

std::string human_count(double x) {
  if (x < 1e3) return fmt::format("{:.0f}", x);
  if (x < 1e6) return fmt::format("{:.1f}k", x * 1e-3);
  if (x < 1e9) return fmt::format("{:.2f}M", x * 1e-6);
  return fmt::format("{:.2f}G", x * 1e-9);
}

StepFigures step_figures(const std::vector<io::TimingRecord>& all) {
  StepFigures f;
  double tmin = 1e300, tsum = 0, cmax = 0, csum = 0;
  for (const auto& r : all) {
    f.ca_exposed = std::max(f.ca_exposed, r.ca_exposed);
    f.ca_bytes += r.ca_bytes / 2;  // each byte is counted by its sender and its receiver
    f.ca_imbalance_before = std::max(f.ca_imbalance_before, r.ca_imbalance_before);
    f.ca_imbalance = std::max(f.ca_imbalance, r.ca_imbalance);
    f.dp_exposed = std::max(f.dp_exposed, r.dp_exposed);
    f.dp_in_flight = std::max(f.dp_in_flight, r.dp_in_flight);
    f.tp_exposed = std::max(f.tp_exposed, r.tp_exposed);
    f.tp_in_flight = std::max(f.tp_in_flight, r.tp_in_flight);
    f.rss_mib = std::max(f.rss_mib, r.rss_mib);
    f.mem_measured_bytes = std::max(f.mem_measured_bytes, double(r.mem_measured));
    f.eval = std::max(f.eval, r.time[io::kEval]);
    f.checkpoint = std::max(f.checkpoint, r.time[io::kCheckpoint]);
    f.sample = std::max(f.sample, r.time[io::kSample]);
    f.ckpt_write = std::max(f.ckpt_write, r.ckpt_write);
    const double c = r.time[io::kForward] + r.time[io::kBackward];
    tmin = std::min(tmin, c);
    f.compute_max = std::max(f.compute_max, c);
    tsum += c;
    cmax = std::max(cmax, r.compute_cpu);
    csum += r.compute_cpu;
  }
  if (!all.empty()) {
    f.compute_min = tmin;
    f.compute_mean = tsum / double(all.size());
  }
  // Measured imbalance: max/mean compute CPU time over ranks (not wall, which
  // time-slicing inflates when ranks outnumber cores).
  f.cpu_imbalance = csum > 0 ? cmax / (csum / double(all.size())) : 1.0;
  return f;
}

std::string source_tag(int k, const std::string& name) {
  std::string stem = name.substr(0, name.find(' '));  // a source of several paths: the first
  if (const auto slash = stem.rfind('/'); slash != std::string::npos) stem = stem.substr(slash + 1);
  if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".h5") == 0) stem.resize(stem.size() - 3);
  std::string kept;
  for (char c : stem)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') kept += c;
  const auto b = kept.find_first_not_of("-_."), e = kept.find_last_not_of("-_.");
  kept = b == std::string::npos ? std::string() : kept.substr(b, e - b + 1);
  return std::to_string(k) + (kept.empty() ? "" : "_" + kept);
}

std::vector<io::ScalarValue> source_scalars(const StepResult& last, const std::vector<std::string>& names) {
  std::vector<io::ScalarValue> v;
  if (last.source_tokens.empty()) return v;
  if (names.size() != last.source_tokens.size() || last.source_drawn.size() != last.source_tokens.size())
    throw std::invalid_argument(fmt::format("source_scalars: {} source names for {} sources", names.size(),
                                            last.source_tokens.size()));
  std::int64_t drawn = 0;
  for (auto d : last.source_drawn) drawn += d;
  for (std::size_t s = 0; s < names.size(); ++s) {
    const std::string tag = "data/source/" + source_tag(int(s) + 1, names[s]);
    v.push_back({tag + "/tokens", double(last.source_tokens[s])});
    v.push_back({tag + "/drawn_share", drawn > 0 ? double(last.source_drawn[s]) / double(drawn) : 0.0});
  }
  return v;
}

std::vector<io::ScalarValue> step_scalars(const StepResult& last, const StepFigures& f) {
  std::vector<io::ScalarValue> v = {
      {"train/loss", last.loss},
      {"train/lr", last.lr},
      {"train/grad_norm", last.grad_norm},
      {"train/tokens_per_s", last.seconds > 0 ? double(last.tokens) / last.seconds : 0.0},
  };
  if (last.record.mfu >= 0) v.push_back({"train/mfu", last.record.mfu});
  if (last.val_loss >= 0) v.push_back({"val/loss", last.val_loss});
  v.push_back({"mem/peak_rss_mib", f.rss_mib});
  v.push_back({"balance/imbalance_attn", last.record.attn_imbalance});
  v.push_back({"balance/imbalance_lat", last.record.latency_imbalance});
  v.push_back({"balance/imbalance_cpu", f.cpu_imbalance});
  if (f.ca_imbalance_before > 0) {
    v.push_back({"balance/core_attn_before", f.ca_imbalance_before});
    v.push_back({"balance/core_attn_after", f.ca_imbalance});
  }
  v.push_back({"comm/dp_exposed_ms", f.dp_exposed * 1e3});
  v.push_back({"comm/dp_in_flight_ms", f.dp_in_flight * 1e3});
  v.push_back({"comm/tp_exposed_ms", f.tp_exposed * 1e3});
  v.push_back({"comm/tp_in_flight_ms", f.tp_in_flight * 1e3});
  v.push_back({"time/step_ms", last.seconds * 1e3});
  if (f.eval > 0) v.push_back({"time/eval_ms", f.eval * 1e3});
  if (f.checkpoint > 0) v.push_back({"time/checkpoint_ms", f.checkpoint * 1e3});
  if (f.ckpt_write > 0) v.push_back({"time/checkpoint_write_ms", f.ckpt_write * 1e3});
  if (f.sample > 0) v.push_back({"time/sample_ms", f.sample * 1e3});
  return v;
}

std::string step_timestamp(std::time_t t) {
  std::tm local{};
  localtime_r(&t, &local);
  char buf[32] = {};
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &local);
  return buf;
}

double memory_share(const StepFigures& f, const StepLineContext& ctx) {
  if (!(ctx.mem_capacity_bytes > 0)) return -1;
  const double used = ctx.mem_on_device ? f.mem_measured_bytes : f.rss_mib * 1024.0 * 1024.0;
  return used / ctx.mem_capacity_bytes;
}

std::string format_step_line(const StepResult& last, const std::vector<io::TimingRecord>& all, const Throughput& w,
                             const StepLineContext& ctx) {
  const StepFigures f = step_figures(all);
  const std::string val = last.val_loss >= 0 ? fmt::format(" val {:.4f}", last.val_loss) : "";
  const double flops_dev = w.seconds > 0 ? w.flops / w.seconds / double(ctx.devices) : 0;
  const std::string mfu =
      ctx.peak_tflops > 0 ? fmt::format(" MFU {:.3g}%", 100.0 * flops_dev / (ctx.peak_tflops * 1e12)) : "";
  const double share = memory_share(f, ctx);
  const std::string mem = share >= 0 ? fmt::format("mem {:.1f}%", 100.0 * share)
                                     : fmt::format("mem {:.0f} MiB", ctx.mem_on_device
                                                                         ? f.mem_measured_bytes / 1048576.0
                                                                         : f.rss_mib);
  const std::string extra = (f.eval > 0 ? fmt::format(" | eval {:.0f} ms", f.eval * 1e3) : std::string()) +
                            (f.checkpoint > 0 ? fmt::format(" | ckpt {:.0f} ms", f.checkpoint * 1e3) : std::string()) +
                            (f.ckpt_write > 0 ? fmt::format(" | ckpt write {:.0f} ms (background)", f.ckpt_write * 1e3)
                                              : std::string()) +
                            (f.sample > 0 ? fmt::format(" | sample {:.0f} ms", f.sample * 1e3) : std::string());
  // A blend: the step's tokens per source, and each source's share of all tokens drawn so far.
  std::string src;
  if (last.source_tokens.size() > 1) {
    double drawn = 0;
    for (auto t : last.source_drawn) drawn += double(t);
    std::string toks, shares;
    for (std::size_t s = 0; s < last.source_tokens.size(); ++s) {
      toks += (s ? "/" : "") + human_count(double(last.source_tokens[s]));
      shares += fmt::format("{}{:.1f}", s ? "/" : "",
                            drawn > 0 && s < last.source_drawn.size() ? 100.0 * double(last.source_drawn[s]) / drawn : 0.0);
    }
    src = " | src " + toks + " (drawn " + shares + "%)";
  }
  const std::string skip =
      last.skipped ? fmt::format(" | SKIPPED (z loss {:.1f} grad {:.1f})", last.z_loss, last.z_grad) : std::string();
  return fmt::format(
      "[{}] step {:>5}/{} | loss {:.4f}{} lr {:.2e} gnorm {:.3f}{} | samples {} skipped {}{} | {:.0f} tok/s/dev {:.3g} "
      "TFLOP/s/dev{} | {} | step {:.0f} ms{}{}",
      ctx.timestamp.empty() ? step_timestamp(std::time(nullptr)) : ctx.timestamp, last.step + 1, ctx.total_steps,
      last.loss, val, last.lr, last.grad_norm, skip, human_count(double(last.samples)), last.skipped_steps, src,
      w.seconds > 0 ? w.tokens / w.seconds / double(ctx.devices) : 0.0, flops_dev * 1e-12, mfu, mem,
      last.seconds * 1e3, extra, ctx.stragglers);
}

std::string format_detail_line(const StepResult& last, const std::vector<io::TimingRecord>& all,
                               const StepLineContext& ctx) {
  const StepFigures f = step_figures(all);
  // Disaggregated attention: the plan's max/mean attention cost over ranks before -> after, traffic, wait.
  // Group imbalance of the plan (Σ over micro-batches of max / mean; the worst group over stages).
  const std::string ca = f.ca_imbalance_before > 0
                             ? fmt::format(" | core attn {:.2f}->{:.2f}, {:.1f} MiB, exposed {:.1f} ms",
                                           f.ca_imbalance_before, f.ca_imbalance, f.ca_bytes / 1048576.0,
                                           f.ca_exposed * 1e3)
                             : std::string();
  const double used = ctx.mem_on_device ? f.mem_measured_bytes / 1048576.0 : f.rss_mib;
  const std::string of =
      ctx.mem_capacity_bytes > 0
          ? fmt::format(" of {} {}", core::format_bytes(ctx.mem_capacity_bytes),
                        ctx.mem_on_device ? "(device)" : "(host MemTotal / ranks on the host)")
          : std::string();
  return fmt::format(
      "[{}] detail {:>3}/{} | elapsed {} ETA {} | tokens {} ({}/step) | mem {:.0f} MiB{} | compute min/mean/max {:.0f}/{:.0f}/{:.0f} "
      "ms | imbalance attn {:.2f} lat {:.2f} cpu {:.2f} | comm exposed/in flight dp {:.1f}/{:.1f} tp {:.1f}/{:.1f} "
      "ms{}",
      ctx.timestamp.empty() ? step_timestamp(std::time(nullptr)) : ctx.timestamp, last.step + 1, ctx.total_steps,
      hms(ctx.elapsed), hms(ctx.eta), human_count(double(last.record.tokens_seen)), last.tokens, used, of, f.compute_min * 1e3,
      f.compute_mean * 1e3, f.compute_max * 1e3, last.record.attn_imbalance, last.record.latency_imbalance,
      f.cpu_imbalance, f.dp_exposed * 1e3, f.dp_in_flight * 1e3, f.tp_exposed * 1e3, f.tp_in_flight * 1e3, ca);
}

bool detail_due(std::int64_t step, std::int64_t last_detail_step, bool first_line, bool last_step, int every) {
  if (every <= 0) return false;
  return first_line || last_step || step - last_detail_step >= every;
}


void print_memory_model(const core::Config& cfg, std::int64_t vocab, const pipeline::MemoryOptions& opt) {
  // What scripts/bench.sh divides by the SGEMM rate for the GEMM-bound share.
  const std::int64_t nmm = model::matmul_params(cfg.model, vocab);
  spdlog::info("model: {} matmul parameters (LM head included, embedding excluded), vocabulary {}: "
               "GEMM work 6*N_mm = {:.4g} FLOP per token (forward + backward)",
               nmm, vocab, 6.0 * double(nmm));
  const auto stages = pipeline::predict_memory_stages(cfg, vocab, opt);
  for (const auto& e : stages)
    spdlog::info("memory model: pp rank {} (tp rank 0): {}", e.pp_rank, pipeline::format_memory(e));
  spdlog::info("memory model: predicted peak per rank, max over ranks {} (pp rank {})",
               core::format_bytes(pipeline::max_memory(stages).total()), pipeline::max_memory(stages).pp_rank);
}

void print_run_summary(const grid::ProcessGrid& grid, double predicted_bytes, const StepResult& last,
                       std::int64_t step, int total_steps, bool stopped) {
  const int n = grid.world_size();
  std::vector<double> mine = {predicted_bytes, double(core::kokkos_peak_bytes(MemSpace::name())),
                              double(core::peak_rss_bytes()), double(grid.pp_rank()), double(grid.tp_rank())};
  std::vector<double> all(mine.size() * std::size_t(n));
  grid.world().allgather(mine.data(), all.data(), mine.size());
  if (grid.rank() != 0) return;
  // One min/mean/max line (thousands of ranks must not print thousands of
  // lines); a line per rank at log.level=debug.
  double rss_min = 1e300, rss_max = 0, rss_sum = 0, k_min = 1e300, k_max = 0, k_sum = 0, pred_max = 0;
  int rss_argmax = 0;
  for (int r = 0; r < n; ++r) {
    const double* x = &all[std::size_t(r) * mine.size()];
    spdlog::debug("memory rank {} (pp {}, tp {}): predicted {} | measured Kokkos peak {} ({:+.1f}%) | peak RSS {}",
                  r, int(x[3]), int(x[4]), core::format_bytes(x[0]), core::format_bytes(x[1]),
                  x[0] > 0 ? (x[1] / x[0] - 1) * 100 : 0.0, core::format_bytes(x[2]));
    if (x[2] / (1024.0 * 1024.0) > rss_max) rss_argmax = r;
    rss_min = std::min(rss_min, x[2] / (1024.0 * 1024.0));
    rss_max = std::max(rss_max, x[2] / (1024.0 * 1024.0));
    rss_sum += x[2] / (1024.0 * 1024.0);
    k_min = std::min(k_min, x[1]);
    k_max = std::max(k_max, x[1]);
    k_sum += x[1];
    pred_max = std::max(pred_max, x[0]);
  }
  if (n == 1)
    spdlog::info("memory: predicted {} | measured Kokkos peak {} ({:+.1f}%) | peak RSS {:.0f} MiB",
                 core::format_bytes(pred_max), core::format_bytes(k_max),
                 pred_max > 0 ? (k_max / pred_max - 1) * 100 : 0.0, rss_max);
  else
    spdlog::info("memory over {} ranks: predicted max {} | measured Kokkos peak min/mean/max {}/{}/{} | peak RSS "
                 "min/mean/max {:.0f}/{:.0f}/{:.0f} MiB (highest: rank {})",
                 n, core::format_bytes(pred_max), core::format_bytes(k_min), core::format_bytes(k_sum / n),
                 core::format_bytes(k_max), rss_min, rss_sum / n, rss_max, rss_argmax);
  if (stopped) spdlog::warn("stop requested (SIGTERM/SIGUSR1): checkpoint written after step {}", step);
  if (total_steps > 0)
    spdlog::info("done: {} steps | {} | final loss {:.4f}{}", step,
                 n == 1 ? fmt::format("peak memory {:.0f} MiB", rss_max)
                        : fmt::format("peak memory per rank {:.0f}-{:.0f} MiB", rss_min, rss_max),
                 last.loss, last.val_loss >= 0 ? fmt::format(" | val {:.4f}", last.val_loss) : "");
}

}  // namespace wlb::train

// Input deck: Boost.Program_options INI parsing into typed Config structs.
#include "wlb4d/core/config.hpp"

#include "wlb4d/core/attention_kernel.hpp"
#include "wlb4d/core/device_table.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/sources.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <charconv>
#include <fstream>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <algorithm>
#include <sstream>

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace wlb::core {
namespace {

// ---- value formatting ------------------------------------------------------
template <class T> std::string show(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    // The shortest text that parses back to the same double (std::to_chars):
    // 0.0003 and 600 as written in a deck, not 0.00029999999999999997 or 6e+02.
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);
    return std::string(buf, r.ptr);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else {
    return std::to_string(v);
  }
}

// A rule returns "" when satisfied, else the rule text ("must be >= 1").
template <class T> using Rule = std::function<std::string(const T&)>;

template <class T> Rule<T> at_least(T lo) {
  return [lo](const T& v) { return v >= lo ? std::string() : "must be >= " + show(lo); };
}
template <class T> Rule<T> in_range(T lo, T hi) {
  return [lo, hi](const T& v) {
    return (v >= lo && v <= hi) ? std::string() : "must be in [" + show(lo) + ", " + show(hi) + "]";
  };
}
Rule<double> positive() {
  return [](const double& v) { return v > 0 ? std::string() : std::string("must be > 0"); };
}
Rule<std::string> one_of(std::vector<std::string> allowed) {
  return [allowed](const std::string& v) {
    for (const auto& a : allowed) {
      if (v == a) return std::string();
    }
    std::string s = "must be one of";
    for (const auto& a : allowed) s += " " + a;
    return s;
  };
}
template <class T> Rule<T> any() {
  return [](const T&) { return std::string(); };
}

// ---- strict value conversion ---------------------------------------------------
// Boost reads bool and unsigned keys too leniently: an empty value is `true`
// ("--checkpoint.at_end=") and "-1" wraps to 18446744073709551615. Those keys
// are therefore read as text and converted here; every other type is Boost's.
template <class T> struct DeckValue {
  using Text = T;
  static Text text(const T& v) { return v; }
  static T parse(const Text& v, const std::string&) { return v; }
};

template <> struct DeckValue<bool> {
  using Text = std::string;
  static Text text(bool v) { return v ? "true" : "false"; }
  static bool parse(const std::string& raw, const std::string& name) {
    std::string v;
    for (char ch : raw)
      if (!std::isspace(static_cast<unsigned char>(ch))) v += char(std::tolower(static_cast<unsigned char>(ch)));
    if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
    if (v == "false" || v == "0" || v == "no" || v == "off") return false;
    throw ConfigError("malformed value for " + name + ": '" + raw +
                      "' must be true or false (or 1/0, yes/no, on/off); an empty value is not a bool");
  }
};

template <> struct DeckValue<std::uint64_t> {
  using Text = std::string;
  static Text text(std::uint64_t v) { return std::to_string(v); }
  static std::uint64_t parse(const std::string& raw, const std::string& name) {
    const auto b = raw.find_first_not_of(" \t"), e = raw.find_last_not_of(" \t");
    const std::string v = b == std::string::npos ? std::string() : raw.substr(b, e - b + 1);
    const std::string rule = "' must be an unsigned integer in [0, 18446744073709551615]";
    bool digits = !v.empty();
    for (char ch : v) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
    if (!digits) throw ConfigError("malformed value for " + name + ": '" + raw + rule);
    errno = 0;
    const unsigned long long x = std::strtoull(v.c_str(), nullptr, 10);
    if (errno == ERANGE) throw ConfigError("malformed value for " + name + ": '" + raw + rule);
    return static_cast<std::uint64_t>(x);
  }
};

// ---- the key table -----------------------------------------------------------
struct KeySpec {
  std::string name;     // section.key
  std::string help;     // with unit
  std::function<void(po::options_description&, const Config&)> add;
  std::function<void(const po::variables_map&, Config&)> read;
  std::function<std::string(const Config&)> print;
  std::function<void(const Config&)> check;
};

template <class T>
KeySpec make_key(const std::string& name, std::function<T&(Config&)> ref, const std::string& help,
                 Rule<T> rule) {
  KeySpec k;
  k.name = name;
  k.help = help;
  using Text = typename DeckValue<T>::Text;
  k.add = [name, help, ref](po::options_description& od, const Config& defaults) {
    Config d = defaults;
    od.add_options()(name.c_str(),
                     po::value<Text>()->default_value(DeckValue<T>::text(ref(d)), show(ref(d))),
                     help.c_str());
  };
  k.read = [name, ref](const po::variables_map& vm, Config& c) {
    if (vm.count(name)) ref(c) = DeckValue<T>::parse(vm[name].as<Text>(), name);
  };
  k.print = [ref](const Config& c) { return show(ref(const_cast<Config&>(c))); };
  k.check = [name, ref, rule](const Config& c) {
    const T& v = ref(const_cast<Config&>(c));
    if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(v)) throw ConfigError(name + "=" + show(v) + " must be a finite number (not inf or nan)");
    }
    std::string r = rule(v);
    if (!r.empty()) throw ConfigError(name + "=" + show(v) + " " + r);
  };
  return k;
}

#define WLB_KEY(T, sec, key, help, ...) \
  make_key<T>(#sec "." #key, [](Config& c) -> T& { return c.sec.key; }, help, __VA_ARGS__)

const std::vector<KeySpec>& key_table() {
  static const std::vector<KeySpec> table = {
      // [model]
      WLB_KEY(int, model, layers, "transformer blocks (count)", at_least(1)),
      WLB_KEY(int, model, d_model, "hidden size (elements)", at_least(2)),
      WLB_KEY(int, model, heads, "query heads (count); head_dim = d_model/heads", at_least(1)),
      WLB_KEY(int, model, kv_heads, "key/value heads for GQA (count), divides heads", at_least(1)),
      WLB_KEY(int, model, ffn_hidden, "SwiGLU inner size (elements)", at_least(1)),
      WLB_KEY(double, model, rope_theta, "RoPE base frequency (dimensionless)", positive()),
      WLB_KEY(std::string, model, rope_scaling,
              "RoPE frequency scaling: none|llama3 (Llama 3.1's long-context scaling; rope_factor etc.)",
              one_of({"none", "llama3"})),
      WLB_KEY(double, model, rope_factor, "llama3 RoPE scaling: divisor of the low frequencies", positive()),
      WLB_KEY(double, model, rope_low_freq_factor, "llama3 RoPE scaling: low_freq_factor (dimensionless)",
              positive()),
      WLB_KEY(double, model, rope_high_freq_factor,
              "llama3 RoPE scaling: high_freq_factor (dimensionless, > rope_low_freq_factor)", positive()),
      WLB_KEY(int, model, rope_original_max_position,
              "llama3 RoPE scaling: the pre-training context length (tokens)", at_least(1)),
      WLB_KEY(double, model, norm_eps, "RMSNorm epsilon (dimensionless)", positive()),
      WLB_KEY(double, model, init_std, "std of the normal init of weight matrices", positive()),
      WLB_KEY(int, model, vocab_size,
              "embedding/LM-head rows (tokens); 0: the dataset's vocabulary, else padded size >= it",
              at_least(0)),
      WLB_KEY(bool, model, tie_embeddings,
              "LM head = token embedding (no lm_head.weight; Llama 3.2 1B/3B, GPT-2)", any<bool>()),
      WLB_KEY(std::string, model, recompute,
              "activation recompute: none|selective (norms, SwiGLU product)|full (whole layer forward)",
              one_of({"none", "selective", "full"})),
      WLB_KEY(int, model, recompute_layers, "recompute the first N layers of each stage (count; 0: all)",
              at_least(0)),
      WLB_KEY(std::string, model, attention_kernel,
              "attention kernel: auto (cudnn on a cuDNN build with train.precision=bf16 and a head dim it takes, "
              "else portable)|portable (wlb4d's Kokkos/BLAS kernels)|cudnn (cuDNN fused SDPA, bf16 operands)",
              one_of({"auto", "portable", "cudnn"})),
      // [parallel]
      WLB_KEY(int, parallel, dp, "data-parallel replicas (ranks)", at_least(1)),
      WLB_KEY(int, parallel, pp, "pipeline stages (ranks)", at_least(1)),
      WLB_KEY(int, parallel, cp, "context-parallel ranks per sequence", at_least(1)),
      WLB_KEY(int, parallel, tp, "tensor-parallel ranks (split heads, FFN and vocab)", at_least(1)),
      WLB_KEY(std::string, parallel, schedule,
              "pipeline schedule: gpipe|1f1b|interleaved|bfs|zb1 (zb1: ZB-H1 zero bubble, W delayed into the "
              "cool-down)",
              one_of({"gpipe", "1f1b", "interleaved", "bfs", "zb1"})),
      WLB_KEY(int, parallel, virtual_stages, "model chunks per pipeline rank (interleaved, bfs)",
              at_least(1)),
      WLB_KEY(int, parallel, zero,
              "ZeRO stage: 0 replicated AdamW state | 1 AdamW moments sharded over the DP x CP gradient group",
              in_range(0, 1)),
      WLB_KEY(bool, parallel, sequence_parallel,
              "sequence parallelism: norm/residual regions hold T/tp tokens (needs parallel.tp > 1)", any<bool>()),
      WLB_KEY(bool, parallel, print_coords, "print every rank's (dp,pp,cp,tp) at start-up", any<bool>()),
      // [data]
      WLB_KEY(std::string, data, train,
              "training token dataset(s) from wlb4d-prep: a file, shard files (list or glob) read as one stream, "
              "or a blend of weighted sources 'W1 PATH1 W2 PATH2 ...' (token shares)",
              [](const std::string& v) {
                std::string rule;
                core::parse_sources(v, &rule);
                return rule;
              }),
      WLB_KEY(std::string, data, val,
              "validation token dataset (a file, or shard files as a list or glob; no weights; empty: none)",
              [](const std::string& v) {
                if (v.find_first_not_of(" \t") == std::string::npos) return std::string();
                std::string rule;
                const auto s = core::parse_sources(v, &rule);
                if (rule.empty() && s.size() > 1) rule = "is a blend: the validation set is one source (files, no weights)";
                return rule;
              }),
      WLB_KEY(bool, data, shuffle, "seeded shuffle of document order each epoch", any<bool>()),
      WLB_KEY(std::int64_t, data, max_docs, "use only the first N documents (count; 0: all)",
              at_least<std::int64_t>(0)),
      // [balance]
      WLB_KEY(std::string, balance, packer, "document packer: fixed|greedy|wlb",
              one_of({"fixed", "greedy", "wlb"})),
      WLB_KEY(std::string, balance, sharding, "CP sharding: sequence|document|adaptive",
              one_of({"sequence", "document", "adaptive"})),
      WLB_KEY(std::string, balance, attention,
              "core attention: local|disaggregated (query blocks moved between the DP x CP ranks of a stage "
              "so each computes the same attention cost; DistCA)",
              one_of({"local", "disaggregated"})),
      WLB_KEY(std::int64_t, balance, ca_task_tokens,
              "disaggregated: query rows per core-attention task (tokens; rounded up to the attention tile)",
              at_least<std::int64_t>(1)),
      WLB_KEY(double, balance, ca_tolerance,
              "disaggregated: the assignment stops within (1 + this) of the mean rank attention cost "
              "(dimensionless, >= 0)",
              at_least(0.0)),
      WLB_KEY(std::int64_t, balance, max_tokens, "wlb: token cap per micro-batch (tokens; 0: train.max_seq_len)",
              at_least<std::int64_t>(0)),
      WLB_KEY(int, balance, max_delay, "wlb: most steps a document may wait in an outlier queue (steps)",
              at_least(0)),
      WLB_KEY(std::string, balance, outlier_thresholds,
              "wlb: outlier queue thresholds (tokens, ascending, space-separated) or auto",
              [](const std::string& v) {
                if (v == "auto" || v == "none") return std::string();
                std::istringstream is(v);
                long long prev = 0, x = 0;
                int n = 0;
                std::string tok;
                while (is >> tok) {
                  try {
                    size_t pos = 0;
                    x = std::stoll(tok, &pos);
                    if (pos != tok.size()) throw std::invalid_argument(tok);
                  } catch (...) {
                    return std::string("must be auto, none or ascending positive token counts");
                  }
                  if (x <= prev) return std::string("must be auto, none or ascending positive token counts");
                  prev = x;
                  ++n;
                }
                return n ? std::string() : std::string("must be auto, none or ascending positive token counts");
              }),
      WLB_KEY(bool, balance, calibrate,
              "time this build's kernels at start-up for the cost model (opt-in: the plan then depends on the "
              "machine's timings; the constants are saved in checkpoints and reused on resume). false: "
              "balance.cost_a/cost_b when given, else the FLOP-count model (plan.flops_per_s, "
              "plan.attention_efficiency), the same plan on any machine",
              any<bool>()),
      WLB_KEY(double, balance, cost_a,
              "cost model: seconds per token per layer (calibrate=false; 0 with cost_b 0: the FLOP-count model)",
              at_least(0.0)),
      WLB_KEY(double, balance, cost_b,
              "cost model: seconds per token^2 per layer (calibrate=false; 0 with cost_a 0: the FLOP-count model)",
              at_least(0.0)),
      WLB_KEY(double, balance, cost_c, "cost model: seconds per micro-batch per layer", at_least(0.0)),
      // [optim]
      WLB_KEY(double, optim, lr, "peak learning rate", positive()),
      WLB_KEY(double, optim, min_lr, "final learning rate of the cosine decay", at_least(0.0)),
      WLB_KEY(int, optim, warmup_steps, "linear warm-up (steps)", at_least(0)),
      WLB_KEY(double, optim, beta1, "AdamW beta1", in_range(0.0, 0.999999)),
      WLB_KEY(double, optim, beta2, "AdamW beta2", in_range(0.0, 0.999999)),
      WLB_KEY(double, optim, eps, "AdamW epsilon", positive()),
      WLB_KEY(double, optim, weight_decay, "decoupled weight decay on matrices", at_least(0.0)),
      WLB_KEY(double, optim, grad_clip, "max global gradient L2 norm (0: off)", at_least(0.0)),
      // [train]
      WLB_KEY(int, train, steps, "optimizer steps", at_least(0)),
      WLB_KEY(int, train, micro_batches, "micro-batches per step, all DP replicas together (count)",
              at_least(1)),
      WLB_KEY(int, train, max_seq_len, "tokens per micro-batch of the fixed packer (tokens)", at_least(2)),
      WLB_KEY(std::uint64_t, train, seed, "seed of the initialisation and the data order", any<std::uint64_t>()),
      WLB_KEY(int, train, eval_every, "steps between validations (0: never)", at_least(0)),
      WLB_KEY(std::int64_t, train, eval_tokens, "tokens per validation (tokens)", at_least<std::int64_t>(1)),
      WLB_KEY(int, train, print_every, "steps between rank-0 progress lines", at_least(1)),
      WLB_KEY(int, train, sample_every,
              "steps between text samples rank 0 prints from the current weights (0: never)", at_least(0)),
      WLB_KEY(int, train, sample_tokens, "tokens per sample (train.sample_every)", at_least(1)),
      WLB_KEY(std::string, train, sample_prompt, "text each sample continues (empty: a new document)",
              any<std::string>()),
      WLB_KEY(std::string, train, precision,
              "GEMM precision: fp32|bf16 (bf16 operands rounded to nearest even, fp32 accumulation; master "
              "weights, optimizer state, norms, softmax, loss and gradient sums stay fp32)",
              one_of({"fp32", "bf16"})),
      WLB_KEY(double, train, skip_spike_z,
              "loss-spike guard: skip the optimizer update of a step whose loss or grad norm is more than this many "
              "standard deviations above the mean of the last train.skip_spike_window steps, on every rank alike "
              "(0: off; e.g. 6)",
              at_least(0.0)),
      WLB_KEY(int, train, skip_spike_window, "loss-spike guard: steps in the running window (count)", at_least(2)),
      WLB_KEY(int, train, skip_spike_warmup,
              "loss-spike guard: values the window needs before it judges a step (count, 2..skip_spike_window)",
              at_least(2)),
      // [checkpoint]
      WLB_KEY(std::string, checkpoint, dir, "checkpoint directory", any<std::string>()),
      WLB_KEY(int, checkpoint, every, "steps between checkpoints (0: off)", at_least(0)),
      WLB_KEY(double, checkpoint, every_minutes, "wall-clock minutes between checkpoints (0: off)",
              at_least(0.0)),
      WLB_KEY(int, checkpoint, keep, "newest checkpoints kept (count)", at_least(1)),
      WLB_KEY(std::string, checkpoint, resume, "auto|never|<checkpoint path>",
              [](const std::string& v) { return v.empty() ? std::string("must be auto, never or a path") : std::string(); }),
      WLB_KEY(bool, checkpoint, at_end, "write a checkpoint when the run ends", any<bool>()),
      WLB_KEY(std::string, checkpoint, init_from,
              "start training from these weights (a wlb4d checkpoint of any layout, e.g. written by wlb4d-ckpt "
              "import-hf): weights only, fresh optimizer, step 0; a checkpoint in checkpoint.dir (resume=auto) "
              "takes precedence, so a restarted job resumes; refused with resume=<path> (empty: off)",
              any<std::string>()),
      WLB_KEY(bool, checkpoint, async,
              "write checkpoints in the background: the step copies the state to host buffers (the blocking part, "
              "t_checkpoint) and goes on while a writer thread writes, reads back and commits the same HDF5 file "
              "(ckpt_write); `latest` moves only after the read-back; needs MPI_THREAD_MULTIPLE (else synchronous, "
              "with a message)",
              any<bool>()),
      WLB_KEY(bool, checkpoint, overwrite,
              "with resume=never: replace an earlier run's step files and latest in checkpoint.dir and its "
              "log.timing_file/log.csv_file (false: refuse the run, naming them)",
              any<bool>()),
      // [log]
      WLB_KEY(std::string, log, timing_file, "per-step per-rank timing table (HDF5 path; empty: off)",
              any<std::string>()),
      WLB_KEY(std::string, log, csv_file, "CSV copy of the timing table (path; empty: off)", any<std::string>()),
      WLB_KEY(std::string, log, level, "log level: trace|debug|info|warn|error",
              one_of({"trace", "debug", "info", "warn", "error"})),
      WLB_KEY(double, log, peak_tflops,
              "peak of one device (rank) in TFLOP/s for the step line's and the timing log's MFU "
              "(model FLOP/s per device / peak; 0: plan.device's peak at train.precision, else a CUDA build's "
              "detected device if it is in the table, else no MFU)",
              at_least(0.0)),
      WLB_KEY(int, log, detail_every,
              "steps between the detail lines under the step line (compute min/mean/max, imbalance, exposed "
              "communication, tokens, memory in MiB): printed with the first and the last step line and a step line "
              "at least this many steps after the previous detail line (0: never)",
              at_least(0)),
      WLB_KEY(std::int64_t, log, trace_step,
              "record start/end of every pipeline action of this step (1-based, as the step line counts) in the "
              "timing log's /trace (0: off)",
              at_least<std::int64_t>(0)),
      WLB_KEY(std::string, log, trace_json,
              "the traced step (log.trace_step) as Chrome trace-event JSON for ui.perfetto.dev / chrome://tracing: "
              "auto = log.timing_file with .trace.json for its extension (none without a timing file), a path, "
              "or empty: off",
              any<std::string>()),
      WLB_KEY(std::string, log, tensorboard_dir,
              "directory of TensorBoard event files with the step scalars (loss, lr, grad norm, throughput, MFU, "
              "memory, imbalance, exposed communication, step/checkpoint time, validation loss); rank 0 "
              "creates it and a new file per start (empty: off)",
              any<std::string>()),
      WLB_KEY(double, log, straggler_factor,
              "straggler flag: name a rank whose forward+backward time exceeds this factor x the median of its "
              "pipeline stage's ranks for log.straggler_steps consecutive steps (0: off; e.g. 1.5; not an abort)",
              [](const double& v) {
                return v == 0 || v > 1 ? std::string() : std::string("must be 0 (off) or > 1");
              }),
      WLB_KEY(int, log, straggler_steps, "straggler flag: consecutive slow steps before a rank is named (count)",
              at_least(1)),
      // [comm]
      WLB_KEY(std::string, comm, wait, "yield (MPI_Test + sched_yield; oversubscribed) | block",
              one_of({"yield", "block"})),
      WLB_KEY(std::string, comm, backend, "collective backend: mpi | nccl (CUDA builds)",
              one_of({"mpi", "nccl"})),
      WLB_KEY(double, comm, timeout_s,
              "collective watchdog (seconds): a wait longer than this ends the job on every rank, naming the "
              "operation, the group and the ranks that did not arrive; also the longest a checkpoint save or load may go "
              "without progress (0: off; comm.wait=yield only: blocking MPI calls cannot be timed, wlb4d warns)",
              at_least(0.0)),
      WLB_KEY(double, comm, bucket_mib,
              "DP x CP gradient bucket size (MiB): each bucket's all-reduce (zero=1: reduce-scatter) starts "
              "nonblocking once the backward has finished its tensors, overlapping the rest of the backward (0: one "
              "reduction after the backward)",
              at_least(0.0)),
      WLB_KEY(std::string, comm, grad_reduce_dtype,
              "DP x CP gradient all-reduce element type: fp32 | bf16 (bf16: each rank's fp32 gradient rounded to "
              "bf16 before the all-reduce, half the bytes; every pairwise sum in fp32, rounded; widened to fp32 "
              "after; one reduction after the backward, no buckets; needs train.precision=bf16 and parallel.zero=0)",
              one_of({"fp32", "bf16"})),
      // [plan]
      WLB_KEY(std::string, plan, lengths, "wlb4d-plan: document lengths (JSON array file or HDF5 dataset)",
              any<std::string>()),
      WLB_KEY(int, plan, steps, "wlb4d-plan: simulated steps", at_least(1)),
      WLB_KEY(std::string, plan, packers, "wlb4d-plan: packers to compare (space-separated)", any<std::string>()),
      WLB_KEY(std::string, plan, shardings, "wlb4d-plan: CP shardings to compare (space-separated)",
              any<std::string>()),
      WLB_KEY(double, plan, alpha_s,
              "wlb4d-plan: per-message latency of the alpha-beta model (seconds; --search: the inter-node link)",
              at_least(0.0)),
      WLB_KEY(double, plan, beta_s_per_byte,
              "wlb4d-plan: seconds per byte of the alpha-beta model (s/byte; --search: the inter-node link)",
              at_least(0.0)),
      WLB_KEY(std::string, plan, device,
              "the device of one rank, from the device table (core/device_table.hpp; datasheet peaks and memory): "
              "its peak at train.precision is the MFU peak of wlb4d and wlb4d-plan, x plan.gemm_efficiency the "
              "planner's GEMM rate, its memory the budget, unless log.peak_tflops, plan.flops_per_s(_bf16) or "
              "plan.device_memory_gib are given (empty: none)",
              [](const std::string& v) {
                return v.empty() || find_device(v) ? std::string()
                                                   : "must be empty or one of " + device_keys();
              }),
      WLB_KEY(double, plan, gemm_efficiency,
              "sustained GEMM rate / plan.device's dense peak at the precision trained (dimensionless, in (0, 1]): "
              "the GEMM rate when plan.flops_per_s(_bf16) is not given",
              [](const double& v) {
                return v > 0 && v <= 1 ? std::string() : std::string("must be in (0, 1]");
              }),
      WLB_KEY(double, plan, flops_per_s,
              "sustained fp32 GEMM throughput per device (FLOP/s; 0: plan.device's fp32 peak x "
              "plan.gemm_efficiency, else 4e14); the rate of wlb4d-plan and of wlb4d's FLOP-count cost model "
              "(balance.calibrate=false without cost_a/cost_b) under train.precision=fp32",
              at_least(0.0)),
      WLB_KEY(double, plan, device_memory_gib,
              "memory per device (GiB; 0: plan.device's, else 80 in wlb4d-plan and the device's detected total "
              "in wlb4d): wlb4d-plan marks layouts whose predicted peak per rank exceeds it; a device (CUDA) build "
              "of wlb4d refuses to start above it",
              at_least(0.0)),
      WLB_KEY(int, plan, nodes,
              "wlb4d-plan --search: nodes of the cluster (count; 0: as many as dp*pp*cp*tp needs); "
              "nodes*devices_per_node must be >= dp*pp*cp*tp",
              at_least(0)),
      WLB_KEY(int, plan, devices_per_node,
              "wlb4d-plan --search: devices (ranks) per node (count); TP stays within a node, groups that fit "
              "a node use the intra-node link",
              at_least(1)),
      WLB_KEY(double, plan, flops_per_s_bf16,
              "sustained bf16 GEMM throughput per device (FLOP/s; 0: plan.device's bf16 peak x "
              "plan.gemm_efficiency, else the fp32 rate); the rate under train.precision=bf16",
              at_least(0.0)),
      WLB_KEY(double, plan, attention_efficiency,
              "wlb4d-plan and wlb4d's FLOP-count cost model: attention kernel FLOP rate / GEMM rate "
              "(dimensionless, in (0, 1])",
              [](const double& v) {
                return v > 0 && v <= 1 ? std::string() : std::string("must be in (0, 1]");
              }),
      WLB_KEY(double, plan, intra_alpha_s, "wlb4d-plan --search: per-message latency within a node (seconds)",
              at_least(0.0)),
      WLB_KEY(double, plan, intra_beta_s_per_byte,
              "wlb4d-plan --search: seconds per byte within a node (s/byte; 1/bandwidth)", at_least(0.0)),
      WLB_KEY(std::string, plan, search_micro_batches,
              "wlb4d-plan --search: micro-batch counts per step to try (space-separated, each >= 1; empty: "
              "train.micro_batches)",
              [](const std::string& v) {
                std::istringstream is(v);
                std::string tok;
                while (is >> tok) {
                  std::size_t pos = 0;
                  long long x = 0;
                  try {
                    x = std::stoll(tok, &pos);
                  } catch (...) {
                    pos = 0;
                  }
                  if (pos != tok.size() || x < 1 || x > 1000000)
                    return std::string("must be empty or space-separated counts in [1, 1000000]");
                }
                return std::string();
              }),
      WLB_KEY(int, plan, search_coarse_steps,
              "wlb4d-plan --search: simulated steps of the coarse pass over every candidate (steps)", at_least(1)),
      WLB_KEY(int, plan, search_refine,
              "wlb4d-plan --search: best coarse candidates re-simulated over plan.steps steps (count)",
              at_least(1)),
      WLB_KEY(std::string, plan, attention,
              "wlb4d-plan: attention executions to compare (space-separated): local (each rank its own CP shard) "
              "and/or disaggregated (core-attention tasks balanced over the DP x CP group of a stage, DistCA)",
              [](const std::string& v) {
                std::istringstream is(v);
                std::string tok;
                int n = 0;
                while (is >> tok) {
                  ++n;
                  if (tok != "local" && tok != "disaggregated")
                    return std::string("must name local and/or disaggregated, not '" + tok + "'");
                }
                return n > 0 ? std::string() : std::string("must name at least one of local, disaggregated");
              }),
      WLB_KEY(std::int64_t, plan, ca_task_tokens,
              "wlb4d-plan: query rows per core-attention task (tokens; rounded up to the attention tile)",
              at_least<std::int64_t>(1)),
      WLB_KEY(double, plan, ca_tolerance,
              "wlb4d-plan: the core-attention assignment stops within (1 + this) of the mean rank cost "
              "(dimensionless, >= 0)",
              at_least(0.0)),
  };
  return table;
}
#undef WLB_KEY

po::options_description deck_options() {
  po::options_description od("Deck keys ([section] key = value in the deck, or --section.key=value)");
  Config defaults;
  for (const auto& k : key_table()) k.add(od, defaults);
  return od;
}

// No prefix guessing: --model.layer must not silently mean --model.layers.
constexpr int kCliStyle = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;

std::string section_of(const std::string& name) { return name.substr(0, name.find('.')); }

/// Levenshtein distance (insert, delete, substitute: 1 each).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

/// "; did you mean 'model.layers'?" for the nearest deck key within a third
/// of the name's length (at least 2 edits), or a word on the unknown section;
/// "" when nothing is near.
std::string did_you_mean(const std::string& name) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(2, name.size() / 3) + 1;
  std::set<std::string> sections;
  for (const auto& k : key_table()) {
    sections.insert(section_of(k.name));
    const std::size_t d = edit_distance(name, k.name);
    if (d < best_d) best_d = d, best = k.name;
  }
  if (!best.empty()) return "; did you mean '" + best + "'?";
  // The right key in the wrong section (train.lr for optim.lr): the same
  // name after the dot, in whichever sections have it.
  if (const auto dot = name.find('.'); dot != std::string::npos) {
    const std::string leaf = name.substr(dot);
    std::string same;
    for (const auto& k : key_table())
      if (k.name.size() > leaf.size() && k.name.compare(k.name.size() - leaf.size(), leaf.size(), leaf) == 0 &&
          k.name.find('.') == k.name.size() - leaf.size())
        same += (same.empty() ? "'" : ", '") + k.name + "'";
    if (!same.empty()) return "; did you mean " + same + "?";
  }
  if (!sections.count(section_of(name))) {
    std::string list;
    for (const auto& s : sections) list += (list.empty() ? "" : ", ") + s;
    return "; '" + section_of(name) + "' is not a section (sections: " + list + ")";
  }
  return "";
}

// Translate Boost's exceptions into messages that name key, value and rule.
[[noreturn]] void rethrow_po(const po::error& e, const std::string& where) {
  if (auto* u = dynamic_cast<const po::unknown_option*>(&e)) {
    std::string key = u->get_option_name();
    while (!key.empty() && key[0] == '-') key.erase(0, 1);
    throw ConfigError("unknown key '" + key + "'" + where + ": not a deck key" + did_you_mean(key) +
                      " (see --help for the list)");
  }
  if (auto* iv = dynamic_cast<const po::validation_error*>(&e)) {
    std::string key = iv->get_option_name();
    while (!key.empty() && key[0] == '-') key.erase(0, 1);
    throw ConfigError(std::string("malformed value for ") + key + where + ": " + e.what());
  }
  if (dynamic_cast<const po::multiple_occurrences*>(&e)) {
    throw ConfigError(std::string("key given twice") + where + ": " + e.what());
  }
  // mpi_main says "deck error: " before this: name only where it is.
  throw ConfigError((where.empty() ? std::string() : where.substr(1) + ": ") + e.what());
}

Config from_vm(const po::variables_map& vm) {
  Config c;
  for (const auto& k : key_table()) k.read(vm, c);
  return c;
}

void parse_ini_stream(std::istream& in, const po::options_description& od, po::variables_map& vm,
                      const std::string& where) {
  try {
    po::store(po::parse_config_file(in, od, /*allow_unregistered=*/false), vm);
  } catch (const po::error& e) {
    rethrow_po(e, where);
  }
}

// ---- deck includes ------------------------------------------------------------
// A deck may start with `include = FILE` lines (top level, before any
// [section]; FILE relative to the including deck's folder; repeatable and
// nestable). The decks are stored into the variables_map highest precedence
// first, and the first stored value of a key wins (po::store), so the order
// below gives: command line > the deck > its last include > ... > its first
// include, each include's own keys before its own includes.

// One deck's text without its include lines, and where it came from.
struct DeckPart {
  std::string body;   // INI text for Boost (include lines blanked)
  std::string where;  // " in deck 'path'" (for messages)
};

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

struct IncludeWalk {
  std::vector<std::pair<std::string, std::string>> chain;  // (canonical, shown) of the open decks
  std::vector<DeckPart> parts;                              // highest precedence first
};

void collect_file(const std::string& shown, const std::string& includer, const std::string& written,
                  IncludeWalk& walk);

// Splits the include lines off `text` (the deck `shown`, whose includes are
// relative to `dir`) and walks them, last first.
void collect_text(const std::string& text, const std::string& where, const std::string& shown,
                  const fs::path& dir, IncludeWalk& walk) {
  // A UTF-8 byte-order mark (editors on Windows write one) is not part of the deck.
  const std::string bom = "\xEF\xBB\xBF";
  std::istringstream in(text.rfind(bom, 0) == 0 ? text.substr(bom.size()) : text);
  std::string line, body;
  std::vector<std::string> includes;
  bool in_section = false;
  while (std::getline(in, line)) {
    const std::string code = trim(line.substr(0, line.find('#')));  // Boost's comment rule
    const auto eq = code.find('=');
    if (!code.empty() && code.front() == '[') {
      in_section = true;
    } else if (eq != std::string::npos && trim(code.substr(0, eq)) == "include") {
      if (in_section)
        throw ConfigError("include" + where +
                          " inside a [section]: 'include = FILE' must come before the first [section]");
      const std::string file = trim(code.substr(eq + 1));
      if (file.empty())
        throw ConfigError("include" + where +
                          " names no file: 'include = FILE' (FILE relative to the including deck's folder)");
      includes.push_back(file);
      body += "\n";
      continue;
    }
    body += line + "\n";
  }
  walk.parts.push_back({std::move(body), where});
  for (auto it = includes.rbegin(); it != includes.rend(); ++it) {
    const fs::path p(*it);
    const std::string inc = (p.is_absolute() ? p : (dir / p)).lexically_normal().string();
    collect_file(inc, shown, *it, walk);
  }
}

// " (include chain: 'top.ini' -> 'base.ini' -> 'include = W')" for an
// included deck, "" for the top deck: where a bad file came from.
std::string include_chain(const IncludeWalk& walk, const std::string& written) {
  if (walk.chain.empty()) return "";
  std::string s = " (include chain: ";
  for (const auto& o : walk.chain) s += "'" + o.second + "' -> ";
  return s + "'include = " + written + "')";
}

// What a path that is not a regular file is, for the message.
std::string file_kind(fs::file_type t) {
  switch (t) {
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::fifo: return "a named pipe (FIFO)";
    case fs::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

// Reads the deck file `shown` (included by `includer` as `written`; both
// empty for the top deck) and walks its includes. The file must be a regular
// file (after symlinks) of at most kMaxDeckBytes, checked before a byte is
// read: /dev/zero, a FIFO or a multi-GB file would otherwise be read without
// bound and end in a bare std::bad_alloc (or never).
void collect_file(const std::string& shown, const std::string& includer, const std::string& written,
                  IncludeWalk& walk) {
  std::error_code ec;
  fs::path canon = fs::weakly_canonical(fs::path(shown), ec);
  const std::string key = ec ? fs::absolute(shown).lexically_normal().string() : canon.string();
  for (const auto& open : walk.chain) {
    if (open.first != key) continue;
    std::string cycle;
    bool on = false;
    for (const auto& o : walk.chain) {
      on = on || o.first == key;
      if (on) cycle += "'" + o.second + "' -> ";
    }
    throw ConfigError("include cycle: " + cycle + "'" + shown +
                      "' (a deck may not include itself, directly or through other decks)");
  }
  const std::string chain = include_chain(walk, written);
  const fs::file_status st = fs::status(fs::path(shown), ec);  // follows symlinks
  if (st.type() == fs::file_type::directory)
    throw ConfigError("deck file '" + shown + "' is a directory: the deck must be an INI file" +
                      (includer.empty() ? std::string() : " (included by '" + includer + "')") + chain);
  const std::string rule = "a deck and each of its includes must be a regular file of at most " +
                           std::to_string(kMaxDeckBytes >> 20) + " MiB";
  if (!ec && fs::exists(st) && st.type() != fs::file_type::regular) {
    std::error_code lec;
    const fs::path target = fs::is_symlink(fs::path(shown), lec) ? fs::read_symlink(fs::path(shown), lec) : fs::path();
    const std::string via = target.empty() ? std::string() : " (a symbolic link to '" + target.string() + "')";
    throw ConfigError("deck file '" + shown + "'" + via + " is " + file_kind(st.type()) + ": " + rule + chain);
  }
  if (!ec && st.type() == fs::file_type::regular) {
    const std::uintmax_t size = fs::file_size(fs::path(shown), ec);
    if (!ec && size > kMaxDeckBytes)
      throw ConfigError("deck file '" + shown + "' is " + std::to_string(size) + " bytes: " + rule + " (" +
                        std::to_string(kMaxDeckBytes) + " bytes)" + chain);
  }
  std::ifstream in(shown, std::ios::binary);
  if (!in) {
    if (includer.empty())
      throw ConfigError("deck file '" + shown + "' cannot be opened (missing or unreadable)");
    throw ConfigError("deck file '" + shown + "' cannot be opened (missing or unreadable): included by '" +
                      includer + "' as 'include = " + written +
                      "' (include paths are relative to the including deck's folder)");
  }
  // At most one byte past the limit: a file that grows after the size check
  // (or a /proc-style file whose size says 0) is still bounded.
  std::string text(kMaxDeckBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxDeckBytes)
    throw ConfigError("deck file '" + shown + "' holds more than " + std::to_string(kMaxDeckBytes) +
                      " bytes: " + rule + chain);
  walk.chain.emplace_back(key, shown);
  collect_text(text, " in deck '" + shown + "'", shown, fs::path(shown).parent_path(), walk);
  walk.chain.pop_back();
}

// Stores every part of the walk (after the command line: CLI wins).
void store_parts(const IncludeWalk& walk, const po::options_description& od, po::variables_map& vm) {
  for (const auto& part : walk.parts) {
    std::istringstream in(part.body);
    parse_ini_stream(in, od, vm, part.where);
  }
}

}  // namespace

void validate(const Config& c) {
  for (const auto& k : key_table()) k.check(c);
  const auto& m = c.model;
  const auto& p = c.parallel;
  auto fail = [](const std::string& s) { throw ConfigError(s); };
  if (m.d_model % m.heads != 0)
    fail(fmt::format("model.heads={} must divide model.d_model={}", m.heads, m.d_model));
  if (m.head_dim() % 2 != 0)
    fail(fmt::format("model.d_model/model.heads={} must be even (RoPE rotates pairs)", m.head_dim()));
  if (m.tie_embeddings && p.pp == 1 && p.virtual_stages > 1)
    fail(fmt::format("model.tie_embeddings=true with parallel.pp=1 needs parallel.virtual_stages=1 (got {}): the "
                     "embedding and the LM head would be two chunks of one rank",
                     p.virtual_stages));
  if (m.rope_scaling == "llama3" && !(m.rope_high_freq_factor > m.rope_low_freq_factor))
    fail(fmt::format("model.rope_high_freq_factor={} must exceed model.rope_low_freq_factor={} "
                     "(model.rope_scaling=llama3 interpolates between the two wavelengths)",
                     m.rope_high_freq_factor, m.rope_low_freq_factor));
  resolve_attention_kernel(m.attention_kernel, m.head_dim(), c.train.precision, cudnn_attention_built());
  if (m.kv_heads > m.heads || m.heads % m.kv_heads != 0)
    fail(fmt::format("model.kv_heads={} must divide model.heads={} (GQA)", m.kv_heads, m.heads));
  if (m.heads % p.tp != 0)
    fail(fmt::format("parallel.tp={} must divide model.heads={}", p.tp, m.heads));
  if (m.kv_heads % p.tp != 0)
    fail(fmt::format("parallel.tp={} must divide model.kv_heads={}", p.tp, m.kv_heads));
  if (m.ffn_hidden < p.tp)  // uneven shards are legal (params.hpp split_range); empty ones are not
    fail(fmt::format("model.ffn_hidden={} must be >= parallel.tp={} (every TP rank needs an FFN column)", m.ffn_hidden,
                     p.tp));
  if (p.sequence_parallel && p.tp < 2)
    fail(fmt::format("parallel.sequence_parallel=true needs parallel.tp > 1 (got parallel.tp={}): it splits the "
                     "norm/residual tokens over the TP group",
                     p.tp));
  if (m.layers < p.pp * p.virtual_stages)
    fail(fmt::format("model.layers={} must be >= parallel.pp*parallel.virtual_stages={} (every stage needs a layer)",
                     m.layers, p.pp * p.virtual_stages));
  if (p.virtual_stages > 1 && p.schedule != "interleaved" && p.schedule != "bfs")
    fail(fmt::format("parallel.virtual_stages={} needs parallel.schedule=interleaved or bfs (got {})",
                     p.virtual_stages, p.schedule));
  if (c.train.micro_batches % p.dp != 0)
    fail(fmt::format("parallel.dp={} must divide train.micro_batches={}", p.dp, c.train.micro_batches));
  const auto& ck = c.checkpoint;
  if (!ck.init_from.empty() && ck.resume != "auto" && ck.resume != "never")
    fail(fmt::format("checkpoint.init_from={} and checkpoint.resume={} together: init_from starts a new run from "
                     "weights (step 0, fresh optimizer), resume=<path> continues one; give one of them",
                     ck.init_from, ck.resume));
  if (p.schedule == "interleaved" && p.virtual_stages > 1 && (c.train.micro_batches / p.dp) % p.pp != 0)
    fail(fmt::format("parallel.pp={} must divide train.micro_batches/parallel.dp={} (parallel.schedule=interleaved "
                     "with virtual_stages > 1; use 1f1b, gpipe or bfs, or change train.micro_batches)",
                     p.pp, c.train.micro_batches / p.dp));
  if (c.optim.min_lr > c.optim.lr)
    fail(fmt::format("optim.min_lr={} must be <= optim.lr={}", c.optim.min_lr, c.optim.lr));
  if (c.balance.max_tokens != 0 && c.balance.max_tokens < c.train.max_seq_len)
    fail(fmt::format("balance.max_tokens={} must be 0 or >= train.max_seq_len={}", c.balance.max_tokens,
                     c.train.max_seq_len));
  if (c.comm.grad_reduce_dtype == "bf16" && c.train.precision != "bf16")
    fail(fmt::format("comm.grad_reduce_dtype=bf16 needs train.precision=bf16 (got train.precision={}): a bf16 "
                     "reduction of an fp32 run would round gradients the run otherwise keeps exact",
                     c.train.precision));
  if (c.comm.grad_reduce_dtype == "bf16" && p.zero != 0)
    fail(fmt::format("comm.grad_reduce_dtype=bf16 needs parallel.zero=0 (got parallel.zero={}): ZeRO-1's "
                     "reduce-scatter has no bf16 variant",
                     p.zero));
  if (!c.log.trace_json.empty() && c.log.trace_json != "auto" && c.log.trace_step == 0)
    fail(fmt::format("log.trace_json='{}' needs log.trace_step = N (the step it draws, 1..train.steps): no step "
                     "is traced with log.trace_step=0",
                     c.log.trace_json));
  if (c.train.skip_spike_warmup > c.train.skip_spike_window)
    fail(fmt::format("train.skip_spike_warmup={} must be <= train.skip_spike_window={} (the window holds at most "
                     "that many values)",
                     c.train.skip_spike_warmup, c.train.skip_spike_window));
  if (c.log.trace_step > c.train.steps)
    fail(fmt::format("log.trace_step={} must be 0 (off) or <= train.steps={} (a step the run reaches)",
                     c.log.trace_step, c.train.steps));
}

void validate_world(const Config& c, int world_size) {
  const auto& p = c.parallel;
  if (p.world() != world_size)
    throw ConfigError(fmt::format(
        "parallel.dp*pp*cp*tp = {}*{}*{}*{} = {} must equal the number of MPI ranks ({})", p.dp, p.pp,
        p.cp, p.tp, p.world(), world_size));
}

Config parse_deck_text(const std::string& ini_text, const std::vector<std::string>& overrides) {
  auto od = deck_options();
  po::variables_map vm;
  if (!overrides.empty()) {
    std::vector<std::string> args;
    for (const auto& o : overrides) args.push_back(o.rfind("--", 0) == 0 ? o : "--" + o);
    try {
      po::store(po::command_line_parser(args).options(od).style(kCliStyle).run(), vm);
    } catch (const po::error& e) {
      rethrow_po(e, " on the command line");
    }
  }
  IncludeWalk walk;  // includes of a text deck are relative to the working directory
  collect_text(ini_text, " in the deck", "(deck text)", fs::path(), walk);
  store_parts(walk, od, vm);
  po::notify(vm);
  Config c = from_vm(vm);
  validate(c);
  return c;
}

CommandLine parse_command_line(int argc, const char* const* argv) {
  auto od = deck_options();
  po::options_description general("General");
  general.add_options()("help,h", "print every deck key with its default, unit and rule")(
      "print-config", "print the resolved deck (INI) and exit")(
      "version", "print the version, git hash, Kokkos, MPI and HDF5 versions and the build type")(
      "check", "validate the deck and the layout for the rank count, then exit (0: OK, 2: deck error)")(
      "check-ranks", po::value<int>(), "with --check: the rank count to check for (default: the MPI world size)")(
      "input,i", po::value<std::string>(), "deck file (INI); also the first positional argument");
  po::options_description all;
  all.add(general).add(od);
  po::positional_options_description pos;
  pos.add("input", 1);

  CommandLine out;
  po::variables_map vm;
  try {
    // "--key=" (an empty value, e.g. to switch off log.timing_file) is split
    // into "--key" "" because Boost rejects an empty value after '='.
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a.size() > 3 && a.rfind("--", 0) == 0 && a.back() == '=' && a.find('=') == a.size() - 1) {
        args.push_back(a.substr(0, a.size() - 1));
        args.emplace_back();
      } else {
        args.push_back(std::move(a));
      }
    }
    auto parsed = po::command_line_parser(args)
                      .options(all)
                      .positional(pos)
                      .style(kCliStyle)
                      .allow_unregistered()
                      .run();
    // Unregistered tokens that look like deck keys (contain a dot) are typos:
    // reject them here; the rest are program-specific flags (e.g. --csv).
    for (const auto& opt : parsed.options) {
      if (!opt.unregistered) continue;
      if (opt.string_key.find('.') != std::string::npos)
        throw ConfigError("unknown key '" + opt.string_key + "' on the command line: not a deck key" +
                          did_you_mean(opt.string_key) + " (see --help for the list)");
      for (const auto& tok : opt.original_tokens) out.extra.push_back(tok);
    }
    po::store(parsed, vm);  // CLI first: the first stored value wins
  } catch (const po::error& e) {
    rethrow_po(e, " on the command line");
  }
  out.help = vm.count("help") > 0;
  out.print_config = vm.count("print-config") > 0;
  out.version = vm.count("version") > 0;
  out.check = vm.count("check") > 0 || vm.count("check-ranks") > 0;
  if (vm.count("check-ranks")) {
    out.check_ranks = vm["check-ranks"].as<int>();
    if (out.check_ranks < 1)
      throw ConfigError("--check-ranks=" + std::to_string(out.check_ranks) + " must be >= 1 (the rank count)");
  }
  if (vm.count("input")) {
    const std::string path = vm["input"].as<std::string>();
    IncludeWalk walk;
    collect_file(path, "", "", walk);
    store_parts(walk, od, vm);
    out.config.deck_path = path;
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    rethrow_po(e, "");
  }
  std::string deck_path = out.config.deck_path;
  out.config = from_vm(vm);
  out.config.deck_path = deck_path;
  if (!out.help && !out.version) validate(out.config);
  return out;
}

std::string to_ini(const Config& c) {
  std::string out, section;
  for (const auto& k : key_table()) {
    std::string s = section_of(k.name);
    if (s != section) {
      out += (section.empty() ? "" : "\n") + std::string("[") + s + "]\n";
      section = s;
    }
    out += k.name.substr(s.size() + 1) + " = " + k.print(c) + "\n";
  }
  return out;
}

std::string layout_rules() {
  return "  parallel.dp*pp*cp*tp = the number of MPI ranks (mpiexec -n, or --check-ranks N)\n"
         "  model.heads divides model.d_model, and head_dim = d_model/heads is even (RoPE)\n"
         "  model.kv_heads divides model.heads (GQA)\n"
         "  parallel.tp divides model.heads and model.kv_heads; model.ffn_hidden >= parallel.tp (may split unevenly)\n"
         "  parallel.pp*parallel.virtual_stages <= model.layers (every stage needs a layer)\n"
         "  parallel.virtual_stages > 1 needs parallel.schedule = interleaved or bfs\n"
         "  parallel.dp divides train.micro_batches\n"
         "  parallel.schedule = interleaved with virtual_stages > 1: parallel.pp divides train.micro_batches/dp\n"
         "  parallel.sequence_parallel = true needs parallel.tp > 1\n"
         "  parallel.cp: any count (each sequence or document is cut in 2*cp chunks)\n"
         "  the vocabulary may split unevenly over parallel.tp; model.vocab_size is 0 or >= the dataset's\n";
}

std::string deck_help(const std::string& usage, const std::vector<std::string>& key_prefixes) {
  po::options_description od("Deck keys this tool reads ([section] key = value in the deck, or --section.key=value)");
  Config defaults;
  for (const auto& k : key_table()) {
    for (const auto& pre : key_prefixes) {
      if (k.name.rfind(pre, 0) == 0) {
        k.add(od, defaults);
        break;
      }
    }
  }
  std::ostringstream os;
  os << usage << "\n" << od;
  return os.str();
}

std::string deck_help() {
  std::ostringstream os;
  os << "Usage: wlb4d DECK.ini [--section.key=value ...] [--print-config] [--check [--check-ranks N]]\n"
     << "             [--version] [--help] [--kokkos-help]\n\n"
     << "Every key below can be set in the deck ([section] key = value) or\n"
     << "overridden on the command line (--section.key=value). Unknown keys are errors.\n"
     << "A deck may start (before any [section]) with lines 'include = base.ini' (relative\n"
     << "to the deck's folder; repeatable, nestable): the deck's keys override its includes'\n"
     << "(a later include overrides an earlier one), the command line overrides all.\n"
     << "The deck and each include must be a regular file of at most 4 MiB.\n"
     << "--print-config prints the resolved deck. --check validates the deck and the layout\n"
     << "for the MPI world size (or --check-ranks N, no mpiexec needed) and exits 0, or 2 with\n"
     << "the error; it reads only the deck and its includes (no dataset, no checkpoint), so\n"
     << "the dataset rules (model.vocab_size, token ids) are checked when the run starts.\n"
     << "--version prints the versions of wlb4d and its libraries; --kokkos-help Kokkos' options.\n\n"
     << "Layout rules (what must divide what):\n"
     << layout_rules() << "\n";
  // The keys by section, each under a one-line summary; the planner's own
  // keys ([plan]) are listed by wlb4d-plan --help, which reads them.
  static const std::map<std::string, std::string> summary = {
      {"model", "the Llama-style decoder: shape, RoPE, norm, vocabulary, tied embeddings, recompute"},
      {"parallel", "the 4D layout (dp*pp*cp*tp = MPI ranks), pipeline schedule, ZeRO-1, sequence parallelism"},
      {"data", "token datasets (written by wlb4d-prep)"},
      {"balance", "per-step document packing and CP sharding (WLB-LLM), the cost model"},
      {"optim", "AdamW, gradient clipping, the learning-rate schedule"},
      {"train", "steps, batch, sequence length, evaluation, samples, precision"},
      {"checkpoint", "HDF5 checkpoints: when, where, retention, resume, init_from"},
      {"comm", "communication: collectives backend, waiting, gradient buckets, timeouts"},
      {"log", "log level, timing files (HDF5/CSV), traces, the device's peak for MFU"},
  };
  Config defaults;
  std::vector<std::string> order;
  for (const auto& k : key_table())
    if (std::find(order.begin(), order.end(), section_of(k.name)) == order.end()) order.push_back(section_of(k.name));
  os << "Deck keys ([section] key = value in the deck, or --section.key=value):\n";
  for (const auto& sec : order) {
    if (sec == "plan") continue;
    const auto it = summary.find(sec);
    po::options_description od("[" + sec + "] " + (it != summary.end() ? it->second : std::string()), 120, 60);
    for (const auto& k : key_table())
      if (section_of(k.name) == sec) k.add(od, defaults);
    os << "\n" << od;
  }
  os << "\n[plan] the planner's keys (cluster, device, search): wlb4d-plan --help\n";
  return os.str();
}

}  // namespace wlb::core

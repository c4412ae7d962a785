#pragma once
/// \file config.hpp
/// \brief The input deck (DESIGN §8): one typed struct per INI section.
///
/// A deck is an INI file read by Boost.Program_options: `[section] key = value`
/// becomes `section.key`. Command-line `--section.key=value` overrides the
/// file. Every key has a default, a unit in its help text and a validation
/// rule; unknown keys, malformed values and violated rules throw
/// wlb::core::ConfigError with a message naming the key, the value and the
/// rule, e.g. "parallel.tp=3 must divide model.heads=8".
///
/// Includes (AMReX ParmParse's `FILE =` idea): a deck may start, before its
/// first [section], with lines `include = base.ini`. The path is relative to
/// the including deck's folder (or absolute); include lines may repeat, and an
/// included deck may include others. Precedence, highest first: the command
/// line, the deck itself, its last include, ..., its first include (each
/// include's own keys above the decks it includes). An include inside a
/// [section], a missing included file or an include cycle is a ConfigError
/// naming the file(s) and the rule; an unknown key in an included deck is an
/// error naming that deck. The deck and every include must be a regular file
/// (after symlinks) of at most kMaxDeckBytes, checked before it is read. The resolved Config (to_ini: what --print-config
/// prints and checkpoints store) has no include lines.

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::core {

/// The largest deck file (the deck itself and each include) the parser reads,
/// in bytes (4 MiB; a real deck is a few KiB). A larger file, or one that is
/// not a regular file (/dev/zero, a FIFO), is a ConfigError naming the file
/// and its include chain, raised before a byte of it is read.
inline constexpr std::uintmax_t kMaxDeckBytes = std::uintmax_t{4} << 20;

/// [model] Llama-style decoder shape. The vocabulary comes from the dataset.
struct ModelConfig {
  int layers = 4;             ///< transformer blocks
  int d_model = 256;          ///< hidden size (elements)
  int heads = 8;              ///< query heads; head_dim = d_model / heads
  int kv_heads = 4;           ///< key/value heads (GQA), divides heads
  int ffn_hidden = 688;       ///< SwiGLU inner size (elements)
  double rope_theta = 10000;  ///< RoPE base
  /// RoPE frequency scaling for contexts beyond pre-training: "none" or
  /// "llama3" (Llama 3.1's wavelength-dependent scaling, HF transformers
  /// `_compute_llama3_parameters`; model::rope_inv_freq has the formula).
  std::string rope_scaling = "none";
  double rope_factor = 8;                  ///< llama3: divisor of the low frequencies
  double rope_low_freq_factor = 1;         ///< llama3: wavelengths above original/low are divided by factor
  double rope_high_freq_factor = 4;        ///< llama3: wavelengths below original/high are kept
  int rope_original_max_position = 8192;   ///< llama3: the pre-training context (tokens)
  double norm_eps = 1e-5;     ///< RMSNorm epsilon
  double init_std = 0.02;     ///< std of the normal init of matrices
  int vocab_size = 0;         ///< 0: the dataset's; else padded size >= the dataset's (e.g. 50304)
  /// The LM head is the token embedding (Press & Wolf 2017, "Using the Output
  /// Embedding to Improve Language Models"; Llama 3.2 1B/3B, GPT-2): no
  /// lm_head.weight; with pp > 1 the last stage holds a replica of
  /// embed.weight whose gradient is summed with the first stage's.
  bool tie_embeddings = false;
  /// Activation recompute (DESIGN §10): none | selective (keep the GEMM
  /// outputs, recompute the RMSNorms and the SwiGLU product in the backward) |
  /// full (keep each layer's input, re-run its forward in the backward).
  std::string recompute = "none";
  int recompute_layers = 0;   ///< recompute the first N layers of each stage (0: all)
  /// Attention kernel: auto | portable | cudnn (core/attention_kernel.hpp has
  /// the rule; the start-up banner names the kernel in use and why).
  std::string attention_kernel = "auto";
  /// Not a deck key: the dataset's vocabulary, set by the trainer. Logits of
  /// ids >= it (the padding of vocab_size) are masked out of the softmax and
  /// the loss (llm.c's convention). 0: every row is a real token.
  int data_vocab = 0;
  int head_dim() const { return d_model / heads; }
  /// Parameters of one transformer layer used in matmuls (elements): Wq and Wo
  /// (d_model·heads·head_dim each), Wk and Wv (d_model·kv_heads·head_dim each),
  /// the SwiGLU gate, up and down projections (d_model·ffn_hidden each). The
  /// two RMSNorm weights (2·d_model) are not matmul parameters. The one
  /// formula the FLOP count, the cost model and the planner share.
  std::int64_t layer_matmul_params() const {
    const std::int64_t d = d_model, hd = head_dim();
    return 2 * d * heads * hd + 2 * d * kv_heads * hd + 3 * d * std::int64_t(ffn_hidden);
  }
};

/// [parallel] 4D layout; world size must equal dp*pp*cp*tp.
struct ParallelConfig {
  int dp = 1, pp = 1, cp = 1, tp = 1;
  std::string schedule = "1f1b";   ///< gpipe | 1f1b | interleaved | bfs
  int virtual_stages = 1;          ///< model chunks per pipeline rank (interleaved/bfs)
  int zero = 0;                    ///< ZeRO stage: 0 | 1 (AdamW moments sharded over DP×CP)
  bool sequence_parallel = false;  ///< norm/residual regions hold T/tp tokens (needs tp > 1)
  bool print_coords = false;       ///< print every rank's (dp,pp,cp,tp) at start-up
  int world() const { return dp * pp * cp * tp; }
};

/// [data] token datasets written by wlb4d-prep.
struct DataConfig {
  std::string train = "data/train.h5";  ///< training dataset (HDF5)
  std::string val;                      ///< validation dataset (HDF5); empty: none
  bool shuffle = true;                  ///< seeded shuffle of the document order per epoch
  std::int64_t max_docs = 0;            ///< use only the first N documents (0: all)
};

/// [balance] WLB-LLM packing and CP sharding (docs/wlb-llm.md; WLB-LLM paper §4–5).
struct BalanceConfig {
  std::string packer = "fixed";      ///< fixed | greedy | wlb
  std::string sharding = "sequence"; ///< sequence | document | adaptive
  std::int64_t max_tokens = 0;       ///< wlb: token cap per micro-batch (0: train.max_seq_len)
  int max_delay = 4;                 ///< wlb: steps a document may wait in an outlier queue
  std::string outlier_thresholds = "auto";  ///< wlb: token lengths, e.g. "2048 8192", or auto
  bool calibrate = false;            ///< time this build's kernels at start-up for the cost model (opt-in; false: deck or FLOP-count model)
  double cost_a = 0;                 ///< seconds per token per layer (when calibrate=false)
  double cost_b = 0;                 ///< seconds per token^2 per layer (when calibrate=false)
  double cost_c = 0;                 ///< seconds per micro-batch per layer (constant)
  /// local | disaggregated: core attention of each layer balanced over the
  /// DP×CP attention group (core-attention disaggregation; model/ca_exchange.hpp)
  std::string attention = "local";
  std::int64_t ca_task_tokens = 256;  ///< disaggregated: query rows per task (tokens)
  double ca_tolerance = 0.02;         ///< disaggregated: stop within (1 + this) of the mean (dimensionless)
};

/// [optim] AdamW + warm-up/cosine schedule + global-norm clipping.
struct OptimConfig {
  double lr = 3e-4;            ///< peak learning rate
  double min_lr = 3e-5;        ///< final learning rate of the cosine decay
  int warmup_steps = 10;       ///< linear warm-up length (steps)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;   ///< decoupled, matrices only
  double grad_clip = 1.0;      ///< max global L2 norm (0: off)
};

/// [train] the loop.
struct TrainConfig {
  int steps = 100;             ///< optimizer steps
  int micro_batches = 4;       ///< micro-batches per step (global, before DP split)
  int max_seq_len = 256;       ///< tokens per micro-batch for the fixed packer
  std::uint64_t seed = 1234;   ///< init, data order
  int eval_every = 25;         ///< steps between validations (0: never)
  std::int64_t eval_tokens = 8192;  ///< tokens per validation
  int print_every = 1;         ///< steps between rank-0 lines
  /// Every N steps rank 0 prints a sample of sample_tokens tokens continuing
  /// sample_prompt ("": a new document) from the current weights (llm.c's
  /// samples during training; infer::Decoder). 0: never.
  int sample_every = 0;
  int sample_tokens = 64;
  std::string sample_prompt;
  /// fp32 | bf16: bf16 GEMM operands (weights copied from the fp32 masters
  /// after every update, activations rounded), fp32 accumulation, fp32
  /// everything else (DESIGN §10, model/bf16_gemm.hpp).
  std::string precision = "fp32";
  /// Loss-spike guard (train/guards.hpp): a step whose loss or global grad
  /// norm lies more than skip_spike_z standard deviations above the mean of
  /// the last skip_spike_window steps skips its optimizer update on every
  /// rank (0: off). Judged once the window holds skip_spike_warmup values.
  double skip_spike_z = 0;
  int skip_spike_window = 64;
  int skip_spike_warmup = 16;
};

/// [checkpoint]
struct CheckpointConfig {
  std::string dir = "checkpoints";
  int every = 0;               ///< steps between checkpoints (0: only at the end)
  double every_minutes = 0;    ///< wall minutes between checkpoints (0: off)
  int keep = 3;                ///< newest checkpoints kept
  std::string resume = "auto"; ///< auto | never | <path>
  bool at_end = true;          ///< write a checkpoint when the run ends
  /// resume=never over an earlier run's outputs (step files or `latest` in
  /// dir, a non-empty log.timing_file / log.csv_file): false refuses the run
  /// before training; true removes them first (with a warning).
  bool overwrite = false;
  /// Weights to start from (a checkpoint path; "" off): values only, fresh
  /// optimizer, step 0. Used when no checkpoint is resumed (resume=never, or
  /// auto with nothing in dir); refused together with resume=<path>.
  std::string init_from;
  /// Asynchronous checkpoints (io::AsyncCheckpointWriter): the step copies
  /// the state to host buffers and goes on; a writer thread writes, reads
  /// back and commits the same file. Needs MPI_THREAD_MULTIPLE (else
  /// synchronous, with a message).
  bool async = false;
};

/// [log]
struct LogConfig {
  std::string timing_file = "timing.h5";  ///< per-step, per-rank HDF5 table ("" : off)
  std::string csv_file;                   ///< optional CSV copy of the timing table
  std::string level = "info";             ///< trace | debug | info | warn | error
  double peak_tflops = 0;                 ///< peak TFLOP/s of one device (rank), for MFU (0: plan.device's, core::mfu_peak)
  /// The step line's second line (balance and communication figures,
  /// train/report.hpp): after the first and last step lines and at least
  /// every detail_every steps (0: never).
  int detail_every = 10;
  std::int64_t trace_step = 0;            ///< record per-action pipeline timings of this step (1-based; 0: off)
  /// Chrome trace-event JSON of the traced step (io/chrome_trace.hpp):
  /// "auto" = timing_file with .trace.json for its extension (none without
  /// a timing file); a path; "" = off. Needs trace_step when a path is given.
  std::string trace_json = "auto";
  /// TensorBoard event files of the step scalars (io/tensorboard.hpp), one
  /// per start, written by rank 0 into this directory (created; "" : off).
  std::string tensorboard_dir;
  /// Straggler flag (train/guards.hpp): a rank whose forward+backward time
  /// exceeds straggler_factor x the median of its pipeline stage's ranks for
  /// straggler_steps consecutive steps is named (0: off).
  double straggler_factor = 0;
  int straggler_steps = 5;
};

/// [comm]
struct CommConfig {
  std::string wait = "yield";  ///< yield (MPI_Test + sched_yield) | block
  std::string backend = "mpi"; ///< mpi | nccl (CUDA builds)
  double timeout_s = 600;      ///< collective watchdog: a wait longer than this ends the job (0: off)
  /// DP×CP gradient buckets (MiB of fp32 gradient): each bucket's reduction
  /// starts as soon as the backward has finished it (0: one reduction after
  /// the backward). 25 as PyTorch DDP's bucket_cap_mb; optim/optimizer.hpp.
  double bucket_mib = 25;
  /// DP×CP gradient reduction: fp32, or bf16 (rounded before the all-reduce,
  /// half the bytes; sums in fp32, widened after; needs train.precision=bf16
  /// and parallel.zero=0). optim/optimizer.hpp.
  std::string grad_reduce_dtype = "fp32";
};

/// [plan] the cluster-scale simulator wlb4d-plan (no MPI run needed). It
/// reuses [model], [parallel], [train] and [balance] (cost_a/b/c with
/// calibrate=false) and adds what only a simulation needs.
struct PlanConfig {
  std::string lengths;           ///< document lengths: JSON array file or HDF5 token dataset
  int steps = 50;                ///< simulated optimizer steps
  std::string packers = "fixed greedy wlb";            ///< packers to compare
  std::string shardings = "sequence document adaptive";  ///< CP shardings to compare
  double alpha_s = 5e-6;         ///< α–β comm model: latency per message (seconds); inter-node link
  double beta_s_per_byte = 2e-11;  ///< α–β comm model: seconds per byte (1/bandwidth); inter-node link
  /// The device (core/device_table.hpp key: a100, h100, h200, ...; "": none):
  /// its peaks give the GEMM rates and MFU, its memory the budget, unless
  /// the keys below are given.
  std::string device;
  double gemm_efficiency = 0.65;  ///< sustained GEMM rate / the device's dense peak (dimensionless)
  /// Sustained fp32 GEMM FLOP/s per device (0: plan.device's fp32 peak x
  /// gemm_efficiency, else core::kFallbackGemmFlops; core::gemm_flops).
  double flops_per_s = 0;
  /// Memory per device (GiB, 2^30 bytes), the memory model's budget (0:
  /// plan.device's, else 80 in wlb4d-plan (core::device_memory_gib) and the
  /// running device's total in the trainer (core::device_memory_budget)).
  double device_memory_gib = 0;
  // Cluster description (DESIGN §11; wlb4d-plan --search). The search maps
  // ranks as the grid orders them (TP innermost, then CP, DP, PP) onto nodes
  // of devices_per_node devices and charges a group the intra-node link when
  // it fits one node, else the inter-node one (alpha_s, beta_s_per_byte).
  int nodes = 0;                 ///< nodes of the cluster (0: as many as the deck's world needs)
  int devices_per_node = 8;      ///< devices (ranks) per node; TP stays within a node
  double flops_per_s_bf16 = 0;   ///< sustained bf16 GEMM FLOP/s per device (0: plan.device's bf16 peak x gemm_efficiency, else the fp32 rate)
  double attention_efficiency = 0.6;  ///< attention kernel FLOP rate / GEMM rate (dimensionless)
  double intra_alpha_s = 2e-6;   ///< intra-node α: latency per message (seconds)
  double intra_beta_s_per_byte = 2.5e-12;  ///< intra-node β: seconds per byte (1/bandwidth)
  std::string search_micro_batches;  ///< --search: micro-batch counts to try (empty: train.micro_batches)
  int search_coarse_steps = 2;   ///< --search: steps of the coarse pass (every surviving candidate)
  int search_refine = 16;        ///< --search: best coarse candidates re-simulated over plan.steps steps
  // Core-attention disaggregation rows (balance/attention_tasks.hpp).
  std::string attention = "local";  ///< attention executions to compare: local and/or disaggregated
  std::int64_t ca_task_tokens = 1024;  ///< query rows per core-attention task (tokens)
  double ca_tolerance = 0.02;       ///< assignment stops within (1 + this) of the mean (dimensionless)
};

/// The resolved deck.
struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  DataConfig data;
  BalanceConfig balance;
  OptimConfig optim;
  TrainConfig train;
  CheckpointConfig checkpoint;
  LogConfig log;
  CommConfig comm;
  PlanConfig plan;
  std::string deck_path;  ///< file it was read from ("" : defaults + CLI only)
};

/// What the command line asked for besides the deck itself.
struct CommandLine {
  Config config;
  bool help = false;          ///< --help: print every key (see deck_help())
  bool print_config = false;  ///< --print-config: print the resolved deck and exit
  bool version = false;       ///< --version: print the build's versions (version_report) and exit
  /// --check: validate the deck and the layout for a rank count, then exit 0
  /// (or 2 with the deck error) without opening a dataset or a checkpoint.
  bool check = false;
  int check_ranks = 0;        ///< --check-ranks N (implies --check); 0: the MPI world size
  std::vector<std::string> extra;  ///< program-specific flags left untouched
};

/// Parses `prog [DECK] [--section.key=value ...] [--print-config] [--check [--check-ranks N]]
/// [--version] [--help]`.
/// The first positional argument (or -i/--input) is the deck file; its
/// `include =` lines are resolved (see the file comment).
/// \throws ConfigError for an unknown key, a malformed value, a missing deck
///         file, a deck file (or include) that is not a regular file or is
///         larger than kMaxDeckBytes, or a violated single-key or cross-key rule (world size excluded).
CommandLine parse_command_line(int argc, const char* const* argv);

/// Parses a deck given as text (tests, checkpoint attributes) plus overrides.
/// Include lines in the text are relative to the working directory.
/// \throws ConfigError as parse_command_line.
Config parse_deck_text(const std::string& ini_text,
                       const std::vector<std::string>& overrides = {});

/// Every rule that needs no world size; parse_* call it. \throws ConfigError.
void validate(const Config& cfg);

/// The rule dp*pp*cp*tp == world_size. \throws ConfigError naming all five.
void validate_world(const Config& cfg, int world_size);

/// The resolved deck as INI text, every key, in section order. Parsing the
/// result gives back the same Config (it is stored in checkpoints).
std::string to_ini(const Config& cfg);

/// `--help` text: every key with its default, unit and rule, and the layout rules.
std::string deck_help();

/// `--help` text of a tool that reads only some keys: `usage` first, then the
/// keys whose name starts with one of `key_prefixes` ("plan." or "model.layers").
std::string deck_help(const std::string& usage, const std::vector<std::string>& key_prefixes);

/// The layout rules validate() and validate_world() enforce (what must divide
/// what), one per line; --help and README.md list them.
std::string layout_rules();

}  // namespace wlb::core

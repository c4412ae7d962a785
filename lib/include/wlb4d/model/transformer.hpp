#pragma once
/// \file transformer.hpp
/// \brief One pipeline stage of the Llama-style decoder (Touvron et al. 2023,
/// "LLaMA", §2.2): forward and hand-written backward, tensor-parallel.
///
/// Model (DESIGN §2 step 5):
///   h_0 = Embed(ids)                                         (first stage)
///   per layer l:  a   = h + Wo·Attn(RoPE(Wq·n1), RoPE(Wk·n1), Wv·n1),  n1 = RMSNorm(h)
///                 h'  = a + W_down·(silu(W_gate·n2) ∘ W_up·n2),          n2 = RMSNorm(a)
///   loss = Σ_{t: label ≥ 0} CE(LMHead(RMSNorm(h_L))_t, label_t)          (last stage)
/// No biases; LM head untied from the embedding. Attention: attention.hpp
/// (document-causal mask from kv_lo/kv_hi, GQA, scale 1/sqrt(D)); RoPE
/// half-split pairing (layers.hpp).
///
/// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, §3, Fig. 3): Wq,
/// Wk, Wv, W_gate, W_up are column-parallel (this rank's heads / FFN
/// columns); Wo and W_down are row-parallel and their outputs are all-reduced
/// over TP (operator g); the gradient of every column-parallel block's input
/// is all-reduced in backward (operator f). Embedding and LM head split the
/// vocabulary (vocab-parallel embedding + cross-entropy). Every collective is
/// skipped when the TP communicator has size 1, so a one-rank model calls no
/// MPI at all. Every such collective is a region edge of tp_region.hpp
/// (enter_column / leave_row and their backward conjugates).
///
/// Sequence parallelism (parallel.sequence_parallel; Korthikanti et al. 2022,
/// "Reducing Activation Recomputation in Large Transformer Models", §4.2.2):
/// the residual stream and the RMSNorm regions hold only this rank's rows
/// [t0, t0+Ts) = split_range(T, tp, tp_rank) of the T tokens (residual_rows;
/// uneven T/tp is legal, and Ts = 0 when T < tp: that rank still joins every
/// collective). An all-gather over TP (g) of the norm output precedes the
/// column-parallel GEMMs (QKV, gate/up, LM head); a reduce-scatter (ḡ)
/// replaces the all-reduce after the row-parallel ones (wo, w_down) and after
/// the vocab-parallel embedding. Backward runs the conjugates: reduce-scatter
/// of the norm-output gradient, all-gather of the residual gradient before
/// the row-parallel GEMMs and the embedding. The saved norm output is kept at
/// Ts rows and all-gathered again in the backward (Megatron-LM does the
/// same), so only head/FFN-sharded fields stay T-sized. Norm-weight gradients
/// are partial per rank and summed over TP once per backward(), so every TP
/// rank adds the same full gradient (they stay tp_replicated). With CP, T is
/// this rank's CP shard: tokens split over CP first, then over TP.
///
/// Context parallelism hook: the keys/values attention reads come from a
/// KvExchange (identity by default). A CP implementation all-gathers K/V over
/// the CP group in gather() and reduce-scatters dK/dV in reduce_scatter()
/// (DESIGN §5); the model is otherwise unchanged (kv_lo/kv_hi are then in
/// gathered-key order).
///
/// Memory: activations saved for the backward live in per-slot workspaces
/// allocated once at construction (capacity max_tokens tokens per slot);
/// gradients of activations live in one scratch workspace shared by all slots
/// (backward passes run one at a time). forward/backward allocate nothing.
/// Per slot and layer, with model.recompute = none:
/// (4·d + 2·Hq_l·D + 2·Hkv_l·D + Hq_l + 3·F_l + 2)·C elements (Hq_l, Hkv_l,
/// F_l: this rank's shard; C = max_tokens). Under sequence parallelism the
/// residual/norm fields x_in, rstd1, xn1, h1, rstd2, xn2 and the stage top's
/// output hidden, final-norm rstd and output hold ⌈C/tp⌉ rows, i.e.
/// (4·d + 2)·⌈C/tp⌉ + (2·Hq_l·D + 2·Hkv_l·D + Hq_l + 3·F_l)·C per slot and
/// layer, plus two [C][d] buffers shared by all slots (gathered norm output,
/// full-T GEMM output before its reduce-scatter).
///
/// Activation recompute (model.recompute, for the first model.recompute_layers
/// local layers, 0 = all): `full` keeps only the layer input x_in (d·C per
/// layer) and re-runs the layer's forward up to the SwiGLU product before its
/// backward (the down projection's output is not needed: one GEMM and one TP
/// all-reduce fewer than a whole forward); `selective` keeps the GEMM outputs
/// (q and k after RoPE, which is applied in place, v, o, lse, h1, gate, up)
/// and recomputes both RMSNorms and the SwiGLU product (saves (2·d + F_l + 2)·C
/// per layer). Fields not kept live in one shared one-layer workspace. The
/// same kernels run on the same inputs, so losses and gradients are
/// bit-identical to recompute = none; full recompute repeats the layer's CP
/// K/V all-gather.
///
/// Mixed precision (train.precision = bf16, DESIGN §10; Scalar = float
/// only): every GEMM of the linear layers (QKV, wo, gate/up, w_down, LM head;
/// forward, dX and dW) runs through bf16_gemm.hpp: bf16 operands — a bf16
/// copy of each GEMM weight, refreshed from the fp32 master (params()) at the
/// first forward after zero_grad() or mark_weights_updated(), and the fp32
/// activation or gradient rounded on entry — with fp32 accumulation into
/// fp32 outputs and fp32 dW (gradients sum over micro-batches in fp32).
/// Everything else stays fp32: the residual stream and its gradient, the
/// RMSNorm statistics, RoPE (angles in double), the attention kernel
/// (softmax max/sum, LSE), SwiGLU, the cross-entropy and the loss. Stored
/// activations: the saved tensors the backward reads only as a GEMM operand
/// (dW = Xᵀ·dY) — the norm outputs xn1, xn2, the final-norm output and the
/// SwiGLU product act — are kept as 2-byte bf16 bits (rounded once, in the
/// forward, from an fp32 staging buffer; the backward widens them exactly),
/// so a slot holds (2·d + F_l)·C·2 bytes fewer per layer. The rest stays
/// fp32: x_in and h1 (the residual stream, RMSNorm backward inputs), the
/// RMSNorm statistics, q, k, v, o and lse (the attention kernel is fp32 only
/// and its backward reads o for rowsum(dO∘O)), gate and up (SwiGLU backward),
/// the logits. Numbers are bit-identical to rounding an fp32 copy at the GEMM
/// (round(widen(round(x))) = round(x)). Extra memory: the weight copies
/// (label model::bf16_weights, see bf16_gemm.hpp), the operand workspace of
/// bf16_gemm.hpp (model::bf16_operands) and one fp32 staging buffer
/// [C][max(d, F_l)] (in model::grad_scratch).
///
/// Split backward (zero-bubble pipelines; Qi et al., "Zero Bubble Pipeline
/// Parallelism", ICLR 2024, arXiv 2401.10241, §2): backward_input (B) computes
/// the gradient of the stage input (what the previous stage waits for), the
/// norm-weight and embedding gradients; backward_weight (W) computes the
/// weight gradients of every GEMM (wq, wk, wv, wo, w_gate, w_up, w_down, LM
/// head), dW += dYᵀ·X, and may run any time later. What W needs is kept from B
/// to W in the slot: the GEMM inputs X (xn1, o, xn2, act and the final-norm
/// output, already saved by the forward) and the output gradients dY, written
/// by B into fields of the slot that B no longer needs (dQ/dK/dV into q/k/v,
/// dgate/dup into gate/up, d(attention output) into h1, d(layer output) into
/// the next layer's x_in or the stage output; the LM head's dlogits stay in
/// place), so with model.recompute = none the split costs no memory. Fields a
/// recomputed layer does not keep live in `weight_slots` W stashes (one per
/// B whose W is pending), allocated at construction. Under sequence
/// parallelism the norm outputs and the residual-stream gradients are kept at
/// Ts rows and all-gathered over TP again inside W. The GEMMs are those of
/// linear_backward on the same operands, so B then W gives bit-identical
/// gradients to the fused backward(), which runs each block's W right after
/// that block's B (the dX GEMMs), on the live operands, and needs no W stash
/// (weight_slots = 0: schedules that never delay W, so full recompute keeps
/// its memory saving).
///
/// TP overlap (Megatron-LM's --tp-comm-overlap in its simplest form): in the
/// fused backward() the column-parallel GEMMs (QKV, gate/up, the
/// vocab-parallel LM head) compute dX first, start its TP sum (all-reduce;
/// SP: reduce-scatter) nonblocking, run their dW GEMMs and wait after them:
/// the same GEMMs and the same sum, so bit-identical. Under the B/W split
/// (backward_input / backward_weight: model.recompute = none, or zb1) B has
/// no dW GEMM to hide the reduction behind and waits for it at once. On
/// MPICH without a progress thread a started collective advances only in MPI
/// calls (here: SP's all-gathers inside the dW part), so on CPU most of it
/// still runs at the wait.
///
/// FLOP counting (per optimizer step, the PaLM / Megatron-LM "model FLOPs"
/// convention, Chowdhery et al. 2022 App. B; no recomputation counted):
///   model_flops = 6 · N_mm · tokens + 12 · layers · Hq · D · pairs
/// where N_mm = layers·(2·d·Hq·D + 2·d·Hkv·D + 3·d·F) + V·d are the parameters
/// used in matmuls (embedding lookup and norm weights excluded; LM head
/// included), tokens = Σ T, and pairs = Σ_i (kv_hi[i] − kv_lo[i] + 1) =
/// Σ_documents d(d+1)/2 (query/key pairs per head under the mask). The
/// attention term is 3 × the forward's 4·D·Hq·pairs (backward = 2 × forward,
/// like the 6N term; attention.hpp's kernel-level counter uses FA-2's 2.5).

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/types.hpp"
#include "wlb4d/model/batch.hpp"
#include "wlb4d/model/bf16_gemm.hpp"
#include "wlb4d/model/params.hpp"
#include "wlb4d/model/tp_region.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace wlb::model {

/// Parameters that take part in matmuls, N_mm of the FLOP formula (global, all layers).
std::int64_t matmul_params(const core::ModelConfig& cfg, std::int64_t vocab);

/// Model FLOPs of forward + backward over `tokens` tokens with `pairs`
/// attention (query, key) pairs per head per layer (see the file comment;
/// unit: FLOP, whole model, all ranks together).
double model_flops(const core::ModelConfig& cfg, std::int64_t vocab, std::int64_t tokens, std::int64_t pairs);

/// Source of the keys/values attention reads (the CP hook). The default
/// implementation is the identity (no context parallelism). Shapes: local
/// k, v, dk, dv are [T][Hkv_l][D]; gathered ones [S][Hkv_l][D].
template <class Scalar>
class KvExchange {
 public:
  virtual ~KvExchange() = default;
  /// K/V that the T local queries attend to. Called in forward and again in
  /// backward with the same arguments (an implementation may cache per
  /// (layer, slot) or gather again). Identity: returns {k, v}.
  virtual std::pair<View3<Scalar>, View3<Scalar>> gather(int layer, int slot, const View3<Scalar>& k,
                                                         const View3<Scalar>& v) {
    (void)layer;
    (void)slot;
    return {k, v};
  }
  /// Buffers [S][Hkv_l][D] into which attention writes dK/dV of the gathered
  /// keys. Identity: {dk, dv} (the local gradient buffers themselves).
  virtual std::pair<View3<Scalar>, View3<Scalar>> grad_buffers(int layer, int slot, const View3<Scalar>& dk,
                                                               const View3<Scalar>& dv) {
    (void)layer;
    (void)slot;
    return {dk, dv};
  }
  /// dk, dv (local) = reduce-scatter over CP of dk_all, dv_all. Identity: no-op.
  virtual void reduce_scatter(int layer, int slot, const View3<Scalar>& dk_all, const View3<Scalar>& dv_all,
                              const View3<Scalar>& dk, const View3<Scalar>& dv) {
    (void)layer;
    (void)slot;
    (void)dk_all;
    (void)dv_all;
    (void)dk;
    (void)dv;
  }
};

/// Core attention, softmax(scale·QKᵀ, masked)·V, of one layer (the
/// core-attention disaggregation hook). The default runs attention_forward /
/// attention_backward on this rank; CoreAttentionExchange
/// (ca_exchange.hpp) computes some query rows on other ranks of the
/// attention group and returns their results, so the caller sees the same
/// outputs. Shapes as attention.hpp: q, out, dout, dq [T][Hq_l][D]; k, v, dk,
/// dv [S][Hkv_l][D] (gathered under CP); lse [Hq_l][T]; kv_lo, kv_hi [T].
/// Every rank of a group calls forward/backward for the same (layer, slot)
/// in the same order (the schedule guarantees it; recompute re-runs forward).
/// Errors: the default throws what attention_forward/backward throw
/// (std::invalid_argument on inconsistent extents).
template <class Scalar>
class CoreAttention {
 public:
  virtual ~CoreAttention() = default;
  virtual void forward(int layer, int slot, const View3<Scalar>& q, const View3<Scalar>& k, const View3<Scalar>& v,
                       const View1<const std::int32_t>& kv_lo, const View1<const std::int32_t>& kv_hi, Scalar scale,
                       const View3<Scalar>& out, const View2<Scalar>& lse);
  virtual void backward(int layer, int slot, const View3<Scalar>& q, const View3<Scalar>& k, const View3<Scalar>& v,
                        const View3<Scalar>& out, const View3<Scalar>& dout, const View2<Scalar>& lse,
                        const View1<const std::int32_t>& kv_lo, const View1<const std::int32_t>& kv_hi, Scalar scale,
                        const View3<Scalar>& dq, const View3<Scalar>& dk, const View3<Scalar>& dv);
};

/// Result of Transformer::forward.
template <class Scalar>
struct StageOutput {
  /// Non-last stage: the stage's output hidden states [T][d] (under sequence
  /// parallelism [residual_rows(T).count][d], this rank's rows; a window into
  /// the slot's workspace, valid until the next forward on the same slot).
  /// Last stage: empty.
  View2<Scalar> hidden;
  /// Last stage: Σ cross-entropy over the micro-batch's target tokens (nats,
  /// a sum, not a mean; identical on every TP rank). Otherwise 0.
  double loss = 0;
};

/// Activation recompute of one layer (model.recompute).
enum class Recompute { None, Selective, Full };

/// One pipeline stage (one rank: the whole model) of one TP shard.
///
/// Use for one micro-batch on one rank (pp = tp = 1):
/// \code
///   Transformer<float> model(cfg.model, vocab, ModelShard{}, comm::Communicator::self(), 1, max_tokens);
///   model.params().init_parameters(cfg.train.seed);
///   model.zero_grad();                                   // once per step
///   auto mb = make_micro_batch(micro_batch.cu_seqlens(), ids);
///   double loss_sum = model.forward(0, mb).loss;         // Σ CE
///   model.backward(0, mb, {}, 1.0 / plan.target_tokens); // grads += d(loss_sum/N)/dθ
///   // ... after all micro-batches: reduce grads over DP×CP, optimizer on params()
/// \endcode
/// A middle stage passes the received hidden states to forward() and the
/// received output gradient to backward(), and sends what they return.
template <class Scalar>
class Transformer {
 public:
  /// \param cfg        model shape; \param vocab vocabulary size (dataset)
  /// \param stage      layers and embedding/head this rank holds; its tp_rank
  ///                   and tp_size must equal tp.rank() and tp.size()
  /// \param tp         tensor-parallel communicator (size 1: no collectives)
  /// \param slots      micro-batches in flight (forwards whose backward is pending)
  /// \param max_tokens workspace capacity: most tokens of one micro-batch
  /// \param sequence_parallel parallel.sequence_parallel (see the file
  ///        comment); ignored when tp.size() == 1
  /// \throws wlb::core::ConfigError from validate_shard(); std::invalid_argument
  ///         if slots < 1, weight_slots < 0, max_tokens < 1 or stage's TP fields differ from tp.
  /// \param weight_slots W stashes: backward_input calls whose
  ///        backward_weight may be pending at once; 0: backward() only (no
  ///        stash memory; backward_input then throws)
  /// \param bf16 train.precision = bf16 (see the file comment);
  ///        std::invalid_argument for Scalar = double
  Transformer(const core::ModelConfig& cfg, std::int64_t vocab, const ModelShard& stage, comm::Communicator tp,
              int slots, std::int64_t max_tokens, bool sequence_parallel = false, int weight_slots = 1,
              bool bf16 = false);
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  ParamRegistry<Scalar>& params() { return params_; }
  const ParamRegistry<Scalar>& params() const { return params_; }
  /// Sets every gradient to 0 (start of a step); backward() accumulates.
  /// Under bf16 also marks the weight copies stale (the previous step's update is done).
  void zero_grad() {
    params_.zero_grad();
    bf16_stale_ = true;
  }
  /// The fp32 master weights changed (optimizer update, checkpoint load):
  /// under bf16 the next forward refreshes the bf16 copies first. No-op in fp32.
  void mark_weights_updated() { bf16_stale_ = true; }
  bool bf16() const { return bf16_; }

  /// Forward of micro-batch `mb` into workspace `slot` (whose previous
  /// backward must be done).
  /// \param input_hidden non-first stage: [≥T][d] hidden states from the
  ///        previous stage (copied; the caller may reuse it); under sequence
  ///        parallelism [≥residual_rows(T).count][d], this rank's rows only.
  ///        First stage: ignored (mb.token_ids is read).
  /// \throws std::invalid_argument for a bad slot, T > max_tokens (T = 0 is legal: an empty CP shard still joins every collective), or
  ///         missing inputs; std::logic_error if the slot's backward is pending.
  StageOutput<Scalar> forward(int slot, const MicroBatchInput& mb, const View2<Scalar>& input_hidden = {});

  /// Backward of the forward stored in `slot`; adds the parameter gradients of
  /// (grad_scale · loss) (last stage) or of ⟨grad_output, output⟩ (other
  /// stages) to params().grads().
  /// \param grad_output non-last stage: [≥T][d] gradient w.r.t. the stage
  ///        output (SP: [≥residual_rows(T).count][d]). Last stage: ignored.
  /// \param grad_scale  last stage: multiplies dloss (normally 1 / target
  ///        tokens of the step). Otherwise ignored.
  /// \return non-first stage: gradient w.r.t. input_hidden, [T][d] (SP:
  ///         [residual_rows(T).count][d]), valid until the next backward call;
  ///         first stage: empty.
  /// \throws std::logic_error if the slot holds no forward, std::invalid_argument
  ///         if mb.tokens differs from that forward's.
  View2<Scalar> backward(int slot, const MicroBatchInput& mb, const View2<Scalar>& grad_output = {},
                         double grad_scale = 1.0);

  /// B of the split backward (see the file comment): the input gradient (the
  /// return value, as backward()'s), the norm-weight and embedding gradients,
  /// and the output gradients W needs, kept in `slot` and W stash `wslot`. The
  /// slot stays held until backward_weight(slot, wslot). Same parameters as
  /// backward().
  /// \throws std::logic_error if the slot holds no forward or its B already
  ///         ran, or wslot is held by another pending W; std::invalid_argument
  ///         for a bad slot/wslot (any wslot when weight_slots() = 0) or a token
  ///         count differing from the forward's.
  View2<Scalar> backward_input(int slot, int wslot, const MicroBatchInput& mb, const View2<Scalar>& grad_output = {},
                               double grad_scale = 1.0);
  /// W of the split backward: adds the GEMM weight gradients of the B stored
  /// in (slot, wslot) to params().grads() and frees both. Under sequence
  /// parallelism it all-gathers over TP (every TP rank runs the same W).
  /// \throws std::logic_error if (slot, wslot) holds no pending W.
  void backward_weight(int slot, int wslot);

  /// Gradient-ready hook (DP bucketed reduction, optim::Optimizer::grads_ready):
  /// called as hook(from) when every gradient element at chunk-flat offset
  /// >= from (params().grads(), registry order) has received this call's
  /// contribution: in backward_weight() after the LM head's W and after each
  /// layer's W (norm weights were done at B); in the fused backward() after
  /// the head and after each layer, except under sequence parallelism, whose
  /// norm-weight gradients are added at its end. Not called by
  /// backward_input(). Empty (the default): no calls.
  void set_grads_ready_hook(std::function<void(std::int64_t)> hook) { grads_ready_ = std::move(hook); }

  /// Forgets the forward pending in `slot` without running its backward
  /// (evaluation, finite-difference probes). No-op if none is pending.
  void discard(int slot);

  /// Replaces the K/V source (context parallelism); nullptr restores identity.
  void set_kv_exchange(std::shared_ptr<KvExchange<Scalar>> x);
  /// Installs the core-attention hook (nullptr: the local default).
  void set_core_attention(std::shared_ptr<CoreAttention<Scalar>> a);

  /// Wall seconds spent in this stage's TP all-reduces (SP: all-gathers and
  /// reduce-scatters) since the last
  /// reset (the vocab-parallel cross-entropy's small reductions excluded).
  double tp_comm_seconds() const { return tpr_.comm_seconds(); }
  /// Of the TP reductions overlapped with dW GEMMs (the fused backward's
  /// column-parallel dX, see backward()), the seconds they were in flight
  /// beyond their wait (tp_comm_seconds counts only the wait: the exposed part).
  double tp_overlapped_seconds() const { return tpr_.overlapped_seconds(); }
  void reset_tp_comm_seconds() { tpr_.reset_seconds(); }
  /// Appends each TP collective's exposed interval to `log` from now on
  /// (TpRegion::set_span_log; nullptr: off). For a traced step.
  void set_tp_span_log(std::vector<core::TimeSpan>* log) { tpr_.set_span_log(log); }

  /// Rows [offset, offset+count) of a T-token micro-batch that this rank's
  /// residual stream holds: split_range(T, tp, tp_rank) under sequence
  /// parallelism (count may be 0 when T < tp), else (0, T). The stage input
  /// and output hidden states and their gradients have `count` rows.
  std::pair<std::int64_t, std::int64_t> residual_rows(std::int64_t T) const;
  bool sequence_parallel() const { return sp_; }

  int slots() const { return int(slot_tokens_.size()); }
  int weight_slots() const { return int(wslot_owner_.size()); }
  std::int64_t max_tokens() const { return cap_; }
  const ModelShard& stage() const { return params_.shard(); }

 private:
  /// backward_input (wslot >= 0) or the fused backward (wslot = -1): the
  /// head, then per layer (top down) mlp_block_backward and
  /// attention_block_backward, then the embedding, mirroring forward().
  View2<Scalar> backward_impl(int slot, int wslot, const MicroBatchInput& mb, const View2<Scalar>& grad_output,
                              double grad_scale);
  // Field order of one layer's saved activations (see workspace layout in .cpp).
  enum Field { kXin, kRstd1, kXn1, kQ, kK, kV, kO, kLse, kH1, kRstd2, kXn2, kG, kU, kA, kNumFields };
  enum Top { kXout, kRstdF, kXnF, kLogits, kCeLse, kNumTop };
  // kWide (bf16 only): fp32 staging of a bf16-stored GEMM operand (see the file comment).
  enum Scratch { kDres, kDxn, kDq, kDk, kDv, kDo, kDa, kDg, kDu, kCeScratch, kGath, kFull, kWide, kNumScratch };
  struct LayerParams {
    std::size_t attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
  };

  /// A saved GEMM input [rows][cols] (LayoutRight) at p: fp32, or under bf16
  /// (half) its bf16 bits in the first rows·cols·2 bytes of the region.
  struct Operand {
    Scalar* p = nullptr;
    std::int64_t rows = 0, cols = 0;
    bool half = false;
  };
  /// One layer's saved activations of a slot for T tokens, in Field order.
  struct LayerViews {
    View2<Scalar> x_in;
    View1<Scalar> rstd1;
    Operand xn1;
    View3<Scalar> q, k, v, o;
    View2<Scalar> lse, h1;
    View1<Scalar> rstd2;
    Operand xn2;
    View2<Scalar> gate, up;
    Operand act;
  };
  /// Whether field f is stored as bf16 bits (xn1, xn2, act under bf16).
  bool half_field(Field f) const { return bf16_ && (f == kXn1 || f == kXn2 || f == kA); }
  /// Scalars a field (or W-stash copy) of width·rows elements occupies: half of it when stored in bf16.
  std::int64_t field_scalars(Field f) const;
  Operand operand(Scalar* p, std::int64_t rows, std::int64_t cols, bool half) const { return {p, rows, cols, half}; }
  /// Where the forward's kernel writes op in fp32: op itself, or (half) the kWide staging buffer.
  View2<Scalar> staged(const Operand& op) const;
  /// Half: rounds the staged fp32 values (round to nearest even) into op's bits. No-op otherwise.
  void store(const Operand& op, const View2<Scalar>& staged_values) const;
  /// op in fp32 for a GEMM: op itself, or (half) its bits widened into kWide.
  View2<Scalar> widened(const Operand& op) const;
  /// keep_for_w for an operand: copies op (its bits when half) to dst unless it is already there.
  void keep_operand(Scalar* dst, const Operand& op) const;
  LayerViews layer_views(int slot, int l, std::int64_t T) const;

  /// Workspace extents in elements (layout_workspaces fills the offset tables).
  struct WorkspaceExtents {
    std::int64_t slot = 0;     // one slot: the layers' kept fields and the stage top
    std::int64_t rec = 0;      // shared one-layer recompute workspace
    std::int64_t scratch = 0;  // shared gradient scratch (every Scratch region, C rows)
    std::int64_t wstash = 0;   // one W stash
  };
  void resolve_params();
  WorkspaceExtents layout_workspaces();
  std::int64_t layout_fields();   // width_, rows_, field_off_, rc_, rec_off_, top_off_, slot_size_; returns rec_'s size
  std::int64_t layout_scratch();  // scr_off_; returns the scratch width (elements per token)
  void init_bf16_weights();

  /// One backward (fused, or the B of the split), shared by its pieces.
  struct BackwardPass {
    int slot = 0, wslot = -1;
    bool fused = true;    // backward(): each block runs its W itself; else it keeps W's operands
    bool notify = false;  // call the gradient-ready hook after the head and each layer
    std::int64_t T = 0, Ts = 0;
    View2<Scalar> dres;       // gradient of the residual stream [Ts][d]
    View2<Scalar> dxn;        // gradient of a (gathered) norm output [T][d], partial over TP
    View2<Scalar> dxn_local;  // dxn summed over TP: this rank's rows under SP, else dxn
    std::int64_t norm_k = 0;  // SP: next row of norm_grad_
  };
  /// A column-parallel GEMM's output gradient and weight (parameter index).
  struct ColumnGrad {
    View2<Scalar> dy;
    std::size_t w;
  };
  BackwardPass begin_backward(int slot, int wslot, const MicroBatchInput& mb);
  void head_backward(BackwardPass& b, const MicroBatchInput& mb, double grad_scale);
  void mlp_block_backward(BackwardPass& b, int l);
  void attention_block_backward(BackwardPass& b, int l, const MicroBatchInput& mb);
  /// Fused: the dW GEMMs of column-parallel weights on input x, with the TP
  /// sum of b.dxn in flight. An array, not a braced list: see init_bf16_weights (nvcc).
  template <std::size_t N>
  void column_weight_grads(const BackwardPass& b, const Operand& x, const ColumnGrad (&dys)[N]);
  /// Where a norm's weight gradient goes: the parameter's, or (SP) the next partial row.
  View1<Scalar> norm_grad_out(BackwardPass& b, const View1<Scalar>& grad) const;
  /// Slot bookkeeping and (SP) the TP sum of the norm-weight gradients.
  void end_backward(const BackwardPass& b);
  static Recompute recompute_mode(const core::ModelConfig& cfg, int local_layer);
  static bool keeps(Recompute r, Field f);
  void attention_block_forward(int slot, int l, const MicroBatchInput& mb);
  void mlp_block_forward(int slot, int l, const MicroBatchInput& mb, bool down);
  void recompute(int slot, int l, const MicroBatchInput& mb);
  Scalar* field(int slot, int layer, Field f) const;
  /// Where W finds field f of layer l for the B in (slot, wslot): the slot's
  /// own field if the layer keeps it, else W stash wslot.
  Scalar* wfield(int slot, int wslot, int layer, Field f) const;
  /// The slot field that holds d(layer l's output) between B and W: x_in of layer l+1, or the stage output.
  Scalar* dout_field(int slot, int layer) const;
  void check_slot(const char* fn, int slot) const;
  Scalar* top(int slot, Top f) const;
  Scalar* scratch(Scratch f) const;
  // The GEMMs of the linear layers (parameter index w): layers.hpp's fp32
  // ones, or bf16_gemm.hpp's under bf16.
  void lin_fwd(const View2<Scalar>& x, std::size_t w, const View2<Scalar>& y, Scalar beta = Scalar(0));
  void lin_bin(std::size_t w, const View2<Scalar>& dy, const View2<Scalar>& dx, Scalar beta = Scalar(0));
  void lin_bw(const View2<Scalar>& x, const View2<Scalar>& dy, std::size_t w);
  void refresh_bf16_weights();

  core::ModelConfig cfg_;
  std::int64_t vocab_ = 0;
  comm::Communicator tp_;
  TpRegion<Scalar> tpr_;  // the TP collectives at the column/row-parallel region edges
  ParamRegistry<Scalar> params_;
  std::int64_t cap_ = 0;
  bool sp_ = false;        // sequence parallelism (only when tp > 1)
  std::int64_t scap_ = 0;  // rows of the residual/norm fields: ⌈C/tp⌉ under SP, else C
  std::int64_t d_ = 0, D_ = 0, hq_ = 0, hkv_ = 0, f_ = 0, vl_ = 0, v0_ = 0;
  std::int64_t vl_real_ = 0;  // columns of this vocabulary shard below cfg.data_vocab (the rest: padding)
  int nlayers_ = 0;
  View1<double> rope_freq_;  // [D/2] RoPE frequencies (model.rope_theta, model.rope_scaling)
  std::vector<LayerParams> lp_;
  std::size_t embed_ = 0, final_norm_ = 0, lm_head_ = 0;
  std::vector<std::int64_t> width_;       // per Field, elements per token
  std::vector<std::int64_t> rows_;        // per Field, token capacity (C, or scap_ for residual/norm fields)
  std::vector<std::vector<std::int64_t>> field_off_;  // [layer][Field]: offset in the slot (elements); -1: in rec_
  std::vector<Recompute> rc_;             // per local layer
  std::vector<std::int64_t> rec_off_;     // per Field, offset in rec_ (elements)
  View1<Scalar> rec_;                     // one layer's fields that layers do not keep
  std::vector<std::int64_t> top_off_;     // per Top, elements
  std::int64_t slot_size_ = 0;            // elements
  std::vector<std::int64_t> scr_off_;     // per Scratch, units of C
  View1<Scalar> ws_;                      // all slots
  View1<Scalar> scr_;                     // shared gradient scratch
  std::vector<std::int64_t> slot_tokens_; // T of the pending forward, -1: none
  std::vector<char> slot_b_done_;         // B ran, W pending
  std::vector<int> wslot_owner_;          // per W stash: the slot whose W is pending, -1: free
  std::vector<std::vector<std::int64_t>> wst_off_;  // [layer][Field]: offset in a W stash (elements); -1: in the slot
  std::int64_t wst_size_ = 0;             // elements per W stash
  View1<Scalar> wst_;                     // all W stashes (empty with recompute = none)
  std::shared_ptr<KvExchange<Scalar>> kvx_;
  std::shared_ptr<CoreAttention<Scalar>> core_;
  View1<Scalar> norm_grad_;               // SP: partial norm-weight gradients of one backward
  std::function<void(std::int64_t)> grads_ready_;
  /// Calls grads_ready_ (if set) after fencing the kernels that wrote the gradients.
  void notify_grads_ready(std::int64_t from) const;
  bool bf16_ = false;
  bool bf16_stale_ = true;
  std::vector<Bf16Weight> bf16_w_;  // per parameter index; empty (0×0) for non-GEMM parameters
  Bf16Workspace bf16_ws_;
};

}  // namespace wlb::model

// Pipeline-stage decoder (transformer.hpp): forward, hand-written backward,
// Megatron TP collectives, workspaces.
//
// Workspace layout. Every saved tensor of a slot is a region of C·width
// elements (C = max_tokens) inside one allocation; a micro-batch of T ≤ C
// tokens uses the first T·width elements of each region through an unmanaged
// LayoutRight View of exact extent. Exact extents matter: GEMMs and the
// attention kernel check them, and lse is [Hq][T] (T is the inner extent).
#include "wlb4d/model/transformer.hpp"

#include "wlb4d/core/error.hpp"

#include "wlb4d/model/attention.hpp"
#include "wlb4d/model/layers.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <string>

namespace wlb::model {

namespace {

template <class S>
View1<S> v1(S* p, std::int64_t n) {
  return View1<S>(p, n);
}
template <class S>
View2<S> v2(S* p, std::int64_t r, std::int64_t c) {
  return View2<S>(p, r, c);
}
template <class S>
View3<S> v3(S* p, std::int64_t a, std::int64_t b, std::int64_t c) {
  return View3<S>(p, a, b, c);
}
CView1<std::int32_t> ci(const IntVec& v, std::int64_t T) { return CView1<std::int32_t>(v.data(), T); }

}  // namespace

std::int64_t matmul_params(const core::ModelConfig& c, std::int64_t vocab) {
  return c.layers * c.layer_matmul_params() + vocab * std::int64_t(c.d_model);
}

double model_flops(const core::ModelConfig& c, std::int64_t vocab, std::int64_t tokens, std::int64_t pairs) {
  return 6.0 * double(matmul_params(c, vocab)) * double(tokens) +
         12.0 * double(c.layers) * double(c.heads) * double(c.head_dim()) * double(pairs);
}

template <class Scalar>
Transformer<Scalar>::Transformer(const core::ModelConfig& cfg, std::int64_t vocab, const ModelShard& stage,
                                 comm::Communicator tp, int slots, std::int64_t max_tokens, bool sequence_parallel,
                                 int weight_slots, bool bf16)
    : cfg_(cfg), vocab_(vocab), tp_(tp), params_(cfg, vocab, stage), cap_(max_tokens),
      sp_(sequence_parallel && tp.size() > 1) {
  if (slots < 1) throw std::invalid_argument("wlb::model::Transformer: slots=" + std::to_string(slots) + " < 1");
  if (weight_slots < 0)
    throw std::invalid_argument("wlb::model::Transformer: weight_slots=" + std::to_string(weight_slots) + " < 0");
  if (max_tokens < 1)
    throw std::invalid_argument("wlb::model::Transformer: max_tokens=" + std::to_string(max_tokens) + " < 1");
  if (stage.tp_rank != tp.rank() || stage.tp_size != tp.size())
    throw std::invalid_argument("wlb::model::Transformer: stage TP shard " + std::to_string(stage.tp_rank) + "/" +
                                std::to_string(stage.tp_size) + " differs from the TP communicator's rank " +
                                std::to_string(tp.rank()) + "/" + std::to_string(tp.size()));
  if (bf16 && !std::is_same<Scalar, float>::value)
    throw std::invalid_argument("wlb::model::Transformer: bf16 GEMMs need Scalar = float");
  bf16_ = bf16;  // before the workspace layout: bf16 stores xn1, xn2, act in 2 bytes
  const int p = tp.size();
  d_ = cfg.d_model;
  D_ = cfg.head_dim();
  rope_freq_ = rope_inv_freq_view(D_, cfg);
  hq_ = cfg.heads / p;
  hkv_ = cfg.kv_heads / p;
  f_ = split_range(cfg.ffn_hidden, p, tp.rank()).second;
  const auto vs = split_range(vocab, p, tp.rank());
  v0_ = vs.first;
  vl_ = vs.second;
  // Real (not padding) vocabulary columns of this shard: ids < cfg.data_vocab.
  vl_real_ = cfg.data_vocab > 0 ? std::clamp<std::int64_t>(cfg.data_vocab - v0_, 0, vl_) : vl_;
  const ModelShard& s = params_.shard();
  nlayers_ = s.layer_end - s.layer_begin;
  tpr_ = TpRegion<Scalar>(tp, sequence_parallel, d_);
  resolve_params();

  const WorkspaceExtents ext = layout_workspaces();
  if (ext.rec > 0) rec_ = View1<Scalar>("wlb::model::recompute", ext.rec);
  ws_ = View1<Scalar>("wlb::model::activations", ext.slot * slots);
  scr_ = View1<Scalar>("wlb::model::grad_scratch", ext.scratch);
  // Norm-weight gradients of one backward under SP: partial over this rank's
  // tokens, summed over TP in one all-reduce at the end of backward().
  if (sp_) norm_grad_ = View1<Scalar>("wlb::model::sp_norm_grad", (2 * nlayers_ + (s.head ? 1 : 0)) * d_);
  slot_tokens_.assign(slots, -1);
  slot_b_done_.assign(std::size_t(slots), 0);
  wslot_owner_.assign(std::size_t(weight_slots), -1);
  if (ext.wstash > 0) wst_ = View1<Scalar>("wlb::model::weight_grad_stash", ext.wstash * weight_slots);
  kvx_ = std::make_shared<KvExchange<Scalar>>();
  core_ = std::make_shared<CoreAttention<Scalar>>();
  if (bf16) init_bf16_weights();
}

template <class Scalar>
void Transformer<Scalar>::resolve_params() {
  // Parameter indices, resolved once (forward/backward do no name look-ups).
  const ModelShard& s = params_.shard();
  auto idx = [&](const std::string& n) { return std::size_t(params_.find(n) - &params_[0]); };
  if (s.embedding) embed_ = idx("embed.weight");
  for (int l = s.layer_begin; l < s.layer_end; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    lp_.push_back({idx(pre + "attn_norm.weight"), idx(pre + "attn.wq"), idx(pre + "attn.wk"), idx(pre + "attn.wv"),
                   idx(pre + "attn.wo"), idx(pre + "mlp_norm.weight"), idx(pre + "mlp.w_gate"),
                   idx(pre + "mlp.w_up"), idx(pre + "mlp.w_down")});
  }
  if (s.head) {
    final_norm_ = idx("final_norm.weight");
    lm_head_ = idx(cfg_.tie_embeddings ? "embed.weight" : "lm_head.weight");
  }
}

template <class Scalar>
typename Transformer<Scalar>::WorkspaceExtents Transformer<Scalar>::layout_workspaces() {
  WorkspaceExtents ext;
  ext.rec = layout_fields();
  ext.slot = slot_size_;
  ext.scratch = layout_scratch() * cap_;
  // W stashes (split backward): the fields W reads (GEMM inputs xn1, o, xn2,
  // act; dY holders h1, q, k, v, gate, up) that a recomputed layer keeps only
  // in the shared rec_ workspace, which the next layer or micro-batch
  // overwrites before W runs. Nothing with model.recompute = none.
  wst_off_.assign(std::size_t(nlayers_), std::vector<std::int64_t>(kNumFields, -1));
  for (int l = 0; l < nlayers_; ++l)
    for (Field f : {kXn1, kO, kXn2, kA, kH1, kQ, kK, kV, kG, kU})
      if (field_off_[l][f] < 0) {
        wst_off_[l][f] = wst_size_;
        wst_size_ += field_scalars(f);
      }
  ext.wstash = wst_size_;
  return ext;
}

template <class Scalar>
std::int64_t Transformer<Scalar>::layout_fields() {
  const ModelShard& s = params_.shard();
  // Saved activations of one layer, elements per token (order = Field).
  const std::int64_t qd = hq_ * D_, kd = hkv_ * D_;
  width_ = {d_, 1, d_, qd, kd, kd, qd, hq_, d_, 1, d_, f_, f_, f_};
  // Rows each field holds at most: the residual stream and the norm fields
  // (x_in, rstd1, xn1, h1, rstd2, xn2) hold this rank's ≤ ⌈C/tp⌉ tokens under
  // sequence parallelism (split_range gives the first ranks the extra token);
  // the head/FFN-sharded fields hold all C.
  scap_ = sp_ ? (cap_ + tp_.size() - 1) / tp_.size() : cap_;
  rows_.assign(kNumFields, cap_);
  for (Field f : {kXin, kRstd1, kXn1, kH1, kRstd2, kXn2}) rows_[f] = scap_;
  // Recompute (DESIGN §10): a field a layer does not keep lives in one shared
  // one-layer workspace (rec_), overwritten by every layer's forward and
  // refilled by recompute() before that layer's backward.
  field_off_.assign(std::size_t(nlayers_), std::vector<std::int64_t>(kNumFields, -1));
  std::int64_t stored = 0;  // elements
  for (int l = 0; l < nlayers_; ++l) {
    rc_.push_back(recompute_mode(cfg_, l));
    for (int f = 0; f < kNumFields; ++f)
      if (keeps(rc_.back(), Field(f))) {
        field_off_[l][f] = stored;
        stored += field_scalars(Field(f));
      }
  }
  // Only the fields some layer does not keep take room in rec_ (none with
  // model.recompute = none: no extra memory).
  rec_off_.assign(kNumFields, 0);
  std::int64_t rec = 0;
  for (int f = 0; f < kNumFields; ++f) {
    bool needed = false;
    for (int l = 0; l < nlayers_; ++l) needed = needed || field_off_[l][f] < 0;
    rec_off_[f] = rec;
    if (needed) rec += field_scalars(Field(f));
  }
  // Stage top: output hidden (every stage), and final norm + logits (last);
  // the output hidden and the final norm are residual-region fields.
  const std::int64_t xnf = s.head ? (bf16_ ? (d_ * scap_ + 1) / 2 : d_ * scap_) : 0;  // bf16: 2-byte bits
  const std::vector<std::int64_t> top_n = {d_ * scap_, s.head ? scap_ : 0, xnf,
                                           s.head ? vl_ * cap_ : 0, s.head ? cap_ : 0};
  top_off_.assign(kNumTop, 0);
  std::int64_t top = 0;
  for (int f = 0; f < kNumTop; ++f) {
    top_off_[f] = stored + top;
    top += top_n[f];
  }
  slot_size_ = stored + top;
  return rec;
}

template <class Scalar>
std::int64_t Transformer<Scalar>::layout_scratch() {
  // Sequence parallelism adds two shared [C][d] buffers: the all-gathered
  // norm output (input of the column-parallel GEMMs) and the full-T output of
  // a row-parallel GEMM before its reduce-scatter (backward: the all-gathered
  // residual gradient, then the reduce-scattered norm-output gradient).
  const std::int64_t qd = hq_ * D_, kd = hkv_ * D_;
  const std::int64_t sp_w = sp_ ? d_ : 0;
  const std::int64_t wide_w = bf16_ ? std::max(d_, f_) : 0;  // kWide: staging of the bf16-stored operands
  const std::vector<std::int64_t> scr_w = {d_, d_, qd, kd, kd, qd, f_, f_, f_, 3, sp_w, sp_w, wide_w};
  scr_off_.assign(kNumScratch, 0);
  std::int64_t so = 0;
  for (int f = 0; f < kNumScratch; ++f) {
    scr_off_[f] = so;
    so += scr_w[f];
  }
  return so;
}

template <class Scalar>
void Transformer<Scalar>::init_bf16_weights() {
  const std::int64_t qd = hq_ * D_;
  bf16_w_.resize(params_.size());
  std::vector<std::size_t> gemm_w;
  for (const auto& L : lp_) {
    // An array, not a braced list: nvcc 13's front end mistranslates a
    // range-for over a braced list of members here (a template member).
    const std::size_t layer_w[] = {L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down};
    for (std::size_t i : layer_w) gemm_w.push_back(i);
  }
  if (params_.shard().head) gemm_w.push_back(lm_head_);
  std::int64_t out_max = 0, w_block = 0;
  for (std::size_t i : gemm_w) {
    const auto& P = params_[i];
    bf16_w_[i] = Bf16Weight(P.local_shape[0], P.local_shape[1]);
    out_max = std::max(out_max, P.local_shape[0]);
    w_block = std::max(w_block, std::min(P.local_shape[0], kBf16Block) * P.local_shape[1]);
  }
  // Operand workspace (bf16_gemm.hpp): under SP the gathered T is C too.
  const std::int64_t wmax = std::max({d_, qd, f_});
  bf16_ws_ = Bf16Workspace(cap_ * std::max(wmax, std::min(out_max, kBf16Block)), cap_ * wmax, w_block,
                           out_max > kBf16Block ? cap_ * kBf16Block : 0);
}

template <class Scalar>
void Transformer<Scalar>::refresh_bf16_weights() {
  if constexpr (std::is_same<Scalar, float>::value) {
    for (std::size_t i = 0; i < bf16_w_.size(); ++i)
      if (bf16_w_[i].rows() > 0) bf16_w_[i].refresh(params_[i].value2());
  }
  bf16_stale_ = false;
}

template <class Scalar>
std::int64_t Transformer<Scalar>::field_scalars(Field f) const {
  const std::int64_t n = width_[f] * rows_[f];
  return half_field(f) ? (n + 1) / 2 : n;
}

namespace {
template <class S>
core::bf16_bits* bits_at(S* p) {  // a bf16-stored region of a Scalar workspace (never read as Scalar)
  return reinterpret_cast<core::bf16_bits*>(p);
}
}  // namespace

template <class Scalar>
View2<Scalar> Transformer<Scalar>::staged(const Operand& op) const {
  return v2(op.half ? scratch(kWide) : op.p, op.rows, op.cols);
}

template <class Scalar>
void Transformer<Scalar>::store(const Operand& op, const View2<Scalar>& staged_values) const {
  if constexpr (std::is_same<Scalar, float>::value) {
    if (op.half) bf16_store(staged_values, bits_at(op.p));
  }
}

template <class Scalar>
View2<Scalar> Transformer<Scalar>::widened(const Operand& op) const {
  const auto x = staged(op);
  if constexpr (std::is_same<Scalar, float>::value) {
    if (op.half) bf16_load(bits_at(op.p), x);
  }
  return x;
}

template <class Scalar>
void Transformer<Scalar>::keep_operand(Scalar* dst, const Operand& op) const {
  if (dst == op.p) return;
  const std::int64_t n = op.rows * op.cols;
  if (op.half)
    Kokkos::deep_copy(View1<core::bf16_bits>(bits_at(dst), n), View1<core::bf16_bits>(bits_at(op.p), n));
  else
    Kokkos::deep_copy(v1(dst, n), v1(op.p, n));
}

template <class Scalar>
void Transformer<Scalar>::lin_fwd(const View2<Scalar>& x, std::size_t w, const View2<Scalar>& y, Scalar beta) {
  if constexpr (std::is_same<Scalar, float>::value) {
    if (bf16_) {
      if (bf16_stale_) refresh_bf16_weights();
      bf16_linear_forward(x, bf16_w_[w], y, beta, bf16_ws_);
      return;
    }
  }
  linear_forward(x, params_[w].value2(), y, beta);
}

template <class Scalar>
void Transformer<Scalar>::lin_bin(std::size_t w, const View2<Scalar>& dy, const View2<Scalar>& dx, Scalar beta) {
  if constexpr (std::is_same<Scalar, float>::value) {
    if (bf16_) {
      // The copies the forward used: backward never follows an update without a forward.
      bf16_linear_backward_input(bf16_w_[w], dy, dx, beta, bf16_ws_);
      return;
    }
  }
  linear_backward_input(params_[w].value2(), dy, dx, beta);
}

template <class Scalar>
void Transformer<Scalar>::lin_bw(const View2<Scalar>& x, const View2<Scalar>& dy, std::size_t w) {
  if constexpr (std::is_same<Scalar, float>::value) {
    if (bf16_) {
      bf16_linear_backward_weight(x, dy, params_[w].grad2(), bf16_ws_);
      return;
    }
  }
  linear_backward_weight(x, dy, params_[w].grad2());
}

template <class Scalar>
Recompute Transformer<Scalar>::recompute_mode(const core::ModelConfig& cfg, int local_layer) {
  if (cfg.recompute_layers > 0 && local_layer >= cfg.recompute_layers) return Recompute::None;
  if (cfg.recompute == "full") return Recompute::Full;
  if (cfg.recompute == "selective") return Recompute::Selective;
  if (cfg.recompute == "none") return Recompute::None;
  throw core::ConfigError("model.recompute='" + cfg.recompute + "' must be none, selective or full");
}

template <class Scalar>
bool Transformer<Scalar>::keeps(Recompute r, Field f) {
  switch (r) {
    case Recompute::None: return true;
    case Recompute::Full: return f == kXin;
    case Recompute::Selective: return f != kRstd1 && f != kXn1 && f != kRstd2 && f != kXn2 && f != kA;
  }
  return true;
}

template <class Scalar>
Scalar* Transformer<Scalar>::field(int slot, int layer, Field f) const {
  const std::int64_t o = field_off_[std::size_t(layer)][f];
  return o >= 0 ? ws_.data() + slot * slot_size_ + o : rec_.data() + rec_off_[f];
}

template <class Scalar>
Scalar* Transformer<Scalar>::wfield(int slot, int wslot, int layer, Field f) const {
  const std::int64_t o = field_off_[std::size_t(layer)][f];
  return o >= 0 ? ws_.data() + slot * slot_size_ + o : wst_.data() + wslot * wst_size_ + wst_off_[std::size_t(layer)][f];
}

template <class Scalar>
Scalar* Transformer<Scalar>::dout_field(int slot, int layer) const {
  return layer + 1 < nlayers_ ? field(slot, layer + 1, kXin) : top(slot, kXout);
}

template <class Scalar>
Scalar* Transformer<Scalar>::top(int slot, Top f) const {
  return ws_.data() + slot * slot_size_ + top_off_[f];
}

template <class Scalar>
Scalar* Transformer<Scalar>::scratch(Scratch f) const {
  return scr_.data() + scr_off_[f] * cap_;
}

template <class Scalar>
void Transformer<Scalar>::notify_grads_ready(std::int64_t from) const {
  if (!grads_ready_) return;
  Kokkos::fence();  // the gradient kernels are done before a reduction reads them
  grads_ready_(from);
}

template <class Scalar>
std::pair<std::int64_t, std::int64_t> Transformer<Scalar>::residual_rows(std::int64_t T) const {
  return tpr_.local_rows(T);
}

template <class Scalar>
void Transformer<Scalar>::discard(int slot) {
  if (slot < 0 || slot >= slots())
    throw std::invalid_argument("wlb::model::Transformer::discard: slot " + std::to_string(slot) + " of " +
                                std::to_string(slots()));
  slot_tokens_[slot] = -1;
  slot_b_done_[std::size_t(slot)] = 0;
  for (auto& o : wslot_owner_)
    if (o == slot) o = -1;
}

template <class Scalar>
void CoreAttention<Scalar>::forward(int, int, const View3<Scalar>& q, const View3<Scalar>& k, const View3<Scalar>& v,
                                    const View1<const std::int32_t>& kv_lo, const View1<const std::int32_t>& kv_hi,
                                    Scalar scale, const View3<Scalar>& out, const View2<Scalar>& lse) {
  attention_forward<Scalar>(q, k, v, kv_lo, kv_hi, scale, out, lse);
}

template <class Scalar>
void CoreAttention<Scalar>::backward(int, int, const View3<Scalar>& q, const View3<Scalar>& k, const View3<Scalar>& v,
                                     const View3<Scalar>& out, const View3<Scalar>& dout, const View2<Scalar>& lse,
                                     const View1<const std::int32_t>& kv_lo, const View1<const std::int32_t>& kv_hi,
                                     Scalar scale, const View3<Scalar>& dq, const View3<Scalar>& dk,
                                     const View3<Scalar>& dv) {
  attention_backward<Scalar>(q, k, v, out, dout, lse, kv_lo, kv_hi, scale, dq, dk, dv);
}

template <class Scalar>
void Transformer<Scalar>::set_core_attention(std::shared_ptr<CoreAttention<Scalar>> a) {
  core_ = a ? std::move(a) : std::make_shared<CoreAttention<Scalar>>();
}

template <class Scalar>
void Transformer<Scalar>::set_kv_exchange(std::shared_ptr<KvExchange<Scalar>> x) {
  kvx_ = x ? std::move(x) : std::make_shared<KvExchange<Scalar>>();
}

template <class Scalar>
typename Transformer<Scalar>::LayerViews Transformer<Scalar>::layer_views(int slot, int l, std::int64_t T) const {
  const std::int64_t Ts = residual_rows(T).second;  // residual/norm fields: this rank's tokens under SP
  return {v2(field(slot, l, kXin), Ts, d_),
          v1(field(slot, l, kRstd1), Ts),
          operand(field(slot, l, kXn1), Ts, d_, half_field(kXn1)),
          v3(field(slot, l, kQ), T, hq_, D_),
          v3(field(slot, l, kK), T, hkv_, D_),
          v3(field(slot, l, kV), T, hkv_, D_),
          v3(field(slot, l, kO), T, hq_, D_),
          v2(field(slot, l, kLse), hq_, T),
          v2(field(slot, l, kH1), Ts, d_),
          v1(field(slot, l, kRstd2), Ts),
          operand(field(slot, l, kXn2), Ts, d_, half_field(kXn2)),
          v2(field(slot, l, kG), T, f_),
          v2(field(slot, l, kU), T, f_),
          operand(field(slot, l, kA), T, f_, half_field(kA))};
}

template <class Scalar>
void Transformer<Scalar>::attention_block_forward(int slot, int l, const MicroBatchInput& mb) {
  const std::int64_t T = mb.tokens, qd = hq_ * D_, kd = hkv_ * D_;
  const LayerParams& P = lp_[std::size_t(l)];
  const std::int64_t Ts = residual_rows(T).second;
  const auto [X, RSTD1, XN1, Q3, K3, V3, O3, LSE2, H1, RSTD2, XN2, G2, U2, A2] = layer_views(slot, l, T);
  const auto XN1f = staged(XN1);  // bf16: fp32 staging, rounded once into the saved bits
  rmsnorm_forward(X, Ts, params_[P.attn_norm].value, cfg_.norm_eps, XN1f, RSTD1);
  store(XN1, XN1f);
  const auto XN1g = tpr_.enter_column(XN1f, T, scratch(kGath));  // SP: all-gather (operator g)
  lin_fwd(XN1g, P.wq, v2(Q3.data(), T, qd));
  lin_fwd(XN1g, P.wk, v2(K3.data(), T, kd));
  lin_fwd(XN1g, P.wv, v2(V3.data(), T, kd));
  rope_apply(Q3, T, mb.positions, rope_freq_, false);
  rope_apply(K3, T, mb.positions, rope_freq_, false);
  const auto kv = kvx_->gather(params_.shard().layer_begin + l, slot, K3, V3);
  core_->forward(params_.shard().layer_begin + l, slot, Q3, kv.first, kv.second, ci(mb.kv_lo, T), ci(mb.kv_hi, T),
                 Scalar(1.0 / std::sqrt(double(D_))), O3, LSE2);
  // Row-parallel output: all-reduce (operator g; SP: reduce-scatter to this rank's tokens, ḡ).
  const auto Y = tpr_.row_partial(H1, T, scratch(kFull));
  lin_fwd(v2(O3.data(), T, qd), P.wo, Y);
  tpr_.leave_row(Y, T, H1);
  add_inplace(H1, X, Ts);
}

template <class Scalar>
void Transformer<Scalar>::mlp_block_forward(int slot, int l, const MicroBatchInput& mb, bool down) {
  const std::int64_t T = mb.tokens;
  const LayerParams& P = lp_[std::size_t(l)];
  const std::int64_t Ts = residual_rows(T).second;
  const auto [X, RSTD1, XN1, Q3, K3, V3, O3, LSE2, H1, RSTD2, XN2, G2, U2, A2] = layer_views(slot, l, T);
  const auto XN2f = staged(XN2);
  rmsnorm_forward(H1, Ts, params_[P.mlp_norm].value, cfg_.norm_eps, XN2f, RSTD2);
  store(XN2, XN2f);
  const auto XN2g = tpr_.enter_column(XN2f, T, scratch(kGath));  // SP: operator g
  lin_fwd(XN2g, P.w_gate, G2);
  lin_fwd(XN2g, P.w_up, U2);
  const auto Af = staged(A2);  // bf16: the same staging buffer (XN2's GEMMs are done)
  swiglu_forward(G2, U2, T, Af);
  store(A2, Af);
  if (!down) return;  // recompute: the backward needs no layer output
  const auto XNEXT = v2(l + 1 < nlayers_ ? field(slot, l + 1, kXin) : top(slot, kXout), Ts, d_);
  const auto Y = tpr_.row_partial(XNEXT, T, scratch(kFull));  // row-parallel output, as wo's
  lin_fwd(Af, P.w_down, Y);
  tpr_.leave_row(Y, T, XNEXT);
  add_inplace(XNEXT, H1, Ts);
}

template <class Scalar>
void Transformer<Scalar>::recompute(int slot, int l, const MicroBatchInput& mb) {
  const std::int64_t T = mb.tokens;
  const LayerParams& P = lp_[std::size_t(l)];
  switch (rc_[std::size_t(l)]) {
    case Recompute::None: return;
    case Recompute::Full:  // the same kernels on the same input: bit-identical fields
      attention_block_forward(slot, l, mb);
      mlp_block_forward(slot, l, mb, /*down=*/false);
      return;
    case Recompute::Selective: {
      const auto [X, RSTD1, XN1, Q3, K3, V3, O3, LSE2, H1, RSTD2, XN2, G2, U2, A2] = layer_views(slot, l, T);
      const std::int64_t Ts = residual_rows(T).second;
      // The forward's kernels and roundings: bit-identical fields.
      rmsnorm_forward(X, Ts, params_[P.attn_norm].value, cfg_.norm_eps, staged(XN1), RSTD1);
      store(XN1, staged(XN1));
      rmsnorm_forward(H1, Ts, params_[P.mlp_norm].value, cfg_.norm_eps, staged(XN2), RSTD2);
      store(XN2, staged(XN2));
      swiglu_forward(G2, U2, T, staged(A2));
      store(A2, staged(A2));
      return;
    }
  }
}

template <class Scalar>
StageOutput<Scalar> Transformer<Scalar>::forward(int slot, const MicroBatchInput& mb,
                                                 const View2<Scalar>& input_hidden) {
  const ModelShard& s = params_.shard();
  const std::int64_t T = mb.tokens;
  if (slot < 0 || slot >= slots())
    throw std::invalid_argument("wlb::model::Transformer::forward: slot " + std::to_string(slot) + " of " +
                                std::to_string(slots()));
  // T = 0 is legal: a context-parallel rank whose shard of a short
  // micro-batch is empty still takes part in every K/V exchange and TP
  // collective of the layer (every layer kernel is a no-op for T = 0).
  if (T < 0 || T > cap_)
    throw std::invalid_argument("wlb::model::Transformer::forward: micro-batch of " + std::to_string(T) +
                                " tokens; capacity is 0.." + std::to_string(cap_));
  if (slot_tokens_[slot] >= 0)
    throw std::logic_error("wlb::model::Transformer::forward: slot " + std::to_string(slot) +
                           " still holds a forward whose backward has not run");
  auto need = [&](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("wlb::model::Transformer::forward: ") + what);
  };
  need(std::int64_t(mb.positions.extent(0)) >= T && std::int64_t(mb.kv_lo.extent(0)) >= T &&
           std::int64_t(mb.kv_hi.extent(0)) >= T,
       "positions/kv_lo/kv_hi shorter than T");

  // Stage input → x_in of the first local layer (SP: this rank's Ts rows).
  const std::int64_t Ts = residual_rows(T).second;
  const View2<Scalar> x0 = v2(field(slot, 0, kXin), Ts, d_);
  if (s.embedding) {
    need(std::int64_t(mb.token_ids.extent(0)) >= T, "first stage needs token_ids");
    const auto& E = params_[embed_];
    // Vocab-parallel embedding: partial rows of all T tokens, summed like a
    // row-parallel output (SP: reduce-scattered to this rank's rows).
    const auto Y = tpr_.row_partial(x0, T, scratch(kFull));
    embedding_forward(mb.token_ids, T, v0_, E.value2(), Y);
    tpr_.leave_row(Y, T, x0);
  } else {
    need(std::int64_t(input_hidden.extent(0)) >= Ts && std::int64_t(input_hidden.extent(1)) == d_,
         sp_ ? "non-first stage needs input_hidden [residual_rows(T)][d_model]"
             : "non-first stage needs input_hidden [T][d_model]");
    Kokkos::deep_copy(x0, v2(input_hidden.data(), Ts, d_));
  }

  for (int l = 0; l < nlayers_; ++l) {
    attention_block_forward(slot, l, mb);
    mlp_block_forward(slot, l, mb, /*down=*/true);
  }

  StageOutput<Scalar> out;
  const auto XO = v2(top(slot, kXout), Ts, d_);
  if (s.head) {
    need(std::int64_t(mb.labels.extent(0)) >= T, "last stage needs labels");
    const auto XNF = operand(top(slot, kXnF), Ts, d_, bf16_);
    const auto XNFf = staged(XNF);
    const auto LOG = v2(top(slot, kLogits), T, vl_);
    rmsnorm_forward(XO, Ts, params_[final_norm_].value, cfg_.norm_eps, XNFf, v1(top(slot, kRstdF), Ts));
    store(XNF, XNFf);
    lin_fwd(tpr_.enter_column(XNFf, T, scratch(kGath)), lm_head_, LOG);  // SP: operator g
    out.loss = cross_entropy_forward(LOG, mb.labels, T, v0_, tp_, v1(top(slot, kCeLse), T), v1(scratch(kCeScratch), 3 * T),
                                     vl_real_);
  } else {
    out.hidden = XO;
  }
  slot_tokens_[slot] = T;
  return out;
}

template <class Scalar>
View2<Scalar> Transformer<Scalar>::backward(int slot, const MicroBatchInput& mb, const View2<Scalar>& grad_output,
                                            double grad_scale) {
  // Fused: each block's W right after its B, on the live operands, so no W
  // stash is needed (a recomputed layer's fields are overwritten by the next
  // layer's recompute before a stage-level W could read them).
  return backward_impl(slot, -1, mb, grad_output, grad_scale);
}

template <class Scalar>
View2<Scalar> Transformer<Scalar>::backward_input(int slot, int wslot, const MicroBatchInput& mb,
                                                  const View2<Scalar>& grad_output, double grad_scale) {
  if (wslot < 0 || wslot >= weight_slots())
    throw std::invalid_argument("wlb::model::Transformer::backward_input: W stash " + std::to_string(wslot) + " of " +
                                std::to_string(weight_slots()));
  return backward_impl(slot, wslot, mb, grad_output, grad_scale);
}

template <class Scalar>
void Transformer<Scalar>::check_slot(const char* fn, int slot) const {
  if (slot < 0 || slot >= slots())
    throw std::invalid_argument(std::string("wlb::model::Transformer::") + fn + ": slot " + std::to_string(slot) +
                                " of " + std::to_string(slots()));
}

namespace {
/// Keeps `src` for W at `dst` (same extents); nothing to do when W reads it in place.
template <class V, class S>
void keep_for_w(S* dst, const V& src) {
  if (dst != src.data()) Kokkos::deep_copy(V(dst, src.layout()), src);
}
}  // namespace

template <class Scalar>
View2<Scalar> Transformer<Scalar>::backward_impl(int slot, int wslot, const MicroBatchInput& mb,
                                                 const View2<Scalar>& grad_output, double grad_scale) {
  const ModelShard& s = params_.shard();
  BackwardPass b = begin_backward(slot, wslot, mb);
  if (s.head) {
    head_backward(b, mb, grad_scale);
  } else {
    if (!(std::int64_t(grad_output.extent(0)) >= b.Ts && std::int64_t(grad_output.extent(1)) == d_))
      throw std::invalid_argument(
          std::string("wlb::model::Transformer::backward: non-last stage needs grad_output ") +
          (sp_ ? "[residual_rows(T)][d_model]" : "[T][d_model]"));
    Kokkos::deep_copy(b.dres, v2(grad_output.data(), b.Ts, d_));
  }
  for (int l = nlayers_ - 1; l >= 0; --l) {
    recompute(slot, l, mb);
    mlp_block_backward(b, l);
    attention_block_backward(b, l, mb);
  }
  end_backward(b);
  if (s.embedding) {
    const auto& E = params_[embed_];
    // Every token's embedding gradient (the vocab shard rows of all T tokens):
    // the backward of the embedding's row-parallel exit (SP: all-gather).
    embedding_backward(mb.token_ids, b.T, v0_, tpr_.leave_row_backward(b.dres, b.T, scratch(kFull)), E.grad2());
    return {};
  }
  return b.dres;
}

template <class Scalar>
typename Transformer<Scalar>::BackwardPass Transformer<Scalar>::begin_backward(int slot, int wslot,
                                                                               const MicroBatchInput& mb) {
  check_slot("backward_input", slot);
  BackwardPass b;
  b.slot = slot;
  b.wslot = wslot;
  b.fused = wslot < 0;  // backward(): W inline, nothing kept
  b.notify = b.fused && !sp_;
  b.T = slot_tokens_[slot];
  const std::int64_t T = b.T;
  if (T < 0)
    throw std::logic_error("wlb::model::Transformer::backward: slot " + std::to_string(slot) + " holds no forward");
  if (slot_b_done_[std::size_t(slot)])
    throw std::logic_error("wlb::model::Transformer::backward_input: slot " + std::to_string(slot) +
                           " already ran its B; its W is pending");
  if (!b.fused && wslot_owner_[std::size_t(wslot)] >= 0)
    throw std::logic_error("wlb::model::Transformer::backward_input: W stash " + std::to_string(wslot) +
                           " still holds the pending W of slot " + std::to_string(wslot_owner_[std::size_t(wslot)]));
  if (mb.tokens != T)
    throw std::invalid_argument("wlb::model::Transformer::backward: micro-batch has " + std::to_string(mb.tokens) +
                                " tokens, the forward in slot " + std::to_string(slot) + " had " + std::to_string(T));
  b.Ts = residual_rows(T).second;
  b.dres = v2(scratch(kDres), b.Ts, d_);  // gradient of the residual stream (SP: this rank's rows)
  b.dxn = v2(scratch(kDxn), T, d_);       // gradient of a (gathered, under SP) norm output
  // SP: this rank's rows of dxn after the reduce-scatter (the backward of the
  // forward's all-gather); otherwise dxn itself after its all-reduce.
  b.dxn_local = sp_ ? v2(scratch(kFull), b.Ts, d_) : b.dxn;
  if (sp_) Kokkos::deep_copy(norm_grad_, Scalar(0));
  return b;
}

template <class Scalar>
View1<Scalar> Transformer<Scalar>::norm_grad_out(BackwardPass& b, const View1<Scalar>& grad) const {
  // The parameter's own (accumulating) gradient or, under SP, the
  // partial-sum buffer reduced over TP at the end (end_backward).
  return sp_ ? View1<Scalar>(norm_grad_.data() + d_ * b.norm_k++, d_) : grad;
}

template <class Scalar>
template <std::size_t N>
void Transformer<Scalar>::column_weight_grads(const BackwardPass& b, const Operand& x, const ColumnGrad (&dys)[N]) {
  // Column-parallel backward: dX's TP sum (operator f, SP: reduce-scatter) in
  // flight during the dW GEMMs (Megatron's tp-comm-overlap); the same GEMMs
  // and the same sum as without the overlap, so bit-identical.
  std::optional<comm::Request> req;
  if (tpr_.parallel()) req = tpr_.start_enter_column_backward(b.dxn, b.T, b.dxn_local);
  const auto xg = tpr_.enter_column(widened(x), b.T, scratch(kGath));  // the forward's GEMM input
  for (const ColumnGrad& g : dys) lin_bw(xg, g.dy, g.w);
  if (req) tpr_.finish(*req);
}

template <class Scalar>
void Transformer<Scalar>::head_backward(BackwardPass& b, const MicroBatchInput& mb, double grad_scale) {
  const std::int64_t T = b.T, Ts = b.Ts;
  const auto LOG = v2(top(b.slot, kLogits), T, vl_);
  cross_entropy_backward(LOG, mb.labels, T, v0_, v1(top(b.slot, kCeLse), T), grad_scale, LOG, vl_real_);  // in place
  lin_bin(lm_head_, LOG, b.dxn);  // W: dW_head from LOG (kept in the slot)
  if (b.fused) {
    const ColumnGrad head[] = {{LOG, lm_head_}};
    column_weight_grads(b, operand(top(b.slot, kXnF), Ts, d_, bf16_), head);
  } else {
    tpr_.enter_column_backward(b.dxn, T, b.dxn_local);  // vocab-parallel head: operator f (SP: ḡ)
  }
  const auto& N = params_[final_norm_];
  rmsnorm_backward(v2(top(b.slot, kXout), Ts, d_), Ts, N.value, v1(top(b.slot, kRstdF), Ts), b.dxn_local, b.dres,
                   norm_grad_out(b, N.grad), false);
  if (b.notify) notify_grads_ready(std::int64_t(N.offset));  // final norm and head done
}

template <class Scalar>
void Transformer<Scalar>::mlp_block_backward(BackwardPass& b, int l) {
  const std::int64_t T = b.T;
  const LayerParams& P = lp_[std::size_t(l)];
  const auto [X, RSTD1, XN1, Q3, K3, V3, O3, LSE2, H1, RSTD2, XN2, G2, U2, A2] = layer_views(b.slot, l, T);
  const auto DA2 = v2(scratch(kDa), T, f_);
  const auto DG2 = v2(scratch(kDg), T, f_);
  const auto DU2 = v2(scratch(kDu), T, f_);
  // b.dres holds dL/d(layer output): the gradient of W_down's row-parallel
  // exit (SP: all-gathered).
  const auto DY = tpr_.leave_row_backward(b.dres, T, scratch(kFull));
  lin_bin(P.w_down, DY, DA2);
  swiglu_backward(G2, U2, DA2, T, DG2, DU2);
  lin_bin(P.w_gate, DG2, b.dxn);
  lin_bin(P.w_up, DU2, b.dxn, Scalar(1));
  if (b.fused) {  // every W on the live operands (DY is still whole: nothing wrote kFull since)
    lin_bw(widened(A2), DY, P.w_down);
    const ColumnGrad gate_up[] = {{DG2, P.w_gate}, {DU2, P.w_up}};
    column_weight_grads(b, XN2, gate_up);
  } else {
    // Kept for W: dL/d(layer output) in the layer output's slot field (dead
    // once the layer above ran its B), dgate/dup in gate/up (dead after
    // swiglu_backward), W's GEMM inputs (copied only if recompute keeps them in rec_).
    auto wf = [&](Field f) { return wfield(b.slot, b.wslot, l, f); };
    keep_for_w(dout_field(b.slot, l), b.dres);
    keep_for_w(wf(kG), DG2);
    keep_for_w(wf(kU), DU2);
    keep_operand(wf(kXn2), XN2);
    keep_operand(wf(kA), A2);
    tpr_.enter_column_backward(b.dxn, T, b.dxn_local);  // column-parallel input: operator f (SP: ḡ)
  }
  const auto& N2 = params_[P.mlp_norm];
  rmsnorm_backward(H1, b.Ts, N2.value, RSTD2, b.dxn_local, b.dres, norm_grad_out(b, N2.grad), true);
}

template <class Scalar>
void Transformer<Scalar>::attention_block_backward(BackwardPass& b, int l, const MicroBatchInput& mb) {
  const std::int64_t T = b.T, qd = hq_ * D_, kd = hkv_ * D_;
  const LayerParams& P = lp_[std::size_t(l)];
  const auto [X, RSTD1, XN1, Q3, K3, V3, O3, LSE2, H1, RSTD2, XN2, G2, U2, A2] = layer_views(b.slot, l, T);
  const auto DQ3 = v3(scratch(kDq), T, hq_, D_);
  const auto DK3 = v3(scratch(kDk), T, hkv_, D_);
  const auto DV3 = v3(scratch(kDv), T, hkv_, D_);
  const auto DO3 = v3(scratch(kDo), T, hq_, D_);
  const auto DQ = v2(DQ3.data(), T, qd), DK = v2(DK3.data(), T, kd), DV = v2(DV3.data(), T, kd);
  // b.dres holds dL/dH1: the gradient of Wo's row-parallel exit (SP: all-gathered).
  const auto DY = tpr_.leave_row_backward(b.dres, T, scratch(kFull));
  lin_bin(P.wo, DY, v2(DO3.data(), T, qd));
  const int layer = params_.shard().layer_begin + l;
  const auto kv = kvx_->gather(layer, b.slot, K3, V3);
  const auto dkv = kvx_->grad_buffers(layer, b.slot, DK3, DV3);
  core_->backward(layer, b.slot, Q3, kv.first, kv.second, O3, DO3, LSE2, ci(mb.kv_lo, T), ci(mb.kv_hi, T),
                  Scalar(1.0 / std::sqrt(double(D_))), DQ3, dkv.first, dkv.second);
  kvx_->reduce_scatter(layer, b.slot, dkv.first, dkv.second, DK3, DV3);
  rope_apply(DQ3, T, mb.positions, rope_freq_, true);
  rope_apply(DK3, T, mb.positions, rope_freq_, true);
  lin_bin(P.wq, DQ, b.dxn);
  lin_bin(P.wk, DK, b.dxn, Scalar(1));
  lin_bin(P.wv, DV, b.dxn, Scalar(1));
  if (b.fused) {  // as the MLP's: Wo's W on the live DY, then QKV's W with dX's sum in flight
    lin_bw(v2(O3.data(), T, qd), DY, P.wo);
    const ColumnGrad qkv[] = {{DQ, P.wq}, {DK, P.wk}, {DV, P.wv}};
    column_weight_grads(b, XN1, qkv);
  } else {
    // Kept for W: dL/dH1 in h1 (dead now), dQ/dK/dV in q/k/v (dead after the
    // attention backward), the GEMM inputs o and xn1.
    auto wf = [&](Field f) { return wfield(b.slot, b.wslot, l, f); };
    keep_for_w(wf(kH1), b.dres);
    keep_for_w(wf(kO), O3);
    keep_for_w(wf(kQ), DQ3);
    keep_for_w(wf(kK), DK3);
    keep_for_w(wf(kV), DV3);
    keep_operand(wf(kXn1), XN1);
    tpr_.enter_column_backward(b.dxn, T, b.dxn_local);
  }
  const auto& N1 = params_[P.attn_norm];
  rmsnorm_backward(X, b.Ts, N1.value, RSTD1, b.dxn_local, b.dres, norm_grad_out(b, N1.grad), true);
  if (b.notify) notify_grads_ready(std::int64_t(N1.offset));  // layer l done (attn_norm is its first tensor)
}

template <class Scalar>
void Transformer<Scalar>::end_backward(const BackwardPass& b) {
  if (b.fused) {
    slot_tokens_[b.slot] = -1;  // the slot is free again
  } else {
    slot_b_done_[std::size_t(b.slot)] = 1;
    wslot_owner_[std::size_t(b.wslot)] = b.slot;
  }
  if (!sp_) return;
  // Norm weights are TP-replicated but each rank saw only its tokens: sum
  // the partial gradients over TP (one all-reduce for the whole stage), so
  // every TP rank adds the same full gradient to its copy.
  tpr_.allreduce(v2(norm_grad_.data(), b.norm_k, d_));
  std::int64_t k = 0;
  auto add_norm = [&](std::size_t idx) {
    add_inplace(v2(params_[idx].grad.data(), 1, d_), v2(norm_grad_.data() + d_ * k++, 1, d_), 1);
  };
  if (params_.shard().head) add_norm(final_norm_);
  for (int l = nlayers_ - 1; l >= 0; --l) {
    add_norm(lp_[std::size_t(l)].mlp_norm);
    add_norm(lp_[std::size_t(l)].attn_norm);
  }
}

template <class Scalar>
void Transformer<Scalar>::backward_weight(int slot, int wslot) {
  check_slot("backward_weight", slot);
  if (wslot < 0 || wslot >= weight_slots() || wslot_owner_[std::size_t(wslot)] != slot ||
      !slot_b_done_[std::size_t(slot)])
    throw std::logic_error("wlb::model::Transformer::backward_weight: no pending W for slot " + std::to_string(slot) +
                           " in W stash " + std::to_string(wslot));
  const std::int64_t T = slot_tokens_[slot];
  const std::int64_t qd = hq_ * D_, kd = hkv_ * D_;
  const std::int64_t Ts = residual_rows(T).second;
  // The GEMM inputs of the forward, all-gathered over TP again under SP.
  auto gathered = [&](Scalar* p, bool half) {
    const auto local = widened(operand(p, Ts, d_, half));
    return tpr_.enter_column(local, T, scratch(kGath));
  };
  // Row-parallel output gradients kept at Ts rows: all-gathered under SP.
  auto gathered_dy = [&](Scalar* p) {
    const auto local = v2(p, Ts, d_);
    return tpr_.leave_row_backward(local, T, scratch(kFull));
  };
  if (params_.shard().head) {
    lin_bw(gathered(top(slot, kXnF), bf16_), v2(top(slot, kLogits), T, vl_), lm_head_);
    notify_grads_ready(std::int64_t(params_[final_norm_].offset));  // the final norm was done at B
  }
  for (int l = nlayers_ - 1; l >= 0; --l) {
    const LayerParams& P = lp_[std::size_t(l)];
    auto wf = [&](Field f) { return wfield(slot, wslot, l, f); };
    lin_bw(widened(operand(wf(kA), T, f_, half_field(kA))), gathered_dy(dout_field(slot, l)), P.w_down);
    const auto XN2g = gathered(wf(kXn2), half_field(kXn2));
    lin_bw(XN2g, v2(wf(kG), T, f_), P.w_gate);
    lin_bw(XN2g, v2(wf(kU), T, f_), P.w_up);
    lin_bw(v2(wf(kO), T, qd), gathered_dy(wf(kH1)), P.wo);
    const auto XN1g = gathered(wf(kXn1), half_field(kXn1));
    lin_bw(XN1g, v2(wf(kQ), T, qd), P.wq);
    lin_bw(XN1g, v2(wf(kK), T, kd), P.wk);
    lin_bw(XN1g, v2(wf(kV), T, kd), P.wv);
    notify_grads_ready(std::int64_t(params_[P.attn_norm].offset));  // its norms were done at B
  }
  slot_tokens_[slot] = -1;
  slot_b_done_[std::size_t(slot)] = 0;
  wslot_owner_[std::size_t(wslot)] = -1;
}

template class CoreAttention<float>;
template class CoreAttention<double>;
template class Transformer<float>;
template class Transformer<double>;

}  // namespace wlb::model

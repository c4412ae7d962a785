/// \file cudnn_sdpa.cpp
/// \brief The cuDNN attention kernel (backend.hpp, namespace cudnn_sdpa):
/// cuDNN's fused scaled-dot-product attention graph through cudnn-frontend,
/// forward and backward, for attention.hpp's fp32 contract. Compiled only on a
/// CUDA build with WLB4D_ENABLE_CUDNN (lib/CMakeLists.txt leaves it out
/// otherwise).
///
/// One call:
///  1. the mask (kv_lo/kv_hi, copied to the host) becomes ragged batch entries,
///     one per run of a document's queries (attention_ragged.hpp);
///  2. q, k, v (and out, dout in the backward) are packed and rounded to bf16
///     in the ragged ("THD") layout [rows][heads][D];
///  3. the graph for the bucketed shape (b, s_q, s_kv, Hq, Hkv, D) is taken
///     from the plan cache or built (validate, build_operation_graph, heuristics
///     A then fallback, check_support, build_plans), then executed with the
///     per-entry seq_len_q/seq_len_kv of the padding mask, the ragged offsets
///     and the bottom-right causal mask;
///  4. the outputs are unpacked to fp32: out [T][Hq][D], lse [Hq][T] from the
///     fp32 statistics (natural-log log-sum-exp of the scaled scores, cuDNN's
///     "Stats"), dq, and dk/dv summed over the entries that hold each key in
///     entry order.
/// The backward asks for cuDNN's deterministic algorithm
/// (SDPA_backward_attributes::set_deterministic_algorithm: no atomics in dQ);
/// the dK/dV sum here has a fixed order, so a rerun gives the same bits. Where
/// cuDNN cannot build the deterministic graph, a warning names the graph and
/// the default algorithm runs.
///
/// Sources: cuDNN developer guide, "Scaled Dot Product Attention" (support
/// surface, ragged offsets, padding and bottom-right causal masks);
/// cudnn-frontend 1.23 include/cudnn_frontend/graph_interface.h and the SDPA
/// samples; llm.c llmc/cudnn_att.cpp (graph cache, UIDs, workspace) as a model.
#include "backend.hpp"

#include "wlb4d/core/attention_kernel.hpp"
#include "wlb4d/core/bf16.hpp"
#include "wlb4d/model/attention_ragged.hpp"

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace wlb::model::attn_impl::cudnn_sdpa {

namespace fe = cudnn_frontend;
using core::bf16_bits;

// Tensor UIDs of the variant pack (one namespace for both graphs).
enum Uid : std::int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kScale, kSeqQ, kSeqKV, kRaggedQ, kRaggedKV
};

void check(const fe::error_object& e, const char* what, const SdpaGraphKey& key) {
  if (e.is_good()) return;
  throw std::runtime_error(std::string("attention (model.attention_kernel=cudnn): ") + what + " failed for the " +
                           key.str() + " graph: " + e.err_msg +
                           " (model.attention_kernel=portable runs the portable kernel)");
}

void check_cudnn(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS)
    throw std::runtime_error(std::string("attention (model.attention_kernel=cudnn): ") + what + ": " +
                             cudnnGetErrorString(st));
}

// One handle per process (wlb4d drives one GPU per rank from one thread), on
// the stream of Kokkos' default instance so packing, SDPA and unpacking stay
// ordered without fences. Never destroyed (see bf16_gemm.cpp's cuBLAS handle).
cudnnHandle_t handle() {
  static cudnnHandle_t h = [] {
    cudnnHandle_t x = nullptr;
    check_cudnn(cudnnCreate(&x), "cudnnCreate");
    return x;
  }();
  check_cudnn(cudnnSetStream(h, ExecSpace().cuda_stream()), "cudnnSetStream");
  return h;
}

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace_bytes = 0;
};

// The ragged element strides of a [rows][heads][D] tensor seen as cuDNN's
// (b, h, s, d): the batch stride is replaced by the ragged offset.
std::vector<std::int64_t> thd_stride(std::int64_t heads, std::int64_t s, std::int64_t d) {
  return {heads * s * d, d, heads * d, 1};
}

// Counters of the end-of-run report (cache_report): backward graphs built with
// the default (non-deterministic) algorithm, and the wall time of graph builds
// (the rank's one thread builds them).
std::atomic<std::int64_t> g_nondeterministic{0};
double g_build_ms = 0;

// The graph for `key`; the backward with cuDNN's deterministic algorithm when
// `deterministic`. Throws (check) when cuDNN cannot build it.
Plan build_graph(const SdpaGraphKey& key, bool deterministic) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t b = key.batch, hq = key.heads_q, hkv = key.heads_kv, sq = key.s_q, skv = key.s_kv,
                     d = key.head_dim;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto i32 = [&](const char* name, Uid uid, std::int64_t n) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({n, 1, 1, 1})
                         .set_stride({1, 1, 1, 1})
                         .set_data_type(fe::DataType_t::INT32));
  };
  auto ragged_q = i32("ragged_offset_q", kRaggedQ, b + 1);
  auto ragged_kv = i32("ragged_offset_kv", kRaggedKV, b + 1);
  auto seq_q = i32("seq_len_q", kSeqQ, b);
  auto seq_kv = i32("seq_len_kv", kSeqKV, b);
  auto act = [&](const char* name, Uid uid, std::int64_t heads, std::int64_t s,
                 const std::shared_ptr<fe::graph::Tensor_attributes>& ragged) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({b, heads, s, d})
                         .set_stride(thd_stride(heads, s, d))
                         .set_ragged_offset(ragged));
  };
  auto Q = act("Q", kQ, hq, sq, ragged_q);
  auto K = act("K", kK, hkv, skv, ragged_kv);
  auto V = act("V", kV, hkv, skv, ragged_kv);
  auto scale = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("attn_scale")
                             .set_uid(kScale)
                             .set_dim({1, 1, 1, 1})
                             .set_stride({1, 1, 1, 1})
                             .set_is_pass_by_value(true)
                             .set_data_type(fe::DataType_t::FLOAT));
  if (!key.backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("wlb4d_sdpa_forward")
                    .set_generate_stats(true)
                    .set_attn_scale(scale)
                    .set_padding_mask(true)
                    .set_seq_len_q(seq_q)
                    .set_seq_len_kv(seq_kv)
                    .set_causal_mask_bottom_right(true);
    auto [O, stats] = g->sdpa(Q, K, V, opts);
    O->set_output(true).set_uid(kO).set_dim({b, hq, sq, d}).set_stride(thd_stride(hq, sq, d)).set_ragged_offset(
        ragged_q);
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({b, hq, sq, 1})
        .set_stride({hq * sq, sq, 1, 1});
  } else {
    auto O = act("O", kO, hq, sq, ragged_q);
    auto dO = act("dO", kDO, hq, sq, ragged_q);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim({b, hq, sq, 1})
                               .set_stride({hq * sq, sq, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("wlb4d_sdpa_backward")
                    .set_attn_scale(scale)
                    .set_padding_mask(true)
                    .set_seq_len_q(seq_q)
                    .set_seq_len_kv(seq_kv)
                    .set_causal_mask_bottom_right(true)
                    .set_max_total_seq_len_q(key.total_q)
                    .set_max_total_seq_len_kv(key.total_kv)
                    .set_deterministic_algorithm(deterministic);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opts);
    dQ->set_output(true).set_uid(kDQ).set_dim({b, hq, sq, d}).set_stride(thd_stride(hq, sq, d)).set_ragged_offset(
        ragged_q);
    dK->set_output(true).set_uid(kDK).set_dim({b, hkv, skv, d}).set_stride(thd_stride(hkv, skv, d)).set_ragged_offset(
        ragged_kv);
    dV->set_output(true).set_uid(kDV).set_dim({b, hkv, skv, d}).set_stride(thd_stride(hkv, skv, d)).set_ragged_offset(
        ragged_kv);
  }
  check(g->validate(), "validate", key);
  check(g->build_operation_graph(handle()), "build_operation_graph", key);
  check(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans", key);
  check(g->check_support(handle()), "check_support", key);
  check(g->build_plans(handle()), "build_plans", key);
  Plan p;
  p.graph = g;
  check(g->get_workspace_size(p.workspace_bytes), "get_workspace_size", key);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  g_build_ms += ms;
  spdlog::debug("attention: built the cuDNN SDPA graph {}{} in {:.1f} ms (workspace {} bytes)", key.str(),
                key.backward ? (deterministic ? ", deterministic" : ", non-deterministic") : "", ms, p.workspace_bytes);
  return p;
}

// Half of the device memory free now: the most a deterministic backward's
// workspace may take before the default algorithm runs instead.
std::int64_t workspace_limit() {
  std::size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return std::numeric_limits<std::int64_t>::max();
  return static_cast<std::int64_t>(free_bytes / 2);
}

// The backward asks for the deterministic algorithm (layout equivalence needs
// bitwise reruns). Where cuDNN offers none for the shape or the device, or
// where its workspace would not fit (cudnn-frontend 1.23 sizes the
// deterministic dP workspace as b x h_q x s_q x s_kv x 2 bytes of the bucket:
// every entry pays for the longest), it says so once per graph and runs the
// default one (dQ accumulated with atomics, workspace sized by the packed rows).
Plan build(const SdpaGraphKey& key) {
  if (!key.backward) return build_graph(key, false);
  std::string why;
  try {
    Plan p = build_graph(key, true);
    const std::int64_t limit = workspace_limit();
    if (p.workspace_bytes <= limit) return p;
    why = "its workspace, " + std::to_string(p.workspace_bytes >> 20) + " MiB, exceeds half of the free device memory (" +
          std::to_string(limit >> 20) + " MiB)";
  } catch (const std::runtime_error& e) {
    why = std::string("cuDNN offers none: ") + e.what();
  }
  ++g_nondeterministic;
  spdlog::warn("attention: no deterministic cuDNN SDPA backward for the {} graph ({}); running the "
               "non-deterministic one: reruns may differ in the last bits",
               key.str(), why);
  return build_graph(key, false);
}

SdpaPlanCache<Plan>& cache() {
  static SdpaPlanCache<Plan> c(64);
  return c;
}

// Device buffers that grow and are kept (one set per process).
template <class T>
void ensure(Kokkos::View<T*, MemSpace>& v, std::int64_t n, const char* label) {
  if (static_cast<std::int64_t>(v.extent(0)) < n) v = Kokkos::View<T*, MemSpace>(label, n);
}
struct Buffers {
  Kokkos::View<bf16_bits*, MemSpace> q, k, v, o, dout, dq, dk, dv;
  Kokkos::View<float*, MemSpace> stats;
  Kokkos::View<std::int32_t*, MemSpace> ints;
  Kokkos::View<char*, MemSpace> workspace;
};
Buffers& buffers() {
  static Buffers b;
  return b;
}

// The ragged layout's host arrays in one device array (int32), and views into it.
struct DeviceMaps {
  Kokkos::View<const std::int32_t*, MemSpace> seq_q, seq_kv, ragged_q, ragged_kv, q_src, kv_src, q_row, q_entry,
      q_pos, key_rows_begin, key_rows;
};

DeviceMaps upload(const RaggedAttention& r, int hq, int hkv, int d) {
  std::vector<std::int32_t> all;
  std::vector<std::pair<std::size_t, std::size_t>> at;
  // Each array starts on a 16-byte boundary: cudnn-frontend declares every
  // tensor with 16-byte alignment (Tensor_attributes::alignment), and cuDNN
  // refuses a misaligned pointer (CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER).
  auto add = [&](const std::vector<std::int32_t>& x) {
    all.resize((all.size() + 3) & ~std::size_t(3), 0);
    at.emplace_back(all.size(), x.size());
    all.insert(all.end(), x.begin(), x.end());
  };
  auto offsets = [&](const std::vector<std::int64_t>& rows, std::int64_t elems) {
    std::vector<std::int32_t> o(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) o[i] = static_cast<std::int32_t>(rows[i] * elems);
    return o;
  };
  add(r.seq_len_q);
  add(r.seq_len_kv);
  add(offsets(r.q_row_offset, std::int64_t(hq) * d));
  add(offsets(r.kv_row_offset, std::int64_t(hkv) * d));
  add(r.q_src);
  add(r.kv_src);
  add(r.q_row);
  add(r.q_entry);
  add(r.q_pos);
  add(r.key_rows_begin);
  add(r.key_rows);
  auto& buf = buffers().ints;
  ensure(buf, static_cast<std::int64_t>(all.size()) + 1, "wlb4d::attention::cudnn::maps");
  Kokkos::View<const std::int32_t*, HostSpace, Kokkos::MemoryUnmanaged> host(all.data(), all.size());
  Kokkos::deep_copy(Kokkos::subview(buf, std::make_pair(std::size_t(0), all.size())), host);
  auto part = [&](int i) {
    return Kokkos::View<const std::int32_t*, MemSpace>(
        Kokkos::subview(buf, std::make_pair(at[i].first, at[i].first + at[i].second)));
  };
  return DeviceMaps{part(0), part(1), part(2), part(3), part(4), part(5),
                    part(6), part(7), part(8), part(9), part(10)};
}

RaggedAttention ragged_on_host(const View1<const std::int32_t>& kv_lo, const View1<const std::int32_t>& kv_hi,
                               const Dims& dm) {
  auto lo = Kokkos::create_mirror_view_and_copy(HostSpace(), kv_lo);
  auto hi = Kokkos::create_mirror_view_and_copy(HostSpace(), kv_hi);
  return ragged_attention(lo.data(), hi.data(), dm.T, dm.S,
                          std::int64_t(dm.Hq > dm.Hkv ? dm.Hq : dm.Hkv) * dm.D);
}

// dst[row][h][d] = bf16(src(map[row], h, d)); 0 where map[row] < 0.
void pack(View3<const float> src, Kokkos::View<const std::int32_t*, MemSpace> map, std::int64_t rows, int heads,
          int d, Kokkos::View<bf16_bits*, MemSpace> dst) {
  const std::int64_t per_row = std::int64_t(heads) * d;
  Kokkos::parallel_for(
      "wlb4d::attention::cudnn::pack", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(0, rows * per_row),
      KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t row = idx / per_row;
        const int h = static_cast<int>((idx % per_row) / d), e = static_cast<int>(idx % d);
        const std::int32_t s = map(row);
        dst(idx) = s < 0 ? bf16_bits(0) : core::float_to_bf16(src(s, h, e));
      });
}

// out(i, h, d) = packed[row_of[i]][h][d]; 0 where row_of[i] < 0.
void unpack_queries(Kokkos::View<const bf16_bits*, MemSpace> packed, Kokkos::View<const std::int32_t*, MemSpace> row_of,
                    View3<float> out) {
  const int T = static_cast<int>(out.extent(0)), H = static_cast<int>(out.extent(1)),
            D = static_cast<int>(out.extent(2));
  Kokkos::parallel_for(
      "wlb4d::attention::cudnn::unpack_queries",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>({0, 0, 0}, {T, H, D}),
      KOKKOS_LAMBDA(const int i, const int h, const int e) {
        const std::int32_t r = row_of(i);
        out(i, h, e) = r < 0 ? 0.0f : core::bf16_to_float(packed((std::int64_t(r) * H + h) * D + e));
      });
}

// dk(j, h, d) = Σ over the packed rows holding key j, in entry order.
void sum_keys(Kokkos::View<const bf16_bits*, MemSpace> packed, Kokkos::View<const std::int32_t*, MemSpace> begin,
              Kokkos::View<const std::int32_t*, MemSpace> rows, View3<float> dk) {
  const int S = static_cast<int>(dk.extent(0)), H = static_cast<int>(dk.extent(1)),
            D = static_cast<int>(dk.extent(2));
  Kokkos::parallel_for(
      "wlb4d::attention::cudnn::sum_keys", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>({0, 0, 0}, {S, H, D}),
      KOKKOS_LAMBDA(const int j, const int h, const int e) {
        float s = 0.0f;
        for (std::int32_t t = begin(j); t < begin(j + 1); ++t)
          s += core::bf16_to_float(packed((std::int64_t(rows(t)) * H + h) * D + e));
        dk(j, h, e) = s;
      });
}

// lse(h, i) = stats[entry][h][pos] (-inf for a row with no key).
void stats_to_lse(Kokkos::View<const float*, MemSpace> stats, const DeviceMaps& m, int s_q, View2<float> lse) {
  const int H = static_cast<int>(lse.extent(0)), T = static_cast<int>(lse.extent(1));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto entry = m.q_entry;
  auto pos = m.q_pos;
  Kokkos::parallel_for(
      "wlb4d::attention::cudnn::stats_to_lse", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {H, T}),
      KOKKOS_LAMBDA(const int h, const int i) {
        const std::int32_t e = entry(i);
        lse(h, i) = e < 0 ? neg_inf : stats((std::int64_t(e) * H + h) * s_q + pos(i));
      });
}

// stats[entry][h][pos] = lse(h, i) for the rows with a key (the rest stays 0:
// the padding entries' score is 0 and their log-sum-exp is log(1) = 0).
void lse_to_stats(View2<const float> lse, const DeviceMaps& m, int s_q, Kokkos::View<float*, MemSpace> stats) {
  const int H = static_cast<int>(lse.extent(0)), T = static_cast<int>(lse.extent(1));
  auto entry = m.q_entry;
  auto pos = m.q_pos;
  Kokkos::parallel_for(
      "wlb4d::attention::cudnn::lse_to_stats", Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>({0, 0}, {H, T}),
      KOKKOS_LAMBDA(const int h, const int i) {
        const std::int32_t e = entry(i);
        if (e >= 0) stats((std::int64_t(e) * H + h) * s_q + pos(i)) = lse(h, i);
      });
}

void fill_empty_forward(View3<float> out, View2<float> lse) {
  Kokkos::deep_copy(out, 0.0f);
  Kokkos::deep_copy(lse, -std::numeric_limits<float>::infinity());
}

Plan& plan_for(const SdpaGraphKey& key) {
  return cache().get(key, [&] { return build(key); });
}

void* workspace(std::int64_t bytes) {
  auto& w = buffers().workspace;
  ensure(w, bytes > 0 ? bytes : 1, "wlb4d::attention::cudnn::workspace");
  return w.data();
}

void forward(View3<const float> q, View3<const float> k, View3<const float> v, View1<const std::int32_t> kv_lo,
             View1<const std::int32_t> kv_hi, float scale, View3<float> out, View2<float> lse, const Dims& dm) {
  const RaggedAttention r = ragged_on_host(kv_lo, kv_hi, dm);
  if (r.batch == 0) return fill_empty_forward(out, lse);
  const SdpaGraphKey key = sdpa_graph_key(r, dm.Hq, dm.Hkv, dm.D, false);
  Plan& plan = plan_for(key);
  const DeviceMaps m = upload(r, dm.Hq, dm.Hkv, dm.D);
  Buffers& b = buffers();
  const std::int64_t qn = r.total_q * dm.Hq * dm.D, kn = r.total_kv * dm.Hkv * dm.D;
  ensure(b.q, qn, "wlb4d::attention::cudnn::q");
  ensure(b.o, qn, "wlb4d::attention::cudnn::o");
  ensure(b.k, kn, "wlb4d::attention::cudnn::k");
  ensure(b.v, kn, "wlb4d::attention::cudnn::v");
  const std::int64_t sn = std::int64_t(key.batch) * dm.Hq * key.s_q;
  ensure(b.stats, sn, "wlb4d::attention::cudnn::stats");
  pack(q, m.q_src, r.q_rows, dm.Hq, dm.D, b.q);
  pack(k, m.kv_src, r.kv_rows, dm.Hkv, dm.D, b.k);
  pack(v, m.kv_src, r.kv_rows, dm.Hkv, dm.D, b.v);
  float scale_host = scale;
  std::unordered_map<std::int64_t, void*> pack_map = {
      {kQ, b.q.data()},       {kK, b.k.data()},          {kV, b.v.data()},
      {kO, b.o.data()},       {kStats, b.stats.data()},  {kScale, &scale_host},
      {kSeqQ, const_cast<std::int32_t*>(m.seq_q.data())},          {kSeqKV, const_cast<std::int32_t*>(m.seq_kv.data())},
      {kRaggedQ, const_cast<std::int32_t*>(m.ragged_q.data())},    {kRaggedKV, const_cast<std::int32_t*>(m.ragged_kv.data())}};
  check(plan.graph->execute(handle(), pack_map, workspace(plan.workspace_bytes)), "execute", key);
  unpack_queries(b.o, m.q_row, out);
  stats_to_lse(b.stats, m, key.s_q, lse);
  ExecSpace().fence();  // the host arrays behind the maps and scale_host go out of scope
}

void backward(View3<const float> q, View3<const float> k, View3<const float> v, View3<const float> out,
              View3<const float> dout, View2<const float> lse, View1<const std::int32_t> kv_lo,
              View1<const std::int32_t> kv_hi, float scale, View3<float> dq, View3<float> dk, View3<float> dv,
              const Dims& dm) {
  const RaggedAttention r = ragged_on_host(kv_lo, kv_hi, dm);
  if (r.batch == 0) {
    Kokkos::deep_copy(dq, 0.0f);
    Kokkos::deep_copy(dk, 0.0f);
    Kokkos::deep_copy(dv, 0.0f);
    return;
  }
  const SdpaGraphKey key = sdpa_graph_key(r, dm.Hq, dm.Hkv, dm.D, true);
  Plan& plan = plan_for(key);
  const DeviceMaps m = upload(r, dm.Hq, dm.Hkv, dm.D);
  Buffers& b = buffers();
  const std::int64_t qn = r.total_q * dm.Hq * dm.D, kn = r.total_kv * dm.Hkv * dm.D;
  for (auto* x : {&b.q, &b.o, &b.dout, &b.dq}) ensure(*x, qn, "wlb4d::attention::cudnn::q-shaped");
  for (auto* x : {&b.k, &b.v, &b.dk, &b.dv}) ensure(*x, kn, "wlb4d::attention::cudnn::kv-shaped");
  const std::int64_t sn = std::int64_t(key.batch) * dm.Hq * key.s_q;
  ensure(b.stats, sn, "wlb4d::attention::cudnn::stats");
  pack(q, m.q_src, r.q_rows, dm.Hq, dm.D, b.q);
  pack(k, m.kv_src, r.kv_rows, dm.Hkv, dm.D, b.k);
  pack(v, m.kv_src, r.kv_rows, dm.Hkv, dm.D, b.v);
  pack(out, m.q_src, r.q_rows, dm.Hq, dm.D, b.o);
  pack(dout, m.q_src, r.q_rows, dm.Hq, dm.D, b.dout);
  Kokkos::deep_copy(Kokkos::subview(b.stats, std::make_pair(std::int64_t(0), sn)), 0.0f);
  lse_to_stats(lse, m, key.s_q, b.stats);
  float scale_host = scale;
  std::unordered_map<std::int64_t, void*> pack_map = {
      {kQ, b.q.data()},       {kK, b.k.data()},          {kV, b.v.data()},
      {kO, b.o.data()},       {kDO, b.dout.data()},      {kStats, b.stats.data()},
      {kDQ, b.dq.data()},     {kDK, b.dk.data()},        {kDV, b.dv.data()},
      {kScale, &scale_host},
      {kSeqQ, const_cast<std::int32_t*>(m.seq_q.data())},          {kSeqKV, const_cast<std::int32_t*>(m.seq_kv.data())},
      {kRaggedQ, const_cast<std::int32_t*>(m.ragged_q.data())},    {kRaggedKV, const_cast<std::int32_t*>(m.ragged_kv.data())}};
  check(plan.graph->execute(handle(), pack_map, workspace(plan.workspace_bytes)), "execute", key);
  unpack_queries(b.dq, m.q_row, dq);
  sum_keys(b.dk, m.key_rows_begin, m.key_rows, dk);
  sum_keys(b.dv, m.key_rows_begin, m.key_rows, dv);
  ExecSpace().fence();
}

std::int64_t nondeterministic_graphs() { return g_nondeterministic.load(); }

std::string cache_report() {
  const auto& c = cache();
  const std::size_t calls = c.hits() + c.misses();
  if (calls == 0) return "";
  return fmt::format("attention: cuDNN graphs: {} built in {:.0f} ms ({:.0f} ms each on average), {} of {} calls served "
                     "from the cache, {} evicted; {} non-deterministic backward graph(s)",
                     c.misses(), g_build_ms, g_build_ms / double(c.misses() ? c.misses() : 1), c.hits(), calls,
                     c.evictions(), g_nondeterministic.load());
}

std::string versions() {
  const std::size_t v = cudnnGetVersion();  // e.g. 91900 for 9.19.0
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         " (cudnn-frontend " + std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_PATCH_VERSION) + ")";
}

}  // namespace wlb::model::attn_impl::cudnn_sdpa

// Kernels of layers.hpp. Every loop is a labelled Kokkos parallel construct;
// math goes through wlb::kmath so the same source builds for CUDA.
#include "wlb4d/model/layers.hpp"

#include "wlb4d/core/kokkos_compat.hpp"

#include "vexp.hpp"

#include <KokkosBlas3_gemm.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace wlb::model {

namespace {

using Team = Kokkos::TeamPolicy<ExecSpace>;
using Member = Team::member_type;
using MD2 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>;
using MD3 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>;

void require(bool ok, const char* fn, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("wlb::model::") + fn + ": " + what);
}

std::string dims(std::size_t a, std::size_t b) {
  return "[" + std::to_string(a) + "][" + std::to_string(b) + "]";
}

// Columns per work item of rmsnorm_bwd_dw: a block of rows-outer sums on the
// host, one column per thread on GPUs (coalesced loads across threads).
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL)
constexpr int kRmsDwCols = 1;
#else
constexpr int kRmsDwCols = 32;
#endif

}  // namespace

// ---- linear -----------------------------------------------------------------------

template <class Scalar>
void linear_forward(const View2<Scalar>& x, const View2<Scalar>& w, const View2<Scalar>& y, Scalar beta) {
  require(x.extent(1) == w.extent(1) && y.extent(0) == x.extent(0) && y.extent(1) == w.extent(0),
          "linear_forward", "x" + dims(x.extent(0), x.extent(1)) + " W" + dims(w.extent(0), w.extent(1)) +
                                " y" + dims(y.extent(0), y.extent(1)) + " do not fit y = x·Wᵀ");
  if (x.extent(0) == 0) return;
  KokkosBlas::gemm("N", "T", Scalar(1), x, w, beta, y);
}

template <class Scalar>
void linear_backward_input(const View2<Scalar>& w, const View2<Scalar>& dy, const View2<Scalar>& dx,
                           Scalar beta_dx) {
  require(dy.extent(1) == w.extent(0) && dx.extent(0) == dy.extent(0) && dx.extent(1) == w.extent(1),
          "linear_backward_input", "W" + dims(w.extent(0), w.extent(1)) + " dy" + dims(dy.extent(0), dy.extent(1)) +
                                       " dx" + dims(dx.extent(0), dx.extent(1)) + " do not fit dx = dy·W");
  if (dy.extent(0) == 0) return;
  KokkosBlas::gemm("N", "N", Scalar(1), dy, w, beta_dx, dx);
}

template <class Scalar>
void linear_backward_weight(const View2<Scalar>& x, const View2<Scalar>& dy, const View2<Scalar>& dw) {
  require(dy.extent(0) == x.extent(0) && dw.extent(0) == dy.extent(1) && dw.extent(1) == x.extent(1),
          "linear_backward_weight", "x" + dims(x.extent(0), x.extent(1)) + " dy" + dims(dy.extent(0), dy.extent(1)) +
                                        " dW" + dims(dw.extent(0), dw.extent(1)) + " do not fit dW += dyᵀ·x");
  if (x.extent(0) == 0) return;
  // dW += dyᵀ·x. For a very tall dW (the LM head, one row per vocabulary entry)
  // one call runs OpenBLAS at ~70% of its speed at the other shapes (measured
  // with bench/gemm_bench BM_sgemm_linear/1024/50304/768/{2,3}: 25-28 vs 37
  // GFLOP/s); blocks of kDwRows rows of dW run at full speed. Each element
  // is still one dot product over the tokens, so the result is unchanged.
  constexpr std::int64_t kDwRows = 4096;
  const std::int64_t O = std::int64_t(dw.extent(0));
  if (O <= 2 * kDwRows) {
    KokkosBlas::gemm("T", "N", Scalar(1), dy, x, Scalar(1), dw);
    return;
  }
  for (std::int64_t o0 = 0; o0 < O; o0 += kDwRows) {
    const auto rows = std::make_pair(o0, o0 + kDwRows < O ? o0 + kDwRows : O);
    KokkosBlas::gemm("T", "N", Scalar(1), Kokkos::subview(dy, Kokkos::ALL, rows), x, Scalar(1),
                     Kokkos::subview(dw, rows, Kokkos::ALL));
  }
}

template <class Scalar>
void linear_backward(const View2<Scalar>& x, const View2<Scalar>& w, const View2<Scalar>& dy,
                     const View2<Scalar>& dx, const View2<Scalar>& dw, Scalar beta_dx) {
  require(dy.extent(0) == x.extent(0) && dy.extent(1) == w.extent(0) && x.extent(1) == w.extent(1) &&
              dw.extent(0) == w.extent(0) && dw.extent(1) == w.extent(1),
          "linear_backward", "x" + dims(x.extent(0), x.extent(1)) + " W" + dims(w.extent(0), w.extent(1)) +
                                 " dy" + dims(dy.extent(0), dy.extent(1)) + " dW" +
                                 dims(dw.extent(0), dw.extent(1)) + " are inconsistent");
  if (x.extent(0) == 0) return;
  if (dx.data() != nullptr) {
    require(dx.extent(0) == x.extent(0) && dx.extent(1) == x.extent(1), "linear_backward",
            "dx" + dims(dx.extent(0), dx.extent(1)) + " must match x" + dims(x.extent(0), x.extent(1)));
    linear_backward_input(w, dy, dx, beta_dx);
  }
  linear_backward_weight(x, dy, dw);
}

// ---- embedding ------------------------------------------------------------------------

template <class Scalar>
void embedding_forward(const IntVec& ids, std::int64_t T, std::int64_t v0, const View2<Scalar>& table,
                       const View2<Scalar>& out) {
  require(table.extent(1) == out.extent(1) && std::int64_t(out.extent(0)) >= T &&
              std::int64_t(ids.extent(0)) >= T,
          "embedding_forward", "table/out/ids extents do not fit T=" + std::to_string(T));
  const std::int64_t d = std::int64_t(table.extent(1));
  const std::int64_t vl = std::int64_t(table.extent(0));
  if (T == 0 || d == 0) return;
  Kokkos::parallel_for(
      "wlb::model::embedding_fwd", MD2({0, 0}, {T, d}), KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t j) {
        const std::int64_t r = std::int64_t(ids(t)) - v0;
        out(t, j) = (r >= 0 && r < vl) ? table(r, j) : Scalar(0);
      });
}

template <class Scalar>
void embedding_backward(const IntVec& ids, std::int64_t T, std::int64_t v0, const View2<Scalar>& dout,
                        const View2<Scalar>& dtable) {
  require(dtable.extent(1) == dout.extent(1) && std::int64_t(dout.extent(0)) >= T &&
              std::int64_t(ids.extent(0)) >= T,
          "embedding_backward", "dtable/dout/ids extents do not fit T=" + std::to_string(T));
  const std::int64_t d = std::int64_t(dtable.extent(1));
  const std::int64_t vl = std::int64_t(dtable.extent(0));
  // One work item per column: two tokens with the same id never touch the same
  // element concurrently, and the sum over tokens has a fixed order.
  Kokkos::parallel_for(
      "wlb::model::embedding_bwd", Kokkos::RangePolicy<ExecSpace>(0, d), KOKKOS_LAMBDA(const std::int64_t j) {
        for (std::int64_t t = 0; t < T; ++t) {
          const std::int64_t r = std::int64_t(ids(t)) - v0;
          if (r >= 0 && r < vl) dtable(r, j) += dout(t, j);
        }
      });
}

// ---- RMSNorm -------------------------------------------------------------------------------

template <class Scalar>
void rmsnorm_forward(const View2<Scalar>& x, std::int64_t T, const View1<Scalar>& w, double eps,
                     const View2<Scalar>& y, const View1<Scalar>& rstd) {
  const int d = int(x.extent(1));
  require(w.extent(0) == x.extent(1) && y.extent(1) == x.extent(1) && std::int64_t(x.extent(0)) >= T &&
              std::int64_t(y.extent(0)) >= T && std::int64_t(rstd.extent(0)) >= T,
          "rmsnorm_forward", "x/w/y/rstd extents do not fit T=" + std::to_string(T));
  if (T == 0) return;
  const Scalar seps = Scalar(eps);
  Kokkos::parallel_for(
      "wlb::model::rmsnorm_fwd", Team(int(T), Kokkos::AUTO), KOKKOS_LAMBDA(const Member& m) {
        const int t = m.league_rank();
        Scalar ss = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, d), [&](const int j, Scalar& a) { a += x(t, j) * x(t, j); }, ss);
        const Scalar r = Scalar(1) / kmath::sqrt(ss / Scalar(d) + seps);
        Kokkos::single(Kokkos::PerTeam(m), [&]() { rstd(t) = r; });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, d), [&](const int j) { y(t, j) = x(t, j) * r * w(j); });
      });
}

template <class Scalar>
void rmsnorm_backward(const View2<Scalar>& x, std::int64_t T, const View1<Scalar>& w,
                      const View1<Scalar>& rstd, const View2<Scalar>& dy, const View2<Scalar>& dx,
                      const View1<Scalar>& dw, bool accumulate_dx) {
  const int d = int(x.extent(1));
  require(w.extent(0) == x.extent(1) && dy.extent(1) == x.extent(1) && dx.extent(1) == x.extent(1) &&
              dw.extent(0) == x.extent(1) && std::int64_t(dy.extent(0)) >= T &&
              std::int64_t(dx.extent(0)) >= T && std::int64_t(rstd.extent(0)) >= T,
          "rmsnorm_backward", "x/w/dy/dx/dw/rstd extents do not fit T=" + std::to_string(T));
  if (T == 0) return;
  // dw first: it reads dy and x, and dx may be the buffer dy is later read from
  // by the caller (it never aliases dy itself).
  // One work item per block of kDwCols columns, rows in the outer loop: the
  // host reads dy and x row by row (contiguous) instead of down columns
  // (stride d). Each column's sum still runs over t in order, so the result
  // is the same as one work item per column (what device builds use).
  constexpr int kDwCols = kRmsDwCols;
  const int nblk = (d + kDwCols - 1) / kDwCols;
  Kokkos::parallel_for(
      "wlb::model::rmsnorm_bwd_dw", Kokkos::RangePolicy<ExecSpace>(0, nblk), KOKKOS_LAMBDA(const int b) {
        const int j0 = b * kDwCols;
        const int nj = kmath::min(kDwCols, d - j0);
        Scalar a[kDwCols];
        for (int jj = 0; jj < kDwCols; ++jj) a[jj] = 0;
        for (std::int64_t t = 0; t < T; ++t) {
          const Scalar r = rstd(t);
          const Scalar* KOKKOS_RESTRICT dyt = &dy(t, j0);
          const Scalar* KOKKOS_RESTRICT xt = &x(t, j0);
          if (nj == kDwCols) {
            for (int jj = 0; jj < kDwCols; ++jj) a[jj] += dyt[jj] * xt[jj] * r;
          } else {
            for (int jj = 0; jj < nj; ++jj) a[jj] += dyt[jj] * xt[jj] * r;
          }
        }
        for (int jj = 0; jj < nj; ++jj) dw(j0 + jj) += a[jj];
      });
  // A branch, not a 0/1 factor: 0·dx would turn uninitialised NaNs into NaN.
  const bool acc = accumulate_dx;
  Kokkos::parallel_for(
      "wlb::model::rmsnorm_bwd_dx", Team(int(T), Kokkos::AUTO), KOKKOS_LAMBDA(const Member& m) {
        const int t = m.league_rank();
        Scalar s = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, d), [&](const int j, Scalar& a) { a += w(j) * dy(t, j) * x(t, j); }, s);
        const Scalar r = rstd(t);
        const Scalar c = r * r * r * s / Scalar(d);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, d), [&](const int j) {
          const Scalar gj = r * w(j) * dy(t, j) - c * x(t, j);
          dx(t, j) = acc ? dx(t, j) + gj : gj;
        });
      });
}

// ---- RoPE -------------------------------------------------------------------------------------

std::vector<double> rope_inv_freq(std::int64_t D, const core::ModelConfig& m) {
  require(D > 0 && D % 2 == 0, "rope_inv_freq", "head_dim " + std::to_string(D) + " must be even");
  std::vector<double> f(std::size_t(D / 2));
  const double log_theta = std::log(m.rope_theta);
  for (std::int64_t i = 0; i < D / 2; ++i) f[std::size_t(i)] = std::exp(-2.0 * double(i) / double(D) * log_theta);
  if (m.rope_scaling == "none") return f;
  require(m.rope_scaling == "llama3", "rope_inv_freq", "unknown model.rope_scaling '" + m.rope_scaling + "'");
  const double pi = 3.14159265358979323846;
  const double L = m.rope_original_max_position, lo = m.rope_low_freq_factor, hi = m.rope_high_freq_factor;
  const double low_freq_wavelen = L / lo, high_freq_wavelen = L / hi;
  for (auto& x : f) {
    const double wavelen = 2.0 * pi / x;
    if (wavelen < high_freq_wavelen) continue;
    if (wavelen > low_freq_wavelen) {
      x /= m.rope_factor;
      continue;
    }
    const double s = (L / wavelen - lo) / (hi - lo);
    x = (1.0 - s) * x / m.rope_factor + s * x;
  }
  return f;
}

View1<double> rope_inv_freq_view(std::int64_t D, const core::ModelConfig& m) {
  const auto f = rope_inv_freq(D, m);
  View1<double> v("wlb::model::rope_inv_freq", f.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < f.size(); ++i) h(i) = f[i];
  Kokkos::deep_copy(v, h);
  return v;
}

template <class Scalar>
void rope_apply(const View3<Scalar>& x, std::int64_t T, const IntVec& pos, const View1<double>& inv_freq,
                bool inverse) {
  const std::int64_t H = std::int64_t(x.extent(1));
  const std::int64_t D = std::int64_t(x.extent(2));
  require(D % 2 == 0, "rope_apply", "head_dim " + std::to_string(D) + " must be even");
  require(std::int64_t(x.extent(0)) >= T && std::int64_t(pos.extent(0)) >= T, "rope_apply",
          "x/pos extents do not fit T=" + std::to_string(T));
  require(std::int64_t(inv_freq.extent(0)) == D / 2, "rope_apply",
          "inv_freq has " + std::to_string(inv_freq.extent(0)) + " frequencies, head_dim/2 = " + std::to_string(D / 2));
  if (T == 0 || H == 0) return;
  const std::int64_t half = D / 2;
  const double sign = inverse ? -1.0 : 1.0;
  // One work item per (token, frequency): the rotation angle (two fp64
  // transcendentals) is computed once and applied to every head, not once
  // per head (the per-element values are unchanged).
  Kokkos::parallel_for(
      "wlb::model::rope", MD2({0, 0}, {T, half}), KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t i) {
        const double ang = sign * double(pos(t)) * inv_freq(i);
        const Scalar c = Scalar(kmath::cos(ang));
        const Scalar s = Scalar(kmath::sin(ang));
        for (std::int64_t h = 0; h < H; ++h) {
          const Scalar a = x(t, h, i);
          const Scalar b = x(t, h, i + half);
          x(t, h, i) = a * c - b * s;
          x(t, h, i + half) = b * c + a * s;
        }
      });
}

// ---- SwiGLU ------------------------------------------------------------------------------------

#ifdef WLB4D_VEXP
/// Host SwiGLU row walk: for row gt[0, F) in chunks of 256, fills sig[k] =
/// σ(gt[f0+k]) with the exponentials eight at a time (vexp.hpp) and calls
/// body(f0, n, sig). Shared by the forward and backward kernels.
template <class Scalar, class Body>
inline void sigmoid_chunks(const Scalar* KOKKOS_RESTRICT gt, std::int64_t F, Body&& body) {
  constexpr int kC = 256;
  Scalar e[kC];
  for (std::int64_t f0 = 0; f0 < F; f0 += kC) {
    const int n = int(kmath::min<std::int64_t>(kC, F - f0));
    for (int k = 0; k < n; ++k) e[k] = -gt[f0 + k];
    vexp::exp_shift(e, e, n, Scalar(0));
    for (int k = 0; k < n; ++k) e[k] = Scalar(1) / (Scalar(1) + e[k]);
    body(f0, n, e);
  }
}
#endif

template <class Scalar>
void swiglu_forward(const View2<Scalar>& g, const View2<Scalar>& u, std::int64_t T, const View2<Scalar>& h) {
  const std::int64_t F = std::int64_t(g.extent(1));
  require(u.extent(1) == g.extent(1) && h.extent(1) == g.extent(1), "swiglu_forward", "g/u/h widths differ");
  if (T == 0 || F == 0) return;
#ifdef WLB4D_VEXP
  // Host: one row per work item, the exponentials eight at a time (vexp.hpp).
  Kokkos::parallel_for(
      "wlb::model::swiglu_fwd", Kokkos::RangePolicy<ExecSpace>(0, T), KOKKOS_LAMBDA(const std::int64_t t) {
        const Scalar* KOKKOS_RESTRICT gt = &g(t, 0);
        const Scalar* KOKKOS_RESTRICT ut = &u(t, 0);
        Scalar* KOKKOS_RESTRICT ht = &h(t, 0);
        sigmoid_chunks(gt, F, [&](std::int64_t f0, int n, const Scalar* sig) {
          for (int k = 0; k < n; ++k) ht[f0 + k] = gt[f0 + k] * sig[k] * ut[f0 + k];
        });
      });
  return;
#endif
  Kokkos::parallel_for(
      "wlb::model::swiglu_fwd", MD2({0, 0}, {T, F}), KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t f) {
        const Scalar z = g(t, f);
        const Scalar sig = Scalar(1) / (Scalar(1) + kmath::exp(-z));
        h(t, f) = z * sig * u(t, f);
      });
}

template <class Scalar>
void swiglu_backward(const View2<Scalar>& g, const View2<Scalar>& u, const View2<Scalar>& dh, std::int64_t T,
                     const View2<Scalar>& dg, const View2<Scalar>& du) {
  const std::int64_t F = std::int64_t(g.extent(1));
  require(u.extent(1) == g.extent(1) && dh.extent(1) == g.extent(1) && dg.extent(1) == g.extent(1) &&
              du.extent(1) == g.extent(1),
          "swiglu_backward", "g/u/dh/dg/du widths differ");
  if (T == 0 || F == 0) return;
#ifdef WLB4D_VEXP
  Kokkos::parallel_for(
      "wlb::model::swiglu_bwd", Kokkos::RangePolicy<ExecSpace>(0, T), KOKKOS_LAMBDA(const std::int64_t t) {
        const Scalar* KOKKOS_RESTRICT gt = &g(t, 0);
        const Scalar* KOKKOS_RESTRICT ut = &u(t, 0);
        const Scalar* KOKKOS_RESTRICT dht = &dh(t, 0);
        Scalar* KOKKOS_RESTRICT dgt = &dg(t, 0);
        Scalar* KOKKOS_RESTRICT dut = &du(t, 0);
        sigmoid_chunks(gt, F, [&](std::int64_t f0, int n, const Scalar* s) {
          for (int k = 0; k < n; ++k) {
            const Scalar z = gt[f0 + k], sig = s[k], grad = dht[f0 + k], up = ut[f0 + k];
            dgt[f0 + k] = grad * up * sig * (Scalar(1) + z * (Scalar(1) - sig));
            dut[f0 + k] = grad * z * sig;
          }
        });
      });
  return;
#endif
  Kokkos::parallel_for(
      "wlb::model::swiglu_bwd", MD2({0, 0}, {T, F}), KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t f) {
        const Scalar z = g(t, f);
        const Scalar sig = Scalar(1) / (Scalar(1) + kmath::exp(-z));
        const Scalar grad = dh(t, f);
        const Scalar up = u(t, f);
        dg(t, f) = grad * up * sig * (Scalar(1) + z * (Scalar(1) - sig));
        du(t, f) = grad * z * sig;
      });
}

// ---- cross-entropy -------------------------------------------------------------------------------

// Kernels of cross_entropy_forward: free functions of a named namespace (nvcc:
// an extended lambda needs an enclosing function with external linkage).
namespace ce_impl {

/// mx[t] = max over the real columns [0, vl) of row t (lowest if vl = 0).
template <class Scalar>
void row_max(const View2<Scalar>& logits, std::int64_t T, int vl, Scalar lowest, const View1<Scalar>& mx) {
#ifdef WLB4D_VEXP
  // Host: one row per work item; max and Σ exp in eight lanes (vexp.hpp).
  Kokkos::parallel_for(
      "wlb::model::ce_max", Kokkos::RangePolicy<ExecSpace>(0, T), KOKKOS_LAMBDA(const std::int64_t t) {
        const Scalar* KOKKOS_RESTRICT l = &logits(t, 0);
        if (vl == 0) {
          mx(t) = lowest;
          return;
        }
        constexpr int W = 8;
        Scalar m[W];
        for (int k = 0; k < W; ++k) m[k] = l[0];
        int v = 0;
        for (; v + W <= vl; v += W)
          for (int k = 0; k < W; ++k) m[k] = m[k] < l[v + k] ? l[v + k] : m[k];
        for (; v < vl; ++v) m[0] = m[0] < l[v] ? l[v] : m[0];
        Scalar a = m[0];
        for (int k = 1; k < W; ++k) a = kmath::max(a, m[k]);
        mx(t) = a;
      });
#else
  Kokkos::parallel_for(
      "wlb::model::ce_max", Team(int(T), Kokkos::AUTO), KOKKOS_LAMBDA(const Member& m) {
        const int t = m.league_rank();
        Scalar a = vl > 0 ? logits(t, 0) : lowest;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, vl), [&](const int v, Scalar& acc) { acc = kmath::max(acc, logits(t, v)); },
            Kokkos::Max<Scalar>(a));
        Kokkos::single(Kokkos::PerTeam(m), [&]() { mx(t) = a; });
      });
#endif
}

/// se[t] = Σ_{v < vl} exp(logits(t, v) - mx[t]); z[t] = the label's logit if this shard holds it, else 0.
template <class Scalar>
void sumexp_and_target(const View2<Scalar>& logits, const IntVec& labels, std::int64_t T, std::int64_t v0, int vl,
                       const View1<Scalar>& mx, const View1<Scalar>& se, const View1<Scalar>& z) {
#ifdef WLB4D_VEXP
  Kokkos::parallel_for(
      "wlb::model::ce_sumexp", Kokkos::RangePolicy<ExecSpace>(0, T), KOKKOS_LAMBDA(const std::int64_t t) {
        const Scalar* KOKKOS_RESTRICT l = &logits(t, 0);
        const Scalar mt = mx(t);
        constexpr int kC = 512, W = 8;
        Scalar e[kC];
        Scalar acc[W] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int v0c = 0; v0c < vl; v0c += kC) {
          const int n = kmath::min(kC, vl - v0c);
          vexp::exp_shift(l + v0c, e, n, mt);
          int k = 0;
          for (; k + W <= n; k += W)
            for (int w = 0; w < W; ++w) acc[w] += e[k + w];
          for (; k < n; ++k) acc[0] += e[k];
        }
        Scalar s = 0;
        for (int w = 0; w < W; ++w) s += acc[w];
        se(t) = s;
        const std::int64_t r = std::int64_t(labels(t)) - v0;
        z(t) = (labels(t) >= 0 && r >= 0 && r < vl) ? logits(t, r) : Scalar(0);
      });
#else
  Kokkos::parallel_for(
      "wlb::model::ce_sumexp", Team(int(T), Kokkos::AUTO), KOKKOS_LAMBDA(const Member& m) {
        const int t = m.league_rank();
        const Scalar mt = mx(t);
        Scalar s = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, vl), [&](const int v, Scalar& acc) { acc += kmath::exp(logits(t, v) - mt); },
            s);
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          se(t) = s;
          const std::int64_t r = std::int64_t(labels(t)) - v0;
          z(t) = (labels(t) >= 0 && r >= 0 && r < vl) ? logits(t, r) : Scalar(0);
        });
      });
#endif
}

}  // namespace ce_impl

template <class Scalar>
double cross_entropy_forward(const View2<Scalar>& logits, const IntVec& labels, std::int64_t T,
                             std::int64_t v0, const comm::Communicator& tp, const View1<Scalar>& lse,
                             const View1<Scalar>& scratch, std::int64_t vl_real) {
  // Only the real columns [0, vl) enter the softmax; padding beyond is masked.
  const int vl = vl_real < 0 ? int(logits.extent(1)) : int(std::min<std::int64_t>(vl_real, logits.extent(1)));
  const Scalar lowest = Kokkos::reduction_identity<Scalar>::max();  // a shard of padding only
  require(std::int64_t(logits.extent(0)) >= T && std::int64_t(labels.extent(0)) >= T &&
              std::int64_t(lse.extent(0)) >= T && std::int64_t(scratch.extent(0)) >= 3 * T,
          "cross_entropy_forward", "logits/labels/lse/scratch extents do not fit T=" + std::to_string(T));
  if (T == 0) return 0.0;
  // scratch = [ max (T) | sumexp (T) | target logit (T) ]: sumexp and target
  // are adjacent so one all-reduce carries both.
  Scalar* base = scratch.data();
  View1<Scalar> mx(base, T), se(base + T, T), z(base + 2 * T, T);
  ce_impl::row_max(logits, T, vl, lowest, mx);
  if (tp.size() > 1) {
    Kokkos::fence();
    tp.allreduce_device(mx.data(), std::size_t(T), comm::ReduceOp::Max);
  }
  ce_impl::sumexp_and_target(logits, labels, T, v0, vl, mx, se, z);
  if (tp.size() > 1) {
    Kokkos::fence();
    tp.allreduce_device(se.data(), std::size_t(2 * T), comm::ReduceOp::Sum);
  }
  double loss = 0;
  Kokkos::parallel_reduce(
      "wlb::model::ce_loss", Kokkos::RangePolicy<ExecSpace>(0, T),
      KOKKOS_LAMBDA(const std::int64_t t, double& acc) {
        const Scalar l = kmath::log(se(t)) + mx(t);
        lse(t) = l;
        if (labels(t) >= 0) acc += double(l - z(t));
      },
      loss);
  return loss;
}

template <class Scalar>
void cross_entropy_backward(const View2<Scalar>& logits, const IntVec& labels, std::int64_t T,
                            std::int64_t v0, const View1<Scalar>& lse, double grad_scale,
                            const View2<Scalar>& dlogits, std::int64_t vl_real) {
  const std::int64_t vl = std::int64_t(logits.extent(1));
  const std::int64_t vr = vl_real < 0 ? vl : std::min(vl_real, vl);  // padded columns [vr, vl): gradient 0
  require(dlogits.extent(1) == logits.extent(1) && std::int64_t(dlogits.extent(0)) >= T &&
              std::int64_t(logits.extent(0)) >= T && std::int64_t(lse.extent(0)) >= T,
          "cross_entropy_backward", "logits/dlogits/lse extents do not fit T=" + std::to_string(T));
  if (T == 0 || vl == 0) return;
  const Scalar gs = Scalar(grad_scale);
#ifdef WLB4D_VEXP
  // Host: one row per work item, softmax·scale in one vectorised pass, then
  // the target entry rewritten as (p - 1)·scale (the value of the generic
  // kernel, from the same p).
  Kokkos::parallel_for(
      "wlb::model::ce_bwd", Kokkos::RangePolicy<ExecSpace>(0, T), KOKKOS_LAMBDA(const std::int64_t t) {
        const std::int64_t lab = labels(t);
        Scalar* d = &dlogits(t, 0);  // may alias logits (in place)
        if (lab < 0) {
          for (std::int64_t v = 0; v < vl; ++v) d[v] = Scalar(0);
          return;
        }
        const Scalar lt = lse(t);
        const std::int64_t r = lab - v0;
        const Scalar lr = (r >= 0 && r < vr) ? logits(t, r) : Scalar(0);
        if (vr > 0) vexp::exp_shift(&logits(t, 0), d, int(vr), lt, gs);
        for (std::int64_t v = vr; v < vl; ++v) d[v] = Scalar(0);
        if (r >= 0 && r < vr) d[r] = (vexp::exp_one(lr - lt) - Scalar(1)) * gs;
      });
  return;
#endif
  Kokkos::parallel_for(
      "wlb::model::ce_bwd", MD2({0, 0}, {T, vl}), KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t v) {
        const std::int64_t lab = labels(t);
        if (lab < 0 || v >= vr) {
          dlogits(t, v) = Scalar(0);
        } else {
          const Scalar p = kmath::exp(logits(t, v) - lse(t));
          dlogits(t, v) = (p - (v0 + v == lab ? Scalar(1) : Scalar(0))) * gs;
        }
      });
}

template <class Scalar>
void add_inplace(const View2<Scalar>& y, const View2<Scalar>& x, std::int64_t T) {
  const std::int64_t d = std::int64_t(y.extent(1));
  require(x.extent(1) == y.extent(1), "add_inplace", "widths differ");
  if (T == 0 || d == 0) return;
  Kokkos::parallel_for(
      "wlb::model::add", MD2({0, 0}, {T, d}),
      KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t j) { y(t, j) += x(t, j); });
}

// ---- explicit instantiations --------------------------------------------------------------------

#define WLB_MODEL_LAYERS_INST(S)                                                                          \
  template void linear_forward<S>(const View2<S>&, const View2<S>&, const View2<S>&, S);                 \
  template void linear_backward<S>(const View2<S>&, const View2<S>&, const View2<S>&, const View2<S>&,   \
                                   const View2<S>&, S);                                                  \
  template void linear_backward_input<S>(const View2<S>&, const View2<S>&, const View2<S>&, S);          \
  template void linear_backward_weight<S>(const View2<S>&, const View2<S>&, const View2<S>&);           \
  template void embedding_forward<S>(const IntVec&, std::int64_t, std::int64_t, const View2<S>&,         \
                                     const View2<S>&);                                                   \
  template void embedding_backward<S>(const IntVec&, std::int64_t, std::int64_t, const View2<S>&,        \
                                      const View2<S>&);                                                  \
  template void rmsnorm_forward<S>(const View2<S>&, std::int64_t, const View1<S>&, double,               \
                                   const View2<S>&, const View1<S>&);                                    \
  template void rmsnorm_backward<S>(const View2<S>&, std::int64_t, const View1<S>&, const View1<S>&,     \
                                    const View2<S>&, const View2<S>&, const View1<S>&, bool);            \
  template void rope_apply<S>(const View3<S>&, std::int64_t, const IntVec&, const View1<double>&, bool); \
  template void swiglu_forward<S>(const View2<S>&, const View2<S>&, std::int64_t, const View2<S>&);      \
  template void swiglu_backward<S>(const View2<S>&, const View2<S>&, const View2<S>&, std::int64_t,      \
                                   const View2<S>&, const View2<S>&);                                    \
  template double cross_entropy_forward<S>(const View2<S>&, const IntVec&, std::int64_t, std::int64_t,   \
                                           const comm::Communicator&, const View1<S>&, const View1<S>&,  \
                                           std::int64_t);                                                \
  template void cross_entropy_backward<S>(const View2<S>&, const IntVec&, std::int64_t, std::int64_t,    \
                                          const View1<S>&, double, const View2<S>&, std::int64_t);       \
  template void add_inplace<S>(const View2<S>&, const View2<S>&, std::int64_t);

WLB_MODEL_LAYERS_INST(float)
WLB_MODEL_LAYERS_INST(double)
#undef WLB_MODEL_LAYERS_INST

}  // namespace wlb::model

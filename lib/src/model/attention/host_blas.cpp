// Host attention backend (`host_blas` of attention/backend.hpp): the
// FA-2 algorithm with each tile product handed to the BLAS. Compiled only
// when WLB4D_ATTN_HOST_BLAS (a host execution space with KokkosKernels' BLAS
// TPL, see backend.hpp); attention.cpp decides per process whether to use it
// (host_blas_tiles()).
#include "backend.hpp"

#ifdef WLB4D_ATTN_HOST_BLAS

#include "wlb4d/core/kokkos_compat.hpp"

#include "../vexp.hpp"

#include <KokkosBlas_Host_tpl.hpp>

#include <limits>

namespace wlb::model::attn_impl::host_blas {

// On a host execution space every tile product of the portable kernel
// (kokkos_tiled.cpp) is a small dense GEMM
// that the BLAS does at its SGEMM rate; the portable register-blocked kernel
// reached 40% of it. So on the host the same FA-2 algorithm runs with
// one team (of one thread) per work item and each tile product handed to the
// BLAS through KokkosKernels' host wrapper (column-major; a row-major
// C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ). The BLAS reads the
// tiles of q, k, v, dout, out, dq in place (row stride H·D of the
// [T][H][D] LayoutRight Views), so only S, P/dP and the dK/dV accumulators live
// in scratch. Per (query block, key block) the products cover the rows that see
// a key of the block and the hull of their keys, so the cost still follows
// Σ d² (a diagonal block computes its masked half too, as the portable kernel's
// column blocks did).
//
// Backward: FA-2 Algorithm 2 exactly (5 tile GEMMs, no recomputation), one
// team per kv head: it loops over key blocks (outer; dK, dV of the block
// accumulated in scratch) and, inside, over the group's query heads and the
// query blocks (dQ accumulated in place in dq, in increasing key-block order).
// Every element of dq, dk, dv is written by one team in a fixed order: no
// atomics, deterministic, for any thread count. The price is parallelism
// Hkv instead of Hkv·S/BK; on the 1-2 threads of a host rank that is enough.

/// Row-major C (m × n, ldc) = alpha·op(A)·op(B) + beta·C; op(A) is m × k
/// (ta: A stored k × m), op(B) is k × n (tb: B stored n × k).
template <class Scalar>
void rm_gemm(bool ta, bool tb, int m, int n, int k, Scalar alpha, const Scalar* A, int lda,
             const Scalar* B, int ldb, Scalar beta, Scalar* C, int ldc) {
  KokkosBlas::Impl::HostBlas<Scalar>::gemm(tb ? 'T' : 'N', ta ? 'T' : 'N', n, m, k, alpha, B, ldb, A,
                                           lda, beta, C, ldc);
}

/// Host block shape: queries × keys per tile product. Measured (bench/
/// attention_bench, fp32, 1 × 1024 tokens, both OpenBLAS kernels): see
/// host_block_keys.
inline int host_block_queries(int /*D*/) { return 64; }
inline int host_block_keys(int /*D*/) { return 64; }

/// Reductions over a contiguous row in kLanes independent partial results,
/// combined in a fixed order: the compiler vectorises them without -ffast-math
/// (a single running sum is a serial chain of dependent adds, which cost as
/// much as the tile GEMMs), and the result is the same on every run.
constexpr int kLanes = 16;
template <class Scalar>
Scalar lane_max(const Scalar* KOKKOS_RESTRICT x, int n, Scalar init) {
  Scalar acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = init;
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = acc[l] > x[j + l] ? acc[l] : x[j + l];
  for (; j < n; ++j) acc[0] = acc[0] > x[j] ? acc[0] : x[j];
  Scalar m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = m > acc[l] ? m : acc[l];
  return m;
}
template <class Scalar>
Scalar lane_sum(const Scalar* KOKKOS_RESTRICT x, int n) {
  Scalar acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[j + l];
  for (; j < n; ++j) acc[0] += x[j];
  Scalar s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}
template <class Scalar>
Scalar lane_dot(const Scalar* KOKKOS_RESTRICT x, const Scalar* KOKKOS_RESTRICT y, int n) {
  Scalar acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[j + l] * y[j + l];
  for (; j < n; ++j) acc[0] += x[j] * y[j];
  Scalar s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

/// Per-team scratch of the host kernels for head dim D.
template <class Scalar>
std::size_t forward_host_bytes(int D) {
  const int BQ = host_block_queries(D), BK = host_block_keys(D);
  return Scratch<Scalar>::shmem_size(BQ * BK)     // S / P
         + Scratch<Scalar>::shmem_size(D * BQ)    // Qᵀ
         + 2 * Scratch<Scalar>::shmem_size(BQ)    // m, l
         + 2 * Scratch<int>::shmem_size(BQ);      // lo, hi
}
template <class Scalar>
std::size_t backward_host_bytes(int D) {
  const int BQ = host_block_queries(D), BK = host_block_keys(D);
  return 2 * Scratch<Scalar>::shmem_size(BK * BQ)  // Sᵀ/Pᵀ, dPᵀ/dSᵀ
         + 2 * Scratch<Scalar>::shmem_size(D * BK)  // Kᵀ, Vᵀ of the key block
         + 2 * Scratch<Scalar>::shmem_size(BK * D)  // dK, dV of the key block
         + 2 * Scratch<Scalar>::shmem_size(BQ)      // row of Sᵀ - lse, D_i
         + 2 * Scratch<int>::shmem_size(BQ);        // lo, hi
}

/// The rows of a query block that see a key of [j0, j0+nk) and the hull of
/// those keys (relative to j0): rb..re, cb..ce; re < 0 if none. pairs: the
/// allowed (row, key) pairs inside.
struct BlockHull {
  int rb, re, cb, ce;
  long pairs;
};
inline BlockHull block_hull(const int* lo, const int* hi, int nq, int j0, int nk) {
  BlockHull b{nq, -1, nk, -1, 0};
  for (int r = 0; r < nq; ++r) {
    const int jb = lo[r] - j0 > 0 ? lo[r] - j0 : 0;
    const int je = hi[r] - j0 < nk - 1 ? hi[r] - j0 : nk - 1;
    if (jb > je) continue;
    if (b.re < 0) b.rb = r;
    b.re = r;
    b.cb = jb < b.cb ? jb : b.cb;
    b.ce = je > b.ce ? je : b.ce;
    b.pairs += je - jb + 1;
  }
  return b;
}

/// Row bands of a (query block, key block) pair. A pair whose hull is mostly
/// masked (a diagonal block of a causal document is half masked, a block of
/// short documents is block-diagonal) is computed in bands of kBandRows rows,
/// each over its own key hull, so the cost stays near the allowed pairs (Σ d²);
/// a dense pair is one product (larger GEMMs run faster). Measured on 16 × 64
/// tokens (D = 64, SkylakeX): see the commit that added it.
constexpr int kBandRows = 16;
inline int band_rows(const BlockHull& b) {
  const long area = long(b.re - b.rb + 1) * (b.ce - b.cb + 1);
  return 4 * b.pairs < 3 * area ? kBandRows : b.re - b.rb + 1;
}
/// The hull of rows [r0, r0+n) ∩ [blk.rb, blk.re] (row indices of the block).
inline BlockHull band_hull(const BlockHull& blk, const int* lo, const int* hi, int r0, int n,
                           int j0, int nk) {
  if (r0 == blk.rb && n >= blk.re - blk.rb + 1) return blk;
  const int m = r0 + n - 1 < blk.re ? n : blk.re - r0 + 1;
  BlockHull b = block_hull(lo + r0, hi + r0, m, j0, nk);
  b.rb += r0;
  b.re += r0;
  return b;
}
/// Calls body(b, nr, nc) for each band of blk that some row sees (forward and
/// backward walk a block pair the same way): b its hull, nr × nc its extent.
template <class Body>
inline void for_each_band(const BlockHull& blk, const int* lo, const int* hi, int j0, int nk, Body&& body) {
  const int band = band_rows(blk);
  for (int r0 = blk.rb; r0 <= blk.re; r0 += band) {
    const BlockHull b = band_hull(blk, lo, hi, r0, band, j0, nk);
    if (b.re < 0) continue;
    body(b, b.re - b.rb + 1, b.ce - b.cb + 1);
  }
}

/// dst[d * ld + r] = x(r0 + r, h, d) for r < n: a block of x transposed.
/// Eight rows at a time, so that the stores down a column of dst become
/// one contiguous 8-wide store per d (a scalar scatter down the columns was a
/// quarter of the backward on 64-token documents).
template <class Scalar>
void transpose_rows(const View3<const Scalar>& x, int r0, int n, int h, int D, Scalar* dst, int ld) {
  constexpr int W = 8;
  int r = 0;
  for (; r + W <= n; r += W) {
    const Scalar* src[W];
    for (int i = 0; i < W; ++i) src[i] = &x(r0 + r + i, h, 0);
    for (int d = 0; d < D; ++d) {
      Scalar* KOKKOS_RESTRICT o = dst + d * ld + r;
      for (int i = 0; i < W; ++i) o[i] = src[i][d];
    }
  }
  for (; r < n; ++r) {
    const Scalar* KOKKOS_RESTRICT src = &x(r0 + r, h, 0);
    for (int d = 0; d < D; ++d) dst[d * ld + r] = src[d];
  }
}

// Operand forms. This OpenBLAS (0.3.21, SkylakeX kernel) measured at 64³,
// row-major C = op(A)·op(B): A·Bᵀ 76 GFLOP/s, A·B 121, Aᵀ·B 159, Aᵀ·Bᵀ 145
// (its packing path against its small-matrix kernels); the Prescott kernel
// runs all four at 29-30. So no product below is of the A·Bᵀ form: the forward
// keeps Qᵀ of its query block, the backward Kᵀ and Vᵀ of its key block, and
// the backward works on the transposed score tile Sᵀ (keys × queries).
template <class Scalar>
void forward(View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,
             View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,
             View3<Scalar> out, View2<Scalar> lse, const Dims& dm) {
  const int T = dm.T, S = dm.S, D = dm.D, Hq = dm.Hq, group = dm.Hq / dm.Hkv;
  const int BQ = host_block_queries(D), BK = host_block_keys(D);
  const int ldq = Hq * D, ldk = dm.Hkv * D;
  const int nqt = (T + BQ - 1) / BQ;
  const Scalar neg_inf = -std::numeric_limits<Scalar>::infinity();
  const std::size_t bytes = forward_host_bytes<Scalar>(D);
  Kokkos::parallel_for(
      "wlb::model::attention_forward_host",
      Policy(Hq * nqt, 1).set_scratch_size(scratch_level(bytes), Kokkos::PerTeam(bytes)),
      [=](const Member& t) {
        const int lvl = scratch_level(bytes);
        const int h = t.league_rank() / nqt;
        const int i0 = (t.league_rank() % nqt) * BQ;
        const int nq = T - i0 < BQ ? T - i0 : BQ;
        const int hk = h / group;
        Scratch<Scalar> Sb(t.team_scratch(lvl), BQ * BK), Qt(t.team_scratch(lvl), D * BQ),
            mb(t.team_scratch(lvl), BQ), lb(t.team_scratch(lvl), BQ);
        Scratch<int> lo(t.team_scratch(lvl), BQ), hi(t.team_scratch(lvl), BQ);
        for (int r = 0; r < nq; ++r) {
          lo(r) = wlb::kmath::max<int>(kv_lo(i0 + r), 0);
          hi(r) = wlb::kmath::min<int>(kv_hi(i0 + r), S - 1);
          mb(r) = neg_inf;
          lb(r) = Scalar(0);
          Scalar* o = &out(i0 + r, h, 0);
          for (int d = 0; d < D; ++d) o[d] = Scalar(0);
        }
        transpose_rows(q, i0, nq, h, D, Qt.data(), BQ);
        int jmin, jmax;
        key_span(lo.data(), hi.data(), nq, jmin, jmax);
        for (int j0 = (jmin > jmax ? S : jmin / BK * BK); j0 <= jmax; j0 += BK) {
          const int nk = S - j0 < BK ? S - j0 : BK;
          const BlockHull blk = block_hull(lo.data(), hi.data(), nq, j0, nk);
          if (blk.re < 0) continue;  // no row sees this key block (document boundary)
          for_each_band(blk, lo.data(), hi.data(), j0, nk, [&](const BlockHull& b, const int nr, const int nc) {
            Scalar* s0 = Sb.data() + b.rb * BK + b.cb;
            // S = scale·Q·Kᵀ (FA-2 Alg. 1 line 8) as (Qᵀ)ᵀ·Kᵀ.
            rm_gemm<Scalar>(true, true, nr, nc, D, scale, Qt.data() + b.rb, BQ, &k(j0 + b.cb, hk, 0),
                            ldk, Scalar(0), s0, BK);
            // Online softmax (lines 9-10) on each row's allowed keys; the rest
            // of the hull is zeroed so that P·V adds nothing for them.
            for (int r = b.rb; r <= b.re; ++r) {
              Scalar* s = Sb.data() + r * BK;
              const int jb = wlb::kmath::max(lo(r) - j0, 0);
              const int je = wlb::kmath::min(hi(r) - j0, nk - 1);
              if (jb > je) {
                for (int j = b.cb; j <= b.ce; ++j) s[j] = Scalar(0);
                continue;
              }
              const Scalar m_old = mb(r);
              const Scalar m_new = lane_max(s + jb, je - jb + 1, m_old);
              const Scalar alpha = wlb::kmath::exp(m_old - m_new);  // 0 on the first block
              for (int j = b.cb; j < jb; ++j) s[j] = Scalar(0);
#ifdef WLB4D_VEXP
              vexp::exp_shift(s + jb, s + jb, je - jb + 1, m_new);
#else
              for (int j = jb; j <= je; ++j) s[j] = wlb::kmath::exp(s[j] - m_new);
#endif
              const Scalar sum = lane_sum(s + jb, je - jb + 1);
              for (int j = je + 1; j <= b.ce; ++j) s[j] = Scalar(0);
              mb(r) = m_new;
              lb(r) = alpha * lb(r) + sum;
              if (alpha != Scalar(1)) {
                Scalar* o = &out(i0 + r, h, 0);
                for (int d = 0; d < D; ++d) o[d] *= alpha;
              }
            }
            // O += P·V (line 10), in place in out.
            rm_gemm<Scalar>(false, false, nr, D, nc, Scalar(1), s0, BK, &v(j0 + b.cb, hk, 0), ldk,
                            Scalar(1), &out(i0 + b.rb, h, 0), ldq);
          });
        }
        // Normalise (line 12) and store lse (line 13).
        for (int r = 0; r < nq; ++r) {
          const Scalar l = lb(r);
          const Scalar inv = l > Scalar(0) ? Scalar(1) / l : Scalar(0);
          Scalar* o = &out(i0 + r, h, 0);
          for (int d = 0; d < D; ++d) o[d] *= inv;
          lse(h, i0 + r) = l > Scalar(0) ? mb(r) + wlb::kmath::log(l) : neg_inf;
        }
      });
}

template <class Scalar>
void backward(View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,
              View3<const Scalar> out, View3<const Scalar> dout, View2<const Scalar> lse,
              View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,
              View3<Scalar> dq, View3<Scalar> dk, View3<Scalar> dv, const Dims& dm) {
  const int T = dm.T, S = dm.S, D = dm.D, Hq = dm.Hq, Hkv = dm.Hkv, group = Hq / Hkv;
  const int BQ = host_block_queries(D), BK = host_block_keys(D);
  const int ldq = Hq * D, ldk = Hkv * D;
  const std::size_t bytes = backward_host_bytes<Scalar>(D);
  Kokkos::parallel_for(
      "wlb::model::attention_backward_host",
      Policy(Hkv, 1).set_scratch_size(scratch_level(bytes), Kokkos::PerTeam(bytes)),
      [=](const Member& t) {
        const int lvl = scratch_level(bytes);
        const int hk = t.league_rank();
        Scratch<Scalar> St(t.team_scratch(lvl), BK * BQ), dPt(t.team_scratch(lvl), BK * BQ),
            Kt(t.team_scratch(lvl), D * BK), Vt(t.team_scratch(lvl), D * BK),
            dKa(t.team_scratch(lvl), BK * D), dVa(t.team_scratch(lvl), BK * D),
            xs(t.team_scratch(lvl), BQ), Ds(t.team_scratch(lvl), BQ);
        Scratch<int> lo(t.team_scratch(lvl), BQ), hi(t.team_scratch(lvl), BQ);
        for (int i = 0; i < T; ++i) {  // this team owns dq(:, group of hk, :)
          Scalar* g = &dq(i, hk * group, 0);
          for (int n = 0; n < group * D; ++n) g[n] = Scalar(0);
        }
        for (int j0 = 0; j0 < S; j0 += BK) {
          const int nk = S - j0 < BK ? S - j0 : BK;
          for (int n = 0; n < nk * D; ++n) dKa(n) = dVa(n) = Scalar(0);
          transpose_rows(k, j0, nk, hk, D, Kt.data(), BK);
          transpose_rows(v, j0, nk, hk, D, Vt.data(), BK);
          for (int h = hk * group; h < (hk + 1) * group; ++h) {
            for (int i0 = 0; i0 < T; i0 += BQ) {
              const int nq = T - i0 < BQ ? T - i0 : BQ;
              for (int r = 0; r < nq; ++r) {
                lo(r) = wlb::kmath::max<int>(kv_lo(i0 + r), 0);
                hi(r) = wlb::kmath::min<int>(kv_hi(i0 + r), S - 1);
              }
              const BlockHull blk = block_hull(lo.data(), hi.data(), nq, j0, nk);
              if (blk.re < 0) continue;  // no row sees this key block (document boundary)
              // D_i = rowsum(dO ∘ O) (Alg. 2 line 4) of the rows that see the
              // block: nq·D per block pair against ~10·nq·BK·D in its GEMMs,
              // so recomputing it keeps the scratch independent of T.
              for (int r = blk.rb; r <= blk.re; ++r)
                Ds(r) = lane_dot(&dout(i0 + r, h, 0), &out(i0 + r, h, 0), D);
              for_each_band(blk, lo.data(), hi.data(), j0, nk, [&](const BlockHull& b, const int nr, const int nc) {
                Scalar* st0 = St.data() + b.cb * BQ + b.rb;
                Scalar* dpt0 = dPt.data() + b.cb * BQ + b.rb;
                const Scalar* qi = &q(i0 + b.rb, h, 0);
                const Scalar* doi = &dout(i0 + b.rb, h, 0);
                // Sᵀ = scale·K·Qᵀ, dPᵀ = V·dOᵀ (Alg. 2 lines 8, 11), as (Kᵀ)ᵀ·Qᵀ.
                rm_gemm<Scalar>(true, true, nc, nr, D, scale, Kt.data() + b.cb, BK, qi, ldq, Scalar(0),
                                st0, BQ);
                rm_gemm<Scalar>(true, true, nc, nr, D, Scalar(1), Vt.data() + b.cb, BK, doi, ldq,
                                Scalar(0), dpt0, BQ);
                // Pᵀ = exp(Sᵀ - lse), dSᵀ = Pᵀ ∘ (dPᵀ - D) (lines 9, 12); entries
                // off the mask are selected to exactly 0 (exp of them may be inf).
                const Scalar* lse_i = &lse(h, i0 + b.rb);
                const Scalar* D_i = Ds.data() + b.rb;
                const int* lo_i = lo.data() + b.rb;
                const int* hi_i = hi.data() + b.rb;
                for (int c = 0; c < nc; ++c) {
                  Scalar* KOKKOS_RESTRICT s = st0 + c * BQ;
                  Scalar* KOKKOS_RESTRICT dp = dpt0 + c * BQ;
                  Scalar* KOKKOS_RESTRICT x = xs.data();
                  const int j = j0 + b.cb + c;
                  for (int r = 0; r < nr; ++r) x[r] = s[r] - lse_i[r];
#ifdef WLB4D_VEXP
                  vexp::exp_shift(x, x, nr, Scalar(0));
#else
                  for (int r = 0; r < nr; ++r) x[r] = wlb::kmath::exp(x[r]);
#endif
                  for (int r = 0; r < nr; ++r) {
                    const bool on = lo_i[r] <= j && j <= hi_i[r];
                    const Scalar p = on ? x[r] : Scalar(0);
                    s[r] = p;
                    dp[r] = on ? p * (dp[r] - D_i[r]) : Scalar(0);
                  }
                }
                // dV += Pᵀ·dO, dK += scale·dSᵀ·Q, dQ += scale·dS·K (lines 12, 15, 14).
                rm_gemm<Scalar>(false, false, nc, D, nr, Scalar(1), st0, BQ, doi, ldq, Scalar(1),
                                dVa.data() + b.cb * D, D);
                rm_gemm<Scalar>(false, false, nc, D, nr, scale, dpt0, BQ, qi, ldq, Scalar(1),
                                dKa.data() + b.cb * D, D);
                rm_gemm<Scalar>(true, false, nr, D, nc, scale, dpt0, BQ, &k(j0 + b.cb, hk, 0), ldk,
                                Scalar(1), &dq(i0 + b.rb, h, 0), ldq);
              });
            }
          }
          for (int r = 0; r < nk; ++r) {
            Scalar* gk = &dk(j0 + r, hk, 0);
            Scalar* gv = &dv(j0 + r, hk, 0);
            for (int d = 0; d < D; ++d) gk[d] = dKa(r * D + d);
            for (int d = 0; d < D; ++d) gv[d] = dVa(r * D + d);
          }
        }
      });
}

template <class Scalar>
AttentionTiles tiles(int head_dim) {
  // One backward kernel (dK/dV and dQ together), reported as both.
  AttentionTiles r;
  r.queries = host_block_queries(head_dim);
  r.keys = host_block_keys(head_dim);
  r.forward_bytes = forward_host_bytes<Scalar>(head_dim);
  r.dkdv_bytes = r.dq_bytes = backward_host_bytes<Scalar>(head_dim);
  r.level0_max_bytes = static_cast<std::size_t>(Policy::scratch_size_max(0));
  return r;
}

WLB4D_INSTANTIATE_ATTENTION_BACKEND(float)
WLB4D_INSTANTIATE_ATTENTION_BACKEND(double)

}  // namespace wlb::model::attn_impl::host_blas

#endif  // WLB4D_ATTN_HOST_BLAS

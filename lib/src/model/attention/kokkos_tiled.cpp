// Portable Kokkos team kernels of document-masked FlashAttention-2 (the
// `tiled` backend of attention/backend.hpp; the one CUDA runs).
//
// Structure shared by the three team kernels (forward, dK/dV, dQ):
//  * Tiles live in team scratch as dense, zero-padded row-major arrays; the
//    head dim is padded to Dp (a multiple of the micro-kernel width CB) so the
//    innermost loops are fixed-width, contiguous and vectorise on the host
//    without -ffast-math (no floating-point reassociation needed).
//  * Every tile product is a small GEMM (team_gemm_banded / _krange): the
//    output is cut into RB × CB register blocks, one per team thread, each
//    computed as a sum of rank-1 updates (broadcast A, contiguous B row);
//    blocks and reduction ranges that the document mask zeroes are skipped,
//    so short documents cost in proportion to their pairs. K is stored
//    transposed in scratch (Kt[d][j]) so S = Q·Kᵀ is such a product too.
//  * Phases inside a team are separated by team_barrier(); each phase writes
//    disjoint data (rows or blocks), so there are no races on any backend.
//  * The mask is per row an interval [kv_lo, kv_hi]; inside a key tile the
//    allowed keys of a row are one contiguous run, so masking is two loop
//    bounds, not a per-element test.
#include "tiled.hpp"

#include "wlb4d/core/kokkos_compat.hpp"

#include "../vexp.hpp"

#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace wlb::model::attn_impl::tiled {

// Tile sizes. Measured on the host (Serial, fp32, D=64, default flags), before
// the masked-block skipping below: 32/64/128-square tiles gave 9.3/9.7/9.5
// GFLOP/s fwd+bwd on one 1024-token document and 5.4/4.6/2.8 on 16 × 64-token
// documents (smaller tiles wasted less on the masked half of diagonal tiles).
// With the skipping, the instruction counts (callgrind, 16 × 64 tokens, 4 heads)
// are 52.8/47.2/47.8 M for 32/64/128: 64 stays. RB × CB is the register
// block of the tile GEMM: 4 rows × two SIMD vectors (8 accumulators, which
// leaves registers for the B row and the broadcast with SSE2's 16 xmm; 16
// accumulators spilled to the stack), narrowed to the key tile if that is
// narrower (block_cols).
//
// Per execution space (tiled.hpp): the host keeps 64 × 64 for every head dim
// (its "team scratch" is ordinary memory, the tiles live in L1/L2). A CUDA
// team's scratch must fit the 48 KiB per block that every GPU gives without
// an opt-in (Hopper allows up to 227 KiB only with cudaFuncSetAttribute,
// which Kokkos does not do for level 0), and the scratch grows with the head
// dim, so the shape is chosen per call from D and the scalar type
// (cuda_tiles: the first of 32 × 16, 32 × 8, 16 × 8 whose three kernels fit).
// scratch_bytes() gives per team (KiB; head dim padded to CB = 8 floats on
// the device; test_model_attention prints this table):
//                 32 × 16 tiles            16 × 8 tiles
//                 forward  dK/dV  dQ       forward  dK/dV  dQ
//   fp32, D = 64   26.6    36.7   40.6      12.8    17.4   19.3
//   fp32, D = 128  50.6    68.7   76.6      24.8    33.4   37.3
//   fp64, D = 64   52.9    72.9   80.9      25.5    34.5   38.5
// (32 × 8, fp32, D = 64: 21.6 / 26.6 / 32.6 KiB; D = 128: 41.6 / 50.6 / 62.6)
// so fp32 takes 32 × 16 up to D = 64 and 16 × 8 at D = 128 (every Llama from
// 1B up), fp64 at D = 64 takes 16 × 8. What fits no shape (fp64 at D = 128:
// 49.5 / 66.5 / 74.5 KiB at 16 × 8) runs in level-1 scratch (global memory,
// correct but slower); see scratch_level(). Kokkos >= 4.6 reports a level-0
// maximum of 48 KiB minus a team-reduction reserve (40936 bytes), which the
// 32 × 16 dQ kernel at D = 64 exceeds, so the budget is the smaller of the
// two (tiles_for) and fp32 at D = 64 then takes 32 × 8 (its dQ about 32 KiB).
constexpr int kRB = 4;   // register-block rows
#if defined(__AVX__) && !defined(__CUDA_ARCH__)
constexpr int kSimdFloats = 8;
#else
constexpr int kSimdFloats = 4;
#endif
template <class Scalar> struct BlockCols;
template <> struct BlockCols<float> { static constexpr int value = 2 * kSimdFloats; };
template <> struct BlockCols<double> { static constexpr int value = kSimdFloats; };

/// Register-block width CB of Scalar tile products under key tiles of bk
/// columns: BlockCols, or bk if the key tile is narrower (the CUDA shapes'
/// bk = 8 on a host with AVX, whose fp32 BlockCols is 16). The head dim is
/// padded to a multiple of it.
KOKKOS_INLINE_FUNCTION constexpr int block_cols(int block_cols_simd, int bk) {
  return bk < block_cols_simd ? bk : block_cols_simd;
}

/// A tile shape as template arguments (the kernels' loops and scratch
/// extents are compile-time); Shape is its run-time value.
template <int BQ, int BK>
struct Tiles {
  static constexpr int bq = BQ, bk = BK;
  static_assert(BQ % kRB == 0 && BK % kRB == 0, "tiles must hold whole register blocks");
  static_assert(BK % block_cols(BlockCols<float>::value, BK) == 0 &&
                    BK % block_cols(BlockCols<double>::value, BK) == 0,
                "key tile must hold whole register blocks");
};
using HostTiles = Tiles<kHostTiles.bq, kHostTiles.bk>;
using CudaTiles0 = Tiles<kCudaTiles[0].bq, kCudaTiles[0].bk>;
using CudaTiles1 = Tiles<kCudaTiles[1].bq, kCudaTiles[1].bk>;
using CudaTiles2 = Tiles<kCudaTiles[2].bq, kCudaTiles[2].bk>;
static_assert(kNumCudaTiles == 3, "with_tiles() dispatches to each of kCudaTiles");

KOKKOS_INLINE_FUNCTION int round_up(int n, int m) { return (n + m - 1) / m * m; }

// Host SIMD path of the micro-kernel. GCC's auto-vectoriser turns the plain
// loop below into shuffle-heavy code for some block widths (measured 2-15
// GFLOP/s fp32 on this CPU, against 20 (SSE2) / 35 (AVX2) GFLOP/s for the
// same loop written with GCC vector extensions), so the host uses explicit
// vectors; device compilers (CUDA/HIP/SYCL device passes) take the plain loop.
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && \
    !defined(__SYCL_DEVICE_ONLY__)
#define WLB4D_ATTN_HOST_SIMD 1
constexpr int kSimdBytes = 4 * kSimdFloats;
#endif

/// C[r][c] (+)= Σ_k A(r, k) · B[k][c] for one RB × CB block, a sum of rank-1
/// updates (broadcast an A element, multiply a contiguous B row). A(r, k) is
/// A[r*lda + k] (row-major A) or, if ATrans, A[k*lda + r] (A given
/// transposed, for dV = Pᵀ·dO and dK = dSᵀ·Q). B and C are row-major with
/// leading dimensions ldb, ldc. The accumulators are a fixed-size local
/// array, kept in registers.
template <class Scalar, int CB, bool ATrans>
KOKKOS_INLINE_FUNCTION void gemm_block(int K, const Scalar* KOKKOS_RESTRICT A, int lda,
                                       const Scalar* KOKKOS_RESTRICT B, int ldb,
                                       Scalar* KOKKOS_RESTRICT C, int ldc, bool accumulate) {
#ifdef WLB4D_ATTN_HOST_SIMD
  typedef Scalar vec __attribute__((vector_size(kSimdBytes)));
  constexpr int W = kSimdBytes / static_cast<int>(sizeof(Scalar));
  constexpr int NV = CB / W;
  static_assert(CB % W == 0, "block width must be whole vectors");
  vec acc[kRB][NV];
  for (int r = 0; r < kRB; ++r)
    for (int c = 0; c < NV; ++c) {
      if (accumulate)
        __builtin_memcpy(&acc[r][c], C + r * ldc + c * W, sizeof(vec));
      else
        acc[r][c] = vec{};
    }
  for (int k = 0; k < K; ++k) {
    vec b[NV];
    for (int c = 0; c < NV; ++c) __builtin_memcpy(&b[c], B + k * ldb + c * W, sizeof(vec));
    for (int r = 0; r < kRB; ++r) {
      const Scalar a = ATrans ? A[k * lda + r] : A[r * lda + k];
      for (int c = 0; c < NV; ++c) acc[r][c] += a * b[c];
    }
  }
  for (int r = 0; r < kRB; ++r)
    for (int c = 0; c < NV; ++c) __builtin_memcpy(C + r * ldc + c * W, &acc[r][c], sizeof(vec));
#else
  Scalar acc[kRB][CB];
  for (int r = 0; r < kRB; ++r)
    for (int c = 0; c < CB; ++c) acc[r][c] = accumulate ? C[r * ldc + c] : Scalar(0);
  for (int k = 0; k < K; ++k) {
    const Scalar* b = B + k * ldb;
    for (int r = 0; r < kRB; ++r) {
      const Scalar a = ATrans ? A[k * lda + r] : A[r * lda + k];
      for (int c = 0; c < CB; ++c) acc[r][c] += a * b[c];
    }
  }
  for (int r = 0; r < kRB; ++r)
    for (int c = 0; c < CB; ++c) C[r * ldc + c] = acc[r][c];
#endif
}

/// Masked tile products. A tile pair of a document-causal mask is mostly
/// empty near document boundaries (diagonal tiles are half masked, and a tile
/// holding several short documents is block-diagonal), so the products skip
/// what the mask zeroes, per register-block row band (RB rows):
///  * band_ranges: for each band of query rows, the hull [blo, bhi] of the
///    allowed keys of its rows, relative to the key tile (empty: blo > bhi);
///  * team_gemm_banded: S = A·B only for the CB-wide column blocks that meet
///    the band's hull (the others are left unwritten and never read: the
///    softmax rows read [jb, je] only and zero the rest of the row);
///  * team_gemm_krange: C += A·B with the reduction of band b restricted to
///    [klo[b], khi[b]]. The terms left out are products with exact zeros
///    (masked P / dS entries), so the sums are unchanged.
/// The hulls are per band, the same for all threads after a team_barrier.
KOKKOS_INLINE_FUNCTION void band_ranges(const Member& t, const int* lo, const int* hi, int nq, int M,
                                        int j0, int nk, int* blo, int* bhi) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, M / kRB), [&](const int b) {
    int a = kNoKey, z = -1;
    const int r1 = wlb::kmath::min(b * kRB + kRB, nq);
    for (int r = b * kRB; r < r1; ++r) {
      const int jb = wlb::kmath::max(lo[r] - j0, 0);
      const int je = wlb::kmath::min(hi[r] - j0, nk - 1);
      if (jb > je) continue;
      a = wlb::kmath::min(a, jb);
      z = wlb::kmath::max(z, je);
    }
    blo[b] = a;
    bhi[b] = z;
  });
}

/// For each band of kRB keys of the tile (Mk keys), the hull of the query
/// rows (< nq) that may see one of them: the reduction range of dV += Pᵀ·dO
/// and dK += dSᵀ·Q.
KOKKOS_INLINE_FUNCTION void key_band_ranges(const Member& t, const int* lo, const int* hi, int nq,
                                            int Mk, int j0, int nk, int* klo, int* khi) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, Mk / kRB), [&](const int b) {
    const int c0 = j0 + b * kRB, c1 = wlb::kmath::min(c0 + kRB - 1, j0 + nk - 1);
    // lo/hi are already clamped to [0, S-1]: row r sees a key of the band
    // iff lo[r] <= c1 and hi[r] >= c0 (and its range is not empty). Scan from
    // both ends: an unmasked tile pair stops at once.
    auto sees = [&](int r) { return lo[r] <= hi[r] && lo[r] <= c1 && hi[r] >= c0; };
    int a = 0;
    while (a < nq && !sees(a)) ++a;
    int z = nq - 1;
    while (z > a && !sees(z)) --z;
    klo[b] = a < nq ? a : kNoKey;
    khi[b] = a < nq ? z : -1;
  });
}

/// C (M × N) = A (M × K) · B, only the column blocks meeting [blo[b], bhi[b]].
template <class Scalar, int CB>
KOKKOS_INLINE_FUNCTION void team_gemm_banded(const Member& t, int M, int N, int K, const Scalar* A,
                                             int lda, const Scalar* B, int ldb, Scalar* C, int ldc,
                                             const int* blo, const int* bhi) {
  const int nbn = N / CB;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, (M / kRB) * nbn), [&](const int b) {
    const int band = b / nbn;
    const int n0 = (b % nbn) * CB;
    if (blo[band] > n0 + CB - 1 || bhi[band] < n0) return;
    gemm_block<Scalar, CB, false>(K, A + band * kRB * lda, lda, B + n0, ldb,
                                  C + band * kRB * ldc + n0, ldc, false);
  });
}

/// C (M × N) += A · B with the reduction of row band b over [klo[b], khi[b]]
/// only (nothing if empty). ATrans: A is given transposed (K × M row-major).
template <class Scalar, int CB, bool ATrans = false>
KOKKOS_INLINE_FUNCTION void team_gemm_krange(const Member& t, int M, int N, const Scalar* A, int lda,
                                             const Scalar* B, int ldb, Scalar* C, int ldc,
                                             const int* klo, const int* khi) {
  const int nbn = N / CB;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, (M / kRB) * nbn), [&](const int b) {
    const int band = b / nbn;
    const int m0 = band * kRB, n0 = (b % nbn) * CB;
    const int k0 = klo[band], k1 = khi[band];
    if (k0 > k1) return;
    const Scalar* a = ATrans ? A + k0 * lda + m0 : A + m0 * lda + k0;
    gemm_block<Scalar, CB, ATrans>(k1 - k0 + 1, a, lda, B + k0 * ldb + n0, ldb, C + m0 * ldc + n0,
                                   ldc, true);
  });
}

/// Loads rows [r0, r0+n) of x(:, h, :) into tile[BQ or BK][Dp], times `mul`,
/// zero-filling padded rows and columns (the GEMMs read whole blocks).
template <class Scalar>
KOKKOS_INLINE_FUNCTION void load_rows(const Member& t, const View3<const Scalar>& x, int r0, int n,
                                      int h, int D, int Dp, int rows, Scalar mul, Scalar* tile) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows), [&](const int r) {
    Scalar* KOKKOS_RESTRICT dst = tile + r * Dp;
    if (r < n) {
      // LayoutRight: x(i, h, :) is contiguous; a restrict pointer lets the
      // host compiler vectorise the copy (through x(...) it stays scalar).
      const Scalar* KOKKOS_RESTRICT src = &x(r0 + r, h, 0);
      for (int d = 0; d < D; ++d) dst[d] = mul * src[d];
      for (int d = D; d < Dp; ++d) dst[d] = Scalar(0);
    } else {
      for (int d = 0; d < Dp; ++d) dst[d] = Scalar(0);
    }
  });
}

/// Column r of a transposed tile: row r0+r of x(:, h, :), zero-padded to Dp,
/// or zeros for r >= n (ld = BK).
template <class Scalar, int BK>
KOKKOS_INLINE_FUNCTION void load_col_t(const View3<const Scalar>& x, int r0, int r, int n, int h, int D, int Dp,
                                       Scalar* tile) {
  Scalar* dst = tile + r;
  if (r < n) {
    const Scalar* KOKKOS_RESTRICT src = &x(r0 + r, h, 0);
    for (int d = 0; d < D; ++d) dst[d * BK] = src[d];
    for (int d = D; d < Dp; ++d) dst[d * BK] = Scalar(0);
  } else {
    for (int d = 0; d < Dp; ++d) dst[d * BK] = Scalar(0);
  }
}

/// Loads rows [r0, r0+n) of x(:, h, :) transposed: tile[d][r] (ld = BK).
/// Parallel over rows: each reads its row of x contiguously (LayoutRight) and
/// scatters it down one column of the tile, which stays in L1 / scratch.
template <class Scalar, int BK>
KOKKOS_INLINE_FUNCTION void load_rows_t(const Member& t, const View3<const Scalar>& x, int r0,
                                        int n, int h, int D, int Dp, Scalar* tile) {
#ifdef WLB4D_ATTN_HOST_SIMD
  // Host: W rows at a time, one vector (W consecutive columns of the tile)
  // per d, stored contiguously: a scalar scatter down the columns costs ~5
  // instructions per element, this ~1.5.
  typedef Scalar vec __attribute__((vector_size(kSimdBytes)));
  constexpr int W = kSimdBytes / static_cast<int>(sizeof(Scalar));
  static_assert(BK % W == 0, "key tile must hold whole vectors");
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, BK / W), [&](const int b) {
    const int c0 = b * W;
    if (c0 + W <= n) {
      const Scalar* src[W];
      for (int i = 0; i < W; ++i) src[i] = &x(r0 + c0 + i, h, 0);
      for (int d = 0; d < D; ++d) {
        vec v;
        for (int i = 0; i < W; ++i) v[i] = src[i][d];
        __builtin_memcpy(tile + d * BK + c0, &v, sizeof(vec));
      }
      for (int d = D; d < Dp; ++d)
        for (int i = 0; i < W; ++i) tile[d * BK + c0 + i] = Scalar(0);
    } else {
      for (int r = c0; r < c0 + W; ++r) load_col_t<Scalar, BK>(x, r0, r, n, h, D, Dp, tile);
    }
  });
#else
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, BK),
                       [&](const int r) { load_col_t<Scalar, BK>(x, r0, r, n, h, D, Dp, tile); });
#endif
}

/// Loads the clamped key range of rows [i0, i0+n) into lo/hi (empty: lo > hi).
KOKKOS_INLINE_FUNCTION void load_ranges(const Member& t, const View1<const std::int32_t>& kv_lo,
                                        const View1<const std::int32_t>& kv_hi, int i0, int n,
                                        int S, int* lo, int* hi) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, n), [&](const int r) {
    lo[r] = wlb::kmath::max<int>(kv_lo(i0 + r), 0);
    hi[r] = wlb::kmath::min<int>(kv_hi(i0 + r), S - 1);
  });
}

/// True if any of the n rows may attend a key in [j0, j1]. Every thread of
/// the team computes the same answer, so it can guard barriers.
KOKKOS_INLINE_FUNCTION bool any_row_overlaps(const int* lo, const int* hi, int n, int j0, int j1) {
  for (int r = 0; r < n; ++r)
    if (lo[r] <= hi[r] && lo[r] <= j1 && hi[r] >= j0) return true;
  return false;
}

/// Backward row phase shared by both backward kernels: for row i of the tile,
/// turns S (scaled scores) into P = exp(S - lse_i) and dP into
/// dS = P ∘ (dP - D_i) on the allowed keys, zero elsewhere (so padded and
/// masked entries contribute nothing to dK, dV, dQ and never touch exp).
template <class Scalar>
KOKKOS_INLINE_FUNCTION void softmax_grad_row(Scalar* s, Scalar* dp, int lo, int hi, int j0,
                                             int nk, int ncols, Scalar lse_i, Scalar d_i) {
  const int jb = wlb::kmath::max(lo - j0, 0);
  const int je = wlb::kmath::min(hi - j0, nk - 1);  // jb > je: nothing allowed
#ifdef WLB4D_VEXP
  for (int j = 0; j < jb && j < ncols; ++j) s[j] = dp[j] = Scalar(0);
  if (jb <= je) {
    vexp::exp_shift(s + jb, s + jb, je - jb + 1, lse_i);
    for (int j = jb; j <= je; ++j) dp[j] = s[j] * (dp[j] - d_i);
  }
  for (int j = wlb::kmath::max(je + 1, jb); j < ncols; ++j) s[j] = dp[j] = Scalar(0);
#else
  for (int j = 0; j < ncols; ++j) {
    if (j >= jb && j <= je) {
      const Scalar p = wlb::kmath::exp(s[j] - lse_i);
      s[j] = p;
      dp[j] = p * (dp[j] - d_i);
    } else {
      s[j] = Scalar(0);
      dp[j] = Scalar(0);
    }
  }
#endif
}

/// D_i = Σ_d dO(i, h, d) · O(i, h, d) (FA-2 Alg. 2 line 4), summed in d order.
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar row_dot(const View3<const Scalar>& dout, const View3<const Scalar>& out,
                                      int i, int h, int D) {
  // Restrict pointers to the contiguous rows (LayoutRight): through the View
  // operator every term recomputes a 3-D offset.
  const Scalar* KOKKOS_RESTRICT a = &dout(i, h, 0);
  const Scalar* KOKKOS_RESTRICT b = &out(i, h, 0);
  Scalar acc = 0;
  for (int d = 0; d < D; ++d) acc += a[d] * b[d];
  return acc;
}

/// Scores of one (query tile, key tile) pair in the backward, shared by both
/// backward kernels (FA-2 Alg. 2 lines 8-11): S = (scale·Q)·Kᵀ and dP = dO·Vᵀ
/// on the blocks the mask leaves, then P and dS = P ∘ (dP - D) row by row
/// (padded rows zero). blo/bhi: band_ranges of the pair. Ends on a barrier.
template <class Scalar, int BK, int CB>
KOKKOS_INLINE_FUNCTION void backward_scores(const Member& t, int nq, int M, int N, int D, int Dp,
                                            int j0, int nk, const Scalar* Qs, const Scalar* dOs,
                                            const Scalar* Kt, const Scalar* Vt, const int* lo,
                                            const int* hi, const int* blo, const int* bhi,
                                            const Scalar* lse_s, const Scalar* D_s, Scalar* Sb,
                                            Scalar* dPb) {
  team_gemm_banded<Scalar, CB>(t, M, N, D, Qs, Dp, Kt, BK, Sb, BK, blo, bhi);
  team_gemm_banded<Scalar, CB>(t, M, N, D, dOs, Dp, Vt, BK, dPb, BK, blo, bhi);
  t.team_barrier();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, M), [&](const int r) {
    if (r < nq)
      softmax_grad_row(Sb + r * BK, dPb + r * BK, lo[r], hi[r], j0, nk, N, lse_s[r], D_s[r]);
    else  // padded rows must not add to dK/dV/dQ
      for (int j = 0; j < N; ++j) Sb[r * BK + j] = dPb[r * BK + j] = Scalar(0);
  });
  t.team_barrier();
}

/// [min lo, max hi] of the clamped key ranges of rows [i0, i0+n) read from
/// global memory (jmin > jmax if all are empty); every thread gets the same.
KOKKOS_INLINE_FUNCTION void tile_span(const View1<const std::int32_t>& kv_lo,
                                      const View1<const std::int32_t>& kv_hi, int i0, int n, int S,
                                      int& jmin, int& jmax) {
  jmin = kNoKey;
  jmax = -1;
  for (int i = i0; i < i0 + n; ++i) {
    const int lo = wlb::kmath::max<int>(kv_lo(i), 0);
    const int hi = wlb::kmath::min<int>(kv_hi(i), S - 1);
    if (lo > hi) continue;
    jmin = wlb::kmath::min(jmin, lo);
    jmax = wlb::kmath::max(jmax, hi);
  }
}
/// The head dim padded to the register block width of Scalar products under
/// key tiles of bk columns (the kernels' Dp).
template <class Scalar>
int padded_head_dim(int head_dim, int bk) {
  return round_up(head_dim, block_cols(BlockCols<Scalar>::value, bk));
}

// The one account of what the kernels allocate: each kernel below requests
// scratch_bytes(...).<its kernel> and carves exactly these Views out of it,
// in this order.
template <class Scalar>
ScratchBytes scratch_bytes(Shape s, int head_dim) {
  const std::size_t BQ = std::size_t(s.bq), BK = std::size_t(s.bk);
  const std::size_t Dp = std::size_t(padded_head_dim<Scalar>(head_dim, s.bk));
  auto f = [](std::size_t n) { return Scratch<Scalar>::shmem_size(n); };
  auto i = [](std::size_t n) { return Scratch<int>::shmem_size(n); };
  ScratchBytes r;
  r.forward = f(BQ * Dp)       // Qs
              + f(Dp * BK)     // Kt
              + f(BK * Dp)     // Vs
              + f(BQ * BK)     // S / P
              + f(BQ * Dp)     // O accumulator
              + 2 * f(BQ)      // m, l
              + 2 * i(BQ)      // lo, hi
              + 2 * i(BQ / kRB);  // band hulls
  r.dkdv = 2 * f(Dp * BK)      // Kt, Vt
           + 2 * f(BQ * Dp)    // Qs, dOs
           + 2 * f(BQ * BK)    // S/P, dP/dS
           + 2 * f(BK * Dp)    // dK, dV acc
           + 2 * f(BQ)         // lse, D
           + 2 * i(BQ)         // lo, hi
           + 2 * i(BQ / kRB)   // query band hulls
           + 2 * i(BK / kRB);  // key band hulls
  r.dq = 2 * f(Dp * BK)        // Kt, Vt
         + f(BK * Dp)          // Ks
         + 2 * f(BQ * Dp)      // Qs, dOs
         + 2 * f(BQ * BK)      // S/P, dP/dS
         + f(BQ * Dp)          // dQ acc
         + 2 * f(BQ)           // lse, D
         + 2 * i(BQ)           // lo, hi
         + 2 * i(BQ / kRB);    // band hulls
  return r;
}

template <class Scalar>
Shape cuda_tiles(int head_dim, std::size_t budget) {
  for (int n = 0; n + 1 < kNumCudaTiles; ++n)
    if (scratch_bytes<Scalar>(kCudaTiles[n], head_dim).max() <= budget) return kCudaTiles[n];
  return kCudaTiles[kNumCudaTiles - 1];
}

#if defined(KOKKOS_ENABLE_CUDA)
constexpr bool kCudaSpace = std::is_same<ExecSpace, Kokkos::Cuda>::value;
#else
constexpr bool kCudaSpace = false;
#endif

template <class Scalar>
Shape tiles_for(int head_dim) {
  if (!kCudaSpace) return kHostTiles;
  // What scratch_level() will compare with: Kokkos >= 4.6 keeps a reserve
  // for team reductions out of the 48 KiB.
  const auto level0 = static_cast<std::size_t>(Policy::scratch_size_max(0));
  return cuda_tiles<Scalar>(head_dim, level0 < kCudaScratchBudget ? level0 : kCudaScratchBudget);
}

// The CUDA shapes are compiled for a host execution space only where
// WLB4D_ATTENTION_CUDA_TILES_ON_HOST is set (the attention tests, which run
// them against the reference): the library's host build keeps one
// instantiation per kernel, so the compiler inlines its helpers as before
// (more instantiations made GCC outline some of them).
#if defined(WLB4D_ATTENTION_CUDA_TILES_ON_HOST)
constexpr bool kCudaTilesCompiled = true;
#else
constexpr bool kCudaTilesCompiled = kCudaSpace;
#endif

/// Calls f(Tiles<bq, bk>{}) for the compiled shape equal to s: the host
/// shape in host builds only (no device code for a shape CUDA never takes),
/// the CUDA shapes where kCudaTilesCompiled.
template <class F>
void with_tiles(Shape s, F&& f) {
  if constexpr (!kCudaSpace) {
    if (s == kHostTiles) return f(HostTiles{});
  }
  if constexpr (kCudaTilesCompiled) {
    if (s == kCudaTiles[0]) return f(CudaTiles0{});
    if (s == kCudaTiles[1]) return f(CudaTiles1{});
    if (s == kCudaTiles[2]) return f(CudaTiles2{});
  }
  throw std::invalid_argument("attention (tiled): no kernel compiled for " + std::to_string(s.bq) + " x " +
                              std::to_string(s.bk) + " tiles");
}

// ---------------------------------------------------------------- forward --

template <class Scalar, int BQ, int BK>
void forward_tiles(View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,
                   View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,
                   View3<Scalar> out, View2<Scalar> lse, const Dims& dm) {
  constexpr int CB = block_cols(BlockCols<Scalar>::value, BK);
  const int T = dm.T, S = dm.S, D = dm.D, Dp = round_up(D, CB);
  const int group = dm.Hq / dm.Hkv;
  const int nqt = (T + BQ - 1) / BQ;
  const Scalar neg_inf = -std::numeric_limits<Scalar>::infinity();

  const std::size_t bytes = scratch_bytes<Scalar>(Shape{BQ, BK}, D).forward;
  const int lvl = scratch_level(bytes);

  Kokkos::parallel_for(
      "wlb::model::attention_forward",
      Policy(dm.Hq * nqt, Kokkos::AUTO).set_scratch_size(lvl, Kokkos::PerTeam(bytes)),
      KOKKOS_LAMBDA(const Member& t) {
        const int h = t.league_rank() / nqt;
        const int i0 = (t.league_rank() % nqt) * BQ;
        const int nq = wlb::kmath::min(BQ, T - i0);
        const int hk = h / group;
        const int M = round_up(nq, kRB);
        Scratch<Scalar> Qs(t.team_scratch(lvl), BQ * Dp), Kt(t.team_scratch(lvl), Dp * BK),
            Vs(t.team_scratch(lvl), BK * Dp), Sb(t.team_scratch(lvl), BQ * BK),
            Ob(t.team_scratch(lvl), BQ * Dp), mb(t.team_scratch(lvl), BQ),
            lb(t.team_scratch(lvl), BQ);
        Scratch<int> lo(t.team_scratch(lvl), BQ), hi(t.team_scratch(lvl), BQ),
            blo(t.team_scratch(lvl), BQ / kRB), bhi(t.team_scratch(lvl), BQ / kRB);

        // Q is pre-multiplied by the softmax scale: S = Qs·Kᵀ is already scaled.
        load_rows<Scalar>(t, q, i0, nq, h, D, Dp, BQ, scale, Qs.data());
        load_ranges(t, kv_lo, kv_hi, i0, nq, S, lo.data(), hi.data());
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, BQ), [&](const int r) {
          mb(r) = neg_inf;
          lb(r) = Scalar(0);
          for (int d = 0; d < Dp; ++d) Ob(r * Dp + d) = Scalar(0);
        });
        t.team_barrier();

        int jmin, jmax;
        key_span(lo.data(), hi.data(), nq, jmin, jmax);
        for (int j0 = (jmin > jmax ? S : jmin / BK * BK); j0 <= jmax; j0 += BK) {
          const int nk = wlb::kmath::min(BK, S - j0);
          // A key tile that no row may see costs nothing (document boundaries).
          if (!any_row_overlaps(lo.data(), hi.data(), nq, j0, j0 + nk - 1)) continue;
          const int N = round_up(nk, CB);
          load_rows_t<Scalar, BK>(t, k, j0, nk, hk, D, Dp, Kt.data());
          load_rows<Scalar>(t, v, j0, nk, hk, D, Dp, BK, Scalar(1), Vs.data());
          band_ranges(t, lo.data(), hi.data(), nq, M, j0, nk, blo.data(), bhi.data());
          t.team_barrier();
          team_gemm_banded<Scalar, CB>(t, M, N, D, Qs.data(), Dp, Kt.data(), BK, Sb.data(), BK,
                                   blo.data(), bhi.data());
          t.team_barrier();
          // Online softmax (FA-2 Alg. 1 lines 8-10), one row per thread.
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nq), [&](const int r) {
            Scalar* s = Sb.data() + r * BK;
            const int jb = wlb::kmath::max(lo(r) - j0, 0);
            const int je = wlb::kmath::min(hi(r) - j0, nk - 1);
            if (jb > je) {  // row sees no key of this tile: P = 0, state unchanged
              for (int j = 0; j < N; ++j) s[j] = Scalar(0);
              return;
            }
            const Scalar m_old = mb(r);
            Scalar m_new = m_old;
            for (int j = jb; j <= je; ++j) m_new = wlb::kmath::max(m_new, s[j]);
            // m_old = -inf on the first visited tile: alpha = exp(-inf) = 0.
            const Scalar alpha = wlb::kmath::exp(m_old - m_new);
            Scalar sum = 0;
            for (int j = 0; j < jb; ++j) s[j] = Scalar(0);
#ifdef WLB4D_VEXP
            vexp::exp_shift(s + jb, s + jb, je - jb + 1, m_new);
            for (int j = jb; j <= je; ++j) sum += s[j];
#else
            for (int j = jb; j <= je; ++j) {
              const Scalar p = wlb::kmath::exp(s[j] - m_new);
              s[j] = p;
              sum += p;
            }
#endif
            for (int j = je + 1; j < N; ++j) s[j] = Scalar(0);
            mb(r) = m_new;
            lb(r) = alpha * lb(r) + sum;
            if (alpha != Scalar(1)) {
              Scalar* o = Ob.data() + r * Dp;
              for (int d = 0; d < Dp; ++d) o[d] *= alpha;
            }
          });
          t.team_barrier();
          // O += P·V over each band's allowed keys (Alg. 1 line 10).
          team_gemm_krange<Scalar, CB>(t, M, Dp, Sb.data(), BK, Vs.data(), Dp, Ob.data(), Dp,
                                   blo.data(), bhi.data());
          t.team_barrier();
        }

        // Normalise (Alg. 1 line 12) and store lse (line 13).
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nq), [&](const int r) {
          const Scalar l = lb(r);
          const Scalar inv = l > Scalar(0) ? Scalar(1) / l : Scalar(0);
          Scalar* KOKKOS_RESTRICT o = &out(i0 + r, h, 0);
          const Scalar* KOKKOS_RESTRICT src = Ob.data() + r * Dp;
          for (int d = 0; d < D; ++d) o[d] = src[d] * inv;
          lse(h, i0 + r) = l > Scalar(0) ? mb(r) + wlb::kmath::log(l) : neg_inf;
        });
      });
}

// --------------------------------------------------------------- backward --

template <class Scalar, int BQ, int BK>
void backward_tiles(View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,
                    View3<const Scalar> out, View3<const Scalar> dout, View2<const Scalar> lse,
                    View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,
                    View3<Scalar> dq, View3<Scalar> dk, View3<Scalar> dv, const Dims& dm) {
  constexpr int CB = block_cols(BlockCols<Scalar>::value, BK);
  const int T = dm.T, S = dm.S, D = dm.D, Dp = round_up(D, CB);
  const int Hq = dm.Hq, Hkv = dm.Hkv, group = Hq / Hkv;
  const int nqt = (T + BQ - 1) / BQ;
  const int nkt = (S + BK - 1) / BK;

  // D_i = rowsum(dO ∘ O) (FA-2 Alg. 2 line 4) and each query tile's key span
  // are computed inside the teams where they are needed (row_dot, tile_span
  // below) rather than in global buffers: the backward allocates nothing.
  // ---- dK, dV: one team per (kv head, key tile), looping over the query
  // heads of its group and the query tiles that may see it (Alg. 2 lines
  // 5-20 without the dQ update, which would need atomics).
  if (S > 0 && Hkv > 0) {
    const std::size_t bytes = scratch_bytes<Scalar>(Shape{BQ, BK}, D).dkdv;
    const int lvl = scratch_level(bytes);
    Kokkos::parallel_for(
        "wlb::model::attention_backward_dkdv",
        Policy(Hkv * nkt, Kokkos::AUTO).set_scratch_size(lvl, Kokkos::PerTeam(bytes)),
        KOKKOS_LAMBDA(const Member& t) {
          const int hk = t.league_rank() / nkt;
          const int j0 = (t.league_rank() % nkt) * BK;
          const int nk = wlb::kmath::min(BK, S - j0);
          const int j1 = j0 + nk - 1;
          const int N = round_up(nk, CB);
          const int Mk = round_up(nk, kRB);
          Scratch<Scalar> Kt(t.team_scratch(lvl), Dp * BK), Vt(t.team_scratch(lvl), Dp * BK),
              Qs(t.team_scratch(lvl), BQ * Dp), dOs(t.team_scratch(lvl), BQ * Dp),
              Sb(t.team_scratch(lvl), BQ * BK), dPb(t.team_scratch(lvl), BQ * BK),
              dKa(t.team_scratch(lvl), BK * Dp), dVa(t.team_scratch(lvl), BK * Dp),
              lse_s(t.team_scratch(lvl), BQ), D_s(t.team_scratch(lvl), BQ);
          Scratch<int> lo(t.team_scratch(lvl), BQ), hi(t.team_scratch(lvl), BQ),
              blo(t.team_scratch(lvl), BQ / kRB), bhi(t.team_scratch(lvl), BQ / kRB),
              klo(t.team_scratch(lvl), BK / kRB), khi(t.team_scratch(lvl), BK / kRB);

          load_rows_t<Scalar, BK>(t, k, j0, nk, hk, D, Dp, Kt.data());
          load_rows_t<Scalar, BK>(t, v, j0, nk, hk, D, Dp, Vt.data());
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, BK * Dp), [&](const int n) {
            dKa(n) = Scalar(0);
            dVa(n) = Scalar(0);
          });
          t.team_barrier();

          for (int qt = 0; qt < nqt; ++qt) {
            const int i0 = qt * BQ;
            const int nq = wlb::kmath::min(BQ, T - i0);
            {
              int jmin, jmax;  // same for all threads
              tile_span(kv_lo, kv_hi, i0, nq, S, jmin, jmax);
              if (jmin > j1 || jmax < j0) continue;
            }
            const int M = round_up(nq, kRB);
            load_ranges(t, kv_lo, kv_hi, i0, nq, S, lo.data(), hi.data());
            t.team_barrier();
            if (!any_row_overlaps(lo.data(), hi.data(), nq, j0, j1)) {
              t.team_barrier();  // lo/hi are rewritten by the next iteration
              continue;
            }
            band_ranges(t, lo.data(), hi.data(), nq, M, j0, nk, blo.data(), bhi.data());
            key_band_ranges(t, lo.data(), hi.data(), nq, Mk, j0, nk, klo.data(), khi.data());
            for (int h = hk * group; h < (hk + 1) * group; ++h) {
              // Qs holds scale·q, so dK = dSᵀ·Qs needs no extra scaling.
              load_rows<Scalar>(t, q, i0, nq, h, D, Dp, BQ, scale, Qs.data());
              load_rows<Scalar>(t, dout, i0, nq, h, D, Dp, BQ, Scalar(1), dOs.data());
              Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nq), [&](const int r) {
                lse_s(r) = lse(h, i0 + r);
                D_s(r) = row_dot(dout, out, i0 + r, h, D);
              });
              t.team_barrier();
              backward_scores<Scalar, BK, CB>(t, nq, M, N, D, Dp, j0, nk, Qs.data(), dOs.data(), Kt.data(),
                                      Vt.data(), lo.data(), hi.data(), blo.data(), bhi.data(),
                                      lse_s.data(), D_s.data(), Sb.data(), dPb.data());
              // dV += Pᵀ·dO, dK += dSᵀ·(scale·Q)  (Alg. 2 lines 12, 15), each key
              // band over the query rows that may see it.
              team_gemm_krange<Scalar, CB, true>(t, Mk, Dp, Sb.data(), BK, dOs.data(), Dp, dVa.data(),
                                             Dp, klo.data(), khi.data());
              team_gemm_krange<Scalar, CB, true>(t, Mk, Dp, dPb.data(), BK, Qs.data(), Dp, dKa.data(),
                                             Dp, klo.data(), khi.data());
              t.team_barrier();
            }
          }

          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nk), [&](const int r) {
            Scalar* KOKKOS_RESTRICT gk = &dk(j0 + r, hk, 0);
            Scalar* KOKKOS_RESTRICT gv = &dv(j0 + r, hk, 0);
            const Scalar* KOKKOS_RESTRICT sk = dKa.data() + r * Dp;
            const Scalar* KOKKOS_RESTRICT sv = dVa.data() + r * Dp;
            for (int d = 0; d < D; ++d) gk[d] = sk[d];
            for (int d = 0; d < D; ++d) gv[d] = sv[d];
          });
        });
  }

  // ---- dQ: one team per (query head, query tile) (Alg. 2 lines 13-14,
  // accumulated in scratch instead of atomically in global memory).
  if (T > 0 && Hq > 0) {
    const std::size_t bytes = scratch_bytes<Scalar>(Shape{BQ, BK}, D).dq;
    const int lvl = scratch_level(bytes);
    Kokkos::parallel_for(
        "wlb::model::attention_backward_dq",
        Policy(Hq * nqt, Kokkos::AUTO).set_scratch_size(lvl, Kokkos::PerTeam(bytes)),
        KOKKOS_LAMBDA(const Member& t) {
          const int h = t.league_rank() / nqt;
          const int i0 = (t.league_rank() % nqt) * BQ;
          const int nq = wlb::kmath::min(BQ, T - i0);
          const int hk = h / group;
          const int M = round_up(nq, kRB);
          Scratch<Scalar> Kt(t.team_scratch(lvl), Dp * BK), Vt(t.team_scratch(lvl), Dp * BK),
              Ks(t.team_scratch(lvl), BK * Dp), Qs(t.team_scratch(lvl), BQ * Dp),
              dOs(t.team_scratch(lvl), BQ * Dp), Sb(t.team_scratch(lvl), BQ * BK),
              dPb(t.team_scratch(lvl), BQ * BK), dQa(t.team_scratch(lvl), BQ * Dp),
              lse_s(t.team_scratch(lvl), BQ), D_s(t.team_scratch(lvl), BQ);
          Scratch<int> lo(t.team_scratch(lvl), BQ), hi(t.team_scratch(lvl), BQ),
              blo(t.team_scratch(lvl), BQ / kRB), bhi(t.team_scratch(lvl), BQ / kRB);

          load_rows<Scalar>(t, q, i0, nq, h, D, Dp, BQ, scale, Qs.data());
          load_rows<Scalar>(t, dout, i0, nq, h, D, Dp, BQ, Scalar(1), dOs.data());
          load_ranges(t, kv_lo, kv_hi, i0, nq, S, lo.data(), hi.data());
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, BQ), [&](const int r) {
            lse_s(r) = r < nq ? lse(h, i0 + r) : Scalar(0);
            D_s(r) = r < nq ? row_dot(dout, out, i0 + r, h, D) : Scalar(0);
            for (int d = 0; d < Dp; ++d) dQa(r * Dp + d) = Scalar(0);
          });
          t.team_barrier();

          int jmin, jmax;
          key_span(lo.data(), hi.data(), nq, jmin, jmax);
          for (int j0 = (jmin > jmax ? S : jmin / BK * BK); j0 <= jmax; j0 += BK) {
            const int nk = wlb::kmath::min(BK, S - j0);
            if (!any_row_overlaps(lo.data(), hi.data(), nq, j0, j0 + nk - 1)) continue;
            const int N = round_up(nk, CB);
            load_rows_t<Scalar, BK>(t, k, j0, nk, hk, D, Dp, Kt.data());
            load_rows_t<Scalar, BK>(t, v, j0, nk, hk, D, Dp, Vt.data());
            load_rows<Scalar>(t, k, j0, nk, hk, D, Dp, BK, Scalar(1), Ks.data());
            band_ranges(t, lo.data(), hi.data(), nq, M, j0, nk, blo.data(), bhi.data());
            t.team_barrier();
            backward_scores<Scalar, BK, CB>(t, nq, M, N, D, Dp, j0, nk, Qs.data(), dOs.data(), Kt.data(),
                                    Vt.data(), lo.data(), hi.data(), blo.data(), bhi.data(),
                                    lse_s.data(), D_s.data(), Sb.data(), dPb.data());
            // dQ += dS·K over each band's allowed keys (the scale is applied once,
            // at the store).
            team_gemm_krange<Scalar, CB>(t, M, Dp, dPb.data(), BK, Ks.data(), Dp, dQa.data(), Dp,
                                     blo.data(), bhi.data());
            t.team_barrier();
          }

          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nq), [&](const int r) {
            Scalar* KOKKOS_RESTRICT g = &dq(i0 + r, h, 0);
            const Scalar* KOKKOS_RESTRICT src = dQa.data() + r * Dp;
            for (int d = 0; d < D; ++d) g[d] = scale * src[d];
          });
        });
  }
}

// ------------------------------------------------------------- dispatch --

template <class Scalar>
void forward(Shape s, View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,
             View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,
             View3<Scalar> out, View2<Scalar> lse, const Dims& dm) {
  with_tiles(s, [&](auto tiles) {
    using T = decltype(tiles);
    forward_tiles<Scalar, T::bq, T::bk>(q, k, v, kv_lo, kv_hi, scale, out, lse, dm);
  });
}

template <class Scalar>
void backward(Shape s, View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,
              View3<const Scalar> out, View3<const Scalar> dout, View2<const Scalar> lse,
              View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,
              View3<Scalar> dq, View3<Scalar> dk, View3<Scalar> dv, const Dims& dm) {
  with_tiles(s, [&](auto tiles) {
    using T = decltype(tiles);
    backward_tiles<Scalar, T::bq, T::bk>(q, k, v, out, dout, lse, kv_lo, kv_hi, scale, dq, dk, dv, dm);
  });
}

template <class Scalar>
void forward(View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,
             View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,
             View3<Scalar> out, View2<Scalar> lse, const Dims& dm) {
  forward<Scalar>(tiles_for<Scalar>(dm.D), q, k, v, kv_lo, kv_hi, scale, out, lse, dm);
}

template <class Scalar>
void backward(View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,
              View3<const Scalar> out, View3<const Scalar> dout, View2<const Scalar> lse,
              View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,
              View3<Scalar> dq, View3<Scalar> dk, View3<Scalar> dv, const Dims& dm) {
  backward<Scalar>(tiles_for<Scalar>(dm.D), q, k, v, out, dout, lse, kv_lo, kv_hi, scale, dq, dk, dv, dm);
}

template <class Scalar>
AttentionTiles tiles(int head_dim) {
  const Shape s = tiles_for<Scalar>(head_dim);
  const ScratchBytes b = scratch_bytes<Scalar>(s, head_dim);
  AttentionTiles r;
  r.queries = s.bq;
  r.keys = s.bk;
  r.forward_bytes = b.forward;
  r.dkdv_bytes = b.dkdv;
  r.dq_bytes = b.dq;
  r.level0_max_bytes = static_cast<std::size_t>(Policy::scratch_size_max(0));
  return r;
}

#define WLB4D_INSTANTIATE_TILED(S)                                                                          \
  template void forward<S>(Shape, View3<const S>, View3<const S>, View3<const S>, View1<const std::int32_t>, \
                           View1<const std::int32_t>, S, View3<S>, View2<S>, const Dims&);                  \
  template void backward<S>(Shape, View3<const S>, View3<const S>, View3<const S>, View3<const S>,           \
                            View3<const S>, View2<const S>, View1<const std::int32_t>,                       \
                            View1<const std::int32_t>, S, View3<S>, View3<S>, View3<S>, const Dims&);        \
  template ScratchBytes scratch_bytes<S>(Shape, int);                                                        \
  template Shape cuda_tiles<S>(int, std::size_t);                                                            \
  template Shape tiles_for<S>(int);
WLB4D_INSTANTIATE_TILED(float)
WLB4D_INSTANTIATE_TILED(double)
#undef WLB4D_INSTANTIATE_TILED
WLB4D_INSTANTIATE_ATTENTION_BACKEND(float)
WLB4D_INSTANTIATE_ATTENTION_BACKEND(double)

}  // namespace wlb::model::attn_impl::tiled

// bf16 GEMMs of the linear layers. See bf16_gemm.hpp.
#include "wlb4d/model/bf16_gemm.hpp"

#include "wlb4d/core/blas_info.hpp"

#include <KokkosBlas3_gemm.hpp>

#if defined(WLB4D_HAVE_CUBLAS) && defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>
#define WLB4D_BF16_GEMMEX 1
#endif

#include <algorithm>
#include <stdexcept>
#include <string>

namespace wlb::model {

namespace {

using core::bf16_bits;
using MD2 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>;

void require(bool ok, const char* fn, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("wlb::model::") + fn + ": " + what);
}
std::string dims(std::size_t a, std::size_t b) { return "[" + std::to_string(a) + "][" + std::to_string(b) + "]"; }

#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL)
constexpr bool kDeviceBuild = true;
#else
constexpr bool kDeviceBuild = false;
#endif

[[maybe_unused]] core::SbgemmFn sbgemm() {
  static const core::SbgemmFn f = kDeviceBuild ? nullptr : core::find_sbgemm();
  return f;
}

// The paths that keep bf16 bits (2-byte weight copies and operands).
bool uses_bits(Bf16Path p) { return p != Bf16Path::Widen; }

#ifdef WLB4D_BF16_GEMMEX
void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("wlb::model: bf16 GEMM: ") + what + " failed: " + cublasGetStatusString(st));
}

// One handle per process (cuBLAS handles are per device and thread; wlb4d
// drives one GPU per rank from one thread), bound to the stream of Kokkos'
// default instance so the rounding kernels and the GEMM stay ordered without
// a fence. Not destroyed: destroying after Kokkos::finalize could touch a
// released context, and the process exits right after.
cublasHandle_t cublas_handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t x = nullptr;
    check_cublas(cublasCreate(&x), "cublasCreate");
    return x;
  }();
  check_cublas(cublasSetStream(h, ExecSpace().cuda_stream()), "cublasSetStream");
  return h;
}

// Row-major C[M][N] = alpha·op(A)·op(B) + beta·C with bf16 A, B and fp32 C,
// fp32 accumulation (CUBLAS_COMPUTE_32F: tensor cores on sm_80+). cuBLAS is
// column-major, where a row-major X is Xᵀ: so compute Cᵀ = op(B)ᵀ·op(A)ᵀ,
// i.e. swap the operands and keep each one's transpose flag.
void gemm_ex(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const bf16_bits* A,
             std::int64_t lda, const bf16_bits* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  check_cublas(cublasGemmEx(cublas_handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(N),
                            int(M), int(K), &alpha, B, CUDA_R_16BF, int(ldb), A, CUDA_R_16BF, int(lda), &beta, C,
                            CUDA_R_32F, int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}
#endif

View2<float> wide2(float* p, std::int64_t r, std::int64_t c) { return View2<float>(p, r, c); }

}  // namespace

// Kernels live in named free functions (nvcc: no extended lambda in private members).
namespace bf16_detail {

/// dst[t][j] = round(src[t][c0 + j]) for t < T, j < n (src row stride ld), fp32-held bf16 values.
void round_cols_wide(const float* src, std::int64_t ld, std::int64_t c0, std::int64_t T, std::int64_t n,
                     float* dst) {
  if (T == 0 || n == 0) return;
  Kokkos::parallel_for(
      "wlb::model::bf16_round", MD2({0, 0}, {T, n}), KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t j) {
        dst[t * n + j] = core::round_to_bf16(src[t * ld + c0 + j]);
      });
}

/// The same into bf16 bits.
void round_cols_bits(const float* src, std::int64_t ld, std::int64_t c0, std::int64_t T, std::int64_t n,
                     bf16_bits* dst) {
  if (T == 0 || n == 0) return;
  Kokkos::parallel_for(
      "wlb::model::bf16_round", MD2({0, 0}, {T, n}), KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t j) {
        dst[t * n + j] = core::float_to_bf16(src[t * ld + c0 + j]);
      });
}

/// dst[t][c0 + j] = src[t][j] (to = true) or src[t][c0 + j] → dst[t][j]: a block of n columns of a row-major [T][ld].
void copy_cols(const float* src, float* dst, std::int64_t ld, std::int64_t c0, std::int64_t T, std::int64_t n,
               bool to) {
  if (T == 0 || n == 0) return;
  Kokkos::parallel_for(
      "wlb::model::bf16_block_copy", MD2({0, 0}, {T, n}), KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t j) {
        if (to) dst[t * ld + c0 + j] = src[t * n + j];
        else dst[t * n + j] = src[t * ld + c0 + j];
      });
}

/// bits[i] = float_to_bf16(x[i]), i < n.
void store_bits(const float* x, std::int64_t n, bf16_bits* bits) {
  if (n == 0) return;
  Kokkos::parallel_for(
      "wlb::model::bf16_store", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { bits[i] = core::float_to_bf16(x[i]); });
}

/// x[i] = bf16_to_float(bits[i]), i < n.
void load_bits(const bf16_bits* bits, std::int64_t n, float* x) {
  if (n == 0) return;
  Kokkos::parallel_for(
      "wlb::model::bf16_load", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { x[i] = core::bf16_to_float(bits[i]); });
}

}  // namespace bf16_detail

void bf16_store(const View2<float>& x, bf16_bits* bits) {
  bf16_detail::store_bits(x.data(), std::int64_t(x.extent(0) * x.extent(1)), bits);
}

void bf16_load(const bf16_bits* bits, const View2<float>& x) {
  bf16_detail::load_bits(bits, std::int64_t(x.extent(0) * x.extent(1)), x.data());
}

Bf16Path bf16_gemm_path() {
#ifdef WLB4D_BF16_GEMMEX
  return Bf16Path::GemmEx;
#else
  return sbgemm() ? Bf16Path::Sbgemm : Bf16Path::Widen;
#endif
}

const char* to_string(Bf16Path p) {
  switch (p) {
    case Bf16Path::Sbgemm: return "sbgemm";
    case Bf16Path::GemmEx: return "cublasGemmEx";
    case Bf16Path::Widen: break;
  }
  return "widen";
}

std::string bf16_gemm_summary() {
  switch (bf16_gemm_path()) {
    case Bf16Path::Sbgemm: return "bf16 GEMM: cblas_sbgemm of the loaded BLAS (bf16 operands, fp32 accumulation)";
    case Bf16Path::GemmEx:
      return "bf16 GEMM: cuBLAS cublasGemmEx (CUDA_R_16BF operands, CUBLAS_COMPUTE_32F, fp32 output; tensor cores)";
    case Bf16Path::Widen: break;
  }
  return std::string("bf16 GEMM: operands rounded to bf16, widened to fp32, SGEMM with fp32 accumulation (") +
         (kDeviceBuild ? "device build without cuBLAS: SGEMM on the widened operands"
                       : "the loaded BLAS has no cblas_sbgemm") +
         ")";
}

int bf16_operand_bytes() { return uses_bits(bf16_gemm_path()) ? 2 : 4; }

int bf16_weight_bytes() { return uses_bits(bf16_gemm_path()) ? 2 : 0; }

Bf16Weight::Bf16Weight(std::int64_t rows, std::int64_t cols) : rows_(rows), cols_(cols) {
  if (uses_bits(bf16_gemm_path()))
    bits_ = View2<bf16_bits>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "model::bf16_weights"), rows, cols);
}

void Bf16Weight::refresh(const View2<float>& master) {
  require(std::int64_t(master.extent(0)) == rows_ && std::int64_t(master.extent(1)) == cols_, "Bf16Weight::refresh",
          "master" + dims(master.extent(0), master.extent(1)) + " differs from the copy " + dims(rows_, cols_));
  if (uses_bits(bf16_gemm_path()))
    bf16_detail::round_cols_bits(master.data(), cols_, 0, rows_, cols_, bits_.data());
  else
    master_ = master;  // Widen: the GEMMs round blocks of it (bf16_gemm.hpp)
}

Bf16Workspace::Bf16Workspace(std::int64_t a_elems, std::int64_t b_elems, std::int64_t w_elems, std::int64_t c_elems)
    : a_elems_(a_elems), b_elems_(b_elems) {
  const auto alloc = [] { return Kokkos::view_alloc(Kokkos::WithoutInitializing, "model::bf16_operands"); };
  if (uses_bits(bf16_gemm_path())) {
    a_bits_ = View1<bf16_bits>(alloc(), a_elems);
    b_bits_ = View1<bf16_bits>(alloc(), b_elems);
  } else {
    w_elems_ = w_elems;
    c_elems_ = c_elems;
    a_wide_ = View1<float>(alloc(), a_elems);
    b_wide_ = View1<float>(alloc(), b_elems);
    if (w_elems > 0) w_wide_ = View1<float>(alloc(), w_elems);
    if (c_elems > 0) c_wide_ = View1<float>(alloc(), c_elems);
  }
}

Bf16Workspace Bf16Workspace::for_gemm(std::int64_t T, std::int64_t in, std::int64_t out) {
  const std::int64_t n = std::min(out, kBf16Block);
  return Bf16Workspace(T * std::max(in, n), T * in, n * in, out > kBf16Block ? T * n : 0);
}

namespace {

[[maybe_unused]] constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

// C[M][N] = alpha·op(A)·op(B) + beta·C on the workspace operands. A is the
// workspace's rounded left operand [rows_a][cols_a]; B is either the weight
// copy (w != nullptr, rows w_r0.. of it) or the workspace's right operand.
void run_gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const Bf16Workspace& ws,
              std::int64_t a_rows, std::int64_t a_cols, const Bf16Weight* w, std::int64_t w_r0, std::int64_t w_r1,
              std::int64_t b_rows, std::int64_t b_cols, float beta, const View2<float>& C) {
#ifdef WLB4D_BF16_GEMMEX
  (void)a_rows;
  (void)w_r1;
  (void)b_rows;
  const bf16_bits* B = w ? w->bits().data() + w_r0 * w->cols() : ws.b_bits();
  gemm_ex(ta, tb, M, N, K, 1.0f, ws.a_bits(), a_cols, B, w ? w->cols() : b_cols, beta, C.data(),
          std::int64_t(C.extent(1)));
#else
  if (const auto f = sbgemm()) {
    const bf16_bits* B = w ? w->bits().data() + w_r0 * w->cols() : ws.b_bits();
    const std::int64_t ldb = w ? w->cols() : b_cols;
    ExecSpace().fence();  // the rounding kernels are done before the BLAS reads
    f(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(M), int(N), int(K), 1.0f, ws.a_bits(),
      int(a_cols), B, int(ldb), beta, C.data(), int(C.extent(1)));
    return;
  }
  const auto A = wide2(ws.a_wide(), a_rows, a_cols);
  if (w) {  // rows w_r0..w_r1 of the master, rounded into the weight block workspace
    const std::int64_t n = w_r1 - w_r0;
    require(n * w->cols() <= ws.w_elems(), "bf16 GEMM",
            "weight block" + dims(n, w->cols()) + " exceeds the bf16 workspace of " + std::to_string(ws.w_elems()) +
                " elements");
    require(w->master().data() != nullptr || n * w->cols() == 0, "bf16 GEMM", "weight copy used before refresh()");
    bf16_detail::round_cols_wide(w->master().data() + w_r0 * w->cols(), w->cols(), 0, n, w->cols(), ws.w_wide());
  }
  const auto B = w ? wide2(ws.w_wide(), w_r1 - w_r0, w->cols()) : wide2(ws.b_wide(), b_rows, b_cols);
  KokkosBlas::gemm(ta ? "T" : "N", tb ? "T" : "N", 1.0f, A, B, beta, C);
#endif
}

}  // namespace

void bf16_linear_forward(const View2<float>& x, const Bf16Weight& w, const View2<float>& y, float beta,
                         Bf16Workspace& ws) {
  const std::int64_t T = x.extent(0), in = x.extent(1), out = w.rows();
  require(in == w.cols() && std::int64_t(y.extent(0)) == T && std::int64_t(y.extent(1)) == out,
          "bf16_linear_forward", "x" + dims(T, in) + " W" + dims(out, w.cols()) + " y" +
                                     dims(y.extent(0), y.extent(1)) + " do not fit y = x·Wᵀ");
  require(T * in <= ws.a_elems(), "bf16_linear_forward",
          "x" + dims(T, in) + " exceeds the bf16 workspace of " + std::to_string(ws.a_elems()) + " elements");
  if (T == 0) return;
  if (ws.a_bits()) {
    bf16_detail::round_cols_bits(x.data(), in, 0, T, in, ws.a_bits());
    run_gemm(false, true, T, out, in, ws, T, in, &w, 0, out, 0, 0, beta, y);
    return;
  }
  bf16_detail::round_cols_wide(x.data(), in, 0, T, in, ws.a_wide());
  if (out <= kBf16Block) {
    run_gemm(false, true, T, out, in, ws, T, in, &w, 0, out, 0, 0, beta, y);
    return;
  }
  // Widen, out > kBf16Block (the LM head): blocks of output columns through c_wide (LayoutRight for the BLAS).
  require(T * kBf16Block <= ws.c_elems(), "bf16_linear_forward",
          "y block" + dims(T, kBf16Block) + " exceeds the bf16 workspace of " + std::to_string(ws.c_elems()) +
              " elements");
  for (std::int64_t o0 = 0; o0 < out; o0 += kBf16Block) {
    const std::int64_t n = std::min(kBf16Block, out - o0);
    const auto Cb = wide2(ws.c_wide(), T, n);
    if (beta != 0.0f) bf16_detail::copy_cols(y.data(), Cb.data(), out, o0, T, n, false);
    run_gemm(false, true, T, n, in, ws, T, in, &w, o0, o0 + n, 0, 0, beta, Cb);
    bf16_detail::copy_cols(Cb.data(), y.data(), out, o0, T, n, true);
  }
}

void bf16_linear_backward_input(const Bf16Weight& w, const View2<float>& dy, const View2<float>& dx,
                                float beta_dx, Bf16Workspace& ws) {
  const std::int64_t T = dy.extent(0), out = dy.extent(1), in = w.cols();
  require(out == w.rows() && std::int64_t(dx.extent(0)) == T && std::int64_t(dx.extent(1)) == in,
          "bf16_linear_backward_input", "W" + dims(w.rows(), in) + " dy" + dims(T, out) + " dx" +
                                            dims(dx.extent(0), dx.extent(1)) + " do not fit dx = dy·W");
  if (T == 0) return;
  // Reduction over out in blocks: dx = beta·dx + Σ_blocks dy[:, blk]·W[blk, :].
  for (std::int64_t o0 = 0; o0 < out; o0 += kBf16Block) {
    const std::int64_t n = std::min(kBf16Block, out - o0);
    require(T * n <= ws.a_elems(), "bf16_linear_backward_input",
            "dy block" + dims(T, n) + " exceeds the bf16 workspace of " + std::to_string(ws.a_elems()) + " elements");
    if (ws.a_bits()) bf16_detail::round_cols_bits(dy.data(), out, o0, T, n, ws.a_bits());
    else bf16_detail::round_cols_wide(dy.data(), out, o0, T, n, ws.a_wide());
    run_gemm(false, false, T, in, n, ws, T, n, &w, o0, o0 + n, 0, 0, o0 == 0 ? beta_dx : 1.0f, dx);
  }
}

void bf16_linear_backward_weight(const View2<float>& x, const View2<float>& dy, const View2<float>& dw,
                                 Bf16Workspace& ws) {
  const std::int64_t T = x.extent(0), in = x.extent(1), out = dy.extent(1);
  require(std::int64_t(dy.extent(0)) == T && std::int64_t(dw.extent(0)) == out && std::int64_t(dw.extent(1)) == in,
          "bf16_linear_backward_weight", "x" + dims(T, in) + " dy" + dims(dy.extent(0), out) + " dW" +
                                             dims(dw.extent(0), dw.extent(1)) + " do not fit dW += dyᵀ·x");
  require(T * in <= ws.b_elems(), "bf16_linear_backward_weight",
          "x" + dims(T, in) + " exceeds the bf16 workspace of " + std::to_string(ws.b_elems()) + " elements");
  if (T == 0) return;
  if (ws.b_bits()) bf16_detail::round_cols_bits(x.data(), in, 0, T, in, ws.b_bits());
  else bf16_detail::round_cols_wide(x.data(), in, 0, T, in, ws.b_wide());
  for (std::int64_t o0 = 0; o0 < out; o0 += kBf16Block) {
    const std::int64_t n = std::min(kBf16Block, out - o0);
    require(T * n <= ws.a_elems(), "bf16_linear_backward_weight",
            "dy block" + dims(T, n) + " exceeds the bf16 workspace of " + std::to_string(ws.a_elems()) + " elements");
    if (ws.a_bits()) bf16_detail::round_cols_bits(dy.data(), out, o0, T, n, ws.a_bits());
    else bf16_detail::round_cols_wide(dy.data(), out, o0, T, n, ws.a_wide());
    run_gemm(true, false, n, in, T, ws, T, n, nullptr, 0, 0, T, in, 1.0f, wide2(dw.data() + o0 * in, n, in));
  }
}

}  // namespace wlb::model

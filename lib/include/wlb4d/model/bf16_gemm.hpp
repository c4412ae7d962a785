#pragma once
/// \file bf16_gemm.hpp
/// \brief The GEMMs of the linear layers under train.precision = bf16
/// (DESIGN §10): bf16 operands (round to nearest even, core/bf16.hpp), fp32
/// accumulation, fp32 output — what a bf16 tensor-core GEMM (cuBLAS
/// cublasGemmEx with CUDA_R_16BF inputs and CUBLAS_COMPUTE_32F) or OpenBLAS's
/// cblas_sbgemm computes (Micikevicius et al. 2018, "Mixed Precision
/// Training", §3; Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep
/// Learning Training", §3: bf16 inputs, fp32 accumulate).
///
/// Operands: a weight is a Bf16Weight, the bf16 copy of its fp32 master
/// (refresh() after every optimizer update; on the Widen path no copy is
/// kept, see below); an activation or a gradient of
/// an activation is an fp32 View rounded to bf16 on entry into a workspace
/// (the fp32 original is left unchanged: the residual stream and its
/// gradient stay fp32). Outputs and dW are fp32 and accumulate as
/// linear_forward / linear_backward_* of layers.hpp, whose shapes, beta and
/// error rules these follow (std::invalid_argument on mismatched extents).
///
/// Paths (bf16_gemm_path(), chosen once per process):
/// - Sbgemm (host builds whose loaded BLAS exports cblas_sbgemm, found by
///   dlsym, core::find_sbgemm): bf16 bits are passed to cblas_sbgemm; weight
///   copies are 2 bytes per element (label model::bf16_weights).
/// - GemmEx (CUDA builds, WLB4D_HAVE_CUBLAS): bf16 bits are passed to cuBLAS
///   cublasGemmEx (CUDA_R_16BF operands, CUDA_R_32F output,
///   CUBLAS_COMPUTE_32F: the tensor cores on sm_80+), on the stream of
///   Kokkos' default instance; 2-byte weight copies as Sbgemm. Kokkos Kernels
///   4.7 has no bf16 GEMM ETI that reaches cuBLAS, hence the direct call.
///   A cuBLAS error throws std::runtime_error naming the call and its status.
/// - Widen (any other BLAS, e.g. Debian 12's OpenBLAS 0.3.21 built without
///   BUILD_BFLOAT16; a device build without cuBLAS): the bf16 values are held
///   in fp32 (exactly representable) and multiplied by KokkosBlas::gemm
///   (SGEMM / cuBLAS SGEMM), fp32 accumulation: the same numbers as sbgemm
///   up to the order of summation. SGEMM needs 4-byte operands, so a
///   persistent copy would cost 4 bytes per weight element (more than the
///   fp32 run's whole activation saving); instead refresh() only records the
///   master and each GEMM rounds the rows of the master it multiplies (blocks
///   of kBf16Block rows) into the workspace: the same bf16 values (the
///   master does not change between a forward and its backward), one extra
///   pass over the weight per GEMM (≈ 1/(2T) of its flops).
/// Long GEMM reductions and long dW are split into blocks of kBf16Block
/// columns of dy (the LM head's vocabulary dimension), so the workspace is
/// bounded by C·max(widths, kBf16Block) instead of C·V_l.
///
/// Workspace (Bf16Workspace, allocated once, label model::bf16_operands):
/// a_elems = C·max(d, qd, F_l, min(max out width, kBf16Block)) for the rounded
/// left operand, b_elems = C·max(d, qd, F_l) for the rounded right operand of
/// dW; 4 bytes per element on the Widen path, 2 on Sbgemm and GemmEx. Widen only:
/// w_elems = max over the weights of min(rows, kBf16Block)·cols (a rounded
/// block of weight rows) and, when some weight has more than kBf16Block rows
/// (the LM head), c_elems = C·kBf16Block (a forward's block of output
/// columns, copied into y).

#include "wlb4d/core/bf16.hpp"
#include "wlb4d/core/types.hpp"

#include <cstdint>
#include <string>

namespace wlb::model {

enum class Bf16Path { Sbgemm, GemmEx, Widen };
/// The path this process runs (see the file comment). Host function.
Bf16Path bf16_gemm_path();
const char* to_string(Bf16Path p);
/// One line for the start-up log: which bf16 GEMM runs and why.
std::string bf16_gemm_summary();
/// Bytes per element of the operand workspace: 2 (Sbgemm, GemmEx) or 4 (Widen).
int bf16_operand_bytes();
/// Bytes per element of a persistent weight copy: 2 (Sbgemm, GemmEx) or 0 (Widen: none, see the file comment).
int bf16_weight_bytes();

/// Columns of dy per GEMM block (see the file comment).
constexpr std::int64_t kBf16Block = 4096;

/// The bf16 copy of one [rows][cols] fp32 master weight (label model::bf16_weights; Sbgemm and GemmEx paths).
class Bf16Weight {
 public:
  Bf16Weight() = default;
  Bf16Weight(std::int64_t rows, std::int64_t cols);
  /// Sbgemm, GemmEx: copy = round_to_bf16(master), elementwise. Widen: records master
  /// (a shallow View; its GEMMs round from it). \throws std::invalid_argument on a shape mismatch.
  void refresh(const View2<float>& master);
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  /// Widen path: the master of the last refresh(); otherwise empty.
  const View2<float>& master() const { return master_; }
  /// Sbgemm, GemmEx paths: the bf16 bits; Widen path: empty.
  const View2<core::bf16_bits>& bits() const { return bits_; }

 private:
  std::int64_t rows_ = 0, cols_ = 0;
  View2<float> master_;
  View2<core::bf16_bits> bits_;
};

/// Rounded-operand workspace (see the file comment).
class Bf16Workspace {
 public:
  Bf16Workspace() = default;
  /// w_elems, c_elems: Widen path only (ignored otherwise); see the file comment.
  Bf16Workspace(std::int64_t a_elems, std::int64_t b_elems, std::int64_t w_elems = 0, std::int64_t c_elems = 0);
  /// The sizes a GEMM of x[T][in]·W[out][in]ᵀ (and its dX, dW) needs, this path.
  static Bf16Workspace for_gemm(std::int64_t T, std::int64_t in, std::int64_t out);
  std::int64_t a_elems() const { return a_elems_; }
  std::int64_t b_elems() const { return b_elems_; }
  std::int64_t w_elems() const { return w_elems_; }
  std::int64_t c_elems() const { return c_elems_; }
  float* a_wide() const { return a_wide_.data(); }
  float* b_wide() const { return b_wide_.data(); }
  float* w_wide() const { return w_wide_.data(); }
  float* c_wide() const { return c_wide_.data(); }
  core::bf16_bits* a_bits() const { return a_bits_.data(); }
  core::bf16_bits* b_bits() const { return b_bits_.data(); }

 private:
  std::int64_t a_elems_ = 0, b_elems_ = 0, w_elems_ = 0, c_elems_ = 0;
  View1<float> a_wide_, b_wide_, w_wide_, c_wide_;
  View1<core::bf16_bits> a_bits_, b_bits_;
};

/// Stored bf16 activations (Transformer under bf16): bits[i] = float_to_bf16(x[i]) over the
/// rows·cols elements of x (LayoutRight, row-major order), round to nearest even. bits holds ≥ x.span().
void bf16_store(const View2<float>& x, core::bf16_bits* bits);
/// x[i] = bf16_to_float(bits[i]) (exact), the inverse of bf16_store for values it wrote.
void bf16_load(const core::bf16_bits* bits, const View2<float>& x);

/// y[T][out] = beta·y + bf16(x)[T][in] · bf16(W)[out][in]ᵀ, fp32 accumulation
/// (Widen: in blocks of kBf16Block output columns when out exceeds it).
/// \throws std::invalid_argument on mismatched extents or a workspace too small (T·in > ws.a_elems(), …).
void bf16_linear_forward(const View2<float>& x, const Bf16Weight& w, const View2<float>& y, float beta,
                         Bf16Workspace& ws);
/// dx[T][in] = beta_dx·dx + bf16(dy)[T][out] · bf16(W)[out][in], in blocks of kBf16Block of out.
void bf16_linear_backward_input(const Bf16Weight& w, const View2<float>& dy, const View2<float>& dx,
                                float beta_dx, Bf16Workspace& ws);
/// dW[out][in] += bf16(dy)ᵀ · bf16(x), fp32 dW (the micro-batches' sum stays fp32), blocks of kBf16Block rows.
void bf16_linear_backward_weight(const View2<float>& x, const View2<float>& dy, const View2<float>& dw,
                                 Bf16Workspace& ws);

}  // namespace wlb::model

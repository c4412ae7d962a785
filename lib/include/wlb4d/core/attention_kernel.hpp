#pragma once
/// \file attention_kernel.hpp
/// \brief The deck rule of `model.attention_kernel = auto | portable | cudnn`:
/// which attention kernel a run uses, and why (a line of the start-up banner).
///
/// Kernels:
///   portable  wlb4d's own document-masked FlashAttention-2 kernels
///             (model/attention.hpp): the Kokkos team kernel on every execution
///             space, and on a host build the BLAS-tile path where the BLAS
///             kernel is fast enough (WLB4D_ATTENTION_PATH overrides that
///             choice). fp32 or fp64 throughout.
///   cudnn     cuDNN's fused scaled-dot-product attention (SDPA) graph through
///             cudnn-frontend, forward and backward, with bf16 operands and fp32
///             statistics (lib/src/model/attention/cudnn_sdpa.cpp). Built only
///             with -DWLB4D_ENABLE_CUDA=ON -DWLB4D_ENABLE_CUDNN=ON (Spack: +cuda
///             +cudnn); this build says so through cudnn_attention_built().
///   auto      cudnn where it is built, the head dim is one cuDNN takes and
///             train.precision = bf16 (the attention's operands are then bf16
///             anyway); otherwise portable. An fp32 run keeps the fp32 kernel so
///             that its losses match the CPU's (DESIGN §3).
///
/// Head dims cuDNN's fused SDPA takes, forward and backward, on sm_80 and newer
/// with cuDNN 9: a multiple of 8 up to 128 (cudnn-frontend 1.23,
/// include/cudnn_frontend/node/sdpa_support_surface.h: "hidden_dim should be
/// multiple of 8", and at most 128 on Ampere for cuDNN <= 9.9; Llama's 64 and
/// 128 are inside). GQA (query heads a multiple of kv heads) is always taken.

#include <string>

namespace wlb::core {

/// Whether this build has the cuDNN attention kernel (WLB4D_ENABLE_CUDNN).
bool cudnn_attention_built();

/// "" when cuDNN's fused SDPA takes head dim `head_dim` (see the file comment),
/// else why not, as a sentence fragment ("head dim 72 is not a multiple of 8").
std::string cudnn_head_dim_issue(int head_dim);

/// The kernel a run uses: kernel is "portable" or "cudnn"; why says what
/// decided it (for the banner), e.g. "auto: this build has no cuDNN".
struct AttentionKernelChoice {
  std::string kernel;
  std::string why;
};

/// Resolves model.attention_kernel.
/// \param requested  "auto", "portable" or "cudnn" (the deck value)
/// \param head_dim   model.d_model / model.heads (elements)
/// \param precision  train.precision ("fp32" or "bf16")
/// \param cudnn_built whether the cuDNN kernel is compiled in (normally
///                   cudnn_attention_built(); a parameter so both builds' rules
///                   are testable on one)
/// \throws ConfigError naming model.attention_kernel and the reason when
///   `cudnn` is asked for on a build without cuDNN, or for a head dim cuDNN
///   does not take (auto falls back to portable instead and says so in why),
///   or when `requested` is not one of the three.
AttentionKernelChoice resolve_attention_kernel(const std::string& requested, int head_dim,
                                               const std::string& precision, bool cudnn_built);

}  // namespace wlb::core

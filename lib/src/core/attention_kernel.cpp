// The deck rule of model.attention_kernel (see attention_kernel.hpp).
#include "wlb4d/core/attention_kernel.hpp"

#include "wlb4d/core/error.hpp"

#include <fmt/format.h>

namespace wlb::core {

bool cudnn_attention_built() {
#ifdef WLB4D_HAVE_CUDNN
  return true;
#else
  return false;
#endif
}

std::string cudnn_head_dim_issue(int head_dim) {
  if (head_dim % 8 != 0) return fmt::format("head dim {} is not a multiple of 8", head_dim);
  if (head_dim > 128) return fmt::format("head dim {} is above 128", head_dim);
  if (head_dim <= 0) return fmt::format("head dim {} is not positive", head_dim);
  return {};
}

AttentionKernelChoice resolve_attention_kernel(const std::string& requested, int head_dim,
                                               const std::string& precision, bool cudnn_built) {
  const std::string dim_issue = cudnn_head_dim_issue(head_dim);
  if (requested == "portable") return {"portable", "model.attention_kernel=portable"};
  if (requested == "cudnn") {
    if (!cudnn_built)
      throw ConfigError(
          "model.attention_kernel=cudnn: this build has no cuDNN attention (configure with -DWLB4D_ENABLE_CUDA=ON "
          "-DWLB4D_ENABLE_CUDNN=ON, or Spack +cuda +cudnn); use auto or portable");
    if (!dim_issue.empty())
      throw ConfigError(fmt::format(
          "model.attention_kernel=cudnn: cuDNN's fused attention does not take this model: {} (model.d_model/"
          "model.heads; it needs a multiple of 8 up to 128); refused, not falling back: use auto (falls back to "
          "the portable kernel) or portable",
          dim_issue));
    return {"cudnn", "model.attention_kernel=cudnn" +
                         std::string(precision == "bf16" ? "" : ", bf16 operands in an fp32 run")};
  }
  if (requested != "auto")
    throw ConfigError(fmt::format("model.attention_kernel={}: must be one of auto portable cudnn", requested));
  if (!cudnn_built) return {"portable", "auto: this build has no cuDNN"};
  if (!dim_issue.empty())
    return {"portable", fmt::format("auto: falls back from cuDNN, whose fused attention does not take {}", dim_issue)};
  if (precision != "bf16")
    return {"portable", fmt::format("auto: train.precision={} keeps the fp32 kernel (cuDNN's takes bf16 operands)",
                                    precision)};
  return {"cudnn", "auto: a cuDNN build, head dim " + std::to_string(head_dim) + ", train.precision=bf16"};
}

}  // namespace wlb::core

#pragma once
/// \file device_table.hpp
/// \brief The known devices: peak dense FLOP rates and memory, one table used
/// by the decks (plan.device), by wlb4d-plan (its GEMM rate, memory budget and
/// MFU) and by the trainer's MFU (the step line, the timing log, TensorBoard).
///
/// Every figure is the vendor's datasheet figure for one device (one GPU):
///   * fp32: FP32 (CUDA cores, no tensor cores) peak, TFLOP/s (10^12 FLOP/s);
///   * tf32, bf16: tensor-core peak **without** structured sparsity, TFLOP/s —
///     NVIDIA's datasheets print the with-sparsity figure (marked "*"); the
///     dense figure is half of it;
///   * memory_gb: device memory as the datasheet prints it, GB = 10^9 bytes.
/// Sources (NVIDIA datasheets, as published on nvidia.com):
///   * "NVIDIA A100 Tensor Core GPU" datasheet (A100 80GB SXM / A100 40GB):
///     FP32 19.5, TF32 156 (312*), BF16 312 (624*), 80 GB HBM2e / 40 GB HBM2;
///   * "NVIDIA H100 Tensor Core GPU" datasheet, H100 SXM: FP32 67, TF32 989*,
///     BF16 1,979*, 80 GB; H100 PCIe: FP32 51, TF32 756*, BF16 1,513*, 80 GB;
///   * "NVIDIA H200 Tensor Core GPU" datasheet, H200 SXM: FP32 67, TF32 989*,
///     BF16 1,979*, 141 GB HBM3e.
/// A device is added only with a datasheet for all four figures.
/// CPUs have no entry: their rate depends on cores, clock and BLAS, so a CPU
/// deck gives plan.flops_per_s (measured) and no MFU is reported.
///
/// The precision trained selects the peak: train.precision = fp32 -> fp32
/// (the trainer's fp32 GEMMs do not enable TF32 math), bf16 -> bf16.

#include "wlb4d/core/config.hpp"

#include <string>
#include <vector>

namespace wlb::core {

struct DeviceSpec {
  std::string key;          ///< the plan.device name: "h100"
  std::string name;         ///< "NVIDIA H100 SXM 80GB"
  double fp32_tflops = 0;   ///< FP32 peak (TFLOP/s)
  double tf32_tflops = 0;   ///< TF32 tensor-core dense peak (TFLOP/s)
  double bf16_tflops = 0;   ///< BF16 tensor-core dense peak (TFLOP/s)
  double memory_gb = 0;     ///< device memory (GB, 10^9 bytes)
  /// Matching a CUDA device name (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB
  /// HBM3"): every word of `match` occurs in it and none of `exclude`
  /// (case-insensitive substrings).
  std::vector<std::string> match, exclude;

  /// Peak FLOP/s (not TFLOP/s) at a train.precision: "fp32", "tf32" or "bf16".
  /// \throws ConfigError for another precision.
  double peak_flops(const std::string& precision) const;
  /// memory_gb in GiB (2^30 bytes): memory_gb · 10^9 / 2^30.
  double memory_gib() const;
};

/// The table, in the order `wlb4d --help` lists the keys.
const std::vector<DeviceSpec>& device_table();
/// "a100 a100-40gb h100 h100-pcie h200".
std::string device_keys();
/// The entry of a plan.device key; nullptr for "" or an unknown key.
const DeviceSpec* find_device(const std::string& key);
/// The entry whose match rule accepts a CUDA device name; nullptr when none.
const DeviceSpec* match_device_name(const std::string& cuda_name);

/// The sustained GEMM rate used when a deck gives no plan.flops_per_s and no
/// plan.device (FLOP/s): the planner's historical default, about 40% of an
/// H100 SXM's bf16 peak. Only the shape of the cost model depends on it when
/// the trainer plans with it (its coefficients are relative).
inline constexpr double kFallbackGemmFlops = 4e14;
/// The memory budget without plan.device_memory_gib or plan.device (GiB).
inline constexpr double kFallbackDeviceMemoryGib = 80;

/// The sustained GEMM rate of the deck at `precision` (FLOP/s per device):
///   bf16: plan.flops_per_s_bf16 when > 0, else plan.device's bf16 peak ·
///         plan.gemm_efficiency, else the fp32 rate below;
///   fp32: plan.flops_per_s when > 0, else plan.device's fp32 peak ·
///         plan.gemm_efficiency, else kFallbackGemmFlops.
double gemm_flops(const Config& cfg, const std::string& precision);
/// gemm_flops(cfg, cfg.train.precision).
double gemm_flops(const Config& cfg);
/// The peak of plan.device at train.precision (FLOP/s); 0 without a device.
double device_peak_flops(const Config& cfg);
/// plan.device_memory_gib when > 0, else plan.device's memory_gib(), else
/// kFallbackDeviceMemoryGib (GiB). The budget of a deck planned away from its
/// device (wlb4d-plan); the trainer uses device_memory_budget.
double device_memory_gib(const Config& cfg);

/// The device memory one rank may use (the memory model's upper bound,
/// pipeline::check_memory_fits) and where the figure came from.
struct MemoryBudget {
  double bytes = 0;    ///< bytes (not GiB)
  std::string source;  ///< e.g. "plan.device_memory_gib=40", "the device's total (detected)"
};
/// plan.device_memory_gib when > 0; else plan.device's memory; else
/// `detected_bytes` when > 0 (the running device's total,
/// detected_device_memory_bytes(): a CUDA build knows its device, so an
/// H200 is not budgeted as 80 GiB nor an A100 40GB above what it has); else
/// kFallbackDeviceMemoryGib. Given keys win: they describe the device the
/// deck was planned for, or reserve memory for something else.
MemoryBudget device_memory_budget(const Config& cfg, double detected_bytes);

/// The trainer's MFU peak (FLOP/s per device) and where it came from:
/// log.peak_tflops > 0 wins; else plan.device at train.precision; else
/// `detected_name` (a CUDA build's device, "" on a host build) matched
/// against the table; else 0 (no MFU).
struct PeakSource {
  double flops = 0;
  std::string source;  ///< "log.peak_tflops", "plan.device=h100 (bf16)", "detected NVIDIA H100 80GB HBM3 = h100 (bf16)", or why none
};
PeakSource mfu_peak(const Config& cfg, const std::string& detected_name);

/// The name of this process's CUDA device (cudaDeviceProp::name) on a build
/// whose Kokkos has CUDA; "" otherwise.
std::string detected_device_name();
/// Total memory of this process's CUDA device (bytes, cudaDeviceProp::
/// totalGlobalMem, the total cudaMemGetInfo reports); 0 on a host build or
/// when the CUDA runtime cannot tell.
double detected_device_memory_bytes();

}  // namespace wlb::core

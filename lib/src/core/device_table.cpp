// The known devices (device_table.hpp: figures and their datasheets).
#include "wlb4d/core/device_table.hpp"

#include "wlb4d/core/error.hpp"

#include <Kokkos_Macros.hpp>
#include <fmt/format.h>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cctype>

namespace wlb::core {

namespace {
std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

double DeviceSpec::peak_flops(const std::string& precision) const {
  if (precision == "fp32") return fp32_tflops * 1e12;
  if (precision == "tf32") return tf32_tflops * 1e12;
  if (precision == "bf16") return bf16_tflops * 1e12;
  throw ConfigError("device table: no peak for precision '" + precision + "' (fp32, tf32 or bf16)");
}

double DeviceSpec::memory_gib() const { return memory_gb * 1e9 / (1024.0 * 1024.0 * 1024.0); }

const std::vector<DeviceSpec>& device_table() {
  // Dense tensor-core figures are half the datasheets' with-sparsity ones.
  static const std::vector<DeviceSpec> table = {
      {"a100", "NVIDIA A100 SXM/PCIe 80GB", 19.5, 156, 312, 80, {"A100", "80GB"}, {}},
      {"a100-40gb", "NVIDIA A100 40GB", 19.5, 156, 312, 40, {"A100"}, {"80GB"}},
      {"h100", "NVIDIA H100 SXM 80GB", 67, 989.0 / 2, 1979.0 / 2, 80, {"H100"}, {"PCIe", "NVL"}},
      {"h100-pcie", "NVIDIA H100 PCIe 80GB", 51, 756.0 / 2, 1513.0 / 2, 80, {"H100", "PCIe"}, {}},
      {"h200", "NVIDIA H200 SXM 141GB", 67, 989.0 / 2, 1979.0 / 2, 141, {"H200"}, {"NVL"}},
  };
  return table;
}

std::string device_keys() {
  std::string s;
  for (const auto& d : device_table()) s += (s.empty() ? "" : " ") + d.key;
  return s;
}

const DeviceSpec* find_device(const std::string& key) {
  for (const auto& d : device_table())
    if (d.key == key) return &d;
  return nullptr;
}

const DeviceSpec* match_device_name(const std::string& cuda_name) {
  const std::string n = lower(cuda_name);
  for (const auto& d : device_table()) {
    bool ok = !d.match.empty();
    for (const auto& w : d.match) ok = ok && n.find(lower(w)) != std::string::npos;
    for (const auto& w : d.exclude) ok = ok && n.find(lower(w)) == std::string::npos;
    if (ok) return &d;
  }
  return nullptr;
}

double gemm_flops(const Config& cfg, const std::string& precision) {
  const auto& p = cfg.plan;
  const DeviceSpec* dev = find_device(p.device);
  if (precision == "bf16") {
    if (p.flops_per_s_bf16 > 0) return p.flops_per_s_bf16;
    if (dev) return dev->peak_flops("bf16") * p.gemm_efficiency;
    return gemm_flops(cfg, "fp32");
  }
  if (p.flops_per_s > 0) return p.flops_per_s;
  if (dev) return dev->peak_flops("fp32") * p.gemm_efficiency;
  return kFallbackGemmFlops;
}

double gemm_flops(const Config& cfg) { return gemm_flops(cfg, cfg.train.precision); }

double device_peak_flops(const Config& cfg) {
  const DeviceSpec* dev = find_device(cfg.plan.device);
  return dev ? dev->peak_flops(cfg.train.precision) : 0.0;
}

double device_memory_gib(const Config& cfg) {
  if (cfg.plan.device_memory_gib > 0) return cfg.plan.device_memory_gib;
  if (const DeviceSpec* dev = find_device(cfg.plan.device)) return dev->memory_gib();
  return kFallbackDeviceMemoryGib;
}

MemoryBudget device_memory_budget(const Config& cfg, double detected_bytes) {
  constexpr double gib = 1024.0 * 1024.0 * 1024.0;
  MemoryBudget out;
  if (cfg.plan.device_memory_gib > 0) {
    out.bytes = cfg.plan.device_memory_gib * gib;
    out.source = fmt::format("plan.device_memory_gib={:.4g} of device memory per rank", cfg.plan.device_memory_gib);
  } else if (const DeviceSpec* dev = find_device(cfg.plan.device)) {
    out.bytes = dev->memory_gib() * gib;
    out.source = fmt::format("{:.4g} GiB of device memory per rank, plan.device={}", dev->memory_gib(), dev->key);
  } else if (detected_bytes > 0) {
    out.bytes = detected_bytes;
    out.source = fmt::format("{:.4g} GiB of device memory per rank, the device's total (detected; "
                             "plan.device_memory_gib overrides it)",
                             detected_bytes / gib);
  } else {
    out.bytes = kFallbackDeviceMemoryGib * gib;
    out.source = fmt::format("{:.4g} GiB of device memory per rank, assumed: no plan.device_memory_gib, no "
                             "plan.device, and the device's total is unknown",
                             kFallbackDeviceMemoryGib);
  }
  return out;
}

PeakSource mfu_peak(const Config& cfg, const std::string& detected_name) {
  PeakSource out;
  const std::string& prec = cfg.train.precision;
  if (cfg.log.peak_tflops > 0) {
    out.flops = cfg.log.peak_tflops * 1e12;
    out.source = fmt::format("log.peak_tflops={}", cfg.log.peak_tflops);
  } else if (const DeviceSpec* dev = find_device(cfg.plan.device)) {
    out.flops = dev->peak_flops(prec);
    out.source = fmt::format("plan.device={} ({}, {} peak {} TFLOP/s)", dev->key, dev->name, prec, out.flops * 1e-12);
  } else if (const DeviceSpec* det = detected_name.empty() ? nullptr : match_device_name(detected_name)) {
    out.flops = det->peak_flops(prec);
    out.source = fmt::format("detected device '{}' = {} ({} peak {} TFLOP/s)", detected_name, det->key, prec,
                             out.flops * 1e-12);
  } else {
    out.source = detected_name.empty()
                     ? "no MFU: no log.peak_tflops and no plan.device (known devices: " + device_keys() + ")"
                     : "no MFU: the device '" + detected_name +
                           "' is not in the device table; give log.peak_tflops or plan.device (" + device_keys() +
                           ")";
  }
  return out;
}

std::string detected_device_name() {
#if defined(KOKKOS_ENABLE_CUDA)
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess) return prop.name;
#endif
  return {};
}

double detected_device_memory_bytes() {
#if defined(KOKKOS_ENABLE_CUDA)
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
    return double(prop.totalGlobalMem);
#endif
  return 0;
}

}  // namespace wlb::core

// The device table (core/device_table.hpp): datasheet figures, lookups by
// plan.device key and by CUDA device name, and how a deck resolves its GEMM
// rate, memory budget and MFU peak.
#include "wlb4d/core/device_table.hpp"

#include "wlb4d/core/error.hpp"

#include <gtest/gtest.h>

#include <set>

namespace {
using namespace wlb::core;

// NVIDIA datasheet figures, typed in here (TFLOP/s; the tensor-core ones are
// half the datasheets' with-sparsity figures), not read from the table.
TEST(DeviceTable, DatasheetFigures) {
  struct Want {
    const char* key;
    double fp32, tf32_sparse, bf16_sparse, gb;
  };
  for (const Want& w : {Want{"a100", 19.5, 312, 624, 80}, Want{"a100-40gb", 19.5, 312, 624, 40},
                        Want{"h100", 67, 989, 1979, 80}, Want{"h100-pcie", 51, 756, 1513, 80},
                        Want{"h200", 67, 989, 1979, 141}}) {
    const DeviceSpec* d = find_device(w.key);
    ASSERT_NE(d, nullptr) << w.key;
    EXPECT_DOUBLE_EQ(d->peak_flops("fp32"), w.fp32 * 1e12) << w.key;
    EXPECT_NEAR(d->peak_flops("tf32"), w.tf32_sparse / 2 * 1e12, 1e10) << w.key;
    EXPECT_NEAR(d->peak_flops("bf16"), w.bf16_sparse / 2 * 1e12, 1e10) << w.key;
    EXPECT_DOUBLE_EQ(d->memory_gib(), w.gb * 1e9 / 1073741824.0) << w.key;
  }
  EXPECT_THROW(find_device("h100")->peak_flops("fp8"), ConfigError);
  EXPECT_EQ(find_device(""), nullptr);
  EXPECT_EQ(find_device("H100"), nullptr);  // keys are lower case, as the deck spells them
  std::set<std::string> keys;
  for (const auto& d : device_table()) EXPECT_TRUE(keys.insert(d.key).second) << d.key;
  EXPECT_EQ(device_keys(), "a100 a100-40gb h100 h100-pcie h200");
}

// cudaDeviceProp::name as the driver reports it on these devices.
TEST(DeviceTable, MatchesCudaNames) {
  auto key = [](const char* name) {
    const DeviceSpec* d = match_device_name(name);
    return d ? d->key : std::string("none");
  };
  EXPECT_EQ(key("NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(key("NVIDIA H100 PCIe"), "h100-pcie");
  EXPECT_EQ(key("NVIDIA H100 NVL"), "none");  // other peaks: not in the table
  EXPECT_EQ(key("NVIDIA H200"), "h200");
  EXPECT_EQ(key("NVIDIA H200 NVL"), "none");
  EXPECT_EQ(key("NVIDIA A100-SXM4-80GB"), "a100");
  EXPECT_EQ(key("NVIDIA A100 80GB PCIe"), "a100");
  EXPECT_EQ(key("NVIDIA A100-SXM4-40GB"), "a100-40gb");
  EXPECT_EQ(key("NVIDIA L40S"), "none");
  EXPECT_EQ(key("Tesla V100-SXM2-32GB"), "none");
  EXPECT_EQ(key(""), "none");
}

TEST(DeviceTable, GemmRateResolution) {
  Config c;  // no device, no rate: the fallback at either precision
  EXPECT_EQ(gemm_flops(c, "fp32"), kFallbackGemmFlops);
  EXPECT_EQ(gemm_flops(c, "bf16"), kFallbackGemmFlops);
  EXPECT_EQ(device_peak_flops(c), 0);
  EXPECT_EQ(device_memory_gib(c), kFallbackDeviceMemoryGib);
  c.plan.flops_per_s = 5.8e10;  // a CPU deck: the measured rate, bf16 falls back to it
  EXPECT_EQ(gemm_flops(c, "bf16"), 5.8e10);
  c = Config{};
  c.plan.device = "h200";
  c.plan.gemm_efficiency = 0.5;
  EXPECT_DOUBLE_EQ(gemm_flops(c, "fp32"), 67e12 * 0.5);
  EXPECT_DOUBLE_EQ(gemm_flops(c, "bf16"), 989.5e12 * 0.5);
  EXPECT_DOUBLE_EQ(device_memory_gib(c), 141e9 / 1073741824.0);
  c.train.precision = "bf16";
  EXPECT_DOUBLE_EQ(gemm_flops(c), 989.5e12 * 0.5);
  EXPECT_DOUBLE_EQ(device_peak_flops(c), 989.5e12);
  c.train.precision = "fp32";
  EXPECT_DOUBLE_EQ(device_peak_flops(c), 67e12);
  // Given keys win over the device's figures.
  c.plan.flops_per_s = 1e13;
  c.plan.flops_per_s_bf16 = 2e14;
  c.plan.device_memory_gib = 100;
  EXPECT_EQ(gemm_flops(c, "fp32"), 1e13);
  EXPECT_EQ(gemm_flops(c, "bf16"), 2e14);
  EXPECT_EQ(device_memory_gib(c), 100);
}

TEST(DeviceTable, MemoryBudgetOrder) {
  constexpr double gib = 1073741824.0;
  const double h200_total = 150754820096.0;  // cudaDeviceProp::totalGlobalMem of an H200 (140.4 GiB)
  Config c;
  // No key, no detected device (a host build): the fallback, said to be assumed.
  auto b = device_memory_budget(c, 0);
  EXPECT_EQ(b.bytes, kFallbackDeviceMemoryGib * gib);
  EXPECT_NE(b.source.find("assumed"), std::string::npos) << b.source;
  // A CUDA build without keys: the device's own total, not 80 GiB.
  b = device_memory_budget(c, h200_total);
  EXPECT_EQ(b.bytes, h200_total);
  EXPECT_NE(b.source.find("detected"), std::string::npos) << b.source;
  // plan.device over the detected total; plan.device_memory_gib over both.
  c.plan.device = "a100-40gb";
  b = device_memory_budget(c, h200_total);
  EXPECT_DOUBLE_EQ(b.bytes, 40e9);
  EXPECT_NE(b.source.find("plan.device=a100-40gb"), std::string::npos) << b.source;
  c.plan.device_memory_gib = 20;
  b = device_memory_budget(c, h200_total);
  EXPECT_EQ(b.bytes, 20 * gib);
  EXPECT_NE(b.source.find("plan.device_memory_gib=20"), std::string::npos) << b.source;
  // wlb4d-plan's budget (device_memory_gib) is unchanged: no detection there.
  EXPECT_EQ(device_memory_gib(Config{}), kFallbackDeviceMemoryGib);
}

TEST(DeviceTable, MfuPeakOrder) {
  Config c;
  EXPECT_EQ(mfu_peak(c, "").flops, 0);
  EXPECT_NE(mfu_peak(c, "").source.find("no MFU"), std::string::npos);
  EXPECT_NE(mfu_peak(c, "Some GPU").source.find("'Some GPU' is not in the device table"), std::string::npos);
  // A detected device, at the precision trained.
  EXPECT_DOUBLE_EQ(mfu_peak(c, "NVIDIA H100 80GB HBM3").flops, 67e12);
  c.train.precision = "bf16";
  EXPECT_DOUBLE_EQ(mfu_peak(c, "NVIDIA H100 80GB HBM3").flops, 989.5e12);
  // plan.device over the detected device.
  c.plan.device = "a100";
  EXPECT_DOUBLE_EQ(mfu_peak(c, "NVIDIA H100 80GB HBM3").flops, 312e12);
  EXPECT_NE(mfu_peak(c, "").source.find("plan.device=a100"), std::string::npos);
  // log.peak_tflops over everything.
  c.log.peak_tflops = 0.02;
  EXPECT_DOUBLE_EQ(mfu_peak(c, "NVIDIA H100 80GB HBM3").flops, 0.02e12);
  EXPECT_EQ(mfu_peak(c, "").source, "log.peak_tflops=0.02");
}

TEST(DeviceTable, DeckKeys) {
  const auto cl = [](std::vector<std::string> args) {
    std::vector<const char*> argv{"wlb4d"};
    for (auto& a : args) argv.push_back(a.c_str());
    return parse_command_line(int(argv.size()), argv.data()).config;
  };
  EXPECT_EQ(cl({"--plan.device=h100"}).plan.device, "h100");
  try {
    cl({"--plan.device=h300"});
    FAIL() << "plan.device=h300 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.device=h300 must be empty or one of a100"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cl({"--plan.gemm_efficiency=0"}), ConfigError);
  EXPECT_THROW(cl({"--plan.gemm_efficiency=1.5"}), ConfigError);
  EXPECT_THROW(cl({"--plan.flops_per_s=-1"}), ConfigError);
}

}  // namespace

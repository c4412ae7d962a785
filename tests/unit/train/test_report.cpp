// The step line and the detail line (train/report.hpp), formatted from
// hand-made records: every figure below is computed here from the inputs.
#include "wlb4d/train/report.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {
using namespace wlb;

train::StepResult result() {
  train::StepResult r;
  r.step = 9;  // the 10th step
  r.loss = 2.5;
  r.lr = 3e-4;
  r.grad_norm = 1.25;
  r.tokens = 4096;
  r.seconds = 0.5;
  r.samples = 1234;
  r.skipped_steps = 2;
  r.record.tokens_seen = 40960;
  r.record.attn_imbalance = 1.5;
  r.record.latency_imbalance = 1.25;
  return r;
}

std::vector<io::TimingRecord> records() {
  std::vector<io::TimingRecord> all(2);
  all[0].rss_mib = 100;
  all[1].rss_mib = 300;
  all[0].mem_measured = 64LL << 20;
  all[1].mem_measured = 32LL << 20;
  all[0].time[io::kForward] = 0.1;
  all[0].time[io::kBackward] = 0.2;  // compute 300 ms
  all[1].time[io::kForward] = 0.2;
  all[1].time[io::kBackward] = 0.3;  // compute 500 ms
  all[0].compute_cpu = 1;
  all[1].compute_cpu = 3;  // cpu imbalance 3 / 2 = 1.5
  return all;
}

TEST(StepLine, FieldsAndWidth) {
  train::Throughput w;
  w.tokens = 8192;
  w.seconds = 2;
  w.flops = 8e12;  // over 2 devices and 2 s: 2 TFLOP/s per device
  train::StepLineContext ctx;
  ctx.total_steps = 100;
  ctx.devices = 2;
  ctx.peak_tflops = 8;  // MFU 2/8 = 25%
  ctx.mem_capacity_bytes = 1200.0 * 1048576;  // the max RSS 300 MiB = 25%
  ctx.timestamp = "2026-12-05 12:34:56";
  const std::string line = train::format_step_line(result(), records(), w, ctx);
  EXPECT_EQ(line,
            "[2026-12-05 12:34:56] step    10/100 | loss 2.5000 lr 3.00e-04 gnorm 1.250 | samples 1.2k skipped 2 | "
            "2048 tok/s/dev 2 TFLOP/s/dev MFU 25% | mem 25.0% | step 500 ms");
  EXPECT_LE(line.size(), 165u);
  // No peak: no MFU field; no capacity: memory in MiB; a device build: the Kokkos peak.
  ctx.peak_tflops = 0;
  ctx.mem_capacity_bytes = 0;
  const std::string bare = train::format_step_line(result(), records(), w, ctx);
  EXPECT_EQ(bare.find("MFU"), std::string::npos) << bare;
  EXPECT_NE(bare.find("2 TFLOP/s/dev | mem 300 MiB |"), std::string::npos) << bare;
  ctx.mem_on_device = true;
  EXPECT_NE(train::format_step_line(result(), records(), w, ctx).find("| mem 64 MiB |"), std::string::npos);
  ctx.mem_capacity_bytes = 256.0 * 1048576;
  EXPECT_NE(train::format_step_line(result(), records(), w, ctx).find("| mem 25.0% |"), std::string::npos);
}

TEST(StepLine, DetailLine) {
  train::StepLineContext ctx;
  ctx.total_steps = 100;
  ctx.elapsed = 3725;  // 1:02:05
  ctx.eta = 59;
  ctx.mem_capacity_bytes = 2.0 * 1073741824;
  ctx.timestamp = "2026-12-05 12:34:56";
  const std::string d = train::format_detail_line(result(), records(), ctx);
  EXPECT_EQ(d,
            "[2026-12-05 12:34:56] detail  10/100 | elapsed 1:02:05 ETA 0:00:59 | tokens 41.0k (4096/step) | mem 300 "
            "MiB of 2.00 GiB (host MemTotal / ranks on the host) | compute min/mean/max 300/400/500 ms | imbalance attn "
            "1.50 lat 1.25 cpu 1.50 | comm exposed/in flight dp 0.0/0.0 tp 0.0/0.0 ms");
}

TEST(StepLine, DetailDue) {
  // every 4, a line per step over 10 steps: 1 (first), 5, 9, 10 (last).
  std::vector<int> got;
  std::int64_t last = 0;
  for (int s = 1; s <= 10; ++s)
    if (train::detail_due(s, last, s == 1, s == 10, 4)) {
      got.push_back(s);
      last = s;
    }
  EXPECT_EQ(got, (std::vector<int>{1, 5, 9, 10}));
  EXPECT_FALSE(train::detail_due(1, 0, true, true, 0));  // 0: never
  // print_every 5, every 3: each line after the first is >= 3 steps later.
  EXPECT_TRUE(train::detail_due(10, 5, false, false, 3));
  EXPECT_FALSE(train::detail_due(7, 5, false, false, 3));
}

TEST(StepLine, Timestamp) {
  const std::string t = train::step_timestamp(std::time(nullptr));
  ASSERT_EQ(t.size(), 19u) << t;
  EXPECT_EQ(t[4], '-');
  EXPECT_EQ(t[10], ' ');
  EXPECT_EQ(t[13], ':');
}

}  // namespace

// A blend's sources as TensorBoard tag components and their scalars
// (log.tensorboard_dir with a blended data.train).
TEST(SourceScalars, TagsFromTheDeckNames) {
  EXPECT_EQ(train::source_tag(1, "runs/web/web-*.h5"), "1_web");
  EXPECT_EQ(train::source_tag(2, "code.h5"), "2_code");
  EXPECT_EQ(train::source_tag(3, "a/b/c-[0-9]?.h5 d.h5"), "3_c-0-9");  // the first path; glob characters dropped
  EXPECT_EQ(train::source_tag(4, "*.h5"), "4");
  EXPECT_EQ(train::source_tag(5, "dir/tiny train (1).h5"), "5_tiny");  // a space ends the first path
}

TEST(SourceScalars, TokensAndDrawnShare) {
  train::StepResult last;
  EXPECT_TRUE(train::source_scalars(last, {}).empty());  // one file: no per-source scalars
  last.source_tokens = {700, 324};
  last.source_drawn = {7000, 3000};
  const auto v = train::source_scalars(last, {"web-*.h5", "code.h5"});
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].tag, "data/source/1_web/tokens");
  EXPECT_EQ(v[0].value, 700.0);
  EXPECT_EQ(v[1].tag, "data/source/1_web/drawn_share");
  EXPECT_DOUBLE_EQ(v[1].value, 0.7);
  EXPECT_EQ(v[2].tag, "data/source/2_code/tokens");
  EXPECT_EQ(v[3].tag, "data/source/2_code/drawn_share");
  EXPECT_DOUBLE_EQ(v[3].value, 0.3);
  EXPECT_THROW(train::source_scalars(last, {"web-*.h5"}), std::invalid_argument);
}

// Local batch materialisation (pipeline::read_micro_batch + model::build_host_micro_batch): labels never cross a span, positions restart,
// kv ranges follow the document-causal mask, CP slices are consistent.
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/pipeline/executor.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace wlb;

namespace {
std::string make_dataset() {
  const std::string path = "test_batch_ds.h5";
  data::TokenDatasetWriter w(path, "bytes", 257, 256, "test", "");
  w.append({10, 11, 12, 13});        // doc 0: 4 tokens + EOS
  w.append({20, 21});                // doc 1: 2 tokens + EOS
  w.append({30, 31, 32, 33, 34, 35});  // doc 2: 6 tokens + EOS
  w.finish();
  return path;
}
}  // namespace

TEST(Batch, LabelsPositionsAndKvRanges) {
  auto ds = data::TokenDataset::open(make_dataset());
  ASSERT_EQ(ds.doc_length(0), 5);
  balance::MicroBatch mb;
  mb.spans = {{0, 0, 5}, {2, 2, 3}, {1, 0, 3}};  // whole doc 0, a piece of doc 2, whole doc 1
  auto b = pipeline::read_micro_batch(ds, mb);
  ASSERT_EQ(b.size(), 11);
  const std::vector<std::int32_t> tokens{10, 11, 12, 13, 256, 32, 33, 34, 20, 21, 256};
  const std::vector<std::int32_t> labels{11, 12, 13, 256, -1, 33, 34, -1, 21, 256, -1};
  const std::vector<std::int32_t> pos{0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2};
  const std::vector<std::int32_t> lo{0, 0, 0, 0, 0, 5, 5, 5, 8, 8, 8};
  EXPECT_EQ(b.token_ids, tokens);
  EXPECT_EQ(b.labels, labels);
  EXPECT_EQ(b.positions, pos);
  EXPECT_EQ(b.kv_lo, lo);
  for (std::int64_t i = 0; i < b.size(); ++i) EXPECT_EQ(b.kv_hi[i], i);
  EXPECT_EQ(b.target_tokens, mb.target_tokens());
  EXPECT_EQ(b.target_tokens, 8);
  // A CP slice keeps the packed-order kv ranges and labels of its tokens.
  const std::vector<std::int64_t> slice{1, 4, 6, 9};
  auto s = pipeline::read_micro_batch(ds, mb, &slice);
  EXPECT_EQ(s.token_ids, (std::vector<std::int32_t>{11, 256, 33, 21}));
  EXPECT_EQ(s.labels, (std::vector<std::int32_t>{12, -1, 34, 256}));
  EXPECT_EQ(s.kv_lo, (std::vector<std::int32_t>{0, 0, 5, 8}));
  EXPECT_EQ(s.kv_hi, (std::vector<std::int32_t>{1, 4, 6, 9}));
  EXPECT_EQ(s.target_tokens, 3);
  // An empty slice is legal (a CP rank without tokens).
  const std::vector<std::int64_t> none;
  const auto e = pipeline::read_micro_batch(ds, mb, &none);
  EXPECT_EQ(e.size(), 0);
  EXPECT_TRUE(e.has_ids);
  // attention pairs: Σ over local tokens of (kv_hi - kv_lo + 1) = Σ_docs d(d+1)/2.
  EXPECT_EQ(b.attention_pairs, 5 * 6 / 2 + 3 * 4 / 2 + 3 * 4 / 2);
  // A span outside its document is a clear error.
  balance::MicroBatch bad;
  bad.spans = {{1, 2, 5}};
  EXPECT_THROW(pipeline::read_micro_batch(ds, bad), core::DataError);
}

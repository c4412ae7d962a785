// Shards and blends: the split value, glob resolution, and the weighted
// document stream against a naive re-implementation of its rule.
#include "test_helpers.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/hash.hpp"
#include "wlb4d/core/sources.hpp"
#include "wlb4d/data/blend.hpp"
#include "wlb4d/data/dataset.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace wlb;
using namespace wlb::data;

namespace {

/// A dataset of `docs` documents with seeded lengths in [lo, hi] (EOS included).
std::string write_source(const std::string& name, int docs, int lo, int hi, std::uint64_t seed) {
  const auto path = test::scratch(name).string();
  TokenDatasetWriter w(path, "bytes", 257, 256, "blend unit test", "");
  std::mt19937_64 g(seed);
  for (int d = 0; d < docs; ++d) {
    const int len = lo + int(g() % std::uint64_t(hi - lo + 1));
    w.append(std::vector<token_t>(std::size_t(len - 1), token_t(65 + d % 26)));
  }
  w.finish();
  return path;
}

struct Blend2 {
  std::string web, code;
  TokenDataset ds;
  std::vector<std::int64_t> first;
};
Blend2 two_sources() {
  Blend2 b{write_source("blend-web.h5", 120, 2, 60, 1), write_source("blend-code.h5", 40, 20, 200, 2),
           TokenDataset::open(std::vector<std::string>{test::scratch("blend-web.h5").string(),
                                                       test::scratch("blend-code.h5").string()}),
           {}};
  b.first = {0, b.ds.file_first_doc(1), b.ds.num_docs()};
  return b;
}

void expect_config_error(const std::string& value, const std::string& fragment) {
  try {
    core::parse_sources("data.train", value);
    ADD_FAILURE() << "expected ConfigError for '" << value << "'";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data.train"), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(SplitSources, FormsOfTheValue) {
  auto one = core::parse_sources("data.train", "runs/train.h5");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].weight, 1.0);
  EXPECT_EQ(one[0].paths, std::vector<std::string>{"runs/train.h5"});
  auto list = core::parse_sources("data.train", " a.h5  b.h5\tc.h5 ");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].paths.size(), 3u);
  auto blend = core::parse_sources("data.train", "0.7 web-*.h5 0.3 code-0.h5 code-1.h5");
  ASSERT_EQ(blend.size(), 2u);
  EXPECT_DOUBLE_EQ(blend[0].weight, 0.7);
  EXPECT_EQ(blend[0].paths, std::vector<std::string>{"web-*.h5"});
  EXPECT_EQ(blend[1].paths, (std::vector<std::string>{"code-0.h5", "code-1.h5"}));
  EXPECT_EQ(core::parse_sources("data.train", "2 a.h5 1e0 b.h5").size(), 2u);
}

TEST(SplitSources, BadValuesNameTheKeyAndTheRule) {
  expect_config_error("", "must name a token dataset file");
  expect_config_error("0.7 a.h5 0 b.h5", "weight '0' for source 2: a weight must be > 0");
  expect_config_error("0.7 a.h5 -0.3 b.h5", "weight '-0.3' for source 2: a weight must be > 0");
  expect_config_error("a.h5 0.3 b.h5", "path 'a.h5' before the first weight");
  expect_config_error("0.7 a.h5 0.3", "followed by no path");
  expect_config_error("0.7 0.3 a.h5", "followed by no path");
}

TEST(SplitSources, GlobsExpandSortedAndAnEmptyGlobIsAnError) {
  for (const char* n : {"glob-b-1.h5", "glob-b-0.h5", "glob-a.h5"}) test::write_file(test::scratch(n), "x");
  const std::string dir = test::scratch("").string();
  auto r = resolve_sources("data.train", core::parse_sources("data.train", "3 " + dir + "glob-b-*.h5 1 " + dir +
                                                                               "glob-a.h5"));
  ASSERT_EQ(r.files.size(), 3u);
  EXPECT_EQ(r.files[0], dir + "glob-b-0.h5");
  EXPECT_EQ(r.files[1], dir + "glob-b-1.h5");
  EXPECT_EQ(r.first_file, (std::vector<std::int64_t>{0, 2, 3}));
  EXPECT_DOUBLE_EQ(r.weights[0], 0.75);
  try {
    resolve_sources("data.train", core::parse_sources("data.train", "1 " + dir + "glob-a.h5 1 " + dir + "nope-*.h5"));
    ADD_FAILURE() << "expected DataError";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("data.train: source 2: '" + dir + "nope-*.h5' matches no file"),
              std::string::npos)
        << e.what();
  }
}

TEST(BlendedStream, SharesFollowTheWeightsOverAThousandDraws) {
  auto b = two_sources();
  BlendedStream s(b.ds, b.first, {0.7, 0.3}, 42, true);
  std::int64_t tok[2] = {0, 0}, docs[2] = {0, 0}, max_len = 0;
  for (int i = 0; i < 1000; ++i) {
    const auto d = s.next();
    const int src = s.source_of(d.doc_id);
    tok[src] += d.length;
    ++docs[src];
    max_len = std::max(max_len, d.length);
    EXPECT_EQ(d.length, b.ds.doc_length(d.doc_id));
  }
  const double total = double(tok[0] + tok[1]);
  // The rule keeps every source within one document of its weight (far
  // inside the sampling error of a random draw, sqrt(0.21/1000) ~ 1.4% of documents).
  EXPECT_LE(std::abs(double(tok[0]) - 0.7 * total), double(max_len)) << tok[0] << " of " << total;
  EXPECT_NEAR(double(tok[0]) / total, 0.7, 0.01);
  EXPECT_EQ(s.tokens_drawn()[0], tok[0]);
  EXPECT_EQ(s.state().docs[1], docs[1]);
  // Several epochs of each source went by: every document of an epoch once.
  EXPECT_GE(s.stream(0).epoch(), 1);
  EXPECT_GE(s.stream(1).epoch(), 1);
}

TEST(BlendedStream, EqualsANaiveImplementationOfTheRule) {
  auto b = two_sources();
  BlendedStream s(b.ds, b.first, {2.0, 1.0}, 7, true);
  // Reference: two plain streams with the documented seeds, the argmax written out.
  DocumentStream web(b.ds, 0, b.first[1], 7, true);
  DocumentStream code(b.ds, b.first[1], b.first[2] - b.first[1], core::splitmix64(7 + (std::uint64_t(1) << 32)), true);
  double t0 = 0, t1 = 0;
  for (int i = 0; i < 600; ++i) {
    const double T = t0 + t1;
    const bool pick_code = (1.0 / 3.0) * T - t1 > (2.0 / 3.0) * T - t0;
    const auto want = pick_code ? code.next() : web.next();
    (pick_code ? t1 : t0) += double(want.length);
    ASSERT_EQ(s.next(), want) << "draw " << i;
  }
}

TEST(BlendedStream, OneSourceIsTheStreamOfOneFile) {
  auto b = two_sources();
  BlendedStream s(b.ds, {0, b.ds.num_docs()}, {1.0}, 99, true);
  DocumentStream ref(b.ds, 99, true);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(s.next(), ref.next()) << i;
}

TEST(BlendedStream, SaveAndLoadContinueTheExactSequence) {
  auto b = two_sources();
  BlendedStream ref(b.ds, b.first, {0.7, 0.3}, 5, true);
  std::vector<DocumentStream::Doc> want;
  for (int i = 0; i < 400; ++i) want.push_back(ref.next());
  for (int k : {0, 1, 57, 160, 399}) {
    BlendedStream a(b.ds, b.first, {0.7, 0.3}, 5, true);
    for (int i = 0; i < k; ++i) a.next();
    const auto saved = a.save();
    BlendedStream c(b.ds, b.first, {0.7, 0.3}, 5, true);
    c.load(saved);
    EXPECT_EQ(c.state(), a.state());
    for (int i = k; i < 400; ++i) ASSERT_EQ(c.next(), want[std::size_t(i)]) << "resumed at " << k << ", draw " << i;
  }
  BlendedStream one(b.ds, {0, b.ds.num_docs()}, {1.0}, 5, true);
  EXPECT_THROW(one.load(ref.save()), core::DataError);  // another number of sources
  EXPECT_THROW(ref.load({2, 0, 0}), core::DataError);    // damaged
}

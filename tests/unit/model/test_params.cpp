// Parameter registry: names, shapes, shards, flags, and layout-independent
// initialisation (every TP/PP shard equals the matching slice of the 1-rank model).
#include "test_util.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/model/params.hpp"

#include <gtest/gtest.h>

#include <cmath>

using namespace wlb;
using namespace wlb::model;
using namespace wlb::test;

namespace {

// 3 layers; FFN 25: uneven FFN shards on tp = 2.
const core::ModelConfig kModel = tiny_model(3, 16, 4, 2, 25);

}  // namespace

TEST(ModelParams, SplitRangeUneven) {
  using R = std::pair<std::int64_t, std::int64_t>;
  EXPECT_EQ(split_range(97, 2, 0), R(0, 49));
  EXPECT_EQ(split_range(97, 2, 1), R(49, 48));
  EXPECT_EQ(split_range(10, 4, 3), R(8, 2));
  EXPECT_THROW(split_range(10, 2, 2), std::invalid_argument);
}

TEST(ModelParams, NamesShapesOrderFlags) {
  const auto cfg = kModel;
  ParamRegistry<float> reg(cfg, 97, ModelShard{});
  ASSERT_EQ(reg.size(), 1u + 9u * 3u + 2u);
  EXPECT_EQ(reg[0].name, "embed.weight");
  EXPECT_EQ(reg[1].name, "layers.0.attn_norm.weight");
  EXPECT_EQ(reg[2].name, "layers.0.attn.wq");
  EXPECT_EQ(reg[9].name, "layers.0.mlp.w_down");
  EXPECT_EQ(reg[reg.size() - 2].name, "final_norm.weight");
  EXPECT_EQ(reg[reg.size() - 1].name, "lm_head.weight");
  const auto& wk = reg.at("layers.2.attn.wk");
  EXPECT_EQ(wk.global_shape, (std::vector<std::int64_t>{2 * 4, 16}));
  EXPECT_EQ(reg.at("layers.1.attn.wo").global_shape, (std::vector<std::int64_t>{16, 16}));
  EXPECT_EQ(reg.at("layers.1.mlp.w_down").global_shape, (std::vector<std::int64_t>{16, 25}));
  EXPECT_TRUE(wk.decay);
  EXPECT_FALSE(wk.tp_replicated);
  EXPECT_FALSE(reg.at("final_norm.weight").decay);
  EXPECT_TRUE(reg.at("final_norm.weight").tp_replicated);
  std::int64_t total = 0;
  for (const auto& p : reg) {
    EXPECT_EQ(p.offset, std::size_t(total)) << p.name;
    EXPECT_EQ(p.value.data(), reg.values().data() + p.offset);
    total += p.local_numel();
  }
  EXPECT_EQ(total, reg.local_numel());
  EXPECT_EQ(reg.find("layers.3.attn.wq"), nullptr);
  EXPECT_THROW(reg.at("nope"), std::out_of_range);
}

TEST(ModelParams, ShardValidationErrors) {
  auto cfg = kModel;
  ModelShard s;
  s.tp_size = 4;  // kv_heads = 2 is not divisible by 4
  EXPECT_THROW(ParamRegistry<float>(cfg, 97, s), core::ConfigError);
  s.tp_size = 3;  // heads = 4
  EXPECT_THROW(ParamRegistry<float>(cfg, 97, s), core::ConfigError);
  ModelShard empty;
  empty.layer_begin = 2;
  empty.layer_end = 2;
  EXPECT_THROW(ParamRegistry<float>(cfg, 97, empty), core::ConfigError);
}

TEST(ModelParams, InitInvariantUnderTensorAndPipelineSharding) {
  const auto cfg = kModel;
  const std::uint64_t seed = 42;
  ParamRegistry<double> full(cfg, 97, ModelShard{});
  full.init_parameters(seed);
  for (int tp = 1; tp <= 2; ++tp) {
    for (int r = 0; r < tp; ++r) {
      ModelShard s;
      s.tp_rank = r;
      s.tp_size = tp;
      s.layer_begin = 1;  // a middle/last pipeline stage: layers [1, 3) + head
      s.layer_end = 3;
      s.embedding = false;
      ParamRegistry<double> part(cfg, 97, s);
      part.init_parameters(seed);
      EXPECT_EQ(part.find("embed.weight"), nullptr);
      EXPECT_EQ(part.find("layers.0.attn.wq"), nullptr);
      for (const auto& p : part) {
        const auto& g = full.at(p.name);
        const auto hv = host_vec(p.value), hg = host_vec(g.value);
        for (std::int64_t i = 0; i < p.local_numel(); ++i)
          ASSERT_EQ(hv[i], hg[p.global_index(i)]) << p.name << " tp=" << tp << " rank " << r << " local " << i;
        if (tp == 2 && p.name == "lm_head.weight") {
          EXPECT_EQ(p.local_shape[0], r == 0 ? 49 : 48);
          EXPECT_EQ(p.shard_offset, r == 0 ? 0 : 49);
        }
        if (tp == 2 && p.name == "layers.1.attn.wo") {
          EXPECT_EQ(p.shard_dim, 1);
          EXPECT_EQ(p.local_shape, (std::vector<std::int64_t>{16, 8}));
        }
        if (tp == 2 && p.name == "layers.1.mlp.w_up") {
          EXPECT_EQ(p.local_shape[0], r == 0 ? 13 : 12);
        }
      }
    }
  }
}

TEST(ModelParams, InitStatistics) {
  auto cfg = kModel;
  cfg.d_model = 64;
  cfg.ffn_hidden = 256;
  ParamRegistry<double> reg(cfg, 300, ModelShard{});
  reg.init_parameters(7);
  auto stats = [&](const std::string& n) {
    const auto v = host_vec(reg.at(n).value);
    double s = 0, s2 = 0;
    for (double x : v) {
      s += x;
      s2 += x * x;
    }
    const double m = s / v.size();
    return std::make_pair(m, std::sqrt(s2 / v.size() - m * m));
  };
  const auto e = stats("embed.weight");  // 19200 draws
  EXPECT_NEAR(e.first, 0.0, 0.02 * 0.05);
  EXPECT_NEAR(e.second, 0.02, 0.02 * 0.03);
  const auto wd = stats("layers.0.mlp.w_down");  // scaled by 1/sqrt(2·layers)
  EXPECT_NEAR(wd.second, 0.02 / std::sqrt(6.0), 0.02 / std::sqrt(6.0) * 0.05);
  for (double x : host_vec(reg.at("layers.2.mlp_norm.weight").value)) EXPECT_EQ(x, 1.0);
  // The generator is a pure function of (seed, name, index).
  EXPECT_EQ(init_normal(1, "a", 5), init_normal(1, "a", 5));
  EXPECT_NE(init_normal(1, "a", 5), init_normal(2, "a", 5));
  EXPECT_NE(init_normal(1, "a", 5), init_normal(1, "b", 5));
}

// param_shapes (what checkpoint readers check files against) lists exactly the
// full registry's tensors, and a TP shard's local shapes are split_range of it.
TEST(ModelParams, ParamShapesListTheFullRegistry) {
  const auto cfg = kModel;
  const auto shapes = param_shapes(cfg, 97);
  ParamRegistry<float> reg(cfg, 97, ModelShard{});
  ASSERT_EQ(shapes.size(), reg.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(shapes[i].name, reg[i].name);
    EXPECT_EQ(shapes[i].global_shape, reg[i].global_shape) << reg[i].name;
    EXPECT_EQ(shapes[i].shard_dim, reg[i].shard_dim) << reg[i].name;
  }
  ModelShard s1;
  s1.tp_rank = 1;
  s1.tp_size = 2;
  ParamRegistry<float> half(cfg, 97, s1);
  EXPECT_EQ(half.at("embed.weight").local_shape, (std::vector<std::int64_t>{48, 16}));
  EXPECT_EQ(half.at("embed.weight").shard_offset, 49);
  EXPECT_EQ(half.at("layers.0.mlp.w_down").local_shape, (std::vector<std::int64_t>{16, 12}));
  EXPECT_EQ(half.at("layers.0.mlp.w_down").shard_offset, 13);
  EXPECT_EQ(half.at("layers.0.attn.wk").local_shape, (std::vector<std::int64_t>{4, 16}));
  EXPECT_EQ(half.at("layers.0.attn.wk").shard_offset, 4);
}

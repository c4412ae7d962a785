// Deck parsing: every key parses, overrides win, each class of bad input
// gives its own message naming key, value and rule.
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/error.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>

using namespace wlb::core;

namespace {
// Expects a ConfigError whose message contains every fragment.
template <class F>
void expect_config_error(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    for (const auto& frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << "message: " << msg << "\nmissing: " << frag;
  }
}
}  // namespace

TEST(Config, DefaultsAreValid) { EXPECT_NO_THROW(validate(Config{})); }

TEST(Config, EveryKeyParsesFromIni) {
  const std::string ini = R"(
[model]
layers = 5
d_model = 96
heads = 6
kv_heads = 3
ffn_hidden = 120
rope_theta = 500000
norm_eps = 1e-6
init_std = 0.01
[parallel]
dp = 2
pp = 2
cp = 1
tp = 3
schedule = interleaved
virtual_stages = 2
print_coords = true
[data]
train = a.h5
val = b.h5
shuffle = false
max_docs = 10
[balance]
packer = wlb
sharding = adaptive
max_tokens = 512
max_delay = 3
outlier_thresholds = 300 400
calibrate = false
cost_a = 1e-9
cost_b = 2e-12
cost_c = 1e-6
[optim]
lr = 0.001
min_lr = 0.0001
warmup_steps = 7
beta1 = 0.8
beta2 = 0.9
eps = 1e-7
weight_decay = 0.05
grad_clip = 2
[train]
steps = 11
micro_batches = 6
max_seq_len = 128
seed = 99
eval_every = 5
eval_tokens = 1000
print_every = 2
[checkpoint]
dir = ck
every = 4
every_minutes = 1.5
keep = 2
resume = never
at_end = false
[log]
timing_file = t.h5
csv_file = t.csv
level = debug
[comm]
wait = block
backend = mpi
)";
  Config c = parse_deck_text(ini);
  EXPECT_EQ(c.model.layers, 5);
  EXPECT_EQ(c.model.d_model, 96);
  EXPECT_EQ(c.model.heads, 6);
  EXPECT_EQ(c.model.kv_heads, 3);
  EXPECT_EQ(c.model.ffn_hidden, 120);
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 500000);
  EXPECT_DOUBLE_EQ(c.model.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.model.init_std, 0.01);
  EXPECT_EQ(c.parallel.dp, 2);
  EXPECT_EQ(c.parallel.pp, 2);
  EXPECT_EQ(c.parallel.tp, 3);
  EXPECT_EQ(c.parallel.schedule, "interleaved");
  EXPECT_EQ(c.parallel.virtual_stages, 2);
  EXPECT_TRUE(c.parallel.print_coords);
  EXPECT_EQ(c.data.train, "a.h5");
  EXPECT_EQ(c.data.val, "b.h5");
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.data.max_docs, 10);
  EXPECT_EQ(c.balance.packer, "wlb");
  EXPECT_EQ(c.balance.sharding, "adaptive");
  EXPECT_EQ(c.balance.max_tokens, 512);
  EXPECT_EQ(c.balance.max_delay, 3);
  EXPECT_EQ(c.balance.outlier_thresholds, "300 400");
  EXPECT_FALSE(c.balance.calibrate);
  EXPECT_DOUBLE_EQ(c.balance.cost_b, 2e-12);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.001);
  EXPECT_EQ(c.optim.warmup_steps, 7);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 2);
  EXPECT_EQ(c.train.steps, 11);
  EXPECT_EQ(c.train.micro_batches, 6);
  EXPECT_EQ(c.train.seed, 99u);
  EXPECT_EQ(c.train.eval_tokens, 1000);
  EXPECT_EQ(c.checkpoint.dir, "ck");
  EXPECT_DOUBLE_EQ(c.checkpoint.every_minutes, 1.5);
  EXPECT_EQ(c.checkpoint.resume, "never");
  EXPECT_FALSE(c.checkpoint.at_end);
  EXPECT_EQ(c.log.csv_file, "t.csv");
  EXPECT_EQ(c.log.level, "debug");
  EXPECT_EQ(c.comm.wait, "block");
  // to_ini round-trips every key.
  Config again = parse_deck_text(to_ini(c));
  EXPECT_EQ(to_ini(again), to_ini(c));
}

TEST(Config, CommandLineOverridesDeck) {
  Config c = parse_deck_text("[model]\nd_model = 128\n", {"--model.d_model=256", "parallel.tp=2"});
  EXPECT_EQ(c.model.d_model, 256);
  EXPECT_EQ(c.parallel.tp, 2);
}

TEST(Config, CommandLineParserReadsDeckFileAndOverrides) {
  const std::string path = "test_config_deck.ini";
  std::ofstream(path) << "# comment\n[model]\nlayers = 3\n[train]\nsteps = 9\n";
  const char* argv[] = {"wlb4d", path.c_str(), "--train.steps=12", "--print-config"};
  CommandLine cl = parse_command_line(4, argv);
  EXPECT_EQ(cl.config.model.layers, 3);
  EXPECT_EQ(cl.config.train.steps, 12);
  EXPECT_TRUE(cl.print_config);
  EXPECT_EQ(cl.config.deck_path, path);
  // An empty value switches a path key off.
  const char* argv2[] = {"wlb4d", path.c_str(), "--log.timing_file="};
  EXPECT_EQ(parse_command_line(3, argv2).config.log.timing_file, "");
}

TEST(Config, UnknownKeyIsNamed) {
  expect_config_error([] { parse_deck_text("[train]\nunknown_key = 3\n"); }, {"unknown key", "train.unknown_key"});
  expect_config_error([] { parse_deck_text("", {"--model.layerz=3"}); }, {"unknown key", "model.layerz"});
  const char* argv[] = {"wlb4d", "--optim.lrr=3"};
  expect_config_error([&] { parse_command_line(2, argv); }, {"unknown key", "optim.lrr"});
}

TEST(Config, MalformedValueIsNamed) {
  expect_config_error([] { parse_deck_text("[model]\nlayers = three\n"); }, {"malformed", "model.layers", "three"});
  expect_config_error([] { parse_deck_text("[optim]\nlr = 1e-3x\n"); }, {"malformed", "optim.lr"});
  expect_config_error([] { parse_deck_text("[data]\nshuffle = maybe\n"); }, {"malformed", "data.shuffle"});
}

TEST(Config, OutOfRangeNamesKeyValueRule) {
  expect_config_error([] { parse_deck_text("[model]\nlayers = 0\n"); }, {"model.layers=0", "must be >= 1"});
  expect_config_error([] { parse_deck_text("[optim]\nbeta2 = 1.5\n"); }, {"optim.beta2=1.5", "must be in"});
  expect_config_error([] { parse_deck_text("[parallel]\nschedule = zigzag\n"); },
                      {"parallel.schedule=zigzag", "must be one of", "1f1b"});
  expect_config_error([] { parse_deck_text("[balance]\noutlier_thresholds = 400 300\n"); },
                      {"balance.outlier_thresholds=400 300", "ascending"});
}

TEST(Config, CrossKeyRules) {
  expect_config_error([] { parse_deck_text("[model]\nheads = 8\nkv_heads = 4\n[parallel]\ntp = 3\n"); },
                      {"parallel.tp=3 must divide model.heads=8"});
  expect_config_error([] { parse_deck_text("[model]\nheads = 8\nkv_heads = 2\n[parallel]\ntp = 4\n"); },
                      {"parallel.tp=4 must divide model.kv_heads=2"});
  expect_config_error([] { parse_deck_text("[model]\nheads = 8\nkv_heads = 3\n"); },
                      {"model.kv_heads=3 must divide model.heads=8"});
  expect_config_error([] { parse_deck_text("[model]\nlayers = 2\n[parallel]\npp = 4\n"); },
                      {"model.layers=2", "parallel.pp"});
  expect_config_error([] { parse_deck_text("[optim]\nlr = 1e-4\nmin_lr = 1e-3\n"); },
                      {"optim.min_lr", "optim.lr"});
  expect_config_error([] { parse_deck_text("[parallel]\ndp = 3\n[train]\nmicro_batches = 4\n"); },
                      {"parallel.dp=3 must divide train.micro_batches=4"});
}

TEST(Config, WorldSizeRule) {
  Config c = parse_deck_text("[parallel]\ndp = 2\ntp = 2\n[train]\nmicro_batches=4\n");
  EXPECT_NO_THROW(validate_world(c, 4));
  expect_config_error([&] { validate_world(c, 3); }, {"2*1*1*2 = 4", "must equal the number of MPI ranks (3)"});
}

TEST(Config, MissingDeckFile) {
  const char* argv[] = {"wlb4d", "does/not/exist.ini"};
  expect_config_error([&] { parse_command_line(2, argv); }, {"deck file 'does/not/exist.ini'", "cannot be opened"});
}

TEST(Config, HelpListsEveryKeyWithUnit) {
  std::string h = deck_help();
  std::string ini = to_ini(Config{});
  std::regex key_re(R"(^(\w+) = )", std::regex::multiline);
  std::string section;
  std::istringstream is(ini);
  std::string line;
  int n = 0;
  while (std::getline(is, line)) {
    if (line.size() > 2 && line[0] == '[') { section = line.substr(1, line.size() - 2); continue; }
    auto eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    std::string key = section + "." + line.substr(0, eq);
    EXPECT_NE(h.find(key), std::string::npos) << key << " missing from --help";
    ++n;
  }
  EXPECT_GT(n, 50);
}

// Deck parsing: every key parses, overrides win, each class of bad input
// gives its own message naming key, value and rule.
#include "wlb4d/core/attention_kernel.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/error.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <sys/stat.h>

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
micro_batches = 8
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
  EXPECT_EQ(c.train.micro_batches, 8);
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
  expect_config_error(
      [] { parse_deck_text("[model]\nrope_scaling = llama3\nrope_low_freq_factor = 4\nrope_high_freq_factor = 2\n"); },
      {"model.rope_high_freq_factor=2 must exceed model.rope_low_freq_factor=4"});
  expect_config_error([] { parse_deck_text("[model]\nrope_scaling = yarn\n"); }, {"model.rope_scaling=yarn"});
  expect_config_error(
      [] {
        parse_deck_text("[model]\nlayers = 4\ntie_embeddings = true\n[parallel]\nschedule = interleaved\n"
                        "virtual_stages = 2\n");
      },
      {"model.tie_embeddings=true with parallel.pp=1 needs parallel.virtual_stages=1"});
  expect_config_error([] { parse_deck_text("[parallel]\ndp = 3\n[train]\nmicro_batches = 4\n"); },
                      {"parallel.dp=3 must divide train.micro_batches=4"});
  // Interleaved 1F1B needs the per-replica micro-batch count to be a multiple of pp
  // (the executor's rule, now checked with the deck: --check sees it).
  expect_config_error(
      [] {
        parse_deck_text("[model]\nlayers = 4\n[parallel]\ndp = 2\npp = 2\nschedule = interleaved\n"
                        "virtual_stages = 2\n[train]\nmicro_batches = 6\n");
      },
      {"parallel.pp=2 must divide train.micro_batches/parallel.dp=3", "interleaved"});
  expect_config_error([] { parse_deck_text("[train]\nskip_spike_z = 6\nskip_spike_window = 8\nskip_spike_warmup = 9\n"); },
                      {"train.skip_spike_warmup=9 must be <= train.skip_spike_window=8"});
  expect_config_error([] { parse_deck_text("[log]\nstraggler_factor = 0.8\n"); },
                      {"log.straggler_factor", "must be 0 (off) or > 1"});
  expect_config_error([] { parse_deck_text("[log]\nstraggler_steps = 0\n"); }, {"log.straggler_steps", ">= 1"});
  expect_config_error([] { parse_deck_text("[train]\nskip_spike_z = -1\n"); }, {"train.skip_spike_z", ">= 0"});
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

// ---- include = FILE -----------------------------------------------------------
namespace {
namespace fs = std::filesystem;

// A fresh folder of deck files under the test's working directory.
struct DeckDir {
  fs::path root;
  explicit DeckDir(const std::string& name) : root(fs::current_path() / ("include-" + name)) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~DeckDir() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  std::string put(const std::string& rel, const std::string& text) const {
    const fs::path p = root / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
};

CommandLine parse_args(std::vector<std::string> args) {
  std::vector<const char*> argv{"wlb4d"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}
}  // namespace

TEST(ConfigInclude, OverrideOrderDeckOverBaseCliOverBoth) {
  DeckDir d("order");
  d.put("base.ini", "[model]\nlayers = 3\nd_model = 128\n[train]\nsteps = 7\nseed = 11\n");
  const std::string deck = d.put("deck.ini", "# header\ninclude = base.ini\n\n[model]\nlayers = 5\n[train]\nsteps = 9\n");
  Config c = parse_args({deck}).config;
  EXPECT_EQ(c.model.layers, 5);     // the deck over its base
  EXPECT_EQ(c.model.d_model, 128);  // from the base
  EXPECT_EQ(c.train.steps, 9);
  EXPECT_EQ(c.train.seed, 11u);
  EXPECT_EQ(c.model.heads, ModelConfig{}.heads);  // neither: the default
  EXPECT_EQ(c.deck_path, deck);
  c = parse_args({deck, "--train.steps=12", "--train.seed=5"}).config;  // CLI over both
  EXPECT_EQ(c.train.steps, 12);
  EXPECT_EQ(c.train.seed, 5u);
  EXPECT_EQ(c.model.layers, 5);
  // The resolved deck (--print-config, checkpoints) holds the merged values and no include.
  const std::string ini = to_ini(c);
  EXPECT_EQ(ini.find("include"), std::string::npos);
  EXPECT_NE(ini.find("d_model = 128"), std::string::npos);
  EXPECT_EQ(to_ini(parse_deck_text(ini)), ini);
}

TEST(ConfigInclude, RepeatedIncludesLaterOverridesEarlier) {
  DeckDir d("repeat");
  d.put("a.ini", "[train]\nsteps = 1\nseed = 1\nmicro_batches = 8\n");
  d.put("b.ini", "[train]\nsteps = 2\nseed = 2\n");
  const std::string deck = d.put("deck.ini", "include = a.ini\ninclude = b.ini\n[train]\nseed = 3\n");
  Config c = parse_args({deck}).config;
  EXPECT_EQ(c.train.micro_batches, 8);  // only in a
  EXPECT_EQ(c.train.steps, 2);          // b over a
  EXPECT_EQ(c.train.seed, 3u);          // the deck over both
}

TEST(ConfigInclude, NestedIncludesRelativeToTheIncludingDeck) {
  DeckDir d("nested");
  // decks/run.ini -> common/mid.ini -> common/base/root.ini: every path is
  // relative to the folder of the deck that names it, not the working directory.
  d.put("common/base/root.ini", "[model]\nlayers = 3\nd_model = 96\nheads = 6\nkv_heads = 3\n");
  d.put("common/mid.ini", "include = base/root.ini   # relative to common/\n[model]\nlayers = 4\n");
  const std::string deck = d.put("decks/run.ini", "include = ../common/mid.ini\n[train]\nsteps = 3\n");
  Config c = parse_args({deck}).config;
  EXPECT_EQ(c.model.layers, 4);   // mid over root
  EXPECT_EQ(c.model.d_model, 96);  // root, two levels down
  EXPECT_EQ(c.model.heads, 6);
  EXPECT_EQ(c.train.steps, 3);
  // A diamond (two includes sharing a base) is not a cycle.
  d.put("decks/x.ini", "include = ../common/mid.ini\n");
  d.put("decks/y.ini", "include = ../common/mid.ini\n[train]\nseed = 9\n");
  const std::string diamond = d.put("decks/diamond.ini", "include = x.ini\ninclude = y.ini\n");
  c = parse_args({diamond}).config;
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.train.seed, 9u);
}

TEST(ConfigInclude, CycleIsAnErrorNamingTheChain) {
  DeckDir d("cycle");
  d.put("a.ini", "include = b.ini\n[train]\nsteps = 1\n");
  d.put("b.ini", "include = sub/../a.ini\n");
  const std::string self = d.put("self.ini", "include = self.ini\n");
  const std::string a = (d.root / "a.ini").string();
  expect_config_error([&] { parse_args({a}); },
                      {"include cycle", "a.ini' -> '", "b.ini' -> '", "may not include itself"});
  expect_config_error([&] { parse_args({self}); }, {"include cycle", "self.ini' -> '", "self.ini'"});
}

TEST(ConfigInclude, MissingIncludedFileNamesBothFiles) {
  DeckDir d("missing");
  const std::string deck = d.put("deck.ini", "include = nope/base.ini\n[train]\nsteps = 1\n");
  expect_config_error([&] { parse_args({deck}); },
                      {"deck file '" + (d.root / "nope/base.ini").string() + "' cannot be opened",
                       "included by '" + deck + "'", "include = nope/base.ini",
                       "relative to the including deck's folder"});
}

TEST(ConfigInclude, UnknownKeyInABaseNamesTheBase) {
  DeckDir d("unknown");
  const std::string base = d.put("base.ini", "[train]\nstepz = 3\n");
  const std::string deck = d.put("deck.ini", "include = base.ini\n[train]\nsteps = 1\n");
  expect_config_error([&] { parse_args({deck}); }, {"unknown key 'train.stepz'", "in deck '" + base + "'"});
  // A key given twice in one deck is still an error (naming that deck); once
  // in the deck and once in its base is an override.
  d.put("twice.ini", "[train]\nsteps = 1\nsteps = 2\n");
  const std::string deck2 = d.put("deck2.ini", "include = twice.ini\n");
  expect_config_error([&] { parse_args({deck2}); }, {"twice.ini"});
}

TEST(ConfigInclude, IncludeOnlyAtTopLevel) {
  DeckDir d("toplevel");
  d.put("base.ini", "[train]\nsteps = 3\n");
  const std::string deck = d.put("deck.ini", "[train]\ninclude = base.ini\n");
  expect_config_error([&] { parse_args({deck}); },
                      {"include in deck '" + deck + "'", "before the first [section]"});
  const std::string empty = d.put("empty.ini", "include =\n");
  expect_config_error([&] { parse_args({empty}); }, {"names no file"});
  // Deck text (parse_deck_text) resolves includes from the working directory.
  const std::string rel = fs::relative(d.root / "base.ini").string();
  EXPECT_EQ(parse_deck_text("include = " + rel + "\n").train.steps, 3);
}

// ---- deck files are bounded before they are read --------------------------------
// A deck or include that is a device, a FIFO or a huge file is refused from
// its metadata (never read: /dev/zero would otherwise grow a string until
// std::bad_alloc), naming the file, the include chain and the rule.
TEST(ConfigInclude, DeviceIncludeIsRefusedNamingTheChain) {
  DeckDir d("device");
  d.put("mid.ini", "include = /dev/zero\n");
  const std::string deck = d.put("deck.ini", "include = mid.ini\n[train]\nsteps = 1\n");
  expect_config_error([&] { parse_args({deck}); },
                      {"deck file '/dev/zero' is a character device",
                       "must be a regular file of at most 4 MiB",
                       "include chain: '" + deck + "' -> '" + (d.root / "mid.ini").string() + "' -> 'include = /dev/zero'"});
  const std::string urandom = d.put("urandom.ini", "include = /dev/urandom\n");
  expect_config_error([&] { parse_args({urandom}); }, {"deck file '/dev/urandom' is a character device"});
  // The deck itself, through a symlink: the link's target is what counts.
  fs::create_symlink("/dev/zero", d.root / "link.ini");
  const std::string link = (d.root / "link.ini").string();
  expect_config_error([&] { parse_args({link}); },
                      {"deck file '" + link + "' (a symbolic link to '/dev/zero') is a character device", "at most 4 MiB"});
}

TEST(ConfigInclude, OversizedDeckIsRefusedBeforeItIsRead) {
  DeckDir d("oversized");
  const std::string big = d.put("big.ini", "[train]\nsteps = 1\n");
  fs::resize_file(big, kMaxDeckBytes + 1);  // sparse: costs no disk
  expect_config_error([&] { parse_args({big}); },
                      {"deck file '" + big + "' is " + std::to_string(kMaxDeckBytes + 1) + " bytes",
                       "regular file of at most 4 MiB (4194304 bytes)"});
  const std::string deck = d.put("deck.ini", "include = big.ini\n");
  expect_config_error([&] { parse_args({deck}); },
                      {"deck file '" + big + "' is", "include chain: '" + deck + "' -> 'include = big.ini'"});
  // At the limit is fine: a deck of comments (4 MiB) parses.
  const std::string ok = d.put("ok.ini", "[train]\nsteps = 2\n");
  {
    std::ofstream out(ok, std::ios::app);
    const std::string line(63, '#');
    for (std::uintmax_t n = 15; n + 64 <= kMaxDeckBytes; n += 64) out << line << "\n";
  }
  EXPECT_LE(fs::file_size(ok), kMaxDeckBytes);
  EXPECT_EQ(parse_args({ok}).config.train.steps, 2);
}

TEST(ConfigInclude, FifoDeckIsRefusedWithoutBlocking) {
  DeckDir d("fifo");
  const fs::path fifo = d.root / "pipe.ini";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opening a FIFO with no writer blocks forever: the check must come first.
  expect_config_error([&] { parse_args({fifo.string()}); },
                      {"deck file '" + fifo.string() + "' is a named pipe (FIFO)", "at most 4 MiB"});
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
    // The planner's keys are listed by wlb4d-plan --help (deck_help with its prefixes), not wlb4d's.
    if (section == "plan") {
      EXPECT_EQ(h.find("--" + key + " "), std::string::npos) << key << " in wlb4d --help";
      EXPECT_NE(deck_help("usage", {"plan."}).find(key), std::string::npos) << key << " missing from the planner's help";
    } else {
      EXPECT_NE(h.find(key), std::string::npos) << key << " missing from --help";
    }
    ++n;
  }
  EXPECT_GT(n, 50);
}

// ---- deck validation: values the validator used to accept -----------------------
TEST(ConfigStrict, EveryFloatingKeyMustBeFinite) {
  for (const char* bad : {"inf", "-inf", "nan", "infinity"}) {
    for (const char* key : {"model.norm_eps", "optim.eps", "balance.cost_a", "plan.alpha_s", "model.rope_theta",
                            "checkpoint.every_minutes", "optim.grad_clip"}) {
      expect_config_error([&] { parse_deck_text("", {std::string("--") + key + "=" + bad}); },
                          {key, "must be a finite number"});
    }
  }
  // In a deck file too, naming the key.
  expect_config_error([] { parse_deck_text("[model]\nnorm_eps = inf\n"); }, {"model.norm_eps=inf", "finite"});
}

TEST(ConfigStrict, EmptyBoolIsAnError) {
  const char* argv[] = {"wlb4d", "--checkpoint.at_end="};
  expect_config_error([&] { parse_command_line(2, argv); },
                      {"malformed value for checkpoint.at_end", "must be true or false"});
  expect_config_error([] { parse_deck_text("[data]\nshuffle =\n"); }, {"data.shuffle", "must be true or false"});
  // The spellings Boost accepted still work.
  EXPECT_FALSE(parse_deck_text("", {"--checkpoint.at_end=false"}).checkpoint.at_end);
  EXPECT_FALSE(parse_deck_text("", {"--checkpoint.at_end=0"}).checkpoint.at_end);
  EXPECT_TRUE(parse_deck_text("[checkpoint]\nat_end = Yes\n").checkpoint.at_end);
  EXPECT_FALSE(parse_deck_text("[checkpoint]\nat_end = off\n").checkpoint.at_end);
}

TEST(ConfigStrict, NegativeSeedIsAnError) {
  const char* argv[] = {"wlb4d", "--train.seed=-1"};
  expect_config_error([&] { parse_command_line(2, argv); }, {"train.seed", "'-1'", "unsigned integer"});
  expect_config_error([] { parse_deck_text("[train]\nseed = -5\n"); }, {"train.seed", "unsigned"});
  expect_config_error([] { parse_deck_text("[train]\nseed = 18446744073709551616\n"); }, {"train.seed"});
  EXPECT_EQ(parse_deck_text("[train]\nseed = 18446744073709551615\n").train.seed, 18446744073709551615ull);
  EXPECT_EQ(parse_deck_text("", {"--train.seed=7"}).train.seed, 7u);
}

TEST(ConfigStrict, DirectoryAsDeckIsAnError) {
  std::filesystem::create_directories("a-deck-dir.ini");
  const char* argv[] = {"wlb4d", "a-deck-dir.ini"};
  expect_config_error([&] { parse_command_line(2, argv); }, {"deck file 'a-deck-dir.ini'", "is a directory"});
}

TEST(ConfigStrict, Utf8BomAtTheTopIsSkipped) {
  Config c = parse_deck_text("\xEF\xBB\xBF[model]\nlayers = 3\n");
  EXPECT_EQ(c.model.layers, 3);
  const std::string path = "test_config_bom.ini";
  std::ofstream(path) << "\xEF\xBB\xBF# a comment first\n[train]\nsteps = 4\n";
  const char* argv[] = {"wlb4d", path.c_str()};
  EXPECT_EQ(parse_command_line(2, argv).config.train.steps, 4);
}

TEST(ConfigStrict, DefaultsPrintAsWritten) {
  const std::string ini = to_ini(Config{});
  EXPECT_NE(ini.find("lr = 0.0003\n"), std::string::npos) << ini;
  EXPECT_EQ(ini.find("0.00029999999999999997"), std::string::npos);
  EXPECT_NE(deck_help().find("0.0003"), std::string::npos);
  EXPECT_EQ(deck_help().find("0.00029999999999999997"), std::string::npos);
  // Still a round trip for values that need every digit.
  Config c;
  c.optim.lr = 0.1 + 0.2;
  EXPECT_EQ(parse_deck_text(to_ini(c)).optim.lr, c.optim.lr);
}

// ---- model.attention_kernel (core/attention_kernel.hpp) ------------------------
TEST(AttentionKernel, DefaultIsAutoAndParses) {
  EXPECT_EQ(Config{}.model.attention_kernel, "auto");
  EXPECT_EQ(parse_deck_text("[model]\nattention_kernel = portable\n", {}).model.attention_kernel, "portable");
  expect_config_error([] { parse_deck_text("[model]\nattention_kernel = flash\n", {}); },
                      {"model.attention_kernel", "auto portable cudnn"});
}

TEST(AttentionKernel, PortableIsAlwaysTaken) {
  for (bool built : {false, true})
    for (int d : {64, 72, 128, 256}) {
      const auto c = resolve_attention_kernel("portable", d, "fp32", built);
      EXPECT_EQ(c.kernel, "portable");
      EXPECT_NE(c.why.find("model.attention_kernel=portable"), std::string::npos);
    }
}

TEST(AttentionKernel, CudnnOnABuildWithoutItIsRefusedNamingTheKey) {
  expect_config_error([] { resolve_attention_kernel("cudnn", 128, "bf16", false); },
                      {"model.attention_kernel=cudnn", "this build has no cuDNN", "-DWLB4D_ENABLE_CUDNN=ON"});
}

TEST(AttentionKernel, CudnnWithAHeadDimItDoesNotTakeIsRefusedAndSaysSo) {
  expect_config_error([] { resolve_attention_kernel("cudnn", 36, "bf16", true); },
                      {"model.attention_kernel=cudnn", "head dim 36 is not a multiple of 8", "refused"});
  expect_config_error([] { resolve_attention_kernel("cudnn", 256, "bf16", true); },
                      {"model.attention_kernel=cudnn", "head dim 256 is above 128", "refused"});
  for (int d : {8, 64, 96, 128}) EXPECT_EQ(resolve_attention_kernel("cudnn", d, "bf16", true).kernel, "cudnn") << d;
  // Asked for explicitly, an fp32 run gets it too, and the banner says bf16 operands.
  const auto c = resolve_attention_kernel("cudnn", 64, "fp32", true);
  EXPECT_EQ(c.kernel, "cudnn");
  EXPECT_NE(c.why.find("bf16 operands in an fp32 run"), std::string::npos) << c.why;
}

TEST(AttentionKernel, AutoChoosesAndSaysWhy) {
  auto a = resolve_attention_kernel("auto", 128, "bf16", false);
  EXPECT_EQ(a.kernel, "portable");
  EXPECT_NE(a.why.find("this build has no cuDNN"), std::string::npos) << a.why;
  a = resolve_attention_kernel("auto", 128, "bf16", true);
  EXPECT_EQ(a.kernel, "cudnn");
  a = resolve_attention_kernel("auto", 36, "bf16", true);  // falls back, and the message says which
  EXPECT_EQ(a.kernel, "portable");
  EXPECT_NE(a.why.find("falls back from cuDNN"), std::string::npos) << a.why;
  EXPECT_NE(a.why.find("head dim 36"), std::string::npos) << a.why;
  a = resolve_attention_kernel("auto", 64, "fp32", true);  // fp32 runs keep the fp32 kernel
  EXPECT_EQ(a.kernel, "portable");
  EXPECT_NE(a.why.find("train.precision=fp32"), std::string::npos) << a.why;
}

TEST(AttentionKernel, HeadDimRule) {
  for (int d : {8, 16, 64, 80, 96, 120, 128}) EXPECT_EQ(cudnn_head_dim_issue(d), "") << d;
  for (int d : {2, 4, 12, 36, 60, 136, 192, 256}) EXPECT_NE(cudnn_head_dim_issue(d), "") << d;
}

TEST(AttentionKernel, DeckValidationOnThisBuild) {
  // quickstart-like model: d_model 256, 8 heads -> head dim 32.
  const std::string deck = "[model]\nattention_kernel = cudnn\n";
  if (cudnn_attention_built()) {
    EXPECT_NO_THROW(parse_deck_text(deck, {}));
    expect_config_error([] { parse_deck_text("[model]\nattention_kernel = cudnn\nd_model = 240\nheads = 4\n", {}); },
                        {"model.attention_kernel=cudnn", "head dim 60"});
  } else {
    expect_config_error([&] { parse_deck_text(deck, {}); }, {"model.attention_kernel=cudnn", "no cuDNN"});
  }
  EXPECT_NO_THROW(parse_deck_text("[model]\nattention_kernel = auto\nd_model = 240\nheads = 4\n", {}));
}

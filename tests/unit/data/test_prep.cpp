// wlb4d-prep logic: options, split by document, summary numbers.
#include "test_helpers.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/data/prep.hpp"
#include "wlb4d/data/tokenizer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

using namespace wlb;
using namespace wlb::data;

namespace {
std::vector<std::string> decoded_docs(const std::string& path) {
  auto ds = TokenDataset::open(path);
  auto tok = make_tokenizer(ds.tokenizer(), ds.tokenizer_model(), path, ds.eos_id());
  std::vector<std::string> out;
  for (std::int64_t d = 0; d < ds.num_docs(); ++d) {
    std::vector<token_t> buf(static_cast<std::size_t>(ds.doc_length(d)));
    ds.read(d, 0, ds.doc_length(d), buf.data());
    out.push_back(tok->decode(buf));
  }
  return out;
}
}  // namespace

TEST(Prep, ParsesOptions) {
  const char* argv[] = {"wlb4d-prep", "--input", "a.jsonl", "-i", "dir", "--output", "o.h5", "--tokenizer",
                        "sentencepiece", "--vocab-size", "512", "--val-fraction", "0.1", "--val-output", "v.h5",
                        "--seed", "9", "--max-docs", "100"};
  auto o = parse_prep_args(static_cast<int>(std::size(argv)), argv);
  EXPECT_EQ(o.inputs, (std::vector<std::string>{"a.jsonl", "dir"}));
  EXPECT_EQ(o.output, "o.h5");
  EXPECT_EQ(o.tokenizer, "sentencepiece");
  EXPECT_EQ(o.vocab_size, 512);
  EXPECT_DOUBLE_EQ(o.val_fraction, 0.1);
  EXPECT_EQ(o.val_output, "v.h5");
  EXPECT_EQ(o.seed, 9u);
  EXPECT_EQ(o.max_docs, 100);
  const char* bad[] = {"wlb4d-prep", "--inptu", "x"};
  EXPECT_THROW(parse_prep_args(3, bad), core::ConfigError);
}

TEST(Prep, RejectsInvalidOptions) {
  PrepOptions o;
  o.inputs = {test::tiny_jsonl()};
  EXPECT_THROW(run_prep(o), core::ConfigError);  // no --output
  o.output = test::scratch("x.h5").string();
  o.val_fraction = 0.2;  // no --val-output
  EXPECT_THROW(run_prep(o), core::ConfigError);
  o.val_fraction = 1.0;
  o.val_output = test::scratch("v.h5").string();
  EXPECT_THROW(run_prep(o), core::ConfigError);
  o.val_fraction = 0;
  o.val_output.clear();
  o.tokenizer = "words";
  EXPECT_THROW(run_prep(o), core::ConfigError);
  o.tokenizer = "sentencepiece";
  o.vocab_size = 100;
  EXPECT_THROW(run_prep(o), core::ConfigError);
}

TEST(Prep, SplitByDocumentIsSeededAndComplete) {
  auto texts = test::jsonl_texts(test::tiny_jsonl());
  PrepOptions o;
  o.inputs = {test::tiny_jsonl()};
  o.output = test::scratch("split-train.h5").string();
  o.val_output = test::scratch("split-val.h5").string();
  o.val_fraction = 0.25;
  o.seed = 77;
  auto s = run_prep(o);
  EXPECT_EQ(s.train.docs, 15);
  EXPECT_EQ(s.val.docs, 5);
  auto tr = decoded_docs(o.output), va = decoded_docs(o.val_output);
  // Together they are the corpus, each document once, each split in corpus order.
  std::multiset<std::string> all(tr.begin(), tr.end());
  all.insert(va.begin(), va.end());
  EXPECT_EQ(all, std::multiset<std::string>(texts.begin(), texts.end()));
  auto in_order = [&](const std::vector<std::string>& v) {
    std::vector<std::ptrdiff_t> pos;
    for (const auto& d : v) pos.push_back(std::find(texts.begin(), texts.end(), d) - texts.begin());
    return std::is_sorted(pos.begin(), pos.end());
  };
  EXPECT_TRUE(in_order(tr));
  EXPECT_TRUE(in_order(va));
  // Same seed, same split; another seed, another split.
  auto s2 = run_prep(o);
  EXPECT_EQ(decoded_docs(o.val_output), va);
  o.seed = 78;
  run_prep(o);
  EXPECT_NE(decoded_docs(o.val_output), va);
  EXPECT_EQ(s2.train.tokens + s2.val.tokens, s.train.tokens + s.val.tokens);
}

TEST(Prep, SummaryNumbers) {
  PrepOptions o;
  o.inputs = {test::tiny_jsonl()};
  o.output = test::scratch("sum.h5").string();
  o.max_docs = 10;
  auto s = run_prep(o);
  auto texts = test::jsonl_texts(test::tiny_jsonl());
  std::vector<std::int64_t> len;
  std::int64_t tokens = 0;
  for (int i = 0; i < 10; ++i) {
    len.push_back(static_cast<std::int64_t>(texts[static_cast<std::size_t>(i)].size()) + 1);
    tokens += len.back();
  }
  std::sort(len.begin(), len.end());
  EXPECT_EQ(s.train.docs, 10);
  EXPECT_EQ(s.train.tokens, tokens);
  EXPECT_EQ(s.train.p50, len[4]);  // nearest rank: ceil(0.5 * 10) = 5th
  EXPECT_EQ(s.train.p90, len[8]);
  EXPECT_EQ(s.train.p99, len[9]);
  EXPECT_EQ(s.train.max, len[9]);
  auto text = format_summary(s);
  EXPECT_NE(text.find("wlb4d-prep: train " + o.output + ": 10 documents, " + std::to_string(tokens) + " tokens"),
            std::string::npos)
      << text;
  EXPECT_EQ(percentile({}, 50), 0);
  EXPECT_EQ(percentile({1, 2, 3, 4}, 100), 4);
  EXPECT_EQ(percentile({1, 2, 3, 4}, 1), 1);
}

TEST(Prep, HuggingFaceTokenizerJson) {
  // A Llama-3-style byte-level BPE written as a tokenizer.json file.
  const auto json_path = test::scratch("bpe-tokenizer.json");
  test::write_file(json_path, test::tokenizer_json({{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}}, test::llama3_pre()).dump());
  const char* argv[] = {"wlb4d-prep", "-i", "a.jsonl", "-o", "o.h5", "--tokenizer", "tok.json", "--eos-token", "<|eot_id|>"};
  const auto parsed = parse_prep_args(static_cast<int>(std::size(argv)), argv);
  EXPECT_EQ(parsed.tokenizer, "tok.json");
  EXPECT_EQ(parsed.eos_token, "<|eot_id|>");
  EXPECT_TRUE(is_hf_tokenizer("a/b/tokenizer.json"));
  EXPECT_FALSE(is_hf_tokenizer(".json"));
  EXPECT_FALSE(is_hf_tokenizer("sentencepiece"));

  PrepOptions o;
  o.inputs = {test::tiny_jsonl()};
  o.output = test::scratch("hf-train.h5").string();
  o.tokenizer = json_path.string();
  auto s = run_prep(o);
  EXPECT_EQ(s.tokenizer, "hf-bpe");
  EXPECT_EQ(s.vocab_size, 303);
  EXPECT_EQ(s.eos_id, 300);  // the rule: <|endoftext|>
  EXPECT_NE(format_summary(s).find("tokenizer hf-bpe, vocab_size 303, eos_id 300 (<|endoftext|>)"), std::string::npos);
  {
    auto ds = TokenDataset::open(o.output);
    EXPECT_EQ(ds.tokenizer(), "hf-bpe");
    EXPECT_EQ(ds.tokenizer_model(), test::read_file(json_path));  // the file, byte for byte
    const auto tok = make_tokenizer(ds.tokenizer(), ds.tokenizer_model(), o.output, ds.eos_id());
    const auto texts = test::jsonl_texts(test::tiny_jsonl());
    for (std::int64_t d = 0; d < ds.num_docs(); ++d) {
      std::vector<token_t> buf(static_cast<std::size_t>(ds.doc_length(d)));
      ds.read(d, 0, ds.doc_length(d), buf.data());
      auto want = tok->encode(texts[std::size_t(d)]);
      want.push_back(300);
      EXPECT_EQ(buf, want);
    }
  }
  EXPECT_EQ(decoded_docs(o.output), test::jsonl_texts(test::tiny_jsonl()));
  // --eos-token names another special token; the dataset records it.
  o.eos_token = "<|eot_id|>";
  s = run_prep(o);
  EXPECT_EQ(s.eos_id, 302);
  EXPECT_EQ(TokenDataset::open(o.output).eos_id(), 302);
  EXPECT_EQ(decoded_docs(o.output), test::jsonl_texts(test::tiny_jsonl()));
  // Refusals: a named EOS that is not special; --eos-token without a
  // tokenizer.json; a missing file; a tokenizer name that is neither.
  o.eos_token = "he";
  EXPECT_THROW(run_prep(o), core::DataError);
  o.tokenizer = "bytes";
  EXPECT_THROW(run_prep(o), core::ConfigError);
  o.eos_token.clear();
  o.tokenizer = test::scratch("missing.json").string();
  EXPECT_THROW(run_prep(o), core::DataError);
  o.tokenizer = "tokenizer.txt";
  try {
    run_prep(o);
    ADD_FAILURE() << "--tokenizer tokenizer.txt was accepted";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("must be bytes, sentencepiece or a Hugging Face tokenizer.json"),
              std::string::npos);
  }
}

TEST(Prep, NoDocumentsIsAnError) {
  auto p = test::scratch("empty.jsonl");
  test::write_file(p, "{\"text\": \"\"}\n{\"other\": 1}\n");
  PrepOptions o;
  o.inputs = {p.string()};
  o.output = test::scratch("none.h5").string();
  EXPECT_THROW(run_prep(o), core::DataError);
}

// ---- prep refuses to destroy its input, writes atomically ----------
namespace {
template <class F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const core::ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}
}  // namespace

TEST(PrepSafety, NegativeSeedIsRefused) {
  const char* argv[] = {"wlb4d-prep", "--input", "a.jsonl", "--output", "o.h5", "--seed", "-1"};
  const std::string msg = config_error_of([&] { parse_prep_args(7, argv); });
  EXPECT_NE(msg.find("--seed '-1' must be an unsigned integer"), std::string::npos) << msg;
  const char* big[] = {"wlb4d-prep", "--input", "a.jsonl", "--output", "o.h5", "--seed", "18446744073709551616"};
  EXPECT_THROW(parse_prep_args(7, big), core::ConfigError);
  const char* max[] = {"wlb4d-prep", "--input", "a.jsonl", "--output", "o.h5", "--seed", "18446744073709551615"};
  EXPECT_EQ(parse_prep_args(7, max).seed, 18446744073709551615ull);
}

TEST(PrepSafety, OutputThatIsTheInputIsRefused) {
  const auto corpus = test::scratch("corpus-same.jsonl");
  const std::string text = test::read_file(test::tiny_jsonl());
  test::write_file(corpus, text);
  const auto link = test::scratch("corpus-same-link.h5");
  std::filesystem::remove(link);
  std::filesystem::create_hard_link(corpus, link);  // another name, the same inode
  for (const auto& out : {corpus, link}) {
    PrepOptions o;
    o.inputs = {corpus.string()};
    o.output = out.string();
    const std::string msg = config_error_of([&] { run_prep(o); });
    EXPECT_NE(msg.find("is the same file as --input"), std::string::npos) << msg;
    EXPECT_NE(msg.find("refusing to overwrite the corpus"), std::string::npos) << msg;
    o.output = test::scratch("ok-train.h5").string();
    o.val_fraction = 0.1;
    o.val_output = out.string();
    EXPECT_NE(config_error_of([&] { run_prep(o); }).find("--val-output"), std::string::npos);
  }
  EXPECT_EQ(test::read_file(corpus), text);  // the corpus is intact
}

TEST(PrepSafety, OutputsAreRenamedFromTmpWhenComplete) {
  PrepOptions o;
  o.inputs = {test::tiny_jsonl()};
  o.output = test::scratch("atomic-train.h5").string();
  o.val_fraction = 0.1;
  o.val_output = test::scratch("atomic-val.h5").string();
  const auto s = run_prep(o);
  EXPECT_EQ(s.train.path, o.output);
  EXPECT_EQ(s.val.path, o.val_output);
  EXPECT_TRUE(std::filesystem::exists(o.output));
  EXPECT_FALSE(std::filesystem::exists(o.output + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(o.val_output + ".tmp"));
  EXPECT_EQ(TokenDataset::open(o.output).num_docs(), 18);
  // A failure while writing the second output (its name is too long for the
  // file system) leaves the existing first output untouched and no .tmp file:
  // the outputs are renamed into place only when both are complete.
  o.output = test::scratch("atomic-existing.h5").string();
  test::write_file(o.output, "an older dataset");
  o.val_output = test::scratch(std::string(300, 'v') + ".h5").string();
  EXPECT_THROW(run_prep(o), core::DataError);
  EXPECT_TRUE(test::read_file(o.output) == "an older dataset") << "the existing --output was replaced";
  EXPECT_FALSE(std::filesystem::exists(o.output + ".tmp"));
}

namespace {
/// Every attribute, length and token of two datasets (shards open as one) are equal.
void expect_same_dataset(const TokenDataset& a, const TokenDataset& b) {
  EXPECT_EQ(a.tokenizer(), b.tokenizer());
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.eos_id(), b.eos_id());
  EXPECT_EQ(a.tokenizer_model(), b.tokenizer_model());
  EXPECT_EQ(a.source(), b.source());
  ASSERT_EQ(a.doc_lengths(), b.doc_lengths());
  std::vector<token_t> x(std::size_t(a.num_tokens())), y(x.size());
  a.read_tokens(0, a.num_tokens(), x.data());
  b.read_tokens(0, b.num_tokens(), y.data());
  EXPECT_EQ(x, y);
}
}  // namespace

TEST(PrepParallel, ThreadsAndShardsWriteWhatTheSerialRunWrites) {
  const auto json_path = test::scratch("par-tokenizer.json");
  test::write_file(json_path, test::tokenizer_json({{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"e", "r"}},
                                                   test::gpt2_pre()).dump());
  for (const std::string& tk : {std::string("bytes"), json_path.string(), std::string("sentencepiece")}) {
    SCOPED_TRACE(tk);
    const std::string tag = tk == "bytes" ? "bytes" : tk == "sentencepiece" ? "spm" : "hf";
    PrepOptions o;
    o.inputs = {test::tiny_jsonl()};
    o.tokenizer = tk;
    o.vocab_size = 400;
    if (tag == "hf") o.eos_token = "<|eot_id|>";
    o.val_fraction = 0.1;
    o.threads = 1;
    o.output = test::scratch("par-" + tag + "-serial.h5").string();
    o.val_output = test::scratch("par-" + tag + "-serial-val.h5").string();
    const auto serial = run_prep(o);
    EXPECT_EQ(serial.threads, 1);
    o.threads = 3;
    o.output = test::scratch("par-" + tag + "-threads.h5").string();
    o.val_output = test::scratch("par-" + tag + "-threads-val.h5").string();
    const auto par = run_prep(o);
    EXPECT_EQ(par.threads, 3);
    EXPECT_EQ(par.train.tokens, serial.train.tokens);
    expect_same_dataset(TokenDataset::open(serial.train.path), TokenDataset::open(par.train.path));
    expect_same_dataset(TokenDataset::open(serial.val.path), TokenDataset::open(par.val.path));
    // Shards of ~1/5 of the tokens, read as one stream: the serial file again.
    o.shard_tokens = serial.train.tokens / 5;
    o.output = test::scratch("par-" + tag + "-shard.h5").string();
    o.val_output = test::scratch("par-" + tag + "-shard-val.h5").string();
    const auto sh = run_prep(o);
    ASSERT_GE(sh.train.shards.size(), 3u);
    EXPECT_EQ(sh.train.shards[1], test::scratch("par-" + tag + "-shard-00001.h5").string());
    EXPECT_EQ(sh.train.path, test::scratch("par-" + tag + "-shard-*.h5").string());
    EXPECT_NE(format_summary(sh).find("-shard-*.h5 (" + std::to_string(sh.train.shards.size()) + " shards): 18 documents"),
              std::string::npos)
        << format_summary(sh);
    for (const auto& p : sh.train.shards) {  // every shard but the last holds >= shard_tokens
      auto one = TokenDataset::open(p);
      if (p != sh.train.shards.back()) {
        EXPECT_GE(one.num_tokens(), o.shard_tokens) << p;
      }
    }
    expect_same_dataset(TokenDataset::open(serial.train.path), TokenDataset::open(sh.train.shards));
    expect_same_dataset(TokenDataset::open(serial.val.path), TokenDataset::open(sh.val.shards));
    // A later run with fewer shards removes the earlier run's extra ones.
    const std::size_t before = sh.train.shards.size();
    o.shard_tokens = serial.train.tokens;  // everything fits in shard 0 (it reaches the limit at the last document)
    const auto fewer = run_prep(o);
    EXPECT_EQ(fewer.train.shards.size(), 1u);
    for (std::size_t i = 1; i < before; ++i)
      EXPECT_FALSE(std::filesystem::exists(test::scratch("par-" + tag + "-shard-0000" + std::to_string(i) + ".h5")));
  }
}

TEST(PrepParallel, BadThreadAndShardOptions) {
  const char* a1[] = {"wlb4d-prep", "-i", "a.jsonl", "-o", "o.h5", "--threads", "4", "--shard-tokens", "1000000"};
  const auto p = parse_prep_args(static_cast<int>(std::size(a1)), a1);
  EXPECT_EQ(p.threads, 4);
  EXPECT_EQ(p.shard_tokens, 1000000);
  PrepOptions o;
  o.inputs = {test::tiny_jsonl()};
  o.output = test::scratch("bad-threads.h5").string();
  o.threads = -1;
  EXPECT_THROW(run_prep(o), core::ConfigError);
  o.threads = 0;
  o.shard_tokens = -5;
  try {
    run_prep(o);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--shard-tokens -5 must be >= 0"), std::string::npos) << e.what();
  }
}

// --sft: the dataset's loss mask is the response / assistant tokens and the
// EOS after a final response, each segment encoded on its own.
TEST(Prep, FineTuningWritesTheLossMask) {
  auto in = test::scratch("prep-sft.jsonl");
  test::write_file(in,
                   "{\"prompt\": \"ab\", \"response\": \"cd\"}\n"
                   "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"y\"},"
                   " {\"role\": \"user\", \"content\": \"z\"}]}\n");
  PrepOptions o;
  o.inputs = {in.string()};
  o.output = test::scratch("prep-sft.h5").string();
  o.sft = true;
  const auto s = run_prep(o);
  const auto ds = TokenDataset::open(o.output);
  ASSERT_TRUE(ds.has_loss_mask());
  std::vector<std::uint8_t> m(static_cast<std::size_t>(ds.doc_length(0)));
  ds.read_loss_mask(0, 0, ds.doc_length(0), m.data());
  EXPECT_EQ(m, (std::vector<std::uint8_t>{0, 0, 1, 1, 1}));  // a b | c d | EOS
  // <|user|>\n x\n <|assistant|>\n y\n <|user|>\n z\n EOS: only "y\n" trained; EOS masked.
  const std::string text = "<|user|>\nx\n<|assistant|>\ny\n<|user|>\nz\n";
  ASSERT_EQ(ds.doc_length(1), std::int64_t(text.size()) + 1);
  m.resize(text.size() + 1);
  ds.read_loss_mask(1, 0, ds.doc_length(1), m.data());
  const std::size_t y = text.find("y\n");
  for (std::size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i], (i == y || i == y + 1) ? 1 : 0) << i;
  EXPECT_EQ(s.train.loss_targets, 3 + 2);
  EXPECT_EQ(ds.loss_targets(), 5);
  EXPECT_NE(format_summary(s).find("loss mask: 5 of"), std::string::npos) << format_summary(s);
}

// --sft with threads and shards: every shard carries its own /loss_mask, and
// the shards read as one dataset give the serial file's tokens and mask.
TEST(Prep, FineTuningShardsAndThreadsWriteTheSerialMask) {
  auto in = test::scratch("prep-sft-shards.jsonl");
  std::string recs;
  for (int i = 0; i < 40; ++i)
    recs += i % 2 ? "{\"prompt\": \"Q: " + std::to_string(i) + " plus 1?\\nA: \", \"response\": \"" +
                        std::to_string(i + 1) + "\"}\n"
                  : "{\"messages\": [{\"role\": \"user\", \"content\": \"say " + std::to_string(i) +
                        "\"}, {\"role\": \"assistant\", \"content\": \"" + std::to_string(i) + "\"}]}\n";
  test::write_file(in, recs);
  PrepOptions o;
  o.inputs = {in.string()};
  o.sft = true;
  o.threads = 1;
  o.output = test::scratch("prep-sft-serial.h5").string();
  const auto serial = run_prep(o);
  o.threads = 3;
  o.shard_tokens = serial.train.tokens / 4;
  o.output = test::scratch("prep-sft-sh.h5").string();
  const auto sh = run_prep(o);
  ASSERT_GE(sh.train.shards.size(), 3u);
  EXPECT_EQ(sh.train.loss_targets, serial.train.loss_targets);
  for (const auto& p : sh.train.shards) EXPECT_TRUE(TokenDataset::open(p).has_loss_mask()) << p;
  const auto a = TokenDataset::open(serial.train.path);
  const auto b = TokenDataset::open(sh.train.shards);
  ASSERT_EQ(a.doc_lengths(), b.doc_lengths());
  EXPECT_EQ(b.loss_targets(), a.loss_targets());
  for (std::int64_t d = 0; d < a.num_docs(); ++d) {
    const auto n = a.doc_length(d);
    std::vector<std::uint8_t> x(static_cast<std::size_t>(n)), y(x.size());
    a.read_loss_mask(d, 0, n, x.data());
    b.read_loss_mask(d, 0, n, y.data());
    EXPECT_EQ(x, y) << d;
    EXPECT_EQ(a.span_targets(d, 1, n - 1), b.span_targets(d, 1, n - 1)) << d;
  }
}

TEST(Prep, ParsesJsonKeysTxtSplitAndSft) {
  const char* argv[] = {"wlb4d-prep", "-i", "a.jsonl", "-o", "b.h5", "--json-keys", "title,body", "--txt-split",
                        "blank-line"};
  auto o = parse_prep_args(9, argv);
  EXPECT_EQ(o.json_keys, (std::vector<std::string>{"title", "body"}));
  EXPECT_EQ(o.txt_split, "blank-line");
  EXPECT_FALSE(o.sft);
  const char* bad_keys[] = {"wlb4d-prep", "--json-keys", "a,,b"};
  EXPECT_THROW(parse_prep_args(3, bad_keys), core::ConfigError);
  const char* sft3[] = {"wlb4d-prep", "--sft", "--json-keys", "a,b,c"};
  EXPECT_THROW(parse_prep_args(4, sft3), core::ConfigError);
  const char* split[] = {"wlb4d-prep", "--txt-split", "para"};
  EXPECT_THROW(parse_prep_args(3, split), core::ConfigError);
}

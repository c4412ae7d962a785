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

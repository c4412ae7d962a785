// Tokenizers: bytes round trip on real text, sentencepiece train/encode/decode.
#include "test_helpers.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/tokenizer.hpp"

#include <gtest/gtest.h>

using namespace wlb;
using namespace wlb::data;

TEST(ByteTokenizer, RoundTripsEveryTinyDocumentExactly) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_EQ(tok.eos_id(), 256);
  auto docs = test::jsonl_texts(test::tiny_jsonl());
  ASSERT_EQ(docs.size(), 20u);
  for (const auto& d : docs) {
    auto ids = tok.encode(d);
    ASSERT_EQ(ids.size(), d.size());  // one token per UTF-8 byte
    EXPECT_EQ(tok.decode(ids), d);
  }
}

TEST(ByteTokenizer, KeepsArbitraryBytesAndDropsEos) {
  ByteTokenizer tok;
  std::string s("a\0b\xff\xfe\n\xe2\x82\xac", 9);
  auto ids = tok.encode(s);
  EXPECT_EQ(ids[3], 255u);
  ids.push_back(256);  // EOS is dropped by decode
  EXPECT_EQ(tok.decode(ids), s);
  std::vector<token_t> bad{65, 257};
  EXPECT_THROW(tok.decode(bad), core::DataError);
}

namespace {
const SentencePieceTokenizer& small_spm() {
  static std::unique_ptr<SentencePieceTokenizer> tok = [] {
    SpmTrainOptions o;
    o.vocab_size = 400;
    return SentencePieceTokenizer::train(test::jsonl_texts(test::tiny_jsonl()), o);
  }();
  return *tok;
}
}  // namespace

TEST(SentencePieceTokenizer, TrainedModelRoundTrips) {
  const auto& tok = small_spm();
  EXPECT_EQ(tok.name(), "sentencepiece");
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.eos_id(), 2);
  for (const auto& d : test::jsonl_texts(test::tiny_jsonl())) {
    auto ids = tok.encode(d);
    EXPECT_LT(ids.size(), d.size());  // compresses real text
    for (auto id : ids) {
      EXPECT_LT(id, 400u);
      EXPECT_NE(id, 2u);
    }
    EXPECT_EQ(tok.decode(ids), d);
  }
  // Whitespace, newlines, tabs and characters never seen in training survive.
  std::string odd = "  two  spaces\n\n\ttab, digits 12345, Grüße, 日本語, emoji \xF0\x9F\x98\x80 ";
  EXPECT_EQ(tok.decode(tok.encode(odd)), odd);
  // Invalid UTF-8 becomes U+FFFD (documented).
  EXPECT_EQ(tok.decode(tok.encode("a\xff" "b")), "a\xEF\xBF\xBD" "b");
}

TEST(SentencePieceTokenizer, SerializedModelReloads) {
  const auto& tok = small_spm();
  auto again = SentencePieceTokenizer::from_serialized(tok.model(), "test");
  std::string s = "Fellow-Citizens of the Senate and House of Representatives";
  EXPECT_EQ(again->encode(s), tok.encode(s));
  auto path = test::scratch("m.model");
  test::write_file(path, tok.model());
  auto loaded = SentencePieceTokenizer::load(path.string());
  EXPECT_EQ(loaded->encode(s), tok.encode(s));
  auto generic = make_tokenizer("sentencepiece", tok.model());
  EXPECT_EQ(generic->vocab_size(), 400);
}

TEST(SentencePieceTokenizer, ErrorsAreDataErrors) {
  EXPECT_THROW(SentencePieceTokenizer::from_serialized("not a model", "x"), core::DataError);
  EXPECT_THROW(SentencePieceTokenizer::load("/no/such.model"), core::DataError);
  // Read whole, so bounded first: a device is refused before a byte is read.
  try {
    SentencePieceTokenizer::load("/dev/zero");
    FAIL() << "expected DataError";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/zero: sentencepiece model file is not a regular file"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(make_tokenizer("wordpiece", ""), core::DataError);
  SpmTrainOptions o;
  o.vocab_size = 100000;  // far more than a tiny corpus allows
  try {
    SentencePieceTokenizer::train({"just a few words here"}, o);
    FAIL() << "expected DataError";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 100000"), std::string::npos) << e.what();
  }
}

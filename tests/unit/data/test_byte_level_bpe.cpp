// Byte-level BPE from hand-built tokenizer.json files: the merge order, the
// pre-tokenizers (GPT-2's ByteLevel regex, Llama 3's Split), ignore_merges,
// added tokens, decoding, and every refusal named in its message. Expected
// tokens are worked out by hand from the BPE rules (byte_level_bpe.hpp) and
// written as tokenizer.json spells them ("Ġ" is the space byte). The real
// GPT-2 and Llama 3 vocabularies are compared with Hugging Face's own library
// in tests/tools/hf_bpe_peer.sh.
#include "test_helpers.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/byte_level_bpe.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <set>

using namespace wlb;
using namespace wlb::data;
using nlohmann::json;

namespace {

using test::byte_level_only;
using test::gpt2_pre;
using test::llama3_pre;
using test::tokenizer_json;

std::unique_ptr<ByteLevelBpeTokenizer> make(const json& j, const ByteLevelBpeOptions& o = {}) {
  return ByteLevelBpeTokenizer::from_json(j.dump(), "test.json", o);
}

/// The tokens of text as tokenizer.json spells them.
std::vector<std::string> tokens(const ByteLevelBpeTokenizer& t, const std::string& text) {
  std::vector<std::string> out;
  for (const auto id : t.encode(text)) out.push_back(t.token(int(id)));
  return out;
}

using Tokens = std::vector<std::string>;

/// The DataError message of f ("" when it does not throw one).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const core::DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ByteLevelAlphabet, IsGpt2s) {
  // openai/gpt-2 encoder.py bytes_to_unicode: '!'..'~', '¡'..'¬', '®'..'ÿ' as
  // themselves; the other 68 bytes as U+0100, U+0101, ... in byte order.
  std::set<std::string> chars;
  for (int b = 0; b < 256; ++b) chars.insert(byte_level_char(b));
  EXPECT_EQ(chars.size(), 256u);
  EXPECT_EQ(byte_level_char('A'), "A");
  EXPECT_EQ(byte_level_char(0), "\xc4\x80");     // U+0100
  EXPECT_EQ(byte_level_char(' '), "\xc4\xa0");   // U+0120 'Ġ'
  EXPECT_EQ(byte_level_char('\n'), "\xc4\x8a");  // U+010A 'Ċ'
  EXPECT_EQ(byte_level_char(0xe9), "\xc3\xa9");  // 'é' as itself
  EXPECT_EQ(byte_level_char(0xad), "\xc5\x83");  // soft hyphen: the 68th, U+0143
}

TEST(ByteLevelBpe, MergesLowestRankFirst) {
  // "hello": l+l (rank 0), h+e (1), he+ll (2), hell+o (3) -> one token; "help"
  // stops at he|l|p (no merge "he l").
  const auto t = make(tokenizer_json({{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}}, gpt2_pre()));
  EXPECT_EQ(tokens(*t, "hello"), (Tokens{"hello"}));
  EXPECT_EQ(tokens(*t, "help"), (Tokens{"he", "l", "p"}));
  EXPECT_EQ(t->num_merges(), 4u);
  // Rank decides, not position: "abc" with b+c ranked before a+b is a|bc,
  // with the ranks swapped ab|c.
  EXPECT_EQ(tokens(*make(tokenizer_json({{"b", "c"}, {"a", "b"}}, gpt2_pre())), "abc"), (Tokens{"a", "bc"}));
  EXPECT_EQ(tokens(*make(tokenizer_json({{"a", "b"}, {"b", "c"}}, gpt2_pre())), "abc"), (Tokens{"ab", "c"}));
}

TEST(ByteLevelBpe, EqualRanksMergeLeftToRight) {
  // "aaa": both a+a pairs have rank 0; the left one merges, the right one is
  // then gone: aa|a. "aaaaa": aa|aa|a.
  const auto t = make(tokenizer_json({{"a", "a"}}, gpt2_pre()));
  EXPECT_EQ(tokens(*t, "aaa"), (Tokens{"aa", "a"}));
  EXPECT_EQ(tokens(*t, "aaaaa"), (Tokens{"aa", "aa", "a"}));
  // With aa+a after a+a: "aaa" -> aa|a -> aaa.
  EXPECT_EQ(tokens(*make(tokenizer_json({{"a", "a"}, {"aa", "a"}}, gpt2_pre())), "aaa"), (Tokens{"aaa"}));
}

TEST(ByteLevelBpe, StaleCandidatesAreSkipped) {
  // "abcd": b+c (0) first; the a+b candidate (1) is then stale (b is inside
  // bc) and the new pair a+bc (2) applies; c+d (3) is stale too: abc|d.
  const auto t = make(tokenizer_json({{"b", "c"}, {"a", "b"}, {"a", "bc"}, {"c", "d"}}, gpt2_pre()));
  EXPECT_EQ(tokens(*t, "abcd"), (Tokens{"abc", "d"}));
}

TEST(ByteLevelBpe, MergesAsStringsOrPairs) {
  const std::vector<std::pair<std::string, std::string>> m = {
      {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"o", "r"}, {"Ġ", "w"}, {"Ġw", "or"}};
  const auto s = make(tokenizer_json(m, gpt2_pre(), {}, true));
  const auto p = make(tokenizer_json(m, gpt2_pre(), {}, false));
  const std::string text = "the world, the theory";
  EXPECT_EQ(tokens(*s, text), (Tokens{"t", "he", "Ġwor", "l", "d", ",", "Ġthe", "Ġthe", "or", "y"}));
  EXPECT_EQ(p->encode(text), s->encode(text));
}

TEST(ByteLevelBpe, Gpt2RegexCutsPreTokens) {
  // Merges that would cross GPT-2's pre-token boundaries: o+Ġ ("hello| world"),
  // t+' ("it|'s"), Ġ+Ġ (a run of spaces before a word keeps its last space).
  const std::vector<std::pair<std::string, std::string>> m = {
      {"o", "Ġ"}, {"Ġ", "w"}, {"t", "'"}, {"'", "s"}, {"Ġ", "Ġ"}, {"Ġ", "b"}, {"1", "2"}, {"3", "4"}};
  const auto t = make(tokenizer_json(m, gpt2_pre()));
  EXPECT_EQ(tokens(*t, "hello world"), (Tokens{"h", "e", "l", "l", "o", "Ġw", "o", "r", "l", "d"}));
  EXPECT_EQ(tokens(*t, "it's"), (Tokens{"i", "t", "'s"}));
  // "a   b": a | ĠĠ (\s+(?!\S) leaves the space before b) | Ġb.
  EXPECT_EQ(tokens(*t, "a   b"), (Tokens{"a", "ĠĠ", "Ġb"}));
  EXPECT_EQ(tokens(*t, "a  "), (Tokens{"a", "ĠĠ"}));  // trailing: one piece
  // Digits stay one piece (\p{N}+): 12|34; a letter after them starts another.
  EXPECT_EQ(tokens(*t, "1234x"), (Tokens{"12", "34", "x"}));
  // Without the regex the same merges cross everything: o+Ġ first.
  const auto whole = make(tokenizer_json(m, byte_level_only()));
  EXPECT_EQ(tokens(*whole, "hello world"), (Tokens{"h", "e", "l", "l", "oĠ", "w", "o", "r", "l", "d"}));
  EXPECT_EQ(tokens(*whole, "it's"), (Tokens{"i", "t'", "s"}));
}

TEST(ByteLevelBpe, Llama3SplitPattern) {
  const std::vector<std::pair<std::string, std::string>> m = {
      {"3", "4"}, {"1", "2"}, {"12", "3"}, {"'", "S"}, {"T", "'"}, {"Ġ", "Ġ"}, {"!", "Ċ"}, {"Ċ", "Ċ"}};
  const auto t = make(tokenizer_json(m, llama3_pre()));
  // \p{N}{1,3}: 123|456|7 — the 3+4 merge (rank 0) never sees its pair.
  EXPECT_EQ(tokens(*t, "1234567"), (Tokens{"123", "4", "5", "6", "7"}));
  // (?i:'s|...) takes "'S" in upper case; T+' would have merged first.
  EXPECT_EQ(tokens(*t, "IT'S"), (Tokens{"I", "T", "'S"}));
  // " ?[^\s\p{L}\p{N}]+[\r\n]*" keeps newlines after punctuation with it;
  // "\s*[\r\n]+" takes a run of newlines.
  EXPECT_EQ(tokens(*t, "hi!\n\nyo"), (Tokens{"h", "i", "!Ċ", "Ċ", "y", "o"}));
  EXPECT_EQ(tokens(*t, "a\n\nb"), (Tokens{"a", "ĊĊ", "b"}));
  // A letter run may start with one non-letter, non-digit (here a space).
  EXPECT_EQ(tokens(*t, "x  yz"), (Tokens{"x", "Ġ", "Ġ", "y", "z"}));
}

TEST(ByteLevelBpe, SplitOnALiteralString) {
  // {"String": "-"} cuts at every '-' (not a regex: '.' is a dot); a+- would
  // merge first without the cut.
  json pre = llama3_pre();
  pre["pretokenizers"][0]["pattern"] = {{"String", "-."}};
  const auto t = make(tokenizer_json({{"a", "-"}, {"-", "."}, {"b", "c"}}, pre));
  EXPECT_EQ(tokens(*t, "a-.bc"), (Tokens{"a", "-.", "bc"}));
  EXPECT_EQ(tokens(*t, "a-xbc"), (Tokens{"a-", "x", "bc"}));  // no "-." here: one piece
}

TEST(ByteLevelBpe, AddPrefixSpace) {
  const auto t = make(tokenizer_json({{"Ġ", "h"}, {"Ġh", "i"}}, byte_level_only(true)));
  EXPECT_EQ(tokens(*t, "hi"), (Tokens{"Ġhi"}));
  EXPECT_EQ(tokens(*t, " hi"), (Tokens{"Ġhi"}));  // already starts with a space
  // The space is text: it decodes back.
  EXPECT_EQ(t->decode(t->encode("hi")), " hi");
}

TEST(ByteLevelBpe, IgnoreMergesTakesWholeVocabularyWords) {
  json j = tokenizer_json({{"a", "b"}}, gpt2_pre(), {"abc"});
  EXPECT_EQ(tokens(*make(j), "abc"), (Tokens{"ab", "c"}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(tokens(*make(j), "abc"), (Tokens{"abc"}));
  EXPECT_EQ(tokens(*make(j), "abcab"), (Tokens{"ab", "c", "ab"}));  // not in the vocabulary: merged
}

TEST(ByteLevelBpe, SpecialTokensAndDecoding) {
  const auto t = make(tokenizer_json({{"h", "i"}}, gpt2_pre()));
  EXPECT_EQ(t->name(), "hf-bpe");
  EXPECT_EQ(t->vocab_size(), 303);  // ids 257..299 have no token
  EXPECT_EQ(t->eos_id(), 300);      // <|endoftext|>
  EXPECT_EQ(t->bos_id(), 301);      // <|begin_of_text|>
  EXPECT_EQ(t->token(300), "<|endoftext|>");
  EXPECT_EQ(t->token_id("<|eot_id|>"), 302);
  EXPECT_EQ(t->token_id("nope"), -1);
  // A special token's text inside a document is text, never the special id.
  EXPECT_EQ(tokens(*t, "hi<|endoftext|>"),
            (Tokens{"hi", "<", "|", "e", "n", "d", "o", "f", "t", "e", "x", "t", "|", ">"}));
  EXPECT_EQ(t->decode(t->encode("hi<|endoftext|>")), "hi<|endoftext|>");
  // decode drops EOS, spells the other added tokens.
  std::vector<token_t> seq{301, 104, 105, 302, 300};
  EXPECT_EQ(t->decode(seq), "<|begin_of_text|>hi<|eot_id|>");
  EXPECT_THROW(t->decode(std::vector<token_t>{270}), core::DataError);  // no token
  EXPECT_THROW(t->decode(std::vector<token_t>{303}), core::DataError);  // >= vocab_size
  EXPECT_THROW(t->token(280), core::DataError);
  // EOS named by text or by id.
  ByteLevelBpeOptions o;
  o.eos_token = "<|eot_id|>";
  EXPECT_EQ(make(tokenizer_json({}, gpt2_pre()), o)->eos_id(), 302);
  o = {};
  o.eos_id = 301;
  EXPECT_EQ(make(tokenizer_json({}, gpt2_pre()), o)->eos_id(), 301);
}

TEST(ByteLevelBpe, AddedTokenOutsideTheAlphabetDecodesAsItsText) {
  json j = tokenizer_json({}, gpt2_pre());
  j["added_tokens"].push_back({{"id", 303}, {"content", "<→>"}, {"special", true}});
  const auto t = make(j);
  EXPECT_EQ(t->decode(std::vector<token_t>{303, 'a'}), "<→>a");
}

TEST(ByteLevelBpe, RoundTripsAnyText) {
  const auto t = make(tokenizer_json({{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"e", "s"}}, llama3_pre()));
  for (const auto& d : test::jsonl_texts(test::tiny_jsonl())) EXPECT_EQ(t->decode(t->encode(d)), d);
  const std::string odd = "  two  spaces\n\n\ttab, 1234567, Grüße, 日本語, e\xCC\x81, emoji \xF0\x9F\x91\xA8\xE2\x80\x8D"
                          "\xF0\x9F\x91\xA9 \x00\x01 end";
  EXPECT_EQ(t->decode(t->encode(odd)), odd);
  // Invalid UTF-8 becomes U+FFFD, as HF's tokenizers (valid UTF-8 only) would need.
  EXPECT_EQ(t->decode(t->encode("a\xff" "b")), "a\xEF\xBF\xBD" "b");
  EXPECT_TRUE(t->encode("").empty());
}

TEST(ByteLevelBpe, ModelIsTheJsonAndMakeTokenizerRebuildsIt) {
  ByteLevelBpeOptions o;
  o.eos_token = "<|eot_id|>";
  const auto t = make(tokenizer_json({{"h", "i"}}, llama3_pre()), o);
  const auto again = make_tokenizer("hf-bpe", t->model(), "ds.h5", t->eos_id());
  EXPECT_EQ(again->name(), "hf-bpe");
  EXPECT_EQ(again->eos_id(), 302);
  EXPECT_EQ(again->vocab_size(), t->vocab_size());
  EXPECT_EQ(again->encode("hi there"), t->encode("hi there"));
  EXPECT_EQ(make_tokenizer("hf-bpe", t->model(), "ds.h5")->eos_id(), 300);  // the rule
  // A file round trip through load().
  const auto path = test::scratch("tok.json");
  test::write_file(path, t->model());
  EXPECT_EQ(ByteLevelBpeTokenizer::load(path.string())->encode("hi"), t->encode("hi"));
  EXPECT_NE(error_of([&] { make_tokenizer("hf-bpe", t->model(), "ds.h5", 104); })
                .find("ds.h5: eos_id 104 is not the id of a special added token"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_tokenizer("wordpiece", "", "ds.h5"); }).find("expected bytes, sentencepiece or hf-bpe"),
            std::string::npos);
}

TEST(ByteLevelBpe, RefusalsNameTheFieldAndTheRule) {
  const json good = tokenizer_json({{"h", "i"}}, gpt2_pre());
  const auto refused = [&](const std::function<void(json&)>& edit, const std::string& expect,
                           const ByteLevelBpeOptions& o = {}) {
    json j = good;
    edit(j);
    const std::string msg = error_of([&] { make(j, o); });
    EXPECT_NE(msg.find("test.json: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(expect), std::string::npos) << "expected '" << expect << "' in: " << msg;
  };
  EXPECT_NE(error_of([] { ByteLevelBpeTokenizer::from_json("{\"model\": ", "t.json"); })
                .find("t.json: not a Hugging Face tokenizer.json (not JSON"),
            std::string::npos);
  refused([](json& j) { j["model"]["type"] = "WordPiece"; },
          "model.type is 'WordPiece'; wlb4d reads only byte-level BPE tokenizers");
  refused([](json& j) { j["model"].erase("vocab"); }, "model.vocab is missing");
  refused([](json& j) { j["model"]["vocab"]["x"] = -3; }, "model.vocab[\"x\"] = -3 is not a token id");
  refused([](json& j) { j["model"]["vocab"]["zz"] = 104; }, "model.vocab gives id 104 to both");
  refused([](json& j) { j["model"]["vocab"].erase("A"); }, "model.vocab has no token \"A\" for byte 0x41");
  refused([](json& j) { j["model"].erase("merges"); }, "model.merges is missing");
  refused([](json& j) { j["model"]["merges"] = {"h i x"}; }, "model.merges[0] \"h i x\" is not two tokens");
  refused([](json& j) { j["model"]["merges"] = {json::array({"h"})}; }, "is neither \"a b\" nor [\"a\", \"b\"]");
  refused([](json& j) { j["model"]["merges"] = {"hi i"}; }, "\"hii\" is not in model.vocab");
  refused([](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout is 0.1");
  refused([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "model.continuing_subword_prefix is \"##\"");
  refused([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer.type is 'NFC'; wlb4d implements no normalizer");
  refused([](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer is null");
  refused([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre_tokenizer.type is 'Whitespace'");
  refused([](json& j) { j["pre_tokenizer"] = llama3_pre(); j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
          "pre_tokenizer.pretokenizers[0].behavior is 'Removed'; only \"Isolated\"");
  refused([](json& j) { j["pre_tokenizer"] = llama3_pre(); j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(\\p{L}"}}; },
          "pre_tokenizer.pretokenizers[0].pattern.Regex '(\\p{L}' is not a regular expression PCRE2 compiles "
          "(at offset 6: missing closing parenthesis)");
  refused([](json& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {byte_level_only(), llama3_pre()["pretokenizers"][0]}}}; },
          "pre_tokenizer.pretokenizers[0] is ByteLevel but not the last step");
  refused([](json& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {llama3_pre()["pretokenizers"][0]}}}; },
          "pre_tokenizer has no ByteLevel step");
  refused([](json& j) { j["decoder"] = nullptr; }, "decoder is null; a byte-level BPE decodes with ByteLevel");
  refused([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder is 'WordPiece'");
  refused([](json& j) { j["added_tokens"][1]["special"] = false; },
          "added_tokens[1] \"<|begin_of_text|>\" has special = false");
  refused([](json& j) { j["added_tokens"][1]["id"] = 104; }, "added_tokens gives id 104 to \"<|begin_of_text|>\" but "
                                                            "model.vocab has \"h\" there");
  refused([](json& j) { j["added_tokens"][1]["id"] = 300; }, "added_tokens give id 300 to both");
  refused([](json& j) { j["added_tokens"].erase(0); }, "no end-of-text token: no special added token is one of "
                                                       "<|end_of_text|>, <|endoftext|>, </s>, <eos>");
  ByteLevelBpeOptions o;
  o.eos_token = "hi";
  refused([](json&) {}, "EOS token \"hi\" is not a special added token", o);
  o.eos_id = 300;
  refused([](json&) {}, "name the EOS by its text or by its id, not both", o);
  // A file that is missing, or not a regular file, names its path.
  EXPECT_NE(error_of([] { ByteLevelBpeTokenizer::load("no/such/tokenizer.json"); })
                .find("no/such/tokenizer.json: cannot open tokenizer.json file"),
            std::string::npos);
  EXPECT_NE(error_of([] { ByteLevelBpeTokenizer::load("/dev/null"); }).find("is not a regular file"), std::string::npos);
}

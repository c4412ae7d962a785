// Corpus reading rules: JSONL, .xz, .txt, directories, skipped/repaired documents, errors.
#include "test_helpers.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/corpus.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

using namespace wlb;
using namespace wlb::data;

TEST(Utf8, ValidationAndRepair) {
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("Gr\xC3\xBC\xC3\x9F" "e \xE2\x82\xAC \xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(is_valid_utf8("abc\xE2\x82"));       // truncated
  std::int64_t n = 0;
  EXPECT_EQ(repair_utf8("a\xFF" "b", &n), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(n, 1);
  // A truncated 3-byte sequence is one maximal subpart -> one U+FFFD.
  EXPECT_EQ(repair_utf8("x\xE2\x82y", &n), "x\xEF\xBF\xBDy");
  EXPECT_EQ(n, 1);
  EXPECT_EQ(repair_utf8("ok", &n), "ok");
  EXPECT_EQ(n, 0);
}

TEST(Corpus, ReadsTinyJsonlInOrder) {
  CorpusStats st;
  auto docs = read_corpus({test::tiny_jsonl()}, &st);
  EXPECT_EQ(docs, test::jsonl_texts(test::tiny_jsonl()));
  EXPECT_EQ(st.files, 1);
  EXPECT_EQ(st.documents, 20);
  EXPECT_EQ(st.empty_skipped + st.no_text_skipped + st.utf8_repaired, 0);
  auto first5 = read_corpus({test::tiny_jsonl()}, &st, 5);
  ASSERT_EQ(first5.size(), 5u);
  EXPECT_EQ(first5[4], docs[4]);
}

TEST(Corpus, SkipsEmptyAndTextlessAndRepairsUtf8AsDocumented) {
  auto p = test::scratch("rules.jsonl");
  test::write_file(p,
                   "{\"text\": \"first\"}\n"
                   "\n"                                  // blank line: ignored
                   "{\"text\": \"\"}\n"                  // empty: skipped
                   "{\"text\": \"  \\n\\t \"}\n"         // whitespace only: skipped
                   "{\"title\": \"no text\"}\n"          // no "text": skipped
                   "{\"text\": 42}\n"                    // not a string: skipped
                   "{\"text\": \"bad \xFF byte\"}\r\n"   // invalid UTF-8: repaired; CRLF ok
                   "{\"text\": \"last\", \"id\": 7}");   // no final newline
  CorpusStats st;
  auto docs = read_corpus({p.string()}, &st);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "first");
  EXPECT_EQ(docs[1], "bad \xEF\xBF\xBD byte");
  EXPECT_EQ(docs[2], "last");
  EXPECT_EQ(st.empty_skipped, 2);
  EXPECT_EQ(st.no_text_skipped, 2);
  EXPECT_EQ(st.utf8_repaired, 1);
}

TEST(Corpus, MalformedJsonNamesFileAndLine) {
  auto p = test::scratch("broken.jsonl");
  test::write_file(p, "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  try {
    read_corpus({p.string()}, nullptr);
    FAIL() << "expected DataError";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find(p.string() + ":2: malformed JSON"), std::string::npos) << e.what();
  }
  test::write_file(p, "[1, 2]\n");
  EXPECT_THROW(read_corpus({p.string()}, nullptr), core::DataError);
}

TEST(Corpus, TxtXzAndDirectories) {
  auto dir = test::scratch("dir");
  std::filesystem::create_directories(dir / "sub");
  test::write_file(dir / "b.txt", "document B\nsecond line\n");
  test::write_file(dir / "a.txt", "document A");
  test::write_file(dir / "notes.md", "ignored");
  test::write_file(dir / "sub" / "c.jsonl", "{\"text\": \"C1\"}\n{\"text\": \"C2\"}\n");
  test::write_file(dir / "sub" / "empty.txt", "\n\n");
  auto xz = dir / "sub" / "d.jsonl";
  test::write_file(xz, "{\"text\": \"D from xz\"}\n");
  ASSERT_EQ(std::system(("xz -f " + xz.string()).c_str()), 0);
  CorpusStats st;
  auto docs = read_corpus({dir.string()}, &st);
  std::vector<std::string> want{"document A", "document B\nsecond line\n", "C1", "C2", "D from xz"};
  EXPECT_EQ(docs, want);
  EXPECT_EQ(st.files, 5);
  EXPECT_EQ(st.ignored_files, 1);
  EXPECT_EQ(st.empty_skipped, 1);
}

TEST(Corpus, MissingInputsAndBadXzAreErrors) {
  EXPECT_THROW(read_corpus({"/no/such/corpus.jsonl"}, nullptr), core::DataError);
  auto md = test::scratch("x.md");
  test::write_file(md, "x");
  EXPECT_THROW(read_corpus({md.string()}, nullptr), core::DataError);
  // A corpus file is read whole: a symlink x.jsonl -> /dev/zero is refused, not read.
  auto dev = test::scratch("zero.jsonl");
  std::filesystem::remove(dev);
  std::filesystem::create_symlink("/dev/zero", dev);
  try {
    read_corpus({dev.string()}, nullptr);
    FAIL() << "expected DataError";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("zero.jsonl: input is not a regular file or a directory"),
              std::string::npos) << e.what();
  }
  auto bad = test::scratch("bad.jsonl.xz");
  test::write_file(bad, "this is not xz data");
  try {
    read_corpus({bad.string()}, nullptr);
    FAIL() << "expected DataError";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("xz -dc' failed"), std::string::npos) << e.what();
  }
}

TEST(Corpus, JsonKeysReadEveryListedFieldInOrder) {
  auto p = test::scratch("keys.jsonl");
  test::write_file(p,
                   "{\"title\": \"T1\", \"body\": \"B1\", \"text\": \"ignored\"}\n"
                   "{\"body\": \"B2\"}\n"          // one of the keys: one document
                   "{\"text\": \"only text\"}\n"   // none of the keys: skipped, counted
                   "{\"title\": 7, \"body\": \"B4\"}\n");
  CorpusStats st;
  CorpusOptions co;
  co.json_keys = {"title", "body"};
  auto docs = read_corpus({p.string()}, &st, -1, co);
  EXPECT_EQ(docs, (std::vector<std::string>{"T1", "B1", "B2", "B4"}));
  EXPECT_EQ(st.no_text_skipped, 1);
  EXPECT_EQ(read_corpus({p.string()}, &st, 2, co).size(), 2u);  // max_docs counts documents
  co.json_keys.clear();
  EXPECT_THROW(read_corpus({p.string()}, &st, -1, co), core::ConfigError);
}

TEST(Corpus, TxtSplitRules) {
  auto p = test::scratch("split.txt");
  test::write_file(p, "First para\nline two\n\n \t\nSecond para\r\n\n\nThird\n");
  CorpusOptions co;
  EXPECT_EQ(read_corpus({p.string()}, nullptr, -1, co).size(), 1u);  // default: one document per file
  co.txt_split = parse_txt_split("blank-line");
  EXPECT_EQ(read_corpus({p.string()}, nullptr, -1, co),
            (std::vector<std::string>{"First para\nline two", "Second para\r", "Third"}));
  co.txt_split = parse_txt_split("line");
  EXPECT_EQ(read_corpus({p.string()}, nullptr, -1, co),
            (std::vector<std::string>{"First para", "line two", "Second para\r", "Third"}));
  EXPECT_THROW(parse_txt_split("paragraph"), core::ConfigError);
}

TEST(Corpus, FineTuningRecordsBecomeSegments) {
  auto p = test::scratch("sft.jsonl");
  test::write_file(p,
                   "{\"prompt\": \"Q: hi\\nA: \", \"response\": \"hello\"}\n"
                   "\n"
                   "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n");
  CorpusStats st;
  auto docs = read_sft_corpus({p.string()}, &st);
  ASSERT_EQ(docs.size(), 2u);
  ASSERT_EQ(docs[0].size(), 2u);
  EXPECT_EQ(docs[0][0].text, "Q: hi\nA: ");
  EXPECT_FALSE(docs[0][0].target);
  EXPECT_EQ(docs[0][1].text, "hello");
  EXPECT_TRUE(docs[0][1].target);
  ASSERT_EQ(docs[1].size(), 4u);
  EXPECT_EQ(docs[1][0].text, "<|user|>\n");
  EXPECT_EQ(docs[1][1].text, "u\n");
  EXPECT_FALSE(docs[1][1].target);
  EXPECT_EQ(docs[1][2].text, "<|assistant|>\n");
  EXPECT_FALSE(docs[1][2].target);
  EXPECT_EQ(docs[1][3].text, "a\n");
  EXPECT_TRUE(docs[1][3].target);
  EXPECT_EQ(st.documents, 2);
  // Custom field names (--json-keys instruction,output).
  auto q = test::scratch("alpaca.jsonl");
  test::write_file(q, "{\"instruction\": \"Do\", \"output\": \"Done\"}\n");
  EXPECT_EQ(read_sft_corpus({q.string()}, nullptr, -1, "instruction", "output")[0][1].text, "Done");
}

TEST(Corpus, FineTuningRecordErrorsNameFileLineAndRule) {
  auto expect = [](const std::string& line, const std::string& frag) {
    auto p = test::scratch("sft-bad.jsonl");
    test::write_file(p, "{\"prompt\": \"ok\", \"response\": \"ok\"}\n" + line + "\n");
    try {
      read_sft_corpus({p.string()}, nullptr);
      ADD_FAILURE() << "expected DataError for " << line;
    } catch (const core::DataError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("sft-bad.jsonl:2: "), std::string::npos) << m;
      EXPECT_NE(m.find(frag), std::string::npos) << m;
    }
  };
  expect("{\"prompt\": \"no response\"}", "without a response");
  expect("{\"prompt\": \"p\", \"response\": \"  \"}", "non-blank string");
  expect("{\"prompt\": 3, \"response\": \"r\"}", "without a string \"prompt\"");
  expect("{\"text\": \"plain\"}", "needs \"messages\" (chat) or \"prompt\" and \"response\"");
  expect("{\"messages\": {\"role\": \"user\"}}", "must be an array");
  expect("{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}]}", "no \"assistant\" turn");
  expect("{\"messages\": [{\"role\": \"assistant\"}]}", "messages[0] needs a string \"content\"");
  auto t = test::scratch("sft.txt");
  test::write_file(t, "text");
  EXPECT_THROW(read_sft_corpus({t.string()}, nullptr), core::DataError);
}

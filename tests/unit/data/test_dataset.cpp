// Token dataset: writer + reader against the JSONL source, spans, schema errors.
#include "test_helpers.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/data/prep.hpp"
#include "wlb4d/data/tokenizer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <hdf5.h>

#include <functional>
#include <numeric>

using namespace wlb;
using namespace wlb::data;

namespace {

/// tiny.jsonl prepared with the bytes tokenizer (once per test binary).
const std::string& tiny_bytes_h5() {
  static std::string path = [] {
    PrepOptions o;
    o.inputs = {test::tiny_jsonl()};
    o.output = test::scratch("tiny-bytes.h5").string();
    run_prep(o);
    return o.output;
  }();
  return path;
}

/// Expects a DataError whose message contains every fragment.
void expect_data_error(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "expected DataError";
  } catch (const core::DataError& e) {
    for (const auto& frag : fragments)
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << "'" << frag << "' not in: " << e.what();
  }
}

/// Writes a hand-made file: an edit hook may break the schema.
std::string write_custom(const std::string& name, const std::function<void(hid_t)>& edit) {
  auto path = test::scratch(name).string();
  {
    TokenDatasetWriter w(path, "bytes", 257, 256, "unit test", "");
    w.append({72, 105});
    w.append({33});
    w.finish();
  }
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  edit(f);
  H5Fclose(f);
  return path;
}

template <class T>
void replace_dataset(hid_t f, const char* name, hid_t type, const std::vector<T>& v, hid_t memtype) {
  H5Ldelete(f, name, H5P_DEFAULT);
  hsize_t n = v.size();
  hid_t s = H5Screate_simple(1, &n, nullptr);
  hid_t d = H5Dcreate2(f, name, type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Dclose(d);
  H5Sclose(s);
}

}  // namespace

TEST(TokenDataset, MatchesJsonlSource) {
  auto texts = test::jsonl_texts(test::tiny_jsonl());
  auto ds = TokenDataset::open(tiny_bytes_h5());
  EXPECT_EQ(ds.tokenizer(), "bytes");
  EXPECT_EQ(ds.vocab_size(), 257);
  EXPECT_EQ(ds.eos_id(), 256);
  EXPECT_EQ(ds.tokenizer_model(), "");
  EXPECT_EQ(ds.source(), test::tiny_jsonl());
  ASSERT_EQ(ds.num_docs(), static_cast<std::int64_t>(texts.size()));
  EXPECT_EQ(ds.doc_offset(0), 0);
  EXPECT_EQ(ds.doc_offset(ds.num_docs()), ds.num_tokens());
  EXPECT_TRUE(ds.chunk_checksums());
  ByteTokenizer tok;
  std::int64_t total = 0;
  for (std::int64_t d = 0; d < ds.num_docs(); ++d) {
    const std::string& t = texts[static_cast<std::size_t>(d)];
    ASSERT_EQ(ds.doc_length(d), static_cast<std::int64_t>(t.size()) + 1);  // bytes + EOS
    total += ds.doc_length(d);
    std::vector<token_t> buf(static_cast<std::size_t>(ds.doc_length(d)));
    ds.read(d, 0, ds.doc_length(d), buf.data());
    EXPECT_EQ(buf.back(), 256u);
    EXPECT_EQ(tok.decode(buf), t);
    // A span in the middle of the document.
    std::vector<token_t> mid(7);
    ds.read(d, 3, 7, mid.data());
    EXPECT_EQ(tok.decode(mid), t.substr(3, 7));
  }
  EXPECT_EQ(total, ds.num_tokens());
}

TEST(TokenDataset, GlobalRangesCrossDocumentBoundaries) {
  auto texts = test::jsonl_texts(test::tiny_jsonl());
  std::vector<token_t> expect;  // the source, concatenated with EOS after each document
  for (const auto& t : texts) {
    for (unsigned char c : t) expect.push_back(c);
    expect.push_back(256);
  }
  auto ds = TokenDataset::open(tiny_bytes_h5());
  ASSERT_EQ(ds.num_tokens(), static_cast<std::int64_t>(expect.size()));
  for (std::int64_t d = 1; d + 1 < ds.num_docs() + 1; d += 3) {
    std::int64_t begin = ds.doc_offset(d) - 10;  // 10 before the boundary ...
    std::int64_t count = 10 + ds.doc_length(d) + 5;  // ... past the next one
    count = std::min(count, ds.num_tokens() - begin);
    std::vector<token_t> got(static_cast<std::size_t>(count));
    ds.read_tokens(begin, count, got.data());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), expect.begin() + begin)) << "range at doc " << d;
  }
  std::vector<token_t> all(expect.size());
  ds.read_tokens(0, ds.num_tokens(), all.data());
  EXPECT_EQ(all, expect);
  ds.read_tokens(ds.num_tokens(), 0, nullptr);  // empty range at the end is fine
}

TEST(TokenDataset, OutOfRangeRequestsAreDataErrors) {
  auto ds = TokenDataset::open(tiny_bytes_h5());
  std::vector<token_t> buf(100000);
  expect_data_error([&] { ds.doc_length(ds.num_docs()); }, {tiny_bytes_h5(), "out of range"});
  expect_data_error([&] { ds.read(0, 1, ds.doc_length(0), buf.data()); }, {"leaves document 0"});
  expect_data_error([&] { ds.read_tokens(ds.num_tokens() - 1, 2, buf.data()); }, {"leaves dataset 'tokens'"});
  expect_data_error([&] { ds.read_tokens(-1, 2, buf.data()); }, {"leaves dataset 'tokens'"});
}

TEST(TokenDataset, MovableAndIdentity) {
  auto a = TokenDataset::open(tiny_bytes_h5());
  std::string id = a.identity();
  EXPECT_NE(id.find("docs=20"), std::string::npos) << id;
  EXPECT_NE(id.find("offsets_fnv1a="), std::string::npos) << id;
  TokenDataset b = std::move(a);
  EXPECT_EQ(b.identity(), id);
  EXPECT_EQ(b.num_docs(), 20);
  token_t t = 0;
  b.read(0, 0, 1, &t);
  EXPECT_LT(t, 256u);
  auto c = TokenDataset::open(tiny_bytes_h5());
  c = std::move(b);
  EXPECT_EQ(c.identity(), id);
}

// A copy of the file elsewhere, touched later, is the same data: only path
// and mtime differ, and the content identity drops exactly those.
TEST(TokenDataset, ContentIdentityIgnoresPathAndMtimeOnly) {
  const auto copy = test::scratch("tiny-bytes-copy.h5");
  std::filesystem::copy_file(tiny_bytes_h5(), copy, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::last_write_time(copy, std::filesystem::file_time_type::clock::now() + std::chrono::hours(1));
  const auto a = TokenDataset::open(tiny_bytes_h5()).identity();
  const auto b = TokenDataset::open(copy.string()).identity();
  EXPECT_NE(a, b);
  EXPECT_EQ(TokenDataset::content_identity(a), TokenDataset::content_identity(b));
  EXPECT_EQ(TokenDataset::content_identity(a).find("path="), std::string::npos);
  EXPECT_EQ(TokenDataset::content_identity(a).find("mtime="), std::string::npos);
  EXPECT_NE(TokenDataset::content_identity(a).find(";offsets_fnv1a="), std::string::npos);
  // Two files: the entries stay apart, each without its path and mtime.
  EXPECT_EQ(TokenDataset::content_identity("path=/a;size=1;mtime=2;docs=3|path=/b;size=4;mtime=5;docs=6"),
            "size=1;docs=3|size=4;docs=6");
  // Another document boundary is another dataset.
  EXPECT_NE(TokenDataset::content_identity("path=/a;size=1;mtime=2;docs=3;offsets_fnv1a=x"),
            TokenDataset::content_identity("path=/a;size=1;mtime=2;docs=3;offsets_fnv1a=y"));
}

TEST(TokenDataset, SentencePieceDatasetCarriesItsModel) {
  PrepOptions o;
  o.inputs = {test::tiny_jsonl()};
  o.output = test::scratch("tiny-spm.h5").string();
  o.tokenizer = "sentencepiece";
  o.vocab_size = 400;
  auto s = run_prep(o);
  EXPECT_EQ(s.vocab_size, 400);
  auto ds = TokenDataset::open(o.output);
  EXPECT_EQ(ds.tokenizer(), "sentencepiece");
  EXPECT_EQ(ds.vocab_size(), 400);
  EXPECT_EQ(ds.eos_id(), 2);
  auto tok = make_tokenizer(ds.tokenizer(), ds.tokenizer_model(), ds.path());
  auto texts = test::jsonl_texts(test::tiny_jsonl());
  for (std::int64_t d = 0; d < ds.num_docs(); ++d) {
    std::vector<token_t> buf(static_cast<std::size_t>(ds.doc_length(d)));
    ds.read(d, 0, ds.doc_length(d), buf.data());
    EXPECT_EQ(buf.back(), 2u);
    EXPECT_EQ(tok->decode(buf), texts[static_cast<std::size_t>(d)]);
  }
}

TEST(TokenDataset, MissingNotHdf5AndTruncatedFiles) {
  expect_data_error([] { TokenDataset::open("/no/such/file.h5"); }, {"/no/such/file.h5", "does not exist"});
  auto txt = test::scratch("not.h5");
  test::write_file(txt, "just text, not HDF5");
  expect_data_error([&] { TokenDataset::open(txt.string()); }, {txt.string(), "not an HDF5 file"});
  // Cut a real dataset in half: the superblock survives, the data does not.
  std::string bytes = test::read_file(tiny_bytes_h5());
  auto cut = test::scratch("truncated.h5");
  test::write_file(cut, bytes.substr(0, bytes.size() / 2));
  expect_data_error([&] { TokenDataset::open(cut.string()); }, {cut.string(), "truncated"});
}

TEST(TokenDataset, WrongSchemaIsNamed) {
  auto p = write_custom("no-tokens.h5", [](hid_t f) { H5Ldelete(f, "tokens", H5P_DEFAULT); });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "dataset 'tokens'", "is missing"});

  p = write_custom("no-offsets.h5", [](hid_t f) { H5Ldelete(f, "doc_offsets", H5P_DEFAULT); });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "dataset 'doc_offsets'", "is missing"});

  p = write_custom("int64-tokens.h5", [](hid_t f) {
    replace_dataset<std::int64_t>(f, "tokens", H5T_STD_I64LE, {72, 105, 256, 33, 256}, H5T_NATIVE_INT64);
  });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "dataset 'tokens'", "dtype uint32"});

  p = write_custom("2d-tokens.h5", [](hid_t f) {
    H5Ldelete(f, "tokens", H5P_DEFAULT);
    hsize_t dims[2] = {5, 1};
    hid_t s = H5Screate_simple(2, dims, nullptr);
    hid_t d = H5Dcreate2(f, "tokens", H5T_STD_U32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(d);
    H5Sclose(s);
  });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "dataset 'tokens'", "must be 1-D"});

  p = write_custom("float-offsets.h5", [](hid_t f) {
    replace_dataset<double>(f, "doc_offsets", H5T_IEEE_F64LE, {0, 3, 5}, H5T_NATIVE_DOUBLE);
  });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "dataset 'doc_offsets'", "dtype uint64"});

  p = write_custom("nonmonotone.h5", [](hid_t f) {
    replace_dataset<std::uint64_t>(f, "doc_offsets", H5T_STD_U64LE, {0, 4, 3, 5}, H5T_NATIVE_UINT64);
  });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "doc_offsets", "strictly increasing"});

  p = write_custom("short-offsets.h5", [](hid_t f) {
    replace_dataset<std::uint64_t>(f, "doc_offsets", H5T_STD_U64LE, {0, 3}, H5T_NATIVE_UINT64);
  });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "doc_offsets", "must end at num_tokens = 5"});

  p = write_custom("no-format.h5", [](hid_t f) { H5Adelete(f, "format"); });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "missing root attribute 'format'"});

  p = write_custom("no-vocab.h5", [](hid_t f) { H5Adelete(f, "vocab_size"); });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "missing root attribute 'vocab_size'"});
}

TEST(TokenDataset, TokenAboveVocabIsCaughtAtOpen) {
  auto p = write_custom("big-token.h5", [](hid_t f) {
    replace_dataset<std::uint32_t>(f, "tokens", H5T_STD_U32LE, {72, 105, 256, 9999, 256}, H5T_NATIVE_UINT32);
  });
  // The open's checksum pass reads every id (before: found only by a read of that span).
  expect_data_error([&] { TokenDataset::open(p); }, {p, "'tokens'", "9999", "index 3", "vocab_size 257"});
}

TEST(TokenDataset, TokenAboveVocabIsCaughtOnReadWithoutChecksum) {
  auto p = write_custom("big-token-old.h5", [](hid_t f) {
    replace_dataset<std::uint32_t>(f, "tokens", H5T_STD_U32LE, {72, 105, 256, 9999, 256}, H5T_NATIVE_UINT32);
    H5Adelete(f, "tokens_fnv1a64");  // as written before the checksum existed
    H5Adelete(f, "max_token_id");
  });
  auto ds = TokenDataset::open(p);  // an older dataset: tokens are checked when read
  EXPECT_FALSE(ds.has_checksum());
  std::vector<token_t> buf(3);
  ds.read(0, 0, 3, buf.data());
  expect_data_error([&] { ds.read(1, 0, 2, buf.data()); }, {p, "'tokens'", "9999", "index 3", "vocab_size 257"});
}

TEST(TokenDataset, MaxTokenIdAndChecksumAreCheckedAtOpen) {
  // The writer's attributes against an independent scan of what it wrote.
  auto p = write_custom("intact.h5", [](hid_t) {});
  {
    auto ds = TokenDataset::open(p);
    EXPECT_TRUE(ds.has_checksum());
    std::vector<token_t> all(std::size_t(ds.num_tokens()));
    ds.read_tokens(0, ds.num_tokens(), all.data());
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    std::int64_t max_id = -1;
    hid_t a = H5Aopen(f, "max_token_id", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, &max_id);
    H5Aclose(a);
    H5Fclose(f);
    EXPECT_EQ(max_id, std::int64_t(*std::max_element(all.begin(), all.end())));
  }
  // A token byte changed inside the vocabulary: only the checksum sees it.
  p = write_custom("flipped-token.h5", [](hid_t f) {
    replace_dataset<std::uint32_t>(f, "tokens", H5T_STD_U32LE, {72, 104, 256, 33, 256}, H5T_NATIVE_UINT32);
  });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "'tokens' does not match its checksum", "tokens_fnv1a64"});
  // Ids up to 300 with vocab_size 257 (e.g. prepared for another tokenizer):
  // refused at open, naming the file, before any span is read.
  p = write_custom("small-vocab.h5", [](hid_t f) {
    H5Adelete(f, "max_token_id");
    const std::int64_t v = 300;
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "max_token_id", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Sclose(s);
  });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "'max_token_id' = 300 is not below vocab_size = 257"});
}

// ---- declared sizes are checked against the file before any read ---------------
namespace {
/// Sets (or replaces) a scalar int64 root attribute.
void set_attr_i64(hid_t f, const char* name, std::int64_t v) {
  if (H5Aexists(f, name) > 0) H5Adelete(f, name);
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a);
  H5Sclose(s);
}

/// Replaces /tokens by a chunked (chunk `chunk` ids), optionally deflated
/// dataset of extent `extent` whose first v.size() ids are written.
void chunked_tokens(hid_t f, const std::vector<std::uint32_t>& v, hsize_t extent, hsize_t chunk, bool deflate) {
  H5Ldelete(f, "tokens", H5P_DEFAULT);
  hsize_t maxdim = H5S_UNLIMITED;
  hid_t s = H5Screate_simple(1, &extent, &maxdim);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  if (deflate) H5Pset_deflate(dcpl, 6);
  hid_t d = H5Dcreate2(f, "tokens", H5T_STD_U32LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  hsize_t start = 0, count = v.size();
  hid_t fs = H5Dget_space(d);
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, nullptr, &count, nullptr);
  hid_t ms = H5Screate_simple(1, &count, nullptr);
  H5Dwrite(d, H5T_NATIVE_UINT32, ms, fs, H5P_DEFAULT, v.data());
  H5Sclose(ms);
  H5Sclose(fs);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(s);
}
constexpr std::uint64_t kTera = std::uint64_t{1} << 40;  // 2^40 ids: 4 TiB declared
}  // namespace

TEST(TokenDatasetBounds, SparseTokensAreRefusedBeforeTheChecksumPass) {
  // /tokens grown to 2^40 ids (only the first chunk written), offsets and
  // num_tokens consistent with it: the file is ~300 KB. Before, the open's
  // checksum pass read 4 TiB of fill values (hours); without a checksum the
  // run trained on zeros.
  for (const bool checksum : {true, false}) {
    const auto p = write_custom(checksum ? "sparse-tokens.h5" : "sparse-tokens-old.h5", [&](hid_t f) {
      hid_t d = H5Dopen2(f, "tokens", H5P_DEFAULT);
      hsize_t n = kTera;
      H5Dset_extent(d, &n);
      H5Dclose(d);
      replace_dataset<std::uint64_t>(f, "doc_offsets", H5T_STD_U64LE, {0, kTera}, H5T_NATIVE_UINT64);
      set_attr_i64(f, "num_tokens", static_cast<std::int64_t>(kTera));
      set_attr_i64(f, "num_docs", 1);
      if (!checksum) H5Adelete(f, "tokens_fnv1a64");
    });
    // (/tokens carries the Fletcher32 filter, so the rule for filtered datasets refuses it.)
    expect_data_error([&] { TokenDataset::open(p); },
                      {p, "dataset 'tokens' declares 1099511627776 elements (4398046511104 bytes)",
                       "compressed bytes are stored", "declared size must be backed"});
  }
}

TEST(TokenDatasetBounds, UnwrittenOffsetsAreRefusedBeforeTheyAreAllocated) {
  // 2^37 offsets declared, none written: before, a 1 TiB std::vector (bad_alloc).
  const auto p = write_custom("huge-offsets.h5", [](hid_t f) {
    H5Ldelete(f, "doc_offsets", H5P_DEFAULT);
    hsize_t n = hsize_t{1} << 37, chunk = 1 << 16;
    hid_t s = H5Screate_simple(1, &n, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, &chunk);
    H5Dclose(H5Dcreate2(f, "doc_offsets", H5T_STD_U64LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl);
    H5Sclose(s);
  });
  expect_data_error([&] { TokenDataset::open(p); },
                    {p, "dataset 'doc_offsets' declares 137438953472 elements", "no data stored in the file"});
  // More offsets than tokens (+1): each document holds at least its EOS.
  const auto q = write_custom("many-offsets.h5", [](hid_t f) {
    replace_dataset<std::uint64_t>(f, "doc_offsets", H5T_STD_U64LE, {0, 1, 2, 3, 4, 5, 6}, H5T_NATIVE_UINT64);
  });
  expect_data_error([&] { TokenDataset::open(q); },
                    {q, "dataset 'doc_offsets'", "declares 6 documents, more than the 5 tokens"});
}

TEST(TokenDatasetBounds, CountAttributesMustMatchTheExtents) {
  auto p = write_custom("num-tokens.h5", [](hid_t f) { set_attr_i64(f, "num_tokens", std::int64_t{1} << 40); });
  expect_data_error([&] { TokenDataset::open(p); },
                    {p, "root attribute 'num_tokens' = 1099511627776 does not match dataset 'tokens' of 5 tokens"});
  p = write_custom("num-docs.h5", [](hid_t f) { set_attr_i64(f, "num_docs", 7); });
  expect_data_error([&] { TokenDataset::open(p); },
                    {p, "root attribute 'num_docs' = 7 does not match dataset 'doc_offsets' of 3 entries"});
}

TEST(TokenDatasetBounds, CompressedDatasetsAreBoundedAndStillRead) {
  const std::vector<std::uint32_t> ids{72, 105, 256, 33, 256};
  // A deflated /tokens with every chunk written (another tool's writer): reads as usual.
  auto p = write_custom("deflated.h5", [&](hid_t f) { chunked_tokens(f, ids, ids.size(), 2, true); });
  {
    auto ds = TokenDataset::open(p);
    std::vector<token_t> all(5);
    ds.read_tokens(0, 5, all.data());
    EXPECT_EQ(std::vector<std::uint32_t>(all.begin(), all.end()), ids);
  }
  // Deflated, one chunk of 2^20 written out of 2^40: far beyond any compression.
  p = write_custom("deflated-sparse.h5", [&](hid_t f) {
    chunked_tokens(f, ids, kTera, hsize_t{1} << 20, true);
    replace_dataset<std::uint64_t>(f, "doc_offsets", H5T_STD_U64LE, {0, kTera}, H5T_NATIVE_UINT64);
    H5Adelete(f, "num_tokens");
    H5Adelete(f, "num_docs");
  });
  expect_data_error([&] { TokenDataset::open(p); },
                    {p, "dataset 'tokens' declares 1099511627776 elements", "compressed bytes are stored",
                     "1024-fold expansion"});
  // Deflated, 3 of 4 chunks written: a plausible ratio, but a chunk missing.
  p = write_custom("deflated-hole.h5", [&](hid_t f) {
    chunked_tokens(f, {72, 105, 256, 33, 256, 1, 2, 256, 3, 4, 5, 256}, 16, 4, true);
    replace_dataset<std::uint64_t>(f, "doc_offsets", H5T_STD_U64LE, {0, 16}, H5T_NATIVE_UINT64);
    H5Adelete(f, "num_tokens");
    H5Adelete(f, "num_docs");
  });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "dataset 'tokens'", "only 3 of its 4 chunks are stored"});
}

TEST(TokenDatasetBounds, SparseFileOnDiskIsRefused) {
  // Contiguous /tokens of 2^34 ids with only the first and last written: HDF5
  // sees a consistent 64 GiB file, the disk holds a few blocks of it (holes).
  const std::uint64_t n = std::uint64_t{1} << 34;
  const auto p = write_custom("sparse-file.h5", [&](hid_t f) {
    H5Ldelete(f, "tokens", H5P_DEFAULT);
    hsize_t ext = n;
    hid_t s = H5Screate_simple(1, &ext, nullptr);
    hid_t d = H5Dcreate2(f, "tokens", H5T_STD_U32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    for (hsize_t at : {hsize_t{0}, ext - 1}) {
      hsize_t one = 1;
      const std::uint32_t v = 256;
      hid_t fs = H5Dget_space(d);
      H5Sselect_hyperslab(fs, H5S_SELECT_SET, &at, nullptr, &one, nullptr);
      hid_t ms = H5Screate_simple(1, &one, nullptr);
      H5Dwrite(d, H5T_NATIVE_UINT32, ms, fs, H5P_DEFAULT, &v);
      H5Sclose(ms);
      H5Sclose(fs);
    }
    H5Dclose(d);
    H5Sclose(s);
    replace_dataset<std::uint64_t>(f, "doc_offsets", H5T_STD_U64LE, {0, n}, H5T_NATIVE_UINT64);
    H5Adelete(f, "num_tokens");
    H5Adelete(f, "num_docs");
    H5Adelete(f, "tokens_fnv1a64");
  });
  ASSERT_GE(std::filesystem::file_size(p), n * 4);
  expect_data_error([&] { TokenDataset::open(p); },
                    {p, "dataset 'tokens' declares 17179869184 elements", "bytes on disk", "sparse file"});
  std::filesystem::remove(p);
}

TEST(TokenDatasetWriter, ValidatesAndIsAtomic) {
  auto p = test::scratch("w.h5").string();
  std::filesystem::remove(p);  // left by an earlier run of this test: start clean
  std::filesystem::remove(p + ".tmp");
  {
    TokenDatasetWriter w(p, "bytes", 257, 256, "t", "");
    w.append({1, 2});
    expect_data_error([&] { w.append({256}); }, {"is EOS"});
    expect_data_error([&] { w.append({300}); }, {"not below vocab_size 257"});
    EXPECT_TRUE(std::filesystem::exists(p + ".tmp"));
    EXPECT_FALSE(std::filesystem::exists(p));
  }  // abandoned: the .tmp is removed, nothing that looks complete is left
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(p));
  {
    TokenDatasetWriter::Options small;
    small.chunk_tokens = 3;  // many chunks, many flushes
    TokenDatasetWriter w(p, "bytes", 257, 256, "t", "", small);
    for (int d = 0; d < 50; ++d) w.append(std::vector<token_t>(static_cast<std::size_t>(d % 7), 65 + d % 20));
    w.finish();
  }
  auto ds = TokenDataset::open(p);
  EXPECT_EQ(ds.num_docs(), 50);
  for (int d = 0; d < 50; ++d) EXPECT_EQ(ds.doc_length(d), d % 7 + 1);
  expect_data_error([] { TokenDatasetWriter("/no/such/dir/x.h5", "bytes", 257, 256, "", ""); },
                    {"/no/such/dir/x.h5.tmp", "cannot create"});
  expect_data_error([&] { TokenDatasetWriter(p, "sentencepiece", 400, 2, "", ""); }, {"needs the serialized model"});
  expect_data_error([&] { TokenDatasetWriter(p, "hf-bpe", 400, 2, "", ""); },
                    {"a hf-bpe dataset needs the serialized model"});
  expect_data_error([&] { TokenDatasetWriter(p, "wordpiece", 400, 2, "", ""); },
                    {"unknown tokenizer 'wordpiece' (expected bytes, sentencepiece or hf-bpe)"});
}

TEST(TokenDataset, HfBpeDatasetCarriesItsTokenizerJson) {
  // /tokenizer/model holds the tokenizer.json text (group attribute type
  // hf-tokenizer-json) and is required when tokenizer = hf-bpe.
  const std::string model = test::tokenizer_json({{"h", "i"}}, test::gpt2_pre()).dump();
  const auto p = test::scratch("hf-bpe.h5").string();
  {
    TokenDatasetWriter w(p, "hf-bpe", 303, 300, "t", model);
    w.append({104, 105});
    w.finish();
  }
  auto ds = TokenDataset::open(p);
  EXPECT_EQ(ds.tokenizer(), "hf-bpe");
  EXPECT_EQ(ds.tokenizer_model(), model);
  EXPECT_EQ(make_tokenizer(ds.tokenizer(), ds.tokenizer_model(), p, ds.eos_id())->decode({104, 105, 300}), "hi");
}

// ---- integrity per chunk (Fletcher32) and shards read as one dataset ------------
namespace {
/// Writes 6 documents of 5 tokens (4 + EOS) with /tokens chunks of 8 tokens.
std::string write_chunked(const std::string& name, int vocab = 257, int eos = 256) {
  auto path = test::scratch(name).string();
  TokenDatasetWriter::Options o;
  o.chunk_tokens = 8;
  TokenDatasetWriter w(path, "bytes", vocab, eos, "unit test", "", o);
  for (token_t d = 0; d < 6; ++d) w.append({10 + d, 20 + d, 30 + d, 40 + d});
  w.finish();
  return path;
}
/// Flips one bit of the stored bytes of /tokens' chunk `chunk` (in the file, under HDF5).
void flip_bit_in_chunk(const std::string& path, hsize_t chunk) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "tokens", H5P_DEFAULT);
  hsize_t coords[1] = {chunk * 8};
  unsigned mask = 0;
  haddr_t addr = 0;
  hsize_t size = 0;
  ASSERT_GE(H5Dget_chunk_info_by_coord(d, coords, &mask, &addr, &size), 0);
  H5Dclose(d);
  H5Fclose(f);
  std::FILE* fp = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(fp, nullptr);
  std::fseek(fp, long(addr + 4), SEEK_SET);  // the chunk's second token, low byte (little-endian)
  const int c = std::fgetc(fp);
  std::fseek(fp, long(addr + 4), SEEK_SET);
  std::fputc(c ^ 0x01, fp);  // 21 -> 20: still a valid id, only the checksum sees it
  std::fclose(fp);
}
}  // namespace

TEST(TokenDatasetIntegrity, AFlippedBitFailsTheReadOfItsChunkNamingFileAndRange) {
  const auto p = write_chunked("flip-chunk.h5");
  flip_bit_in_chunk(p, 1);  // tokens [8, 16): documents 1-3
  auto ds = TokenDataset::open(p);  // nothing is read at open
  EXPECT_TRUE(ds.chunk_checksums());
  EXPECT_TRUE(ds.has_checksum());
  std::vector<token_t> buf(5);
  ds.read(0, 0, 5, buf.data());  // chunk 0 is intact
  EXPECT_EQ(buf[1], 20u);
  ds.read(4, 0, 5, buf.data());  // chunk 2 ([16, 24), documents 3-4) too
  EXPECT_EQ(buf[0], 14u);
  expect_data_error([&] { ds.read(2, 0, 5, buf.data()); },
                    {p, "dataset 'tokens' is corrupt", "tokens [8, 16)", "documents 1-3", "Fletcher32"});
  std::vector<token_t> all(std::size_t(ds.num_tokens()));
  expect_data_error([&] { ds.read_tokens(0, ds.num_tokens(), all.data()); }, {p, "tokens [8, 16)", "Fletcher32"});
}

TEST(TokenDatasetIntegrity, OldDatasetsWithoutTheFilterKeepTheirChecksumPass) {
  // /tokens rewritten without Fletcher32 (as wlb4d-prep wrote it before): the
  // whole-file tokens_fnv1a64 pass at open still finds a changed id.
  const auto p = write_custom("old-nofilter.h5", [](hid_t f) {
    replace_dataset<std::uint32_t>(f, "tokens", H5T_STD_U32LE, {72, 105, 256, 34, 256}, H5T_NATIVE_UINT32);
  });
  expect_data_error([&] { TokenDataset::open(p); }, {p, "does not match its checksum"});
  const auto q = write_custom("old-nofilter-ok.h5", [](hid_t f) {
    replace_dataset<std::uint32_t>(f, "tokens", H5T_STD_U32LE, {72, 105, 256, 33, 256}, H5T_NATIVE_UINT32);
  });
  auto ds = TokenDataset::open(q);
  EXPECT_TRUE(ds.has_checksum());
  EXPECT_FALSE(ds.chunk_checksums());
}

TEST(TokenDatasetShards, ShardsReadAsTheUnshardedFile) {
  // The tiny corpus written whole, and the same documents cut into 3 files.
  auto texts = test::jsonl_texts(test::tiny_jsonl());
  auto whole = TokenDataset::open(tiny_bytes_h5());
  std::vector<std::string> paths;
  const std::size_t cut[] = {0, 7, 8, 20};  // a one-document shard in the middle
  for (int s = 0; s < 3; ++s) {
    paths.push_back(test::scratch("tiny-shard-" + std::to_string(s) + ".h5").string());
    TokenDatasetWriter w(paths.back(), "bytes", 257, 256, "unit test", "");
    for (std::size_t d = cut[s]; d < cut[s + 1]; ++d) {
      std::vector<token_t> v(static_cast<std::size_t>(whole.doc_length(std::int64_t(d))) - 1);
      whole.read(std::int64_t(d), 0, std::int64_t(v.size()), v.data());
      w.append(v);
    }
    w.finish();
  }
  auto sh = TokenDataset::open(paths);
  EXPECT_EQ(sh.num_files(), 3);
  EXPECT_EQ(sh.file_first_doc(1), 7);
  EXPECT_EQ(sh.file_first_doc(3), 20);
  EXPECT_EQ(sh.num_docs(), whole.num_docs());
  EXPECT_EQ(sh.num_tokens(), whole.num_tokens());
  EXPECT_EQ(sh.doc_lengths(), whole.doc_lengths());
  for (std::int64_t d = 0; d <= whole.num_docs(); ++d) EXPECT_EQ(sh.doc_offset(d), whole.doc_offset(d)) << d;
  std::vector<token_t> a(std::size_t(whole.num_tokens())), b(a.size());
  whole.read_tokens(0, whole.num_tokens(), a.data());
  sh.read_tokens(0, sh.num_tokens(), b.data());  // crosses both file boundaries
  EXPECT_EQ(a, b);
  for (std::int64_t d = 0; d < whole.num_docs(); ++d) {
    std::vector<token_t> x(std::size_t(whole.doc_length(d))), y(x.size());
    whole.read(d, 0, std::int64_t(x.size()), x.data());
    sh.read(d, 0, std::int64_t(y.size()), y.data());
    EXPECT_EQ(x, y) << d;
  }
  EXPECT_NE(sh.identity().find("|"), std::string::npos);
  EXPECT_NE(sh.path().find("(and 2 more files)"), std::string::npos) << sh.path();
}

TEST(TokenDatasetShards, ShardsWithAnotherVocabularyAreRefused) {
  const auto a = write_chunked("shard-vocab-a.h5");
  const auto b = write_chunked("shard-vocab-b.h5", 300, 256);
  expect_data_error([&] { TokenDataset::open(std::vector<std::string>{a, b}); },
                    {b, "vocab_size 300 differs from " + a + "'s 257", "must share the tokenizer and its vocabulary"});
  const auto c = write_chunked("shard-eos-c.h5", 257, 0);
  expect_data_error([&] { TokenDataset::open(std::vector<std::string>{a, c}); }, {c, "eos_id 0 differs"});
}

// Fine-tuning datasets: /loss_mask round trip, span targets, the rules.
TEST(TokenDatasetLossMask, RoundTripSpanTargetsAndRules) {
  const auto path = test::scratch("mask.h5").string();
  {
    TokenDatasetWriter::Options wo;
    wo.loss_mask = true;
    wo.chunk_tokens = 3;  // several chunks, several flushes
    TokenDatasetWriter w(path, "bytes", 257, 256, "unit test", "", wo);
    w.append({1, 2, 3, 4}, {0, 0, 1, 1, 1});  // prompt 1 2, response 3 4, EOS
    w.append({5, 6});                         // no mask given: all targets
    w.append({7, 8, 9}, {0, 1, 0, 0});        // a chat ending with a user turn: EOS masked
    EXPECT_THROW(w.append({1}, {1}), core::DataError);         // 1 token + EOS need 2 values
    EXPECT_THROW(w.append({1}, {1, 2}), core::DataError);      // not 0/1
    EXPECT_EQ(w.loss_targets(), 3 + 2 + 1);
    w.finish();
  }
  const auto ds = TokenDataset::open(path);
  ASSERT_TRUE(ds.has_loss_mask());
  EXPECT_EQ(ds.loss_targets(), 6);
  std::vector<std::uint8_t> m(5);
  ds.read_loss_mask(0, 0, 5, m.data());
  EXPECT_EQ(m, (std::vector<std::uint8_t>{0, 0, 1, 1, 1}));
  ds.read_loss_mask(1, 0, 3, m.data());
  EXPECT_EQ(std::vector<std::uint8_t>(m.begin(), m.begin() + 3), (std::vector<std::uint8_t>{1, 1, 1}));
  // span_targets counts positions whose next token is a target.
  EXPECT_EQ(ds.span_targets(0, 0, 5), 3);
  EXPECT_EQ(ds.span_targets(0, 0, 2), 0);  // prompt only
  EXPECT_EQ(ds.span_targets(0, 1, 3), 2);  // tokens 2 3 4: targets 3, 4
  EXPECT_EQ(ds.span_targets(2, 0, 4), 1);
  EXPECT_THROW(ds.span_targets(2, 1, 4), core::DataError);
  EXPECT_THROW(ds.read_loss_mask(0, 3, 3, m.data()), core::DataError);
  // Without /loss_mask: every next token is a target, the mask reads as ones.
  const auto& plain = TokenDataset::open(tiny_bytes_h5());
  EXPECT_FALSE(plain.has_loss_mask());
  EXPECT_EQ(plain.span_targets(0, 0, 10), 9);
  EXPECT_EQ(plain.loss_targets(), plain.num_tokens() - plain.num_docs());
  ds.read_loss_mask(0, 0, 0, m.data());
  // append(tokens, mask) needs Options::loss_mask.
  TokenDatasetWriter w2(test::scratch("nomask.h5").string(), "bytes", 257, 256, "unit test", "");
  expect_data_error([&] { w2.append({1}, {1, 1}); }, {"nomask.h5", "Options::loss_mask"});
}

namespace {
void add_mask(hid_t f, const std::vector<std::uint8_t>& v) {
  hsize_t n = v.size();
  hid_t s = H5Screate_simple(1, &n, nullptr);
  hid_t d = H5Dcreate2(f, "loss_mask", H5T_STD_U8LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Dclose(d);
  H5Sclose(s);
}
}  // namespace

// A blend of fine-tuning and pretraining files opens as one dataset: the
// pretraining file's documents train on every target.
TEST(TokenDatasetLossMask, FilesWithAndWithoutAMaskMix) {
  const auto masked = test::scratch("mix-masked.h5").string();
  const auto plain = test::scratch("mix-plain.h5").string();
  {
    TokenDatasetWriter::Options wo;
    wo.loss_mask = true;
    TokenDatasetWriter w(masked, "bytes", 257, 256, "unit test", "", wo);
    w.append({1, 2, 3}, {0, 0, 1, 1});  // targets: 3, EOS
    w.finish();
    TokenDatasetWriter q(plain, "bytes", 257, 256, "unit test", "");
    q.append({4, 5, 6, 7});  // 4 targets
    q.finish();
  }
  for (const bool masked_first : {true, false}) {
    SCOPED_TRACE(masked_first);
    const auto ds = TokenDataset::open(masked_first ? std::vector<std::string>{masked, plain}
                                                    : std::vector<std::string>{plain, masked});
    const std::int64_t dm = masked_first ? 0 : 1, dp = 1 - dm;
    EXPECT_TRUE(ds.has_loss_mask());
    EXPECT_EQ(ds.loss_targets(), 2 + 4);
    std::vector<std::uint8_t> m(5);
    ds.read_loss_mask(dp, 0, 5, m.data());
    EXPECT_EQ(m, (std::vector<std::uint8_t>{1, 1, 1, 1, 1}));
    ds.read_loss_mask(dm, 0, 4, m.data());
    EXPECT_EQ(std::vector<std::uint8_t>(m.begin(), m.begin() + 4), (std::vector<std::uint8_t>{0, 0, 1, 1}));
    EXPECT_EQ(ds.span_targets(dp, 0, 5), 4);
    EXPECT_EQ(ds.span_targets(dm, 0, 4), 2);
  }
}

TEST(TokenDatasetLossMask, BadValuesAndLengthsAreNamed) {
  // A mask value that is not 0/1 (a hand-edited file) fails on read, naming the index.
  const auto bad = write_custom("mask-bad.h5", [](hid_t f) {
    add_mask(f, {0, 1, 2, 1, 0});
  });
  const auto ds = TokenDataset::open(bad);
  std::vector<std::uint8_t> m(3);
  expect_data_error([&] { ds.read_loss_mask(0, 0, 3, m.data()); },
                    {"mask-bad.h5", "'loss_mask' holds 2 at index 2", "0 or 1"});
  const auto short_mask = write_custom("mask-short.h5", [](hid_t f) {
    add_mask(f, {0, 1});
  });
  expect_data_error([&] { TokenDataset::open(short_mask); },
                    {"mask-short.h5", "'loss_mask'", "one value per token: 2 values for 5 tokens"});
}

// HDF5 token dataset: reader (TokenDataset) and writer (TokenDatasetWriter).
#include "wlb4d/data/dataset.hpp"

#include "wlb4d/data/h5util.hpp"
#include "wlb4d/core/hash.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/version.hpp"

#include <algorithm>
#include <cctype>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <sys/stat.h>

namespace wlb::data {

using core::DataError;
namespace fs = std::filesystem;
using h5::Handle;

// =============================================================== reader

namespace {

/// A uint64 token offset is kept every kIndexStride documents; the offset of
/// any other document is that plus at most kIndexStride-1 uint32 lengths.
constexpr std::int64_t kIndexStride = 64;
/// /doc_offsets entries read per window at open (8 MiB).
constexpr hsize_t kOffsetsWindow = hsize_t{1} << 20;

std::string dset_err(const std::string& file, const std::string& dset, const std::string& rule) {
  return file + ": wrong schema: dataset '" + dset + "' " + rule;
}

/// Opens a 1-D dataset and checks its element type (class/size/sign) and that
/// its declared extent is backed by the file (h5::check_stored): metadata
/// only, before anything is read or allocated in proportion to `*n`.
Handle open_1d(hid_t file, const std::string& path, const std::string& name, H5T_class_t cls,
               std::size_t size, bool is_unsigned, const std::string& type_name, hsize_t* n) {
  if (!h5::exists(file, name)) throw DataError(dset_err(path, name, "is missing"));
  Handle d(h5::check(H5Dopen2(file, name.c_str(), H5P_DEFAULT), path, "cannot open dataset '" + name + "'"));
  Handle t(h5::check(H5Dget_type(d.get()), path, "H5Dget_type " + name));
  bool ok = H5Tget_class(t.get()) == cls && H5Tget_size(t.get()) == size;
  if (ok && cls == H5T_INTEGER) ok = (H5Tget_sign(t.get()) == H5T_SGN_NONE) == is_unsigned;
  if (!ok) throw DataError(dset_err(path, name, "must have dtype " + type_name));
  Handle s(h5::check(H5Dget_space(d.get()), path, "H5Dget_space " + name));
  if (H5Sget_simple_extent_ndims(s.get()) != 1)
    throw DataError(dset_err(path, name, "must be 1-D (rank " +
                                             std::to_string(H5Sget_simple_extent_ndims(s.get())) + ")"));
  H5Sget_simple_extent_dims(s.get(), n, nullptr);
  h5::check_stored(d.get(), name, path);
  return d;
}

void read_all(hid_t dset, hid_t memtype, void* buf, const std::string& path, const std::string& name) {
  h5::check_status(H5Dread(dset, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), path,
                   "cannot read dataset '" + name + "' (truncated or corrupt file?)");
}

/// Reads elements [start, start+count) of a 1-D dataset; the HDF5 status,
/// and on failure HDF5's reason in *why (taken before any later call clears it).
herr_t read_slab(hid_t dset, hid_t space, hid_t memtype, hsize_t start, hsize_t count, void* out,
                 std::string* why = nullptr) {
  Handle fspace(H5Scopy(space));
  if (!fspace.valid()) return -1;
  if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr) < 0) return -1;
  Handle mspace(H5Screate_simple(1, &count, nullptr));
  if (!mspace.valid()) return -1;
  const herr_t st = H5Dread(dset, memtype, mspace.get(), fspace.get(), H5P_DEFAULT, out);
  if (st < 0 && why) *why = h5::last_error();
  return st;
}

std::string hex64(std::uint64_t h) {
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

constexpr std::int64_t kChecksumBlock = 1 << 22;  // tokens per read of the checksum pass (16 MiB)

}  // namespace

namespace {
/// One HDF5 file of a dataset (a shard): its handles and attributes.
struct Shard {
  std::string path, tokenizer, source, model, checksum;
  int vocab_size = 0;
  int eos_id = 0;
  std::int64_t num_tokens = 0;
  std::int64_t num_docs = 0;    // from /doc_offsets' extent (checked against the offsets by load_offsets)
  std::int64_t doc_base = 0;    // first document in the dataset's numbering
  std::int64_t token_base = 0;  // first token in the dataset's numbering
  std::int64_t num_docs_attr = -2;  // root attribute num_docs (-2: absent)
  bool fletcher32 = false;      // /tokens carries HDF5's Fletcher32 filter (checked on every chunk read)
  std::int64_t chunk = 0;       // /tokens chunk in tokens (0: contiguous)
  Handle file, tokens, tokens_space;
  Handle mask, mask_space;          // /loss_mask (empty: none; one uint8 per token, Fletcher32 per chunk)
  std::int64_t loss_targets = -1;   // root attribute loss_targets (-1: absent)

  /// Attributes, /tokens, /doc_offsets' extent, tokenizer model (no data read
  /// in proportion to the token count).
  void open(hid_t fapl);
  /// Reads this file's tokens [begin, begin+count); the HDF5 status (errors quiet).
  herr_t read_raw(std::int64_t begin, std::int64_t count, token_t* out, std::string* why = nullptr) const {
    const h5::Quiet quiet;
    return read_slab(tokens.get(), tokens_space.get(), H5T_NATIVE_UINT32, hsize_t(begin), hsize_t(count), out, why);
  }
};
}  // namespace

struct TokenDataset::Impl {
  std::string name;  // path(): the file, or "first (and N more files)"
  std::vector<Shard> shards;
  std::vector<std::uint32_t> lengths;  // tokens per document, EOS included
  std::vector<std::uint64_t> index;    // offset of document k*kIndexStride, k = 0..num_docs/kIndexStride
  std::int64_t num_tokens = 0;
  std::int64_t loss_targets = 0;  // Σ files' loss targets (-1 when a masked file lacks the attribute)
  bool has_mask = false;          // some file carries /loss_mask
  mutable std::string identity_cache;

  std::int64_t num_docs() const { return static_cast<std::int64_t>(lengths.size()); }
  std::int64_t offset(std::int64_t d) const {
    const std::int64_t k = d / kIndexStride;
    std::uint64_t o = index[std::size_t(k)];
    for (std::int64_t i = k * kIndexStride; i < d; ++i) o += lengths[std::size_t(i)];
    return static_cast<std::int64_t>(o);
  }
  /// The document holding token t (0 <= t < num_tokens).
  std::int64_t doc_of_token(std::int64_t t) const {
    const auto it = std::upper_bound(index.begin(), index.end(), static_cast<std::uint64_t>(t));
    const std::int64_t k = static_cast<std::int64_t>(it - index.begin()) - 1;
    std::int64_t d = k * kIndexStride;
    std::uint64_t o = index[std::size_t(k)];
    while (d + 1 < num_docs() && o + lengths[std::size_t(d)] <= static_cast<std::uint64_t>(t)) o += lengths[std::size_t(d++)];
    return d;
  }
  std::size_t shard_of_doc(std::int64_t d) const {
    std::size_t s = shards.size() - 1;
    while (s > 0 && shards[s].doc_base > d) --s;  // few files: linear from the end is fine
    return s;
  }
  std::size_t shard_of_token(std::int64_t t) const {
    auto it = std::upper_bound(shards.begin(), shards.end(), t,
                               [](std::int64_t v, const Shard& s) { return v < s.token_base; });
    return static_cast<std::size_t>(it - shards.begin()) - 1;
  }
  void build_index();
  /// Rank 0 / serial: appends shard s's lengths from its /doc_offsets (read in windows, validated).
  void load_offsets(std::size_t s);
  /// Datasets without the Fletcher32 filter but with tokens_fnv1a64 (written
  /// before the filter): one pass over the shard's tokens. "" when it matches.
  std::string verify_checksum(std::size_t s) const;
  void read_range(std::int64_t begin, std::int64_t count, token_t* out) const;
  void read_shard(std::size_t s, std::int64_t begin, std::int64_t count, token_t* out) const;
  /// "documents a-b" of shard s holding its tokens [begin, end).
  std::string docs_of(std::size_t s, std::int64_t begin, std::int64_t end) const;
  /// Serial (comm == nullptr) or collective open of one or more files.
  static std::unique_ptr<Impl> open_files(const std::vector<std::string>& paths, hid_t fapl,
                                          const comm::Communicator* comm);
};

void Shard::open(hid_t fapl) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError(path + ": token dataset does not exist");
  htri_t is_h5 = -1;
  {
    const h5::Quiet quiet;
    is_h5 = H5Fis_hdf5(path.c_str());
  }
  if (is_h5 <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw DataError(path + ": not an HDF5 file (no HDF5 signature; expected a wlb4d-tokens dataset)");
  }
  hid_t f = H5I_INVALID_HID;
  {
    const h5::Quiet quiet;
    f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  }
  file = Handle(h5::check(f, path, "cannot open HDF5 file (truncated or corrupt?)"));
  hid_t root = file.get();

  std::string format = h5::read_attr_string(root, "format", path);
  if (format != kTokenFormat)
    throw DataError(path + ": wrong schema: root attribute 'format' is '" + format + "', expected '" +
                    kTokenFormat + "'");
  auto ver = h5::read_attr_i64(root, "format_version", path);
  if (ver != kTokenFormatVersion)
    throw DataError(path + ": unsupported format_version " + std::to_string(ver) + " (this wlb4d reads " +
                    std::to_string(kTokenFormatVersion) + ")");
  auto vocab = h5::read_attr_i64(root, "vocab_size", path);
  if (vocab < 1 || vocab > (std::int64_t{1} << 31) - 1)
    throw DataError(path + ": wrong schema: root attribute 'vocab_size' = " + std::to_string(vocab) +
                    " must be in [1, 2^31)");
  vocab_size = static_cast<int>(vocab);
  auto eos = h5::read_attr_i64(root, "eos_id", path);
  if (eos < 0 || eos >= vocab)
    throw DataError(path + ": wrong schema: root attribute 'eos_id' = " + std::to_string(eos) +
                    " must be in [0, vocab_size = " + std::to_string(vocab) + ")");
  eos_id = static_cast<int>(eos);
  tokenizer = h5::read_attr_string(root, "tokenizer", path);
  if (tokenizer != "bytes" && tokenizer != "sentencepiece" && tokenizer != "hf-bpe")
    throw DataError(path + ": wrong schema: root attribute 'tokenizer' is '" + tokenizer +
                    "', expected 'bytes', 'sentencepiece' or 'hf-bpe'");
  source = h5::has_attr(root, "source") ? h5::read_attr_string(root, "source", path) : std::string();

  hsize_t n = 0;
  tokens = open_1d(root, path, "tokens", H5T_INTEGER, 4, true, "uint32", &n);
  num_tokens = static_cast<std::int64_t>(n);
  tokens_space = Handle(h5::check(H5Dget_space(tokens.get()), path, "H5Dget_space tokens"));
  if (h5::has_attr(root, "num_tokens")) {  // written by wlb4d-prep: it must say what /tokens holds
    const auto declared = h5::read_attr_i64(root, "num_tokens", path);
    if (declared != num_tokens)
      throw DataError(path + ": root attribute 'num_tokens' = " + std::to_string(declared) +
                      " does not match dataset 'tokens' of " + std::to_string(num_tokens) + " tokens");
  }
  {
    Handle dcpl(h5::check(H5Dget_create_plist(tokens.get()), path, "H5Dget_create_plist tokens"));
    if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
      hsize_t c = 0;
      if (H5Pget_chunk(dcpl.get(), 1, &c) == 1) chunk = static_cast<std::int64_t>(c);
      unsigned flags = 0;
      std::size_t nelmts = 0;
      const h5::Quiet quiet;
      fletcher32 = H5Pget_filter_by_id2(dcpl.get(), H5Z_FILTER_FLETCHER32, &flags, &nelmts, nullptr, 0, nullptr,
                                        nullptr) >= 0;
      H5Eclear2(H5E_DEFAULT);
    }
  }

  // The maximum id prep saw: a vocab_size that does not cover it (a dataset
  // whose attributes were edited, or written by another tool) fails here, on
  // every rank, not later on the one rank that reads the span.
  if (h5::has_attr(root, "max_token_id")) {
    const auto max_id = h5::read_attr_i64(root, "max_token_id", path);
    if (max_id >= vocab)
      throw DataError(path + ": root attribute 'max_token_id' = " + std::to_string(max_id) +
                      " is not below vocab_size = " + std::to_string(vocab) +
                      " (every token id must be < vocab_size)");
  }
  if (h5::has_attr(root, "tokens_fnv1a64")) checksum = h5::read_attr_string(root, "tokens_fnv1a64", path);

  // /doc_offsets: its extent now (every rank; the data is read by load_offsets).
  hsize_t m = 0;
  Handle off = open_1d(root, path, "doc_offsets", H5T_INTEGER, 8, true, "uint64", &m);
  if (m < 1) throw DataError(dset_err(path, "doc_offsets", "must hold num_docs+1 >= 1 entries (it is empty)"));
  // Every document holds at least its EOS: more offsets than tokens + 1 is a
  // declared size the tokens cannot back (checked before the read).
  if (m - 1 > static_cast<hsize_t>(num_tokens))
    throw DataError(dset_err(path, "doc_offsets",
                             "declares " + std::to_string(m - 1) + " documents, more than the " +
                                 std::to_string(num_tokens) +
                                 " tokens of dataset 'tokens' (every document holds at least its EOS)"));
  if (h5::has_attr(root, "num_docs")) num_docs_attr = h5::read_attr_i64(root, "num_docs", path);  // load_offsets checks it
  num_docs = static_cast<std::int64_t>(m) - 1;

  if (h5::exists(root, "loss_mask")) {
    hsize_t nm = 0;
    mask = open_1d(root, path, "loss_mask", H5T_INTEGER, 1, true, "uint8", &nm);
    if (nm != static_cast<hsize_t>(num_tokens))
      throw DataError(dset_err(path, "loss_mask",
                               "must hold one value per token: " + std::to_string(nm) + " values for " +
                                   std::to_string(num_tokens) + " tokens"));
    mask_space = Handle(h5::check(H5Dget_space(mask.get()), path, "H5Dget_space loss_mask"));
  }
  if (h5::has_attr(root, "loss_targets")) loss_targets = h5::read_attr_i64(root, "loss_targets", path);

  if (tokenizer != "bytes") {
    hsize_t k = 0;
    if (!h5::exists(root, "tokenizer"))
      throw DataError(dset_err(path, "tokenizer/model", "is missing (required when tokenizer = " + tokenizer + ")"));
    Handle d = open_1d(root, path, "tokenizer/model", H5T_INTEGER, 1, true, "uint8", &k);
    model.resize(k);
    if (k > 0) read_all(d.get(), H5T_NATIVE_UINT8, model.data(), path, "tokenizer/model");
  }
}

void TokenDataset::Impl::load_offsets(std::size_t s) {
  const Shard& sh = shards[s];
  const std::string& path = sh.path;
  Handle d(h5::check(H5Dopen2(sh.file.get(), "doc_offsets", H5P_DEFAULT), path, "cannot open dataset 'doc_offsets'"));
  Handle space(h5::check(H5Dget_space(d.get()), path, "H5Dget_space doc_offsets"));
  const hsize_t n = hsize_t(sh.num_docs) + 1;
  std::vector<std::uint64_t> win;
  std::uint64_t prev = 0;
  for (hsize_t w = 0; w < n; w += kOffsetsWindow) {
    const hsize_t cnt = std::min(kOffsetsWindow, n - w);
    win.resize(cnt);
    herr_t st = -1;
    std::string why;
    {
      const h5::Quiet quiet;
      st = read_slab(d.get(), space.get(), H5T_NATIVE_UINT64, w, cnt, win.data(), &why);
    }
    if (st < 0)
      throw DataError(path + ": cannot read dataset 'doc_offsets' [" + std::to_string(w) + ", " +
                      std::to_string(w + cnt) + ") (truncated or corrupt file" +
                      (why.find("letcher32") != std::string::npos ? ": a chunk fails its Fletcher32 checksum" : "?") +
                      ")" + (why.empty() ? "" : " (HDF5: " + why + ")"));
    for (hsize_t j = 0; j < cnt; ++j) {
      const hsize_t i = w + j;
      const std::uint64_t o = win[j];
      if (i == 0) {
        if (o != 0)
          throw DataError(dset_err(path, "doc_offsets", "must start at 0 (it starts at " + std::to_string(o) + ")"));
      } else {
        if (o <= prev)
          throw DataError(dset_err(path, "doc_offsets",
                                   "must be strictly increasing (every document holds at least its EOS): "
                                   "offset[" + std::to_string(i) + "] = " + std::to_string(o) + " <= offset[" +
                                       std::to_string(i - 1) + "] = " + std::to_string(prev)));
        if (o - prev > std::numeric_limits<std::uint32_t>::max())
          throw DataError(dset_err(path, "doc_offsets",
                                   "gives document " + std::to_string(i - 1) + " " + std::to_string(o - prev) +
                                       " tokens, more than 2^32-1 (document lengths are held as uint32)"));
        lengths.push_back(static_cast<std::uint32_t>(o - prev));
      }
      prev = o;
    }
  }
  if (prev != static_cast<std::uint64_t>(sh.num_tokens))
    throw DataError(dset_err(path, "doc_offsets",
                             "must end at num_tokens = " + std::to_string(sh.num_tokens) + " (it ends at " +
                                 std::to_string(prev) + ")"));
  if (sh.num_docs_attr != -2 && sh.num_docs_attr != sh.num_docs)  // written by wlb4d-prep: it must say what /doc_offsets holds
    throw DataError(path + ": root attribute 'num_docs' = " + std::to_string(sh.num_docs_attr) +
                    " does not match dataset 'doc_offsets' of " + std::to_string(n) + " entries (num_docs + 1 offsets)");
}

void TokenDataset::Impl::build_index() {
  const std::int64_t n = num_docs();
  index.assign(std::size_t(n / kIndexStride + 1), 0);
  std::uint64_t o = 0;
  for (std::int64_t d = 0; d < n; ++d) {
    if (d % kIndexStride == 0) index[std::size_t(d / kIndexStride)] = o;
    o += lengths[std::size_t(d)];
  }
  if (n % kIndexStride == 0) index[std::size_t(n / kIndexStride)] = o;
  num_tokens = static_cast<std::int64_t>(o);
}

std::string TokenDataset::Impl::docs_of(std::size_t s, std::int64_t begin, std::int64_t end) const {
  const Shard& sh = shards[s];
  const std::int64_t a = doc_of_token(sh.token_base + begin) - sh.doc_base;
  const std::int64_t b = doc_of_token(sh.token_base + std::max(begin, end - 1)) - sh.doc_base;
  return a == b ? "document " + std::to_string(a) : "documents " + std::to_string(a) + "-" + std::to_string(b);
}

void TokenDataset::Impl::read_shard(std::size_t s, std::int64_t begin, std::int64_t count, token_t* out) const {
  const Shard& sh = shards[s];
  std::string why;
  if (sh.read_raw(begin, count, out, &why) < 0) {
    std::string lower = why;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower.find("fletcher32") != std::string::npos && sh.chunk > 0) {
      // Name the first chunk that fails its checksum (each read alone).
      std::vector<token_t> tmp(static_cast<std::size_t>(sh.chunk));
      for (std::int64_t c = begin / sh.chunk; c * sh.chunk < begin + count; ++c) {
        const std::int64_t a = c * sh.chunk, b = std::min(sh.num_tokens, a + sh.chunk);
        if (sh.read_raw(a, b - a, tmp.data()) >= 0) continue;
        throw DataError(sh.path + ": dataset 'tokens' is corrupt: the chunk of tokens [" + std::to_string(a) + ", " +
                        std::to_string(b) + ") (" + docs_of(s, a, b) +
                        " of this file) fails its Fletcher32 checksum (the file changed after wlb4d-prep wrote it; "
                        "re-run wlb4d-prep or restore the file)");
      }
    }
    throw DataError(sh.path + ": cannot read dataset 'tokens' [" + std::to_string(begin) + ", " +
                    std::to_string(begin + count) + ") (" + docs_of(s, begin, begin + count) +
                    ") (truncated or corrupt file?)" + (why.empty() ? "" : " (HDF5: " + why + ")"));
  }
  for (std::int64_t i = 0; i < count; ++i)
    if (out[i] >= static_cast<token_t>(sh.vocab_size))
      throw DataError(sh.path + ": dataset 'tokens' holds id " + std::to_string(out[i]) + " at index " +
                      std::to_string(begin + i) + ", not below vocab_size " + std::to_string(sh.vocab_size));
}

void TokenDataset::Impl::read_range(std::int64_t begin, std::int64_t count, token_t* out) const {
  // An asynchronous checkpoint writer may be using HDF5 (not thread-safe here).
  const h5::ApiLock lock(h5::api_mutex());
  while (count > 0) {
    const std::size_t s = shard_of_token(begin);
    const Shard& sh = shards[s];
    const std::int64_t local = begin - sh.token_base;
    const std::int64_t n = std::min(count, sh.num_tokens - local);
    read_shard(s, local, n, out);
    begin += n;
    count -= n;
    out += n;
  }
}

std::string TokenDataset::Impl::verify_checksum(std::size_t s) const {
  const Shard& sh = shards[s];
  if (sh.checksum.empty() || sh.fletcher32) return "";
  std::vector<token_t> buf;
  std::uint64_t h = core::kFnv1aOffset;
  try {
    for (std::int64_t b = 0; b < sh.num_tokens; b += kChecksumBlock) {
      const std::int64_t n = std::min(kChecksumBlock, sh.num_tokens - b);
      buf.resize(std::size_t(n));
      read_shard(s, b, n, buf.data());
      h = core::fnv1a(buf.data(), buf.size() * sizeof(token_t), h);
    }
  } catch (const DataError& e) {
    return e.what();
  }
  if (hex64(h) != sh.checksum)
    return sh.path + ": dataset 'tokens' does not match its checksum (attribute tokens_fnv1a64 = " + sh.checksum +
           ", the tokens give " + hex64(h) + "): the token ids were changed after wlb4d-prep wrote them";
  return "";
}

TokenDataset::TokenDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;
TokenDataset::~TokenDataset() = default;

namespace {
/// Every file must describe the same token space as the first.
void check_same_tokenizer(const Shard& a, const Shard& b) {
  auto differ = [&](const std::string& what, const std::string& va, const std::string& vb) {
    throw DataError(b.path + ": " + what + " " + vb + " differs from " + a.path + "'s " + va +
                    ": the files read as one dataset (shards, and every source of a blend) must share the "
                    "tokenizer and its vocabulary");
  };
  if (a.tokenizer != b.tokenizer) differ("tokenizer", "'" + a.tokenizer + "'", "'" + b.tokenizer + "'");
  if (a.vocab_size != b.vocab_size)
    differ("vocab_size", std::to_string(a.vocab_size), std::to_string(b.vocab_size));
  if (a.eos_id != b.eos_id) differ("eos_id", std::to_string(a.eos_id), std::to_string(b.eos_id));
  if (a.model != b.model)
    differ("tokenizer model (/tokenizer/model)", "(" + std::to_string(a.model.size()) + " bytes)",
           "(" + std::to_string(b.model.size()) + " bytes, other content)");
}

}  // namespace

std::unique_ptr<TokenDataset::Impl> TokenDataset::Impl::open_files(const std::vector<std::string>& paths, hid_t fapl,
                                                                   const comm::Communicator* comm) {
  if (paths.empty()) throw DataError("token dataset: no files given");
  auto im = std::make_unique<Impl>();
  im->name = paths[0];
  if (paths.size() > 1) im->name += " (and " + std::to_string(paths.size() - 1) + " more files)";
  im->shards.resize(paths.size());
  std::int64_t docs = 0, toks = 0;
  for (std::size_t s = 0; s < paths.size(); ++s) {
    Shard& sh = im->shards[s];
    sh.path = paths[s];
    sh.open(fapl);
    if (s > 0) {
      check_same_tokenizer(im->shards[0], sh);
    }
    sh.doc_base = docs;
    sh.token_base = toks;
    docs += sh.num_docs;
    toks += sh.num_tokens;
    // A file without /loss_mask (pretraining text blended with fine-tuning
    // data) trains on every target: num_tokens - num_docs of them.
    const std::int64_t t = sh.mask.valid() ? sh.loss_targets : sh.num_tokens - sh.num_docs;
    im->loss_targets = (im->loss_targets < 0 || t < 0) ? -1 : im->loss_targets + t;
    im->has_mask = im->has_mask || sh.mask.valid();
  }
  // Rank 0 (or the serial caller) reads and validates the offsets, and runs
  // the whole-file checksum pass for files without the Fletcher32 filter;
  // everyone learns the verdict and the lengths.
  std::string err;
  if (!comm || comm->rank() == 0) {
    try {
      im->lengths.reserve(std::size_t(docs));
      for (std::size_t s = 0; s < im->shards.size() && err.empty(); ++s) {
        im->load_offsets(s);
        err = im->verify_checksum(s);
      }
    } catch (const DataError& e) {
      err = e.what();
    }
  }
  if (comm) {
    err = comm::bcast_string(*comm, err, 0);
    if (!err.empty()) throw DataError(err);
    if (comm->rank() != 0) im->lengths.resize(std::size_t(docs));
    comm->broadcast(im->lengths.data(), im->lengths.size(), 0);  // split below INT_MAX elements by comm
  } else if (!err.empty()) {
    throw DataError(err);
  }
  im->build_index();
  return im;
}

TokenDataset TokenDataset::open(const std::string& path) { return open(std::vector<std::string>{path}); }

TokenDataset TokenDataset::open(const std::vector<std::string>& paths) {
  return TokenDataset(Impl::open_files(paths, H5P_DEFAULT, nullptr));
}

TokenDataset TokenDataset::open(const std::string& path, const comm::Communicator& comm) {
  return open(std::vector<std::string>{path}, comm);
}

TokenDataset TokenDataset::open(const std::vector<std::string>& paths, const comm::Communicator& comm) {
  // Every rank sees the same files, so opening fails on all ranks or none;
  // still, agree on it so that no rank is left alone in the collective H5Fopen.
  for (const auto& path : paths) {
    const int exists_here = fs::exists(path) ? 1 : 0;
    if (!comm.allreduce_value(exists_here, comm::ReduceOp::Min))
      throw DataError(path + ": token dataset does not exist (on at least one rank)");
  }
  Handle fapl(h5::check(H5Pcreate(H5P_FILE_ACCESS), paths.empty() ? "token dataset" : paths[0], "H5Pcreate"));
  // HDF5's MPI-IO driver needs the raw communicator.
  h5::check_status(H5Pset_fapl_mpio(fapl.get(), comm.mpi(), MPI_INFO_NULL), "token dataset", "H5Pset_fapl_mpio");
  return TokenDataset(Impl::open_files(paths, fapl.get(), &comm));
}

std::int64_t TokenDataset::num_docs() const { return impl_->num_docs(); }
std::int64_t TokenDataset::num_tokens() const { return impl_->num_tokens; }
int TokenDataset::vocab_size() const { return impl_->shards[0].vocab_size; }
int TokenDataset::eos_id() const { return impl_->shards[0].eos_id; }
const std::string& TokenDataset::tokenizer() const { return impl_->shards[0].tokenizer; }
const std::string& TokenDataset::path() const { return impl_->name; }
const std::string& TokenDataset::source() const { return impl_->shards[0].source; }
std::string TokenDataset::tokenizer_model() const { return impl_->shards[0].model; }
bool TokenDataset::has_checksum() const {
  for (const auto& s : impl_->shards)
    if (!s.fletcher32 && s.checksum.empty()) return false;
  return true;
}
bool TokenDataset::chunk_checksums() const {
  for (const auto& s : impl_->shards)
    if (!s.fletcher32) return false;
  return true;
}
const std::vector<std::uint32_t>& TokenDataset::doc_lengths() const { return impl_->lengths; }
std::size_t TokenDataset::index_bytes() const {
  return impl_->lengths.capacity() * sizeof(std::uint32_t) + impl_->index.capacity() * sizeof(std::uint64_t);
}
std::int64_t TokenDataset::num_files() const { return static_cast<std::int64_t>(impl_->shards.size()); }
const std::string& TokenDataset::file_path(std::int64_t i) const { return impl_->shards.at(std::size_t(i)).path; }
std::int64_t TokenDataset::file_first_doc(std::int64_t i) const {
  if (i == num_files()) return num_docs();
  return impl_->shards.at(std::size_t(i)).doc_base;
}

std::int64_t TokenDataset::doc_offset(std::int64_t doc) const {
  if (doc < 0 || doc > num_docs())
    throw DataError(impl_->name + ": document offset " + std::to_string(doc) + " out of range [0, " +
                    std::to_string(num_docs()) + "]");
  return impl_->offset(doc);
}

bool TokenDataset::has_loss_mask() const { return impl_->has_mask; }

std::int64_t TokenDataset::loss_targets() const {
  if (!has_loss_mask()) return num_tokens() - num_docs();
  return impl_->loss_targets;
}

namespace {
/// \throws DataError unless [offset, offset+length) lies inside document doc.
void check_span(const TokenDataset& ds, std::int64_t doc, std::int64_t offset, std::int64_t length) {
  const std::int64_t len = ds.doc_length(doc);
  if (offset < 0 || length < 0 || offset + length > len)
    throw DataError(ds.path() + ": span [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                    ") leaves document " + std::to_string(doc) + " of length " + std::to_string(len));
}
}  // namespace

void TokenDataset::read_loss_mask(std::int64_t doc, std::int64_t offset, std::int64_t length,
                                  std::uint8_t* out) const {
  const auto& im = *impl_;
  check_span(*this, doc, offset, length);
  if (length == 0) return;
  // A document lies in one file: read from its shard, in that file's numbering.
  const Shard& sh = im.shards[im.shard_of_doc(doc)];
  if (!sh.mask.valid()) {  // not fine-tuning data: every target trains
    std::fill(out, out + length, std::uint8_t{1});
    return;
  }
  const std::int64_t begin = im.offset(doc) - sh.token_base + offset;
  const std::string range = "[" + std::to_string(begin) + ", " + std::to_string(begin + length) + ") (document " +
                            std::to_string(doc - sh.doc_base) + ")";
  std::string why;
  herr_t st = -1;
  {
    const h5::Quiet quiet;
    st = read_slab(sh.mask.get(), sh.mask_space.get(), H5T_NATIVE_UINT8, hsize_t(begin), hsize_t(length), out, &why);
  }
  if (st < 0)
    throw DataError(sh.path + ": cannot read dataset 'loss_mask' " + range +
                    " (a chunk failed its Fletcher32 check: corrupt file?)" + (why.empty() ? "" : ": " + why));
  for (std::int64_t i = 0; i < length; ++i)
    if (out[i] > 1)
      throw DataError(sh.path + ": dataset 'loss_mask' holds " + std::to_string(int(out[i])) + " at index " +
                      std::to_string(begin + i) + " (a loss mask is 0 or 1)");
}

std::int64_t TokenDataset::span_targets(std::int64_t doc, std::int64_t offset, std::int64_t length) const {
  check_span(*this, doc, offset, length);
  if (length <= 1) return 0;
  if (!impl_->shards[impl_->shard_of_doc(doc)].mask.valid()) return length - 1;
  std::vector<std::uint8_t> m(static_cast<std::size_t>(length));
  read_loss_mask(doc, offset, length, m.data());
  std::int64_t n = 0;
  for (std::int64_t i = 1; i < length; ++i) n += m[std::size_t(i)];
  return n;
}

std::int64_t TokenDataset::doc_length(std::int64_t doc) const {
  if (doc < 0 || doc >= num_docs())
    throw DataError(impl_->name + ": document " + std::to_string(doc) + " out of range [0, " +
                    std::to_string(num_docs()) + ")");
  return static_cast<std::int64_t>(impl_->lengths[std::size_t(doc)]);
}

void TokenDataset::read(std::int64_t doc, std::int64_t offset, std::int64_t length, token_t* out) const {
  std::int64_t len = doc_length(doc);
  if (offset < 0 || length < 0 || offset + length > len) {
    const auto& sh = impl_->shards[impl_->shard_of_doc(doc)];
    throw DataError(sh.path + ": span [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                    ") leaves document " + std::to_string(doc - sh.doc_base) + " of length " + std::to_string(len));
  }
  impl_->read_range(impl_->offset(doc) + offset, length, out);
}

void TokenDataset::read_tokens(std::int64_t begin, std::int64_t count, token_t* out) const {
  if (begin < 0 || count < 0 || begin + count > impl_->num_tokens)
    throw DataError(impl_->name + ": token range [" + std::to_string(begin) + ", " +
                    std::to_string(begin + count) + ") leaves dataset 'tokens' of " +
                    std::to_string(impl_->num_tokens) + " tokens");
  impl_->read_range(begin, count, out);
}

std::string TokenDataset::content_identity(const std::string& identity) {
  std::string out, field;
  // Entries are joined by '|', fields by ';': keep every field but path= and mtime=.
  for (std::size_t i = 0; i <= identity.size(); ++i) {
    const char c = i < identity.size() ? identity[i] : '\0';
    if (c == ';' || c == '|' || c == '\0') {
      if (field.rfind("path=", 0) != 0 && field.rfind("mtime=", 0) != 0) {
        if (!out.empty() && out.back() != '|') out += ';';
        out += field;
      }
      if (c == '|') out += '|';
      field.clear();
    } else {
      field += c;
    }
  }
  return out;
}

std::string TokenDataset::identity() const {
  if (!impl_->identity_cache.empty()) return impl_->identity_cache;
  std::string all;
  for (const auto& sh : impl_->shards) {
    std::error_code ec;
    std::string abs = fs::absolute(sh.path, ec).lexically_normal().string();
    if (ec) abs = sh.path;
    struct stat sb {};
    long long size = -1, mtime_ns = -1;
    if (::stat(sh.path.c_str(), &sb) == 0) {
      size = static_cast<long long>(sb.st_size);
      mtime_ns = static_cast<long long>(sb.st_mtim.tv_sec) * 1000000000LL + sb.st_mtim.tv_nsec;
    }
    // FNV-1a over the file's own offsets (from 0) as little-endian uint64.
    std::uint64_t o = 0;
    std::uint64_t h = core::fnv1a_u64_le(&o, 1);
    for (std::int64_t d = sh.doc_base; d < sh.doc_base + sh.num_docs; ++d) {
      o += impl_->lengths[std::size_t(d)];
      h = core::fnv1a_u64_le(&o, 1, h);
    }
    std::ostringstream os;
    os << "path=" << abs << ";size=" << size << ";mtime=" << mtime_ns << ";docs=" << sh.num_docs
       << ";tokens=" << sh.num_tokens << ";offsets_fnv1a=" << hex64(h);
    all += (all.empty() ? "" : "|") + os.str();
  }
  impl_->identity_cache = all;
  return all;
}

// =============================================================== writer

struct TokenDatasetWriter::Impl {
  std::string path, tmp;
  int vocab_size = 0;
  int eos_id = 0;
  Options opts;
  Handle file;
  Handle tokens;
  std::vector<token_t> buf;
  std::vector<std::uint64_t> offsets{0};
  std::int64_t written = 0;  // tokens flushed to /tokens
  bool finished = false;
  std::uint64_t fnv = core::kFnv1aOffset;  // tokens_fnv1a64 so far
  std::int64_t max_id = -1;                // max_token_id so far
  Handle mask;                             // /loss_mask (Options::loss_mask)
  std::vector<std::uint8_t> mbuf;          // mask values beside buf
  const std::vector<std::uint8_t>* pending_mask = nullptr;  // append(tokens, mask) in progress
  std::int64_t loss_targets = 0;

  std::int64_t total() const { return written + static_cast<std::int64_t>(buf.size()); }
  void flush() {
    if (buf.empty()) return;
    hsize_t newsize = static_cast<hsize_t>(total());
    h5::check_status(H5Dset_extent(tokens.get(), &newsize), tmp, "cannot extend dataset 'tokens'");
    Handle fspace(h5::check(H5Dget_space(tokens.get()), tmp, "H5Dget_space tokens"));
    hsize_t start = static_cast<hsize_t>(written), cnt = buf.size();
    h5::check_status(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr), tmp,
                     "H5Sselect_hyperslab tokens");
    Handle mspace(h5::check(H5Screate_simple(1, &cnt, nullptr), tmp, "H5Screate_simple"));
    h5::check_status(H5Dwrite(tokens.get(), H5T_NATIVE_UINT32, mspace.get(), fspace.get(), H5P_DEFAULT, buf.data()),
                     tmp, "cannot write dataset 'tokens' (disk full?)");
    if (mask.valid()) {
      h5::check_status(H5Dset_extent(mask.get(), &newsize), tmp, "cannot extend dataset 'loss_mask'");
      Handle ms(h5::check(H5Dget_space(mask.get()), tmp, "H5Dget_space loss_mask"));
      h5::check_status(H5Sselect_hyperslab(ms.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr), tmp,
                       "H5Sselect_hyperslab loss_mask");
      h5::check_status(H5Dwrite(mask.get(), H5T_NATIVE_UINT8, mspace.get(), ms.get(), H5P_DEFAULT, mbuf.data()),
                       tmp, "cannot write dataset 'loss_mask' (disk full?)");
      mbuf.clear();
    }
    fnv = core::fnv1a(buf.data(), buf.size() * sizeof(token_t), fnv);
    for (auto t : buf) max_id = std::max<std::int64_t>(max_id, t);
    written = total();
    buf.clear();
  }
};

TokenDatasetWriter::TokenDatasetWriter(const std::string& path, const std::string& tokenizer, int vocab_size,
                                       int eos_id, const std::string& source, const std::string& model)
    : TokenDatasetWriter(path, tokenizer, vocab_size, eos_id, source, model, Options{}) {}

TokenDatasetWriter::TokenDatasetWriter(const std::string& path, const std::string& tokenizer, int vocab_size,
                                       int eos_id, const std::string& source, const std::string& model,
                                       const Options& opts)
    : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  im.path = path;
  im.tmp = path + ".tmp";
  im.vocab_size = vocab_size;
  im.eos_id = eos_id;
  im.opts = opts;
  if (tokenizer != "bytes" && tokenizer != "sentencepiece" && tokenizer != "hf-bpe")
    throw DataError(path + ": unknown tokenizer '" + tokenizer + "' (expected bytes, sentencepiece or hf-bpe)");
  if (tokenizer != "bytes" && model.empty())
    throw DataError(path + ": a " + tokenizer + " dataset needs the serialized model");
  if (vocab_size < 1 || eos_id < 0 || eos_id >= vocab_size)
    throw DataError(path + ": eos_id " + std::to_string(eos_id) + " must be in [0, vocab_size = " +
                    std::to_string(vocab_size) + ")");
  if (opts.chunk_tokens < 1) throw DataError(path + ": chunk_tokens must be >= 1");

  hid_t f = H5I_INVALID_HID;
  {
    const h5::Quiet quiet;
    f = H5Fcreate(im.tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  }
  im.file = Handle(h5::check(f, im.tmp, "cannot create token dataset file"));
  hid_t root = im.file.get();

  hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk = static_cast<hsize_t>(opts.chunk_tokens);
  Handle space(h5::check(H5Screate_simple(1, &zero, &unlimited), im.tmp, "H5Screate_simple"));
  Handle dcpl(h5::check(H5Pcreate(H5P_DATASET_CREATE), im.tmp, "H5Pcreate"));
  h5::check_status(H5Pset_chunk(dcpl.get(), 1, &chunk), im.tmp, "H5Pset_chunk");
  h5::check_status(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), im.tmp, "H5Pset_fill_time");
  // Fletcher32 per chunk: HDF5 checks it on every read, so integrity costs
  // nothing at open and a corrupt chunk fails the read that touches it.
  h5::check_status(H5Pset_fletcher32(dcpl.get()), im.tmp, "H5Pset_fletcher32");
  im.tokens = Handle(h5::check(H5Dcreate2(root, "tokens", H5T_STD_U32LE, space.get(), H5P_DEFAULT, dcpl.get(),
                                          H5P_DEFAULT),
                               im.tmp, "cannot create dataset 'tokens'"));
  if (opts.loss_mask) {
    Handle mcpl(h5::check(H5Pcreate(H5P_DATASET_CREATE), im.tmp, "H5Pcreate"));
    h5::check_status(H5Pset_chunk(mcpl.get(), 1, &chunk), im.tmp, "H5Pset_chunk");
    h5::check_status(H5Pset_fletcher32(mcpl.get()), im.tmp, "H5Pset_fletcher32");
    im.mask = Handle(h5::check(H5Dcreate2(root, "loss_mask", H5T_STD_U8LE, space.get(), H5P_DEFAULT, mcpl.get(),
                                          H5P_DEFAULT),
                               im.tmp, "cannot create dataset 'loss_mask'"));
  }

  h5::write_attr_string(root, "format", kTokenFormat, im.tmp);
  h5::write_attr_i64(root, "format_version", kTokenFormatVersion, im.tmp);
  h5::write_attr_i64(root, "vocab_size", vocab_size, im.tmp);
  h5::write_attr_i64(root, "eos_id", eos_id, im.tmp);
  h5::write_attr_string(root, "tokenizer", tokenizer, im.tmp);
  h5::write_attr_string(root, "source", source, im.tmp);
  h5::write_attr_string(root, "writer", std::string("wlb4d ") + core::kVersion + " (" + core::kGitSha + ")",
                        im.tmp);
  if (tokenizer != "bytes") {
    Handle g(h5::check(H5Gcreate2(root, "tokenizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), im.tmp,
                       "cannot create group 'tokenizer'"));
    hsize_t m = model.size();
    Handle ms(h5::check(H5Screate_simple(1, &m, nullptr), im.tmp, "H5Screate_simple"));
    Handle d(h5::check(H5Dcreate2(g.get(), "model", H5T_STD_U8LE, ms.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                       im.tmp, "cannot create dataset 'tokenizer/model'"));
    h5::check_status(H5Dwrite(d.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, model.data()), im.tmp,
                     "cannot write dataset 'tokenizer/model'");
    // What /tokenizer/model holds: a sentencepiece ModelProto, or the text of
    // a Hugging Face tokenizer.json.
    h5::write_attr_string(g.get(), "type", tokenizer == "sentencepiece" ? "sentencepiece-bpe" : "hf-tokenizer-json",
                          im.tmp);
  }
}

TokenDatasetWriter::~TokenDatasetWriter() {
  if (impl_ && !impl_->finished) {
    impl_->tokens.reset();
    impl_->mask.reset();
    impl_->file.reset();
    std::remove(impl_->tmp.c_str());
  }
}

void TokenDatasetWriter::append(const std::vector<token_t>& tokens) {
  auto& im = *impl_;
  if (im.finished) throw DataError(im.path + ": append after finish()");
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= static_cast<token_t>(im.vocab_size) || tokens[i] == static_cast<token_t>(im.eos_id))
      throw DataError(im.path + ": document " + std::to_string(im.offsets.size() - 1) + " token " +
                      std::to_string(i) + " = " + std::to_string(tokens[i]) +
                      (tokens[i] == static_cast<token_t>(im.eos_id) ? " is EOS (appended by the writer)"
                                                                    : " is not below vocab_size " +
                                                                          std::to_string(im.vocab_size)));
  }
  im.buf.insert(im.buf.end(), tokens.begin(), tokens.end());
  im.buf.push_back(static_cast<token_t>(im.eos_id));
  im.offsets.push_back(static_cast<std::uint64_t>(im.total()));
  if (im.mask.valid()) {
    if (im.pending_mask) {
      im.mbuf.insert(im.mbuf.end(), im.pending_mask->begin(), im.pending_mask->end());
      for (std::size_t i = 1; i < im.pending_mask->size(); ++i) im.loss_targets += (*im.pending_mask)[i];
    } else {
      im.mbuf.insert(im.mbuf.end(), tokens.size() + 1, std::uint8_t{1});
      im.loss_targets += static_cast<std::int64_t>(tokens.size());
    }
  }
  if (static_cast<std::int64_t>(im.buf.size()) >= 16 * im.opts.chunk_tokens) im.flush();
}

void TokenDatasetWriter::append(const std::vector<token_t>& tokens, const std::vector<std::uint8_t>& mask) {
  auto& im = *impl_;
  if (!im.mask.valid())
    throw DataError(im.path + ": append with a loss mask needs TokenDatasetWriter::Options::loss_mask");
  if (mask.size() != tokens.size() + 1)
    throw DataError(im.path + ": document " + std::to_string(im.offsets.size() - 1) + ": loss mask of " +
                    std::to_string(mask.size()) + " values for " + std::to_string(tokens.size()) +
                    " tokens + EOS");
  for (std::size_t i = 0; i < mask.size(); ++i)
    if (mask[i] > 1)
      throw DataError(im.path + ": document " + std::to_string(im.offsets.size() - 1) + ": loss mask value " +
                      std::to_string(int(mask[i])) + " at token " + std::to_string(i) + " (must be 0 or 1)");
  im.pending_mask = &mask;
  try {
    append(tokens);
  } catch (...) {
    im.pending_mask = nullptr;
    throw;
  }
  im.pending_mask = nullptr;
}

std::int64_t TokenDatasetWriter::loss_targets() const { return impl_->loss_targets; }

void TokenDatasetWriter::finish() {
  auto& im = *impl_;
  if (im.finished) return;
  im.flush();
  hid_t root = im.file.get();
  hsize_t n = im.offsets.size();
  hsize_t chunk = std::min<hsize_t>(n, 1 << 16);
  Handle space(h5::check(H5Screate_simple(1, &n, nullptr), im.tmp, "H5Screate_simple"));
  Handle dcpl(h5::check(H5Pcreate(H5P_DATASET_CREATE), im.tmp, "H5Pcreate"));
  h5::check_status(H5Pset_chunk(dcpl.get(), 1, &chunk), im.tmp, "H5Pset_chunk");
  h5::check_status(H5Pset_fletcher32(dcpl.get()), im.tmp, "H5Pset_fletcher32");
  Handle d(h5::check(H5Dcreate2(root, "doc_offsets", H5T_STD_U64LE, space.get(), H5P_DEFAULT, dcpl.get(),
                                H5P_DEFAULT),
                     im.tmp, "cannot create dataset 'doc_offsets'"));
  h5::check_status(H5Dwrite(d.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, im.offsets.data()), im.tmp,
                   "cannot write dataset 'doc_offsets'");
  d.reset();
  h5::write_attr_i64(root, "num_docs", static_cast<std::int64_t>(n) - 1, im.tmp);
  h5::write_attr_i64(root, "num_tokens", im.written, im.tmp);
  h5::write_attr_i64(root, "max_token_id", im.max_id, im.tmp);
  h5::write_attr_string(root, "tokens_fnv1a64", hex64(im.fnv), im.tmp);
  if (im.mask.valid()) h5::write_attr_i64(root, "loss_targets", im.loss_targets, im.tmp);
  im.tokens.reset();
  im.mask.reset();
  h5::check_status(H5Fflush(root, H5F_SCOPE_GLOBAL), im.tmp, "H5Fflush");
  im.file.reset();
  std::error_code ec;
  fs::rename(im.tmp, im.path, ec);
  if (ec) throw DataError(im.tmp + ": cannot rename to " + im.path + " (" + ec.message() + ")");
  im.finished = true;
}

std::int64_t TokenDatasetWriter::num_docs() const { return static_cast<std::int64_t>(impl_->offsets.size()) - 1; }
std::int64_t TokenDatasetWriter::num_tokens() const { return impl_->total(); }

}  // namespace wlb::data

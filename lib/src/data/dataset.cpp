// HDF5 token dataset: reader (TokenDataset) and writer (TokenDatasetWriter).
#include "wlb4d/data/dataset.hpp"

#include "wlb4d/data/h5util.hpp"
#include "wlb4d/core/hash.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/version.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <sys/stat.h>

namespace wlb::data {

using core::DataError;
namespace fs = std::filesystem;
using h5::Handle;

// =============================================================== reader

struct TokenDataset::Impl {
  std::string path;
  std::string tokenizer;
  std::string source;
  std::string model;
  int vocab_size = 0;
  int eos_id = 0;
  std::int64_t num_tokens = 0;
  std::vector<std::uint64_t> offsets;
  Handle file;
  Handle tokens;  // /tokens
  Handle tokens_space;
  std::string checksum;  // tokens_fnv1a64 attribute ("" : a dataset written before it existed)
  Handle mask;           // /loss_mask (empty: none)
  Handle mask_space;
  std::int64_t loss_targets = -1;
  /// FNV-1a 64 over the ids as little-endian uint32 bytes (the host order on
  /// every target wlb4d builds for), in blocks; read_range also checks every
  /// id < vocab_size. "" when it matches or the dataset has no checksum,
  /// else the error.
  std::string verify_checksum() const;

  void read_range(std::int64_t begin, std::int64_t count, token_t* out) const;
  /// Everything of open() but the offsets: attributes, /tokens, tokenizer model.
  void open_common(hid_t fapl);
};

namespace {

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

/// Reads and validates /doc_offsets (rank 0 of a collective open, or a serial open).
std::vector<std::uint64_t> load_offsets(hid_t file, const std::string& path, std::int64_t num_tokens) {
  hsize_t n = 0;
  Handle d = open_1d(file, path, "doc_offsets", H5T_INTEGER, 8, true, "uint64", &n);
  if (n < 1) throw DataError(dset_err(path, "doc_offsets", "must hold num_docs+1 >= 1 entries (it is empty)"));
  // Every document holds at least its EOS: more offsets than tokens + 1 is a
  // declared size the tokens cannot back (checked before the read).
  if (n - 1 > static_cast<hsize_t>(num_tokens))
    throw DataError(dset_err(path, "doc_offsets",
                             "declares " + std::to_string(n - 1) + " documents, more than the " +
                                 std::to_string(num_tokens) +
                                 " tokens of dataset 'tokens' (every document holds at least its EOS)"));
  std::vector<std::uint64_t> off(n);
  read_all(d.get(), H5T_NATIVE_UINT64, off.data(), path, "doc_offsets");
  if (off[0] != 0)
    throw DataError(dset_err(path, "doc_offsets", "must start at 0 (it starts at " + std::to_string(off[0]) + ")"));
  for (hsize_t i = 1; i < n; ++i)
    if (off[i] <= off[i - 1])
      throw DataError(dset_err(path, "doc_offsets",
                               "must be strictly increasing (every document holds at least its EOS): "
                               "offset[" + std::to_string(i) + "] = " + std::to_string(off[i]) +
                               " <= offset[" + std::to_string(i - 1) + "] = " + std::to_string(off[i - 1])));
  if (off.back() != static_cast<std::uint64_t>(num_tokens))
    throw DataError(dset_err(path, "doc_offsets",
                             "must end at num_tokens = " + std::to_string(num_tokens) + " (it ends at " +
                                 std::to_string(off.back()) + ")"));
  if (h5::has_attr(file, "num_docs")) {  // written by wlb4d-prep: it must say what /doc_offsets holds
    const auto docs = h5::read_attr_i64(file, "num_docs", path);
    if (docs < 0 || static_cast<hsize_t>(docs) != n - 1)
      throw DataError(path + ": root attribute 'num_docs' = " + std::to_string(docs) +
                      " does not match dataset 'doc_offsets' of " + std::to_string(n) +
                      " entries (num_docs + 1 offsets)");
  }
  return off;
}

}  // namespace

void TokenDataset::Impl::open_common(hid_t fapl) {
  Impl& im = *this;
  const std::string& path = im.path;
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
  im.file = Handle(h5::check(f, path, "cannot open HDF5 file (truncated or corrupt?)"));
  hid_t root = im.file.get();

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
  im.vocab_size = static_cast<int>(vocab);
  auto eos = h5::read_attr_i64(root, "eos_id", path);
  if (eos < 0 || eos >= vocab)
    throw DataError(path + ": wrong schema: root attribute 'eos_id' = " + std::to_string(eos) +
                    " must be in [0, vocab_size = " + std::to_string(vocab) + ")");
  im.eos_id = static_cast<int>(eos);
  im.tokenizer = h5::read_attr_string(root, "tokenizer", path);
  if (im.tokenizer != "bytes" && im.tokenizer != "sentencepiece" && im.tokenizer != "hf-bpe")
    throw DataError(path + ": wrong schema: root attribute 'tokenizer' is '" + im.tokenizer +
                    "', expected 'bytes', 'sentencepiece' or 'hf-bpe'");
  im.source = h5::has_attr(root, "source") ? h5::read_attr_string(root, "source", path) : std::string();

  hsize_t n = 0;
  im.tokens = open_1d(root, path, "tokens", H5T_INTEGER, 4, true, "uint32", &n);
  im.num_tokens = static_cast<std::int64_t>(n);
  im.tokens_space = Handle(h5::check(H5Dget_space(im.tokens.get()), path, "H5Dget_space tokens"));
  if (h5::has_attr(root, "num_tokens")) {  // written by wlb4d-prep: it must say what /tokens holds
    const auto declared = h5::read_attr_i64(root, "num_tokens", path);
    if (declared != im.num_tokens)
      throw DataError(path + ": root attribute 'num_tokens' = " + std::to_string(declared) +
                      " does not match dataset 'tokens' of " + std::to_string(im.num_tokens) + " tokens");
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
  if (h5::has_attr(root, "tokens_fnv1a64")) im.checksum = h5::read_attr_string(root, "tokens_fnv1a64", path);

  if (h5::exists(root, "loss_mask")) {
    hsize_t nm = 0;
    im.mask = open_1d(root, path, "loss_mask", H5T_INTEGER, 1, true, "uint8", &nm);
    if (nm != n)
      throw DataError(dset_err(path, "loss_mask",
                               "must hold one value per token: " + std::to_string(nm) + " values for " +
                                   std::to_string(n) + " tokens"));
    im.mask_space = Handle(h5::check(H5Dget_space(im.mask.get()), path, "H5Dget_space loss_mask"));
  }
  if (h5::has_attr(root, "loss_targets")) im.loss_targets = h5::read_attr_i64(root, "loss_targets", path);

  if (im.tokenizer != "bytes") {
    hsize_t m = 0;
    if (!h5::exists(root, "tokenizer"))
      throw DataError(dset_err(path, "tokenizer/model", "is missing (required when tokenizer = " + im.tokenizer + ")"));
    Handle d = open_1d(root, path, "tokenizer/model", H5T_INTEGER, 1, true, "uint8", &m);
    im.model.resize(m);
    if (m > 0) read_all(d.get(), H5T_NATIVE_UINT8, im.model.data(), path, "tokenizer/model");
  }
}

void TokenDataset::Impl::read_range(std::int64_t begin, std::int64_t count, token_t* out) const {
  if (count == 0) return;
  hsize_t start = static_cast<hsize_t>(begin), cnt = static_cast<hsize_t>(count);
  Handle fspace(h5::check(H5Scopy(tokens_space.get()), path, "H5Scopy"));
  h5::check_status(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr), path,
                   "cannot select tokens [" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")");
  Handle mspace(h5::check(H5Screate_simple(1, &cnt, nullptr), path, "H5Screate_simple"));
  herr_t st = -1;
  {
    const h5::Quiet quiet;
    st = H5Dread(tokens.get(), H5T_NATIVE_UINT32, mspace.get(), fspace.get(), H5P_DEFAULT, out);
  }
  h5::check_status(st, path,
                   "cannot read dataset 'tokens' [" + std::to_string(begin) + ", " +
                       std::to_string(begin + count) + ") (truncated or corrupt file?)");
  for (std::int64_t i = 0; i < count; ++i)
    if (out[i] >= static_cast<token_t>(vocab_size))
      throw DataError(path + ": dataset 'tokens' holds id " + std::to_string(out[i]) + " at index " +
                      std::to_string(begin + i) + ", not below vocab_size " + std::to_string(vocab_size));
}

namespace {
constexpr std::int64_t kChecksumBlock = 1 << 22;  // tokens per read of the checksum pass (16 MiB)

std::string hex64(std::uint64_t h) {
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}
}  // namespace

TokenDataset::TokenDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;
TokenDataset::~TokenDataset() = default;

TokenDataset TokenDataset::open(const std::string& path) {
  auto im = std::make_unique<Impl>();
  im->path = path;
  im->open_common(H5P_DEFAULT);
  im->offsets = load_offsets(im->file.get(), path, im->num_tokens);
  const std::string err = im->verify_checksum();
  if (!err.empty()) throw DataError(err);
  return TokenDataset(std::move(im));
}

TokenDataset TokenDataset::open(const std::string& path, const comm::Communicator& comm) {
  auto im = std::make_unique<Impl>();
  im->path = path;
  // Every rank sees the same file, so open_common fails on all ranks or none;
  // still, agree on it so that no rank is left alone in the collective H5Fopen.
  const int exists_here = fs::exists(path) ? 1 : 0;
  if (!comm.allreduce_value(exists_here, comm::ReduceOp::Min))
    throw DataError(path + ": token dataset does not exist (on at least one rank)");
  Handle fapl(h5::check(H5Pcreate(H5P_FILE_ACCESS), path, "H5Pcreate"));
  // HDF5's MPI-IO driver needs the raw communicator.
  h5::check_status(H5Pset_fapl_mpio(fapl.get(), comm.mpi(), MPI_INFO_NULL), path, "H5Pset_fapl_mpio");
  im->open_common(fapl.get());

  // Rank 0 reads and validates the offsets; everyone learns the verdict.
  std::string err;
  if (comm.rank() == 0) {
    try {
      im->offsets = load_offsets(im->file.get(), path, im->num_tokens);
      err = im->verify_checksum();  // one pass on one rank (independent reads)
    } catch (const DataError& e) {
      err = e.what();
    }
  }
  err = comm::bcast_string(comm, err, 0);
  if (!err.empty()) throw DataError(err);
  std::int64_t n = static_cast<std::int64_t>(im->offsets.size());
  comm.broadcast(&n, 1, 0);
  im->offsets.resize(static_cast<std::size_t>(n));
  comm.broadcast(im->offsets.data(), im->offsets.size(), 0);  // split below INT_MAX elements by comm
  return TokenDataset(std::move(im));
}

std::int64_t TokenDataset::num_docs() const { return static_cast<std::int64_t>(impl_->offsets.size()) - 1; }
std::int64_t TokenDataset::num_tokens() const { return impl_->num_tokens; }
int TokenDataset::vocab_size() const { return impl_->vocab_size; }
int TokenDataset::eos_id() const { return impl_->eos_id; }
const std::string& TokenDataset::tokenizer() const { return impl_->tokenizer; }
const std::string& TokenDataset::path() const { return impl_->path; }
const std::string& TokenDataset::source() const { return impl_->source; }
const std::vector<std::uint64_t>& TokenDataset::doc_offsets() const { return impl_->offsets; }
std::string TokenDataset::tokenizer_model() const { return impl_->model; }
bool TokenDataset::has_checksum() const { return !impl_->checksum.empty(); }
bool TokenDataset::has_loss_mask() const { return impl_->mask.valid(); }

std::int64_t TokenDataset::loss_targets() const {
  if (!has_loss_mask()) return num_tokens() - num_docs();
  return impl_->loss_targets;
}

void TokenDataset::read_loss_mask(std::int64_t doc, std::int64_t offset, std::int64_t length,
                                  std::uint8_t* out) const {
  const auto& im = *impl_;
  const std::int64_t len = doc_length(doc);
  if (offset < 0 || length < 0 || offset + length > len)
    throw DataError(im.path + ": span [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                    ") leaves document " + std::to_string(doc) + " of length " + std::to_string(len));
  if (length == 0) return;
  if (!im.mask.valid()) {
    std::fill(out, out + length, std::uint8_t{1});
    return;
  }
  const std::int64_t begin = static_cast<std::int64_t>(im.offsets[std::size_t(doc)]) + offset;
  hsize_t start = static_cast<hsize_t>(begin), cnt = static_cast<hsize_t>(length);
  const std::string range = "[" + std::to_string(begin) + ", " + std::to_string(begin + length) + ") (document " +
                            std::to_string(doc) + ")";
  Handle fspace(h5::check(H5Scopy(im.mask_space.get()), im.path, "H5Scopy"));
  h5::check_status(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr), im.path,
                   "cannot select loss_mask " + range);
  Handle mspace(h5::check(H5Screate_simple(1, &cnt, nullptr), im.path, "H5Screate_simple"));
  herr_t st = -1;
  {
    const h5::Quiet quiet;
    st = H5Dread(im.mask.get(), H5T_NATIVE_UINT8, mspace.get(), fspace.get(), H5P_DEFAULT, out);
  }
  h5::check_status(st, im.path,
                   "cannot read dataset 'loss_mask' " + range + " (a chunk failed its Fletcher32 check: corrupt file?)");
  for (std::int64_t i = 0; i < length; ++i)
    if (out[i] > 1)
      throw DataError(im.path + ": dataset 'loss_mask' holds " + std::to_string(int(out[i])) + " at index " +
                      std::to_string(begin + i) + " (a loss mask is 0 or 1)");
}

std::int64_t TokenDataset::span_targets(std::int64_t doc, std::int64_t offset, std::int64_t length) const {
  const std::int64_t len = doc_length(doc);
  if (offset < 0 || length < 0 || offset + length > len)
    throw DataError(impl_->path + ": span [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                    ") leaves document " + std::to_string(doc) + " of length " + std::to_string(len));
  if (length <= 1) return 0;
  if (!has_loss_mask()) return length - 1;
  std::vector<std::uint8_t> m(static_cast<std::size_t>(length));
  read_loss_mask(doc, offset, length, m.data());
  std::int64_t n = 0;
  for (std::int64_t i = 1; i < length; ++i) n += m[std::size_t(i)];
  return n;
}

std::int64_t TokenDataset::doc_length(std::int64_t doc) const {
  if (doc < 0 || doc >= num_docs())
    throw DataError(impl_->path + ": document " + std::to_string(doc) + " out of range [0, " +
                    std::to_string(num_docs()) + ")");
  return static_cast<std::int64_t>(impl_->offsets[doc + 1] - impl_->offsets[doc]);
}

void TokenDataset::read(std::int64_t doc, std::int64_t offset, std::int64_t length, token_t* out) const {
  std::int64_t len = doc_length(doc);
  if (offset < 0 || length < 0 || offset + length > len)
    throw DataError(impl_->path + ": span [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                    ") leaves document " + std::to_string(doc) + " of length " + std::to_string(len));
  impl_->read_range(static_cast<std::int64_t>(impl_->offsets[doc]) + offset, length, out);
}

void TokenDataset::read_tokens(std::int64_t begin, std::int64_t count, token_t* out) const {
  if (begin < 0 || count < 0 || begin + count > impl_->num_tokens)
    throw DataError(impl_->path + ": token range [" + std::to_string(begin) + ", " +
                    std::to_string(begin + count) + ") leaves dataset 'tokens' of " +
                    std::to_string(impl_->num_tokens) + " tokens");
  impl_->read_range(begin, count, out);
}

std::string TokenDataset::identity() const {
  std::error_code ec;
  std::string abs = fs::absolute(impl_->path, ec).lexically_normal().string();
  if (ec) abs = impl_->path;
  struct stat sb {};
  long long size = -1, mtime_ns = -1;
  if (::stat(impl_->path.c_str(), &sb) == 0) {
    size = static_cast<long long>(sb.st_size);
    mtime_ns = static_cast<long long>(sb.st_mtim.tv_sec) * 1000000000LL + sb.st_mtim.tv_nsec;
  }
  const std::uint64_t h = core::fnv1a_u64_le(impl_->offsets.data(), impl_->offsets.size());  // over the offsets' bytes
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  std::ostringstream os;
  os << "path=" << abs << ";size=" << size << ";mtime=" << mtime_ns << ";docs=" << num_docs()
     << ";tokens=" << num_tokens() << ";offsets_fnv1a=" << hex;
  return os.str();
}

std::string TokenDataset::Impl::verify_checksum() const {
  const Impl& im = *this;
  if (im.checksum.empty()) return "";
  std::vector<token_t> buf;
  std::uint64_t h = core::kFnv1aOffset;
  try {
    for (std::int64_t b = 0; b < im.num_tokens; b += kChecksumBlock) {
      const std::int64_t n = std::min(kChecksumBlock, im.num_tokens - b);
      buf.resize(std::size_t(n));
      im.read_range(b, n, buf.data());
      h = core::fnv1a(buf.data(), buf.size() * sizeof(token_t), h);
    }
  } catch (const DataError& e) {
    return e.what();
  }
  if (hex64(h) != im.checksum)
    return im.path + ": dataset 'tokens' does not match its checksum (attribute tokens_fnv1a64 = " + im.checksum +
           ", the tokens give " + hex64(h) + "): the token ids were changed after wlb4d-prep wrote them";
  return "";
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

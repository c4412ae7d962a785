#include "wlb4d/balance/doc_source.hpp"

#include "wlb4d/core/error.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

namespace wlb::balance {

DocSource::~DocSource() = default;

namespace {
std::size_t draw_index(std::mt19937_64& rng, std::size_t n) {
  // Multiply-shift: uniform enough for simulation, identical on every platform.
  return static_cast<std::size_t>((static_cast<unsigned __int128>(rng()) * n) >> 64);
}
}  // namespace

VectorDocSource::VectorDocSource(std::vector<std::int64_t> lengths) : lengths_(std::move(lengths)) {
  if (lengths_.empty()) throw core::DataError("VectorDocSource: empty length list");
}

Doc VectorDocSource::next() {
  const auto n = drawn_++;
  return Doc{n, lengths_[static_cast<std::size_t>(n % static_cast<std::int64_t>(lengths_.size()))]};
}

SampledDocSource::SampledDocSource(std::vector<std::int64_t> lengths, std::uint64_t seed, std::int64_t clip)
    : lengths_(std::move(lengths)), seed_(seed), clip_(clip), rng_(seed) {
  if (lengths_.empty()) throw core::DataError("SampledDocSource: empty length distribution");
  for (auto& l : lengths_) {
    if (l < 1) throw core::DataError("SampledDocSource: document length " + std::to_string(l) + " < 1");
    if (clip_ > 0 && l > clip_) l = clip_;
  }
}

Doc SampledDocSource::next() {
  const auto i = draw_index(rng_, lengths_.size());
  return Doc{drawn_++, lengths_[i]};
}

void SampledDocSource::seek(std::int64_t n) {
  rng_.seed(seed_);
  drawn_ = 0;
  while (drawn_ < n) next();
}

std::vector<std::int64_t> load_lengths_json(const std::string& path) {
  // A FIFO would block the open, a device be read without end: regular files only.
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);  // follows symlinks
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    throw core::DataError("document lengths file '" + path + "' is not a regular file (a device, FIFO or directory)");
  std::ifstream in(path);
  if (!in) throw core::DataError("document lengths file '" + path + "' cannot be opened");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw core::DataError("document lengths file '" + path + "' is not valid JSON: " + e.what());
  }
  if (!j.is_array() || j.empty())
    throw core::DataError("document lengths file '" + path + "' must hold a non-empty JSON array of lengths");
  std::vector<std::int64_t> out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    const auto& v = j[i];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 1)
      throw core::DataError("document lengths file '" + path + "': entry " + std::to_string(i) +
                            " must be an integer >= 1 (tokens)");
    out.push_back(v.get<std::int64_t>());
  }
  return out;
}

std::vector<std::int64_t> sample_lengths(const std::vector<std::int64_t>& lengths, std::size_t n,
                                         std::uint64_t seed) {
  if (lengths.empty()) throw core::DataError("sample_lengths: empty length distribution");
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> out(n);
  for (auto& x : out) x = lengths[draw_index(rng, lengths.size())];
  return out;
}

}  // namespace wlb::balance

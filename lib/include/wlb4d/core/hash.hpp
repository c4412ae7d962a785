#pragma once
/// \file hash.hpp
/// \brief The two hash functions wlb4d's reproducibility rests on, defined once.
///
/// Parameter initialisation (model/params: a value is a function of
/// (seed, tensor name, global index)), the document order of every epoch
/// (data/document_stream) and the identities stored in checkpoints and
/// datasets all depend on these staying bit-identical across areas and
/// releases: changing one changes every initial weight and every data order.
///
/// - splitmix64: the finaliser of Steele, Lea & Flood, "Fast splittable
///   pseudorandom number generators" (OOPSLA 2014), as in Vigna's
///   splitmix64.c: a bijection on 64-bit words with good avalanche.
/// - FNV-1a 64-bit (Fowler–Noll–Vo; offset basis 0xcbf29ce484222325, prime
///   0x100000001b3) over bytes; `h` continues a running hash.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace wlb::core {

inline constexpr std::uint64_t kFnv1aOffset = 0xcbf29ce484222325ULL;
inline constexpr std::uint64_t kFnv1aPrime = 0x100000001b3ULL;

/// splitmix64 finaliser of x (x advanced by the golden-ratio increment first).
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// FNV-1a over `n` bytes at `p`, continuing from `h`.
inline std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = kFnv1aOffset) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= kFnv1aPrime;
  }
  return h;
}

/// FNV-1a over the bytes of a string, continuing from `h`.
inline std::uint64_t fnv1a(std::string_view s, std::uint64_t h = kFnv1aOffset) {
  return fnv1a(s.data(), s.size(), h);
}

/// FNV-1a over the 8 little-endian bytes of each value (byte order fixed,
/// not the host's), continuing from `h`.
inline std::uint64_t fnv1a_u64_le(const std::uint64_t* v, std::size_t n, std::uint64_t h = kFnv1aOffset) {
  for (std::size_t i = 0; i < n; ++i)
    for (int b = 0; b < 8; ++b) {
      h ^= (v[i] >> (8 * b)) & 0xFF;
      h *= kFnv1aPrime;
    }
  return h;
}

}  // namespace wlb::core

// core/hash.hpp against published reference values (not the code's own output).
#include "wlb4d/core/hash.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

using wlb::core::fnv1a;
using wlb::core::fnv1a_u64_le;
using wlb::core::splitmix64;

TEST(Hash, SplitMix64MatchesVignasReferenceSequence) {
  // Vigna's splitmix64.c with state 0: next() adds the increment, then mixes;
  // the first three outputs are well known.
  std::uint64_t state = 0;
  auto next = [&] {
    const std::uint64_t out = splitmix64(state);
    state += 0x9e3779b97f4a7c15ULL;
    return out;
  };
  EXPECT_EQ(next(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(next(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(next(), 0x06c45d188009454fULL);
}

TEST(Hash, Fnv1aMatchesPublishedTestVectors) {
  // From the FNV reference test suite (Landon Curt Noll, fnv/test_fnv.c).
  EXPECT_EQ(fnv1a(std::string()), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a(std::string("a")), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a(std::string("foobar")), 0x85944171f73967e8ULL);
  // Continuing a running hash equals hashing the concatenation.
  EXPECT_EQ(fnv1a(std::string("bar"), fnv1a(std::string("foo"))), fnv1a(std::string("foobar")));
}

TEST(Hash, Fnv1aOfU64IsLittleEndianBytes) {
  const std::uint64_t v[2] = {0x0102030405060708ULL, 42};
  unsigned char bytes[16];
  for (int i = 0; i < 2; ++i)
    for (int b = 0; b < 8; ++b) bytes[8 * i + b] = static_cast<unsigned char>(v[i] >> (8 * b));
  EXPECT_EQ(fnv1a_u64_le(v, 2), fnv1a(bytes, sizeof bytes));
}

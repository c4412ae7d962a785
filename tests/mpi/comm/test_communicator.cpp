// wlb::comm::Communicator (MPI backend) on 1, 2 and 4 ranks, both wait modes.
// Every expected value is computed serially from the rank formula that
// generated the inputs.
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/bf16.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/types.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

using wlb::comm::Communicator;
using wlb::comm::ReduceOp;
using wlb::comm::WaitMode;

namespace {

class CommTest : public ::testing::TestWithParam<WaitMode> {
 protected:
  Communicator c = Communicator::world(GetParam());
};

/// Restores the per-message element limit after a test lowers it.
struct LimitGuard {
  std::size_t saved = wlb::comm::detail::max_message_elements();
  explicit LimitGuard(std::size_t n) { wlb::comm::detail::set_max_message_elements(n); }
  ~LimitGuard() { wlb::comm::detail::set_max_message_elements(saved); }
};

TEST_P(CommTest, RankAndSize) {
  int r = -1, s = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  EXPECT_EQ(c.rank(), r);
  EXPECT_EQ(c.size(), s);
  EXPECT_EQ(c.wait_mode(), GetParam());
  auto self = Communicator::self(GetParam());
  EXPECT_EQ(self.size(), 1);
  EXPECT_EQ(self.rank(), 0);
  EXPECT_EQ(self.allreduce_value(7.5), 7.5);
}

TEST_P(CommTest, AllreduceSumMaxMin) {
  const int n = 1000, R = c.size(), me = c.rank();
  std::vector<double> d(n);
  std::vector<std::int64_t> l(n);
  std::vector<float> f(n);
  for (int i = 0; i < n; ++i) {
    d[i] = 100.0 * me + i;
    l[i] = (std::int64_t{1} << 40) * (me + 1) + i;
    f[i] = static_cast<float>(me * (i % 7 == 0 ? -1 : 1));
  }
  c.allreduce(d.data(), d.size());
  c.allreduce(l.data(), l.size(), ReduceOp::Max);
  c.allreduce(f.data(), f.size(), ReduceOp::Min);
  const double rank_sum = R * (R - 1) / 2.0;
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(d[i], 100.0 * rank_sum + double(R) * i) << i;
    ASSERT_EQ(l[i], (std::int64_t{1} << 40) * R + i) << i;
    ASSERT_EQ(f[i], i % 7 == 0 ? -float(R - 1) : 0.0f) << i;
  }
  EXPECT_EQ(c.allreduce_value<std::uint32_t>(me + 1u), std::uint32_t(R * (R + 1) / 2));
  EXPECT_EQ(c.allreduce_value<std::int32_t>(-me, ReduceOp::Min), -(R - 1));
  EXPECT_EQ(c.allreduce_value<std::uint64_t>(std::uint64_t(me) << 33, ReduceOp::Max), std::uint64_t(R - 1) << 33);
  EXPECT_EQ(c.allreduce_value<unsigned char>(static_cast<unsigned char>(me + 1), ReduceOp::Max), R);
}

// comm.grad_reduce_dtype = bf16 (bf16 gradient reduction): against the conversion of
// core/bf16.hpp applied to the known addends. 2 ranks: exactly
// round(fp32(a) + fp32(b)); any size: within one rounding per addend of the
// exact sum, and equal on every rank.
TEST_P(CommTest, AllreduceBf16SumIsTheRoundedFp32Sum) {
  const int n = 777, R = c.size(), me = c.rank();
  auto value = [](int r, int i) { return float((i % 13) - 6) * 0.37f + float(r) * 1.0e-3f * float(i + 1); };
  std::vector<std::uint16_t> b(n);
  for (int i = 0; i < n; ++i) b[i] = wlb::core::float_to_bf16(value(me, i));
  c.allreduce_bf16_sum(b.data(), b.size());
  std::vector<float> mine(n), all(std::size_t(n) * R);  // bf16 → fp32 is exact
  for (int i = 0; i < n; ++i) mine[i] = wlb::core::bf16_to_float(b[i]);
  c.allgather(mine.data(), all.data(), mine.size());
  for (int i = 0; i < n; ++i) {
    double exact = 0, mag = 0;
    for (int r = 0; r < R; ++r) {
      const double x = wlb::core::bf16_to_float(wlb::core::float_to_bf16(value(r, i)));
      exact += x;
      mag += std::abs(x);
    }
    const float got = wlb::core::bf16_to_float(b[i]);
    for (int r = 0; r < R; ++r) ASSERT_EQ(all[std::size_t(r) * n + i], got) << "element " << i << " rank " << r;
    if (R == 1) {
      ASSERT_EQ(b[i], wlb::core::float_to_bf16(value(0, i))) << i;
    }
    if (R == 2) {
      ASSERT_EQ(b[i], wlb::core::float_to_bf16(float(wlb::core::bf16_to_float(wlb::core::float_to_bf16(value(0, i))) +
                                                     wlb::core::bf16_to_float(wlb::core::float_to_bf16(value(1, i))))))
          << i;
    }
    ASSERT_LE(std::abs(double(got) - exact), R * wlb::core::kBf16UnitRoundoff * mag + 1e-30) << i;
  }
}

TEST_P(CommTest, AllreduceKokkosViewAndLarge) {
  // 256 KB of floats through the View overload.
  const std::size_t n = 65536;
  wlb::HostView1<float> v("v", n);
  for (std::size_t i = 0; i < n; ++i) v(i) = float(c.rank() + 1) * float(i % 13);
  c.allreduce(v);
  const float tot = float(c.size() * (c.size() + 1) / 2);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(v(i), tot * float(i % 13)) << i;
  wlb::HostView2<double> m("m", 3, 4);
  if (c.rank() == c.size() - 1)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) m(i, j) = 10 * i + j + 0.5;
  c.broadcast(m, c.size() - 1);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) ASSERT_EQ(m(i, j), 10 * i + j + 0.5);
}

TEST_P(CommTest, SplitMessagesAboveLimit) {
  // With the limit at 7 elements, 50-element calls become 8 MPI messages each:
  // the same path a > INT_MAX buffer takes.
  LimitGuard g(7);
  std::vector<std::int64_t> a(50);
  std::iota(a.begin(), a.end(), std::int64_t(c.rank()) * 1000);
  c.allreduce(a.data(), a.size());
  const std::int64_t rs = std::int64_t(c.size()) * (c.size() - 1) / 2;
  for (int i = 0; i < 50; ++i) ASSERT_EQ(a[i], rs * 1000 + std::int64_t(c.size()) * i);
  std::vector<double> b(50, c.rank() == 0 ? 3.25 : -1.0);
  c.broadcast(b.data(), b.size(), 0);
  for (double x : b) ASSERT_EQ(x, 3.25);
  if (c.size() >= 2) {
    std::vector<float> s(23);
    if (c.rank() == 0) {
      std::iota(s.begin(), s.end(), 1.0f);
      c.send(s.data(), s.size(), 1, 5);
    } else if (c.rank() == 1) {
      c.recv(s.data(), s.size(), 0, 5);
      for (int i = 0; i < 23; ++i) ASSERT_EQ(s[i], float(i + 1));
    }
  }
  // Calls that cannot be split report the limit.
  std::vector<float> x(8 * c.size());
  EXPECT_THROW(c.allgather(x.data(), x.data(), 8), wlb::core::CommError);
  EXPECT_THROW(c.reduce_scatter(x.data(), x.data(), 8), wlb::core::CommError);
}

TEST_P(CommTest, Allgather) {
  const int n = 5, R = c.size();
  std::vector<std::int32_t> s(n), r(n * R, -1);
  for (int i = 0; i < n; ++i) s[i] = 10 * c.rank() + i;
  c.allgather(s.data(), r.data(), n);
  for (int q = 0; q < R; ++q)
    for (int i = 0; i < n; ++i) ASSERT_EQ(r[q * n + i], 10 * q + i);
}

TEST_P(CommTest, AllgathervUnevenCountsWithGaps) {
  const int R = c.size();
  std::vector<int> counts(R), displs(R);
  int off = 0;
  for (int q = 0; q < R; ++q) {
    counts[q] = (q * 3) % 4 + (q == 0 ? 0 : 1);  // 0, 4, 3, 2: uneven, rank 0 sends nothing
    displs[q] = off;
    off += counts[q] + 1;  // one-element gap that must stay untouched
  }
  std::vector<double> s(counts[c.rank()]);
  for (int i = 0; i < counts[c.rank()]; ++i) s[i] = 1000.0 * c.rank() + i;
  std::vector<double> r(off, -7.0);
  c.allgatherv(s.data(), s.size(), r.data(), counts, displs);
  for (int q = 0; q < R; ++q) {
    for (int i = 0; i < counts[q]; ++i) ASSERT_EQ(r[displs[q] + i], 1000.0 * q + i);
    ASSERT_EQ(r[displs[q] + counts[q]], -7.0);
  }
  // Argument errors are reported, not passed to MPI.
  EXPECT_THROW(c.allgatherv(s.data(), s.size() + 1, r.data(), counts, displs), wlb::core::CommError);
  EXPECT_THROW(c.allgatherv(s.data(), s.size(), r.data(), std::vector<int>(R + 1, 0), displs),
               wlb::core::CommError);
}

TEST_P(CommTest, ReduceScatterBlock) {
  const int n = 6, R = c.size();
  std::vector<float> s(n * R), r(n);
  for (int k = 0; k < n * R; ++k) s[k] = float(c.rank() + 1) * float(k);
  c.reduce_scatter(s.data(), r.data(), n);
  const float f = float(R * (R + 1) / 2);
  for (int i = 0; i < n; ++i) ASSERT_EQ(r[i], f * float(c.rank() * n + i));
}

TEST_P(CommTest, ReduceScattervUnevenCounts) {
  const int R = c.size();
  std::vector<int> counts(R);
  for (int q = 0; q < R; ++q) counts[q] = 2 * q + 1 - (q == 1 ? 3 : 0);  // 1, 0, 5, 7
  const int total = std::accumulate(counts.begin(), counts.end(), 0);
  auto value = [](int rank, int k) { return double(rank * 1000 + 3 * k) + 0.25; };
  std::vector<double> s(total);
  for (int k = 0; k < total; ++k) s[k] = value(c.rank(), k);
  std::vector<double> r(counts[c.rank()] + 1, -9.0);
  c.reduce_scatterv(s.data(), r.data(), counts);
  // Serial reference: block q starts at the prefix sum of counts.
  int displ = 0;
  for (int q = 0; q < c.rank(); ++q) displ += counts[q];
  for (int j = 0; j < counts[c.rank()]; ++j) {
    double want = 0;
    for (int q = 0; q < R; ++q) want += value(q, displ + j);
    ASSERT_DOUBLE_EQ(r[j], want) << j;
  }
  EXPECT_EQ(r[counts[c.rank()]], -9.0);
  EXPECT_THROW(c.reduce_scatterv(s.data(), r.data(), std::vector<int>(R + 2, 1)), wlb::core::CommError);
}

// In place (ZeRO-1's gradient reduce-scatter and parameter all-gather): the
// same sums and values as the out-of-place calls above, in this rank's own
// range of the one buffer; a rank with no elements (count 0) included.
TEST_P(CommTest, InPlaceReduceScattervAndAllgatherv) {
  const int R = c.size();
  std::vector<int> counts(R), displs(R);
  int total = 0;
  for (int q = 0; q < R; ++q) {
    counts[q] = 2 * q + 3 - (q == 1 ? 5 : 0);  // 3, 0, 7, 9: uneven, one empty
    displs[q] = total;
    total += counts[q];
  }
  auto value = [](int rank, int k) { return double(rank * 1000 + 3 * k) + 0.25; };
  std::vector<double> buf(total);
  for (int k = 0; k < total; ++k) buf[k] = value(c.rank(), k);
  const int me = c.rank(), d = displs[me];
  c.reduce_scatterv(buf.data(), buf.data() + d, counts);
  for (int j = 0; j < counts[me]; ++j) {
    double want = 0;
    for (int q = 0; q < R; ++q) want += value(q, d + j);
    ASSERT_DOUBLE_EQ(buf[d + j], want) << j;
  }
  // All-gather in place: every rank ends with every rank's reduced range.
  c.allgatherv(buf.data() + d, std::size_t(counts[me]), buf.data(), counts, displs);
  for (int k = 0; k < total; ++k) {
    double want = 0;
    for (int q = 0; q < R; ++q) want += value(q, k);
    ASSERT_DOUBLE_EQ(buf[k], want) << k;
  }
}

// In place with the uneven counts of a ZeRO-1 gradient bucket, large enough
// for MPICH's pairwise algorithm (the size of a 25 MiB bucket's shares):
// rank r's displacement is below its count (0 < displ < count), where
// MPI_IN_PLACE aborts in MPICH 4 with an overlapping memcpy. Blocking and
// nonblocking, every rank's range checked, the other ranges untouched.
TEST_P(CommTest, InPlaceReduceScattervUnevenLargeBuckets) {
  const int R = c.size(), me = c.rank();
  std::vector<int> counts(R), displs(R);
  int total = 0;
  for (int q = 0; q < R; ++q) {
    counts[q] = 40000 * (q + 1) * (q + 1) + 7 * q;  // 40000, 160007, 360014, ...
    displs[q] = total;
    total += counts[q];
  }
  auto value = [](int rank, int k) { return float((rank + 1) * (k % 1024)); };
  const float rank_sum = float(R * (R + 1) / 2);
  for (const bool nonblocking : {false, true}) {
    std::vector<float> buf(total);
    for (int k = 0; k < total; ++k) buf[k] = value(me, k);
    const int d = displs[me];
    if (nonblocking) {
      auto req = c.ireduce_scatterv(buf.data(), buf.data() + d, counts);
      req.wait();
    } else {
      c.reduce_scatterv(buf.data(), buf.data() + d, counts);
    }
    for (int k = 0; k < total; ++k) {
      const bool mine = k >= d && k < d + counts[me];
      ASSERT_EQ(buf[k], mine ? rank_sum * float(k % 1024) : value(me, k)) << "k=" << k << " nb=" << nonblocking;
    }
  }
}

TEST_P(CommTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < c.size(); ++root) {
    std::vector<std::uint64_t> b(17, c.rank() == root ? 0 : 99);
    if (c.rank() == root)
      for (int i = 0; i < 17; ++i) b[i] = (std::uint64_t(root) << 40) + i;
    c.broadcast(b.data(), b.size(), root);
    for (int i = 0; i < 17; ++i) ASSERT_EQ(b[i], (std::uint64_t(root) << 40) + i);
  }
  std::string text = c.rank() == 0 ? "hello ranks" : "???????????";
  c.broadcast(text.data(), text.size(), 0);
  EXPECT_EQ(text, "hello ranks");
  int x = 0;
  EXPECT_THROW(c.broadcast(&x, 1, c.size()), wlb::core::CommError);
}

TEST_P(CommTest, SendRecvRing) {
  const int R = c.size();
  if (R < 2) GTEST_SKIP() << "ring needs >= 2 ranks";
  const int me = c.rank(), next = (me + 1) % R, prev = (me + R - 1) % R;
  // 1 MB messages: above the eager limit, so blocking sends rendezvous; the
  // even/odd order keeps the ring deadlock-free.
  const std::size_t n = 262144;
  std::vector<float> out(n), in(n, -1.0f);
  for (std::size_t i = 0; i < n; ++i) out[i] = float(me) + float(i % 100) * 0.5f;
  if (me % 2 == 0) {
    c.send(out.data(), n, next, 11);
    c.recv(in.data(), n, prev, 11);
  } else {
    c.recv(in.data(), n, prev, 11);
    c.send(out.data(), n, next, 11);
  }
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(in[i], float(prev) + float(i % 100) * 0.5f);
  c.barrier();
}

TEST_P(CommTest, RecvSizeMismatchIsAnError) {
  if (c.size() < 2) GTEST_SKIP();
  std::vector<int> buf(8, 0);
  if (c.rank() == 0) {
    c.send(buf.data(), 3, 1, 21);  // shorter than expected
    c.send(buf.data(), 8, 1, 22);  // longer than the receive buffer
  } else if (c.rank() == 1) {
    EXPECT_THROW(c.recv(buf.data(), 5, 0, 21), wlb::core::CommError);
    try {
      c.recv(buf.data(), 4, 0, 22);
      ADD_FAILURE() << "truncation not reported";
    } catch (const wlb::core::CommError& e) {
      EXPECT_NE(std::string(e.what()).find("MPI_"), std::string::npos) << e.what();
    }
  }
  c.barrier();
}

// The watchdog's side-channel tags are not for the caller (they would be
// taken for a watchdog query or answer).
TEST_P(CommTest, WatchdogTagsAreReserved) {
  int x = 1;
  for (int tag : {wlb::comm::kWatchdogQueryTag, wlb::comm::kWatchdogAnswerTag}) {
    EXPECT_THROW(c.send(&x, 1, 0, tag), wlb::core::CommError);
    EXPECT_THROW(c.recv(&x, 1, 0, tag), wlb::core::CommError);
  }
}

TEST_P(CommTest, NullCommunicatorThrows) {
  Communicator null;
  int x = 1;
  EXPECT_THROW(null.allreduce(&x, 1), wlb::core::CommError);
  EXPECT_THROW(null.barrier(), wlb::core::CommError);
  Communicator null2(MPI_COMM_NULL);
  EXPECT_THROW(null2.broadcast(&x, 1, 0), wlb::core::CommError);
}

TEST_P(CommTest, OwnedCommunicatorLivesWhileACopyLives) {
  MPI_Comm dup;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &dup), MPI_SUCCESS);
  Communicator survivor;
  {
    Communicator a(dup, GetParam(), /*owns=*/true);
    survivor = a;  // the copy shares ownership
  }
  // The first owner is gone; the communicator must still work through the copy.
  EXPECT_EQ(survivor.allreduce_value(1), c.size());
  EXPECT_EQ(survivor.size(), c.size());
}

TEST_P(CommTest, SplitByColorAndNoColor) {
  // Even ranks form one communicator (reverse order by key), odd ranks none.
  const bool even = c.rank() % 2 == 0;
  const auto sub = c.split(even ? 0 : Communicator::kNoColor, -c.rank());
  ASSERT_EQ(sub.has_value(), even);
  if (sub) {
    const int n_even = (c.size() + 1) / 2;
    EXPECT_EQ(sub->size(), n_even);
    EXPECT_EQ(sub->rank(), n_even - 1 - c.rank() / 2);
    EXPECT_EQ(sub->wait_mode(), GetParam());
    EXPECT_EQ(sub->allreduce_value(1), n_even);
  }
  c.barrier();
}

TEST_P(CommTest, AgreeOnFirstError) {
  EXPECT_EQ(wlb::comm::agree(c, ""), "");
  // Every rank from 1 up has an error: rank 1's wins (rank 0's alone when size 1).
  const std::string mine = "error of rank " + std::to_string(c.rank());
  const std::string got = wlb::comm::agree(c, c.rank() >= 1 || c.size() == 1 ? mine : "");
  EXPECT_EQ(got, c.size() == 1 ? "error of rank 0" : "error of rank 1");
}

TEST_P(CommTest, BroadcastString) {
  const int root = c.size() - 1;
  const std::string s = c.rank() == root ? std::string("from the root, with a \0 inside", 30) : "ignored";
  EXPECT_EQ(wlb::comm::bcast_string(c, s, root), std::string("from the root, with a \0 inside", 30));
  EXPECT_EQ(wlb::comm::bcast_string(c, c.rank() == 0 ? "" : "x", 0), "");
}

INSTANTIATE_TEST_SUITE_P(WaitModes, CommTest, ::testing::Values(WaitMode::Yield, WaitMode::Block),
                         [](const auto& info) { return info.param == WaitMode::Yield ? "Yield" : "Block"; });

}  // namespace

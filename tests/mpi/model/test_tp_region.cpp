// Tensor-parallel region edges (model/tp_region.hpp) on 2 and 3 ranks: each
// edge and its backward against the rows and sums worked out on every rank,
// without and with sequence parallelism, for T even, uneven over the ranks
// and T < tp (a rank with no row still joins every collective). Values are
// small integers, so every sum is exact in fp32 and fp64 and the checks are
// equalities.
#include "test_util.hpp"
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/model/params.hpp"
#include "wlb4d/model/tp_region.hpp"

#include <gtest/gtest.h>

using namespace wlb;
using namespace wlb::model;
using namespace wlb::test;

namespace {

constexpr std::int64_t kWidth = 3;

/// Element (i, j) of the full [T][kWidth] tensor, times `mul`.
double value(std::int64_t i, std::int64_t j, double mul) { return mul * double(1 + 10 * i + j); }

/// x[i][j] = value(row0 + i, j, mul) through a host mirror.
template <class S>
void fill(const View2<S>& x, std::int64_t row0, double mul) {
  auto h = Kokkos::create_mirror_view(x);
  for (std::size_t i = 0; i < h.extent(0); ++i)
    for (std::size_t j = 0; j < h.extent(1); ++j) h(i, j) = S(value(std::int64_t(i) + row0, std::int64_t(j), mul));
  Kokkos::deep_copy(x, h);
}

template <class S>
void expect_rows(const View2<S>& x, std::int64_t row0, double mul, const char* what) {
  const auto h = host_vec(x);
  for (std::size_t i = 0; i < x.extent(0); ++i)
    for (std::size_t j = 0; j < x.extent(1); ++j)
      ASSERT_EQ(h[i * x.extent(1) + j], value(std::int64_t(i) + row0, std::int64_t(j), mul))
          << what << " row " << i << " col " << j;
}

template <class S>
void check_edges(bool sp, std::int64_t T) {
  const auto w = comm::Communicator::world();
  const int p = w.size(), r = w.rank();
  const TpRegion<S> tpr(w, sp, kWidth);
  ASSERT_EQ(tpr.sequence_parallel(), sp && p > 1);
  ASSERT_EQ(tpr.parallel(), p > 1);
  const auto [o, n] = tpr.local_rows(T);
  if (sp) {
    EXPECT_EQ(std::make_pair(o, n), split_range(T, p, r));
  } else {
    EXPECT_EQ(std::make_pair(o, n), std::make_pair(std::int64_t(0), T));
  }
  const double rank_sum = p * (p + 1) / 2.0;  // Σ_r (r + 1): rank r's partial is (r + 1) · value
  View1<S> buf("buf", T * kWidth);

  // Column-parallel entry: this rank's rows in, every row out.
  View2<S> local("local", n, kWidth);
  fill(local, o, 1.0);
  const auto full = tpr.enter_column(local, T, buf.data());
  ASSERT_EQ(full.extent(0), std::size_t(T));
  if (!sp) {
    EXPECT_EQ(full.data(), local.data());  // identity
  }
  expect_rows(full, 0, 1.0, "enter_column");

  // Its backward, blocking and started: the partial input gradients summed, this rank's rows kept.
  for (bool started : {false, true}) {
    View2<S> dx("dx", T, kWidth);
    fill(dx, 0, r + 1.0);
    View2<S> dx_local = sp ? View2<S>("dx_local", n, kWidth) : dx;
    if (started && tpr.parallel()) {
      auto req = tpr.start_enter_column_backward(dx, T, dx_local);
      tpr.finish(req);
    } else {
      tpr.enter_column_backward(dx, T, dx_local);
    }
    expect_rows(dx_local, o, tpr.parallel() ? rank_sum : 1.0, "enter_column_backward");
  }

  // Row-parallel exit: partial outputs of all T rows summed into this rank's rows.
  View2<S> out("out", n, kWidth);
  const auto partial = tpr.row_partial(out, T, buf.data());
  ASSERT_EQ(partial.extent(0), std::size_t(sp ? T : n));
  fill(partial, 0, r + 1.0);
  tpr.leave_row(partial, T, out);
  expect_rows(out, o, tpr.parallel() ? rank_sum : 1.0, "leave_row");

  // Its backward: the output gradient's rows gathered (SP) or passed on.
  View2<S> dout("dout", n, kWidth);
  fill(dout, o, 2.0);
  const auto dpartial = tpr.leave_row_backward(dout, T, buf.data());
  if (!sp) {
    EXPECT_EQ(dpartial.data(), dout.data());
  }
  expect_rows(dpartial, 0, 2.0, "leave_row_backward");

  EXPECT_GE(tpr.comm_seconds(), 0.0);
  EXPECT_GE(tpr.overlapped_seconds(), 0.0);
}

TEST(TpRegion, WithoutSequenceParallelism) {
  for (std::int64_t T : {6, 7, 1}) {
    SCOPED_TRACE(T);
    check_edges<double>(false, T);
    check_edges<float>(false, T);
  }
}

TEST(TpRegion, SequenceParallelism) {
  for (std::int64_t T : {6, 7, 1}) {
    SCOPED_TRACE(T);
    check_edges<double>(true, T);
    check_edges<float>(true, T);
  }
}

TEST(TpRegion, OneRankIgnoresSequenceParallelism) {
  TpRegion<double> tpr(comm::Communicator::self(), true, kWidth);
  EXPECT_FALSE(tpr.sequence_parallel());
  EXPECT_FALSE(tpr.parallel());
  EXPECT_EQ(tpr.local_rows(5), std::make_pair(std::int64_t(0), std::int64_t(5)));
  View2<double> x("x", 5, kWidth);
  fill(x, 0, 1.0);
  tpr.leave_row(x, 5, x);  // no collective on one rank
  expect_rows(x, 0, 1.0, "leave_row on one rank");
  EXPECT_EQ(tpr.comm_seconds(), 0.0);
}

}  // namespace

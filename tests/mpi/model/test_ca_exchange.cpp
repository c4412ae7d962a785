// Core-attention disaggregation (model/ca_exchange.hpp) on 3
// ranks: each rank holds its own packed micro-batch (documents of lengths
// 1, 2, short and one far longer than the rest); some query blocks are
// computed on other ranks. Every output of the disaggregated forward and
// backward (out, lse, dq, dk, dv) is compared with the local kernel on the
// same rank's own data (the independent computation: no exchange at all).
// Cases: a rank that exports everything, a rank that imports everything,
// blocks starting inside a span (prefix > 0, several blocks of one span to
// one destination: K/V sent once), and the moves of the real assignment
// (balance::assign_attention_tasks), whose result must be identical on
// every rank. Each case runs twice: with a device backend attached to the
// group (the path NCCL takes on GPU builds; a counting host backend here),
// which must be used and give bit for bit the MPI path's outputs.
#include "host_device_collectives.hpp"
#include "test_util.hpp"
#include "wlb4d/balance/attention_tasks.hpp"
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/model/attention.hpp"
#include "wlb4d/model/ca_exchange.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace wlb;
using namespace wlb::model;
using namespace wlb::test;

namespace {

constexpr std::int64_t kHq = 4, kHkv = 2, kD = 16;

/// Document lengths of rank r's micro-batch (known to every rank).
std::vector<std::int64_t> docs_of(int r) {
  if (r == 0) return {1, 2, 37, 5};
  if (r == 1) return {3, 1, 2, 9};
  return {301, 2, 1, 20};  // one document far longer than the rest
}

struct Local {
  std::int64_t T = 0;
  std::vector<std::int64_t> cu;
  View3<float> q, k, v, out, dout, dq, dk, dv;
  View2<float> lse;
  IntVec lo, hi;
};

Local make_local(int r) {
  Local L;
  L.cu = {0};
  for (auto d : docs_of(r)) L.cu.push_back(L.cu.back() + d);
  L.T = L.cu.back();
  std::mt19937_64 rng(1000 + r);
  L.q = View3<float>("q", L.T, kHq, kD);
  L.k = View3<float>("k", L.T, kHkv, kD);
  L.v = View3<float>("v", L.T, kHkv, kD);
  L.dout = View3<float>("dout", L.T, kHq, kD);
  for (auto* x : {&L.q, &L.k, &L.v, &L.dout}) fill_normal(*x, rng);
  L.out = View3<float>("out", L.T, kHq, kD);
  L.dq = View3<float>("dq", L.T, kHq, kD);
  L.dk = View3<float>("dk", L.T, kHkv, kD);
  L.dv = View3<float>("dv", L.T, kHkv, kD);
  L.lse = View2<float>("lse", kHq, L.T);
  std::vector<std::int32_t> lo, hi;
  for (std::size_t s = 0; s + 1 < L.cu.size(); ++s)
    for (auto i = L.cu[s]; i < L.cu[s + 1]; ++i) {
      lo.push_back(std::int32_t(L.cu[s]));
      hi.push_back(std::int32_t(i));
    }
  upload_ints(L.lo, lo, "lo");
  upload_ints(L.hi, hi, "hi");
  return L;
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 1e-6;
  for (double x : b) scale = std::max(scale, std::fabs(x));
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return 1e30;
      continue;
    }
    worst = std::max(worst, std::fabs(a[i] - b[i]) / scale);
  }
  return worst;
}

/// A move of rows [row, row + rows) of span `s` of `home`'s micro-batch.
CaMove move(int home, int dest, std::int32_t s, std::int64_t prefix, std::int64_t rows) {
  std::vector<std::int64_t> cu = {0};
  for (auto d : docs_of(home)) cu.push_back(cu.back() + d);
  CaMove m;
  m.home = home;
  m.dest = dest;
  m.span = s;
  m.prefix = prefix;
  m.rows = rows;
  m.key_begin = cu[std::size_t(s)];
  m.q_row = cu[std::size_t(s)] + prefix;
  return m;
}

/// Runs the disaggregated forward + backward with `moves` and compares every
/// output with the local kernel's on this rank's data.
void check(const std::vector<CaMove>& moves, const char* what) {
  const auto world = comm::Communicator::world();
  const int r = world.rank();
  Local L = make_local(r);
  const float scale = float(1.0 / std::sqrt(double(kD)));
  const View1<const std::int32_t> lo(L.lo.data(), L.T), hi(L.hi.data(), L.T);
  // Reference: this rank's attention, computed here.
  attention_forward<float>(L.q, L.k, L.v, lo, hi, scale, L.out, L.lse);
  attention_backward<float>(L.q, L.k, L.v, L.out, L.dout, L.lse, lo, hi, scale, L.dq, L.dk, L.dv);
  const auto out0 = host_vec(L.out), lse0 = host_vec(L.lse), dq0 = host_vec(L.dq), dk0 = host_vec(L.dk),
             dv0 = host_vec(L.dv);

  // The exchange on `group`; returns its stats (outputs in L).
  auto run_exchange = [&](const comm::Communicator& group) {
    CoreAttentionExchange ca(group, kHq, kHkv, kD);
    auto layout = CoreAttentionExchange::make_layout();
    ca.prepare(moves, L.T, *layout);
    ca.bind(layout);
    Kokkos::deep_copy(L.out, 7.0f);  // stale values must not survive
    Kokkos::deep_copy(L.dq, 7.0f);
    Kokkos::deep_copy(L.dk, 7.0f);
    Kokkos::deep_copy(L.dv, 7.0f);
    ca.forward(0, 0, L.q, L.k, L.v, lo, hi, scale, L.out, L.lse);
    ca.backward(0, 0, L.q, L.k, L.v, L.out, L.dout, L.lse, lo, hi, scale, L.dq, L.dk, L.dv);
    Kokkos::fence();
    return ca.stats();
  };
  // With a device backend attached (NCCL on GPU builds; a counting host
  // backend here) the exchange goes through it: the same floats arrive in
  // the same places, so every output is bit for bit the MPI path's.
  auto calls = std::make_shared<test::DeviceCalls>();
  comm::Communicator attached = world;
  attached.attach_device(std::make_shared<test::HostDeviceCollectives>(world, calls));
  const CaStats dst = run_exchange(attached);
  const auto out_d = host_vec(L.out), lse_d = host_vec(L.lse), dq_d = host_vec(L.dq), dk_d = host_vec(L.dk),
             dv_d = host_vec(L.dv);
  const bool any = world.allreduce_value(int(moves.size())) > 0;
  // Forward: out and back; backward: out and back (every rank joins each).
  EXPECT_EQ(calls->alltoallv.load(), any ? 4 : 0) << what << ": the exchange did not use the device backend";
  const CaStats st = run_exchange(world);
  EXPECT_EQ(calls->alltoallv.load(), any ? 4 : 0) << what << ": the unattached run used the device backend";
  EXPECT_TRUE(host_vec(L.out) == out_d && host_vec(L.lse) == lse_d && host_vec(L.dq) == dq_d &&
              host_vec(L.dk) == dk_d && host_vec(L.dv) == dv_d)
      << what << ": the device-backend run differs from the MPI run, rank " << r;
  EXPECT_EQ(dst.bytes_sent, st.bytes_sent) << what;
  EXPECT_EQ(dst.bytes_received, st.bytes_received) << what;
  EXPECT_EQ(dst.rows_exported, st.rows_exported) << what;
  // fp32: moved rows see other key-tile boundaries and dK/dV partial sums
  // are added in another order — rounding only (measured ~1e-7).
  const double tol = 2e-6;
  EXPECT_LE(rel_diff(host_vec(L.out), out0), tol) << what << " out, rank " << r;
  EXPECT_LE(rel_diff(host_vec(L.lse), lse0), tol) << what << " lse, rank " << r;
  EXPECT_LE(rel_diff(host_vec(L.dq), dq0), tol) << what << " dq, rank " << r;
  EXPECT_LE(rel_diff(host_vec(L.dk), dk0), tol) << what << " dk, rank " << r;
  EXPECT_LE(rel_diff(host_vec(L.dv), dv0), tol) << what << " dv, rank " << r;
  std::int64_t out_rows = 0, in_rows = 0;
  for (const auto& m : moves) {
    if (m.home == r) out_rows += m.rows;
    if (m.dest == r) in_rows += m.rows;
  }
  EXPECT_EQ(st.rows_exported, 2 * out_rows) << what;  // forward + backward
  EXPECT_EQ(st.rows_imported, 2 * in_rows) << what;
  if (out_rows + in_rows > 0) {
    EXPECT_GT(st.bytes_sent + st.bytes_received, 0) << what;
  }
}

}  // namespace

TEST(CaExchange, RankZeroExportsEverythingRankOneImports) {
  ASSERT_EQ(comm::Communicator::world().size(), 3);
  std::vector<CaMove> m;
  for (std::int32_t s = 0; s < 4; ++s) m.push_back(move(0, s % 2 == 0 ? 1 : 2, s, 0, docs_of(0)[std::size_t(s)]));
  check(m, "rank 0 exports all");
}

TEST(CaExchange, BlocksInsideSpansAndSharedKeys) {
  ASSERT_EQ(comm::Communicator::world().size(), 3);
  // Rank 2's long document: three blocks to rank 1 (one K/V block sent, the
  // longest range), one to rank 0; its length-2 document to rank 0; the
  // rest of rank 2 stays home. Rank 1 imports only.
  std::vector<CaMove> m = {move(2, 1, 0, 0, 64), move(2, 1, 0, 64, 64), move(2, 0, 0, 128, 64),
                           move(2, 1, 0, 237, 64), move(2, 0, 1, 0, 2), move(0, 1, 2, 10, 27)};
  check(m, "blocks inside spans");
}

TEST(CaExchange, NoMovesIsLocal) {
  ASSERT_EQ(comm::Communicator::world().size(), 3);
  check({}, "no moves");
}

TEST(CaExchange, AssignedMovesAreIdenticalOnEveryRankAndExact) {
  const auto world = comm::Communicator::world();
  ASSERT_EQ(world.size(), 3);
  // The group's pieces as the executor builds them (cp = 1: one piece per span).
  std::vector<std::vector<balance::Piece>> pieces(3);
  for (int r = 0; r < 3; ++r) {
    std::int64_t start = 0;
    const auto d = docs_of(r);
    for (std::size_t s = 0; s < d.size(); ++s) {
      pieces[std::size_t(r)].push_back({std::int32_t(s), 0, d[s], start});
      start += d[s];
    }
  }
  balance::CostModel cost;
  cost.b = 1e-9;
  cost.tile = 32;
  const std::vector<int> self = {0, 1, 2};
  const auto tasks = balance::make_attention_tasks(pieces, self, cost, 32);
  const balance::AttentionTraffic traffic{4.0 * CoreAttentionExchange::query_row_floats(kHq, kD),
                                          4.0 * CoreAttentionExchange::key_row_floats(kHkv, kD)};
  const auto a = balance::assign_attention_tasks(tasks, 3, self, traffic, 0.0);
  EXPECT_GT(a.moved, 0);
  EXPECT_LT(a.imbalance_after(), a.imbalance_before());
  std::vector<CaMove> moves;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    if (a.owner[i] == tasks[i].home) continue;
    CaMove m;
    m.home = tasks[i].home;
    m.dest = a.owner[i];
    m.q_row = tasks[i].row;
    m.rows = tasks[i].length;
    m.key_begin = tasks[i].key_begin();
    m.prefix = tasks[i].prefix;
    m.span = tasks[i].span;
    moves.push_back(m);
  }
  // Deterministic: every rank computed the same owners.
  std::vector<std::int64_t> mine(a.owner.begin(), a.owner.end()), maxv = mine, minv = mine;
  world.allreduce(maxv.data(), maxv.size(), comm::ReduceOp::Max);
  world.allreduce(minv.data(), minv.size(), comm::ReduceOp::Min);
  EXPECT_EQ(maxv, mine);
  EXPECT_EQ(minv, mine);
  check(moves, "assigned moves");
}

TEST(CaExchange, BadMoveIsRefused) {
  const auto world = comm::Communicator::world();
  CoreAttentionExchange ca(world, kHq, kHkv, kD);
  auto layout = CoreAttentionExchange::make_layout();
  EXPECT_THROW(ca.prepare({move(0, 0, 0, 0, 1)}, 45, *layout), std::invalid_argument);  // home == dest
  EXPECT_THROW(ca.prepare({move(0, 5, 0, 0, 1)}, 45, *layout), std::invalid_argument);  // outside the group
  CaMove big = move(world.rank(), (world.rank() + 1) % 3, 0, 0, 1000);
  EXPECT_THROW(ca.prepare({big}, 45, *layout), std::invalid_argument);  // beyond this rank's rows
}

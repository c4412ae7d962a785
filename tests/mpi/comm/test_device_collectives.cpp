// Communicator's device-buffer entry points with a DeviceCollectives attached
// (the dispatch that NCCL uses on GPU builds), on 1, 2 and 4 ranks, with a
// host backend that counts its calls (tests/common/host_device_collectives.hpp):
// all-to-all-v against MPI_Ialltoallv on the same data (uneven counts, zero
// counts, a rank that sends nothing, gaps between blocks), point to point
// matched by order, the backend passed to a split communicator (make_for),
// and the errors. Expected values come from the rank formula that made the data.
#include "host_device_collectives.hpp"
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/error.hpp"

#include <gtest/gtest.h>

#include <vector>

using wlb::comm::Communicator;
using wlb::test::DeviceCalls;
using wlb::test::HostDeviceCollectives;

namespace {

/// Elements rank r sends to rank p: uneven, often zero; the last rank of a
/// group of more than one sends nothing at all.
int count_of(int r, int p, int n) {
  if (n > 1 && r == n - 1) return 0;
  return (r + 2 * p) % 3 * (p + 1);
}
float value_of(int r, int p, int i) { return float(r * 1000 + p * 100 + i); }
constexpr float kUntouched = -7.0f;

struct Exchange {
  std::vector<int> sc, sd, rc, rd;
  std::vector<float> send, recv;
};

/// This rank's buffers, with one unused element between blocks (sentinels).
Exchange make_exchange(const Communicator& c) {
  const int n = c.size(), me = c.rank();
  Exchange x;
  int so = 0, ro = 0;
  for (int p = 0; p < n; ++p) {
    x.sc.push_back(count_of(me, p, n));
    x.sd.push_back(so);
    so += x.sc.back() + 1;
    x.rc.push_back(count_of(p, me, n));
    x.rd.push_back(ro);
    ro += x.rc.back() + 1;
  }
  x.send.assign(std::size_t(so), kUntouched);
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < x.sc[std::size_t(p)]; ++i) x.send[std::size_t(x.sd[std::size_t(p)] + i)] = value_of(me, p, i);
  x.recv.assign(std::size_t(ro), kUntouched);
  return x;
}

/// What rank `me` must receive (sentinels between the blocks).
std::vector<float> expected_recv(const Exchange& x, int me) {
  std::vector<float> want(x.recv.size(), kUntouched);
  for (std::size_t p = 0; p < x.rc.size(); ++p)
    for (int i = 0; i < x.rc[p]; ++i) want[std::size_t(x.rd[p] + i)] = value_of(int(p), me, i);
  return want;
}

TEST(DeviceCollectives, AlltoallvWithBackendEqualsMpi) {
  Communicator c = Communicator::world();
  Exchange mpi = make_exchange(c);
  c.ialltoallv(mpi.send.data(), mpi.sc, mpi.sd, mpi.recv.data(), mpi.rc, mpi.rd).wait();
  EXPECT_EQ(mpi.recv, expected_recv(mpi, c.rank()));

  auto calls = std::make_shared<DeviceCalls>();
  Communicator d = Communicator::world();
  d.attach_device(std::make_shared<HostDeviceCollectives>(d, calls));
  EXPECT_TRUE(d.has_device());
  EXPECT_STREQ(d.device_backend(), "host-test");
  Exchange dev = make_exchange(d);
  auto req = d.ialltoallv_device(dev.send.data(), dev.sc, dev.sd, dev.recv.data(), dev.rc, dev.rd);
  EXPECT_TRUE(req.done()) << "a device backend completes the all-to-all at the call";
  EXPECT_EQ(dev.recv, mpi.recv);
  EXPECT_EQ(calls->alltoallv.load(), 1) << "the backend was not used";

  // Without a backend, on a host build: the MPI path, nonblocking.
  Exchange host = make_exchange(c);
  auto r2 = c.ialltoallv_device(host.send.data(), host.sc, host.sd, host.recv.data(), host.rc, host.rd);
  r2.wait();
  EXPECT_EQ(host.recv, mpi.recv);
  EXPECT_EQ(calls->alltoallv.load(), 1);
}

TEST(DeviceCollectives, AlltoallvEveryCountZero) {
  Communicator d = Communicator::world();
  auto calls = std::make_shared<DeviceCalls>();
  d.attach_device(std::make_shared<HostDeviceCollectives>(d, calls));
  const std::vector<int> z(std::size_t(d.size()), 0);
  float s = 1.0f, r = kUntouched;
  d.ialltoallv_device(&s, z, z, &r, z, z).wait();
  EXPECT_EQ(r, kUntouched);
  EXPECT_EQ(calls->alltoallv.load(), 1);
}

TEST(DeviceCollectives, AlltoallvBadArgumentsThrowBeforeTheBackend) {
  Communicator d = Communicator::world();
  auto calls = std::make_shared<DeviceCalls>();
  d.attach_device(std::make_shared<HostDeviceCollectives>(d, calls));
  const std::size_t n = std::size_t(d.size());
  std::vector<int> ok(n, 0), short_v(n + 1, 0), neg(n, 0);
  neg[0] = -1;
  float buf = 0;
  EXPECT_THROW(d.ialltoallv_device(&buf, short_v, ok, &buf, ok, ok), wlb::core::CommError);
  EXPECT_THROW(d.ialltoallv_device(&buf, ok, ok, &buf, ok, neg), wlb::core::CommError);
  EXPECT_EQ(calls->alltoallv.load(), 0);
  Communicator c = Communicator::world();
  EXPECT_THROW(c.ialltoallv_device(&buf, ok, short_v, &buf, ok, ok), wlb::core::CommError);
}

TEST(DeviceCollectives, PointToPointMatchesByOrder) {
  Communicator d = Communicator::world();
  if (d.size() < 2) GTEST_SKIP() << "needs two ranks";
  auto calls = std::make_shared<DeviceCalls>();
  d.attach_device(std::make_shared<HostDeviceCollectives>(d, calls));
  // Ranks 0 and 1: three messages each way, tags in decreasing order (a
  // device backend ignores them: the k-th send matches the k-th receive).
  const int me = d.rank();
  if (me < 2) {
    const int peer = 1 - me;
    for (int k = 0; k < 3; ++k) {
      std::vector<float> out(std::size_t(k + 2), float(me * 10 + k)), in(std::size_t(k + 2), kUntouched);
      // Rank 0 sends first, rank 1 receives first: blocking pairs cannot deadlock.
      if (me == 0) {
        d.send_device(out.data(), out.size(), peer, 9 - k);
        d.recv_device(in.data(), in.size(), peer, 9 - k);
      } else {
        d.recv_device(in.data(), in.size(), peer, 9 - k);
        d.send_device(out.data(), out.size(), peer, 9 - k);
      }
      EXPECT_EQ(in, std::vector<float>(std::size_t(k + 2), float(peer * 10 + k))) << "message " << k;
    }
    EXPECT_EQ(calls->send.load(), 3);
    EXPECT_EQ(calls->recv.load(), 3);
    EXPECT_THROW(d.send_device(nullptr, 0, d.size(), 0), wlb::core::CommError);
    EXPECT_THROW(d.recv_device(nullptr, 0, -1, 0), wlb::core::CommError);
  }
  d.barrier();
}

TEST(DeviceCollectives, BackendCarriedToASplitByMakeFor) {
  Communicator d = Communicator::world();
  auto calls = std::make_shared<DeviceCalls>();
  d.attach_device(std::make_shared<HostDeviceCollectives>(d, calls));
  auto sub = d.split(d.rank() % 2, d.rank());
  ASSERT_TRUE(sub);
  EXPECT_FALSE(sub->has_device()) << "split() does not pass the backend on";
  sub->attach_device(d.device()->make_for(*sub));
  Exchange x = make_exchange(*sub);
  sub->ialltoallv_device(x.send.data(), x.sc, x.sd, x.recv.data(), x.rc, x.rd).wait();
  EXPECT_EQ(x.recv, expected_recv(x, sub->rank()));
  EXPECT_EQ(calls->alltoallv.load(), 1);
}

}  // namespace

#pragma once
// A DeviceCollectives for tests on host builds: every call is an MPI call on
// host memory (a communicator of its own, split from the one it is made for),
// so the device-resident paths (Communicator::*_device with a backend
// attached, the core-attention exchange, pipeline point-to-point) run on the
// CPU. Calls are counted, so a test can tell that the backend was used rather
// than the MPI path. Point to point always uses one tag: like NCCL, messages
// between two ranks then match by posting order only (MPI's non-overtaking
// rule), and the receive checks the element count.
#include "wlb4d/comm/communicator.hpp"

#include <atomic>
#include <memory>
#include <vector>

namespace wlb::test {

/// Calls made through a HostDeviceCollectives and the backends made from it
/// (make_for), per kind.
struct DeviceCalls {
  std::atomic<long> allreduce{0}, allgatherv{0}, reduce_scatterv{0}, alltoallv{0}, send{0}, recv{0};
};

class HostDeviceCollectives final : public comm::DeviceCollectives {
 public:
  /// Collective over `c` (splits it). \param calls shared counters.
  HostDeviceCollectives(const comm::Communicator& c, std::shared_ptr<DeviceCalls> calls)
      : comm_(*c.split(0, c.rank())), calls_(std::move(calls)) {
    comm_.set_name(c.name() + " (test device backend)");
  }
  /// A factory for grid::ProcessGrid::use_device_backend sharing `calls`.
  static auto factory(std::shared_ptr<DeviceCalls> calls) {
    return [calls](const comm::Communicator& c) -> std::shared_ptr<const comm::DeviceCollectives> {
      return std::make_shared<HostDeviceCollectives>(c, calls);
    };
  }

  const char* name() const override { return "host-test"; }
  void allreduce(float* d, std::size_t n, comm::ReduceOp op) const override {
    ++calls_->allreduce;
    comm_.allreduce(d, n, op);
  }
  void allreduce(double* d, std::size_t n, comm::ReduceOp op) const override {
    ++calls_->allreduce;
    comm_.allreduce(d, n, op);
  }
  void allgatherv(const float* s, std::size_t sn, float* r, const std::vector<int>& counts,
                  const std::vector<int>& displs) const override {
    ++calls_->allgatherv;
    comm_.allgatherv(s, sn, r, counts, displs);
  }
  void reduce_scatterv(const float* s, float* r, const std::vector<int>& counts) const override {
    ++calls_->reduce_scatterv;
    comm_.reduce_scatterv(s, r, counts);
  }
  void alltoallv(const float* s, const std::vector<int>& sc, const std::vector<int>& sd, float* r,
                 const std::vector<int>& rc, const std::vector<int>& rd) const override {
    ++calls_->alltoallv;
    comm_.ialltoallv(s, sc, sd, r, rc, rd).wait();
  }
  void send(const float* d, std::size_t n, int dest) const override {
    ++calls_->send;
    comm_.send(d, n, dest, kTag);
  }
  void recv(float* d, std::size_t n, int src) const override {
    ++calls_->recv;
    comm_.recv(d, n, src, kTag);
  }
  std::shared_ptr<const comm::DeviceCollectives> make_for(const comm::Communicator& sub) const override {
    return std::make_shared<HostDeviceCollectives>(sub, calls_);
  }

 private:
  static constexpr int kTag = 0;
  comm::Communicator comm_;
  std::shared_ptr<DeviceCalls> calls_;
};

}  // namespace wlb::test

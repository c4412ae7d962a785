// NcclCommunicator (CUDA builds only). Skips when no GPU is visible; on a GPU
// node each rank uses device rank % device_count (ranks > devices share one,
// which NCCL rejects: run with at most one rank per GPU).
#include "wlb4d/comm/nccl_communicator.hpp"
#include "wlb4d/core/error.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

using wlb::comm::Communicator;
using wlb::comm::NcclCommunicator;
using wlb::comm::ReduceOp;
using wlb::comm::WaitMode;

namespace {

template <class T> struct DevBuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit DevBuf(std::size_t n_) : n(n_) { EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
  void put(const std::vector<T>& h) { ASSERT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

class NcclTest : public ::testing::TestWithParam<WaitMode> {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    auto w = Communicator::world();
    // Decide together: a rank that skipped alone would leave the others hanging.
    const int enough = (n > 0 && w.size() <= n) ? 1 : 0;
    if (w.allreduce_value(enough, ReduceOp::Min) == 0) GTEST_SKIP() << "no CUDA device, or more ranks than GPUs";
    ASSERT_EQ(cudaSetDevice(w.rank() % n), cudaSuccess);
    c = NcclCommunicator(w, nullptr, GetParam());
  }
  NcclCommunicator c;
};

TEST_P(NcclTest, AllreduceBroadcastAllgather) {
  const int R = c.size(), me = c.rank(), n = 1000;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = float(me + 1) * float(i % 17);
  DevBuf<float> d(n);
  d.put(h);
  c.allreduce(d.p, n);
  auto got = d.get();
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], float(R * (R + 1) / 2) * float(i % 17));
  c.allreduce(d.p, n, ReduceOp::Max);  // all equal now: max is the same
  EXPECT_EQ(d.get(), got);
  std::vector<double> b(9, me == R - 1 ? 2.5 : 0.0);
  DevBuf<double> db(9);
  db.put(b);
  c.broadcast(db.p, 9, R - 1);
  for (double x : db.get()) ASSERT_EQ(x, 2.5);
  DevBuf<std::int32_t> s(3), r(3 * R);
  s.put({10 * me, 10 * me + 1, 10 * me + 2});
  c.allgather(s.p, r.p, 3);
  auto g = r.get();
  for (int q = 0; q < R; ++q)
    for (int i = 0; i < 3; ++i) ASSERT_EQ(g[q * 3 + i], 10 * q + i);
}

TEST_P(NcclTest, UnevenAllgathervAndReduceScatterv) {
  const int R = c.size(), me = c.rank();
  std::vector<int> counts(R), displs(R);
  for (int q = 0; q < R; ++q) counts[q] = q + 1;
  std::partial_sum(counts.begin(), counts.end() - 1, displs.begin() + 1);
  const int total = displs[R - 1] + counts[R - 1];
  DevBuf<double> s(counts[me]), r(total);
  std::vector<double> hs(counts[me]);
  for (int i = 0; i < counts[me]; ++i) hs[i] = 100.0 * me + i;
  s.put(hs);
  c.allgatherv(s.p, counts[me], r.p, counts, displs);
  auto g = r.get();
  for (int q = 0; q < R; ++q)
    for (int i = 0; i < counts[q]; ++i) ASSERT_EQ(g[displs[q] + i], 100.0 * q + i);
  std::vector<double> full(total);
  for (int k = 0; k < total; ++k) full[k] = me * 1000.0 + k;
  DevBuf<double> fs(total), out(counts[me]);
  fs.put(full);
  c.reduce_scatterv(fs.p, out.p, counts);
  auto o = out.get();
  for (int j = 0; j < counts[me]; ++j) {
    double want = 0;
    for (int q = 0; q < R; ++q) want += q * 1000.0 + displs[me] + j;
    ASSERT_EQ(o[j], want);
  }
}

TEST_P(NcclTest, SendRecv) {
  if (c.size() < 2) GTEST_SKIP();
  DevBuf<float> d(64);
  if (c.rank() == 0) {
    std::vector<float> h(64);
    std::iota(h.begin(), h.end(), 1.0f);
    d.put(h);
    c.send(d.p, 64, 1);
  } else if (c.rank() == 1) {
    c.recv(d.p, 64, 0);
    auto h = d.get();
    for (int i = 0; i < 64; ++i) ASSERT_EQ(h[i], float(i + 1));
  }
}

INSTANTIATE_TEST_SUITE_P(WaitModes, NcclTest, ::testing::Values(WaitMode::Yield, WaitMode::Block),
                         [](const auto& info) { return info.param == WaitMode::Yield ? "Yield" : "Block"; });

}  // namespace

// Context-parallel K/V exchange. See cp_exchange.hpp.
#include "wlb4d/model/cp_exchange.hpp"

#include "wlb4d/core/clock.hpp"

#include <Kokkos_Core.hpp>

#include <stdexcept>
#include <string>

namespace wlb::model {

void permute_rows(const View3<float>& src, const View3<float>& dst, const IntVec& perm, std::int64_t n,
                  std::int64_t width, bool to_packed) {
  const IntVec p = perm;
  const std::int64_t w = width;
  float* s = src.data();
  float* d = dst.data();
  Kokkos::parallel_for(
      "wlb::model::cp_permute", Kokkos::RangePolicy<ExecSpace>(0, n), KOKKOS_LAMBDA(const std::int64_t q) {
        const std::int64_t g = p(q);
        const std::int64_t from = to_packed ? q : g, to = to_packed ? g : q;
        for (std::int64_t j = 0; j < w; ++j) d[to * w + j] = s[from * w + j];
      });
}

CpKvExchange::CpKvExchange(comm::Communicator cp, std::int64_t cap, std::int64_t hkv, std::int64_t hd)
    : cp_(std::move(cp)), width_(hkv * hd), cap_(cap) {
  for (auto* b : {&kg_, &vg_, &dkg_, &dvg_, &tmp_}) *b = View3<float>("cp_kv", cap, hkv, hd);
}

void CpKvExchange::bind(const std::vector<std::int64_t>& counts, const IntVec& gathered_to_packed,
                        std::int64_t total) {
  if (int(counts.size()) != cp_.size())
    throw std::invalid_argument("CpKvExchange::bind: " + std::to_string(counts.size()) + " counts for " +
                                std::to_string(cp_.size()) + " CP ranks");
  if (total > cap_)
    throw std::invalid_argument("CpKvExchange::bind: " + std::to_string(total) + " tokens exceed the capacity " +
                                std::to_string(cap_));
  counts_.assign(counts.size(), 0);
  displs_.assign(counts.size(), 0);
  int acc = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    counts_[r] = int(counts[r] * width_);
    displs_[r] = acc;
    acc += counts_[r];
  }
  perm_ = gathered_to_packed;
  total_ = total;
}

std::pair<View3<float>, View3<float>> CpKvExchange::gather(int, int, const View3<float>& k, const View3<float>& v) {
  const double t0 = core::wall_seconds();
  const std::size_t mine = std::size_t(counts_[std::size_t(cp_.rank())]);
  for (auto pr : {std::make_pair(k, kg_), std::make_pair(v, vg_)}) {
    Kokkos::fence();
    cp_.allgatherv_device(pr.first.data(), mine, tmp_.data(), counts_, displs_);
    permute_rows(tmp_, pr.second, perm_, total_, width_, /*to_packed=*/true);
  }
  Kokkos::fence();
  const double t1 = core::wall_seconds();
  seconds_ += t1 - t0;
  if (spans_) spans_->push_back({t0, t1});
  return {first_rows(kg_), first_rows(vg_)};
}

std::pair<View3<float>, View3<float>> CpKvExchange::grad_buffers(int, int, const View3<float>&,
                                                                 const View3<float>&) {
  return {first_rows(dkg_), first_rows(dvg_)};
}

void CpKvExchange::reduce_scatter(int, int, const View3<float>& dk_all, const View3<float>& dv_all,
                                  const View3<float>& dk, const View3<float>& dv) {
  const double t0 = core::wall_seconds();
  for (auto pr : {std::make_pair(dk_all, dk), std::make_pair(dv_all, dv)}) {
    permute_rows(pr.first, tmp_, perm_, total_, width_, /*to_packed=*/false);
    Kokkos::fence();
    cp_.reduce_scatterv_device(tmp_.data(), pr.second.data(), counts_);
  }
  Kokkos::fence();
  const double t1 = core::wall_seconds();
  seconds_ += t1 - t0;
  if (spans_) spans_->push_back({t0, t1});
}

View3<float> CpKvExchange::first_rows(const View3<float>& b) const {
  return Kokkos::subview(b, std::pair<std::int64_t, std::int64_t>(0, total_), Kokkos::ALL, Kokkos::ALL);
}

}  // namespace wlb::model

// Tensor-parallel region edges (tp_region.hpp).
#include "wlb4d/model/tp_region.hpp"

#include "wlb4d/model/params.hpp"

#include <algorithm>
#include <type_traits>

namespace wlb::model {

template <class Scalar>
std::pair<std::int64_t, std::int64_t> TpRegion<Scalar>::local_rows(std::int64_t T) const {
  return sp_ ? split_range(T, tp_.size(), tp_.rank()) : std::pair<std::int64_t, std::int64_t>(0, T);
}

template <class Scalar>
View2<Scalar> TpRegion<Scalar>::enter_column(const View2<Scalar>& local, std::int64_t T, Scalar* buf) const {
  return sp_ ? allgather(local, T, buf) : local;
}

template <class Scalar>
void TpRegion<Scalar>::enter_column_backward(const View2<Scalar>& dx, std::int64_t T,
                                             const View2<Scalar>& dx_local) const {
  if (sp_) {
    reduce_scatter(dx, T, dx_local);
  } else {
    allreduce(dx);  // operator f
  }
}

template <class Scalar>
View2<Scalar> TpRegion<Scalar>::row_partial(const View2<Scalar>& out, std::int64_t T, Scalar* buf) const {
  return sp_ ? View2<Scalar>(buf, T, width_) : out;
}

template <class Scalar>
void TpRegion<Scalar>::leave_row(const View2<Scalar>& partial, std::int64_t T, const View2<Scalar>& out) const {
  if (sp_) {
    reduce_scatter(partial, T, out);  // operator ḡ
  } else {
    allreduce(out);  // operator g
  }
}

template <class Scalar>
View2<Scalar> TpRegion<Scalar>::leave_row_backward(const View2<Scalar>& dout, std::int64_t T, Scalar* buf) const {
  return sp_ ? allgather(dout, T, buf) : dout;
}

template <class Scalar>
void TpRegion<Scalar>::allreduce(const View2<Scalar>& x) const {
  if (tp_.size() > 1) {
    Kokkos::fence();
    const double t0 = core::wall_seconds();
    tp_.allreduce_device(x.data(), x.span(), comm::ReduceOp::Sum);
    book(t0, core::wall_seconds());
  }
}

template <class Scalar>
comm::Request TpRegion<Scalar>::start_enter_column_backward(const View2<Scalar>& dx, std::int64_t T,
                                                           const View2<Scalar>& dx_local) const {
  Kokkos::fence();  // the dX GEMMs wrote `dx`
  if (sp_) counts(T);
  if constexpr (std::is_same_v<Scalar, float>) {
    return sp_ ? tp_.ireduce_scatterv_device(dx.data(), dx_local.data(), counts_)
               : tp_.iallreduce_device(dx.data(), dx.span());
  } else {  // fp64 (tests): MPI on the buffers directly
    return sp_ ? tp_.ireduce_scatterv(dx.data(), dx_local.data(), counts_) : tp_.iallreduce(dx.data(), dx.span());
  }
}

template <class Scalar>
void TpRegion<Scalar>::finish(comm::Request& r) const {
  const double t0 = spans_ ? core::wall_seconds() : 0.0;
  r.wait();
  // Exposed: the wait; in flight: from the start to the observed completion.
  comm_seconds_ += r.waited();
  overlapped_seconds_ += std::max(0.0, r.completed() - r.started() - r.waited());
  if (spans_) spans_->push_back({t0, core::wall_seconds()});
}

template <class Scalar>
void TpRegion<Scalar>::counts(std::int64_t T) const {
  const int p = tp_.size();
  counts_.resize(std::size_t(p));
  displs_.resize(std::size_t(p));
  for (int r = 0; r < p; ++r) {
    const auto [o, n] = split_range(T, p, r);
    counts_[std::size_t(r)] = int(n * width_);
    displs_[std::size_t(r)] = int(o * width_);
  }
}

template <class Scalar>
View2<Scalar> TpRegion<Scalar>::allgather(const View2<Scalar>& local, std::int64_t T, Scalar* buf) const {
  const View2<Scalar> full(buf, T, width_);
  counts(T);
  Kokkos::fence();
  const double t0 = core::wall_seconds();
  const std::size_t mine = std::size_t(counts_[std::size_t(tp_.rank())]);
  if constexpr (std::is_same_v<Scalar, float>) {
    tp_.allgatherv_device(local.data(), mine, full.data(), counts_, displs_);
  } else {  // fp64 (tests): MPI on the buffers directly
    tp_.allgatherv(local.data(), mine, full.data(), counts_, displs_);
  }
  book(t0, core::wall_seconds());
  return full;
}

template <class Scalar>
void TpRegion<Scalar>::reduce_scatter(const View2<Scalar>& full, std::int64_t T, const View2<Scalar>& local) const {
  counts(T);
  Kokkos::fence();
  const double t0 = core::wall_seconds();
  if constexpr (std::is_same_v<Scalar, float>) {
    tp_.reduce_scatterv_device(full.data(), local.data(), counts_);
  } else {
    tp_.reduce_scatterv(full.data(), local.data(), counts_);
  }
  book(t0, core::wall_seconds());
}

template class TpRegion<float>;
template class TpRegion<double>;

}  // namespace wlb::model

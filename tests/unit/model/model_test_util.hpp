#pragma once
// Helpers shared by the model tests: random host/device data and a
// finite-difference gradient check.
#include "wlb4d/core/types.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace wlb::model::test {

/// Fills a device View (any rank) with N(mean, std) values from `rng`.
template <class V>
void fill_normal(const V& v, std::mt19937_64& rng, double std_dev = 1.0, double mean = 0.0) {
  auto h = Kokkos::create_mirror_view(v);
  std::normal_distribution<double> n(mean, std_dev);
  auto* p = h.data();
  for (std::size_t i = 0; i < h.span(); ++i) p[i] = typename V::non_const_value_type(n(rng));
  Kokkos::deep_copy(v, h);
}

/// Host copy of a device View's elements as doubles (flat, row-major).
template <class V>
std::vector<double> host_vec(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(h.span());
  for (std::size_t i = 0; i < h.span(); ++i) out[i] = double(h.data()[i]);
  return out;
}

/// Sets element i (flat) of a device View on the host side and returns the old value.
template <class V>
double poke(const V& v, std::size_t i, double value) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  const double old = double(h.data()[i]);
  h.data()[i] = typename V::non_const_value_type(value);
  Kokkos::deep_copy(v, h);
  return old;
}

/// Central-difference check of d f / d v[i] against analytic[i] for a sample
/// of flat indices: |a − n| ≤ tol · max(|a|, |n|, floor).
template <class V>
void fd_check(const std::string& what, const V& v, const std::vector<double>& analytic,
              const std::vector<std::size_t>& idx, const std::function<double()>& f, double h = 1e-5,
              double tol = 1e-6, double floor = 1e-7) {
  for (std::size_t i : idx) {
    const double x0 = poke(v, i, 0.0);
    poke(v, i, x0 + h);
    const double fp = f();
    poke(v, i, x0 - h);
    const double fm = f();
    poke(v, i, x0);
    const double num = (fp - fm) / (2 * h);
    const double a = analytic.at(i);
    const double scale = std::max({std::fabs(a), std::fabs(num), floor});
    EXPECT_LE(std::fabs(a - num) / scale, tol) << what << "[" << i << "]: analytic " << a << " numeric " << num;
  }
}

/// `k` sample indices in [0, n): first, last, and random ones.
inline std::vector<std::size_t> sample(std::size_t n, std::size_t k, std::mt19937_64& rng) {
  std::vector<std::size_t> idx;
  if (n == 0) return idx;
  idx.push_back(0);
  if (n > 1) idx.push_back(n - 1);
  std::uniform_int_distribution<std::size_t> u(0, n - 1);
  while (idx.size() < std::min(k, n)) idx.push_back(u(rng));
  return idx;
}

/// Σ r∘y over all elements (the probe loss whose gradient w.r.t. y is r).
template <class V>
double dot(const std::vector<double>& r, const V& y) {
  const auto hy = host_vec(y);
  double s = 0;
  for (std::size_t i = 0; i < hy.size(); ++i) s += r[i] * hy[i];
  return s;
}

}  // namespace wlb::model::test

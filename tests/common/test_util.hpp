#pragma once
/// \file test_util.hpp
/// \brief Helpers shared by wlb4d's C++ tests (every test executable has
/// tests/common on its include path, see tests/cmake/Wlb4dTesting.cmake):
/// a Llama-shaped model small enough for exact checks, the world rank and
/// size, a file name unique to one test run that every rank agrees on,
/// random host/device data and a finite-difference gradient check.
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/mpi_main.hpp"
#include "wlb4d/core/types.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace wlb::test {

using core::world_rank;  // MPI_COMM_WORLD rank (0 before MPI_Init)
using core::world_size;

/// A tiny Llama-shaped model: `layers` blocks of width `d_model` with
/// `heads` query and `kv_heads` key/value heads (GQA) and a SwiGLU of
/// `ffn_hidden`. The defaults are the shape most model tests use: 2 layers,
/// d_model 16, 4 heads over 2 KV heads (head_dim 4), ffn_hidden 24. An odd
/// ffn_hidden (25) gives uneven FFN shards on tp = 2. init_std = 0.3 makes
/// every non-linearity matter in finite-difference and layout checks; RoPE
/// base and RMSNorm epsilon keep core::ModelConfig's defaults (10000, 1e-5).
inline core::ModelConfig tiny_model(int layers = 2, int d_model = 16, int heads = 4, int kv_heads = 2,
                                    int ffn_hidden = 24, double init_std = 0.02) {
  core::ModelConfig c;
  c.layers = layers;
  c.d_model = d_model;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.ffn_hidden = ffn_hidden;
  c.init_std = init_std;
  return c;
}

/// "<stem>_<pid of world rank 0><suffix>": a name that concurrent runs of
/// the suite (ctest -j, two build folders) do not share, the same on every
/// rank (collective over MPI_COMM_WORLD: every rank must call it).
inline std::string unique_name(const std::string& stem, const std::string& suffix) {
  long id = world_rank() == 0 ? long(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return stem + "_" + std::to_string(id) + suffix;
}

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

}  // namespace wlb::test

#pragma once
// Shared helpers of the checkpoint tests (tests/unit/io, tests/mpi/io): a
// small model with uneven shards, per-layout rank models built directly from
// model::ParamRegistry (no trainer), moments that are a pure function of
// (name, global index) so the expected value of every element is computed
// independently of the checkpoint code, and byte-level file damage.
#include "test_util.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/io/checkpoint.hpp"
#include "wlb4d/train/checkpoint_state.hpp"
#include "wlb4d/model/params.hpp"

#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace ckpt_test {

using wlb::Vec;
using Registry = wlb::model::ParamRegistry<float>;

/// vocab 97 (uneven over tp=2 and 4), ffn 42 (uneven over 4), 5 layers
/// (uneven over pp=2 and 4), head_dim 4, GQA 8/4.
inline wlb::core::ModelConfig model_config() { return wlb::test::tiny_model(5, 32, 8, 4, 42); }
inline constexpr std::int64_t kVocab = 97;
inline constexpr std::uint64_t kSeed = 1234;

/// AdamW moments as pure functions of (name, global flat index).
inline float expected_m(const std::string& name, std::int64_t g) {
  return float(0.01 * wlb::model::init_normal(777, name, std::uint64_t(g)));
}
inline float expected_v(const std::string& name, std::int64_t g) {
  return float(1e-4 * double(1 + g % 13) + 1e-6 * double(name.size()));
}

struct GridShape {
  int dp = 1, pp = 1, cp = 1, tp = 1, vstages = 1;
  int size() const { return dp * pp * cp * tp; }
  std::string str() const {
    return "dp" + std::to_string(dp) + "pp" + std::to_string(pp) + "cp" + std::to_string(cp) + "tp" +
           std::to_string(tp) + "v" + std::to_string(vstages);
  }
};

/// This rank's chunks for a layout: virtual stage s = c·pp + pp_rank (the
/// interleaved assignment), stage s holds split_range(layers, pp·v, s).
struct RankModel {
  std::vector<std::unique_ptr<Registry>> chunks;
  std::vector<Vec> m, v;
  std::vector<const Registry*> ptrs() const {
    std::vector<const Registry*> p;
    for (const auto& c : chunks) p.push_back(c.get());
    return p;
  }
};

inline RankModel make_rank_model(const wlb::core::ModelConfig& cfg, std::int64_t vocab,
                                 const wlb::grid::ProcessGrid& g, int vstages, std::uint64_t seed,
                                 bool fill_moments) {
  RankModel rm;
  const int stages = g.pp_size() * vstages;
  for (int c = 0; c < vstages; ++c) {
    const int s = c * g.pp_size() + g.pp_rank();
    const auto lr = wlb::model::split_range(cfg.layers, stages, s);
    wlb::model::ModelShard sh;
    sh.layer_begin = int(lr.first);
    sh.layer_end = int(lr.first + lr.second);
    sh.embedding = s == 0;
    sh.head = s == stages - 1;
    sh.tp_rank = g.tp_rank();
    sh.tp_size = g.tp_size();
    rm.chunks.push_back(std::make_unique<Registry>(cfg, vocab, sh));
    auto& reg = *rm.chunks.back();
    reg.init_parameters(seed);
    rm.m.emplace_back("m", reg.local_numel());
    rm.v.emplace_back("v", reg.local_numel());
    if (fill_moments) {
      auto hm = Kokkos::create_mirror_view(rm.m.back());
      auto hv = Kokkos::create_mirror_view(rm.v.back());
      for (const auto& p : reg)
        for (std::int64_t i = 0; i < p.local_numel(); ++i) {
          hm(p.offset + std::size_t(i)) = expected_m(p.name, p.global_index(i));
          hv(p.offset + std::size_t(i)) = expected_v(p.name, p.global_index(i));
        }
      Kokkos::deep_copy(rm.m.back(), hm);
      Kokkos::deep_copy(rm.v.back(), hv);
    }
  }
  return rm;
}

/// Elements of rm that differ from the 1-rank model `full` (values) and from
/// expected_m / expected_v; also counts the elements checked.
inline std::int64_t mismatches(const RankModel& rm, const Registry& full, std::int64_t* checked = nullptr) {
  std::int64_t bad = 0, n = 0;
  auto fh = Kokkos::create_mirror_view_and_copy(wlb::HostSpace(), full.values());
  for (std::size_t c = 0; c < rm.chunks.size(); ++c) {
    auto hv = Kokkos::create_mirror_view_and_copy(wlb::HostSpace(), rm.chunks[c]->values());
    auto hm = Kokkos::create_mirror_view_and_copy(wlb::HostSpace(), rm.m[c]);
    auto hvv = Kokkos::create_mirror_view_and_copy(wlb::HostSpace(), rm.v[c]);
    for (const auto& p : *rm.chunks[c]) {
      const auto& fp = full.at(p.name);
      for (std::int64_t i = 0; i < p.local_numel(); ++i) {
        const std::int64_t g = p.global_index(i);
        const std::size_t k = p.offset + std::size_t(i);
        bad += hv(k) != fh(fp.offset + std::size_t(g));
        bad += hm(k) != expected_m(p.name, g);
        bad += hvv(k) != expected_v(p.name, g);
        n += 3;
      }
    }
  }
  if (checked) *checked = n;
  return bad;
}

inline wlb::io::TrainState sample_state(std::int64_t step) {
  wlb::io::TrainState s;
  s.step = step;
  s.tokens_seen = 4096 * step + 17;
  s.stream_epoch = 2;
  s.stream_position = 11 + step;
  s.packer_state = {0x57424c50, 1, 2, 3, 5, 0, 7, 8, step, -1};
  s.seed = 0xfedcba9876543210ULL;
  s.skipped_steps = step % 3 + 1;  // the loss-spike guard's count and window
  s.spike_window = {3.25, 1.5, 3.125, 0.75 + double(step), 2.9999999999999996, 1e-300};
  return s;
}

inline wlb::io::CheckpointInfo sample_info(const wlb::core::ModelConfig& m, std::int64_t vocab) {
  wlb::io::CheckpointInfo info;
  wlb::core::Config cfg;
  cfg.model = m;
  info.deck = wlb::core::to_ini(cfg);
  info.dataset_identity = "path=/data/train.h5;size=123;mtime=4;docs=5;tokens=6;offsets_fnv1a=abc";
  info.model = m;
  info.vocab = vocab;
  return info;
}

/// Flips one byte in the middle of chunk `chunk` of `dataset` (serial; the
/// Fletcher32 checksum at the chunk's end then no longer matches).
inline void flip_chunk_byte(const std::string& path, const std::string& dataset, hsize_t chunk = 0) {
  haddr_t addr = 0;
  hsize_t size = 0;
  {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
    hid_t sp = H5Dget_space(ds);
    unsigned mask = 0;
    if (H5Dget_chunk_info(ds, sp, chunk, nullptr, &mask, &addr, &size) < 0 || size < 8)
      throw std::runtime_error("flip_chunk_byte: no chunk " + std::to_string(chunk) + " in " + dataset);
    H5Sclose(sp);
    H5Dclose(ds);
    H5Fclose(f);
  }
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(std::streamoff(addr + size / 2));
  char c = 0;
  io.read(&c, 1);
  c = char(c ^ 0x5a);
  io.seekp(std::streamoff(addr + size / 2));
  io.write(&c, 1);
}

}  // namespace ckpt_test

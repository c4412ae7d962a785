// Tile shapes of the portable attention kernel (attention/kokkos_tiled.cpp)
// and the team scratch they cost (internal header). The kernels are compiled
// for a few fixed shapes and a call picks one at run time from the head dim
// and the scalar type; the forward/backward overloads taking a Shape let the
// tests run the CUDA shapes on a host execution space against the reference.
#pragma once

#include "backend.hpp"

#include <cstddef>

namespace wlb::model::attn_impl::tiled {

/// A tile shape: bq queries × bk keys per (query tile, key tile) pair. Both
/// are multiples of the register block's 4 rows; bk is a multiple of the
/// register block's width (kokkos_tiled.cpp narrows the block to bk if needed).
struct Shape {
  int bq = 0, bk = 0;
};
constexpr bool operator==(Shape a, Shape b) { return a.bq == b.bq && a.bk == b.bk; }
constexpr bool operator!=(Shape a, Shape b) { return !(a == b); }

/// Every host execution space: the "team scratch" is ordinary memory, the
/// tiles live in L1/L2, so one shape for every head dim.
inline constexpr Shape kHostTiles{64, 64};

/// CUDA candidates, largest first. A call takes the first whose three
/// kernels all fit the level-0 budget for its head dim and scalar type
/// (cuda_tiles). fp32 under 48 KiB: 32 × 16 at D <= 64, 16 × 8 at D = 128;
/// under Kokkos >= 4.6's 40936 bytes (48 KiB less its team-reduction
/// reserve) 32 × 8 at D = 64, whose 32 × 16 dQ kernel (41574 bytes) would
/// otherwise run in level-1 scratch.
inline constexpr Shape kCudaTiles[] = {{32, 16}, {32, 8}, {16, 8}};
inline constexpr int kNumCudaTiles = 3;

/// Level-0 (on-chip) scratch a CUDA block gets without an opt-in, bytes.
inline constexpr std::size_t kCudaScratchBudget = 48 * 1024;

/// Per-team scratch of the three kernels, bytes.
struct ScratchBytes {
  std::size_t forward = 0, dkdv = 0, dq = 0;
  std::size_t max() const {
    const std::size_t m = forward > dkdv ? forward : dkdv;
    return m > dq ? m : dq;
  }
};

/// Team scratch of the forward, dK/dV and dQ kernels with tiles s at head dim
/// head_dim (>= 1) for Scalar (float or double): what each kernel requests
/// per team (the head dim padded to the register block width of this
/// compilation, Kokkos' per-View alignment slack included).
template <class Scalar>
ScratchBytes scratch_bytes(Shape s, int head_dim);

/// The CUDA shape for Scalar at head_dim: the first of kCudaTiles whose
/// scratch_bytes().max() <= budget (bytes), else the last (its kernels then
/// run in level-1 scratch, see scratch_level()). On CUDA, tiles_for() passes
/// min(kCudaScratchBudget, the space's scratch_size_max(0)). Host function;
/// callable in every build, so the host tests check the choice.
template <class Scalar>
Shape cuda_tiles(int head_dim, std::size_t budget = kCudaScratchBudget);

/// The shape the kernels take on ExecSpace: cuda_tiles on CUDA, kHostTiles
/// elsewhere.
template <class Scalar>
Shape tiles_for(int head_dim);

/// forward / backward (backend.hpp) with the tile shape given: kHostTiles
/// (host builds only) or one of kCudaTiles (CUDA builds, and host builds with
/// WLB4D_ATTENTION_CUDA_TILES_ON_HOST: the attention tests). Test hook: the
/// library calls the backend functions, which pass tiles_for(D).
/// \throws std::invalid_argument for a shape this build does not compile.
template <class Scalar>
void forward(Shape s, View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,
             View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,
             View3<Scalar> out, View2<Scalar> lse, const Dims& dm);
template <class Scalar>
void backward(Shape s, View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,
              View3<const Scalar> out, View3<const Scalar> dout, View2<const Scalar> lse,
              View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,
              View3<Scalar> dq, View3<Scalar> dk, View3<Scalar> dv, const Dims& dm);

}  // namespace wlb::model::attn_impl::tiled

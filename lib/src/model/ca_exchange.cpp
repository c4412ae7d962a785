// Core-attention disaggregation, execution side. See ca_exchange.hpp.
#include "wlb4d/model/ca_exchange.hpp"

#include "wlb4d/core/clock.hpp"
#include "wlb4d/model/attention.hpp"

#include <Kokkos_Core.hpp>

#include <climits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace wlb::model {

namespace {
using Range = std::pair<std::int64_t, std::int64_t>;
using UView3 = Kokkos::View<float***, Layout, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using UView2 = Kokkos::View<float**, Layout, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
constexpr bool kHostReaches = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;

int to_count(std::int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX)
    throw std::invalid_argument(std::string("CoreAttentionExchange: ") + what + " of " + std::to_string(n) +
                                " floats does not fit one MPI count");
  return static_cast<int>(n);
}

std::vector<int> displs_of(const std::vector<int>& c) {
  std::vector<int> d(c.size(), 0);
  std::int64_t o = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    d[i] = to_count(o, "a displacement");
    o += c[i];
  }
  return d;
}

std::int64_t total(const std::vector<int>& c) {
  std::int64_t t = 0;
  for (int x : c) t += x;
  return t;
}

template <class V> void grow(V& b, std::int64_t n, const char* label) {
  if (std::int64_t(b.extent(0)) < n) b = V(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
}

/// rows [r0, r0+n) of a [N][H][D] View as a flat piece of `dst` at float offset `off`.
void copy_rows_out(const View3<float>& src, std::int64_t r0, std::int64_t n, float* dst) {
  if (n <= 0) return;
  const UView3 d(dst, n, src.extent(1), src.extent(2));
  Kokkos::deep_copy(d, Kokkos::subview(src, Range(r0, r0 + n), Kokkos::ALL, Kokkos::ALL));
}
void copy_rows_in(const float* src, const View3<float>& dst, std::int64_t r0, std::int64_t n) {
  if (n <= 0) return;
  const UView3 s(const_cast<float*>(src), n, dst.extent(1), dst.extent(2));
  Kokkos::deep_copy(Kokkos::subview(dst, Range(r0, r0 + n), Kokkos::ALL, Kokkos::ALL), s);
}
/// lse columns [c0, c0+n) <-> columns [col, col+n) of a [H][width] section at `sec`.
void copy_lse(const View2<float>& lse, std::int64_t c0, std::int64_t n, float* sec, std::int64_t width,
              std::int64_t col, bool to_section) {
  if (n <= 0) return;
  const UView2 s(sec, lse.extent(0), width);
  auto a = Kokkos::subview(lse, Kokkos::ALL, Range(c0, c0 + n));
  auto b = Kokkos::subview(s, Kokkos::ALL, Range(col, col + n));
  if (to_section)
    Kokkos::deep_copy(b, a);
  else
    Kokkos::deep_copy(a, b);
}
/// dst rows [r0, r0+n) += the flat rows at src (width floats a row).
void add_rows(const View3<float>& dst, std::int64_t r0, std::int64_t n, const float* src) {
  if (n <= 0) return;
  const std::int64_t w = std::int64_t(dst.extent(1) * dst.extent(2));
  float* d = dst.data() + r0 * w;
  Kokkos::parallel_for(
      "wlb::model::ca_add_rows", Kokkos::RangePolicy<ExecSpace>(0, n * w),
      KOKKOS_LAMBDA(const std::int64_t i) { d[i] += src[i]; });
}
/// Rows [a, b) of a [N][H][D] View (contiguous: LayoutRight).
View3<float> rows_of(const View3<float>& x, std::int64_t a, std::int64_t b) {
  const std::int64_t w = std::int64_t(x.extent(1) * x.extent(2));
  return View3<float>(x.data() + a * w, b - a, x.extent(1), x.extent(2));
}
/// Columns [a, b) of lse [H][T] <-> a contiguous [H][b-a] View at `tmp`.
View2<float> lse_cols(const View2<float>& lse, std::int64_t a, std::int64_t b, float* tmp, bool from_lse) {
  const View2<float> t(tmp, lse.extent(0), b - a);
  if (b > a) {
    auto c = Kokkos::subview(lse, Kokkos::ALL, Range(a, b));
    if (from_lse)
      Kokkos::deep_copy(t, c);
    else
      Kokkos::deep_copy(c, t);
  }
  return t;
}
}  // namespace

struct CaLayout {
  struct Rows {  // rows [begin, begin + rows) of a [N][H][D] tensor
    std::int64_t begin = 0, rows = 0;
  };
  int ranks = 0;
  std::int64_t tokens = 0;
  bool any = false;                             // the slot has moves (every rank joins the exchanges)
  std::vector<std::vector<Rows>> out_moves;      // [dest]: this rank's exported blocks, in move order
  std::vector<std::vector<Rows>> out_blocks;   // [dest]: K/V row ranges sent there
  std::vector<std::int64_t> out_q, out_k;       // [dest]: query rows / key rows sent
  std::vector<std::int64_t> in_q, in_k;         // [source]: query rows / key rows received
  std::vector<std::int64_t> in_off;             // [source]: first entry in in_lo/in_hi
  IntVec in_lo, in_hi;                          // imported queries' key ranges (indices into the source's K section)
  IntVec exported;                              // [T]: 1 for a row computed elsewhere
  std::int64_t rows_out = 0, rows_in = 0;
  std::int64_t split = 0;                       // ping-pong: local rows [0, split) hide the send, the rest the return
};

namespace {
/// Floats per peer: nq[p]·per_q + nk[p]·per_k (MPI counts).
std::vector<int> floats_per_peer(const std::vector<std::int64_t>& nq, const std::vector<std::int64_t>& nk,
                                 std::int64_t per_q, std::int64_t per_k, const char* what) {
  std::vector<int> c(nq.size());
  for (std::size_t p = 0; p < nq.size(); ++p) c[p] = to_count(nq[p] * per_q + nk[p] * per_k, what);
  return c;
}
/// K/V blocks per (home, dest): (span, keys) in first appearance order of
/// the span, the longest key range of its moves, and each block's first key row.
struct KvBlocks {
  std::map<std::pair<int, int>, std::vector<std::pair<std::int32_t, std::int64_t>>> blocks;
  std::map<std::pair<int, int>, std::vector<std::int64_t>> key_begin;
};
KvBlocks kv_blocks(const std::vector<CaMove>& moves, int R) {
  KvBlocks k;
  for (const CaMove& m : moves) {
    if (m.home < 0 || m.home >= R || m.dest < 0 || m.dest >= R || m.home == m.dest || m.rows < 1 || m.prefix < 0)
      throw std::invalid_argument("CoreAttentionExchange::prepare: move home " + std::to_string(m.home) + " dest " +
                                  std::to_string(m.dest) + " rows " + std::to_string(m.rows) +
                                  " is not a move inside a group of " + std::to_string(R) + " ranks");
    auto& bl = k.blocks[{m.home, m.dest}];
    auto& kb = k.key_begin[{m.home, m.dest}];
    std::size_t b = 0;
    while (b < bl.size() && bl[b].first != m.span) ++b;
    if (b == bl.size()) {
      bl.push_back({m.span, 0});
      kb.push_back(m.key_begin);
    }
    bl[b].second = std::max(bl[b].second, m.key_rows());
  }
  return k;
}

/// Ping-pong (DistCA §3): the first half of the rows staying home runs while
/// the blocks go out, the second while the results come back; returns the
/// end of the first half (exported: 1 for a row computed elsewhere).
std::int64_t ping_pong_split(const std::vector<std::int32_t>& exported, std::int64_t tokens) {
  std::int64_t home_rows = 0;
  for (auto e : exported) home_rows += e == 0;
  for (std::int64_t i = 0, seen = 0; i < tokens; ++i) {
    seen += exported[std::size_t(i)] == 0;
    if (2 * seen >= home_rows) return std::max<std::int64_t>(1, i + 1);
  }
  return tokens;
}

/// Packs x's rows of each range (in order) at dst; returns the floats written.
std::int64_t pack_rows(const std::vector<CaLayout::Rows>& ranges, const View3<float>& x, float* dst) {
  const std::int64_t w = std::int64_t(x.extent(1) * x.extent(2));
  std::int64_t o = 0;
  for (const auto& r : ranges) {
    copy_rows_out(x, r.begin, r.rows, dst + o);
    o += r.rows * w;
  }
  return o;
}
/// Calls f(in, ret, nq, nk, kv_lo, kv_hi) for every source rank with imported
/// blocks: its section of the receive buffer, of the return buffer, its query
/// and key rows and its imported queries' key ranges.
template <class F>
void for_each_import(const CaLayout& L, const std::vector<int>& rc, const std::vector<int>& rsc, float* recv,
                     float* ret_send, F&& f) {
  std::int64_t roff = 0, soff = 0;
  for (int p = 0; p < L.ranks; ++p) {
    const std::int64_t nq = L.in_q[std::size_t(p)], nk = L.in_k[std::size_t(p)];
    if (nq > 0) {
      const std::int64_t i0 = L.in_off[std::size_t(p)];
      f(recv + roff, ret_send + soff, nq, nk, View1<const std::int32_t>(L.in_lo.data() + i0, nq),
        View1<const std::int32_t>(L.in_hi.data() + i0, nq));
    }
    roff += rc[std::size_t(p)];
    soff += rsc[std::size_t(p)];
  }
}
/// lo/hi = kv_lo/kv_hi with the exported rows emptied (lo > hi), T rows.
void mask_exported(IntVec& lo, IntVec& hi, const View1<const std::int32_t>& kv_lo,
                   const View1<const std::int32_t>& kv_hi, const IntVec& exported, std::int64_t T) {
  grow(lo, T, "ca_kv_lo");
  grow(hi, T, "ca_kv_hi");
  const IntVec l = lo, h = hi, ex = exported;
  const View1<const std::int32_t> a = kv_lo, b = kv_hi;
  Kokkos::parallel_for(
      "wlb::model::ca_mask", Kokkos::RangePolicy<ExecSpace>(0, T), KOKKOS_LAMBDA(const std::int64_t i) {
        l(i) = ex(i) ? 1 : a(i);
        h(i) = ex(i) ? 0 : b(i);
      });
}
}  // namespace

struct CoreAttentionExchange::Buffers {
  View1<float> send, recv, ret_send, ret_recv;
  View1<float> lse_tmp, dk_tmp, dv_tmp;  // ping-pong halves: contiguous lse, the second half's dK/dV
  HostView1<float> h_send, h_recv;
  IntVec lo, hi;  // kv_lo / kv_hi with the exported rows emptied
  comm::Request req;
  View1<float> pending_recv;  // staged exchange: where the received floats go
  std::int64_t pending_n = 0;
  bool staged = false;
};

CoreAttentionExchange::CoreAttentionExchange(comm::Communicator group, std::int64_t hq, std::int64_t hkv,
                                             std::int64_t hd)
    : group_(std::move(group)), hq_(hq), hkv_(hkv), hd_(hd), buf_(std::make_unique<Buffers>()) {}

CoreAttentionExchange::~CoreAttentionExchange() = default;

std::shared_ptr<CaLayout> CoreAttentionExchange::make_layout() { return std::make_shared<CaLayout>(); }

bool CoreAttentionExchange::bound_moves() const { return bound_ && bound_->any; }

const CaLayout* CoreAttentionExchange::moving_layout(std::int64_t T, const char* fn) const {
  const CaLayout* L = bound_.get();
  if (!L || !L->any) return nullptr;
  if (T != L->tokens)
    throw std::logic_error(std::string("CoreAttentionExchange::") + fn + ": " + std::to_string(T) +
                           " query rows, the bound layout has " + std::to_string(L->tokens));
  return L;
}

void CoreAttentionExchange::prepare(const std::vector<CaMove>& moves, std::int64_t tokens, CaLayout& into) const {
  const int R = group_.size(), me = group_.rank();
  CaLayout* L = &into;
  L->rows_out = L->rows_in = 0;
  for (auto& v : L->out_moves) v.clear();
  for (auto& v : L->out_blocks) v.clear();
  L->ranks = R;
  L->tokens = tokens;
  L->any = !moves.empty();
  L->out_moves.resize(std::size_t(R));
  L->out_blocks.resize(std::size_t(R));
  L->out_q.assign(std::size_t(R), 0);
  L->out_k.assign(std::size_t(R), 0);
  L->in_q.assign(std::size_t(R), 0);
  L->in_k.assign(std::size_t(R), 0);
  L->in_off.assign(std::size_t(R) + 1, 0);
  const KvBlocks kvb = kv_blocks(moves, R);
  const auto& blocks = kvb.blocks;
  std::vector<std::int32_t> lo, hi;
  std::vector<std::int32_t> exported(std::size_t(tokens), 0);
  for (int p = 0; p < R; ++p) {
    // Exports to p.
    if (p != me) {
      const auto it = blocks.find({me, p});
      if (it != blocks.end()) {
        const auto& kb = kvb.key_begin.at({me, p});
        for (std::size_t b = 0; b < it->second.size(); ++b) {
          L->out_blocks[std::size_t(p)].push_back({kb[b], it->second[b].second});
          L->out_k[std::size_t(p)] += it->second[b].second;
        }
      }
      for (const CaMove& m : moves) {
        if (m.home != me || m.dest != p) continue;
        if (m.q_row < 0 || m.q_row + m.rows > tokens)
          throw std::invalid_argument("CoreAttentionExchange::prepare: exported rows [" + std::to_string(m.q_row) +
                                      ", " + std::to_string(m.q_row + m.rows) + ") outside this rank's " +
                                      std::to_string(tokens) + " rows");
        L->out_moves[std::size_t(p)].push_back({m.q_row, m.rows});
        L->out_q[std::size_t(p)] += m.rows;
        for (std::int64_t r = 0; r < m.rows; ++r) exported[std::size_t(m.q_row + r)] = 1;
      }
      L->rows_out += L->out_q[std::size_t(p)];
    }
    // Imports from p: key ranges into p's K section (its blocks for me, concatenated).
    L->in_off[std::size_t(p)] = std::int64_t(lo.size());
    if (p != me) {
      const auto it = blocks.find({p, me});
      std::vector<std::int64_t> block_off;
      if (it != blocks.end()) {
        for (const auto& b : it->second) {
          block_off.push_back(L->in_k[std::size_t(p)]);
          L->in_k[std::size_t(p)] += b.second;
        }
      }
      for (const CaMove& m : moves) {
        if (m.home != p || m.dest != me) continue;
        std::size_t b = 0;
        while (it->second[b].first != m.span) ++b;
        for (std::int64_t r = 0; r < m.rows; ++r) {
          lo.push_back(std::int32_t(block_off[b]));
          hi.push_back(std::int32_t(block_off[b] + m.prefix + r));
        }
        L->in_q[std::size_t(p)] += m.rows;
      }
      L->rows_in += L->in_q[std::size_t(p)];
    }
  }
  L->in_off[std::size_t(R)] = std::int64_t(lo.size());
  L->split = ping_pong_split(exported, tokens);
  upload_ints(L->in_lo, lo, "ca_in_lo");
  upload_ints(L->in_hi, hi, "ca_in_hi");
  upload_ints(L->exported, exported, "ca_exported");
}

void CoreAttentionExchange::exchange(const std::vector<int>& send_counts, const std::vector<int>& recv_counts,
                                     bool forward_dir) {
  auto& B = *buf_;
  const View1<float>& send = forward_dir ? B.send : B.ret_send;
  const View1<float>& recv = forward_dir ? B.recv : B.ret_recv;
  const auto sd = displs_of(send_counts), rd = displs_of(recv_counts);
  const std::int64_t ns = total(send_counts), nr = total(recv_counts);
  stats_.bytes_sent += 4.0 * double(ns);
  stats_.bytes_received += 4.0 * double(nr);
  Kokkos::fence();  // the packed send buffer is complete before MPI reads it
  if (group_.has_device()) {
    // A device backend (NCCL) moves the buffers device to device; it is
    // blocking, so the trip is not hidden behind the local rows: its whole
    // time is exposed.
    B.staged = false;
    const double t0 = core::wall_seconds();
    B.req = group_.ialltoallv_device(send.data(), send_counts, sd, recv.data(), recv_counts, rd);
    stats_.exposed_s += core::wall_seconds() - t0;
    return;
  }
  B.staged = !kHostReaches;
  if (!B.staged) {
    B.req = group_.ialltoallv(send.data(), send_counts, sd, recv.data(), recv_counts, rd);
    return;
  }
  grow(B.h_send, ns, "ca_host_send");
  grow(B.h_recv, nr, "ca_host_recv");
  Kokkos::deep_copy(Kokkos::subview(B.h_send, Range(0, ns)), Kokkos::subview(send, Range(0, ns)));
  B.req = group_.ialltoallv(B.h_send.data(), send_counts, sd, B.h_recv.data(), recv_counts, rd);
  B.pending_recv = recv;
  B.pending_n = nr;
}

namespace {
/// Waits for the posted exchange and, when staged, copies the received floats to the device.
void finish(comm::Request& req, bool staged, const HostView1<float>& h, const View1<float>& d, std::int64_t n,
            double& exposed) {
  const double t0 = core::wall_seconds();
  req.wait();
  if (staged && n > 0) Kokkos::deep_copy(Kokkos::subview(d, Range(0, n)), Kokkos::subview(h, Range(0, n)));
  exposed += core::wall_seconds() - t0;
}
}  // namespace

std::pair<std::vector<int>, std::vector<int>> CoreAttentionExchange::size_exchange(const CaLayout& L,
                                                                                   bool forward_dir,
                                                                                   std::int64_t per_q,
                                                                                   std::int64_t per_k) {
  auto& B = *buf_;
  // Out: this rank's moved rows go out, the imported ones come in; the return trip reverses both.
  auto sc = forward_dir ? floats_per_peer(L.out_q, L.out_k, per_q, per_k, "a send")
                        : floats_per_peer(L.in_q, L.in_k, per_q, per_k, "a return send");
  auto rc = forward_dir ? floats_per_peer(L.in_q, L.in_k, per_q, per_k, "a receive")
                        : floats_per_peer(L.out_q, L.out_k, per_q, per_k, "a return receive");
  grow(forward_dir ? B.send : B.ret_send, total(sc), forward_dir ? "ca_send" : "ca_ret_send");
  grow(forward_dir ? B.recv : B.ret_recv, total(rc), forward_dir ? "ca_recv" : "ca_ret_recv");
  return {std::move(sc), std::move(rc)};
}

namespace {
/// Forward step 4: O rows and LSE columns of this rank's exported rows from
/// the return buffer ret (rrc: floats per source, [O][LSE] sections).
void unpack_forward_results(const CaLayout& L, const std::vector<int>& rrc, float* ret_recv, const View3<float>& out,
                            const View2<float>& lse) {
  const std::int64_t wq = std::int64_t(out.extent(1) * out.extent(2));
  std::int64_t off = 0;
  for (int p = 0; p < L.ranks; ++p) {
    const std::int64_t nq = L.out_q[std::size_t(p)];
    float* ret = ret_recv + off;
    std::int64_t col = 0;
    for (const auto& m : L.out_moves[std::size_t(p)]) {
      copy_rows_in(ret + col * wq, out, m.begin, m.rows);
      copy_lse(lse, m.begin, m.rows, ret + nq * wq, nq, col, false);
      col += m.rows;
    }
    off += rrc[std::size_t(p)];
  }
}

/// Backward step 4: dQ rows written, dK/dV of the sent key rows added
/// (destination order), from the return buffer ([dQ][dK][dV] sections).
void unpack_backward_results(const CaLayout& L, const std::vector<int>& rrc, const float* ret_recv,
                             const View3<float>& dq, const View3<float>& dk, const View3<float>& dv) {
  const std::int64_t wq = std::int64_t(dq.extent(1) * dq.extent(2)), wk = std::int64_t(dk.extent(1) * dk.extent(2));
  std::int64_t off = 0;
  for (int p = 0; p < L.ranks; ++p) {
    const std::int64_t nq = L.out_q[std::size_t(p)], nk = L.out_k[std::size_t(p)];
    const float* ret = ret_recv + off;
    std::int64_t o = 0;
    for (const auto& m : L.out_moves[std::size_t(p)]) {
      copy_rows_in(ret + o, dq, m.begin, m.rows);
      o += m.rows * wq;
    }
    o = nq * wq;
    for (const auto& b : L.out_blocks[std::size_t(p)]) {
      add_rows(dk, b.begin, b.rows, ret + o);
      add_rows(dv, b.begin, b.rows, ret + o + nk * wk);
      o += b.rows * wk;
    }
    off += rrc[std::size_t(p)];
  }
}
}  // namespace

void CoreAttentionExchange::forward(int layer, int slot, const View3<float>& q, const View3<float>& k,
                                    const View3<float>& v, const View1<const std::int32_t>& kv_lo,
                                    const View1<const std::int32_t>& kv_hi, float scale, const View3<float>& out,
                                    const View2<float>& lse) {
  const CaLayout* L = moving_layout(std::int64_t(q.extent(0)), "forward");
  if (!L) {
    CoreAttention<float>::forward(layer, slot, q, k, v, kv_lo, kv_hi, scale, out, lse);
    return;
  }
  const std::int64_t T = L->tokens;  // = q.extent(0) (moving_layout checks it)
  auto& B = *buf_;
  const int R = L->ranks;
  const std::int64_t wq = hq_ * hd_, wk = hkv_ * hd_;
  // 1. Pack Q rows and K/V blocks per destination: [Q][K][V].
  const auto [sc, rc] = size_exchange(*L, true, wq, 2 * wk);
  for (std::int64_t p = 0, off = 0; p < R; off += sc[std::size_t(p)], ++p) {
    float* base = B.send.data() + off;
    base += pack_rows(L->out_moves[std::size_t(p)], q, base);
    base += pack_rows(L->out_blocks[std::size_t(p)], k, base);
    pack_rows(L->out_blocks[std::size_t(p)], v, base);
  }
  exchange(sc, rc, true);
  // 2. The local rows, exported rows masked empty, while the exchange is in flight.
  mask_exported(B.lo, B.hi, kv_lo, kv_hi, L->exported, T);
  // Ping-pong: local rows [0, h) now, [h, T) while the results come back;
  // each half's lse into a contiguous buffer, copied into lse after.
  const std::int64_t h = L->split;
  grow(B.lse_tmp, hq_ * T, "ca_lse_tmp");
  const View2<float> lse_a(B.lse_tmp.data(), hq_, h), lse_b(B.lse_tmp.data() + hq_ * h, hq_, T - h);
  attention_forward<float>(rows_of(q, 0, h), k, v, View1<const std::int32_t>(B.lo.data(), h),
                           View1<const std::int32_t>(B.hi.data(), h), scale, rows_of(out, 0, h), lse_a);
  finish(B.req, B.staged, B.h_recv, B.recv, B.pending_n, stats_.exposed_s);
  // 3. Imported blocks, one call per source, O and LSE written into the return buffer: [O][LSE].
  const auto [rsc, rrc] = size_exchange(*L, false, wq + hq_, 0);
  for_each_import(*L, rc, rsc, B.recv.data(), B.ret_send.data(),
                  [&](float* in, float* ret, std::int64_t nq, std::int64_t nk, const View1<const std::int32_t>& lo,
                      const View1<const std::int32_t>& hi) {
                    const View3<float> Qp(in, nq, hq_, hd_);
                    const View3<float> Kp(in + nq * wq, nk, hkv_, hd_), Vp(in + nq * wq + nk * wk, nk, hkv_, hd_);
                    const View3<float> Op(ret, nq, hq_, hd_);
                    const View2<float> Lp(ret + nq * wq, hq_, nq);
                    attention_forward<float>(Qp, Kp, Vp, lo, hi, scale, Op, Lp);
                  });
  stats_.rows_imported += L->rows_in;
  stats_.rows_exported += L->rows_out;
  exchange(rsc, rrc, false);
  if (T > h)
    attention_forward<float>(rows_of(q, h, T), k, v, View1<const std::int32_t>(B.lo.data() + h, T - h),
                             View1<const std::int32_t>(B.hi.data() + h, T - h), scale, rows_of(out, h, T), lse_b);
  lse_cols(lse, 0, h, lse_a.data(), false);
  lse_cols(lse, h, T, lse_b.data(), false);
  finish(B.req, B.staged, B.h_recv, B.ret_recv, B.pending_n, stats_.exposed_s);
  // 4. This rank's exported rows: O and LSE from their computing ranks.
  unpack_forward_results(*L, rrc, B.ret_recv.data(), out, lse);
}

void CoreAttentionExchange::backward(int layer, int slot, const View3<float>& q, const View3<float>& k,
                                     const View3<float>& v, const View3<float>& out, const View3<float>& dout,
                                     const View2<float>& lse, const View1<const std::int32_t>& kv_lo,
                                     const View1<const std::int32_t>& kv_hi, float scale, const View3<float>& dq,
                                     const View3<float>& dk, const View3<float>& dv) {
  const CaLayout* L = moving_layout(std::int64_t(q.extent(0)), "backward");
  if (!L) {
    CoreAttention<float>::backward(layer, slot, q, k, v, out, dout, lse, kv_lo, kv_hi, scale, dq, dk, dv);
    return;
  }
  const std::int64_t T = L->tokens;  // = q.extent(0) (moving_layout checks it)
  auto& B = *buf_;
  const int R = L->ranks;
  const std::int64_t wq = hq_ * hd_, wk = hkv_ * hd_;
  // 1. Pack per destination: [Q][K][V][O][dO][LSE].
  const auto [sc, rc] = size_exchange(*L, true, 3 * wq + hq_, 2 * wk);
  for (std::int64_t p = 0, off = 0; p < R; off += sc[std::size_t(p)], ++p) {
    const auto& mv = L->out_moves[std::size_t(p)];
    float* base = B.send.data() + off;
    base += pack_rows(mv, q, base);
    base += pack_rows(L->out_blocks[std::size_t(p)], k, base);
    base += pack_rows(L->out_blocks[std::size_t(p)], v, base);
    base += pack_rows(mv, out, base);
    base += pack_rows(mv, dout, base);
    std::int64_t col = 0;
    for (const auto& m : mv) {
      copy_lse(lse, m.begin, m.rows, base, L->out_q[std::size_t(p)], col, true);
      col += m.rows;
    }
  }
  exchange(sc, rc, true);
  // 2. Local rows (exported ones masked: dq = 0 there, no dk/dv contribution).
  mask_exported(B.lo, B.hi, kv_lo, kv_hi, L->exported, T);
  // Ping-pong as in forward: rows [0, h) write dk/dv, rows [h, T) (while the
  // results come back) into buffers added after.
  const std::int64_t h = L->split, S = std::int64_t(k.extent(0));
  grow(B.lse_tmp, hq_ * T, "ca_lse_tmp");
  const View2<float> lse_a = lse_cols(lse, 0, h, B.lse_tmp.data(), true);
  const View2<float> lse_b = lse_cols(lse, h, T, B.lse_tmp.data() + hq_ * h, true);
  attention_backward<float>(rows_of(q, 0, h), k, v, rows_of(out, 0, h), rows_of(dout, 0, h), lse_a,
                            View1<const std::int32_t>(B.lo.data(), h), View1<const std::int32_t>(B.hi.data(), h),
                            scale, rows_of(dq, 0, h), dk, dv);
  finish(B.req, B.staged, B.h_recv, B.recv, B.pending_n, stats_.exposed_s);
  // 3. Imported blocks: dQ, dK, dV into the return buffer: [dQ][dK][dV].
  const auto [rsc, rrc] = size_exchange(*L, false, wq, 2 * wk);
  for_each_import(*L, rc, rsc, B.recv.data(), B.ret_send.data(),
                  [&](float* in, float* ret, std::int64_t nq, std::int64_t nk, const View1<const std::int32_t>& lo,
                      const View1<const std::int32_t>& hi) {
                    const View3<float> Qp(in, nq, hq_, hd_);
                    const View3<float> Kp(in + nq * wq, nk, hkv_, hd_), Vp(in + nq * wq + nk * wk, nk, hkv_, hd_);
                    const View3<float> Op(in + nq * wq + 2 * nk * wk, nq, hq_, hd_);
                    const View3<float> dOp(in + 2 * nq * wq + 2 * nk * wk, nq, hq_, hd_);
                    const View2<float> Lp(in + 3 * nq * wq + 2 * nk * wk, hq_, nq);
                    const View3<float> dQp(ret, nq, hq_, hd_);
                    const View3<float> dKp(ret + nq * wq, nk, hkv_, hd_), dVp(ret + nq * wq + nk * wk, nk, hkv_, hd_);
                    attention_backward<float>(Qp, Kp, Vp, Op, dOp, Lp, lo, hi, scale, dQp, dKp, dVp);
                  });
  stats_.rows_imported += L->rows_in;
  stats_.rows_exported += L->rows_out;
  exchange(rsc, rrc, false);
  if (T > h) {
    grow(B.dk_tmp, S * wk, "ca_dk_tmp");
    grow(B.dv_tmp, S * wk, "ca_dv_tmp");
    const View3<float> dk_b(B.dk_tmp.data(), S, hkv_, hd_), dv_b(B.dv_tmp.data(), S, hkv_, hd_);
    attention_backward<float>(rows_of(q, h, T), k, v, rows_of(out, h, T), rows_of(dout, h, T), lse_b,
                              View1<const std::int32_t>(B.lo.data() + h, T - h),
                              View1<const std::int32_t>(B.hi.data() + h, T - h), scale, rows_of(dq, h, T), dk_b,
                              dv_b);
    add_rows(dk, 0, S, dk_b.data());
    add_rows(dv, 0, S, dv_b.data());
  }
  finish(B.req, B.staged, B.h_recv, B.ret_recv, B.pending_n, stats_.exposed_s);
  // 4. dQ rows written; dK/dV of the sent key rows added (destination order).
  unpack_backward_results(*L, rrc, B.ret_recv.data(), dq, dk, dv);
}

}  // namespace wlb::model

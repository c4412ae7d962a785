// Packers fixed / greedy / wlb (docs/wlb-llm.md §1.5, §2.3, §2.4).
#include "wlb4d/balance/packer.hpp"

#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/core/error.hpp"

#include <algorithm>
#include <deque>
#include <limits>
#include <numeric>
#include <queue>
#include <sstream>

namespace wlb::balance {

Packer::~Packer() = default;

namespace {

using core::ConfigError;

constexpr std::int64_t kMagic = 0x574C4234;  // "WLB4"
constexpr std::int64_t kVersion = 1;

std::int64_t kind_code(const std::string& k) { return k == "fixed" ? 1 : (k == "greedy" ? 2 : 3); }

// A piece of a document with the step it arrived in.
struct Item {
  std::int64_t doc_id = 0, offset = 0, length = 0, arrival = 0;
  Span span() const { return Span{doc_id, offset, length}; }
};

// Micro-batches under construction.
struct Bins {
  std::vector<std::vector<Item>> items;
  std::vector<std::int64_t> len;
  std::vector<double> cost;
  const CostModel* model;
  Bins(std::size_t n, const CostModel& m) : items(n), len(n, 0), cost(n, m.c), model(&m) {}
  void put(std::size_t j, const Item& it) {
    items[j].push_back(it);
    len[j] += it.length;
    cost[j] += model->span_cost(it.length);
  }
  std::size_t argmin_cost() const {
    return static_cast<std::size_t>(std::min_element(cost.begin(), cost.end()) - cost.begin());
  }
  std::size_t argmin_len() const {
    return static_cast<std::size_t>(std::min_element(len.begin(), len.end()) - len.begin());
  }
};

void put_items(std::vector<std::int64_t>& out, const Item& it) {
  out.insert(out.end(), {it.doc_id, it.offset, it.length, it.arrival});
}

// Reads a state vector.
struct Reader {
  const std::vector<std::int64_t>& v;
  std::size_t pos = 0;
  std::int64_t get() {
    if (pos >= v.size()) throw core::CheckpointError("packer state is truncated");
    return v[pos++];
  }
  std::size_t count() {
    const auto n = get();
    if (n < 0 || static_cast<std::size_t>(n) > v.size()) throw core::CheckpointError("packer state is corrupt");
    return static_cast<std::size_t>(n);
  }
  Item item() {
    Item it{get(), get(), get(), get()};
    if (it.length < 1 || it.offset < 0) throw core::CheckpointError("packer state holds an invalid span");
    return it;
  }
};

class PackerBase : public Packer {
 public:
  PackerBase(PackerParams p, const CostModel& cost) : p_(std::move(p)), cost_(cost) {
    p_.validate();
    if (p_.sharding != "adaptive") fixed_sharding_ = parse_sharding(p_.sharding);
  }
  const PackerParams& params() const override { return p_; }
  std::vector<Span> pending() const override {
    std::vector<Span> out;
    for (const auto& it : carry_) out.push_back(it.span());
    add_pending(out);
    return out;
  }

  std::vector<std::int64_t> save_state() const override {
    std::vector<std::int64_t> s{kMagic, kVersion, kind_code(p_.kind)};
    s.push_back(static_cast<std::int64_t>(carry_.size()));
    for (const auto& it : carry_) put_items(s, it);
    save_extra(s);
    return s;
  }
  void load_state(const std::vector<std::int64_t>& state) override {
    Reader r{state};
    if (r.get() != kMagic || r.get() != kVersion)
      throw core::CheckpointError("packer state: not a wlb4d packer state (bad magic or version)");
    if (r.get() != kind_code(p_.kind))
      throw core::CheckpointError("packer state was written by another balance.packer than '" + p_.kind + "'");
    std::deque<Item> carry;
    for (std::size_t i = 0, n = r.count(); i < n; ++i) carry.push_back(r.item());
    load_extra(r);
    if (r.pos != state.size()) throw core::CheckpointError("packer state has trailing data");
    carry_ = std::move(carry);
  }

 protected:
  virtual void add_pending(std::vector<Span>&) const {}
  virtual void save_extra(std::vector<std::int64_t>&) const {}
  virtual void load_extra(Reader&) {}

  // Exactly B tokens in stream order; the carry (tail of a cut document) first.
  std::vector<Item> draw_budget(std::int64_t step, DocSource& src) {
    std::vector<Item> out;
    std::int64_t need = p_.step_budget();
    while (need > 0) {
      if (carry_.empty()) {
        const Doc d = src.next();
        if (d.length < 1)
          throw core::DataError("document " + std::to_string(d.doc_id) + " has length " +
                                std::to_string(d.length) + " (must be >= 1 token)");
        carry_.push_back(Item{d.doc_id, 0, d.length, step});
      }
      Item& c = carry_.front();
      const std::int64_t take = std::min(c.length, need);
      out.push_back(Item{c.doc_id, c.offset, take, step});
      need -= take;
      if (take == c.length) {
        carry_.pop_front();
      } else {
        c.offset += take;
        c.length -= take;
      }
    }
    return out;
  }

  // Builds the StepPlan from micro-batches and the replica assignment.
  StepPlan finish(std::int64_t step, const std::vector<std::vector<Item>>& mbs,
                  const std::vector<std::vector<std::size_t>>& replicas) const {
    StepPlan plan;
    plan.step = step;
    plan.micro_batches.resize(replicas.size());
    plan.sharding.resize(replicas.size());
    for (std::size_t r = 0; r < replicas.size(); ++r) {
      for (std::size_t j : replicas[r]) {
        MicroBatch mb;
        for (const auto& it : mbs[j]) {
          mb.spans.push_back(it.span());
          const std::int64_t wait = step - it.arrival;
          plan.delay_token_steps += wait * it.length;
          plan.max_delay_steps = std::max(plan.max_delay_steps, wait);
          if (wait > 0) ++plan.delayed_spans;
        }
        plan.tokens += mb.tokens();
        plan.target_tokens += mb.target_tokens();
        plan.sharding[r].push_back(p_.sharding == "adaptive" ? choose_sharding(mb, p_.cp, cost_) : fixed_sharding_);
        plan.micro_batches[r].push_back(std::move(mb));
      }
    }
    return plan;
  }

  std::vector<std::vector<std::size_t>> assign_by_cost(const std::vector<std::vector<Item>>& mbs) const {
    std::vector<double> costs;
    for (const auto& mb : mbs) {
      double c = cost_.c;
      for (const auto& it : mb) c += cost_.span_cost(it.length);
      costs.push_back(c);
    }
    auto replicas = assign_to_replicas(costs, p_.dp);
    for (auto& r : replicas) r = pipeline_order(r, costs);
    return replicas;
  }

  // 1F1B puts the first micro-batch's forward and the last one's backward on
  // the critical path once per stage: run the cheapest first, the second
  // cheapest last, the expensive ones in between (descending).
  static std::vector<std::size_t> pipeline_order(std::vector<std::size_t> idx, const std::vector<double>& costs) {
    if (idx.size() < 3) return idx;
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) { return costs[x] > costs[y]; });
    std::vector<std::size_t> out{idx.back()};
    out.insert(out.end(), idx.begin(), idx.end() - 2);
    out.push_back(idx[idx.size() - 2]);
    return out;
  }

  PackerParams p_;
  CostModel cost_;
  Sharding fixed_sharding_ = Sharding::Sequence;
  std::deque<Item> carry_;  // tail of the document cut at the last budget (at most one item)
};

// The fixed packing, once: pieces in stream order, cut every S tokens. With
// n > 0 there are exactly n micro-batches (the last takes any overflow; for
// the budget of n·S tokens it holds exactly S); with n = 0 as many as needed,
// the last one possibly shorter. T is Item or Span (a piece keeps its other
// fields, e.g. an Item's arrival step).
template <class T>
std::vector<std::vector<T>> cut_pieces(const std::vector<T>& items, std::size_t n, std::int64_t S) {
  std::vector<std::vector<T>> mbs;
  std::int64_t room = 0;
  for (T it : items) {
    while (it.length > 0) {
      if (room == 0) {
        if (n != 0 && mbs.size() == n)
          throw core::InternalError("fixed packing: more than " + std::to_string(n) + " x " + std::to_string(S) +
                                    " tokens");
        mbs.emplace_back();
        room = S;
      }
      T piece = it;
      piece.length = std::min(room, it.length);
      mbs.back().push_back(piece);
      it.offset += piece.length;
      it.length -= piece.length;
      room -= piece.length;
    }
  }
  if (n != 0) mbs.resize(n);
  return mbs;
}

std::vector<std::vector<Item>> cut_in_order(const std::vector<Item>& items, std::size_t n, std::int64_t S) {
  return cut_pieces(items, n, S);
}

}  // namespace

std::vector<MicroBatch> pack_in_order(const std::vector<Span>& spans, std::int64_t max_seq_len) {
  if (max_seq_len < 1) throw ConfigError("train.max_seq_len=" + std::to_string(max_seq_len) + " must be >= 1");
  std::vector<MicroBatch> out;
  for (auto& pieces : cut_pieces(spans, 0, max_seq_len)) out.push_back(MicroBatch{std::move(pieces)});
  return out;
}

namespace {

double max_cost(const std::vector<std::vector<Item>>& mbs, const CostModel& cost) {
  double mx = 0;
  for (const auto& mb : mbs) {
    double c = cost.c;
    for (const auto& it : mb) c += cost.span_cost(it.length);
    mx = std::max(mx, c);
  }
  return mx;
}

// ---------------------------------------------------------------- fixed
class FixedPacker final : public PackerBase {
 public:
  using PackerBase::PackerBase;
  StepPlan plan_step(std::int64_t step, DocSource& src) override {
    const std::size_t n = static_cast<std::size_t>(p_.micro_batches);
    const auto mbs = cut_in_order(draw_budget(step, src), n, p_.max_seq_len);
    const std::size_t per = n / static_cast<std::size_t>(p_.dp);
    std::vector<std::vector<std::size_t>> replicas(static_cast<std::size_t>(p_.dp));
    for (std::size_t i = 0; i < n; ++i) replicas[i / per].push_back(i);
    return finish(step, mbs, replicas);
  }
};

// ---------------------------------------------------------------- greedy
class GreedyPacker final : public PackerBase {
 public:
  using PackerBase::PackerBase;
  StepPlan plan_step(std::int64_t step, DocSource& src) override {
    const auto items = draw_budget(step, src);
    // Longest first; ties in stream order.
    using Entry = std::pair<Item, std::size_t>;
    auto cmp = [](const Entry& x, const Entry& y) {
      if (x.first.length != y.first.length) return x.first.length < y.first.length;
      return x.second > y.second;
    };
    std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> work(cmp);
    for (std::size_t i = 0; i < items.size(); ++i) work.push({items[i], i});
    const std::size_t n = static_cast<std::size_t>(p_.micro_batches);
    Bins bins(n, cost_);
    const std::int64_t S = p_.max_seq_len;
    while (!work.empty()) {
      auto [it, order] = work.top();
      work.pop();
      std::size_t best = n;
      for (std::size_t j = 0; j < n; ++j)
        if (bins.len[j] < S && (best == n || bins.cost[j] < bins.cost[best])) best = j;
      const std::int64_t room = S - bins.len[best];
      if (it.length <= room) {
        bins.put(best, it);
        continue;
      }
      bins.put(best, Item{it.doc_id, it.offset, room, it.arrival});
      work.push({Item{it.doc_id, it.offset + room, it.length - room, it.arrival}, order});
    }
    // Greedy keeps long documents whole, which stream-order cutting would
    // split; keep whichever arrangement has the cheaper slowest micro-batch.
    auto in_order = cut_in_order(items, n, S);
    if (max_cost(in_order, cost_) < max_cost(bins.items, cost_)) bins.items = std::move(in_order);
    return finish(step, bins.items, assign_by_cost(bins.items));
  }
};

// ---------------------------------------------------------------- wlb
class WlbPacker final : public PackerBase {
 public:
  WlbPacker(PackerParams p, const CostModel& cost) : PackerBase(std::move(p), cost) {
    queues_.resize(p_.thresholds.size());
  }

  StepPlan plan_step(std::int64_t step, DocSource& src) override {
    const std::size_t n = static_cast<std::size_t>(p_.micro_batches);
    std::vector<Item> fresh = draw_pieces(step, src);  // 1-2
    release_full_queues(fresh, n);                     // 3
    std::vector<Item> forced, remained;                // 4
    take_due(step, fresh, forced, remained);
    Bins bins(n, cost_);                               // 5
    place(bins, forced, remained, fresh);
    fill_empty(bins);                                  // 6
    return finish(step, bins.items, assign_by_cost(bins.items));  // 7: replicas
  }

 private:
  using Items = std::vector<Item>;

  /// 1-2: the step's budget cut into pieces of at most the context window;
  /// outliers to their queues, the rest returned (new documents).
  Items draw_pieces(std::int64_t step, DocSource& src) {
    // Documents are cut at the context window (max_seq_len), not at S_max: a
    // micro-batch may hold more tokens than the window so that short documents
    // can match a long one's cost (docs/wlb-llm.md §2.2), but no attention span is
    // longer than the window — as in fixed/greedy, whose costs it must beat.
    const std::int64_t window = std::min(p_.max_seq_len, p_.cap());
    Items fresh;
    for (Item it : draw_budget(step, src)) {
      while (it.length > 0) {
        Item piece{it.doc_id, it.offset, std::min(window, it.length), it.arrival};
        it.offset += piece.length;
        it.length -= piece.length;
        const int lvl = level(piece.length);
        if (lvl >= 0) {
          queues_[static_cast<std::size_t>(lvl)].push_back(piece);
        } else {
          fresh.push_back(piece);
        }
      }
    }
    return fresh;
  }

  /// 3: a queue holding >= n pieces releases its n oldest into `fresh`.
  void release_full_queues(Items& fresh, std::size_t n) {
    for (auto& q : queues_) {
      if (q.size() < n) continue;
      for (std::size_t i = 0; i < n; ++i) {
        fresh.push_back(q.front());
        q.pop_front();
      }
    }
  }

  /// 4: pieces that waited max_delay steps are forced into this step, wherever
  /// they come from (a queue, last step's leftovers, or this step's budget when
  /// max_delay = 0). `remained`: last step's leftovers not yet due. Forced and
  /// fresh come out longest first (stable).
  void take_due(std::int64_t step, Items& fresh, Items& forced, Items& remained) {
    auto is_due = [&](const Item& it) { return step - it.arrival >= p_.max_delay; };
    for (auto& q : queues_) {
      std::deque<Item> keep;
      for (const auto& it : q) {
        if (is_due(it)) {
          forced.push_back(it);
        } else {
          keep.push_back(it);
        }
      }
      q.swap(keep);
    }
    Items new_docs;
    for (const auto& it : leftover_) (is_due(it) ? forced : remained).push_back(it);
    for (const auto& it : fresh) (is_due(it) ? forced : new_docs).push_back(it);
    fresh.swap(new_docs);
    leftover_.clear();
    auto longest_first = [](Items& v) {
      std::stable_sort(v.begin(), v.end(), [](const Item& x, const Item& y) { return x.length > y.length; });
    };
    longest_first(forced);
    longest_first(fresh);
  }

  /// To the micro-batch of least Eq. 2 workload if it fits, else to the
  /// shortest if it fits; false if neither has room.
  bool try_place(Bins& bins, const Item& it) const {
    const std::int64_t smax = p_.cap();
    const std::size_t w = bins.argmin_cost();
    if (bins.len[w] + it.length <= smax) {
      bins.put(w, it);
      return true;
    }
    const std::size_t l = bins.argmin_len();
    if (bins.len[l] + it.length <= smax) {
      bins.put(l, it);
      return true;
    }
    return false;
  }

  /// 5: forced (split over the micro-batches with most room when they do not
  /// fit whole), then last step's leftovers, then new documents; what does not
  /// fit is left over to the next step.
  void place(Bins& bins, const Items& forced, const Items& remained, const Items& fresh) {
    const std::int64_t smax = p_.cap();
    for (Item it : forced) {
      if (try_place(bins, it)) continue;
      while (it.length > 0) {  // split over the micro-batches with most room
        const std::size_t l = bins.argmin_len();
        const std::int64_t room = smax - bins.len[l];
        if (room <= 0) break;  // only if the deck changed under a restored state
        const std::int64_t take = std::min(room, it.length);
        bins.put(l, Item{it.doc_id, it.offset, take, it.arrival});
        it.offset += take;
        it.length -= take;
      }
      if (it.length > 0) leftover_.push_back(it);
    }
    for (const auto& it : remained)
      if (!try_place(bins, it)) leftover_.push_back(it);
    for (const auto& it : fresh)
      if (!try_place(bins, it)) leftover_.push_back(it);
  }

  /// 6: no empty micro-batch: the oldest queued piece, else a leftover, else a
  /// split of the fullest micro-batch.
  void fill_empty(Bins& bins) {
    for (std::size_t j = 0; j < bins.len.size(); ++j) {
      if (bins.len[j] > 0) continue;
      if (pull_oldest_queued(bins, j)) continue;
      if (!leftover_.empty()) {
        bins.put(j, leftover_.front());
        leftover_.erase(leftover_.begin());
        continue;
      }
      split_into(bins, j);
    }
  }

  int level(std::int64_t d) const {
    int lvl = -1;
    for (std::size_t i = 0; i < p_.thresholds.size(); ++i)
      if (d >= p_.thresholds[i]) lvl = static_cast<int>(i);
    return lvl;
  }

  bool pull_oldest_queued(Bins& bins, std::size_t j) {
    std::deque<Item>* best = nullptr;
    for (auto& q : queues_)
      if (!q.empty() && (best == nullptr || q.front().arrival < best->front().arrival)) best = &q;
    if (best == nullptr) return false;
    bins.put(j, best->front());
    best->pop_front();
    return true;
  }

  // Moves half of the largest span of the fullest micro-batch into empty bin j.
  void split_into(Bins& bins, std::size_t j) {
    const std::size_t src = static_cast<std::size_t>(std::max_element(bins.len.begin(), bins.len.end()) -
                                                     bins.len.begin());
    if (bins.len[src] < 2) return;  // fewer tokens than micro-batches: cannot happen with B >= 2N
    auto& v = bins.items[src];
    auto big = std::max_element(v.begin(), v.end(), [](const Item& x, const Item& y) { return x.length < y.length; });
    Item moved;
    if (big->length >= 2) {
      const std::int64_t keep = big->length / 2;
      moved = Item{big->doc_id, big->offset + keep, big->length - keep, big->arrival};
      big->length = keep;
    } else {
      moved = v.back();
      v.pop_back();
    }
    // Recompute the source bin's totals.
    bins.len[src] = 0;
    bins.cost[src] = cost_.c;
    for (const auto& it : v) {
      bins.len[src] += it.length;
      bins.cost[src] += cost_.span_cost(it.length);
    }
    bins.put(j, moved);
  }

  void add_pending(std::vector<Span>& out) const override {
    for (const auto& q : queues_)
      for (const auto& it : q) out.push_back(it.span());
    for (const auto& it : leftover_) out.push_back(it.span());
  }
  void save_extra(std::vector<std::int64_t>& s) const override {
    s.push_back(static_cast<std::int64_t>(p_.thresholds.size()));
    s.insert(s.end(), p_.thresholds.begin(), p_.thresholds.end());
    for (const auto& q : queues_) {
      s.push_back(static_cast<std::int64_t>(q.size()));
      for (const auto& it : q) put_items(s, it);
    }
    s.push_back(static_cast<std::int64_t>(leftover_.size()));
    for (const auto& it : leftover_) put_items(s, it);
  }
  void load_extra(Reader& r) override {
    std::vector<std::int64_t> th(r.count());
    for (auto& x : th) x = r.get();
    std::vector<std::deque<Item>> queues(th.size());
    for (auto& q : queues)
      for (std::size_t i = 0, n = r.count(); i < n; ++i) q.push_back(r.item());
    std::vector<Item> left;
    for (std::size_t i = 0, n = r.count(); i < n; ++i) left.push_back(r.item());
    PackerParams p = p_;
    p.thresholds = th;
    try {
      p.validate();
    } catch (const ConfigError& e) {
      throw core::CheckpointError(std::string("packer state holds invalid outlier thresholds: ") + e.what());
    }
    p_ = p;
    queues_ = std::move(queues);
    leftover_ = std::move(left);
  }

  std::vector<std::deque<Item>> queues_;
  std::vector<Item> leftover_;
};

}  // namespace

// ---------------------------------------------------------------- params
PackerParams PackerParams::from_config(const core::Config& cfg) {
  PackerParams p;
  p.kind = cfg.balance.packer;
  p.micro_batches = cfg.train.micro_batches;
  p.dp = cfg.parallel.dp;
  p.cp = cfg.parallel.cp;
  p.sharding = cfg.balance.sharding;
  p.max_seq_len = cfg.train.max_seq_len;
  p.max_tokens = cfg.balance.max_tokens;
  p.max_delay = cfg.balance.max_delay;
  if (cfg.balance.outlier_thresholds != "auto") p.thresholds = parse_thresholds(cfg.balance.outlier_thresholds);
  p.validate();
  return p;
}

void PackerParams::validate() const {
  if (kind != "fixed" && kind != "greedy" && kind != "wlb")
    throw ConfigError("balance.packer='" + kind + "' must be fixed, greedy or wlb");
  if (micro_batches < 1) throw ConfigError("train.micro_batches=" + std::to_string(micro_batches) + " must be >= 1");
  if (dp < 1 || micro_batches % dp != 0)
    throw ConfigError("parallel.dp=" + std::to_string(dp) + " must divide train.micro_batches=" +
                      std::to_string(micro_batches));
  if (cp < 1) throw ConfigError("parallel.cp=" + std::to_string(cp) + " must be >= 1");
  if (max_seq_len < 1) throw ConfigError("train.max_seq_len=" + std::to_string(max_seq_len) + " must be >= 1");
  if (max_tokens != 0 && max_tokens < max_seq_len)
    throw ConfigError("balance.max_tokens=" + std::to_string(max_tokens) + " must be 0 or >= train.max_seq_len=" +
                      std::to_string(max_seq_len));
  if (max_delay < 0) throw ConfigError("balance.max_delay=" + std::to_string(max_delay) + " must be >= 0");
  if (sharding != "sequence" && sharding != "document" && sharding != "adaptive")
    throw ConfigError("balance.sharding='" + sharding + "' must be sequence, document or adaptive");
  for (std::size_t i = 0; i < thresholds.size(); ++i)
    if (thresholds[i] < 1 || (i > 0 && thresholds[i] <= thresholds[i - 1]))
      throw ConfigError("balance.outlier_thresholds must be ascending positive token counts");
}

std::vector<std::int64_t> parse_thresholds(const std::string& text) {
  if (text == "none") return {};
  if (text == "auto")
    throw ConfigError("balance.outlier_thresholds=auto must be resolved with choose_outlier_thresholds");
  std::istringstream is(text);
  std::vector<std::int64_t> out;
  std::string tok;
  while (is >> tok) {
    std::size_t pos = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos != tok.size() || v < 1 || (!out.empty() && v <= out.back()))
      throw ConfigError("balance.outlier_thresholds='" + text + "' must be auto, none or ascending positive token counts");
    out.push_back(v);
  }
  if (out.empty())
    throw ConfigError("balance.outlier_thresholds='" + text + "' must be auto, none or ascending positive token counts");
  return out;
}

std::unique_ptr<Packer> make_packer(const PackerParams& params, const CostModel& cost) {
  params.validate();
  if (params.kind == "fixed") return std::make_unique<FixedPacker>(params, cost);
  if (params.kind == "greedy") return std::make_unique<GreedyPacker>(params, cost);
  return std::make_unique<WlbPacker>(params, cost);
}

std::unique_ptr<Packer> make_packer(const core::Config& cfg, const CostModel& cost,
                                    const std::vector<std::int64_t>& length_sample) {
  PackerParams p = PackerParams::from_config(cfg);
  if (p.kind == "wlb" && cfg.balance.outlier_thresholds == "auto") {
    if (length_sample.empty())
      throw ConfigError(
          "balance.outlier_thresholds=auto needs a sample of document lengths to tune on (docs/wlb-llm.md §2.3); "
          "pass one to make_packer, or set explicit thresholds or none");
    p.thresholds = choose_outlier_thresholds(length_sample, p, cost);
  }
  return make_packer(p, cost);
}

std::vector<std::vector<std::size_t>> assign_to_replicas(const std::vector<double>& costs, int dp) {
  if (dp < 1 || costs.size() % static_cast<std::size_t>(dp) != 0)
    throw ConfigError("parallel.dp=" + std::to_string(dp) + " must divide the micro-batch count " +
                      std::to_string(costs.size()));
  const std::size_t per = costs.size() / static_cast<std::size_t>(dp);
  std::vector<std::size_t> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return costs[x] > costs[y]; });
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(dp));
  std::vector<double> load(static_cast<std::size_t>(dp), 0.0);
  for (std::size_t j : order) {
    std::size_t best = out.size();
    for (std::size_t r = 0; r < out.size(); ++r)
      if (out[r].size() < per && (best == out.size() || load[r] < load[best])) best = r;
    out[best].push_back(j);
    load[best] += costs[j];
  }
  return out;
}

std::vector<std::int64_t> choose_outlier_thresholds(const std::vector<std::int64_t>& sample,
                                                    const PackerParams& params, const CostModel& cost, int steps,
                                                    double max_mean_delay, std::vector<ThresholdTrial>* trials) {
  if (sample.empty()) throw ConfigError("outlier threshold tuning needs a non-empty length sample");
  const std::int64_t smax = std::min(params.cap(), params.max_seq_len);  // longest piece: the window
  std::vector<std::int64_t> cand;
  for (int div : {32, 16, 8, 4, 2}) {
    const std::int64_t x = std::max<std::int64_t>(1, smax / div);
    if (cand.empty() || x > cand.back()) cand.push_back(x);
  }
  std::vector<std::vector<std::int64_t>> sets{{}};
  const std::size_t m = cand.size();
  for (std::size_t i = 0; i < m; ++i) {
    sets.push_back({cand[i]});
    for (std::size_t j = i + 1; j < m; ++j) {
      sets.push_back({cand[i], cand[j]});
      for (std::size_t k = j + 1; k < m; ++k) sets.push_back({cand[i], cand[j], cand[k]});
    }
  }
  std::vector<ThresholdTrial> all;
  for (const auto& set : sets) {
    PackerParams p = params;
    p.kind = "wlb";
    p.sharding = "sequence";
    p.dp = 1;
    p.thresholds = set;
    auto packer = make_packer(p, cost);
    VectorDocSource src(sample);
    double imb = 0;
    std::int64_t tok = 0, delay = 0;
    for (int s = 0; s < steps; ++s) {
      const StepPlan plan = packer->plan_step(s, src);
      double mx = 0, sum = 0;
      for (const auto& mb : plan.micro_batches[0]) {
        const double l = cost.latency(mb);
        mx = std::max(mx, l);
        sum += l;
      }
      imb += sum > 0 ? mx * static_cast<double>(plan.micro_batches[0].size()) / sum : 1.0;
      tok += plan.tokens;
      delay += plan.delay_token_steps;
    }
    all.push_back(ThresholdTrial{set, imb / std::max(steps, 1), tok > 0 ? double(delay) / double(tok) : 0.0});
  }
  const ThresholdTrial* best = nullptr;
  for (const auto& t : all)
    if (t.mean_delay <= max_mean_delay && (best == nullptr || t.imbalance < best->imbalance)) best = &t;
  if (best == nullptr) best = &all.front();  // "none" waits only for leftovers
  const double limit = best->imbalance * 1.005;
  for (const auto& t : all) {
    if (t.mean_delay > max_mean_delay || t.imbalance > limit) continue;
    if (t.mean_delay < best->mean_delay ||
        (t.mean_delay == best->mean_delay && t.thresholds.size() < best->thresholds.size()))
      best = &t;
  }
  auto chosen = best->thresholds;
  if (trials) *trials = std::move(all);
  return chosen;
}

}  // namespace wlb::balance

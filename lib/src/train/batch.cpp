#include "wlb4d/train/batch.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/data/dataset.hpp"

#include <string>

namespace wlb::train {

namespace {
HostBatch build(const data::TokenDataset& ds, const balance::MicroBatch& mb,
                const std::vector<std::int64_t>* mine) {
  const std::int64_t T = mb.tokens();
  // Whole micro-batch first (labels need the next token of the span).
  std::vector<token_t> all(static_cast<std::size_t>(T));
  std::vector<std::int32_t> lab(T), pos(T), lo(T);
  std::int64_t at = 0;
  for (const auto& s : mb.spans) {
    if (s.length < 1 || s.offset < 0 || s.offset + s.length > ds.doc_length(s.doc_id))
      throw core::DataError("step plan span (doc " + std::to_string(s.doc_id) + ", offset " +
                            std::to_string(s.offset) + ", length " + std::to_string(s.length) +
                            ") lies outside the document in '" + ds.path() + "'");
    ds.read(s.doc_id, s.offset, s.length, all.data() + at);
    for (std::int64_t j = 0; j < s.length; ++j) {
      pos[at + j] = static_cast<std::int32_t>(j);
      lo[at + j] = static_cast<std::int32_t>(at);
      lab[at + j] = (j + 1 < s.length) ? static_cast<std::int32_t>(all[at + j + 1]) : -1;
    }
    at += s.length;
  }
  HostBatch b;
  b.mb_tokens = T;
  auto take = [&](std::int64_t i) {
    b.tokens.push_back(static_cast<std::int32_t>(all[i]));
    b.labels.push_back(lab[i]);
    b.positions.push_back(pos[i]);
    b.kv_lo.push_back(lo[i]);
    b.kv_hi.push_back(static_cast<std::int32_t>(i));
    b.global_index.push_back(i);
    if (lab[i] >= 0) ++b.target_tokens;
  };
  if (!mine) {
    for (std::int64_t i = 0; i < T; ++i) take(i);
  } else {
    for (std::int64_t i : *mine) take(i);
  }
  return b;
}
}  // namespace

HostBatch build_batch(const data::TokenDataset& ds, const balance::MicroBatch& mb) {
  return build(ds, mb, nullptr);
}

HostBatch build_batch(const data::TokenDataset& ds, const balance::MicroBatch& mb,
                      const std::vector<std::int64_t>& mine) {
  return build(ds, mb, &mine);
}

double attention_work(const balance::MicroBatch& mb) {
  double w = 0;
  for (const auto& s : mb.spans) w += double(s.length) * double(s.length);
  return w;
}

}  // namespace wlb::train

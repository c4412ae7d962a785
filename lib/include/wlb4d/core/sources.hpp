#pragma once
/// \file sources.hpp
/// \brief The value of a split key (data.train, data.val): weighted sources
/// of token dataset files, in Megatron's order of weight then path
/// (Megatron-LM `--data-path 0.7 web 0.3 code`; docs/data.md, "Shards and
/// blends").
///
///   data.train = runs/data/train.h5                       one file
///   data.train = shards/web-*.h5                          one source: a glob, its files in sorted order
///   data.train = a.h5 b.h5 c.h5                           one source: a list of files read as one stream
///   data.train = 0.7 web-*.h5 0.3 code-0.h5 code-1.h5     two sources, token shares 0.7 / 0.3
///
/// Words are separated by whitespace (paths with spaces are not supported).
/// A word that parses as a whole as a decimal number is a weight; the paths
/// after it, up to the next weight, are its source. Without any weight the
/// value is one source of weight 1. Weights are relative (normalised to sum
/// 1 by the reader).

#include <string>
#include <vector>

namespace wlb::core {

/// One source of a split: its weight and the paths or glob patterns of its files.
struct SourceSpec {
  double weight = 1;
  std::vector<std::string> paths;
};

/// Parses a split value (see the file comment).
/// \throws core::ConfigError naming `key` and the rule: an empty value, a
///         weight <= 0 or not finite, a weight followed by no path, paths
///         before the first weight when weights are given.
std::vector<SourceSpec> parse_sources(const std::string& key, const std::string& value);
/// The same without throwing: *rule is "" or the rule broken (as a deck key's check words it).
std::vector<SourceSpec> parse_sources(const std::string& value, std::string* rule);

/// True when `path` holds a glob character (`*`, `?` or `[`).
bool is_glob(const std::string& path);

}  // namespace wlb::core

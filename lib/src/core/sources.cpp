// Split values: weighted sources of dataset files (sources.hpp).
#include "wlb4d/core/sources.hpp"

#include "wlb4d/core/error.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace wlb::core {

namespace {
/// The word as a number when all of it is one (strtod over the whole word).
bool as_number(const std::string& w, double* v) {
  if (w.empty()) return false;
  const char c = w[0];
  if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '+')) return false;
  errno = 0;
  char* end = nullptr;
  *v = std::strtod(w.c_str(), &end);
  return end == w.c_str() + w.size();
}
}  // namespace

bool is_glob(const std::string& path) { return path.find_first_of("*?[") != std::string::npos; }

std::vector<SourceSpec> parse_sources(const std::string& value, std::string* rule) {
  rule->clear();
  std::istringstream in(value);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  if (words.empty()) {
    *rule = "must name a token dataset file (it is empty)";
    return {};
  }
  const std::string form = " (a blend is 'W1 PATH1 W2 PATH2 ...', Megatron's order of weight then path)";
  double v = 0;
  bool any_weight = false;
  for (const auto& w : words) any_weight = any_weight || as_number(w, &v);
  std::vector<SourceSpec> out;
  if (!any_weight) {
    out.push_back({1.0, words});
    return out;
  }
  if (!as_number(words[0], &v)) {
    *rule = "has path '" + words[0] +
            "' before the first weight; with weights, every path follows its source's weight" + form;
    return {};
  }
  for (const auto& w : words) {
    if (as_number(w, &v)) {
      if (!std::isfinite(v) || v <= 0) {
        *rule = "has weight '" + w + "' for source " + std::to_string(out.size() + 1) + ": a weight must be > 0" + form;
        return {};
      }
      if (!out.empty() && out.back().paths.empty()) break;
      out.push_back({v, {}});
    } else {
      out.back().paths.push_back(w);
    }
  }
  if (out.back().paths.empty()) {
    *rule = "has a weight followed by no path (source " + std::to_string(out.size()) + ")" + form;
    return {};
  }
  return out;
}

std::vector<SourceSpec> parse_sources(const std::string& key, const std::string& value) {
  std::string rule;
  auto out = parse_sources(value, &rule);
  if (!rule.empty()) throw ConfigError(key + "=" + value + " " + rule);
  return out;
}

}  // namespace wlb::core

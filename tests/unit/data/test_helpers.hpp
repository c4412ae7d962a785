#pragma once
// Shared helpers of the data tests: the committed tiny corpus, scratch files.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace wlb::data::test {

inline std::string tiny_jsonl() { return std::string(WLB4D_SOURCE_DIR) + "/tests/data/tiny.jsonl"; }

/// The "text" fields of a JSONL file, in order.
inline std::vector<std::string> jsonl_texts(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return out;
}

/// A file in the scratch directory under the test's working directory (the
/// build tree: ctest runs tests there), so nothing is left in /tmp.
inline std::filesystem::path scratch(const std::string& name) {
  auto dir = std::filesystem::current_path() / "data_scratch";
  std::filesystem::create_directories(dir);
  return dir / name;
}

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace wlb::data::test

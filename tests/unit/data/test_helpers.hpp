#pragma once
// Shared helpers of the data tests: the committed tiny corpus, scratch files,
// small hand-built Hugging Face tokenizer.json files.
#include "wlb4d/data/byte_level_bpe.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
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

// GPT-2's and Llama 3's pre-tokenizer settings, as their tokenizer.json files have them.
inline nlohmann::json gpt2_pre() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
}
inline nlohmann::json byte_level_only(bool prefix = false) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", prefix}, {"trim_offsets", true}, {"use_regex", false}};
}
inline const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline nlohmann::json llama3_pre() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
            byte_level_only()}}};
}

/// A tokenizer.json: the 256 byte characters at ids 0..255 (id = byte), then
/// the result of each merge (in merge order, when new), then `extra` tokens;
/// added tokens <|endoftext|> 300, <|begin_of_text|> 301, <|eot_id|> 302.
/// Merges are written "a b" (string_merges) or ["a", "b"].
inline nlohmann::json tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                                     const nlohmann::json& pre, const std::vector<std::string>& extra = {},
                                     bool string_merges = true) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(b)] = b;
  int next = 256;
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    m.push_back(string_merges ? nlohmann::json(a + " " + b) : nlohmann::json::array({a, b}));
  }
  for (const auto& e : extra) vocab[e] = next++;
  const auto added = [](int id, const char* content) {
    return nlohmann::json{{"id", id},         {"content", content},   {"single_word", false}, {"lstrip", false},
                          {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  nlohmann::json t;
  t["version"] = "1.0";
  t["added_tokens"] = {added(300, "<|endoftext|>"), added(301, "<|begin_of_text|>"), added(302, "<|eot_id|>")};
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = pre;
  t["post_processor"] = nullptr;
  t["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  t["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                {"byte_fallback", false}, {"vocab", vocab}, {"merges", m}};
  return t;
}

}  // namespace wlb::data::test

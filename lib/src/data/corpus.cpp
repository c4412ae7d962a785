// Corpus reading: JSONL / .jsonl.xz / .txt / directories -> documents (corpus.hpp).
#include "wlb4d/data/corpus.hpp"

#include "wlb4d/core/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>

namespace wlb::data {

using core::DataError;
namespace fs = std::filesystem;

namespace {

/// Length of the well-formed UTF-8 sequence at s[i], or -(length of the
/// maximal invalid subpart) when it is ill-formed (Unicode §3.9, D93b).
int utf8_seq(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c == 0xE0) len = 3, lo = 0xA0;
  else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
  else if (c == 0xED) len = 3, hi = 0x9F;
  else if (c == 0xF0) len = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) len = 4;
  else if (c == 0xF4) len = 4, hi = 0x8F;
  else return -1;
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -k;
    unsigned char d = b(i + k);
    if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return -k;
  }
  return len;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

enum class Kind { Jsonl, Txt, Other };
Kind kind_of(const std::string& path) {
  if (ends_with(path, ".jsonl") || ends_with(path, ".jsonl.xz")) return Kind::Jsonl;
  if (ends_with(path, ".txt") || ends_with(path, ".txt.xz")) return Kind::Txt;
  return Kind::Other;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string read_file(const std::string& path) {
  if (ends_with(path, ".xz")) {
    std::string cmd = "xz -dc -- " + shell_quote(path) + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw DataError(path + ": cannot run 'xz -dc' to decompress (is xz-utils installed?)");
    std::string out;
    char buf[1 << 16];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    int st = pclose(p);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::string msg = out.size() > 300 ? out.substr(out.size() - 300) : out;
      while (!msg.empty() && msg.back() == '\n') msg.pop_back();
      throw DataError(path + ": 'xz -dc' failed (exit " +
                      std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : -1) + "): " + msg);
    }
    return out;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open corpus file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw DataError(path + ": read error");
  return ss.str();
}

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  });
}

struct Collector {
  CorpusStats* st;
  std::int64_t max_docs;
  std::vector<std::string>* docs;
  bool full() const { return max_docs >= 0 && static_cast<std::int64_t>(docs->size()) >= max_docs; }
  void add(std::string text, bool repaired) {
    if (blank(text)) {
      ++st->empty_skipped;
      return;
    }
    if (repaired) ++st->utf8_repaired;
    st->bytes += static_cast<std::int64_t>(text.size());
    ++st->documents;
    docs->push_back(std::move(text));
  }
};

/// Calls f(lineno, object) for every non-blank line of a JSONL file (UTF-8
/// repaired first; *bad gets the replacements of that line) until f returns false.
template <class F> void for_each_json_line(const std::string& path, const std::string& data, F&& f) {
  std::size_t pos = 0;
  std::int64_t lineno = 0;
  while (pos < data.size()) {
    std::size_t nl = data.find('\n', pos);
    std::size_t end = nl == std::string::npos ? data.size() : nl;
    std::string_view line(data.data() + pos, end - pos);
    pos = end + 1;
    ++lineno;
    if (blank(line)) continue;
    std::int64_t bad = 0;
    std::string fixed = repair_utf8(line, &bad);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(fixed);
    } catch (const nlohmann::json::parse_error& e) {
      throw DataError(path + ":" + std::to_string(lineno) + ": malformed JSON line (" + e.what() + ")");
    }
    if (!j.is_object())
      throw DataError(path + ":" + std::to_string(lineno) + ": JSON line is not an object");
    if (!f(lineno, j, bad > 0)) return;
  }
}

void read_jsonl(const std::string& path, const std::string& data, Collector& c,
                const std::vector<std::string>& keys) {
  for_each_json_line(path, data, [&](std::int64_t, const nlohmann::json& j, bool repaired) {
    if (c.full()) return false;
    bool any = false;
    for (const auto& k : keys) {
      auto it = j.find(k);
      if (it == j.end() || !it->is_string()) continue;
      any = true;
      if (c.full()) break;
      c.add(it->get<std::string>(), repaired);
    }
    if (!any) ++c.st->no_text_skipped;
    return !c.full();
  });
}

/// Cuts a .txt file's text into documents by the rule.
void read_txt(const std::string& data, TxtSplit rule, bool repaired, Collector& c) {
  if (rule == TxtSplit::File) {
    c.add(data, repaired);
    return;
  }
  std::size_t pos = 0, para_begin = std::string::npos, para_end = 0;
  auto flush_para = [&] {
    if (para_begin != std::string::npos && !c.full()) c.add(data.substr(para_begin, para_end - para_begin), repaired);
    para_begin = std::string::npos;
  };
  while (pos < data.size() && !c.full()) {
    std::size_t nl = data.find('\n', pos);
    std::size_t end = nl == std::string::npos ? data.size() : nl;
    std::string_view line(data.data() + pos, end - pos);
    if (rule == TxtSplit::Line) {
      if (!blank(line)) c.add(std::string(line), repaired);  // blank lines are separators, not documents
    } else if (blank(line)) {
      flush_para();
    } else {
      if (para_begin == std::string::npos) para_begin = pos;
      para_end = end;  // the paragraph's text ends before its last newline
    }
    pos = end + 1;
  }
  if (rule == TxtSplit::BlankLine) flush_para();
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    int n = utf8_seq(s, i);
    if (n < 0) return false;
    i += static_cast<std::size_t>(n);
  }
  return true;
}

std::string repair_utf8(std::string_view s, std::int64_t* replaced) {
  std::int64_t count = 0;
  std::string out;
  std::size_t done = 0;  // s[done, i) is valid and not yet copied
  for (std::size_t i = 0; i < s.size();) {
    int n = utf8_seq(s, i);
    if (n > 0) {
      i += static_cast<std::size_t>(n);
      continue;
    }
    if (count == 0) out.reserve(s.size() + 16);
    out.append(s.data() + done, i - done);
    out += "\xEF\xBF\xBD";
    ++count;
    i += static_cast<std::size_t>(-n);
    done = i;
  }
  if (replaced) *replaced = count;
  if (count == 0) return std::string(s);
  out.append(s.data() + done, s.size() - done);
  return out;
}

std::vector<std::string> list_corpus_files(const std::vector<std::string>& inputs,
                                           std::int64_t* ignored_files) {
  std::vector<std::string> files;
  std::int64_t ignored = 0;
  for (const auto& in : inputs) {
    std::error_code ec;
    auto st = fs::status(in, ec);
    if (ec || !fs::exists(st)) throw DataError(in + ": input does not exist");
    if (fs::is_directory(st)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec)) {
        if (!it->is_regular_file()) continue;
        std::string p = it->path().string();
        if (kind_of(p) == Kind::Other) ++ignored;
        else found.push_back(p);
      }
      if (ec) throw DataError(in + ": cannot list input directory (" + ec.message() + ")");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      if (kind_of(in) == Kind::Other)
        throw DataError(in + ": unsupported input (expected .jsonl, .jsonl.xz, .txt, .txt.xz or a directory)");
      // A file is read whole: a device or FIFO (e.g. a symlink x.jsonl ->
      // /dev/zero) would be read without end.
      if (!fs::is_regular_file(st))
        throw DataError(in + ": input is not a regular file or a directory (a device or FIFO is never read)");
      files.push_back(in);
    }
  }
  if (ignored_files) *ignored_files = ignored;
  return files;
}

TxtSplit parse_txt_split(const std::string& s) {
  if (s == "file") return TxtSplit::File;
  if (s == "blank-line") return TxtSplit::BlankLine;
  if (s == "line") return TxtSplit::Line;
  throw core::ConfigError("--txt-split '" + s + "' must be file, blank-line or line");
}

std::vector<std::string> read_corpus(const std::vector<std::string>& inputs, CorpusStats* stats,
                                     std::int64_t max_docs, const CorpusOptions& opts) {
  if (opts.json_keys.empty()) throw core::ConfigError("--json-keys must name at least one field");
  CorpusStats local;
  CorpusStats& st = stats ? *stats : local;
  st = CorpusStats{};
  std::vector<std::string> docs;
  Collector c{&st, max_docs, &docs};
  for (const auto& f : list_corpus_files(inputs, &st.ignored_files)) {
    if (c.full()) break;
    std::string data = read_file(f);
    ++st.files;
    if (kind_of(f) == Kind::Jsonl) {
      read_jsonl(f, data, c, opts.json_keys);
    } else {
      std::int64_t bad = 0;
      std::string text = repair_utf8(data, &bad);
      read_txt(text, opts.txt_split, bad > 0, c);
    }
  }
  return docs;
}

std::string chat_role_header(const std::string& role) { return "<|" + role + "|>\n"; }

namespace {

/// One fine-tuning record -> its segments (read_sft_corpus's rules).
SegmentedDoc sft_record(const nlohmann::json& j, const std::string& where, const std::string& pk,
                        const std::string& rk) {
  SegmentedDoc doc;
  auto msgs = j.find("messages");
  if (msgs != j.end()) {
    if (!msgs->is_array())
      throw DataError(where + ": \"messages\" must be an array of {\"role\", \"content\"} objects");
    bool trained = false;
    std::size_t k = 0;
    for (const auto& m : *msgs) {
      const std::string turn = where + ": messages[" + std::to_string(k++) + "]";
      if (!m.is_object()) throw DataError(turn + " is not an object (expected {\"role\", \"content\"})");
      auto role = m.find("role"), content = m.find("content");
      if (role == m.end() || !role->is_string()) throw DataError(turn + " needs a string \"role\"");
      if (content == m.end() || !content->is_string()) throw DataError(turn + " needs a string \"content\"");
      const std::string r = role->get<std::string>(), text = content->get<std::string>();
      const bool target = r == "assistant";
      trained = trained || (target && !blank(text));
      doc.push_back({chat_role_header(r), false});
      doc.push_back({text + "\n", target});
    }
    if (!trained)
      throw DataError(where + ": \"messages\" holds no \"assistant\" turn with non-blank content: the record "
                      "would have nothing to train on (the loss is taken on assistant turns only)");
    return doc;
  }
  auto prompt = j.find(pk), response = j.find(rk);
  if (prompt == j.end() && response == j.end())
    throw DataError(where + ": a fine-tuning record needs \"messages\" (chat) or \"" + pk + "\" and \"" + rk +
                    "\" (--json-keys PROMPT,RESPONSE names them)");
  if (prompt == j.end() || !prompt->is_string())
    throw DataError(where + ": fine-tuning record without a string \"" + pk + "\"");
  if (response == j.end() || !response->is_string() || blank(response->get<std::string>()))
    throw DataError(where + ": fine-tuning record without a response: \"" + rk +
                    "\" must be a non-blank string (the loss is taken on the response only)");
  doc.push_back({prompt->get<std::string>(), false});
  doc.push_back({response->get<std::string>(), true});
  return doc;
}

}  // namespace

std::vector<SegmentedDoc> read_sft_corpus(const std::vector<std::string>& inputs, CorpusStats* stats,
                                          std::int64_t max_docs, const std::string& prompt_key,
                                          const std::string& response_key) {
  CorpusStats local;
  CorpusStats& st = stats ? *stats : local;
  st = CorpusStats{};
  std::vector<SegmentedDoc> docs;
  auto full = [&] { return max_docs >= 0 && static_cast<std::int64_t>(docs.size()) >= max_docs; };
  for (const auto& f : list_corpus_files(inputs, &st.ignored_files)) {
    if (full()) break;
    if (kind_of(f) != Kind::Jsonl)
      throw DataError(f + ": fine-tuning (--sft) reads JSONL records only (.jsonl, .jsonl.xz), not .txt");
    std::string data = read_file(f);
    ++st.files;
    for_each_json_line(f, data, [&](std::int64_t lineno, const nlohmann::json& j, bool repaired) {
      if (full()) return false;
      docs.push_back(sft_record(j, f + ":" + std::to_string(lineno), prompt_key, response_key));
      for (const auto& seg : docs.back()) st.bytes += static_cast<std::int64_t>(seg.text.size());
      ++st.documents;
      if (repaired) ++st.utf8_repaired;
      return true;
    });
  }
  return docs;
}

}  // namespace wlb::data

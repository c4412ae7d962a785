// Byte-level BPE from a Hugging Face tokenizer.json (see byte_level_bpe.hpp).
// The regexes are PCRE2's; the merge loop is ours, written after the
// tokenizers crate's Word::merge_all so that ties resolve as HF's do.
#include "wlb4d/data/byte_level_bpe.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/data/corpus.hpp"

#include "model_file.hpp"

#include <nlohmann/json.hpp>
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <utility>

namespace wlb::data {

using core::DataError;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------- alphabet

// bytes_to_unicode(): '!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves; the
// other 68 bytes, in increasing order, for U+0100, U+0101, ...
struct Alphabet {
  std::array<int, 256> cp{};        // byte -> code point
  std::array<int, 256 + 68> byte{};  // code point -> byte (-1: not in the alphabet)
  Alphabet() {
    byte.fill(-1);
    const auto printable = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174; };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      cp[std::size_t(b)] = printable(b) ? b : 256 + n++;
      byte[std::size_t(cp[std::size_t(b)])] = b;
    }
  }
  int byte_of(std::uint32_t c) const { return c < byte.size() ? byte[c] : -1; }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

void append_utf8(std::string& s, std::uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
}

// The next code point of valid UTF-8 text s at i (advanced past it).
std::uint32_t next_cp(std::string_view s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (int k = 1; k < n && i + std::size_t(k) < s.size(); ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + std::size_t(k)]) & 0x3Fu);
  i += std::size_t(n);
  return cp;
}

// A token's text as bytes: through the alphabet when every character is in
// it (*all_alphabet = true), else its own UTF-8 (the ByteLevel decoder's
// rule for added tokens such as "<→>").
std::string token_bytes(std::string_view text, bool* all_alphabet) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const int b = alphabet().byte_of(next_cp(text, i));
    if (b < 0) {
      *all_alphabet = false;
      return std::string(text);
    }
    out += char(b);
  }
  *all_alphabet = true;
  return out;
}

// ---------------------------------------------------------------- regexes

// GPT-2's pre-tokenizer pattern (openai/gpt-2 encoder.py), as the tokenizers
// crate's ByteLevel pre-tokenizer uses it with use_regex = true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<const char*>(buf));
}

class Regex {
 public:
  // Compiles with UTF and Unicode properties (\s, \w, \p{L} over all of
  // Unicode, as Oniguruma in the tokenizers crate), or as a literal string
  // (Split's {"String": ...}); JIT when available.
  Regex(const std::string& pattern, bool literal, const std::string& where) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    // PCRE2_LITERAL refuses PCRE2_UCP (no classes to widen).
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &err, &off, nullptr);
    if (!code_)
      throw DataError(where + " '" + pattern + "' is not a regular expression PCRE2 compiles (at offset " +
                      std::to_string(off) + ": " + pcre2_message(err) + ")");
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  const pcre2_code* code() const { return code_; }
  bool jit() const { return jit_; }
  const std::string& pattern() const { return pattern_; }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
  std::string pattern_;
};

// Match data and a JIT stack for one encode() call. The JIT stack grows to
// 8 MiB: a long whitespace run under `\s+(?!\S)` backtracks without bound
// on the default 32 KiB machine stack.
class MatchState {
 public:
  MatchState() {
    md_ = pcre2_match_data_create(1, nullptr);
    mc_ = pcre2_match_context_create(nullptr);
    js_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (!md_ || !mc_ || !js_) throw std::bad_alloc();
    pcre2_jit_stack_assign(mc_, nullptr, js_);
  }
  ~MatchState() {
    pcre2_jit_stack_free(js_);
    pcre2_match_context_free(mc_);
    pcre2_match_data_free(md_);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;

  // Calls f(segment) for every non-empty match of re in s and every
  // non-empty stretch between matches, in order (HF's Split, "Isolated").
  // s is valid UTF-8 (checked once per encode(): PCRE2 would otherwise
  // re-check the whole subject at every call).
  template <class F>
  void split(const Regex& re, std::string_view s, F&& f) {
    const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
    std::size_t prev = 0, start = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(re.code(), subj, s.size(), start, PCRE2_NO_UTF_CHECK, md_, mc_);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0)
        throw DataError("pre-tokenizer regex '" + re.pattern() + "' failed on a " + std::to_string(s.size()) +
                        "-byte piece of text: " + pcre2_message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md_);
      const std::size_t ms = ov[0], me = ov[1];
      if (me == ms) {
        // An empty match yields nothing; as Oniguruma's find_iter, the
        // search resumes one character on.
        if (ms >= s.size()) break;
        std::size_t i = ms;
        next_cp(s, i);
        start = i;
        continue;
      }
      if (ms > prev) f(s.substr(prev, ms - prev));
      f(s.substr(ms, me - ms));
      prev = start = me;
    }
    if (prev < s.size()) f(s.substr(prev));
  }

 private:
  pcre2_match_data* md_ = nullptr;
  pcre2_match_context* mc_ = nullptr;
  pcre2_jit_stack* js_ = nullptr;
};

// ---------------------------------------------------------------- tokenizer.json

// One pre-tokenizer step, in order: Split steps, then one ByteLevel.
struct Step {
  bool byte_level = false;
  bool add_prefix_space = false;  // ByteLevel
  std::shared_ptr<Regex> re;      // Split's pattern; ByteLevel's GPT-2 pattern (use_regex) or null
};

std::string type_of(const json& j) {
  if (!j.is_object()) return "";
  const auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool flag(const json& j, const char* key, bool dflt, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) throw DataError(where + "." + key + " must be true or false");
  return it->get<bool>();
}

struct Merge {
  int rank;
  int id;  // the merged token
};

std::uint64_t pair_key(int a, int b) { return (std::uint64_t(std::uint32_t(a)) << 32) | std::uint32_t(b); }

}  // namespace

std::string byte_level_char(int b) {
  std::string s;
  append_utf8(s, std::uint32_t(alphabet().cp[std::size_t(b & 0xFF)]));
  return s;
}

struct ByteLevelBpeTokenizer::Impl {
  std::string origin;
  std::string json_text;
  int vocab = 0, eos = -1, bos = -1;
  std::vector<std::string> text;     // id -> tokenizer.json spelling ("" for an id without a token)
  std::vector<std::string> bytes;    // id -> the bytes it decodes to
  std::vector<char> assigned;        // id has a token
  std::vector<char> special;         // id is a special added token
  std::vector<int> added_order;      // ids of added_tokens, in the file's order
  std::unordered_map<std::string, int> by_text;   // vocabulary and added tokens
  std::unordered_map<std::string, int> by_bytes;  // vocabulary tokens spelt in the alphabet (ignore_merges)
  std::array<int, 256> byte_id{};
  std::unordered_map<std::uint64_t, Merge> merges;
  std::size_t num_merges = 0;
  bool ignore_merges = false;
  std::vector<Step> steps;

  mutable std::mutex mu;  // guards the cache and the scratch below
  mutable std::unordered_map<std::string, std::vector<token_t>> cache;
  struct Sym {
    int id, prev, next, len;
  };
  struct Cand {
    int rank, pos, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  mutable std::vector<Sym> syms;
  mutable std::vector<Cand> heap;

  void parse(const std::string& text, const ByteLevelBpeOptions& opts);
  void parse_model(const json& m);
  void parse_added(const json& j);
  void parse_pre_tokenizer(const json& p);
  void choose_specials(const ByteLevelBpeOptions& opts);
  [[noreturn]] void fail(const std::string& what) const { throw DataError(origin + ": " + what); }

  void pre_tokenize(std::size_t step, std::string_view piece, MatchState& ms, std::vector<token_t>& out) const;
  void bpe(std::string_view word, std::vector<token_t>& out) const;
  void merge_word(std::string_view word, std::vector<token_t>& out) const;
};

// ---------------------------------------------------------------- parsing

void ByteLevelBpeTokenizer::Impl::parse_model(const json& m) {
  if (!m.is_object()) fail("model is missing (a tokenizer.json has a \"model\" object)");
  const std::string type = type_of(m);
  if (type != "BPE")
    fail("model.type is '" + type + "'; wlb4d reads only byte-level BPE tokenizers (model.type \"BPE\")");
  if (m.contains("dropout") && !m["dropout"].is_null()) {
    if (!m["dropout"].is_number()) fail("model.dropout must be null or a number");
    if (m["dropout"].get<double>() > 0.0)
      fail("model.dropout is " + m["dropout"].dump() + "; BPE dropout samples merges, so ids would not be "
           "reproducible (it must be null or 0)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = m.find(key);
    if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      fail(std::string("model.") + key + " is " + it->dump() +
           "; byte-level BPE has none (it must be null or \"\")");
  }
  ignore_merges = flag(m, "ignore_merges", false, origin + ": model");

  const auto v = m.find("vocab");
  if (v == m.end() || !v->is_object() || v->empty())
    fail("model.vocab is missing or not an object of token -> id (a BPE model needs its vocabulary)");
  int max_id = -1;
  for (const auto& [tok, idj] : v->items()) {
    if (!idj.is_number_unsigned() || idj.get<std::uint64_t>() > std::uint64_t(1) << 30)
      fail("model.vocab[\"" + tok + "\"] = " + idj.dump() + " is not a token id (an integer in [0, 2^30])");
    max_id = std::max(max_id, idj.get<int>());
  }
  text.assign(std::size_t(max_id) + 1, std::string());
  assigned.assign(std::size_t(max_id) + 1, 0);
  by_text.reserve(v->size() + 512);
  by_bytes.reserve(v->size());
  for (const auto& [tok, idj] : v->items()) {
    const int id = idj.get<int>();
    if (assigned[std::size_t(id)])
      fail("model.vocab gives id " + std::to_string(id) + " to both \"" + text[std::size_t(id)] + "\" and \"" + tok +
           "\" (ids must be unique)");
    assigned[std::size_t(id)] = 1;
    text[std::size_t(id)] = tok;
    by_text.emplace(tok, id);
    bool spelt = false;  // ignore_merges looks whole pre-tokens up in model.vocab
    std::string b = token_bytes(tok, &spelt);
    if (spelt) by_bytes.emplace(std::move(b), id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = by_text.find(byte_level_char(b));
    if (it == by_text.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      fail("model.vocab has no token \"" + byte_level_char(b) + "\" for byte " + hex +
           " (a byte-level BPE vocabulary spells every byte: GPT-2's bytes_to_unicode alphabet)");
    }
    byte_id[std::size_t(b)] = it->second;
  }

  const auto mj = m.find("merges");
  if (mj == m.end() || !mj->is_array()) fail("model.merges is missing or not an array");
  merges.reserve(mj->size());
  for (std::size_t r = 0; r < mj->size(); ++r) {
    const json& e = (*mj)[r];
    std::string a, b;
    const auto where = "model.merges[" + std::to_string(r) + "] " + e.dump();
    if (e.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = e.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
        fail(where + " is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      fail(where + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto ia = by_text.find(a), ib = by_text.find(b), iab = by_text.find(a + b);
    if (ia == by_text.end() || ib == by_text.end() || iab == by_text.end())
      fail(where + ": \"" + (ia == by_text.end() ? a : ib == by_text.end() ? b : a + b) +
           "\" is not in model.vocab (a merge's parts and result must be tokens)");
    // A repeated pair takes its last rank, as HF's map of merges does.
    merges[pair_key(ia->second, ib->second)] = Merge{int(r), iab->second};
  }
  num_merges = mj->size();
}

void ByteLevelBpeTokenizer::Impl::parse_added(const json& j) {
  const auto at = j.find("added_tokens");
  if (at == j.end() || at->is_null()) return;
  if (!at->is_array()) fail("added_tokens must be an array");
  std::vector<std::pair<int, std::string>> added;
  for (std::size_t k = 0; k < at->size(); ++k) {
    const json& e = (*at)[k];
    const std::string where = "added_tokens[" + std::to_string(k) + "]";
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_unsigned() || !e.contains("content") ||
        !e["content"].is_string() || e["content"].get<std::string>().empty())
      fail(where + " must be an object with an id (integer >= 0) and a non-empty content");
    if (e["id"].get<std::uint64_t>() > std::uint64_t(1) << 30) fail(where + ".id is not in [0, 2^30]");
    const std::string content = e["content"].get<std::string>();
    if (!flag(e, "special", false, origin + ": " + where))
      fail(where + " \"" + content + "\" has special = false: HF's tokenizers find such tokens inside the text, "
           "which wlb4d does not do (it would give other ids); only special added tokens are supported");
    added.emplace_back(e["id"].get<int>(), content);
  }
  int max_id = int(text.size()) - 1;
  for (const auto& a : added) max_id = std::max(max_id, a.first);
  text.resize(std::size_t(max_id) + 1);
  assigned.resize(std::size_t(max_id) + 1, 0);
  special.assign(std::size_t(max_id) + 1, 0);
  for (const auto& [id, content] : added) {
    const auto i = std::size_t(id);
    if (special[i])
      fail("added_tokens give id " + std::to_string(id) + " to both \"" + text[i] + "\" and \"" + content + "\"");
    if (assigned[i] && text[i] != content)
      fail("added_tokens gives id " + std::to_string(id) + " to \"" + content + "\" but model.vocab has \"" +
           text[i] + "\" there");
    assigned[i] = special[i] = 1;
    text[i] = content;
    by_text.emplace(content, id);
    added_order.push_back(id);
  }
}

void ByteLevelBpeTokenizer::Impl::parse_pre_tokenizer(const json& p) {
  const std::string kinds =
      " (wlb4d reads ByteLevel, or a Sequence of Split {Regex or String pattern, behavior Isolated} steps "
      "followed by one ByteLevel)";
  if (p.is_null()) fail("pre_tokenizer is null" + kinds);
  std::vector<std::pair<const json*, std::string>> list;  // (step, field name)
  if (type_of(p) == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array() || p["pretokenizers"].empty())
      fail("pre_tokenizer.pretokenizers must be a non-empty array");
    for (std::size_t k = 0; k < p["pretokenizers"].size(); ++k)
      list.emplace_back(&p["pretokenizers"][k], "pre_tokenizer.pretokenizers[" + std::to_string(k) + "]");
  } else {
    list.emplace_back(&p, "pre_tokenizer");
  }
  for (std::size_t k = 0; k < list.size(); ++k) {
    const json& s = *list[k].first;
    const std::string& where = list[k].second;
    const std::string type = type_of(s);
    Step st;
    if (type == "ByteLevel") {
      if (k + 1 != list.size()) fail(where + " is ByteLevel but not the last step" + kinds);
      st.byte_level = true;
      st.add_prefix_space = flag(s, "add_prefix_space", true, origin + ": " + where);
      if (flag(s, "use_regex", true, origin + ": " + where))
        st.re = std::make_shared<Regex>(kGpt2Pattern, false, origin + ": GPT-2's pattern");
    } else if (type == "Split") {
      const std::string behavior = s.value("behavior", "");
      if (behavior != "Isolated")
        fail(where + ".behavior is '" + behavior + "'; only \"Isolated\" is implemented" + kinds);
      const auto pat = s.find("pattern");
      if (pat == s.end() || !pat->is_object() || pat->size() != 1 ||
          !(pat->contains("Regex") || pat->contains("String")) || !pat->begin()->is_string())
        fail(where + ".pattern must be {\"Regex\": \"...\"} or {\"String\": \"...\"}");
      const bool literal = pat->contains("String");
      const std::string re = pat->begin()->get<std::string>();
      if (re.empty()) fail(where + ".pattern is empty");
      st.re = std::make_shared<Regex>(re, literal, origin + ": " + where + ".pattern." + pat->begin().key());
    } else {
      fail(where + ".type is '" + type + "'" + kinds);
    }
    steps.push_back(std::move(st));
  }
  if (steps.empty() || !steps.back().byte_level) fail("pre_tokenizer has no ByteLevel step" + kinds);
}

void ByteLevelBpeTokenizer::Impl::choose_specials(const ByteLevelBpeOptions& opts) {
  const auto is_special = [&](int id) { return id >= 0 && id < vocab && special[std::size_t(id)]; };
  if (opts.eos_id >= 0 && !opts.eos_token.empty())
    fail("name the EOS by its text or by its id, not both ('" + opts.eos_token + "', " +
         std::to_string(opts.eos_id) + ")");
  if (opts.eos_id >= 0) {
    if (!is_special(opts.eos_id))
      fail("eos_id " + std::to_string(opts.eos_id) + " is not the id of a special added token (added_tokens)");
    eos = opts.eos_id;
  } else if (!opts.eos_token.empty()) {
    const auto it = by_text.find(opts.eos_token);
    if (it == by_text.end() || !is_special(it->second))
      fail("EOS token \"" + opts.eos_token + "\" is not a special added token (added_tokens)");
    eos = it->second;
  } else {
    std::string names;
    for (const char* c : kEosCandidates) names += std::string(names.empty() ? "" : ", ") + c;
    for (const int id : added_order)
      for (const char* c : kEosCandidates)
        if (eos < 0 && text[std::size_t(id)] == c) eos = id;
    if (eos < 0)
      fail("no end-of-text token: no special added token is one of " + names +
           " (name the EOS token: wlb4d-prep --eos-token)");
  }
  for (const int id : added_order)
    for (const char* c : kBosCandidates)
      if (bos < 0 && text[std::size_t(id)] == c) bos = id;
}

void ByteLevelBpeTokenizer::Impl::parse(const std::string& json_in, const ByteLevelBpeOptions& opts) {
  json j;
  try {
    j = json::parse(json_in);
  } catch (const json::exception& e) {
    fail(std::string("not a Hugging Face tokenizer.json (not JSON: ") + e.what() + ")");
  }
  if (!j.is_object()) fail("not a Hugging Face tokenizer.json (not a JSON object)");
  parse_model(j.contains("model") ? j["model"] : json());
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    fail("normalizer.type is '" + type_of(j["normalizer"]) +
         "'; wlb4d implements no normalizer (it must be null, as GPT-2's and Llama 3's are)");
  parse_added(j);
  parse_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json());
  const json dec = j.contains("decoder") ? j["decoder"] : json();
  if (type_of(dec) != "ByteLevel")
    fail("decoder is " + (dec.is_null() ? std::string("null") : "'" + type_of(dec) + "'") +
         "; a byte-level BPE decodes with ByteLevel");
  vocab = int(text.size());
  special.resize(text.size(), 0);
  bytes.resize(text.size());
  for (std::size_t id = 0; id < text.size(); ++id) {
    bool spelt = false;
    if (assigned[id]) bytes[id] = token_bytes(text[id], &spelt);
  }
  choose_specials(opts);
  json_text = json_in;
}

// ---------------------------------------------------------------- encoding

void ByteLevelBpeTokenizer::Impl::pre_tokenize(std::size_t step, std::string_view piece, MatchState& ms,
                                               std::vector<token_t>& out) const {
  if (piece.empty()) return;
  const Step& s = steps[step];
  if (!s.byte_level) {
    ms.split(*s.re, piece, [&](std::string_view seg) { pre_tokenize(step + 1, seg, ms, out); });
    return;
  }
  std::string prefixed;
  if (s.add_prefix_space && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (s.re)
    ms.split(*s.re, piece, [&](std::string_view seg) { bpe(seg, out); });
  else
    bpe(piece, out);
}

void ByteLevelBpeTokenizer::Impl::bpe(std::string_view word, std::vector<token_t>& out) const {
  if (word.size() == 1) {
    out.push_back(token_t(byte_id[static_cast<unsigned char>(word[0])]));
    return;
  }
  std::string key(word);
  if (const auto it = cache.find(key); it != cache.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const std::size_t first = out.size();
  const auto whole = ignore_merges ? by_bytes.find(key) : by_bytes.end();
  if (whole != by_bytes.end())
    out.push_back(token_t(whole->second));
  else
    merge_word(word, out);
  // Long pre-tokens (a base64 blob, a run of digits) rarely repeat: only
  // words of up to kCacheWordBytes are kept, as the tokenizers crate does.
  if (cache.size() < kCacheEntries && key.size() <= kCacheWordBytes)
    cache.emplace(std::move(key), std::vector<token_t>(out.begin() + std::ptrdiff_t(first), out.end()));
}

// Word::merge_all of the tokenizers crate: a min-heap of candidate pairs by
// (rank, position); a popped candidate whose symbols have changed since it
// was pushed is stale and skipped.
void ByteLevelBpeTokenizer::Impl::merge_word(std::string_view word, std::vector<token_t>& out) const {
  const int n = int(word.size());
  syms.resize(std::size_t(n));
  for (int i = 0; i < n; ++i)
    syms[std::size_t(i)] = Sym{byte_id[static_cast<unsigned char>(word[std::size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1, 1};
  heap.clear();
  const auto gt = std::greater<Cand>();
  const auto push = [&](int pos, int a, int b) {
    const auto it = merges.find(pair_key(a, b));
    if (it == merges.end()) return;
    heap.push_back(Cand{it->second.rank, pos, it->second.id});
    std::push_heap(heap.begin(), heap.end(), gt);
  };
  for (int i = 0; i + 1 < n; ++i) push(i, syms[std::size_t(i)].id, syms[std::size_t(i) + 1].id);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), gt);
    const Cand top = heap.back();
    heap.pop_back();
    Sym& cur = syms[std::size_t(top.pos)];
    if (cur.len == 0 || cur.next < 0) continue;
    Sym& right = syms[std::size_t(cur.next)];
    const auto it = merges.find(pair_key(cur.id, right.id));
    if (it == merges.end() || it->second.id != top.id) continue;
    cur.id = top.id;
    cur.len += right.len;
    right.len = 0;
    cur.next = right.next;
    if (cur.next >= 0) syms[std::size_t(cur.next)].prev = top.pos;
    if (cur.prev >= 0) push(cur.prev, syms[std::size_t(cur.prev)].id, cur.id);
    if (cur.next >= 0) push(top.pos, cur.id, syms[std::size_t(cur.next)].id);
  }
  for (int i = 0; i >= 0; i = syms[std::size_t(i)].next) out.push_back(token_t(syms[std::size_t(i)].id));
}

// ---------------------------------------------------------------- public

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer() : impl_(std::make_unique<Impl>()) {}
ByteLevelBpeTokenizer::~ByteLevelBpeTokenizer() = default;

std::unique_ptr<ByteLevelBpeTokenizer> ByteLevelBpeTokenizer::from_json(const std::string& json_text,
                                                                        const std::string& origin,
                                                                        const ByteLevelBpeOptions& opts) {
  std::unique_ptr<ByteLevelBpeTokenizer> t(new ByteLevelBpeTokenizer());
  t->impl_->origin = origin;
  t->impl_->parse(json_text, opts);
  return t;
}

std::unique_ptr<ByteLevelBpeTokenizer> ByteLevelBpeTokenizer::load(const std::string& path,
                                                                   const ByteLevelBpeOptions& opts) {
  return from_json(detail::read_model_file(path, "tokenizer.json file", kMaxFileBytes), path, opts);
}

int ByteLevelBpeTokenizer::vocab_size() const { return impl_->vocab; }
int ByteLevelBpeTokenizer::eos_id() const { return impl_->eos; }
int ByteLevelBpeTokenizer::bos_id() const { return impl_->bos; }
std::size_t ByteLevelBpeTokenizer::num_merges() const { return impl_->num_merges; }
std::string ByteLevelBpeTokenizer::model() const { return impl_->json_text; }

bool ByteLevelBpeTokenizer::jit() const {
  for (const auto& s : impl_->steps)
    if (s.re && !s.re->jit()) return false;
  return true;
}

std::string ByteLevelBpeTokenizer::token(int id) const {
  if (id < 0 || id >= impl_->vocab || !impl_->assigned[std::size_t(id)])
    throw DataError(impl_->origin + ": id " + std::to_string(id) + " is not a token (vocab_size " +
                    std::to_string(impl_->vocab) + ")");
  return impl_->text[std::size_t(id)];
}

int ByteLevelBpeTokenizer::token_id(std::string_view text) const {
  const auto it = impl_->by_text.find(std::string(text));
  return it == impl_->by_text.end() ? -1 : it->second;
}

std::vector<token_t> ByteLevelBpeTokenizer::encode(std::string_view text) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = repair_utf8(text);
    text = repaired;
  }
  std::vector<token_t> out;
  out.reserve(text.size() / 3);
  MatchState ms;
  const std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->pre_tokenize(0, text, ms, out);
  return out;
}

std::string ByteLevelBpeTokenizer::decode(const token_t* ids, std::size_t n) const {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const token_t id = ids[i];
    if (id >= token_t(impl_->vocab) || !impl_->assigned[id])
      throw DataError(impl_->origin + ": id " + std::to_string(id) + " at position " + std::to_string(i) +
                      (id >= token_t(impl_->vocab) ? " is not below vocab_size " + std::to_string(impl_->vocab)
                                                   : " has no token in the vocabulary"));
    if (id == token_t(impl_->eos)) continue;
    s += impl_->bytes[id];
  }
  return s;
}

}  // namespace wlb::data

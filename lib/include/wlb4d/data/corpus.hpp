#pragma once
/// \file corpus.hpp
/// \brief Reading text corpora into documents (the input side of wlb4d-prep).
///
/// Inputs, by file name:
/// - `*.jsonl`, `*.jsonl.xz`: one JSON object per line, the document is its
///   string field "text" (other fields ignored); with CorpusOptions::json_keys
///   every listed field that holds a string is one document, in the listed
///   order (Megatron's --json-keys). Fine-tuning records (read_sft_corpus)
///   are described there. `.xz` is decompressed through
///   `xz -dc` (xz-utils). Blank lines are ignored.
/// - `*.txt`, `*.txt.xz`: split by CorpusOptions::txt_split: the whole file
///   is one document (`file`, the default), or every paragraph (lines up to a
///   blank line, `blank-line`), or every non-blank line (`line`).
/// - a directory: every file above in it and its subdirectories, in sorted
///   path order (other files are ignored and counted).
///
/// Rules (also printed by `wlb4d-prep --help`):
/// - A line that is not valid JSON, or not a JSON object, is an error
///   (core::DataError naming file:line).
/// - A JSON object without a string "text" field (none of the json_keys) is
///   skipped and counted.
/// - An empty or whitespace-only document is skipped and counted.
/// - Invalid UTF-8 is repaired: every maximal invalid subsequence becomes
///   U+FFFD, and the document is counted as repaired. (JSON text must be
///   UTF-8, and sentencepiece would replace it anyway, so both tokenizers see
///   the same text.)
/// Documents keep their boundaries and their text is otherwise unchanged.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace wlb::data {

/// How `.txt` files are cut into documents.
enum class TxtSplit {
  File,       ///< the whole file is one document (the default)
  BlankLine,  ///< a document per paragraph: runs of non-blank lines, separated by blank (whitespace-only) lines
  Line,       ///< a document per non-blank line
};

/// Parses "file" | "blank-line" | "line". \throws core::ConfigError naming --txt-split otherwise.
TxtSplit parse_txt_split(const std::string& s);

/// Reading options (wlb4d-prep's --json-keys, --txt-split).
struct CorpusOptions {
  std::vector<std::string> json_keys{"text"};  ///< JSONL fields read, in order (non-empty)
  TxtSplit txt_split = TxtSplit::File;
};

/// What reading a corpus found.
struct CorpusStats {
  std::int64_t files = 0;             ///< input files read
  std::int64_t ignored_files = 0;     ///< files in input directories with other extensions
  std::int64_t documents = 0;         ///< documents kept
  std::int64_t empty_skipped = 0;     ///< empty / whitespace-only documents skipped
  std::int64_t no_text_skipped = 0;   ///< JSON lines without a string "text" skipped
  std::int64_t utf8_repaired = 0;     ///< documents whose invalid UTF-8 was replaced
  std::int64_t bytes = 0;             ///< UTF-8 bytes of the kept documents
};

/// True when s is well-formed UTF-8 (RFC 3629: no overlongs, surrogates or > U+10FFFF).
bool is_valid_utf8(std::string_view s);

/// s with every maximal invalid UTF-8 subsequence replaced by U+FFFD
/// ("\xEF\xBF\xBD"); returns s unchanged when valid. *replaced (optional) gets
/// the number of replacements.
std::string repair_utf8(std::string_view s, std::int64_t* replaced = nullptr);

/// Expands inputs (files and directories) into the list of input files.
/// \throws core::DataError when an input does not exist or a named file has an
///         unsupported extension.
std::vector<std::string> list_corpus_files(const std::vector<std::string>& inputs,
                                           std::int64_t* ignored_files = nullptr);

/// Reads the documents of all inputs, in order, applying the rules above.
/// \param max_docs stop after this many kept documents (< 0: all).
/// \throws core::DataError for a missing/unreadable file, a failed `xz -dc`, or
///         a malformed JSON line ("<file>:<line>: ...").
std::vector<std::string> read_corpus(const std::vector<std::string>& inputs, CorpusStats* stats,
                                     std::int64_t max_docs = -1, const CorpusOptions& opts = {});

/// One piece of a fine-tuning document's text; `target` pieces are trained on
/// (their tokens get loss mask 1), the others only condition the model.
struct Segment {
  std::string text;
  bool target = false;
};
/// A fine-tuning document: its segments in order (the text is their concatenation).
using SegmentedDoc = std::vector<Segment>;

/// The text the chat rendering gives a turn's role header: "<|ROLE|>\n".
std::string chat_role_header(const std::string& role);

/// Reads supervised fine-tuning records from JSONL inputs (.jsonl, .jsonl.xz,
/// directories of them; `.txt` is refused). One JSON object per line, either
/// - prompt/response: string fields `prompt_key` and `response_key` (default
///   "prompt", "response"; e.g. "instruction", "output"): segments
///   {prompt, not target}, {response, target}; no separator is inserted (put
///   one in the prompt, as instruction templates do); or
/// - chat: "messages", an array of {"role": string, "content": string}; each
///   turn renders as chat_role_header(role) (not target), then its content
///   and a "\n" (target when role is "assistant", else not).
/// A record with "messages" is a chat; every other record must be
/// prompt/response. Errors (core::DataError, "<file>:<line>: ..."): a line
/// that is not a JSON object; a prompt that is not a string; a missing,
/// non-string or blank response; messages that are not an array of
/// {role, content} strings, or hold no assistant turn with non-blank content.
/// A blank line is ignored; invalid UTF-8 is repaired as for read_corpus.
/// \throws core::DataError as above, and as read_corpus for files.
std::vector<SegmentedDoc> read_sft_corpus(const std::vector<std::string>& inputs, CorpusStats* stats,
                                          std::int64_t max_docs = -1, const std::string& prompt_key = "prompt",
                                          const std::string& response_key = "response");

}  // namespace wlb::data

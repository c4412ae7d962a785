#pragma once
/// \file corpus.hpp
/// \brief Reading text corpora into documents (the input side of wlb4d-prep).
///
/// Inputs, by file name:
/// - `*.jsonl`, `*.jsonl.xz`: one JSON object per line, the document is its
///   string field "text" (other fields ignored). `.xz` is decompressed through
///   `xz -dc` (xz-utils). Blank lines are ignored.
/// - `*.txt`, `*.txt.xz`: the whole file is one document.
/// - a directory: every file above in it and its subdirectories, in sorted
///   path order (other files are ignored and counted).
///
/// Rules (also printed by `wlb4d-prep --help`):
/// - A line that is not valid JSON, or not a JSON object, is an error
///   (core::DataError naming file:line).
/// - A JSON object without a string "text" field is skipped and counted.
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
                                     std::int64_t max_docs = -1);

}  // namespace wlb::data

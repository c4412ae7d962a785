#pragma once
// Reading a tokenizer's model file whole (sentencepiece .model, tokenizer.json).
#include <cstdint>
#include <string>

namespace wlb::data::detail {

/// The bytes of the file at path, read whole. A device (/dev/zero), a FIFO
/// or a huge file would be read without bound, so the file is checked from
/// its metadata first: it must be a regular file of at most max_bytes.
/// \param what names the file in messages ("sentencepiece model file").
/// \throws core::DataError "<path>: <what> is not a regular file ..." /
///         "... is N bytes; it must be a regular file of at most 1 GiB" /
///         "<path>: cannot open <what>".
std::string read_model_file(const std::string& path, const std::string& what, std::uintmax_t max_bytes);

}  // namespace wlb::data::detail

// A wlb4d checkpoint as a Hugging Face LlamaForCausalLM directory. See llama_export.hpp.
#include "wlb4d/hf/llama_export.hpp"

#include "wlb4d/core/config.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/param_shapes.hpp"
#include "wlb4d/data/byte_level_bpe.hpp"
#include "wlb4d/data/tokenizer.hpp"
#include "wlb4d/io/checkpoint.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <unistd.h>

namespace wlb::hf {

namespace fs = std::filesystem;
using core::CheckpointError;
using nlohmann::ordered_json;

std::string hf_tensor_name(const std::string& n) {
  static const std::map<std::string, std::string> kTop = {{"embed.weight", "model.embed_tokens.weight"},
                                                          {"final_norm.weight", "model.norm.weight"},
                                                          {"lm_head.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> kLayer = {
      {"attn_norm.weight", "input_layernorm.weight"},   {"attn.wq", "self_attn.q_proj.weight"},
      {"attn.wk", "self_attn.k_proj.weight"},           {"attn.wv", "self_attn.v_proj.weight"},
      {"attn.wo", "self_attn.o_proj.weight"},           {"mlp_norm.weight", "post_attention_layernorm.weight"},
      {"mlp.w_gate", "mlp.gate_proj.weight"},           {"mlp.w_up", "mlp.up_proj.weight"},
      {"mlp.w_down", "mlp.down_proj.weight"}};
  if (auto it = kTop.find(n); it != kTop.end()) return it->second;
  static const std::regex kLayerName(R"(layers\.([0-9]+)\.(.+))");
  std::smatch m;
  if (std::regex_match(n, m, kLayerName))
    if (auto it = kLayer.find(m[2].str()); it != kLayer.end()) return "model.layers." + m[1].str() + "." + it->second;
  throw core::InternalError("hf_tensor_name: '" + n + "' is not a wlb4d parameter name");
}

namespace {

struct Tokens {
  std::string bos, eos, unk;  ///< pieces ("" none)
};

void write_json(const fs::path& p, const ordered_json& j) {
  std::ofstream out(p, std::ios::binary);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) throw CheckpointError(p.string() + ": cannot write (" + std::strerror(errno) + ")");
}

ordered_json id_or_null(std::int64_t id) { return id >= 0 ? ordered_json(id) : ordered_json(nullptr); }

/// config.json of LlamaForCausalLM (transformers' LlamaConfig fields).
ordered_json llama_config(const io::CheckpointInfo& info, const core::Config& deck, Dtype dtype) {
  const auto& m = info.model;
  ordered_json c;
  c["architectures"] = {"LlamaForCausalLM"};
  c["model_type"] = "llama";
  c["hidden_size"] = m.d_model;
  c["intermediate_size"] = m.ffn_hidden;
  c["num_attention_heads"] = m.heads;
  c["num_key_value_heads"] = m.kv_heads;
  c["head_dim"] = m.head_dim();
  c["num_hidden_layers"] = m.layers;
  c["rms_norm_eps"] = m.norm_eps;
  c["rope_theta"] = m.rope_theta;
  if (m.rope_scaling == "llama3") {
    ordered_json r;
    r["rope_type"] = "llama3";
    r["factor"] = m.rope_factor;
    r["low_freq_factor"] = m.rope_low_freq_factor;
    r["high_freq_factor"] = m.rope_high_freq_factor;
    r["original_max_position_embeddings"] = m.rope_original_max_position;
    c["rope_scaling"] = r;
  } else {
    c["rope_scaling"] = nullptr;
  }
  c["max_position_embeddings"] = deck.train.max_seq_len;
  c["vocab_size"] = info.tokenizer_vocab;
  c["tie_word_embeddings"] = m.tie_embeddings;
  c["bos_token_id"] = id_or_null(info.bos_id);
  c["eos_token_id"] = id_or_null(info.eos_id);
  c["hidden_act"] = "silu";
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["mlp_bias"] = false;
  c["initializer_range"] = m.init_std;
  c["pretraining_tp"] = 1;
  c["use_cache"] = true;
  c["torch_dtype"] = dtype == Dtype::F32 ? "float32" : "bfloat16";
  return c;
}

/// tokenizer.json of the bytes tokenizer (HF tokenizers' serialization):
/// byte-level pre-tokenizer and decoder without the regex split, a BPE model
/// with the 256 byte-level characters as its vocabulary and no merges, EOS
/// as an added special token.
ordered_json bytes_tokenizer_json(const std::string& eos) {
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[data::byte_level_char(b)] = b;
  const ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  ordered_json t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = ordered_json::array({{{"id", data::ByteTokenizer::kEos},
                                            {"content", eos},
                                            {"single_word", false},
                                            {"lstrip", false},
                                            {"rstrip", false},
                                            {"normalized", false},
                                            {"special", true}}});
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = byte_level;
  t["post_processor"] = nullptr;
  t["decoder"] = byte_level;
  t["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", ordered_json::array()}};
  return t;
}

/// The tokenizer files; returns their names.
std::vector<std::string> write_tokenizer(const std::string& checkpoint, const io::CheckpointInfo& info,
                                         const core::Config& deck, const fs::path& dir) {
  std::vector<std::string> files;
  Tokens tok;
  ordered_json cfg;
  if (info.tokenizer == "sentencepiece") {
    const std::string model = io::read_checkpoint_tokenizer_model(checkpoint);
    if (model.empty()) throw CheckpointError(checkpoint + ": tokenizer = sentencepiece but /tokenizer/model is missing");
    const auto sp = data::SentencePieceTokenizer::from_serialized(model, checkpoint + ": /tokenizer/model");
    const auto piece = [&](std::int64_t id) { return id >= 0 ? sp->piece(int(id)) : std::string(); };
    tok = {piece(info.bos_id), piece(info.eos_id), piece(sp->unk_id())};
    std::ofstream out(dir / "tokenizer.model", std::ios::binary);
    out.write(model.data(), std::streamsize(model.size()));
    out.close();
    if (!out) throw CheckpointError((dir / "tokenizer.model").string() + ": cannot write");
    files.push_back("tokenizer.model");
    cfg["tokenizer_class"] = "LlamaTokenizer";
    // wlb4d's spm models are trained without a dummy prefix (data/tokenizer.hpp):
    // the legacy path encodes with the model as it is.
    cfg["legacy"] = true;
    cfg["add_prefix_space"] = false;
    cfg["sp_model_kwargs"] = ordered_json::object();
  } else if (info.tokenizer == data::ByteLevelBpeTokenizer::kName) {
    // The tokenizer.json the data was prepared with, byte for byte; its EOS
    // (chosen at prep time) and BOS are named in tokenizer_config.json.
    const std::string model = io::read_checkpoint_tokenizer_model(checkpoint);
    if (model.empty()) throw CheckpointError(checkpoint + ": tokenizer = hf-bpe but /tokenizer/model is missing");
    data::ByteLevelBpeOptions o;
    o.eos_id = int(info.eos_id);
    const auto t = data::ByteLevelBpeTokenizer::from_json(model, checkpoint + ": /tokenizer/model", o);
    tok.eos = t->token(t->eos_id());
    if (info.bos_id >= 0) tok.bos = t->token(int(info.bos_id));
    std::ofstream out(dir / "tokenizer.json", std::ios::binary);
    out.write(model.data(), std::streamsize(model.size()));
    out.close();
    if (!out) throw CheckpointError((dir / "tokenizer.json").string() + ": cannot write");
    files.push_back("tokenizer.json");
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  } else {
    tok.eos = "</s>";
    write_json(dir / "tokenizer.json", bytes_tokenizer_json(tok.eos));
    files.push_back("tokenizer.json");
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  }
  // Documents are trained without BOS and with EOS after their text: a
  // prompt is encoded as it is, nothing added.
  cfg["add_bos_token"] = false;
  cfg["add_eos_token"] = false;
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["model_max_length"] = deck.train.max_seq_len;
  ordered_json special = ordered_json::object();
  for (const auto& [key, piece] : {std::pair<const char*, std::string>{"bos_token", tok.bos}, {"eos_token", tok.eos},
                                   {"unk_token", tok.unk}})
    if (!piece.empty()) {
      cfg[key] = piece;
      special[key] = piece;
    }
  write_json(dir / "tokenizer_config.json", cfg);
  write_json(dir / "special_tokens_map.json", special);
  files.push_back("tokenizer_config.json");
  files.push_back("special_tokens_map.json");
  return files;
}

struct Planned {
  std::string wlb_name;
  TensorSpec spec;        ///< HF name, dtype, exported shape
  std::uint64_t bytes;    ///< in the file
};

std::string shard_name(int k, int n) {
  char b[64];
  std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", k, n);
  return b;
}

/// Greedy shards in the model's tensor order, each at most max_bytes of
/// tensor data (a larger tensor gets a shard of its own), as HF's
/// save_pretrained does.
std::vector<std::vector<Planned>> plan_shards(const std::vector<Planned>& all, std::uint64_t max_bytes) {
  std::vector<std::vector<Planned>> shards;
  std::uint64_t in_last = 0;
  for (const auto& t : all) {
    if (shards.empty() || (in_last > 0 && in_last + t.bytes > max_bytes)) {
      shards.emplace_back();
      in_last = 0;
    }
    shards.back().push_back(t);
    in_last += t.bytes;
  }
  return shards;
}

/// outdir must not exist, or be an empty directory.
void check_outdir(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  if (!fs::is_directory(out, ec))
    throw CheckpointError("export-hf: " + out.string() + " exists and is not a directory");
  if (!fs::is_empty(out, ec))
    throw CheckpointError("export-hf: " + out.string() +
                          " is not empty (give a new directory: an export never mixes its files with others)");
}

}  // namespace

ExportReport export_llama(const std::string& checkpoint, const std::string& outdir, const ExportOptions& opts) {
  const io::CheckpointInfo info = io::read_checkpoint_info(checkpoint);
  if (info.tokenizer.empty())
    throw CheckpointError(checkpoint +
                          ": stores no tokenizer (written by an older wlb4d): its vocabulary padding and special ids "
                          "are unknown; resume it for one step with this version to write a checkpoint that has them");
  const core::Config deck = core::parse_deck_text(info.deck);
  const fs::path out(outdir);
  check_outdir(out);
  const fs::path tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec)
    throw CheckpointError("export-hf: cannot create " + tmp.string() + ": " + ec.message());
  try {
    ExportReport rep;
    rep.outdir = outdir;
    rep.vocab = info.tokenizer_vocab;
    rep.padded_vocab = info.vocab;
    std::vector<Planned> all;
    for (const auto& p : core::param_shapes(info.model, info.vocab)) {
      auto shape = p.global_shape;
      if (p.name == "embed.weight" || p.name == "lm_head.weight") shape[0] = info.tokenizer_vocab;
      Planned t{p.name, {hf_tensor_name(p.name), opts.dtype, shape}, 0};
      t.bytes = tensor_bytes(opts.dtype, shape);
      all.push_back(std::move(t));
    }
    const auto shards = plan_shards(all, opts.max_shard_bytes);
    rep.shards = int(shards.size());
    ordered_json weight_map = ordered_json::object();
    for (std::size_t k = 0; k < shards.size(); ++k) {
      const std::string file = shards.size() == 1 ? "model.safetensors" : shard_name(int(k) + 1, int(shards.size()));
      std::vector<TensorSpec> specs;
      for (const auto& t : shards[k]) specs.push_back(t.spec);
      SafetensorsWriter w((tmp / file).string(), specs, {{"format", "pt"}});
      for (const auto& t : shards[k]) {
        std::vector<float> x = io::read_model_tensor(checkpoint, t.wlb_name);
        rep.largest_tensor_bytes = std::max<std::uint64_t>(rep.largest_tensor_bytes, x.size() * sizeof(float));
        x.resize(std::size_t(numel(t.spec.shape)));  // embed/lm_head: the leading tokenizer_vocab rows
        w.write(t.spec.name, x.data(), x.size());
        rep.tensor_bytes += t.bytes;
        weight_map[t.spec.name] = file;
      }
      w.finish();
      rep.files.push_back(file);
    }
    if (shards.size() > 1) {
      ordered_json index;
      index["metadata"] = {{"total_size", rep.tensor_bytes}};
      index["weight_map"] = weight_map;
      write_json(tmp / "model.safetensors.index.json", index);
      rep.files.push_back("model.safetensors.index.json");
    }
    write_json(tmp / "config.json", llama_config(info, deck, opts.dtype));
    ordered_json gen;
    gen["_from_model_config"] = true;
    gen["bos_token_id"] = id_or_null(info.bos_id);
    gen["eos_token_id"] = id_or_null(info.eos_id);
    write_json(tmp / "generation_config.json", gen);
    rep.files.push_back("config.json");
    rep.files.push_back("generation_config.json");
    for (auto& f : write_tokenizer(checkpoint, info, deck, tmp)) rep.files.push_back(std::move(f));
    // An empty outdir (allowed) is replaced by the complete export.
    if (fs::exists(out, ec)) fs::remove(out, ec);
    fs::rename(tmp, out, ec);
    if (ec) throw CheckpointError("export-hf: cannot rename " + tmp.string() + " to " + outdir + ": " + ec.message());
    return rep;
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace wlb::hf

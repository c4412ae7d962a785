// A Hugging Face Llama directory as a weights-only wlb4d checkpoint. See llama_import.hpp.
#include "wlb4d/hf/llama_import.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/core/param_shapes.hpp"
#include "wlb4d/data/byte_level_bpe.hpp"
#include "wlb4d/data/tokenizer.hpp"
#include "wlb4d/hf/llama_export.hpp"
#include "wlb4d/hf/safetensors.hpp"
#include "wlb4d/io/checkpoint.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

namespace wlb::hf {

namespace fs = std::filesystem;
using core::CheckpointError;
using nlohmann::json;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw CheckpointError(p.string() + ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json read_json(const fs::path& p) {
  try {
    return json::parse(read_file(p));
  } catch (const json::exception& e) {
    throw CheckpointError(p.string() + ": not valid JSON (" + e.what() + ")");
  }
}

/// The LlamaConfig fields wlb4d's model has, checked (llama_import.hpp).
class ConfigReader {
 public:
  explicit ConfigReader(const fs::path& dir) : path_((dir / "config.json").string()), j_(read_json(dir / "config.json")) {
    if (!j_.is_object()) fail("", "is not a JSON object");
  }
  [[noreturn]] void fail(const std::string& field, const std::string& rule) const {
    throw CheckpointError(path_ + (field.empty() ? ": " : ": " + field + " ") + rule);
  }
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  std::int64_t integer(const char* k, std::int64_t dflt = -1) const {
    if (!has(k)) {
      if (dflt < 0) fail(k, "is missing (required)");
      return dflt;
    }
    if (!j_[k].is_number_integer() || j_[k].get<std::int64_t>() < 1 || j_[k].get<std::int64_t>() > (1LL << 31) - 1)
      fail(k, "= " + j_[k].dump() + " is not a positive integer below 2^31");
    return j_[k].get<std::int64_t>();
  }
  double number(const char* k, double dflt) const {
    if (!has(k)) return dflt;
    if (!j_[k].is_number() || !(j_[k].get<double>() > 0)) fail(k, "= " + j_[k].dump() + " is not a positive number");
    return j_[k].get<double>();
  }
  bool flag(const char* k, bool dflt) const {
    if (!has(k)) return dflt;
    if (!j_[k].is_boolean()) fail(k, "= " + j_[k].dump() + " is not true or false");
    return j_[k].get<bool>();
  }
  const json& raw(const char* k) const { return j_[k]; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  json j_;
};

core::ModelConfig read_model(const ConfigReader& c, std::int64_t* vocab) {
  if (!c.has("model_type") || c.raw("model_type") != "llama")
    c.fail("model_type", "= " + (c.has("model_type") ? c.raw("model_type").dump() : std::string("(missing)")) +
                             " is not \"llama\" (wlb4d trains Llama-architecture models)");
  if (c.has("architectures")) {
    const auto& a = c.raw("architectures");
    if (!a.is_array() || std::find(a.begin(), a.end(), "LlamaForCausalLM") == a.end())
      c.fail("architectures", "= " + a.dump() + " does not name LlamaForCausalLM");
  }
  if (c.has("hidden_act") && c.raw("hidden_act") != "silu")
    c.fail("hidden_act", "= " + c.raw("hidden_act").dump() + " is not supported (wlb4d's MLP is SwiGLU with SiLU)");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (c.flag(bias, false)) c.fail(bias, "= true is not supported (wlb4d's linear layers have no bias)");
  core::ModelConfig m;
  m.layers = int(c.integer("num_hidden_layers"));
  m.d_model = int(c.integer("hidden_size"));
  m.heads = int(c.integer("num_attention_heads"));
  m.kv_heads = int(c.integer("num_key_value_heads", m.heads));
  m.ffn_hidden = int(c.integer("intermediate_size"));
  m.norm_eps = c.number("rms_norm_eps", 1e-6);
  m.rope_theta = c.number("rope_theta", 10000.0);
  m.init_std = c.number("initializer_range", 0.02);
  *vocab = c.integer("vocab_size");
  if (m.d_model % m.heads != 0)
    c.fail("hidden_size", "= " + std::to_string(m.d_model) + " is not a multiple of num_attention_heads = " +
                              std::to_string(m.heads));
  if (m.heads % m.kv_heads != 0)
    c.fail("num_key_value_heads", "= " + std::to_string(m.kv_heads) + " does not divide num_attention_heads = " +
                                      std::to_string(m.heads));
  if (c.has("head_dim") && c.integer("head_dim") != m.d_model / m.heads)
    c.fail("head_dim", "= " + c.raw("head_dim").dump() + " differs from hidden_size / num_attention_heads = " +
                           std::to_string(m.d_model / m.heads) + " (wlb4d derives the head size from them)");
  if ((m.d_model / m.heads) % 2 != 0) c.fail("hidden_size", "/ num_attention_heads must be even (RoPE rotates pairs)");
  if (c.has("rope_scaling")) {
    // Llama 3.1/3.2's frequency scaling (HF `_compute_llama3_parameters`);
    // other schemes (linear, dynamic, yarn, longrope) would train a different model.
    const auto& r = c.raw("rope_scaling");
    const std::string type = r.is_object() ? r.value("rope_type", r.value("type", std::string())) : std::string();
    if (type != "llama3")
      c.fail("rope_scaling", "= " + r.dump() + " is not supported (only null or rope_type llama3)");
    const auto num = [&](const char* k) {
      if (!r.contains(k) || !r[k].is_number() || !(r[k].get<double>() > 0))
        c.fail("rope_scaling", std::string("has no positive number '") + k + "' (llama3 scaling needs factor, "
                               "low_freq_factor, high_freq_factor, original_max_position_embeddings)");
      return r[k].get<double>();
    };
    m.rope_scaling = "llama3";
    m.rope_factor = num("factor");
    m.rope_low_freq_factor = num("low_freq_factor");
    m.rope_high_freq_factor = num("high_freq_factor");
    m.rope_original_max_position = int(num("original_max_position_embeddings"));
    if (!(m.rope_high_freq_factor > m.rope_low_freq_factor))
      c.fail("rope_scaling", "high_freq_factor must exceed low_freq_factor");
  }
  m.tie_embeddings = c.flag("tie_word_embeddings", false);
  return m;
}

/// Where each HF tensor lives: model.safetensors, or the index's shards.
std::map<std::string, std::string> weight_files(const fs::path& dir) {
  std::map<std::string, std::string> where;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const json j = read_json(index);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw CheckpointError(index.string() + ": weight_map is missing or not an object");
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw CheckpointError(index.string() + ": weight_map[" + name + "] is not a file name");
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        throw CheckpointError(index.string() + ": weight_map[" + name + "] = '" + f + "' is not a file of " +
                              dir.string());
      where[name] = f;
    }
    return where;
  }
  if (!fs::exists(dir / "model.safetensors"))
    throw CheckpointError(dir.string() + ": neither model.safetensors nor model.safetensors.index.json");
  return {};  // every tensor in model.safetensors
}

/// tokenizer_config.json's eos_token ("" when absent): a string, or an
/// AddedToken object {"content": ...} in older files. Only a hint for the
/// EOS: an unreadable file leaves the rule to choose, it fails no import.
std::string config_eos_token(const fs::path& dir) {
  const fs::path p = dir / "tokenizer_config.json";
  if (!fs::exists(p)) return {};
  json c;
  try {
    c = read_json(p);
  } catch (const CheckpointError&) {
    return {};
  }
  if (!c.is_object()) return {};
  const auto it = c.find("eos_token");
  if (it == c.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"];
  return {};
}

/// A tokenizer.json other than wlb4d's bytes one: stored as hf-bpe when
/// wlb4d reads it (data/byte_level_bpe.hpp), with the EOS tokenizer_config.json
/// names when that is a special added token, else the EOS rule's; otherwise
/// not stored, and the note says why.
void read_bpe_tokenizer(const fs::path& dir, io::CheckpointInfo& info, ImportReport& rep) {
  const fs::path path = dir / "tokenizer.json";
  const std::string text = read_file(path);
  std::unique_ptr<data::ByteLevelBpeTokenizer> t;
  std::string why;
  std::vector<data::ByteLevelBpeOptions> tries(1);  // the EOS rule
  if (const std::string eos = config_eos_token(dir); !eos.empty()) {
    tries.insert(tries.begin(), data::ByteLevelBpeOptions{});
    tries.front().eos_token = eos;
  }
  for (const auto& o : tries) {
    if (t) break;
    try {
      t = data::ByteLevelBpeTokenizer::from_json(text, path.string(), o);
    } catch (const core::DataError& e) {
      if (why.empty()) why = e.what();
    }
  }
  if (!t) {
    rep.tokenizer_note = "the tokenizer is not stored: " + why +
                         "; the checkpoint carries none (prepare the data with the same tokenizer)";
    return;
  }
  info.tokenizer = t->name();
  info.tokenizer_model = text;
  info.tokenizer_vocab = t->vocab_size();
  info.eos_id = t->eos_id();
  info.bos_id = t->bos_id();
}

/// The tokenizer to store (llama_import.hpp).
void read_tokenizer(const fs::path& dir, io::CheckpointInfo& info, ImportReport& rep) {
  if (fs::exists(dir / "tokenizer.model")) {
    const std::string model = read_file(dir / "tokenizer.model");
    const auto sp = data::SentencePieceTokenizer::from_serialized(model, (dir / "tokenizer.model").string());
    info.tokenizer = "sentencepiece";
    info.tokenizer_model = model;
    info.tokenizer_vocab = sp->vocab_size();
    info.eos_id = sp->eos_id();
    info.bos_id = sp->bos_id();
  } else if (fs::exists(dir / "tokenizer.json")) {
    const json t = read_json(dir / "tokenizer.json");
    bool bytes = t.contains("model") && t["model"].value("type", "") == "BPE" && t["model"].contains("vocab") &&
                 t["model"]["vocab"].is_object() && t["model"]["vocab"].size() == 256 &&
                 t["model"].contains("merges") && t["model"]["merges"].empty();
    for (int b = 0; bytes && b < 256; ++b) {
      const auto it = t["model"]["vocab"].find(data::byte_level_char(b));
      bytes = it != t["model"]["vocab"].end() && *it == b;
    }
    if (bytes) {
      info.tokenizer = "bytes";
      info.tokenizer_vocab = data::ByteTokenizer::kVocab;
      info.eos_id = data::ByteTokenizer::kEos;
      info.bos_id = -1;
    } else {
      read_bpe_tokenizer(dir, info, rep);
    }
  } else {
    rep.tokenizer_note = dir.string() + " has no tokenizer.model or tokenizer.json; the checkpoint carries none";
  }
  rep.tokenizer = info.tokenizer;
  if (!info.tokenizer.empty() && info.tokenizer_vocab > info.vocab)
    throw CheckpointError(dir.string() + ": the tokenizer has " + std::to_string(info.tokenizer_vocab) +
                          " tokens but config.json's vocab_size is " + std::to_string(info.vocab));
}

std::string model_section(const core::ModelConfig& m, std::int64_t vocab) {
  // fmt's {} is the shortest text that reads back to the same double (1e-05, not 1.0000000000000001e-05).
  std::ostringstream o;
  o << "[model]\n"
    << "layers = " << m.layers << "\n"
    << "d_model = " << m.d_model << "\n"
    << "heads = " << m.heads << "\n"
    << "kv_heads = " << m.kv_heads << "\n"
    << "ffn_hidden = " << m.ffn_hidden << "\n"
    << (m.tie_embeddings ? "tie_embeddings = true\n" : "")
    << "rope_theta = " << fmt::format("{}", m.rope_theta) << "\n"
    << "norm_eps = " << fmt::format("{}", m.norm_eps) << "\n";
  if (m.rope_scaling != "none")
    o << "rope_scaling = " << m.rope_scaling << "\n"
      << "rope_factor = " << fmt::format("{}", m.rope_factor) << "\n"
      << "rope_low_freq_factor = " << fmt::format("{}", m.rope_low_freq_factor) << "\n"
      << "rope_high_freq_factor = " << fmt::format("{}", m.rope_high_freq_factor) << "\n"
      << "rope_original_max_position = " << m.rope_original_max_position << "\n";
  o
    << "vocab_size = " << vocab << "\n";
  return o.str();
}

}  // namespace

ImportReport import_llama(const std::string& hfdir, const std::string& out_h5, const ImportOptions& opts) {
  const fs::path dir(hfdir);
  if (!fs::is_directory(dir)) throw CheckpointError(hfdir + ": not a directory (a Hugging Face model directory)");
  if (fs::exists(out_h5)) throw CheckpointError(out_h5 + ": exists (import-hf never overwrites a checkpoint)");
  ImportReport rep;
  const ConfigReader cfg(dir);
  rep.model = read_model(cfg, &rep.hf_vocab);
  rep.vocab = opts.vocab_size > 0 ? opts.vocab_size : rep.hf_vocab;
  if (rep.vocab < rep.hf_vocab)
    throw CheckpointError("--vocab-size " + std::to_string(rep.vocab) + " is smaller than " + cfg.path() +
                          "'s vocab_size = " + std::to_string(rep.hf_vocab));
  io::CheckpointInfo info;
  info.model = rep.model;
  info.vocab = rep.vocab;
  info.dataset_identity = "imported from Hugging Face directory " + fs::absolute(dir).string();
  core::Config deck;
  deck.model = rep.model;
  deck.model.vocab_size = int(rep.vocab);
  // The context it was trained for: export writes it back as max_position_embeddings.
  deck.train.max_seq_len = int(cfg.integer("max_position_embeddings", 2048));
  info.deck = core::to_ini(deck);
  read_tokenizer(dir, info, rep);
  rep.model_section = model_section(rep.model, rep.vocab);

  // Every file's tensors, checked against the model before anything is written.
  const auto where = weight_files(dir);
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  const auto file_of = [&](const std::string& hf_name) -> SafetensorsFile& {
    std::string f = "model.safetensors";
    if (!where.empty()) {
      const auto it = where.find(hf_name);
      if (it == where.end())
        throw CheckpointError((dir / "model.safetensors.index.json").string() + ": weight_map has no tensor '" +
                              hf_name + "'");
      f = it->second;
    }
    auto& slot = files[f];
    if (!slot) {
      if (!fs::exists(dir / f))
        throw CheckpointError((dir / f).string() + ": missing (named by model.safetensors.index.json)");
      slot = std::make_unique<SafetensorsFile>((dir / f).string());
    }
    return *slot;
  };
  const auto shapes = core::param_shapes(rep.model, rep.hf_vocab);
  std::map<std::string, std::string> used;  // HF name -> file
  for (const auto& p : shapes) {
    const std::string hf = hf_tensor_name(p.name);
    SafetensorsFile& f = file_of(hf);
    const TensorInfo* t = f.find(hf);
    if (!t) throw CheckpointError(f.path() + ": has no tensor '" + hf + "' (the model needs it as " + p.name + ")");
    if (t->shape != p.global_shape)
      throw CheckpointError(f.path() + ": tensor '" + hf + "' has shape " + io::shape_string(t->shape) + " but " +
                            cfg.path() + " implies " + io::shape_string(p.global_shape));
    used[hf] = f.path();
  }
  for (auto& [name, file] : files)
    for (const auto& t : file->tensors())
      // Ignored as transformers ignores them: buffers of older exports, and
      // a stored lm_head.weight of a tied model (the head is the embedding).
      if (!used.count(t.name) && t.name.find("rotary_emb.inv_freq") == std::string::npos &&
          !(rep.model.tie_embeddings && t.name == "lm_head.weight"))
        throw CheckpointError(file->path() + ": tensor '" + t.name +
                              "' is not part of wlb4d's Llama (biases, other architectures): refusing a partial import");
  rep.files = int(files.size());

  io::save_weights_checkpoint(out_h5, info, [&](const std::string& name, const std::vector<std::int64_t>& shape,
                                                std::vector<float>& out) {
    const std::string hf = hf_tensor_name(name);
    out = file_of(hf).read(hf);
    rep.largest_tensor_bytes = std::max<std::uint64_t>(rep.largest_tensor_bytes, out.size() * sizeof(float));
    out.resize(std::size_t(shape[0] * (shape.size() > 1 ? shape[1] : 1)), 0.0f);  // zero padding rows
  });
  return rep;
}

}  // namespace wlb::hf

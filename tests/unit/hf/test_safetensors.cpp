// safetensors reader/writer and the fp32 <-> bf16/f16 conversions, checked
// against the format's documentation (bytes built by hand here), known bit
// patterns, an exhaustive round trip of every 16-bit pattern, and the
// nearest-value property of rounding (an independent statement of RNE).
#include "test_util.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/param_shapes.hpp"
#include "wlb4d/hf/llama_export.hpp"
#include "wlb4d/hf/safetensors.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

namespace {

using namespace wlb;
using hf::Dtype;
namespace fs = std::filesystem;

float f(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

TEST(SafetensorsDtype, Bf16KnownPatternsRoundToNearestEven) {
  EXPECT_EQ(hf::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(hf::float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(hf::float_to_bf16(f(0x3f808000)), 0x3f80);  // 1 + 2^-8: tie, stays even
  EXPECT_EQ(hf::float_to_bf16(f(0x3f818000)), 0x3f82);  // 1 + 3*2^-8: tie, up to even
  EXPECT_EQ(hf::float_to_bf16(f(0x3f808001)), 0x3f81);  // just above the tie
  EXPECT_EQ(hf::float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(hf::float_to_bf16(f(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds to inf, as torch does
  EXPECT_TRUE(std::isnan(hf::bf16_to_float(hf::float_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(hf::bf16_to_float(hf::float_to_bf16(f(0x7f800001)))));  // a NaN whose top bits look like inf
}

TEST(SafetensorsDtype, F16KnownPatterns) {
  EXPECT_EQ(hf::float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(hf::float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(hf::float_to_f16(65504.0f), 0x7bff);   // largest finite
  EXPECT_EQ(hf::float_to_f16(65519.0f), 0x7bff);   // below the midpoint to 65536
  EXPECT_EQ(hf::float_to_f16(65520.0f), 0x7c00);   // the midpoint: ties to even = inf
  EXPECT_EQ(hf::float_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(hf::float_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(hf::float_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: tie to even (0)
  EXPECT_EQ(hf::float_to_f16(std::ldexp(3.0f, -26)), 0x0001);  // 0.75 of it: up
  EXPECT_EQ(hf::float_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 of it: tie, up to even
  EXPECT_EQ(hf::float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);       // tie, stays even
  EXPECT_EQ(hf::float_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);       // tie, up to even
  EXPECT_EQ(hf::float_to_f16(std::ldexp(1023.5f, -24)), 0x0400);           // subnormal rounding carries to normal
  EXPECT_EQ(hf::float_to_f16(-std::ldexp(1.0f, -30)), 0x8000);             // signed zero
  EXPECT_EQ(hf::float_to_f16(-INFINITY), 0xfc00);
  EXPECT_TRUE(std::isnan(hf::f16_to_float(hf::float_to_f16(NAN))));
  EXPECT_EQ(hf::f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(hf::f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(hf::f16_to_float(0x3555), 0.25f + 0.25f * float(0x155) / 1024.0f);
}

TEST(SafetensorsDtype, EveryPatternRoundTripsAndRoundingIsToTheNearest) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float x16 = hf::f16_to_float(std::uint16_t(h)), xb = hf::bf16_to_float(std::uint16_t(h));
    if (!std::isnan(x16)) {
      ASSERT_EQ(hf::float_to_f16(x16), h) << std::hex << h;
    }
    if (!std::isnan(xb)) {
      ASSERT_EQ(hf::float_to_bf16(xb), h) << std::hex << h;
    }
  }
  // Nearest: no other representable value lies closer (in double, exactly).
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> expo(-30, 16);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(mant(rng), expo(rng));
    const auto check = [&](std::uint16_t h, float (*to)(std::uint16_t)) {
      const double e = std::fabs(double(to(h)) - double(x));
      if (std::isinf(to(h))) return;
      for (int d : {-1, 1}) {
        const std::uint16_t n = std::uint16_t(h + d);
        const double v = to(n);
        if (std::isnan(v) || std::isinf(v) || (std::signbit(v) != std::signbit(to(h)) && v != 0)) continue;
        ASSERT_LE(e, std::fabs(v - double(x))) << x;
      }
    };
    check(hf::float_to_f16(x), hf::f16_to_float);
    check(hf::float_to_bf16(x), hf::bf16_to_float);
  }
}

// ---------------------------------------------------------------- files

std::string tmpfile(const std::string& stem) { return test::unique_name("safetensors_" + stem, ".safetensors"); }

void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}
void put_f32(std::string& s, float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  for (int i = 0; i < 4; ++i) s.push_back(char((u >> (8 * i)) & 0xff));
}
std::string file_of(const std::string& header, const std::string& data) {
  std::string s;
  put_u64(s, header.size());
  return s + header + data;
}
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

TEST(Safetensors, ReadsAFileBuiltByHandFromTheFormat) {
  // Header order differs from buffer order; a BF16, an F16 and an F32 tensor
  // and an I64 one (listed, not converted).
  std::string data;
  put_f32(data, 1.5f);  // "b" F32 [2] at 0..8
  put_f32(data, -3.0f);
  data += std::string("\x80\x3f\x00\xc0", 4);  // "a" BF16 [2]: 1.0, -2.0 at 8..12
  data += std::string("\x00\x3c", 2);          // "c" F16 [] : 1.0 at 12..14
  data += std::string(8, '\0');                // "i" I64 [1] at 14..22
  const std::string header =
      R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},"__metadata__":{"format":"pt"},)"
      R"("c":{"dtype":"F16","shape":[],"data_offsets":[12,14]},"b":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
      R"("i":{"dtype":"I64","shape":[1],"data_offsets":[14,22]}})";
  const std::string path = tmpfile("hand");
  write_file(path, file_of(header, data));
  hf::SafetensorsFile st(path);
  ASSERT_EQ(st.tensors().size(), 4u);
  EXPECT_EQ(st.tensors()[0].name, "b");  // data order
  EXPECT_EQ(st.metadata().at("format"), "pt");
  EXPECT_EQ(st.read("a"), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(st.read("b"), (std::vector<float>{1.5f, -3.0f}));
  EXPECT_EQ(st.read("c"), (std::vector<float>{1.0f}));
  EXPECT_EQ(st.find("b")->shape, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(st.find("nope"), nullptr);
  try {
    st.read("i");
    FAIL() << "an I64 tensor was converted";
  } catch (const core::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'i' has dtype I64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(st.read("nope"), core::CheckpointError);
  fs::remove(path);
}

TEST(Safetensors, WriterRoundTripsEveryDtypeAndPadsTheHeader) {
  const std::string path = tmpfile("rt");
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> w(6 * 7), v(5), s{2.5f};
  for (auto& x : w) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  {
    hf::SafetensorsWriter wr(path,
                             {{"w", Dtype::BF16, {6, 7}}, {"v", Dtype::F16, {5}}, {"s", Dtype::F32, {}},
                              {"empty", Dtype::F32, {0, 3}}},
                             {{"format", "pt"}});
    wr.write("w", w.data(), w.size());
    wr.write("v", v.data(), v.size());
    wr.write("s", s.data(), 1);
    wr.write("empty", nullptr, 0);
    EXPECT_FALSE(fs::exists(path));  // only the .tmp until finish
    wr.finish();
  }
  ASSERT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  EXPECT_EQ(len[0] % 8, 0);  // the buffer starts 8-byte aligned
  hf::SafetensorsFile st(path);
  const auto rw = st.read("w"), rv = st.read("v");
  for (std::size_t i = 0; i < w.size(); ++i) EXPECT_EQ(rw[i], hf::bf16_to_float(hf::float_to_bf16(w[i])));
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(rv[i], hf::f16_to_float(hf::float_to_f16(v[i])));
  EXPECT_EQ(st.read("s"), s);
  EXPECT_TRUE(st.read("empty").empty());
  EXPECT_EQ(st.find("w")->dtype, "BF16");
  EXPECT_EQ(st.find("w")->end - st.find("w")->begin, hf::tensor_bytes(Dtype::BF16, {6, 7}));
  fs::remove(path);
}

TEST(Safetensors, AnUnfinishedOrMisusedWriterLeavesNoFile) {
  const std::string path = tmpfile("abandon");
  std::vector<float> x(4, 1.0f);
  {
    hf::SafetensorsWriter wr(path, {{"a", Dtype::F32, {4}}, {"b", Dtype::F32, {4}}}, {});
    EXPECT_THROW(wr.write("b", x.data(), 4), core::InternalError);  // out of order
    EXPECT_THROW(wr.write("a", x.data(), 3), core::InternalError);  // wrong count
    wr.write("a", x.data(), 4);
    EXPECT_THROW(wr.finish(), core::InternalError);  // "b" missing
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_THROW(hf::SafetensorsWriter(path, {{"a", Dtype::F32, {1}}, {"a", Dtype::F32, {1}}}, {}),
               core::CheckpointError);
  EXPECT_THROW(hf::SafetensorsWriter(path, {{"a", Dtype::F32, {-1}}}, {}), core::CheckpointError);
  EXPECT_THROW(hf::SafetensorsWriter("/no/such/dir/x.safetensors", {}, {}), core::CheckpointError);
}

struct Bad {
  const char* what;
  std::string bytes;
  const char* message;
};

TEST(Safetensors, EveryMalformedFileIsRefusedWithItsRule) {
  std::string two;
  put_f32(two, 1.0f);
  put_f32(two, 2.0f);
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string huge;
  put_u64(huge, 1ULL << 40);
  const std::vector<Bad> cases = {
      {"shorter than 8 bytes", "abc", "too short"},
      {"header length beyond the file", huge + "{}", "header length 1099511627776 exceeds the file"},
      {"header not JSON", file_of("{not json", ""), "not valid JSON"},
      {"header not an object", file_of("[1,2]", ""), "not a JSON object"},
      {"duplicate name", file_of(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                 R"("t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", two),
       "names tensor 't' twice"},
      {"entry without dtype", file_of(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", two), "needs dtype"},
      {"unknown dtype", file_of(R"({"t":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", two),
       "unknown dtype 'F33'"},
      {"negative dimension", file_of(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", two),
       "not a non-negative integer"},
      {"offsets that disagree with the shape",
       file_of(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", two), "needs 12"},
      {"offsets reversed", file_of(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", two),
       "end before they begin"},
      {"a gap", file_of(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", two), "gap"},
      {"an overlap", file_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", two), "overlap"},
      {"truncated data", file_of(ok, two.substr(0, 6)), "(truncated)"},
      {"trailing bytes", file_of(ok, two + "xx"), "(trailing bytes)"},
      {"metadata not strings", file_of(R"({"__metadata__":{"format":1}})", ""), "is not a string"},
  };
  for (const auto& c : cases) {
    const std::string path = tmpfile("bad");
    write_file(path, c.bytes);
    try {
      hf::SafetensorsFile st(path);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const core::CheckpointError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << c.what << ": " << m;
      EXPECT_NE(m.find(c.message), std::string::npos) << c.what << ": " << m;
    }
    fs::remove(path);
  }
  EXPECT_THROW(hf::SafetensorsFile("no/such.safetensors"), core::CheckpointError);
}

// ---------------------------------------------------------------- HF names

TEST(HfLlamaNames, EveryParameterHasADistinctTransformersName) {
  const auto shapes = core::param_shapes(test::tiny_model(3), 50);
  std::set<std::string> names;
  for (const auto& p : shapes) EXPECT_TRUE(names.insert(hf::hf_tensor_name(p.name)).second) << p.name;
  EXPECT_EQ(hf::hf_tensor_name("embed.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(hf::hf_tensor_name("layers.2.attn.wk"), "model.layers.2.self_attn.k_proj.weight");
  EXPECT_EQ(hf::hf_tensor_name("layers.0.mlp.w_down"), "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(hf::hf_tensor_name("layers.1.mlp_norm.weight"), "model.layers.1.post_attention_layernorm.weight");
  EXPECT_EQ(hf::hf_tensor_name("final_norm.weight"), "model.norm.weight");
  EXPECT_EQ(hf::hf_tensor_name("lm_head.weight"), "lm_head.weight");
  EXPECT_THROW(hf::hf_tensor_name("layers.0.attn.bias"), core::InternalError);
}

}  // namespace

// TensorBoard event files and the Chrome trace JSON, checked against their
// documented formats: CRC-32C on RFC 3720 §B.4's vectors and the usual check
// value, TFRecord framing byte by byte, Event protobufs against bytes
// written out by hand from the field numbers and wire types, the writer's
// file and its errors; the trace JSON's metadata, slices and file naming.
#include "wlb4d/core/error.hpp"
#include "wlb4d/io/chrome_trace.hpp"
#include "wlb4d/io/tensorboard.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
using namespace wlb;

namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(char(std::uint8_t(x)));
  return s;
}
std::uint32_t crc_of(const std::string& s) { return io::crc32c(s.data(), s.size()); }
std::uint64_t le(const std::string& s, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t(std::uint8_t(s[at + std::size_t(i)])) << (8 * i);
  return v;
}
std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
const std::string kScratch = "tb_test_" + std::to_string(::getpid());
// Removes this run's scratch folder when the test program ends.
struct ScratchCleanup {
  ~ScratchCleanup() {
    std::error_code ec;
    fs::remove_all(kScratch, ec);
  }
} cleanup;
std::string scratch(const std::string& name) {
  const std::string d = kScratch + "/" + name;
  fs::remove_all(d);
  return d;
}

}  // namespace

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);  // the CRC catalogue's check value
  // RFC 3720 §B.4 (iSCSI): 32 bytes of 0x00, of 0xFF, incrementing, decrementing.
  std::string zeros(32, '\0'), ones(32, char(0xFF)), inc, dec;
  for (int i = 0; i < 32; ++i) {
    inc.push_back(char(i));
    dec.push_back(char(31 - i));
  }
  EXPECT_EQ(crc_of(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc_of(ones), 0x62A8AB43u);
  EXPECT_EQ(crc_of(inc), 0x46DD794Eu);
  EXPECT_EQ(crc_of(dec), 0x113FDB5Cu);
  EXPECT_EQ(crc_of(""), 0u);
  // Continuation: crc32c(a + b) from crc32c(a).
  EXPECT_EQ(io::crc32c("56789", 5, io::crc32c("1234", 4)), 0xE3069283u);
}

TEST(Crc32c, MaskIsTFRecords) {
  const std::uint32_t c = crc_of("123456789");
  EXPECT_EQ(io::masked_crc32c("123456789", 9), std::uint32_t(((c >> 15) | (c << 17)) + 0xa282ead8u));
  // Worked by hand: c = 0xE3069283, rotated right by 15 = 0x2507C60D, + 0xa282ead8 = 0xC78AB0E5.
  EXPECT_EQ(io::masked_crc32c("123456789", 9), 0xC78AB0E5u);
}

TEST(TFRecord, FramingLayout) {
  const std::string payload = "hello, event";
  const std::string r = io::tfrecord(payload);
  ASSERT_EQ(r.size(), 8 + 4 + payload.size() + 4);
  EXPECT_EQ(le(r, 0, 8), payload.size());
  EXPECT_EQ(le(r, 8, 4), io::masked_crc32c(r.data(), 8));
  EXPECT_EQ(r.substr(12, payload.size()), payload);
  EXPECT_EQ(le(r, 12 + payload.size(), 4), io::masked_crc32c(payload.data(), payload.size()));
  // The empty payload is a legal record.
  EXPECT_EQ(io::tfrecord("").size(), 16u);
}

TEST(EventProto, FileVersionBytes) {
  // wall_time = 1.5: key 0x09 (field 1, fixed64), IEEE 754 LE 00..00 F8 3F;
  // file_version: key 0x1A (field 3, length-delimited), 13, "brain.Event:2".
  const std::string want = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, 0x1A, 13}) + "brain.Event:2";
  EXPECT_EQ(io::event_file_version(1.5), want);
}

TEST(EventProto, ScalarsBytes) {
  // Event{wall_time 1.5, step 300, summary{value{tag "a", simple_value 2.0}, value{tag "bc", -0.5}}}
  // step: key 0x10 (field 2, varint), 300 = AC 02; summary: key 0x2A (field 5).
  // Value: 0A len tag | 15 float LE (2.0f = 00 00 00 40, -0.5f = 00 00 00 BF).
  const std::string v1 = bytes({0x0A, 1}) + "a" + bytes({0x15, 0, 0, 0, 0x40});
  const std::string v2 = bytes({0x0A, 2}) + "bc" + bytes({0x15, 0, 0, 0, 0xBF});
  const std::string summary = bytes({0x0A, int(v1.size())}) + v1 + bytes({0x0A, int(v2.size())}) + v2;
  const std::string want =
      bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, 0x10, 0xAC, 0x02, 0x2A, int(summary.size())}) + summary;
  EXPECT_EQ(io::event_scalars(1.5, 300, {{"a", 2.0}, {"bc", -0.5}}), want);
}

TEST(EventProto, SessionStartBytes) {
  // session_log: key 0x3A (field 7, length-delimited), SessionLog{status (field 1, varint) = START (1)}.
  const std::string want = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, 0x10, 0x07, 0x3A, 0x02, 0x08, 0x01});
  EXPECT_EQ(io::event_session_start(1.5, 7), want);
}

TEST(EventProto, LongTagUsesAMultiByteLength) {
  const std::string tag(200, 'x');  // length 200 = varint C8 01
  const std::string e = io::event_scalars(0.0, 1, {{tag, 1.0}});
  EXPECT_NE(e.find(bytes({0x0A, 0xC8, 0x01}) + tag), std::string::npos);
}

TEST(TensorBoardWriter, CreatesTheDirectoryAndAFileOfRecords) {
  const std::string dir = scratch("a/b/c");
  std::string path;
  {
    io::TensorBoardWriter w(dir);
    path = w.path();
    w.session_start(1);
    w.add_scalars(1, {{"train/loss", 3.25}});
    // Flushed after every record: readable before the writer closes.
    const std::string now = slurp(path);
    EXPECT_EQ(now.size(), io::tfrecord(io::event_file_version(0)).size() +
                              io::tfrecord(io::event_session_start(0, 1)).size() +
                              io::tfrecord(io::event_scalars(0, 1, {{"train/loss", 3.25}})).size());
  }
  EXPECT_TRUE(fs::is_directory(dir));
  const std::string name = fs::path(path).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(name.substr(name.size() - 6), ".wlb4d");
  EXPECT_NE(name.find("." + std::to_string(::getpid()) + ".wlb4d"), std::string::npos) << name;
  // The records decode back: lengths and CRCs chain to the end of the file.
  const std::string f = slurp(path);
  std::size_t pos = 0, n = 0;
  while (pos < f.size()) {
    const std::uint64_t len = le(f, pos, 8);
    ASSERT_LE(pos + 16 + len, f.size());
    EXPECT_EQ(le(f, pos + 8, 4), io::masked_crc32c(f.data() + pos, 8));
    EXPECT_EQ(le(f, pos + 12 + len, 4), io::masked_crc32c(f.data() + pos + 12, len));
    pos += 16 + len;
    ++n;
  }
  EXPECT_EQ(n, 3u);
  // The first record's Event: wall_time (key 09), then file_version (key 1A).
  EXPECT_EQ(f[12], char(0x09));
  EXPECT_EQ(f.substr(12 + 9, 2), bytes({0x1A, 13}));
}

TEST(TensorBoardWriter, UnusableDirectoryNamesTheKeyAndTheCause) {
  const std::string base = scratch("errs");
  fs::create_directories(base);
  std::ofstream(base + "/afile") << "x";
  try {
    io::TensorBoardWriter w(base + "/afile/tb");
    FAIL() << "no error";
  } catch (const core::DataError& e) {
    EXPECT_EQ(std::string(e.what()), "log.tensorboard_dir='" + base +
                                         "/afile/tb': must be a directory rank 0 can create and write: '" + base +
                                         "/afile' is not a directory");
  }
  try {
    io::TensorBoardWriter w(base + "/afile");
    FAIL() << "no error";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("log.tensorboard_dir='" + base + "/afile': must be a directory"),
              std::string::npos)
        << e.what();
  }
}

TEST(TensorBoardWriter, StartUpCheckCreatesTheDirectoryAndLeavesNoFile) {
  const auto self = comm::Communicator::self();
  const std::string dir = scratch("check/x/y");
  io::check_tensorboard_dir(dir, self);
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));  // the probe file is gone, no event file yet
  std::ofstream(dir + "/f") << "x";
  try {
    io::check_tensorboard_dir(dir + "/f", self);
    FAIL() << "no error";
  } catch (const core::DataError& e) {
    EXPECT_EQ(std::string(e.what()),
              "log.tensorboard_dir='" + dir + "/f': must be a directory rank 0 can create and write: '" + dir +
                  "/f' is not a directory");
  }
  EXPECT_NO_THROW(io::check_tensorboard_dir("", self));  // off
}

TEST(ChromeTrace, ProcessesTracksAndSlices) {
  const std::string kinds = "F,B,SendAct,RecvAct,SendGrad,RecvGrad,W,tp_comm,cp_comm,plan,data,forward_backward";
  auto row = [](int rank, int kind, int mb, double t0, double t1, int peer = -1) {
    io::TraceRecord r;
    r.step = 4;
    r.rank = rank;
    r.stage = rank;
    r.kind = kind;
    r.micro_batch = mb;
    r.virtual_stage = mb >= 0 ? 0 : -1;
    r.peer = peer;
    r.t0 = t0;
    r.t1 = t1;
    return r;
  };
  const std::vector<io::TraceRecord> rows = {row(0, 9, -1, 0.0, 0.001), row(0, 0, 0, 0.002, 0.005),
                                             row(0, 7, 0, 0.003, 0.0035), row(0, 2, 0, 0.005, 0.006, 1),
                                             row(1, 3, 0, 0.0, 0.006, 0), row(1, 11, -1, 0.0, 0.01)};
  io::RunIdentity id;
  id.deck = "d.ini";
  id.layout = "dp=1 pp=2 cp=1 tp=1 schedule=1f1b v=1";
  id.world_size = 2;
  const auto doc = nlohmann::json::parse(io::chrome_trace_json(rows, kinds, {{0, 0, 0, 0, 0}, {1, 0, 1, 0, 0}}, id));
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  EXPECT_EQ(doc["otherData"]["step"], 5);
  EXPECT_EQ(doc["otherData"]["layout"], id.layout);
  std::map<int, std::string> pname;
  std::map<std::pair<int, int>, std::string> tname;
  std::vector<nlohmann::json> x;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") pname[e["pid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "thread_name") tname[{e["pid"], e["tid"]}] = e["args"]["name"];
    if (e["ph"] == "X") x.push_back(e);
  }
  EXPECT_EQ(pname[0], "rank 0 (dp 0, pp 0, cp 0, tp 0)");
  EXPECT_EQ(pname[1], "rank 1 (dp 0, pp 1, cp 0, tp 0)");
  EXPECT_EQ((tname[{0, 1}]), "step phases");
  EXPECT_EQ((tname[{0, 2}]), "pipeline");
  EXPECT_EQ((tname[{0, 3}]), "TP collectives");
  EXPECT_EQ(tname.count({0, 4}), 0u);  // no CP rows: no CP track
  ASSERT_EQ(x.size(), rows.size());
  EXPECT_EQ(x[0]["name"], "plan");
  EXPECT_EQ(x[0]["cat"], "phase");
  EXPECT_EQ(x[0]["tid"], 1);
  EXPECT_FALSE(x[0]["args"].contains("micro_batch"));
  EXPECT_EQ(x[1]["name"], "F");
  EXPECT_EQ(x[1]["cat"], "compute");
  EXPECT_DOUBLE_EQ(x[1]["ts"].get<double>(), 0.002 * 1e6);
  EXPECT_DOUBLE_EQ(x[1]["dur"].get<double>(), 0.005 * 1e6 - 0.002 * 1e6);
  EXPECT_EQ(x[1]["args"]["micro_batch"], 0);
  EXPECT_EQ(x[2]["name"], "tp_comm");
  EXPECT_EQ(x[2]["tid"], 3);
  EXPECT_EQ(x[3]["cat"], "p2p");
  EXPECT_EQ(x[3]["args"]["peer"], 1);
  EXPECT_EQ(x[5]["name"], "forward_backward");
  EXPECT_EQ(x[5]["pid"], 1);
  // A kind without a name is a bug of the caller.
  EXPECT_THROW(io::chrome_trace_json({row(0, 12, -1, 0, 1)}, kinds, {}, id), core::InternalError);
}

TEST(ChromeTrace, WritesAtomicallyAndNamesTheKeyOnFailure) {
  const std::string dir = scratch("json");
  fs::create_directories(dir);
  const std::string p = dir + "/t.trace.json";
  io::write_chrome_trace(p, {}, "F", {}, {});
  EXPECT_TRUE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_TRUE(nlohmann::json::parse(slurp(p)).is_object());
  try {
    io::write_chrome_trace(dir + "/no/such/t.json", {}, "F", {}, {});
    FAIL() << "no error";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("log.trace_json='" + dir + "/no/such/t.json': cannot write"),
              std::string::npos)
        << e.what();
  }
}

TEST(ChromeTrace, DefaultPathFollowsTheTimingFile) {
  EXPECT_EQ(io::default_trace_json_path("runs/a/timing.h5"), "runs/a/timing.trace.json");
  EXPECT_EQ(io::default_trace_json_path("t.HDF5"), "t.trace.json");
  EXPECT_EQ(io::default_trace_json_path("runs/v1.2/log"), "runs/v1.2/log.trace.json");
  EXPECT_EQ(io::default_trace_json_path("log.csv"), "log.csv.trace.json");
  EXPECT_EQ(io::default_trace_json_path(""), "");
}

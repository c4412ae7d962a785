// Collective open of a token dataset with the MPI-IO driver: every rank sees
// the same offsets and reads any span independently; schema errors reach all ranks.
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/data/prep.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>

using namespace wlb;
using namespace wlb::data;

namespace {
std::string prepared() {
  static std::string path = [] {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::string p = (std::filesystem::current_path() / "mpi-tiny.h5").string();
    if (rank == 0) {
      PrepOptions o;
      o.inputs = {std::string(WLB4D_SOURCE_DIR) + "/tests/data/tiny.jsonl"};
      o.output = p;
      run_prep(o);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return p;
  }();
  return path;
}
}  // namespace

TEST(TokenDatasetMpi, CollectiveOpenMatchesSerialOpen) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto serial = TokenDataset::open(prepared());
  auto par = TokenDataset::open(prepared(), comm::Communicator::world());
  EXPECT_EQ(par.doc_lengths(), serial.doc_lengths());
  EXPECT_EQ(par.doc_offset(par.num_docs()), serial.num_tokens());
  EXPECT_EQ(par.num_tokens(), serial.num_tokens());
  EXPECT_EQ(par.vocab_size(), 257);
  // Each rank reads different documents (independent reads).
  for (std::int64_t d = rank; d < par.num_docs(); d += size) {
    std::vector<token_t> a(static_cast<std::size_t>(par.doc_length(d))), b(a.size());
    par.read(d, 0, par.doc_length(d), a.data());
    serial.read(d, 0, serial.doc_length(d), b.data());
    EXPECT_EQ(a, b) << "doc " << d;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(TokenDatasetMpi, ErrorsOnEveryRank) {
  EXPECT_THROW(TokenDataset::open("no/such/dataset.h5", comm::Communicator::world()), core::DataError);
  MPI_Barrier(MPI_COMM_WORLD);
}

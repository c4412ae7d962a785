// Asynchronous checkpoints: the writer thread (checkpoint.hpp, AsyncCheckpointWriter).
#include "checkpoint_detail.hpp"

#include "wlb4d/core/clock.hpp"

#include <atomic>
#include <exception>
#include <thread>

namespace wlb::io {

struct AsyncCheckpointWriter::Impl {
  comm::Communicator world;  // a duplicate of the job's world: the thread's own MPI traffic
  std::int32_t layout[4] = {1, 1, 1, 1};
  std::thread thread;
  std::atomic<bool> finished{false};
  Result result;
  // What the thread writes (owned here until the save ends).
  core::CheckpointConfig cc;
  std::vector<TensorRef> tensors;
  TrainState state;
  CheckpointInfo info;

  Impl(comm::Communicator w, const std::int32_t l[4]) : world(std::move(w)) {
    for (int i = 0; i < 4; ++i) layout[i] = l[i];
  }

  void run() {
    const double t0 = core::wall_seconds();
    try {
      result.path = save_checkpoint(cc, world, layout, tensors, state, info, SaveOptions{true, true});
    } catch (const std::exception& e) {
      result.error = e.what();
    } catch (...) {
      result.error = "checkpoint " + checkpoint_path(cc.dir, state.step) + ": the writer thread failed";
    }
    result.seconds = core::wall_seconds() - t0;
    finished.store(true, std::memory_order_release);
  }
};

namespace {
comm::Communicator duplicate(const comm::Communicator& world) {
  auto d = world.split(0, world.rank());  // every rank, same order: MPI_Comm_dup's group on a new context
  if (!d) throw core::CheckpointError("checkpoint.async: cannot duplicate the world communicator");
  return *d;
}
}  // namespace

AsyncCheckpointWriter::AsyncCheckpointWriter(const comm::Communicator& world, const std::int32_t layout[4])
    : impl_(std::make_unique<Impl>(duplicate(world), layout)) {}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  if (impl_ && impl_->thread.joinable()) impl_->thread.join();
}

void AsyncCheckpointWriter::start(const core::CheckpointConfig& cc, std::vector<TensorRef> tensors, TrainState state,
                                  CheckpointInfo info) {
  if (started_) throw core::InternalError("AsyncCheckpointWriter::start with a save in flight (call wait() first)");
  auto& I = *impl_;
  I.cc = cc;
  I.tensors = std::move(tensors);
  I.state = std::move(state);
  I.info = std::move(info);
  I.result = Result{};
  I.result.step = I.state.step;
  I.finished.store(false);
  I.thread = std::thread([&I] { I.run(); });
  started_ = true;
}

bool AsyncCheckpointWriter::done(const comm::Communicator& world) const {
  if (!started_) return false;
  const int mine = impl_->finished.load(std::memory_order_acquire) ? 1 : 0;
  return world.allreduce_value(mine, comm::ReduceOp::Min) == 1;
}

std::optional<AsyncCheckpointWriter::Result> AsyncCheckpointWriter::wait() {
  if (!started_) return std::nullopt;
  impl_->thread.join();
  started_ = false;
  return impl_->result;
}

}  // namespace wlb::io

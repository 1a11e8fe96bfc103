// CapturedStep (optim/captured_step.hpp): warm-up, capture and replay of a step on a stream of
// its own, through the device runtime's graph interface (DeviceRuntime::begin_capture ...).
#include "shardtensor/optim/captured_step.hpp"

#include <exception>

#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#include "shardtensor/runtime/memory.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard {
namespace {
thread_local CapturedStep* t_capturing = nullptr;
}  // namespace

CapturedStep::CapturedStep(Device dev, std::function<void()> step, Options o)
    : dev_(dev), step_(std::move(step)), o_(o) {
  SHARD_CHECK(static_cast<bool>(step_), "CapturedStep", "empty step function");
  SHARD_CHECK(o_.warmup >= 1, "CapturedStep", "warmup must be at least 1 (got {}): the first run pays the "
              "first-call costs (algorithm search, plan caches, lazily created state) that a capture cannot", o_.warmup);
  for (const auto& c : o_.comms) {
    SHARD_CHECK(c != nullptr, "CapturedStep", "Options::comms holds a null communicator");
    if (c->size() > 1 && c->backend() != "nccl" && !dev_.is_cpu()) {
      const std::string why = fmt::format(
          "its communicator '{}' ({} ranks) moves device buffers through the host (ranks sharing a GPU, or no NCCL "
          "backend): a CUDA graph can capture NCCL collectives only",
          c->backend(), c->size());
      SHARD_CHECK(o_.fallback_eager, "CapturedStep", "the step cannot be captured into a CUDA graph: {} "
                  "(Options::fallback_eager runs it eagerly instead)", why);
      eager_reason_ = why;
    }
  }
  if (dev_.is_cpu()) {
    ctx_ = std::make_unique<ExecContext>(dev_);
    ctx_->settings() = current_context(dev_).settings();
    eager_ = true;
    eager_reason_ = "the CPU runs the step eagerly (graphs capture device work)";
    return;
  }
  const auto& rt = exec::cuda_runtime("CapturedStep");
  rt.check_device(dev_.index, "CapturedStep");
  stream_ = rt.create_stream(dev_.index);
  ctx_ = std::make_unique<ExecContext>(dev_, stream_);
  ctx_->settings() = current_context(dev_).settings();
  if (!eager_reason_.empty()) {
    eager_ = true;
  } else if (!rt.supports_graphs()) {
    eager_ = true;
    eager_reason_ = "the device runtime cannot capture graphs (e.g. SHARDTENSOR_CUDA_CACHE=0)";
  }
}

CapturedStep::~CapturedStep() { release(); }

void CapturedStep::release() noexcept {
  if (dev_.is_cpu()) return;
  const auto& rt = exec::cuda_runtime("CapturedStep");
  if (graph_) rt.destroy_graph(graph_);  // waits for the replays
  graph_ = nullptr;
  for (auto& s : scalars_) {
    for (void* ev : s.events)
      if (ev) rt.destroy_event(ev);
    if (s.pinned) rt.deallocate_pinned(s.pinned);
  }
  scalars_.clear();
  {
    ContextGuard on(*ctx_);  // the arena goes back to the cache on this context's stream
    arena_.reset();
  }
  ctx_.reset();
  rt.destroy_stream(stream_, dev_.index);
}

CapturedStep* CapturedStep::capturing(Device dev) noexcept {
  return t_capturing && t_capturing->dev_ == dev ? t_capturing : nullptr;
}

void CapturedStep::run() {
  if (!graph_) {
    if (eager_ || runs_ < o_.warmup) {
      run_eager();
      return;
    }
    capture();
    if (!graph_) {  // gave up (fallback_eager): this call's step runs eagerly
      run_eager();
      return;
    }
  }
  replay();
}

void CapturedStep::run_eager() {
  ContextGuard on(*ctx_);
  step_();
  ++runs_;
}

void CapturedStep::give_up(const std::string& why) {
  if (!o_.fallback_eager)
    SHARD_FAIL("CapturedStep", "the step cannot be captured into a CUDA graph: {} (nothing ran; "
               "Options::fallback_eager runs it eagerly instead)", why);
  eager_ = true;
  eager_reason_ = why;
}

void CapturedStep::capture() {
  SHARD_PROFILE_SCOPE("graph", "step", "capture", nullptr);
  const auto& rt = exec::cuda_runtime("CapturedStep");
  SHARD_CHECK(!t_capturing, "CapturedStep", "a step is already being captured on this thread");
  // Whatever the warm-up queued runs before the capture begins (the graph only orders itself
  // after it on the stream; a failed capture must not leave half the warm-up in flight).
  ctx_->synchronize();
  if (!arena_) {  // outside the capture: never part of the graph's pool
    ContextGuard on(*ctx_);
    arena_ = allocate_bytes(kArenaDoubles * sizeof(double), dev_);
  }
  arena_used_ = 0;
  void* h = rt.begin_capture(stream_, dev_.index);
  std::string failure;
  {
    ContextGuard on(*ctx_);
    t_capturing = this;
    try {
      step_();
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "a non-standard exception";
    }
    t_capturing = nullptr;
  }
  if (failure.empty()) {
    try {
      rt.end_capture(h);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (!failure.empty()) {
    rt.destroy_graph(h);  // ends the capture when the step threw mid-way; frees the pool
    scalars_.clear();
    arena_used_ = 0;
    give_up(failure);
    return;
  }
  graph_ = h;
}

const double* CapturedStep::replay_scalars(std::size_t n, std::function<void(double*)> fill) {
  SHARD_CHECK(t_capturing == this, "CapturedStep::replay_scalars", "called outside this step's capture");
  SHARD_CHECK(n > 0 && fill, "CapturedStep::replay_scalars", "need n > 0 values and a fill function");
  const std::size_t start = (arena_used_ + 7) / 8 * 8;  // 64-byte aligned slots
  SHARD_CHECK(start + n <= kArenaDoubles, "CapturedStep::replay_scalars",
              "the step asks for more than {} live values in all ({} used, {} more)", kArenaDoubles, arena_used_, n);
  Scalars s;
  s.n = n;
  s.fill = std::move(fill);
  s.device = static_cast<double*>(arena_.get()) + start;
  arena_used_ = start + n;
  const double* p = s.device;
  scalars_.push_back(std::move(s));
  return p;
}

void CapturedStep::replay() {
  SHARD_PROFILE_SCOPE("graph", "step", "replay", nullptr);
  const auto& rt = exec::cuda_runtime("CapturedStep");
  for (auto& s : scalars_) {
    if (!s.pinned) {
      s.pinned = static_cast<double*>(rt.allocate_pinned(kRing * s.n * sizeof(double)));
      for (auto& ev : s.events) ev = rt.create_event(dev_.index);
    }
    const int k = s.next;
    s.next = (k + 1) % kRing;
    if (s.recorded[static_cast<std::size_t>(k)]) rt.synchronize_event(s.events[static_cast<std::size_t>(k)]);
    double* slot = s.pinned + static_cast<std::size_t>(k) * s.n;
    s.fill(slot);
    rt.copy(s.device, dev_, slot, Device::cpu(), s.n * sizeof(double), stream_, false);
    rt.record_event(s.events[static_cast<std::size_t>(k)], stream_, dev_.index);
    s.recorded[static_cast<std::size_t>(k)] = true;
  }
  rt.launch_graph(graph_);
  ++runs_;
  ++replays_;
}

const double* replay_scalars(Device dev, std::size_t n, std::function<void(double*)> fill) {
  CapturedStep* c = CapturedStep::capturing(dev);
  return c ? c->replay_scalars(n, std::move(fill)) : nullptr;
}

}  // namespace shard

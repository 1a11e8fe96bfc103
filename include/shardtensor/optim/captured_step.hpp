#pragma once
/// \file captured_step.hpp
/// A training step captured once into a CUDA graph and replayed: the host work of every op
/// (tape, plans, kernel selection, launches) is paid once; each later step is one graph launch.
///
///     auto x = DistTensor<float, 4>::empty(...);        // static input: copy each batch into it
///     DistTensor<float, 0> loss;                         // static output: the replays write it
///     shard::CapturedStep step(dev, [&] {
///       opt.zero_grad();
///       auto l = F::mse_loss(model.forward(Var(x)), Var(y));
///       l.backward();
///       opt.step();
///       loss = l.value();
///     });
///     for (...) { x.local().copy_from(batch.local()); opt.set_lr(sched(s)); step.run(); }
///
/// run() runs the step eagerly for Options::warmup calls (cuDNN's algorithm search, plan caches,
/// the optimiser's lazily created state and every other first-call cost happen there), then
/// captures one call into a graph (recorded, not run) and from then on replays it. All of it on
/// a stream of its own (context()), made the thread's current context for the device while the
/// step runs, with the settings of the context that was current at construction.
///
/// The contract of a captured step, as with torch.cuda.graphs:
/// - The step reads its inputs from tensors that stay alive, at the same addresses, for as long
///   as this object: copy new data into them between runs on the default stream (the default
///   context: the capture stream is a blocking stream, ordered with it both ways; work on a
///   non-blocking stream of your own must be ordered by you). Tensors the step assigns to outer
///   variables (the loss) are the graph's outputs: each replay overwrites them, so copy a value
///   that must be kept (a logged loss) before the next run(). While the capture runs (inside the
///   run() that captures), no other thread may use the default stream of that GPU: CUDA
///   invalidates the capture of a blocking stream then.
/// - Memory the graph uses must not move while it lives: parameters (no Module::to), optimiser
///   state (load_state copies in place), the static tensors.
/// - Every host decision inside the step must be the same on every call (shapes, which
///   parameters have gradients, control flow). Nothing inside may read a device value on the host
///   (a loss printed inside the step, the fp16 loss scaler's overflow check) or synchronise: that
///   fails the capture with a shard::Error naming the cause (or, with Options::fallback_eager,
///   leaves the step eager for good, reason in eager_reason()).
/// - Collectives inside the step must be on NCCL (it can be captured) or on a one-rank
///   communicator. Name the step's communicators in Options::comms (e.g. the mesh's comm()):
///   one that moves device buffers through MPI (ranks sharing a GPU, or no NCCL) is refused at
///   construction, the same on every rank, before anything is captured (a rank that failed a
///   capture half-way through a collective would leave its peers waiting).
/// - Host values that change between steps (the learning rate, Adam's step count) reach the graph
///   through replay_scalars(): the library's optimisers use it, so set_lr() between runs takes
///   effect. A user kernel that takes such a value as a launch argument would see the captured one.
/// - Device memory the graph allocates comes from a private pool kept until this object is
///   destroyed (the replays write it); destroying it waits for the last replay.
///
/// On the CPU (or with a device runtime that cannot capture) run() is the step itself, so code
/// written against CapturedStep runs everywhere; captured() says which happened.
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/device.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard {

class CapturedStep {
 public:
  struct Options {
    /// Eager runs before the capture (at least 1: the first run pays every first-call cost).
    int warmup = 3;
    /// A step that cannot be captured runs eagerly from then on (eager_reason() says why)
    /// instead of throwing.
    bool fallback_eager = false;
    /// The communicators the step's collectives use (checked: NCCL or one rank).
    std::vector<CommPtr> comms;
  };

  CapturedStep(Device dev, std::function<void()> step, Options o);
  CapturedStep(Device dev, std::function<void()> step) : CapturedStep(dev, std::move(step), Options{}) {}
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  /// One step: eager during the warm-up, then the capture followed by the first replay, then
  /// one replay per call. Asynchronous on the device like any op.
  void run();

  /// Whether the step has been captured (run() now replays the graph).
  bool captured() const noexcept { return graph_ != nullptr; }
  /// Non-empty when run() will never capture: the CPU, a runtime without graphs, or the reason a
  /// capture failed (Options::fallback_eager).
  const std::string& eager_reason() const noexcept { return eager_reason_; }
  /// run() calls so far.
  long runs() const noexcept { return runs_; }
  /// Replays so far.
  long replays() const noexcept { return replays_; }
  /// The context the step runs in (its own stream on a GPU).
  ExecContext& context() noexcept { return *ctx_; }
  /// Waits for the work queued by run().
  void synchronize() const { ctx_->synchronize(); }

  /// The CapturedStep capturing on the calling thread for `dev`, or null.
  static CapturedStep* capturing(Device dev) noexcept;

  /// During a capture: `n` doubles on the device, at a fixed address the captured work may
  /// read, filled on the host by `fill` before every replay and copied there ahead of the
  /// graph on its stream (a ring of pinned buffers, so the host never waits for a replay).
  /// `fill` is not called for the capture itself, which runs nothing. At most 256 doubles per
  /// step in all (an arena allocated before the capture; shard::Error past it). `fill` must stay
  /// callable as long as this object (the optimisers capture themselves: keep the optimiser
  /// alive longer than the CapturedStep).
  const double* replay_scalars(std::size_t n, std::function<void(double*)> fill);

 private:
  static constexpr int kRing = 4;
  /// Doubles of the live-values arena: allocated before the capture, outside the graph's pool, so
  /// no tensor of the graph can share its memory (the host writes it between replays).
  static constexpr std::size_t kArenaDoubles = 256;
  struct Scalars {
    std::size_t n = 0;
    std::function<void(double*)> fill;
    double* device = nullptr;      // n doubles in the arena
    double* pinned = nullptr;      // kRing slots of n doubles (created at the first replay)
    std::array<void*, kRing> events{};
    std::array<bool, kRing> recorded{};
    int next = 0;
  };
  void run_eager();
  void capture();
  void replay();
  void give_up(const std::string& why);
  void release() noexcept;

  Device dev_;
  std::function<void()> step_;
  Options o_;
  Stream stream_{};
  std::unique_ptr<ExecContext> ctx_;
  void* graph_ = nullptr;
  bool eager_ = false;
  std::string eager_reason_;
  long runs_ = 0, replays_ = 0;
  std::vector<Scalars> scalars_;
  std::shared_ptr<void> arena_;
  std::size_t arena_used_ = 0;
};

/// The device address of `n` values for captured work, or null when no capture is in progress
/// on this thread for `dev` (then pass the values as usual): CapturedStep::replay_scalars of
/// the capturing step. How an optimiser keeps its learning rate and step count live in a graph.
const double* replay_scalars(Device dev, std::size_t n, std::function<void(double*)> fill);

}  // namespace shard

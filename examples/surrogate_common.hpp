#pragma once
/// \file surrogate_common.hpp
/// What the surrogate examples (unet_surrogate, vit_surrogate, fno_surrogate) share: the training
/// flags (data groups, batch, samples, learning rate, logging, --warmup, --save, --checkpoint /
/// --checkpoint-every / --resume / --stop-after) and their checks, the device choice, the
/// domain-parallel mesh and heat-equation data, and the training loop (AdamW + cosine warm-up,
/// progress lines with throughput and per-rank peak memory, checkpoints, resume, the
/// `steady state:` line (step_timing.hpp: s/step after --warmup, the first step on its own, peak
/// memory) and the final `final_loss=` line).
///
/// The loop reads no value back from the device inside a step: each step's loss stays on the
/// device until the next log step, which reads them all (one synchronisation per --log-every
/// steps, and the same sums in the same order as reading each step).
///
/// Checkpoints (io/checkpoint.hpp): one HDF5 file holding the parameters (sharded ones as global
/// datasets), the AdamW moments, the step and the data order (io::TrainingState ints "data.*",
/// "sched.total"). Training is deterministic given the step: the batch of step s is
/// data.cursor-driven (s mod the number of batches) and the learning rate is the schedule's value
/// at s, so a run resumed at the same rank count and mesh is bit-identical to an uninterrupted
/// one, and at another rank count / mesh agrees to fp32 tolerance.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <shardtensor/io/checkpoint.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "cli_common.hpp"
#include "heat_data.hpp"
#include "step_timing.hpp"

namespace examples::surrogate {

using shard::index_t;
using T = float;

/// The flags both surrogate examples have (besides their model's).
struct TrainArgs {
  cli::CommonArgs common;  // --steps --grid --seed --mesh --device
  std::vector<int> mesh;   // spatial mesh (H x W); default: all ranks on H
  int data = 1;            // data-parallel groups
  index_t batch = 4;       // global batch (split over data groups)
  index_t train_samples = 32;
  double lr = 3e-3;
  int log_every = 10;
  int warmup = timing::kAutoWarmup;  // steps excluded from the steady-state timing (-1: min(3, steps/4))
  bool profile_window = false;       // print the library profiler's table over the timed window
  std::string save;
  std::string checkpoint;    // checkpoint file ("" = none)
  int checkpoint_every = 0;  // also every K steps (0: only at the end)
  bool resume = false;       // continue from --checkpoint
  int stop_after = 0;        // stop once this many steps (in total) are done (0: at --steps)
  std::string precision = "fp32";  // compute / activation dtype: fp32, bf16, fp16 (f32 masters, f32 loss)
  bool cuda_graph = false;         // capture the training step into a CUDA graph (shard::CapturedStep)
};

/// Adds the common and training flags to `app` (CLI11, typed values with ranges).
inline void add_train_flags(CLI::App& app, TrainArgs& a, const cli::CommonLimits& lim) {
  cli::add_common(app, a.common, lim);
  app.add_option("--data", a.data, "data-parallel groups (ranks = data x mesh)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--batch", a.batch, "global batch (a multiple of --data)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{1} << 20))
      ->capture_default_str();
  app.add_option("--samples", a.train_samples, "training pairs (at least --batch)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{1} << 24))
      ->capture_default_str();
  app.add_option("--lr", a.lr, "peak learning rate (AdamW, cosine warm-up over --steps)")
      ->check(CLI::Range(1e-12, 10.0))
      ->capture_default_str();
  app.add_option("--log-every", a.log_every, "print a progress line every K steps")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  timing::add_warmup_flag(app, a.warmup);
  timing::add_profile_flag(app, a.profile_window);
  app.add_option("--save", a.save, "write the trained parameters to FILE (Module::save)");
  app.add_option("--checkpoint", a.checkpoint,
                 "write a checkpoint (parameters, optimiser, step, data order; parallel HDF5, atomic) to FILE at the "
                 "end, and every --checkpoint-every steps");
  app.add_option("--checkpoint-every", a.checkpoint_every, "also checkpoint every K steps (needs --checkpoint)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 1 << 30));
  app.add_flag("--resume", a.resume,
               "continue from --checkpoint FILE's step up to --steps in total, at any rank count and mesh "
               "(bit-identical at the same rank count and mesh)");
  app.add_option("--stop-after", a.stop_after,
                 "stop (checkpointing) once K of the --steps steps are done, as if interrupted; the schedule "
                 "still spans --steps")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 1 << 30));
  app.add_flag("--cuda-graph", a.cuda_graph,
               "capture the whole training step (forward, backward, AdamW) into a CUDA graph after the warm-up "
               "and replay it (shard::CapturedStep; --device cuda; NCCL or one rank, else it runs eagerly and "
               "says why)");
  cli::add_precision(app, a.precision,
                     "activations and compute: fp32, or bf16 / fp16 with f32 master parameters, f32 loss and "
                     "optimiser (fp16 with a dynamic loss scaler); autocast-bf16: an fp32 model whose conv, linear "
                     "and attention compute in bf16 (shard::Autocast)");
}

/// Calls f(tag) with a value of the model dtype --precision names (float, shard::bf16, shard::f16;
/// autocast-bf16: float, the forward then runs under shard::Autocast).
template <class F>
decltype(auto) with_precision(const std::string& precision, F&& f) {
  if (precision == "bf16") return f(shard::bf16{});
  if (precision == "fp16") return f(shard::f16{});
  return f(float{});
}

/// Checks the training flags' combinations against the rank count P (cli::UsageError, exit 2).
inline void validate_train(TrainArgs& a, int P) {
  if (!a.common.mesh.empty()) a.mesh = cli::parse_mesh(a.common.mesh, 2, 2);
  if (a.mesh.empty()) {
    if (P % a.data != 0)
      throw cli::UsageError("--data " + std::to_string(a.data) + " does not divide the " + std::to_string(P) +
                            " ranks started");
    a.mesh = {P / a.data, 1};
  }
  cli::check_mesh_ranks(a.mesh, a.data, P, "--mesh");
  if (a.batch % a.data != 0)
    throw cli::UsageError("--batch " + std::to_string(a.batch) + " is not a multiple of --data " + std::to_string(a.data));
  if (a.train_samples < a.batch)
    throw cli::UsageError("--samples " + std::to_string(a.train_samples) + " is smaller than --batch " +
                          std::to_string(a.batch));
  if (a.checkpoint_every > 0 && a.checkpoint.empty())
    throw cli::UsageError("--checkpoint-every " + std::to_string(a.checkpoint_every) + " needs --checkpoint FILE");
  if (a.resume && a.checkpoint.empty()) throw cli::UsageError("--resume needs --checkpoint FILE (the file to resume from)");
  if (a.stop_after > a.common.steps)
    throw cli::UsageError("--stop-after " + std::to_string(a.stop_after) + " is past --steps " +
                          std::to_string(a.common.steps));
  if (a.cuda_graph && a.common.device != "cuda")
    throw cli::UsageError("--cuda-graph needs --device cuda (graphs capture GPU work)");
  if (a.cuda_graph && a.precision == "fp16")
    throw cli::UsageError("--cuda-graph with --precision fp16: the dynamic loss scaler reads the overflow flag on the "
                          "host every step, which a CUDA graph cannot capture (use bf16)");
  if (a.stop_after > 0)
    timing::check_warmup(a.warmup, a.stop_after, "--stop-after");
  else
    timing::check_warmup(a.warmup, a.common.steps, "--steps");
}

/// This rank's device: the CPU, or GPU (node-local rank modulo the visible GPUs) for --device cuda.
inline shard::Device pick_device(const std::string& kind, const shard::CommPtr& world, const char* prog) {
  using namespace shard;
  if (kind == "cpu") return Device::cpu();
  const int n = cuda_device_count();
  // Every rank must agree that CUDA is usable, or every rank stops with the same message.
  world->check_all(n > 0, prog,
                   fmt::format("--device cuda but {} (cuda_compiled={})",
                               n == 0 ? "no GPU is visible" : "GPUs are visible", cuda_compiled()));
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int local = lr ? std::atoi(lr) : world->rank();
  return Device::cuda(local % n);
}

inline double mib(std::size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

/// The mesh data x H x W on `dev`'s communicator, and the placements of [N, C, H, W] fields on it
/// (N over data, H and W over the spatial dims). On GPUs the mesh communicates through NCCL, or
/// through MPI (staged in pinned buffers) when ranks share a GPU (make_device_comm decides, the
/// same on every rank).
struct Domain {
  shard::DeviceMesh mesh;
  std::vector<shard::Placement> placements;
};
inline Domain make_domain(const TrainArgs& a, const shard::CommPtr& world, shard::Device dev) {
  using namespace shard;
  CommPtr comm = dev.is_cuda() ? make_device_comm(world, dev) : CommPtr(world);
  return {DeviceMesh(comm, {a.data, a.mesh[0], a.mesh[1]}, {"data", "h", "w"}), {Shard(0), Shard(2), Shard(3)}};
}

/// Training batches and a fixed validation batch from the domain-parallel heat solver.
struct HeatData {
  std::vector<std::pair<shard::DistTensor<T, 4>, shard::DistTensor<T, 4>>> train;
  std::pair<shard::DistTensor<T, 4>, shard::DistTensor<T, 4>> val;
  double gen_seconds = 0;
  index_t points = 0;  ///< grid points per sample for the throughput lines (0: --grid squared)
};
inline HeatData make_data(const Domain& d, const TrainArgs& a, shard::Device dev) {
  heat::Config hc;
  hc.grid = a.common.grid;
  HeatData out;
  const auto t0 = std::chrono::steady_clock::now();
  const index_t nbatches = a.train_samples / a.batch;
  for (index_t b = 0; b < nbatches; ++b) {
    auto [x, y] = heat::make_batch<T>(d.mesh, d.placements, a.common.seed, b * a.batch, a.batch, hc);
    out.train.emplace_back(x.to(dev), y.to(dev));
  }
  auto val = heat::make_batch<T>(d.mesh, d.placements, a.common.seed + 7919, 0, a.batch, hc);
  out.val = {val.first.to(dev), val.second.to(dev)};
  out.gen_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

/// The data-order state of a run: which batch comes next and what the data are (resume refuses a
/// checkpoint of other data).
inline shard::io::TrainingState training_state(long step, long cursor, const TrainArgs& a, index_t nbatches) {
  shard::io::TrainingState st;
  st.step = step;
  st.ints = {{"data.cursor", cursor},
             {"data.batches", static_cast<std::int64_t>(nbatches)},
             {"data.batch", static_cast<std::int64_t>(a.batch)},
             {"data.grid", static_cast<std::int64_t>(a.common.grid)},
             {"data.seed", static_cast<std::int64_t>(a.common.seed)},
             {"sched.total", a.common.steps}};
  return st;
}

/// Checks that a loaded state fits this run (cli::UsageError naming the flag otherwise; every rank
/// holds the same state, so every rank throws alike) and returns the data cursor.
inline long check_resume_state(const shard::io::TrainingState& st, const TrainArgs& a, index_t nbatches) {
  auto get = [&](const char* k) -> std::int64_t {
    auto it = st.ints.find(k);
    if (it == st.ints.end())
      throw cli::UsageError("--resume: checkpoint '" + a.checkpoint + "' lacks the training state '" + k +
                            "' (not written by this example)");
    return it->second;
  };
  auto same = [&](const char* k, std::int64_t want, const char* flag) {
    if (get(k) != want)
      throw cli::UsageError(std::string("--resume: checkpoint '") + a.checkpoint + "' was written with " + flag + " " +
                            std::to_string(get(k)) + ", this run has " + std::to_string(want));
  };
  same("data.seed", static_cast<std::int64_t>(a.common.seed), "--seed");
  same("data.grid", static_cast<std::int64_t>(a.common.grid), "--grid");
  same("data.batch", static_cast<std::int64_t>(a.batch), "--batch");
  same("data.batches", static_cast<std::int64_t>(nbatches), "--samples/--batch batches");
  if (st.step > a.common.steps)
    throw cli::UsageError("--resume: checkpoint '" + a.checkpoint + "' is at step " + std::to_string(st.step) +
                          ", past --steps " + std::to_string(a.common.steps));
  const long cursor = static_cast<long>(get("data.cursor"));
  if (cursor < 0 || cursor >= nbatches)
    throw cli::UsageError("--resume: checkpoint '" + a.checkpoint + "' has data cursor " + std::to_string(cursor) +
                          " outside 0.." + std::to_string(nbatches - 1));
  return cursor;
}

/// Trains `model` (a UnaryModule<T, 4> on [N, 1, H, W] fields) from step 0, or from the
/// checkpoint's step with --resume, up to --steps (or --stop-after); prints progress lines on
/// rank 0 and, last, `final_loss=` (MSE on the validation batch). Collective.
template <class Model>
void train(Model& model, const HeatData& data, const TrainArgs& a, const shard::CommPtr& world, shard::Device dev) {
  using namespace shard;
  namespace F = shard::nn::functional;
  using V = typename Model::value_type;  // activations: float, bf16 or f16; parameters are f32 (T)
  static_assert(std::is_same_v<master_t<V>, T>);
  optim::AdamW<T> opt(model.parameters(), {.lr = a.lr, .weight_decay = 1e-4});
  std::optional<optim::LossScaler> scaler;  // fp16 only: bf16 has f32's exponent range
  if constexpr (std::is_same_v<V, f16>) scaler.emplace();
  optim::CosineWarmup sched(a.lr, std::max(1, a.common.steps / 20), a.common.steps, a.lr * 0.05);
  const index_t nbatches = static_cast<index_t>(data.train.size());
  long start = 0, cursor = 0;
  if (a.resume) {
    const io::TrainingState st = io::load_checkpoint(a.checkpoint, model, &opt);
    cursor = check_resume_state(st, a, nbatches);
    start = static_cast<long>(st.step);
    if (world->rank() == 0) {
      std::printf("resumed from %s at step %ld\n", a.checkpoint.c_str(), start);
      // The learning-rate schedule spans --steps: a different total is allowed (extending a run)
      // but changes the rates from here on, so say so rather than pass it silently.
      const auto total = st.ints.find("sched.total");
      if (total != st.ints.end() && total->second != a.common.steps)
        std::printf("note: the checkpoint's learning-rate schedule spans %lld steps, this run's --steps %d: the "
                    "rates from step %ld follow this run's schedule (not bit-identical to an uninterrupted run)\n",
                    static_cast<long long>(total->second), a.common.steps, start);
      std::fflush(stdout);
    }
  }
  const long stop = a.stop_after > 0 ? a.stop_after : a.common.steps;
  const double points = static_cast<double>(data.points > 0 ? data.points : a.common.grid * a.common.grid);

  // The loss in f32 (the precision policy): the prediction is cast on the tape, the target stays f32.
  auto mse_of = [&](const DistTensor<T, 4>& x, const DistTensor<T, 4>& y, bool record) {
    autograd::Var<V, 4> xv(shard::cast<V>(x), false);
    autograd::Var<T, 4> yv(y, false);
    // --precision autocast-bf16: the fp32 model's forward under the autocast policy (the backward
    // follows the casts it recorded).
    const shard::Autocast ac(a.precision == "autocast-bf16" ? DType::bf16 : DType::f32);
    if (!record) {
      autograd::NoGradGuard ng;
      return F::mse_loss(F::cast<T>(model.forward(xv)), yv);
    }
    return F::mse_loss(F::cast<T>(model.forward(xv)), yv);
  };
  auto save_checkpoint = [&](long done) {
    io::save_checkpoint(a.checkpoint, model, &opt, training_state(done, cursor, a, nbatches));
  };

  // The steps this run executes (fewer than --steps after --resume): the first --warmup of them
  // are not timed. A resumed run may have fewer steps left than an explicit --warmup asks for;
  // then it has no steady-state window (said on the summary line).
  timing::StepTimer timer(dev, stop - start, timing::resolve_warmup(a.warmup, stop - start));
  timer.profile_window(a.profile_window);
  const auto t_start = std::chrono::steady_clock::now();
  auto t_last = t_start;
  using LossTensor = std::decay_t<decltype(mse_of(data.val.first, data.val.second, false).value())>;
  std::vector<LossTensor> pending;  // the losses since the last log step, still on the device
  pending.reserve(static_cast<std::size_t>(std::min(a.log_every, 1024)));

  // --cuda-graph: the step reads static input tensors (each batch is copied into them, on the
  // device) and leaves its loss in a static output that every replay overwrites (copied out for
  // the log). Captured after max(1, warm-up - 1) eager steps, so the capture falls in the
  // untimed warm-up whenever it is at least 2 steps.
  std::optional<shard::CapturedStep> graph;
  std::optional<std::pair<DistTensor<T, 4>, DistTensor<T, 4>>> static_xy;
  LossTensor graph_loss;
  bool graph_said = false;  // the graph's outcome has been printed
  if (a.cuda_graph && dev.is_cuda()) {
    const auto& [x0, y0] = data.train[0];
    static_xy.emplace(DistTensor<T, 4>(x0.spec(), x0.local().clone()), DistTensor<T, 4>(y0.spec(), y0.local().clone()));
    CapturedStep::Options co;
    co.warmup = static_cast<int>(std::max(1L, timing::resolve_warmup(a.warmup, stop - start) - 1));
    co.fallback_eager = true;  // said below; the run goes on eagerly
    co.comms.push_back(x0.mesh().comm());
    for (int m = 0; m < x0.mesh().ndim(); ++m) co.comms.push_back(x0.mesh().dim_comm(m));
    graph.emplace(dev, [&] {
      opt.zero_grad();
      auto loss = mse_of(static_xy->first, static_xy->second, true);
      loss.backward();
      opt.step();
      graph_loss = loss.value();
    }, co);
    if (world->rank() == 0) {
      if (graph->eager_reason().empty())
        std::printf("cuda graph: the step is captured after %d eager step(s), then replayed\n", co.warmup);
      else
        std::printf("cuda graph: not captured, the step runs eagerly: %s\n", graph->eager_reason().c_str());
      std::fflush(stdout);
    }
    graph_said = !graph->eager_reason().empty();
  }
  for (long step = start; step < stop; ++step) {
    opt.set_lr(sched(step));
    const auto& [x, y] = data.train[static_cast<std::size_t>(cursor)];
    cursor = (cursor + 1) % static_cast<long>(nbatches);
    if (graph) {
      static_xy->first.local().copy_from(x.local());
      static_xy->second.local().copy_from(y.local());
      graph->run();
      if (!graph_said && (graph->captured() || !graph->eager_reason().empty())) {
        graph_said = true;
        if (world->rank() == 0) {
          if (graph->captured())
            std::printf("cuda graph: captured at step %ld\n", step + 1);
          else
            std::printf("cuda graph: the capture failed, the step runs eagerly: %s\n", graph->eager_reason().c_str());
          std::fflush(stdout);
        }
      }
      pending.push_back(LossTensor(graph_loss.spec(), graph_loss.local().clone()));
    } else {
      opt.zero_grad();
      auto loss = mse_of(x, y, true);
      if (scaler) {
        scaler->scale(loss).backward();
        scaler->step(opt);  // skipped on every rank when a gradient overflowed
      } else {
        loss.backward();
        opt.step();
      }
      pending.push_back(loss.value());
    }
    if ((step + 1) % a.log_every == 0 || step + 1 == stop) {
      // Every rank reads its pending losses at the same steps (full_tensor is collective).
      double loss_sum = 0;
      const int loss_n = static_cast<int>(pending.size());
      for (const auto& l : pending) loss_sum += static_cast<double>(l.full_tensor().to(Device::cpu()).data()[0]);
      pending.clear();
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - t_last).count();
      t_last = now;
      const double samples_s = static_cast<double>(loss_n * a.batch) / dt;
      // Per-rank peaks: max over ranks of shardtensor's host high-water mark and of the RSS.
      double mem[3] = {mib(memory_stats(DeviceKind::cpu).peak_bytes), mib(process_peak_rss_bytes()),
                       mib(timer.gpu_peak_bytes())};
      world->allreduce(mem, mem, 3, DType::f64, ReduceOp::max);
      if (world->rank() == 0) {
        std::printf("step %5ld  loss %.6e  lr %.2e  %.2f samples/s  %.2f Mpoints/s  peak/rank: tensors %.1f MiB, "
                    "rss %.1f MiB%s%s\n",
                    step + 1, loss_sum / loss_n, opt.lr(), samples_s,
                    samples_s * points / 1e6, mem[0], mem[1],
                    dev.is_cuda() ? fmt::format(", gpu {:.1f} MiB", mem[2]).c_str() : "",
                    scaler ? fmt::format("  loss scale {:g} (skipped {})", scaler->scale_value(),
                                         scaler->skipped_steps()).c_str()
                           : "");
        std::fflush(stdout);
      }
    }
    timer.step_done(step + 1 - start);
    if (!a.checkpoint.empty() && ((a.checkpoint_every > 0 && (step + 1) % a.checkpoint_every == 0) || step + 1 == stop))
      save_checkpoint(step + 1);
  }
  if (!a.checkpoint.empty() && start == stop) save_checkpoint(stop);  // nothing left to do: still "at the end"
  const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  timer.finish(*world, static_cast<double>(a.batch), points,
               world->rank() == 0);
  model.eval();
  auto vloss = mse_of(data.val.first, data.val.second, false);
  const double final_loss = static_cast<double>(vloss.value().full_tensor().to(Device::cpu()).data()[0]);
  model.train();
  if (!a.save.empty()) model.save(a.save);
  if (world->rank() == 0) {
    const long ran = stop - start;
    std::printf("trained %ld steps (%ld..%ld) in %.2f s (%.3f s/step with the warm-up)\n", ran, start, stop, train_s,
                ran > 0 ? train_s / static_cast<double>(ran) : 0.0);
    if (!a.checkpoint.empty()) std::printf("checkpoint %s at step %ld\n", a.checkpoint.c_str(), stop);
    std::printf("final_loss=%.8e\n", final_loss);
    std::fflush(stdout);
  }
}

}  // namespace examples::surrogate

// requires: mpi
// Nowcasting example: predict the next radar frame from past satellite frames and the last radar
// frame with a U-Net, domain-parallel (issue 34; docs/performance.md has the sharded-vs-unsharded
// table, bench/run_nowcast_referee.sh makes it).
//
//   mpiexec -n 4 ./nowcast_surrogate --steps 200 --grid 128 --mesh 2x2
//   mpiexec -n 4 ./nowcast_surrogate --steps 50 --grid 256 --write-data frames.h5   # generate, write, train
//   mpiexec -n 2 ./nowcast_surrogate --steps 50 --data-file frames.h5               # train from a file
//   mpiexec -n 4 ./nowcast_surrogate --steps 200 --checkpoint ck.h5 --checkpoint-every 50   # then, any rank count:
//   mpiexec -n 2 ./nowcast_surrogate --steps 400 --checkpoint ck.h5 --resume
//
// 1. Frames: [time, channel, y, x] fields "satellite" (C_s channels; the generator's are 10.3 um
//    and 6.9 um brightness temperatures and 0.64 um reflectance) and "radar" (1 channel,
//    reflectivity in dBZ). Without --data-file they are generated domain-parallel from the global
//    index (examples/nowcast_data.hpp: advected, growing and decaying convective cells with a
//    diurnal cycle; the satellite channels blurred, parallax-shifted, saturating and leading the
//    rain), each rank its own block, the same at every rank count. --write-data FILE also writes
//    them to FILE (parallel HDF5, chunked by frame, written --io-frames frames at a time);
//    --data-file FILE reads frames of that layout instead (any float/int HDF5 dataset: real
//    MRMS/GOES arrays regridded to one grid work; --radar-name / --satellite-name pick the
//    datasets), --io-frames frames at a time, each rank its own hyperslab.
// 2. Sample k: input = satellite frames k .. k+F-1 (F = --frames-in) and radar frame k+F-1,
//    stacked as F*C_s + 1 channels; target = radar frame k+F. Samples 0 .. --samples-1 train
//    (shuffled, fixed order per seed), the next --batch are the validation batch (later in time).
//    Every channel is standardised with its mean and standard deviation over the training frames
//    (global sums, allreduce).
// 3. Training as in the other surrogates (surrogate_common.hpp: AdamW + cosine warm-up, progress
//    lines with throughput and per-rank peak memory, `steady state:` line, --checkpoint/--resume,
//    --precision, --device, data x domain groups); `final_loss=` is the MSE on the validation
//    batch in standardised units. Then the skill on the validation batch in dBZ, summed globally:
//    `val_mse_dbz2=`, `val_csi=` (critical success index hits / (hits + misses + false alarms) at
//    --threshold dBZ), next to persistence (the last radar frame as the forecast).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include <shardtensor/io/hdf5.hpp>
#include <shardtensor/nn/unet.hpp>

#include "nowcast_data.hpp"
#include "surrogate_common.hpp"

using namespace shard;
namespace cli = examples::cli;
namespace sur = examples::surrogate;
using T = sur::T;

namespace {

struct Args {
  sur::TrainArgs train;  // --steps --grid --seed --mesh --device --data --batch --samples --lr --log-every ...
  index_t width = 16;
  int depth = 2;
  int frames_in = 3;
  double threshold = 35;
  std::string data_file, write_data;
  std::string radar_name = "radar", sat_name = "satellite";
  int io_frames = 8;
};

void add_flags(CLI::App& app, Args& a) {
  sur::add_train_flags(app, a.train, {.min_grid = 4});
  app.add_option("--width", a.width, "U-Net base width (channels at full resolution)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(index_t{1}, index_t{4096}))
      ->capture_default_str();
  app.add_option("--depth", a.depth, "U-Net down/up steps")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  app.add_option("--frames-in", a.frames_in, "past satellite frames per sample (stacked as channels)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--threshold", a.threshold, "reflectivity threshold of the CSI skill score, dBZ")
      ->check(CLI::Range(-100.0, 200.0))
      ->capture_default_str();
  app.add_option("--data-file", a.data_file,
                 "train on the frames of this HDF5 file (datasets --radar-name [time,1,y,x] in dBZ and "
                 "--satellite-name [time,C,y,x]) instead of generated ones; --grid is then the file's");
  app.add_option("--write-data", a.write_data,
                 "write the generated frames to this HDF5 file (parallel, chunked by frame), then train on them");
  app.add_option("--radar-name", a.radar_name, "radar dataset in the files")->capture_default_str();
  app.add_option("--satellite-name", a.sat_name, "satellite dataset in the files")->capture_default_str();
  app.add_option("--io-frames", a.io_frames, "frames per HDF5 read / write (bounds the I/O buffers)")
      ->check(cli::decimal_integer())
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
}

void validate(Args& a, int P) {
  sur::validate_train(a.train, P);
  if (!a.data_file.empty() && !a.write_data.empty())
    throw cli::UsageError("--data-file and --write-data exclude each other (read frames, or generate and write them)");
  if (a.radar_name.empty() || a.sat_name.empty())
    throw cli::UsageError("--radar-name and --satellite-name must not be empty");
  if (a.data_file.empty()) cli::check_halvings(a.train.common.grid, a.depth, "--grid", "--depth");
}

/// The frames of a run, on the host: [T, C, Y, X], replicated over the data groups, Y and X
/// sharded like the training fields.
struct Frames {
  DistTensor<T, 4> radar, sat;
  index_t T_ = 0, ny = 0, nx = 0, cs = 0;
};

std::vector<Placement> frame_placements() { return {Replicate(), Shard(2), Shard(3)}; }

/// Frames [t0, t0 + n) of `x` as their own DistTensor (the I/O pieces).
DistTensor<T, 4> slice_frames(const DistTensor<T, 4>& x, index_t t0, index_t n) {
  const auto& g = x.global_shape();
  auto out = DistTensor<T, 4>::zeros(Shape<4>{n, g[1], g[2], g[3]}, x.mesh(), frame_placements());
  const index_t per = x.local().numel() / std::max<index_t>(g[0], 1);
  if (per > 0) std::memcpy(out.local().data(), x.local().data() + t0 * per, static_cast<std::size_t>(n * per) * sizeof(T));
  return out;
}
void put_frames(DistTensor<T, 4>& x, index_t t0, const DistTensor<T, 4>& piece) {
  const index_t per = x.local().numel() / std::max<index_t>(x.global_shape()[0], 1);
  if (per > 0)
    std::memcpy(x.local().data() + t0 * per, piece.local().data(), static_cast<std::size_t>(piece.local().numel()) * sizeof(T));
}

Frames generate(const DeviceMesh& mesh, const nowcast::Config& c, std::uint64_t seed, index_t nt) {
  Frames f;
  f.T_ = nt, f.ny = c.ny, f.nx = c.nx, f.cs = nowcast::kSatChannels;
  f.sat = DistTensor<T, 4>::zeros(Shape<4>{nt, f.cs, c.ny, c.nx}, mesh, frame_placements());
  f.radar = DistTensor<T, 4>::zeros(Shape<4>{nt, 1, c.ny, c.nx}, mesh, frame_placements());
  const auto off = f.sat.local_offset();
  const index_t h = f.sat.local().size(2), w = f.sat.local().size(3);
  if (h * w == 0) return f;
  for (index_t t = 0; t < nt; ++t)
    nowcast::frame(c, seed, static_cast<long>(t), off[2], h, off[3], w, f.radar.local().data() + t * h * w,
                   f.sat.local().data() + t * f.cs * h * w);
  return f;
}

void write_frames(const std::string& path, const Frames& f, const Args& a, const CommPtr& world) {
  io::H5File file(path, world, io::H5File::Mode::create);
  const index_t cy = std::min<index_t>(f.ny, 256), cx = std::min<index_t>(f.nx, 256);
  io::create_dataset<T>(file, a.radar_name, {f.T_, 1, f.ny, f.nx}, {1, 1, cy, cx});
  io::create_dataset<T>(file, a.sat_name, {f.T_, f.cs, f.ny, f.nx}, {1, f.cs, cy, cx});
  for (index_t t0 = 0; t0 < f.T_; t0 += a.io_frames) {
    const index_t n = std::min<index_t>(a.io_frames, f.T_ - t0);
    io::write_region(file, a.radar_name, slice_frames(f.radar, t0, n), {t0, 0, 0, 0});
    io::write_region(file, a.sat_name, slice_frames(f.sat, t0, n), {t0, 0, 0, 0});
  }
  file.close();
}

/// Reads the first `nt` frames (0: all) of the file's datasets; checks their layout (cli::UsageError).
Frames read_frames(const std::string& path, const DeviceMesh& mesh, const Args& a, const CommPtr& world,
                   index_t need) {
  io::H5File file(path, world, io::H5File::Mode::read);
  const auto rs = io::dataset_shape(file, a.radar_name);
  const auto ss = io::dataset_shape(file, a.sat_name);
  auto bad = [&](const std::string& m) { throw cli::UsageError("--data-file " + path + ": " + m); };
  if (rs.size() != 4 || rs[1] != 1)
    bad("dataset '" + a.radar_name + "' must be [time, 1, y, x], it has " + fmt::format("{}", rs));
  if (ss.size() != 4 || ss[0] != rs[0] || ss[2] != rs[2] || ss[3] != rs[3])
    bad("dataset '" + a.sat_name + "' must be [time, C, y, x] with the radar's time, y, x " +
        fmt::format("{}, it has {}", rs, ss));
  if (rs[0] < need)
    bad(fmt::format("{} frames, but --frames-in {} + --samples {} + the validation batch (--batch {}) need {}", rs[0],
                    a.frames_in, a.train.train_samples, a.train.batch, need));
  Frames f;
  f.T_ = need, f.ny = rs[2], f.nx = rs[3], f.cs = ss[1];
  f.sat = DistTensor<T, 4>::zeros(Shape<4>{need, f.cs, f.ny, f.nx}, mesh, frame_placements());
  f.radar = DistTensor<T, 4>::zeros(Shape<4>{need, 1, f.ny, f.nx}, mesh, frame_placements());
  for (index_t t0 = 0; t0 < need; t0 += a.io_frames) {
    const index_t n = std::min<index_t>(a.io_frames, need - t0);
    put_frames(f.radar, t0, io::read_region<T, 4>(file, a.radar_name, mesh, frame_placements(), {t0, 0, 0, 0},
                                                  {n, 1, f.ny, f.nx}));
    put_frames(f.sat, t0, io::read_region<T, 4>(file, a.sat_name, mesh, frame_placements(), {t0, 0, 0, 0},
                                                {n, f.cs, f.ny, f.nx}));
  }
  file.close();
  return f;
}

/// Per channel (satellite channels, then radar): mean and standard deviation over frames
/// [0, nt), from global sums (every data group holds the same frames: the factor cancels).
std::vector<std::pair<double, double>> channel_stats(const Frames& f, index_t nt, const CommPtr& world) {
  const index_t nc = f.cs + 1;
  std::vector<double> s(static_cast<std::size_t>(3 * nc), 0.0);
  const index_t hw = f.sat.local().size(2) * f.sat.local().size(3);
  for (index_t c = 0; c < nc; ++c) {
    double s1 = 0, s2 = 0;
    for (index_t t = 0; t < nt; ++t) {
      const T* p = c < f.cs ? f.sat.local().data() + (t * f.cs + c) * hw : f.radar.local().data() + t * hw;
      for (index_t i = 0; i < hw; ++i) s1 += p[i], s2 += static_cast<double>(p[i]) * p[i];
    }
    s[static_cast<std::size_t>(3 * c)] = s1, s[static_cast<std::size_t>(3 * c + 1)] = s2;
    s[static_cast<std::size_t>(3 * c + 2)] = static_cast<double>(nt * hw);
  }
  world->allreduce(s.data(), s.data(), static_cast<index_t>(s.size()), DType::f64, ReduceOp::sum);
  std::vector<std::pair<double, double>> out;
  for (index_t c = 0; c < nc; ++c) {
    const double n = std::max(1.0, s[static_cast<std::size_t>(3 * c + 2)]);
    const double m = s[static_cast<std::size_t>(3 * c)] / n;
    const double var = std::max(0.0, s[static_cast<std::size_t>(3 * c + 1)] / n - m * m);
    out.emplace_back(m, var > 1e-12 ? std::sqrt(var) : 1.0);
  }
  return out;
}

/// The batch of samples `ks`: inputs [B, F*C_s + 1, Y, X], targets [B, 1, Y, X], standardised.
std::pair<DistTensor<T, 4>, DistTensor<T, 4>> make_pair(const Frames& f, const sur::Domain& dom,
                                                         const std::vector<index_t>& ks, int nin,
                                                         const std::vector<std::pair<double, double>>& st) {
  const index_t B = static_cast<index_t>(ks.size()), cin = nin * f.cs + 1;
  auto x = DistTensor<T, 4>::zeros(Shape<4>{B, cin, f.ny, f.nx}, dom.mesh, dom.placements);
  auto y = DistTensor<T, 4>::zeros(Shape<4>{B, 1, f.ny, f.nx}, dom.mesh, dom.placements);
  const auto xo = x.local_offset(), fo = f.sat.local_offset();
  const index_t h = x.local().size(2), w = x.local().size(3), hw = h * w;
  SHARD_CHECK(xo[2] == fo[2] && xo[3] == fo[3] && h == f.sat.local().size(2) && w == f.sat.local().size(3),
              "nowcast_surrogate", "the frames' and the samples' spatial shards differ");
  const auto& rs = st.back();
  for (index_t b = 0; b < x.local().size(0); ++b) {
    const index_t k = ks[static_cast<std::size_t>(xo[0] + b)];
    T* xb = x.local().data() + b * cin * hw;
    for (int fr = 0; fr < nin; ++fr)
      for (index_t c = 0; c < f.cs; ++c) {
        const T* src = f.sat.local().data() + ((k + fr) * f.cs + c) * hw;
        T* dst = xb + (fr * f.cs + c) * hw;
        const auto& [m, s] = st[static_cast<std::size_t>(c)];
        for (index_t i = 0; i < hw; ++i) dst[i] = static_cast<T>((src[i] - m) / s);
      }
    const T* last = f.radar.local().data() + (k + nin - 1) * hw;
    const T* next = f.radar.local().data() + (k + nin) * hw;
    T* xr = xb + (cin - 1) * hw;
    T* yb = y.local().data() + b * hw;
    for (index_t i = 0; i < hw; ++i) {
      xr[i] = static_cast<T>((last[i] - rs.first) / rs.second);
      yb[i] = static_cast<T>((next[i] - rs.first) / rs.second);
    }
  }
  return {x, y};
}

}  // namespace

int run(int argc, char** argv, bool& print) {
  mpi_init_if_needed(&argc, &argv);
  auto world = MpiComm::world();
  print = world->rank() == 0;
  Args args;
  CLI::App app{"Trains a U-Net nowcaster (next radar frame from past satellite frames and the last radar frame), "
               "domain-parallel (run under mpiexec).",
               "nowcast_surrogate"};
  add_flags(app, args);
  if (const int rc = cli::parse(app, argc, argv, print); rc >= 0) return rc;
  const int P = world->size();
  validate(args, P);
  auto& ta = args.train;
  const Device dev = sur::pick_device(ta.common.device, world, "nowcast_surrogate");
  const sur::Domain dom = sur::make_domain(ta, world, dev);
  // The frames live on the host, on a mesh over the world communicator (HDF5 needs MPI).
  const DeviceMesh host_mesh(CommPtr(world), {ta.data, ta.mesh[0], ta.mesh[1]}, {"data", "h", "w"});
  const int nin = args.frames_in;
  const index_t need = nin + ta.train_samples + ta.batch;

  const auto t0 = std::chrono::steady_clock::now();
  Frames frames;
  if (args.data_file.empty()) {
    nowcast::Config nc;
    nc.ny = nc.nx = ta.common.grid;
    frames = generate(host_mesh, nc, ta.common.seed, need);
    if (!args.write_data.empty()) write_frames(args.write_data, frames, args, world);
  } else {
    frames = read_frames(args.data_file, host_mesh, args, world, need);
    cli::check_halvings(frames.ny, args.depth, "the file's y extent", "--depth");
    cli::check_halvings(frames.nx, args.depth, "the file's x extent", "--depth");
    ta.common.grid = frames.ny;  // what the checkpoint's data state records
  }
  const double io_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Standardisation from the frames the training samples use; samples shuffled per seed.
  const auto stats = channel_stats(frames, nin + ta.train_samples, world);
  std::vector<index_t> order(static_cast<std::size_t>(ta.train_samples));
  std::iota(order.begin(), order.end(), index_t{0});
  std::vector<double> key(order.size());
  for (std::size_t i = 0; i < key.size(); ++i)
    key[i] = random_value(ta.common.seed ^ 0x5eedull, i, RandomInit::uniform(0, 1));
  std::stable_sort(order.begin(), order.end(), [&](index_t p, index_t q) {
    return key[static_cast<std::size_t>(p)] < key[static_cast<std::size_t>(q)];
  });
  sur::HeatData data;  // training batches and the validation batch (surrogate_common's container)
  for (index_t b = 0; b + ta.batch <= ta.train_samples; b += ta.batch) {
    std::vector<index_t> ks(order.begin() + b, order.begin() + b + ta.batch);
    auto [x, y] = make_pair(frames, dom, ks, nin, stats);
    data.train.emplace_back(x.to(dev), y.to(dev));
  }
  std::vector<index_t> vks(static_cast<std::size_t>(ta.batch));
  std::iota(vks.begin(), vks.end(), ta.train_samples);
  {
    auto [x, y] = make_pair(frames, dom, vks, nin, stats);
    data.val = {x.to(dev), y.to(dev)};
  }
  data.gen_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  data.points = frames.ny * frames.nx;
  const index_t cs = frames.cs, ny = frames.ny, nx = frames.nx;
  frames = Frames{};  // the samples hold what training needs

  nn::UNetOptions uopt;
  uopt.in_channels = nin * cs + 1;
  uopt.out_channels = 1;
  uopt.base_width = args.width;
  uopt.depth = args.depth;
  sur::with_precision(ta.precision, [&](auto tag) {
    using V = decltype(tag);
    nn::UNet<V, 2> model(dom.mesh, uopt, ta.common.seed);
    model.to(dev);
    if (world->rank() == 0) {
      std::printf("nowcast_surrogate: device %s, %d ranks, mesh data=%d x h=%d x w=%d, grid %ldx%ld, %ld frames "
                  "(%s in %.2f s, samples built in %.2f s), input %d frames x %ld satellite channels + last radar = "
                  "%ld channels, batch %ld, %ld training samples, U-Net width %ld depth %d, %ld parameters, "
                  "precision %s\n",
                  fmt::format("{}", dev).c_str(), P, ta.data, ta.mesh[0], ta.mesh[1], static_cast<long>(ny),
                  static_cast<long>(nx), static_cast<long>(need),
                  !args.data_file.empty() ? ("read from " + args.data_file).c_str()
                  : !args.write_data.empty() ? ("generated and written to " + args.write_data).c_str()
                                             : "generated",
                  io_s, data.gen_seconds - io_s, nin, static_cast<long>(cs), static_cast<long>(uopt.in_channels),
                  static_cast<long>(ta.batch), static_cast<long>(ta.train_samples), static_cast<long>(args.width),
                  args.depth, static_cast<long>(model.num_parameters()), ta.precision.c_str());
      std::printf("radar: mean %.3f dBZ, std %.3f dBZ over the training frames\n", stats.back().first,
                  stats.back().second);
      std::fflush(stdout);
    }
    sur::train(model, data, ta, world, dev);

    // Skill on the validation batch in dBZ: the model and persistence (the last radar frame).
    model.eval();
    DistTensor<T, 4> pred;
    {
      autograd::NoGradGuard ng;
      const shard::Autocast ac(ta.precision == "autocast-bf16" ? DType::bf16 : DType::f32);
      autograd::Var<V, 4> xv(shard::cast<V>(data.val.first), false);
      pred = nn::functional::cast<T>(model.forward(xv)).value();
    }
    const auto p = pred.local().to(Device::cpu());
    const auto yv = data.val.second.local().to(Device::cpu());
    const auto xl = data.val.first.local().to(Device::cpu());
    const double m = stats.back().first, sd = stats.back().second, thr = args.threshold;
    const index_t hw = p.size(2) * p.size(3), cin = xl.size(1);
    // sums: se model, se persistence, points, then hits / misses / false alarms of model and persistence
    double s[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (index_t b = 0; b < p.size(0); ++b)
      for (index_t i = 0; i < hw; ++i) {
        const double truth = yv.data()[b * hw + i] * sd + m;
        const double fc = p.data()[b * hw + i] * sd + m;
        const double pers = xl.data()[(b * cin + cin - 1) * hw + i] * sd + m;
        s[0] += (fc - truth) * (fc - truth), s[1] += (pers - truth) * (pers - truth), s[2] += 1;
        const bool o = truth >= thr;
        for (int k = 0; k < 2; ++k) {
          const bool f = (k == 0 ? fc : pers) >= thr;
          s[3 + 3 * k] += (f && o) ? 1 : 0, s[4 + 3 * k] += (!f && o) ? 1 : 0, s[5 + 3 * k] += (f && !o) ? 1 : 0;
        }
      }
    world->allreduce(s, s, 9, DType::f64, ReduceOp::sum);
    auto csi = [&](int k) {
      const double d = s[3 + 3 * k] + s[4 + 3 * k] + s[5 + 3 * k];
      return d > 0 ? s[3 + 3 * k] / d : 0.0;
    };
    if (world->rank() == 0) {
      std::printf("validation (%ld samples, %.0f points): model mse %.4f dBZ^2, csi@%g dBZ %.4f (hits %.0f, misses "
                  "%.0f, false alarms %.0f); persistence mse %.4f dBZ^2, csi %.4f\n",
                  static_cast<long>(ta.batch), s[2], s[0] / s[2], thr, csi(0), s[3], s[4], s[5], s[1] / s[2], csi(1));
      std::printf("val_mse_dbz2=%.8e\nval_csi=%.8e\n", s[0] / s[2], csi(0));
      std::fflush(stdout);
    }
  });
  return 0;
}

int main(int argc, char** argv) {
  bool print = true;
  return cli::run_main("nowcast_surrogate", print, [&] { return run(argc, argv, print); });
}

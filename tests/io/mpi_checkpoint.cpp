// Checkpoints: save / load round trips across rank counts; training resume (AdamW, a small conv
// model on a sharded field, and one with a sharded parameter whose moments are sharded too)
// bitwise equal at the same rank count and within fp tolerance at another, parameters and
// optimiser moments; truncated and byte-flipped files refused on every rank with the model
// untouched.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>
#include <functional>
#include <fstream>
#include <iterator>
#include <shardtensor/io/checkpoint.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "io/io_test_util.hpp"

namespace st_io_mpi_checkpoint {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;
namespace F = shard::nn::functional;

namespace {

constexpr int kSteps = 5, kSplit = 2;

template <class T>
std::shared_ptr<nn::Sequential<T, 4>> make_model(const DeviceMesh& mesh, std::uint64_t seed) {
  auto m = std::make_shared<nn::Sequential<T, 4>>();
  m->add(std::make_shared<nn::Conv2d<T>>(mesh, 1, 4, 3, F::ConvOptions<2>::same({3, 3}), true, seed));
  m->add(std::make_shared<nn::GELU<T, 4>>());
  m->add(std::make_shared<nn::Conv2d<T>>(mesh, 4, 1, 3, F::ConvOptions<2>::same({3, 3}), true, seed + 1));
  return m;
}

/// A 1-D or 2-D domain decomposition of the [N, C, H, W] field for a communicator of size p.
DeviceMesh domain_mesh(CommPtr comm, bool two_d) {
  const int p = comm->size();
  return two_d && p == 4 ? DeviceMesh(comm, {2, 2}) : DeviceMesh(comm, {p});
}
std::vector<Placement> domain_placements(const DeviceMesh& mesh) {
  return mesh.ndim() == 2 ? std::vector<Placement>{Shard(2), Shard(3)} : std::vector<Placement>{Shard(2)};
}

/// A model with a SHARDED parameter (like a ViT's positional embedding): a learned field
/// `pos` [1, 1, H, W] laid out like the data, added to the input before the conv stack. Its
/// AdamW moments are sharded the same way.
template <class T>
class PosConv final : public nn::UnaryModule<T, 4> {
 public:
  PosConv(const DeviceMesh& mesh, std::uint64_t seed) {
    pos_ = this->template make_sharded_parameter<4>("pos", mesh, {1, 1, 13, 10}, domain_placements(mesh), seed, 0.5);
    net_ = this->register_module("net", make_model<T>(mesh, seed));
  }
  autograd::Var<T, 4> forward(const autograd::Var<T, 4>& x) override { return (*net_)(F::add(x, pos_)); }

 private:
  autograd::Var<T, 4> pos_;
  std::shared_ptr<nn::Sequential<T, 4>> net_;
};

template <class T>
using ModelMaker = std::function<std::shared_ptr<nn::UnaryModule<T, 4>>(const DeviceMesh&, std::uint64_t)>;

/// Trains `steps` AdamW steps from `from` on the same data every step; returns the last loss.
template <class T>
double train(nn::UnaryModule<T, 4>& model, optim::Optimizer<T>& opt, const DeviceMesh& mesh, int from, int to) {
  const auto pl = domain_placements(mesh);
  double loss_value = 0;
  for (int s = from; s < to; ++s) {
    // Data of step s: a function of (seed, s, global index), the same at every rank count.
    autograd::Var<T, 4> x(DistTensor<T, 4>::random({2, 1, 13, 10}, mesh, pl, 1000 + s));
    autograd::Var<T, 4> y(DistTensor<T, 4>::random({2, 1, 13, 10}, mesh, pl, 2000 + s));
    opt.zero_grad();
    auto loss = F::mse_loss(model(x), y);
    loss.backward();
    opt.step();
    loss_value = static_cast<double>(loss.local()(0));
  }
  return loss_value;
}

template <class T>
std::vector<T> flat_params(const nn::Module<T>& m) {
  std::vector<T> out;
  for (auto& np : m.named_parameters()) {
    const auto v = np.param->value_flat().contiguous();
    out.insert(out.end(), v.data(), v.data() + v.numel());
  }
  return out;
}

/// The whole value of every parameter, gathered (collective when some are sharded).
template <class T>
std::vector<T> full_params(const nn::Module<T>& m) {
  std::vector<T> out;
  for (auto& np : m.named_parameters()) {
    const auto v = np.param->full_value_host();
    out.insert(out.end(), v.data(), v.data() + v.numel());
  }
  return out;
}

/// This rank's optimiser moments, concatenated in key order (bitwise comparisons at one size).
std::vector<double> local_moments(const optim::OptimizerState& s) {
  std::vector<double> out;
  for (auto& [k, b] : s.buffers) {
    REQUIRE(b.dtype == DType::f64);
    const auto* d = static_cast<const double*>(b.data);
    out.insert(out.end(), d, d + b.numel());
  }
  return out;
}

template <class T>
double rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 1e300;
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])) / std::max(1.0, std::abs(static_cast<double>(b[i]))));
  return m;
}

template <class T>
using AdamW = optim::AdamW<T>;
template <class T>
typename optim::Adam<T>::Options adam_options() {
  return {.lr = 1e-2, .weight_decay = 1e-2};
}

io::TrainingState state_at(int step) {
  io::TrainingState st;
  st.step = step;
  st.ints = {{"epoch", 3}, {"rng.counter", -1234567890123LL}};
  st.bytes = {{"rng.engine", std::string("\x00\x01 binary\xff", 10)}, {"note", "data order v1"}};
  return st;
}

/// Phase 1, at every communicator size and mesh: train kSplit steps, checkpoint; resuming at the
/// same size equals training straight through, bit for bit (parameters, moments, loss). Phase 2:
/// every checkpoint resumed at every other size and mesh, against training straight through at
/// that size (and the loaded moments against a run stopped at kSplit there).
template <class T>
void check_resume(const ModelMaker<T>& make, const char* tag) {
  const std::string dir = shared_tmpdir(tag);
  for_each_comm_size([&](CommPtr comm) {
    for (bool two_d : {false, true}) {
      if (two_d && comm->size() != 4) continue;
      const DeviceMesh mesh = domain_mesh(comm, two_d);
      INFO("mesh of " << mesh.ndim() << " dims over " << comm->size() << " ranks");
      auto ref = make(mesh, 5);
      AdamW<T> oref(ref->parameters(), adam_options<T>());
      const double ref_loss = train(*ref, oref, mesh, 0, kSteps);

      auto a = make(mesh, 5);
      AdamW<T> oa(a->parameters(), adam_options<T>());
      train(*a, oa, mesh, 0, kSplit);
      const std::string path = fmt::format("{}/ck_{}_{}.h5", dir, comm->size(), two_d ? 2 : 1);
      io::save_checkpoint(path, *a, &oa, state_at(kSplit));

      auto b = make(mesh, 77);  // different initial values: load must overwrite them
      AdamW<T> ob(b->parameters(), adam_options<T>());
      const auto st = io::load_checkpoint(path, *b, &ob);
      CHECK(st == state_at(kSplit));
      CHECK(ob.steps() == kSplit);
      CHECK(flat_params(*b) == flat_params(*a));
      CHECK(local_moments(ob.state()) == local_moments(oa.state()));
      CHECK(ob.state().buffers.size() == oa.state().buffers.size());
      const double loss = train(*b, ob, mesh, static_cast<int>(st.step), kSteps);
      CHECK(flat_params(*b) == flat_params(*ref));  // bitwise
      CHECK(local_moments(ob.state()) == local_moments(oref.state()));
      CHECK(loss == ref_loss);
    }
  });
  MpiComm::world()->barrier();
  const int world = world_size();
  for_each_comm_size([&](CommPtr comm) {
    for (bool two_d : {false, true}) {
      if (two_d && comm->size() != 4) continue;
      const DeviceMesh mesh = domain_mesh(comm, two_d);
      auto ref = make(mesh, 5);
      AdamW<T> oref(ref->parameters(), adam_options<T>());
      const double ref_loss = train(*ref, oref, mesh, 0, kSteps);
      auto half = make(mesh, 5);  // stopped where the checkpoints were written
      AdamW<T> ohalf(half->parameters(), adam_options<T>());
      train(*half, ohalf, mesh, 0, kSplit);
      const double tol = std::is_same_v<T, float> ? 1e-4 : 1e-10;
      for (int p = 1; p <= world; ++p)
        for (int md : {1, 2}) {
          if (md == 2 && p != 4) continue;
          INFO("written at " << p << " ranks (" << md << "-D mesh), resumed at " << comm->size() << " ranks ("
                             << mesh.ndim() << "-D mesh)");
          auto b = make(mesh, 77);
          AdamW<T> ob(b->parameters(), adam_options<T>());
          const auto st = io::load_checkpoint(fmt::format("{}/ck_{}_{}.h5", dir, p, md), *b, &ob);
          CHECK(st == state_at(kSplit));
          CHECK(rel_diff(full_params(*b), full_params(*half)) <= tol);
          CHECK(rel_diff(local_moments(ob.state()), local_moments(ohalf.state())) <= tol);
          const double loss = train(*b, ob, mesh, static_cast<int>(st.step), kSteps);
          CHECK(rel_diff(full_params(*b), full_params(*ref)) <= tol);
          CHECK(std::abs(loss - ref_loss) <= tol * std::max(1.0, std::abs(ref_loss)));
        }
    }
  });
  remove_shared_tmpdir(dir);
}

}  // namespace

TEMPLATE_TEST_CASE("checkpoint resume is bitwise at the same rank count and within tolerance at another",
                   "[io][checkpoint][mpi]", float, double) {
  using T = TestType;
  if (!io::hdf5_available()) SKIP("built without HDF5");
  check_resume<T>([](const DeviceMesh& m, std::uint64_t seed) { return make_model<T>(m, seed); }, "ckpt");
}

TEMPLATE_TEST_CASE("checkpoints of sharded parameters and their sharded moments load at any rank count and mesh",
                   "[io][checkpoint][sharded][mpi]", float, double) {
  using T = TestType;
  if (!io::hdf5_available()) SKIP("built without HDF5");
  check_resume<T>([](const DeviceMesh& m, std::uint64_t seed) { return std::make_shared<PosConv<T>>(m, seed); },
                  "ckshard");
}

TEST_CASE("checkpoints refuse truncated and corrupted files on every rank", "[io][checkpoint][errors][mpi]") {
  if (!io::hdf5_available()) SKIP("built without HDF5");
  const std::string dir = shared_tmpdir("ckbad");
  for_each_comm_size([&](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    auto a = make_model<double>(mesh, 5);
    AdamW<double> oa(a->parameters(), adam_options<double>());
    train(*a, oa, mesh, 0, 1);
    // A recognisable first parameter: 0.5 + k / 1024 (exact in binary), found in the file below.
    auto first = a->named_parameters().front().param;
    {
      auto v = first->value_flat();
      for (index_t k = 0; k < v.numel(); ++k) v(k) = 0.5 + static_cast<double>(k) / 1024;
    }
    const std::string path = fmt::format("{}/good_{}.h5", dir, comm->size());
    io::save_checkpoint(path, *a, &oa, state_at(1));
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
    std::string bytes;
    if (comm->rank() == 0) {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    auto b = make_model<double>(mesh, 77);
    AdamW<double> ob(b->parameters(), adam_options<double>());
    const auto before = flat_params(*b);
    auto refused = [&](const std::string& file, const char* what) {
      const std::string msg = error_of([&] { io::load_checkpoint(file, *b, &ob); });
      CHECK_THAT(msg, ContainsSubstring(what));
      CHECK(flat_params(*b) == before);  // nothing was modified
      CHECK(ob.steps() == 0);
    };
    // Truncated at several lengths.
    for (double frac : {0.1, 0.5, 0.95}) {
      const std::string t = fmt::format("{}/trunc_{}_{}.h5", dir, comm->size(), frac);
      if (comm->rank() == 0) std::ofstream(t, std::ios::binary) << bytes.substr(0, static_cast<std::size_t>(bytes.size() * frac));
      comm->barrier();
      INFO("truncated to " << frac);
      refused(t, "truncated file");
    }
    // One flipped byte inside the first parameter's data.
    {
      const std::string t = fmt::format("{}/flip_{}.h5", dir, comm->size());
      int found = 1;
      if (comm->rank() == 0) {
        double pattern[3] = {0.5 + 1.0 / 1024, 0.5 + 2.0 / 1024, 0.5 + 3.0 / 1024};
        const auto pos = bytes.find(std::string(reinterpret_cast<const char*>(pattern), sizeof pattern));
        found = pos != std::string::npos;
        std::string flipped = bytes;
        if (found) flipped[pos + 9] = static_cast<char>(flipped[pos + 9] ^ 0x04);
        std::ofstream(t, std::ios::binary) << flipped;
      }
      comm->broadcast(&found, 1, DType::i32, 0);
      REQUIRE(found == 1);
      refused(t, "checksum mismatch");
    }
    // Not a checkpoint at all / missing.
    refused(dir + "/missing.h5", "cannot open");
    // Ranks passing different state keys: refused on every rank before anything is written.
    if (comm->size() > 1) {
      io::TrainingState odd = state_at(1);
      if (comm->rank() == 1) odd.ints["only.on.rank1"] = 1;
      CHECK_THAT(error_of([&] { io::save_checkpoint(path, *a, &oa, odd); }), ContainsSubstring("same entries"));
    }
    // The good file still loads, everywhere.
    const auto st = io::load_checkpoint(path, *b, &ob);
    CHECK(st == state_at(1));
    CHECK(flat_params(*b) == flat_params(*a));
    // A model whose parameters differ is refused.
    auto other = std::make_shared<nn::Sequential<double, 4>>();
    other->add(std::make_shared<nn::Conv2d<double>>(mesh, 1, 3, 3, F::ConvOptions<2>::same({3, 3}), true, 1));
    CHECK_THAT(error_of([&] { io::load_checkpoint(path, *other, nullptr); }), ContainsSubstring("parameters"));
  });
  remove_shared_tmpdir(dir);
}

namespace {
/// A sharded parameter of 3 elements: at 4 ranks one rank holds none of it, and AdamW allocates
/// no moments there (the save agrees on the buffer list from the ranks that have them).
class Tiny final : public nn::Module<double> {
 public:
  Tiny(const DeviceMesh& mesh, std::uint64_t seed)
      : p_(make_sharded_parameter<1>("p", mesh, {3}, {Shard(0)}, seed, 1.0)) {}
  const autograd::Var<double, 1>& p() const { return p_; }

 private:
  autograd::Var<double, 1> p_;
};
double tiny_step(Tiny& m, optim::Optimizer<double>& opt, const DeviceMesh& mesh, int s) {
  autograd::Var<double, 1> y(DistTensor<double, 1>::random({3}, mesh, {Shard(0)}, 300 + s));
  opt.zero_grad();
  auto loss = F::mse_loss(m.p(), y);
  loss.backward();
  opt.step();
  return loss.local()(0);
}
}  // namespace

TEST_CASE("checkpoints of a sharded parameter with empty blocks on some ranks", "[io][checkpoint][sharded][mpi]") {
  if (!io::hdf5_available()) SKIP("built without HDF5");
  const std::string dir = shared_tmpdir("cktiny");
  for_each_comm_size([&](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    Tiny a(mesh, 5);
    AdamW<double> oa(a.parameters(), adam_options<double>());
    for (int s = 0; s < 2; ++s) tiny_step(a, oa, mesh, s);
    if (comm->size() == 4) CHECK(oa.state().buffers.size() == (comm->rank() == 3 ? 0u : 2u));
    io::save_checkpoint(fmt::format("{}/tiny_{}.h5", dir, comm->size()), a, &oa, state_at(2));
  });
  MpiComm::world()->barrier();
  const int world = world_size();
  for_each_comm_size([&](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    for (int p = 1; p <= world; ++p) {
      INFO("written at " << p << " ranks, read at " << comm->size());
      Tiny ref(mesh, 5);
      AdamW<double> oref(ref.parameters(), adam_options<double>());
      for (int s = 0; s < 2; ++s) tiny_step(ref, oref, mesh, s);
      Tiny b(mesh, 77);
      AdamW<double> ob(b.parameters(), adam_options<double>());
      CHECK(io::load_checkpoint(fmt::format("{}/tiny_{}.h5", dir, p), b, &ob) == state_at(2));
      CHECK(rel_diff(full_params(b), full_params(ref)) <= 1e-14);
      CHECK(rel_diff(local_moments(ob.state()), local_moments(oref.state())) <= 1e-14);
      CHECK(ob.state().buffers.size() == oref.state().buffers.size());
      const double l1 = tiny_step(b, ob, mesh, 2), l0 = tiny_step(ref, oref, mesh, 2);
      CHECK(std::abs(l1 - l0) <= 1e-12);
      CHECK(rel_diff(full_params(b), full_params(ref)) <= 1e-12);
    }
  });
  remove_shared_tmpdir(dir);
}

}  // namespace st_io_mpi_checkpoint

// Parallel HDF5 I/O of DistTensors: write at one communicator size and mesh, read back at every
// other (1-4 ranks, 1-D and 2-D meshes, uneven and empty shards, Replicate and Partial
// placements, f32/f64/c128). Oracle: the full tensor from the seed (DistTensor::random gives the
// same global tensor at every rank count). Mismatched dtype/shape/rank, missing datasets and
// non-HDF5 files are refused with shard::Error on every rank. Region I/O (create_dataset,
// write_region, read_region: chunked time series written piecewise, read as windows with type
// conversion) against the same oracle.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <complex>
#include <fstream>
#include <shardtensor/io/hdf5.hpp>

#include "io/io_test_util.hpp"

namespace st_io_mpi_hdf5 {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {

const Shape<2> kShape{9, 7};

template <class T>
Tensor<T, 2> oracle(std::uint64_t seed) {
  if constexpr (std::is_same_v<T, std::complex<double>>) {
    auto re = Tensor<double, 2>::empty(kShape), im = Tensor<double, 2>::empty(kShape);
    re.fill_random(seed);
    im.fill_random(seed + 1);
    auto t = Tensor<T, 2>::empty(kShape);
    for (index_t i = 0; i < t.numel(); ++i) t.data()[i] = T(re.data()[i], im.data()[i]);
    return t;
  } else {
    auto t = Tensor<T, 2>::empty(kShape);
    t.fill_random(seed);
    return t;
  }
}

template <class T>
DistTensor<T, 2> make(const DeviceMesh& mesh, const std::vector<Placement>& pl, std::uint64_t seed,
                      const ShardSizes& sizes) {
  if constexpr (std::is_same_v<T, std::complex<double>>) {
    auto re = DistTensor<double, 2>::random(kShape, mesh, pl, seed, {}, sizes);
    auto im = DistTensor<double, 2>::random(kShape, mesh, pl, seed + 1, {}, sizes);
    auto l = Tensor<T, 2>::empty(re.local().shape());
    const auto a = re.local().contiguous(), b = im.local().contiguous();
    for (index_t i = 0; i < l.numel(); ++i) l.data()[i] = T(a.data()[i], b.data()[i]);
    return DistTensor<T, 2>(re.spec(), l);
  } else {
    return DistTensor<T, 2>::random(kShape, mesh, pl, seed, {}, sizes);
  }
}

template <class T>
bool equal(const Tensor<T, 2>& a, const Tensor<T, 2>& b) {
  if (a.shape() != b.shape()) return false;
  const auto x = a.contiguous(), y = b.contiguous();
  for (index_t i = 0; i < x.numel(); ++i)
    if (x.data()[i] != y.data()[i]) return false;
  return true;
}

struct Layout {
  std::vector<int> mesh;
  std::vector<Placement> pl;
  bool uneven = false;
};

/// Layouts for a communicator of size p: 1-D and (p = 4, 2) 2-D meshes, uneven with an empty
/// shard, Replicate, Partial(sum) (p >= 2).
std::vector<Layout> layouts(int p) {
  std::vector<Layout> ls = {{{p}, {Shard(0)}}, {{p}, {Shard(1)}, true}, {{p}, {Replicate()}}};
  if (p >= 2) ls.push_back({{p}, {Partial(ReduceOp::sum)}});
  if (p == 4) {
    ls.push_back({{2, 2}, {Shard(0), Shard(1)}});
    ls.push_back({{2, 2}, {Replicate(), Shard(0)}, true});
    ls.push_back({{2, 2}, {Shard(1), Partial(ReduceOp::sum)}});
  }
  if (p == 2) ls.push_back({{1, 2}, {Shard(0), Shard(1)}});
  return ls;
}

ShardSizes sizes_for(const Layout& l, int p) {
  if (!l.uneven) return {};
  // The dim sharded by the last Shard placement over all mesh dims that shard it: first part
  // empty, the rest uneven.
  int d = -1;
  index_t parts = 1;
  for (std::size_t m = 0; m < l.pl.size(); ++m)
    if (l.pl[m].is_shard()) d = l.pl[m].dim;
  for (std::size_t m = 0; m < l.pl.size(); ++m)
    if (l.pl[m].is_shard(d)) parts *= l.mesh[m];
  (void)p;
  std::vector<index_t> s(static_cast<std::size_t>(parts), 0);
  index_t left = kShape[static_cast<std::size_t>(d)];
  for (index_t r = 1; r < parts; ++r) {
    const index_t take = r == parts - 1 ? left : std::min<index_t>(left, r);
    s[static_cast<std::size_t>(r)] = take;
    left -= take;
  }
  if (parts == 1) s[0] = left;
  ShardSizes out(2);
  out[static_cast<std::size_t>(d)] = s;
  return out;
}

template <class T>
void write_all(const std::string& dir, const char* tag) {
  for_each_comm([&](CommPtr comm) {
    const int p = comm->size();
    // SelfComm rounds run on every world rank at once: one file each.
    const std::string path = comm->backend() == "mpi" ? fmt::format("{}/{}_{}_mpi.h5", dir, tag, p)
                                                      : fmt::format("{}/{}_self_{}.h5", dir, tag, MpiComm::world()->rank());
    io::H5File f(path, comm, io::H5File::Mode::create);
    const auto ls = layouts(p);
    for (std::size_t i = 0; i < ls.size(); ++i) {
      DeviceMesh mesh(comm, ls[i].mesh);
      io::write(f, fmt::format("group/x{}", i), make<T>(mesh, ls[i].pl, 100 + i, sizes_for(ls[i], p)));
    }
    f.close();
  });
}

template <class T>
void read_all(const std::string& dir, const char* tag) {
  const int world = world_size();
  for_each_comm([&](CommPtr comm) {
    const int q = comm->size();
    for (int p = 1; p <= world; ++p) {
      const std::string path = fmt::format("{}/{}_{}_mpi.h5", dir, tag, p);
      io::H5File f(path, comm, io::H5File::Mode::read);
      const auto wl = layouts(p);
      for (std::size_t i = 0; i < wl.size(); ++i) {
        const auto want = oracle<T>(100 + i);
        for (const auto& rl : layouts(q)) {
          INFO("written at " << p << " ranks (layout " << i << "), read at " << q << " ranks on a " << rl.mesh.size()
                             << "-D mesh as " << fmt::format("{}", fmt::join(rl.pl, ",")));
          DeviceMesh mesh(comm, rl.mesh);
          auto x = io::read<T, 2>(f, fmt::format("group/x{}", i), mesh, rl.pl, sizes_for(rl, q));
          CHECK(x.placements() == rl.pl);
          CHECK(equal(x.full_tensor(), want));
        }
      }
      f.close();
    }
  });
}

}  // namespace

TEST_CASE("HDF5 round trips across rank counts, meshes, uneven shards and dtypes", "[io][hdf5][mpi]") {
  if (!io::hdf5_available()) SKIP("built without HDF5");
  const std::string dir = shared_tmpdir("h5");
  write_all<double>(dir, "f64");
  write_all<float>(dir, "f32");
  write_all<std::complex<double>>(dir, "c128");
  MpiComm::world()->barrier();
  read_all<double>(dir, "f64");
  read_all<float>(dir, "f32");
  read_all<std::complex<double>>(dir, "c128");
  // Attributes: dtype, global shape, placements and mesh shape as written.
  for_each_comm_size([&](CommPtr comm) {
    io::H5File f(fmt::format("{}/f64_{}_mpi.h5", dir, world_size()), comm, io::H5File::Mode::read);
    const auto info = io::detail::dataset_info(f, "group/x0");
    CHECK(info.dtype == DType::f64);
    CHECK(info.shape == std::vector<index_t>{9, 7});
    CHECK(info.placements == "[Shard(0)]");
    CHECK(info.mesh_shape == std::vector<index_t>{world_size()});
    f.close();
  });
  remove_shared_tmpdir(dir);
}

TEST_CASE("HDF5 reads with the wrong dtype, rank or shape are refused on every rank", "[io][hdf5][errors][mpi]") {
  if (!io::hdf5_available()) SKIP("built without HDF5");
  const std::string dir = shared_tmpdir("h5err");
  for_each_comm_size([&](CommPtr comm) {
    const int p = comm->size();
    DeviceMesh mesh(comm, {p});
    const std::string path = fmt::format("{}/e{}.h5", dir, p);
    auto x = DistTensor<double, 2>::random(kShape, mesh, {Shard(0)}, 9);
    io::write_hdf5(path, "x", x);
    io::H5File f(path, comm, io::H5File::Mode::read);
    CHECK_THAT(error_of([&] { io::read<float, 2>(f, "x", mesh, {Shard(0)}); }), ContainsSubstring("holds f64"));
    CHECK_THAT(error_of([&] { io::read<double, 3>(f, "x", mesh, {Shard(0)}); }), ContainsSubstring("has rank 2"));
    CHECK_THAT(error_of([&] { io::read<double, 2>(f, "nope", mesh, {Shard(0)}); }), ContainsSubstring("no dataset"));
    auto other = DistTensor<double, 2>::zeros({9, 8}, mesh, {Shard(1)});
    CHECK_THAT(error_of([&] { io::read_into(f, "x", other); }), ContainsSubstring("has shape [9, 7]"));
    // Still usable afterwards (nobody was left in a collective): a correct read works.
    auto y = io::read<double, 2>(f, "x", mesh, {Shard(1)});
    CHECK(equal(y.full_tensor(), x.full_tensor()));
    f.close();
    // Writing a dataset twice, opening a missing or a non-HDF5 file.
    io::H5File w(path + ".2", comm, io::H5File::Mode::create);
    io::write(w, "x", x);
    CHECK_THAT(error_of([&] { io::write(w, "x", x); }), ContainsSubstring("already exists"));
    w.close();
    CHECK_THROWS_AS(io::H5File(dir + "/missing.h5", comm, io::H5File::Mode::read), shard::Error);
    if (comm->rank() == 0) std::ofstream(dir + "/junk" + std::to_string(p) + ".h5") << "not an HDF5 file\n";
    comm->barrier();
    CHECK_THROWS_AS(io::H5File(dir + "/junk" + std::to_string(p) + ".h5", comm, io::H5File::Mode::read), shard::Error);
  });
  remove_shared_tmpdir(dir);
}

TEST_CASE("HDF5 chunked datasets written and read by regions (time series)", "[io][hdf5][region][mpi]") {
  if (!io::hdf5_available()) SKIP("built without HDF5");
  const std::string dir = shared_tmpdir("h5region");
  const Shape<4> piece{2, 2, 9, 7};  // 2 frames of [2, 9, 7]; the dataset holds 6 frames
  // Oracle: the pieces' full tensors (DistTensor::random is the same at every rank count).
  auto full = Tensor<double, 4>::zeros({6, 2, 9, 7});
  {
    DeviceMesh one(std::make_shared<SelfComm>(), {1});
    for (index_t t0 = 0; t0 < 6; t0 += 2) {
      const auto x = DistTensor<double, 4>::random(piece, one, {Replicate()}, 300 + t0).full_tensor();
      std::copy(x.data(), x.data() + x.numel(), full.data() + t0 * 2 * 9 * 7);
    }
  }
  for_each_comm_size([&](CommPtr comm) {
    const int p = comm->size();
    // Written by frame pairs on one layout (uneven shards of y), chunked one frame at a time.
    const std::string path = fmt::format("{}/r{}.h5", dir, p);
    {
      io::H5File f(path, comm, io::H5File::Mode::create);
      io::create_dataset<double>(f, "series/radar", {6, 2, 9, 7}, {1, 2, 4, 4});
      CHECK(io::dataset_shape(f, "series/radar") == std::vector<index_t>{6, 2, 9, 7});
      DeviceMesh mesh(comm, p == 4 ? std::vector<int>{2, 2} : std::vector<int>{p});
      const std::vector<Placement> pl = p == 4 ? std::vector<Placement>{Shard(2), Shard(3)} : std::vector<Placement>{Shard(2)};
      for (index_t t0 = 0; t0 < 6; t0 += 2)
        io::write_region(f, "series/radar", DistTensor<double, 4>::random(piece, mesh, pl, 300 + t0), {t0, 0, 0, 0});
      CHECK_THAT(error_of([&] { io::create_dataset<double>(f, "series/radar", {1}); }), ContainsSubstring("already exists"));
      CHECK_THAT(error_of([&] {
                   io::write_region(f, "series/radar", DistTensor<double, 4>::random(piece, mesh, pl, 1), {5, 0, 0, 0});
                 }),
                 ContainsSubstring("outside dataset"));
      f.close();
    }
    // Read back windows at this size on other layouts, converted to f32 by HDF5.
    io::H5File f(path, comm, io::H5File::Mode::read);
    const std::vector<index_t> origin{1, 1, 2, 1}, ext{4, 1, 5, 6};
    for (const auto& pl : {std::vector<Placement>{Shard(3)}, std::vector<Placement>{Shard(0)}, std::vector<Placement>{Replicate()}}) {
      DeviceMesh mesh(comm, {p});
      auto x = io::read_region<float, 4>(f, "series/radar", mesh, pl, origin, ext);
      const auto got = x.full_tensor();
      bool same = true;
      for (index_t t = 0; t < 4; ++t)
        for (index_t i = 0; i < 5; ++i)
          for (index_t j = 0; j < 6; ++j)
            same = same && got(t, 0, i, j) == static_cast<float>(full(t + 1, 1, i + 2, j + 1));
      CHECK(same);
    }
    DeviceMesh mesh(comm, {p});
    CHECK_THAT(error_of([&] { io::read_region<float, 4>(f, "series/radar", mesh, {Shard(2)}, {3, 0, 0, 0}, {4, 2, 9, 7}); }),
               ContainsSubstring("outside dataset"));
    CHECK_THAT(error_of([&] { io::dataset_shape(f, "series/none"); }), ContainsSubstring("no dataset"));
    // A region dataset has no checksum: the whole-tensor read says so.
    CHECK_THAT(error_of([&] { io::read<double, 4>(f, "series/radar", mesh, {Shard(2)}); }),
               ContainsSubstring("no shard_checksum"));
    f.close();
  });
  remove_shared_tmpdir(dir);
}

}  // namespace st_io_mpi_hdf5

// DeviceMesh over MPI: every factorisation of each communicator size into 1-, 2- and 3-D meshes;
// coords, rank_of, and the membership and ordering of dim_comm / dims_comm.
#include <catch2/catch_test_macros.hpp>

#include "support/mpi_harness.hpp"

namespace st_mesh_mpi_device_mesh {

using namespace shard;
using namespace shard::test;

namespace {
// Every mesh shape with 1..3 dims whose product is p (e.g. p = 4: {4}, {1,4}, {2,2}, {4,1}, {1,2,2}, ...).
std::vector<std::vector<int>> mesh_shapes(int p) {
  std::vector<std::vector<int>> out = {{p}};
  for (int a = 1; a <= p; ++a) {
    if (p % a) continue;
    out.push_back({a, p / a});
    for (int b = 1; b <= p / a; ++b)
      if ((p / a) % b == 0) out.push_back({a, b, p / a / b});
  }
  return out;
}

// Row-major coordinates of rank r in `shape` (the reference for DeviceMesh::coords_of).
std::vector<int> unravel_rank(int r, const std::vector<int>& shape) {
  std::vector<int> c(shape.size());
  for (int m = static_cast<int>(shape.size()) - 1; m >= 0; --m) {
    c[static_cast<std::size_t>(m)] = r % shape[static_cast<std::size_t>(m)];
    r /= shape[static_cast<std::size_t>(m)];
  }
  return c;
}

// Checks that `sub` holds exactly the mesh ranks that share this rank's coordinates outside `dims`,
// ordered row-major over `dims`.
void check_group(const DeviceMesh& mesh, const CommPtr& sub, const std::vector<int>& dims) {
  int want_size = 1;
  for (int m : dims) want_size *= mesh.size(m);
  REQUIRE(sub->size() == want_size);
  int want_rank = 0;
  for (int m : dims) want_rank = want_rank * mesh.size(m) + mesh.coord(m);
  CHECK(sub->rank() == want_rank);
  const auto members = sub->allgather_value<int>(mesh.rank());
  for (int g = 0; g < want_size; ++g) {
    auto c = mesh.coords();
    int rem = g;
    for (int k = static_cast<int>(dims.size()) - 1; k >= 0; --k) {
      const int m = dims[static_cast<std::size_t>(k)];
      c[static_cast<std::size_t>(m)] = rem % mesh.size(m);
      rem /= mesh.size(m);
    }
    CHECK(members[static_cast<std::size_t>(g)] == mesh.rank_of(c));
  }
}
}  // namespace

TEST_CASE("DeviceMesh: coords, rank_of, dim_comm and dims_comm for every 1-/2-/3-D shape", "[mesh][mpi]") {
  for_each_comm([](CommPtr comm) {
    const int p = comm->size();
    for (const auto& shape : mesh_shapes(p)) {
      INFO(fmt::format("mesh {} over {} ranks", shape, p));
      DeviceMesh mesh(comm, shape);
      CHECK(mesh.shape() == shape);
      CHECK(mesh.size() == p);
      CHECK(mesh.rank() == comm->rank());
      CHECK(mesh.coords() == unravel_rank(comm->rank(), shape));
      for (int r = 0; r < p; ++r) {
        CHECK(mesh.coords_of(r) == unravel_rank(r, shape));
        CHECK(mesh.rank_of(mesh.coords_of(r)) == r);
      }
      const int nd = mesh.ndim();
      for (int m = 0; m < nd; ++m) {
        CHECK(mesh.coord(m) == mesh.coords()[static_cast<std::size_t>(m)]);
        check_group(mesh, mesh.dim_comm(m), {m});
      }
      // every non-empty subset of mesh dims
      for (unsigned mask = 1; mask < (1u << nd); ++mask) {
        std::vector<int> dims;
        for (int m = 0; m < nd; ++m)
          if (mask & (1u << m)) dims.push_back(m);
        const auto sub = mesh.dims_comm(dims);
        check_group(mesh, sub, dims);
        CHECK(mesh.dims_comm(dims) == sub);  // cached
      }
      CHECK(mesh.dims_comm({0}) == mesh.dim_comm(0));
    }
  });
}

TEST_CASE("DeviceMesh: names, world(), shared copies", "[mesh][mpi][world]") {
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    DeviceMesh mesh(comm, {1, p}, {"dp", "space"});
    CHECK(mesh.dim_index("space") == 1);
    CHECK(mesh.dim_comm(mesh.dim_index("space"))->size() == p);
    CHECK(mesh.dim_comm(mesh.dim_index("dp"))->size() == 1);
    const DeviceMesh copy = mesh;
    CHECK(copy == mesh);
    CHECK(copy.dim_comm(1) == mesh.dim_comm(1));
    CHECK(fmt::format("{}", mesh) ==
          fmt::format("DeviceMesh(shape=[1, {}], names=[\"dp\", \"space\"], rank={}, coords=[0, {}])", p,
                      comm->rank(), comm->rank()));
  });
  auto w = DeviceMesh::world();
  CHECK(w.size() == world_size());
  CHECK(w.ndim() == 1);
  CHECK(w.comm()->backend() == "mpi");
}

}  // namespace st_mesh_mpi_device_mesh

// Redistribution round trips: for every pair of placements (src, dst) drawn from {Shard(0),
// Shard(1), Replicate, Partial(sum), Partial(max), Partial(avg)} per mesh dim, on 1-D, 2-D and
// 3-D meshes, with even, uneven and empty shards, explicit sizes, fp64 and fp32. Oracle: the full
// tensor — distribute it, redistribute, and full_tensor() must give it back exactly; non-Partial
// targets must also hold exactly their box of it locally. (The one exception is reducing a
// Partial(avg): the mean of 3 equal values may differ from the value in the last bit.)
#include <catch2/catch_test_macros.hpp>

#include <limits>

#include "support/mpi_harness.hpp"

namespace st_dist_mpi_redistribute {

using namespace shard;
using namespace shard::test;

namespace {

const std::vector<Placement> kPlacements = {Shard(0),         Shard(1), Replicate(), Partial(ReduceOp::sum),
                                            Partial(ReduceOp::max), Partial(ReduceOp::avg)};

// Every combination of kPlacements over `n` mesh dims (6^n of them).
std::vector<std::vector<Placement>> all_placements(int n) {
  std::vector<std::vector<Placement>> out = {{}};
  for (int m = 0; m < n; ++m) {
    std::vector<std::vector<Placement>> next;
    for (const auto& prefix : out)
      for (const auto& p : kPlacements) {
        next.push_back(prefix);
        next.back().push_back(p);
      }
    out = std::move(next);
  }
  return out;
}

std::string describe(const std::vector<Placement>& ps) {
  std::string s = "[";
  for (std::size_t i = 0; i < ps.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", ps[i]);
  return s + "]";
}

bool has_avg(const std::vector<Placement>& ps) {
  for (const auto& p : ps)
    if (p.is_partial() && p.op == ReduceOp::avg) return true;
  return false;
}

// Allowed max_rel_diff against the full tensor: exact, except where a Partial(avg) is reduced —
// the mean of p equal values, (v + ... + v) / p, is not exact in floating point for p = 3.
template <class T> double allowed_error(const std::vector<Placement>& a, const std::vector<Placement>& b) {
  return has_avg(a) || has_avg(b) ? 4 * std::numeric_limits<T>::epsilon() : 0.0;
}

template <class T, int R = 2>
Tensor<T, R> global_tensor(const std::type_identity_t<Shape<R>>& shape, std::uint64_t seed) {
  auto t = Tensor<T, R>::empty(shape);
  t.fill_random(seed);
  return t;
}

// Counts failures without Catch's per-assertion overhead; reported once per (mesh, shape, dtype).
struct Tally {
  int checked = 0;
  std::vector<std::string> failures;
  template <class Describe> void expect(bool ok, Describe&& what, const char* check) {
    ++checked;
    if (!ok && failures.size() < 10) failures.push_back(what() + ": " + check);
  }
};

// distribute(full, src) -> redistribute(dst) -> compare the local block and full_tensor() with `full`.
template <class T, int R>
void round_trip(Tally& tally, const DeviceMesh& mesh, const Tensor<T, R>& full, const std::vector<Placement>& src,
                const std::vector<Placement>& dst, const ShardSizes& src_sizes = {},
                const ShardSizes& dst_sizes = {}) {
  using DT = DistTensor<T, R>;
  const auto what = [&] {
    return fmt::format("mesh {} global {} {} {} -> {} sizes {} -> {} (rank {})", mesh.shape(), full.shape(),
                       dtype_of<T>, describe(src), describe(dst), src_sizes, dst_sizes, mesh.rank());
  };
  const double allowed = allowed_error<T>(src, dst);
  auto a = DT::distribute(full, mesh, src, -1, src_sizes);
  const auto a_before = a.local().clone();
  auto b = a.redistribute(dst, dst_sizes);
  tally.expect(b.placements() == dst, what, "placements");
  if (!dst_sizes.empty())
    for (int d = 0; d < R; ++d)
      if (!dst_sizes[static_cast<std::size_t>(d)].empty())
        tally.expect(b.layout(d).sizes() == dst_sizes[static_cast<std::size_t>(d)], what, "target sizes");
  if (!b.spec().has_partial()) {
    const Box box = b.spec().local_box();
    const auto want = full.slice(DT::from_vec(box.lo), DT::from_vec(box.len));
    tally.expect(b.local().shape() == want.shape() && max_rel_diff(b.local(), want) <= allowed, what, "local block");
  }
  const auto f = b.full_tensor();
  tally.expect(f.shape() == full.shape() && max_rel_diff(f, full) <= allowed, what, "full_tensor");
  // the source is left untouched (redistribute never writes its input)
  tally.expect(max_rel_diff(a.local(), a_before) == 0.0, what, "source intact");
}

void report(const Tally& t) {
  for (const auto& f : t.failures) FAIL_CHECK(f);
  CHECK(t.failures.empty());
  CHECK(t.checked > 0);
}

const std::vector<Shape<2>> kShapes = {{9, 7}, {2, 5}, {8, 8}};

}  // namespace

TEST_CASE("redistribute: every placement pair on 1-D meshes, shapes {9,7} {2,5} {8,8}, fp64 and fp32",
          "[dist][redistribute][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm);
    const auto ps = all_placements(1);
    for (const auto& shape : kShapes) {
      Tally t64, t32;
      const auto f64 = global_tensor<double>(shape, 11);
      const auto f32 = global_tensor<float>(shape, 12);
      for (const auto& src : ps)
        for (const auto& dst : ps) {
          round_trip(t64, mesh, f64, src, dst);
          round_trip(t32, mesh, f32, src, dst);
        }
      report(t64);
      report(t32);
    }
  });
}

TEST_CASE("redistribute: every pair of 2-D placements on every 2-D mesh", "[dist][redistribute][mpi]") {
  // 36 x 36 pairs per mesh. Every pair runs on every mesh shape; global shape and dtype rotate
  // with the pair index so that each mesh still sees even, uneven and empty shards in both dtypes.
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    std::vector<std::vector<int>> shapes = {{1, p}, {p, 1}};  // 2x2: see the next test
    if (p == 1) shapes.pop_back();
    const auto ps = all_placements(2);
    for (const auto& mshape : shapes) {
      DeviceMesh mesh(comm, mshape);
      Tally tally;
      std::vector<Tensor<double, 2>> f64;
      std::vector<Tensor<float, 2>> f32;
      for (const auto& s : kShapes) {
        f64.push_back(global_tensor<double>(s, 21));
        f32.push_back(global_tensor<float>(s, 22));
      }
      std::size_t k = 0;
      for (const auto& src : ps)
        for (const auto& dst : ps) {
          const std::size_t which = k % kShapes.size();
          if ((k / kShapes.size()) % 2 == 0) round_trip(tally, mesh, f64[which], src, dst);
          else round_trip(tally, mesh, f32[which], src, dst);
          ++k;
        }
      INFO(fmt::format("mesh {}", mshape));
      report(tally);
    }
  });
}

TEST_CASE("redistribute: 2x2 mesh, every pair, in every global shape", "[dist][redistribute][mpi]") {
  // The one mesh where two mesh dims of size > 1 can shard one tensor dim: the full cross product.
  for_each_comm_size(
      [](CommPtr comm) {
        DeviceMesh mesh(comm, {2, 2});
        const auto ps = all_placements(2);
        for (const auto& shape : kShapes) {
          Tally tally;
          const auto f64 = global_tensor<double>(shape, 31);
          const auto f32 = global_tensor<float>(shape, 32);
          bool dbl = true;  // dtype alternates from pair to pair (the core is type-erased)
          for (const auto& src : ps)
            for (const auto& dst : ps) {
              if (dbl) round_trip(tally, mesh, f64, src, dst);
              else round_trip(tally, mesh, f32, src, dst);
              dbl = !dbl;
            }
          report(tally);
        }
      },
      4, 4);
}

TEST_CASE("redistribute: 3-D meshes", "[dist][redistribute][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    std::vector<std::vector<int>> shapes = {{1, 1, p}, {p, 1, 1}};
    if (p == 4) shapes = {{1, 2, 2}, {2, 1, 2}, {2, 2, 1}};
    const auto ps = all_placements(3);
    const auto f64 = global_tensor<double>({9, 7}, 41);
    const auto f32 = global_tensor<float>({2, 5}, 42);
    for (const auto& mshape : shapes) {
      DeviceMesh mesh(comm, mshape);
      Tally tally;
      // Each of the 216 source placements goes to one target spread over the 216 (a fixed stride
      // through the list) and to its reverse.
      for (std::size_t i = 0; i < ps.size(); ++i) {
        const auto& src = ps[i];
        std::vector<Placement> rev(src.rbegin(), src.rend());
        if (i % 2) round_trip(tally, mesh, f64, src, ps[(i * 37 + 11) % ps.size()]);
        else round_trip(tally, mesh, f32, src, ps[(i * 101 + 5) % ps.size()]);
        round_trip(tally, mesh, f64, src, rev);
      }
      INFO(fmt::format("mesh {}", mshape));
      report(tally);
    }
  });
}

TEST_CASE("redistribute: explicit ShardSizes (incl. empty parts) on source and target", "[dist][redistribute][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    // dim 0 (extent 9) over p parts: the first part empty, the rest balanced; dim 1 (extent 7):
    // everything on the last part.
    std::vector<index_t> a0(static_cast<std::size_t>(p), 0), a1(static_cast<std::size_t>(p), 0);
    for (int i = 1; i < p; ++i) a0[static_cast<std::size_t>(i)] = balanced_size(9, p - 1, i - 1);
    if (p == 1) a0[0] = 9;
    a1.back() = 7;
    std::vector<index_t> b0(a0.rbegin(), a0.rend());  // reversed: the last part empty
    DeviceMesh mesh(comm);
    Tally tally;
    const auto f64 = global_tensor<double>({9, 7}, 51);
    const auto f32 = global_tensor<float>({9, 7}, 52);
    const ShardSizes sa0 = {a0, {}}, sb0 = {b0, {}}, sa1 = {{}, a1};
    for (const auto& src : all_placements(1)) {
      round_trip(tally, mesh, f64, src, {Shard(0)}, {}, sa0);
      round_trip(tally, mesh, f32, src, {Shard(1)}, {}, sa1);
      round_trip(tally, mesh, f64, {Shard(0)}, src, sa0, {});
      round_trip(tally, mesh, f32, {Shard(1)}, src, sa1, {});
    }
    round_trip(tally, mesh, f64, {Shard(0)}, {Shard(0)}, sa0, sb0);  // same placement, new layout
    round_trip(tally, mesh, f32, {Shard(0)}, {Shard(0)}, sb0, {});  // back to balanced
    round_trip(tally, mesh, f64, {Shard(0)}, {Shard(1)}, sb0, sa1);
    round_trip(tally, mesh, f64, {Shard(1)}, {Shard(0)}, sa1, sb0);
    // 2-D meshes: a dim sharded over both mesh dims takes p sizes (row-major over the mesh dims).
    for (std::vector<int> ms : {std::vector<int>{1, p}, std::vector<int>{p, 1}}) {
      DeviceMesh m2(comm, ms);
      for (const auto& src : all_placements(2)) {
        round_trip(tally, m2, f64, src, {Shard(0), Shard(0)}, {}, sb0);
        round_trip(tally, m2, f32, {Shard(0), Shard(0)}, src, sa0, {});
      }
    }
    if (p == 4) {
      DeviceMesh m22(comm, {2, 2});
      const ShardSizes s4 = {{0, 2, 7, 0}, {}}, s2x2 = {{9, 0}, {3, 4}};
      for (const auto& src : all_placements(2)) {
        round_trip(tally, m22, f64, src, {Shard(0), Shard(0)}, {}, s4);
        round_trip(tally, m22, f32, {Shard(0), Shard(0)}, src, s4, {});
        round_trip(tally, m22, f64, src, {Shard(0), Shard(1)}, {}, s2x2);
        round_trip(tally, m22, f32, {Shard(0), Shard(1)}, src, s2x2, {});
      }
    }
    report(tally);
  });
}

TEST_CASE("redistribute: tensors of rank 0, 1 and 3", "[dist][redistribute][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    std::vector<std::vector<int>> shapes = {{p}, {1, p}, {p, 1}};
    if (p == 4) shapes.push_back({2, 2});
    const std::vector<Placement> partials = {Replicate(), Partial(ReduceOp::sum), Partial(ReduceOp::max),
                                             Partial(ReduceOp::min), Partial(ReduceOp::avg)};
    const std::vector<Placement> rank1 = {Shard(0), Replicate(), Partial(ReduceOp::sum), Partial(ReduceOp::max)};
    const std::vector<Placement> rank3 = {Shard(0), Shard(1), Shard(2), Replicate(), Partial(ReduceOp::sum)};
    // Every combination of `set` over the mesh dims of `mesh`.
    auto combos = [](const std::vector<Placement>& set, int nd) {
      std::vector<std::vector<Placement>> out = {{}};
      for (int m = 0; m < nd; ++m) {
        std::vector<std::vector<Placement>> next;
        for (const auto& prefix : out)
          for (const auto& pl : set) {
            next.push_back(prefix);
            next.back().push_back(pl);
          }
        out = std::move(next);
      }
      return out;
    };
    const auto s0 = global_tensor<double, 0>({}, 201);
    const auto s1 = global_tensor<float, 1>({7}, 202);
    const auto s3 = global_tensor<double, 3>({5, 4, 3}, 203);
    for (const auto& ms : shapes) {
      DeviceMesh mesh(comm, ms);
      const int nd = mesh.ndim();
      Tally tally;
      for (const auto& src : combos(partials, nd))
        for (const auto& dst : combos(partials, nd)) round_trip(tally, mesh, s0, src, dst);
      for (const auto& src : combos(rank1, nd))
        for (const auto& dst : combos(rank1, nd)) round_trip(tally, mesh, s1, src, dst);
      const auto c3 = combos(rank3, nd);
      for (std::size_t i = 0; i < c3.size(); ++i)
        for (std::size_t j = 0; j < c3.size(); ++j)
          if (nd == 1 || (i + j) % 3 == 0) round_trip(tally, mesh, s3, c3[i], c3[j]);  // a third of the 2-D pairs
      INFO(fmt::format("mesh {}", ms));
      report(tally);
    }
  });
}

}  // namespace st_dist_mpi_redistribute

// DistTensor construction and value semantics over MPI: from_local (zero-copy, gathered and explicit
// sizes), distribute from one root, random at any rank count, genuine Partial values, and which
// communication each redistribution performs (plan + counted calls).
#include <catch2/catch_test_macros.hpp>

#include <limits>

#include "dist/counting_comm.hpp"
#include "support/mpi_harness.hpp"

namespace st_dist_mpi_dist_tensor {

using namespace shard;
using namespace shard::test;

namespace {
const std::vector<Placement> kPlacements = {Shard(0),         Shard(1), Replicate(), Partial(ReduceOp::sum),
                                            Partial(ReduceOp::max), Partial(ReduceOp::avg)};

// Allowed max_rel_diff against the full tensor: exact, except where a Partial(avg) is reduced (the
// mean of 3 equal values may differ from the value in the last bit).
template <class T> double allowed_error(const std::vector<Placement>& ps) {
  for (const auto& p : ps)
    if (p.is_partial() && p.op == ReduceOp::avg) return 4 * std::numeric_limits<T>::epsilon();
  return 0.0;
}

template <class T> Tensor<T, 2> global_tensor(const Shape<2>& shape, std::uint64_t seed) {
  auto t = Tensor<T, 2>::empty(shape);
  t.fill_random(seed);
  return t;
}
}  // namespace

TEST_CASE("from_local: zero-copy view of user memory with gathered uneven sizes", "[dist][from_local][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int r = comm->rank(), p = comm->size();
    DeviceMesh mesh(comm);
    // rank q holds (q + 2) % 3 rows of a 5-column array (some ranks hold none), inside a ghosted
    // buffer with one ghost cell around it.
    auto rows_of = [](int q) { return static_cast<index_t>((q + 2) % 3); };
    index_t total = 0, my_off = 0;
    std::vector<index_t> want_sizes;
    for (int q = 0; q < p; ++q) {
      if (q == r) my_off = total;
      want_sizes.push_back(rows_of(q));
      total += rows_of(q);
    }
    const index_t rows = rows_of(r), cols = 5;
    std::vector<double> user(static_cast<std::size_t>((rows + 2) * (cols + 2)), -1.0);
    auto interior = Tensor<double, 2>::view(user.data() + (cols + 2) + 1, {rows, cols}, {cols + 2, 1});
    const auto full = global_tensor<double>({total, cols}, 61);
    interior.copy_from(full.narrow(0, my_off, rows));

    auto dt = DistTensor<double, 2>::from_local(interior, mesh, {Shard(0)});
    CHECK(dt.local().data() == interior.data());  // zero-copy
    CHECK(dt.local().data() == (rows ? user.data() + cols + 3 : user.data() + cols + 3));
    CHECK(dt.global_shape() == Shape<2>{total, cols});
    CHECK(dt.layout(0).sizes() == want_sizes);
    CHECK(dt.local_offset() == Shape<2>{my_off, 0});
    CHECK(max_rel_diff(dt.full_tensor(), full) == 0.0);
    // Writes by the user are seen through the DistTensor (it is a view).
    if (rows > 0) {
      user[static_cast<std::size_t>(cols + 3)] = 1234.5;
      CHECK(dt.local()(0, 0) == 1234.5);
      user[static_cast<std::size_t>(cols + 3)] = full(my_off, 0);
    }
    // The same with the sizes given explicitly (and through a redistribution to Shard(1)).
    auto dt2 = DistTensor<double, 2>::from_local(interior, mesh, {Shard(0)}, {want_sizes, {}});
    CHECK(dt2.local().data() == interior.data());
    CHECK(dt2.spec() == dt.spec());
    CHECK(max_rel_diff(dt2.redistribute({Shard(1)}).full_tensor(), full) == 0.0);
    // The ghost cells are untouched.
    CHECK(user[0] == -1.0);
    CHECK(user.back() == -1.0);
  });
}

TEST_CASE("from_local: 2-D meshes, replicated and Partial local blocks", "[dist][from_local][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    const auto full = global_tensor<float>({7, 9}, 62);
    for (std::vector<int> ms : {std::vector<int>{1, p}, std::vector<int>{p, 1}}) {
      DeviceMesh mesh(comm, ms);
      // Shard(1) over mesh dim 0, Shard(0) over mesh dim 1: take this rank's block by the balanced rule.
      const int c0 = mesh.coord(0), c1 = mesh.coord(1);
      const index_t r0 = balanced_offset(7, ms[1], c1), n0 = balanced_size(7, ms[1], c1);
      const index_t r1 = balanced_offset(9, ms[0], c0), n1 = balanced_size(9, ms[0], c0);
      auto block = full.slice({r0, r1}, {n0, n1}).contiguous();
      auto dt = DistTensor<float, 2>::from_local(block, mesh, {Shard(1), Shard(0)});
      CHECK(dt.local().data() == block.data());
      CHECK(dt.global_shape() == Shape<2>{7, 9});
      CHECK(max_rel_diff(dt.full_tensor(), full) == 0.0);
      // Replicated everywhere.
      auto rep = DistTensor<float, 2>::from_local(full, mesh, {Replicate(), Replicate()});
      CHECK(rep.local().data() == full.data());
      CHECK(max_rel_diff(rep.redistribute({Shard(0), Shard(1)}).full_tensor(), full) == 0.0);
    }
  });
}

TEST_CASE("Partial value semantics: genuine per-rank partial values reduce by their op", "[dist][partial][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int r = comm->rank(), p = comm->size();
    const Shape<2> g{9, 7};
    std::vector<std::vector<int>> shapes = {{p}, {1, p}, {p, 1}};
    if (p == 4) shapes.push_back({2, 2});
    for (const auto& ms : shapes) {
      DeviceMesh mesh(comm, ms);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        INFO(fmt::format("op {} mesh {}", op, ms));
        // rank q holds random(seed 70 + q); the tensor is their reduction over every mesh dim.
        auto expect = Tensor<double, 2>::empty(g);
        for (int q = 0; q < p; ++q) {
          const auto v = global_tensor<double>(g, 70 + static_cast<std::uint64_t>(q));
          if (q == 0) expect.copy_from(v);
          else if (op == ReduceOp::sum || op == ReduceOp::avg) zip_into(expect, expect, v, [](double a, double b) { return a + b; });
          else if (op == ReduceOp::max) zip_into(expect, expect, v, [](double a, double b) { return std::max(a, b); });
          else zip_into(expect, expect, v, [](double a, double b) { return std::min(a, b); });
        }
        if (op == ReduceOp::avg) scale(expect, 1.0 / p);
        const auto mine = global_tensor<double>(g, 70 + static_cast<std::uint64_t>(r));
        const std::vector<Placement> partial(ms.size(), Partial(op));
        auto part = DistTensor<double, 2>::from_local(mine, mesh, partial);
        CHECK(max_rel_diff(part.full_tensor(), expect) <= tol<double>());
        for (const auto& dst : kPlacements) {
          if (dst.is_partial()) continue;
          std::vector<Placement> target(ms.size(), dst);
          if (ms.size() == 2 && dst.is_shard()) target[1] = Shard(1 - dst.dim);  // a 2-D decomposition
          auto d = part.redistribute(target);
          CHECK(max_rel_diff(d.full_tensor(), expect) <= tol<double>());
          const Box b = d.spec().local_box();
          CHECK(max_rel_diff(d.local(), expect.slice({b.lo[0], b.lo[1]}, {b.len[0], b.len[1]})) <= tol<double>());
        }
        // Partial(op) -> another Partial: same global value.
        const std::vector<Placement> other_op(ms.size(), Partial(op == ReduceOp::max ? ReduceOp::sum : ReduceOp::max));
        CHECK(max_rel_diff(part.redistribute(other_op).full_tensor(), expect) <= tol<double>());
        // The user's block was not modified by any of this.
        CHECK(max_rel_diff(mine, global_tensor<double>(g, 70 + static_cast<std::uint64_t>(r))) == 0.0);
      }
    }
  });
}

TEST_CASE("redistribute never writes the user's block", "[dist][from_local][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    DeviceMesh mesh(comm);
    const auto full = global_tensor<double>({4, 6}, 111);
    std::vector<double> user(full.data(), full.data() + full.numel());
    auto view = Tensor<double, 2>::view(user.data(), {4, 6});
    auto rep = DistTensor<double, 2>::from_local(view, mesh, {Replicate()});
    for (const auto& dst : kPlacements) {
      auto d = rep.redistribute({dst});  // Partial(sum) zeroes all but one rank's copy of the block
      CHECK(max_rel_diff(d.full_tensor(), full) <= allowed_error<double>({dst}));
      CHECK(std::equal(user.begin(), user.end(), full.data()));
    }
  });
}

TEST_CASE("random: the same global tensor under every placement at every rank count", "[dist][random][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int p = comm->size();
    for (const Shape<2>& g : {Shape<2>{9, 7}, Shape<2>{2, 5}}) {
      const auto f64 = global_tensor<double>(g, 81);
      const auto f32 = global_tensor<float>(g, 81);
      for (std::vector<int> ms : {std::vector<int>{p}, std::vector<int>{1, p}, std::vector<int>{p, 1}}) {
        DeviceMesh mesh(comm, ms);
        const int nd = mesh.ndim();
        for (std::size_t i = 0; i < (nd == 1 ? 6u : 36u); ++i) {
          std::vector<Placement> pl = {kPlacements[i % 6]};
          if (nd == 2) pl.push_back(kPlacements[i / 6]);
          INFO(fmt::format("mesh {} placements {} {}", ms, pl[0], nd == 2 ? fmt::format("{}", pl[1]) : ""));
          auto a = DistTensor<double, 2>::random(g, mesh, pl, 81);
          CHECK(max_rel_diff(a.full_tensor(), f64) <= allowed_error<double>(pl));
          auto b = DistTensor<float, 2>::random(g, mesh, pl, 81);
          CHECK(max_rel_diff(b.full_tensor(), f32) <= allowed_error<float>(pl));
          // and redistributing a random Partial/Shard source keeps the value
          auto c = a.redistribute(nd == 1 ? std::vector<Placement>{Shard(1)} : std::vector<Placement>{Shard(1), Shard(0)});
          CHECK(max_rel_diff(c.full_tensor(), f64) <= allowed_error<double>(pl));
        }
      }
      // Explicit sizes with an empty part.
      DeviceMesh mesh(comm);
      std::vector<index_t> sz(static_cast<std::size_t>(p), 0);
      sz.back() = g[0];
      auto e = DistTensor<double, 2>::random(g, mesh, {Shard(0)}, 81, {}, {sz, {}});
      CHECK(max_rel_diff(e.full_tensor(), f64) == 0.0);
      auto z = DistTensor<double, 2>::zeros(g, mesh, {Shard(1)});
      CHECK(sum(map(z.full_tensor(), [](double x) { return std::abs(x); })) == 0.0);
    }
  });
}

TEST_CASE("distribute from one root: every root, 1-D and 2-D meshes, all placements", "[dist][distribute][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int r = comm->rank(), p = comm->size();
    const auto full = global_tensor<double>({9, 7}, 91);
    for (std::vector<int> ms : {std::vector<int>{p}, std::vector<int>{p, 1}}) {
      DeviceMesh mesh(comm, ms);
      for (int root = 0; root < p; ++root) {
        for (const auto& pl : kPlacements) {
          std::vector<Placement> pls = {pl};
          if (ms.size() == 2) pls.push_back(Shard(1));
          INFO(fmt::format("root {} mesh {} placement {}", root, ms, pl));
          // Only the root holds the data; the others pass an empty tensor.
          const Tensor<double, 2> mine = r == root ? full : Tensor<double, 2>();
          auto dt = DistTensor<double, 2>::distribute(mine, mesh, pls, root);
          CHECK(dt.global_shape() == full.shape());
          CHECK(dt.placements() == pls);
          CHECK(max_rel_diff(dt.full_tensor(), full) <= allowed_error<double>(pls));
        }
        // With explicit target sizes (first part takes everything).
        std::vector<index_t> sz(static_cast<std::size_t>(p), 0);
        sz.front() = 9;
        std::vector<Placement> pls = {Shard(0)};
        if (ms.size() == 2) pls.push_back(Replicate());
        auto dt = DistTensor<double, 2>::distribute(r == root ? full : Tensor<double, 2>(), mesh, pls, root, {sz, {}});
        CHECK(dt.layout(0).sizes() == sz);
        CHECK(max_rel_diff(dt.full_tensor(), full) == 0.0);
      }
    }
  });
}

TEST_CASE("redistribute_plan and counted communication per transition", "[dist][plan][mpi]") {
  for_each_comm_size(
      [](CommPtr comm) {
        // The redistribute's own traffic: without the consistency check's allgather (debug mode,
        // SHARDTENSOR_CHECK_COLLECTIVES, counted in tests/dist/mpi_collective_check.cpp).
        ExecContext unchecked;
        unchecked.settings().check_collectives = false;
        ContextGuard guard(unchecked);
        auto counting = std::make_shared<CountingComm>(comm);
        DeviceMesh mesh(counting);
        const auto full = global_tensor<double>({9, 7}, 101);
        using K = detail::RedistStepKind;
        struct Case {
          Placement src, dst;
          std::vector<K> plan;
          std::map<std::string, int> calls;  // communication the redistribute itself performs
        };
        const std::vector<Case> cases = {
            {Replicate(), Shard(0), {K::local}, {}},
            {Replicate(), Shard(1), {K::local}, {}},
            {Replicate(), Partial(ReduceOp::sum), {K::create_partial}, {}},
            {Replicate(), Partial(ReduceOp::avg), {K::create_partial}, {}},
            {Shard(0), Replicate(), {K::allgatherv}, {{"allgatherv", 1}}},
            {Shard(1), Replicate(), {K::allgatherv}, {{"allgatherv", 1}}},
            {Shard(0), Shard(1), {K::alltoallv}, {{"alltoallv", 1}}},
            {Shard(1), Shard(0), {K::alltoallv}, {{"alltoallv", 1}}},
            {Partial(ReduceOp::sum), Shard(0), {K::reduce_scatterv}, {{"reduce_scatterv", 1}}},
            {Partial(ReduceOp::max), Shard(1), {K::reduce_scatterv}, {{"reduce_scatterv", 1}}},
            {Partial(ReduceOp::sum), Replicate(), {K::allreduce}, {{"allreduce", 1}}},
            {Partial(ReduceOp::avg), Replicate(), {K::allreduce}, {{"allreduce", 1}}},
            {Shard(0), Shard(0), {}, {}},
        };
        for (const auto& c : cases) {
          INFO(fmt::format("{} -> {} on {} ranks", c.src, c.dst, comm->size()));
          auto a = DistTensor<double, 2>::distribute(full, mesh, {c.src});
          const DistSpec target = a.spec().with_placements({c.dst});
          counting->reset();
          const auto plan = detail::redistribute_plan(a.spec(), target);
          CHECK(plan->kinds() == c.plan);
          CHECK(plan->collectives() == static_cast<int>(c.calls.size()));
          CHECK(plan->in_shape == a.spec().local_box().len);
          CHECK(plan->out_shape == target.local_box().len);
          CHECK(counting->total() == 0);  // planning never communicates
          CHECK(detail::redistribute_plan(a.spec(), target) == plan);  // cached: the same plan object
          CHECK(!fmt::format("{}", *plan).empty());
          auto b = a.redistribute({c.dst});
          CHECK(counting->counts() == c.calls);
          auto b2 = a.redistribute({c.dst});  // a repeated redistribute plans nothing and moves the same
          CHECK(max_rel_diff(b2.local(), b.local()) == 0.0);
          CHECK(max_rel_diff(b.full_tensor(), full) <= allowed_error<double>({c.src, c.dst}));
        }
      },
      2);
  // 2x2 mesh: a transpose of a 2-D decomposition is one alltoallv; two Partial dims to Replicate
  // are one allreduce each; Replicate -> any sharding is local.
  for_each_comm_size(
      [](CommPtr comm) {
        DeviceMesh mesh(comm, {2, 2});
        DistSpec s01(mesh, {Shard(0), Shard(1)}, {9, 7}), s10(mesh, {Shard(1), Shard(0)}, {9, 7});
        DistSpec rr(mesh, {Replicate(), Replicate()}, {9, 7}), s00(mesh, {Shard(0), Shard(0)}, {9, 7});
        DistSpec pp(mesh, {Partial(), Partial(ReduceOp::max)}, {9, 7});
        using K = detail::RedistStepKind;
        using Ks = std::vector<K>;
        const auto t = detail::redistribute_plan(s01, s10);
        CHECK(t->kinds() == Ks{K::alltoallv});
        CHECK(t->steps[0].mesh_dims == std::vector<int>{0, 1});  // one alltoallv over both mesh dims
        CHECK(t->steps[0].send_counts.size() == 4);
        index_t sent = t->steps[0].has_self ? t->steps[0].local_src.numel() : 0, got = sent;
        for (auto c : t->steps[0].send_counts) sent += c;
        for (auto c : t->steps[0].recv_counts) got += c;
        CHECK(sent == s01.local_box().numel());  // every cell of my block goes somewhere, once
        CHECK(got == s10.local_box().numel());   // every cell of my target block arrives, once
        CHECK(detail::redistribute_plan(rr, s01)->kinds() == Ks{K::local});
        CHECK(detail::redistribute_plan(rr, s00)->kinds() == Ks{K::local});
        const auto r = detail::redistribute_plan(pp, rr);
        CHECK(r->kinds() == Ks{K::allreduce, K::allreduce});
        CHECK(r->steps[0].mesh_dims == std::vector<int>{0});
        CHECK(r->steps[1].mesh_dims == std::vector<int>{1});
        CHECK(r->steps[1].op == ReduceOp::max);
        CHECK(detail::redistribute_plan(s00, s01)->kinds() == Ks{K::alltoallv});
        const auto c = detail::redistribute_plan(rr, pp);
        CHECK(c->kinds() == Ks{K::create_partial, K::create_partial});
        CHECK(c->steps[0].zero == (mesh.coord(0) != 0));  // sum: zeros off coordinate 0
        CHECK(!c->steps[1].zero);                         // max keeps the value everywhere
      },
      4, 4);
}

}  // namespace st_dist_mpi_dist_tensor

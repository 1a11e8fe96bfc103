// Serial checks of the point-cloud ops' building blocks (tests/nn/mpi_point_ops.cpp has the
// sharded oracle): detail::RowExchange on one rank (rows sent twice, to self, nothing, empty
// sources, 1-D blocks; the adjoint by the dot-product test), and the per-entry maths of
// nn/functional/neighbors.hpp on a hand-made list (aggregate's max / mean on empty rows).
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace st_nn_test_point_ops {

using namespace shard;
using autograd::Var;

namespace {

Block host_view(std::vector<double>& v, std::vector<index_t> shape) {
  return Block::view(DType::f64, Device::cpu(), v.data(), shape.data(), static_cast<int>(shape.size()));
}

}  // namespace

TEST_CASE("RowExchange on one rank: repeated rows, local copies, adjoint", "[point_ops][row_exchange]") {
  auto comm = std::make_shared<SelfComm>();
  auto& ctx = current_context();
  const index_t w = 3;
  std::vector<double> src(4 * w);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = 1.0 + static_cast<double>(i);
  detail::RowExchange ex(comm, 4, {0, 5}, {2, 0, 2, 3, 2});
  CHECK(ex.n_recv() == 5);
  CHECK(ex.n_send_remote() == 0);
  std::vector<double> dst(5 * w, -1);
  ex.forward(host_view(src, {4, w}), host_view(dst, {5, w}), ctx);
  const index_t rows[5] = {2, 0, 2, 3, 2};
  for (index_t i = 0; i < 5; ++i)
    for (index_t c = 0; c < w; ++c) CHECK(dst[static_cast<std::size_t>(i * w + c)] == src[static_cast<std::size_t>(rows[i] * w + c)]);
  // <E x, p> == <x, E^T p>
  std::vector<double> p(5 * w), gs(4 * w, 0.0);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = std::sin(1.0 + static_cast<double>(i));
  ex.adjoint_add(host_view(p, {5, w}), host_view(gs, {4, w}), ctx);
  double lhs = 0, rhs = 0;
  for (std::size_t i = 0; i < p.size(); ++i) lhs += dst[i] * p[i];
  for (std::size_t i = 0; i < src.size(); ++i) rhs += src[i] * gs[i];
  CHECK(std::abs(lhs - rhs) <= 1e-12 * std::abs(lhs));
  // row 1 was never sent: its gradient stays 0; row 2 gets three contributions
  for (index_t c = 0; c < w; ++c) {
    CHECK(gs[static_cast<std::size_t>(1 * w + c)] == 0.0);
    CHECK(gs[static_cast<std::size_t>(2 * w + c)] == p[static_cast<std::size_t>(c)] + p[static_cast<std::size_t>(2 * w + c)] +
                                                         p[static_cast<std::size_t>(4 * w + c)]);
  }
  // adjoint_add adds (does not overwrite)
  ex.adjoint_add(host_view(p, {5, w}), host_view(gs, {4, w}), ctx);
  CHECK(gs[static_cast<std::size_t>(3 * w)] == 2 * p[static_cast<std::size_t>(3 * w)]);
}

TEST_CASE("RowExchange on one rank: empty exchanges and 1-D blocks", "[point_ops][row_exchange]") {
  auto comm = std::make_shared<SelfComm>();
  auto& ctx = current_context();
  {
    detail::RowExchange ex(comm, 0, {0, 0}, {});
    std::vector<double> src, dst;
    Block out = ex.forward(host_view(src, {0, 2}), ctx);
    CHECK(out.shape_vec() == std::vector<index_t>{0, 2});
    ex.adjoint_add(host_view(dst, {0, 2}), host_view(src, {0, 2}), ctx);
  }
  {
    detail::RowExchange ex(comm, 3, {0, 0}, {});  // nothing sent
    std::vector<double> src{1, 2, 3}, g{5, 5, 5};
    Block out = ex.forward(host_view(src, {3}), ctx);
    CHECK(out.numel() == 0);
    std::vector<double> none;
    ex.adjoint_add(host_view(none, {0}), host_view(g, {3}), ctx);
    CHECK(g == std::vector<double>{5, 5, 5});
  }
  {
    detail::RowExchange ex(comm, 3, {0, 3}, {2, 2, 0});  // 1-D: [n] blocks
    std::vector<double> src{1, 2, 3};
    Block out = ex.forward(host_view(src, {3}), ctx);
    REQUIRE(out.rank == 1);
    const double* o = static_cast<const double*>(out.data);
    CHECK((o[0] == 3 && o[1] == 3 && o[2] == 1));
    std::vector<double> gr{1, 10, 100}, gs{0, 0, 0};
    ex.adjoint_add(host_view(gr, {3}), host_view(gs, {3}), ctx);
    CHECK(gs == std::vector<double>{100, 0, 11});
  }
  CHECK_THROWS_AS(detail::RowExchange(comm, 2, {0, 1}, {2}), Error);    // row outside [0, n_src)
  CHECK_THROWS_AS(detail::RowExchange(comm, 2, {0, 2}, {0}), Error);    // offsets do not end at the row count
}

TEST_CASE("aggregate on a hand-made list: empty rows, first argmax", "[point_ops]") {
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  // 3 queries, width 3; row 1 is empty, row 2 has a tie in the max.
  Neighbors<double> nb;
  const std::vector<index_t> q{3};
  const std::vector<index_t> s{4};
  nb.query = point_spec(mesh, q, 2);
  nb.support = point_spec(mesh, s, 2);
  auto idx = Tensor<std::int64_t, 2>::empty({3, 3});
  const std::int64_t iv[9] = {0, 1, -1, -1, -1, -1, 2, 3, 1};
  std::copy(iv, iv + 9, idx.data());
  auto cnt = Tensor<std::int64_t, 1>::empty({3});
  cnt.data()[0] = 2, cnt.data()[1] = 0, cnt.data()[2] = 3;
  nb.indices = DistTensor<std::int64_t, 2>(point_rows_spec(nb.query, {3}), idx);
  nb.counts = DistTensor<std::int64_t, 1>(point_rows_spec(nb.query, {}), cnt);
  auto vt = Tensor<double, 3>::empty({3, 3, 1});
  const double vv[9] = {1, 4, 99, 99, 99, 99, 5, 7, 7};
  std::copy(vv, vv + 9, vt.data());
  Var<double, 3> v(DistTensor<double, 3>(point_rows_spec(nb.query, {3, 1}), vt), true);
  auto mx = F::aggregate(v, nb, {F::AggregateReduce::max});
  CHECK(mx.local().data()[0] == 4);
  CHECK(mx.local().data()[1] == 0);
  CHECK(mx.local().data()[2] == 7);
  auto mean = F::aggregate(v, nb, {F::AggregateReduce::mean});
  CHECK(mean.local().data()[0] == 2.5);
  CHECK(mean.local().data()[1] == 0);
  F::sum(F::add(mx, mean)).backward();
  const double* g = v.grad().local().data();
  const double want[9] = {0.5, 1.5, 0, 0, 0, 0, 1.0 / 3, 1 + 1.0 / 3, 1.0 / 3};
  for (int i = 0; i < 9; ++i) CHECK(std::abs(g[i] - want[i]) < 1e-15);
}

TEST_CASE("gather_neighbors: features of another dtype than the coordinates; plan rebuilt for new indices",
          "[point_ops]") {
  DeviceMesh mesh(std::make_shared<SelfComm>(), {1});
  const std::vector<index_t> q{2}, s{3};
  Neighbors<double> nb;
  nb.query = point_spec(mesh, q, 2);
  nb.support = point_spec(mesh, s, 2);
  auto idx = Tensor<std::int64_t, 2>::empty({2, 2});
  const std::int64_t iv[4] = {2, 0, 1, -1};
  std::copy(iv, iv + 4, idx.data());
  auto cnt = Tensor<std::int64_t, 1>::empty({2});
  cnt.data()[0] = 2, cnt.data()[1] = 1;
  nb.indices = DistTensor<std::int64_t, 2>(point_rows_spec(nb.query, {2}), idx);
  nb.counts = DistTensor<std::int64_t, 1>(point_rows_spec(nb.query, {}), cnt);
  auto ft = Tensor<float, 2>::empty({3, 1});
  ft.data()[0] = 10, ft.data()[1] = 20, ft.data()[2] = 30;
  Var<float, 2> f(DistTensor<float, 2>(point_spec(mesh, s, 1), ft), true);
  auto y = F::gather_neighbors(f, nb);
  const float want[4] = {30, 10, 20, 0};
  for (int i = 0; i < 4; ++i) CHECK(y.local().data()[i] == want[i]);
  auto a = F::aggregate(y, nb, {F::AggregateReduce::sum});
  CHECK(a.local().data()[0] == 40);
  CHECK(a.local().data()[1] == 20);
  F::sum(a).backward();
  CHECK(f.grad().local().data()[0] == 1);
  CHECK(f.grad().local().data()[1] == 1);
  CHECK(f.grad().local().data()[2] == 1);
  // new indices in the same Neighbors object: the cached plan is not reused
  auto plan = nb.gather_plan;
  auto idx2 = idx.clone();
  idx2.data()[0] = 1;
  nb.indices = DistTensor<std::int64_t, 2>(nb.indices.spec(), idx2);
  auto y2 = F::gather_neighbors(f.detach(), nb);
  CHECK(nb.gather_plan != plan);
  CHECK(y2.local().data()[0] == 20);
}

}  // namespace st_nn_test_point_ops

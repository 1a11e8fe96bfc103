// The complex ops (nn/functional/complex.hpp) sharded at 1-4 ranks against the unsharded
// computation on one rank (SelfComm), fp64 (1e-10) and fp32 (1e-5): forward values and every input
// gradient of a real loss (sum Re(conj(p) y) for a complex output y, sum(q y) for a real one,
// Re(conj(c) s) for a complex scalar s; p, q, c fixed random), on 1-D and 2-D meshes with uneven
// explicit shard sizes, and with Partial(sum) inputs for the linear ops. fp64 central finite
// differences check the gradient convention (grad = dL/dRe + i dL/dIm) of mul, abs, abs_squared
// and complex * real on sharded layouts. Bad input (complex max, mismatched specs, Partial into a
// nonlinear op) throws shard::Error on every rank. On device tensors (the fake CUDA backend of
// tests/support, which runs the CPU tables on "device" memory) every op and gradient equals the
// host's bit for bit, and Tensor's complex device entry points (axpy, scale, mul, sum) work.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <complex>
#include <shardtensor/nn/functional.hpp>

#include "support/fake_cuda_backend.hpp"
#include "support/mpi_harness.hpp"
#include "support/complex_fill.hpp"

namespace st_nn_mpi_complex_ops {

using namespace shard;
using namespace shard::test;
using autograd::Var;
using Catch::Matchers::ContainsSubstring;

namespace {

using cd = std::complex<double>;
const Shape<2> kShape{7, 5};

/// How the inputs lie on the mesh.
struct Lay {
  std::string name;
  std::vector<int> mesh;
  std::vector<Placement> pl;
  ShardSizes sizes;
};

std::vector<Lay> layouts(int P) {
  static const std::vector<std::vector<index_t>> uneven0 = {{}, {}, {5, 2}, {1, 4, 2}, {2, 1, 3, 1}};
  std::vector<Lay> v;
  v.push_back({"1-D Shard(0) uneven", {P}, {Shard(0)}, P > 1 ? ShardSizes{uneven0[static_cast<std::size_t>(P)], {}} : ShardSizes{}});
  v.push_back({"1-D Shard(1)", {P}, {Shard(1)}, {}});
  v.push_back({"1-D Replicate", {P}, {Replicate()}, {}});
  if (P % 2 == 0) {
    ShardSizes s{{4, 3}, P / 2 > 1 ? std::vector<index_t>{3, 2} : std::vector<index_t>{}};
    v.push_back({"2-D Shard(0), Shard(1) uneven", {2, P / 2}, {Shard(0), Shard(1)}, s});
    v.push_back({"2-D Shard(1), Shard(0)", {2, P / 2}, {Shard(1), Shard(0)}, {}});
  }
  return v;
}

/// Layouts with Partial(sum) inputs (for the linear ops).
std::vector<Lay> partial_layouts(int P) {
  std::vector<Lay> v;
  v.push_back({"1-D Partial", {P}, {Partial()}, {}});
  if (P % 2 == 0) {
    v.push_back({"2-D Partial, Shard(0) uneven", {2, P / 2}, {Partial(), Shard(0)},
                 P / 2 > 1 ? ShardSizes{{5, 2}, {}} : ShardSizes{}});
    v.push_back({"2-D Shard(1), Partial", {2, P / 2}, {Shard(1), Partial()}, {}});
  }
  return v;
}



struct Res {
  std::vector<std::vector<cd>> outs, grads;
  double loss = 0;
  bool grad_specs_ok = true;
};

/// One element of one input moved by `delta` (finite differences).
struct Perturb {
  int input = -1;  ///< 0 z, 1 w, 2 r, 3 r2
  index_t index = 0;
  cd delta = 0;
};

enum Op : int {
  op_real, op_imag, op_complex, op_conj, op_add, op_sub, op_mul_real_scalar, op_mul_complex_scalar, op_sum, op_mean,
  kLinearOps,  // the ops above are linear (Partial(sum) inputs allowed)
  op_abs_squared = kLinearOps, op_abs, op_mul, op_mul_zr, op_mul_rz, op_chain,
  kOps
};
const char* op_label(int op) {
  static const char* names[] = {"real", "imag", "complex", "conj", "add", "sub", "mul(z, real s)", "mul(complex s, z)",
                                "sum", "mean", "abs_squared", "abs", "mul(z, w)", "mul(z, r)", "mul(r, z)",
                                "abs(add(mul(z, w), conj(z)))"};
  return names[op];
}

/// Runs op `op` with inputs laid out by `lay` on `mesh`; returns outputs, loss and input gradients.
template <class T>
Res run_op(const DeviceMesh& mesh, const Lay& lay, int op, const Perturb* pert = nullptr, bool grads = true,
           Device dev = Device::cpu()) {
  using C = std::complex<T>;
  auto zt = rnd_cplx<T, 2>(kShape, 1), wt = rnd_cplx<T, 2>(kShape, 2);
  auto rt = rnd_real<T, 2>(kShape, 3), r2t = rnd_real<T, 2>(kShape, 4);
  if (pert) {
    const auto d = pert->delta;
    if (pert->input == 0) zt.data()[pert->index] += C(static_cast<T>(d.real()), static_cast<T>(d.imag()));
    if (pert->input == 1) wt.data()[pert->index] += C(static_cast<T>(d.real()), static_cast<T>(d.imag()));
    if (pert->input == 2) rt.data()[pert->index] += static_cast<T>(d.real());
    if (pert->input == 3) r2t.data()[pert->index] += static_cast<T>(d.real());
  }
  auto dist = [&](const auto& full) {
    using X = typename std::decay_t<decltype(full)>::value_type;
    return Var<X, 2>(DistTensor<X, 2>::distribute(full, mesh, lay.pl, -1, lay.sizes).to(dev), grads);
  };
  auto z = dist(zt), w = dist(wt);
  auto r = dist(rt), r2 = dist(r2t);
  Res res;
  // Weights laid out like the (resolved) output.
  auto loss_c = [&](Var<C, 2> y) {
    y = F::resolve(y);
    res.outs.push_back(flat(y.value().full_tensor()));
    const auto& s = y.value().spec();
    Var<C, 2> p(DistTensor<C, 2>::distribute(rnd_cplx<T, 2>(kShape, 50), mesh, s.placements(), -1, s.sizes()).to(dev),
                false);
    return F::sum(F::real(F::mul(F::conj(p), y)));
  };
  auto loss_r = [&](Var<T, 2> y) {
    y = F::resolve(y);
    res.outs.push_back(flat(y.value().full_tensor()));
    const auto& s = y.value().spec();
    Var<T, 2> q(DistTensor<T, 2>::distribute(rnd_real<T, 2>(kShape, 51), mesh, s.placements(), -1, s.sizes()).to(dev),
                false);
    return F::sum(F::mul(y, q));
  };
  auto loss_s = [&](Var<C, 1> y) {
    y = F::resolve(y);
    res.outs.push_back(flat(y.value().full_tensor()));
    Var<C, 1> c(DistTensor<C, 1>::distribute(rnd_cplx<T, 1>({1}, 52), mesh, y.value().spec().placements()).to(dev),
                false);
    return F::real(F::mul(F::conj(c), y));
  };
  Var<T, 1> loss;
  switch (op) {
    case op_real: loss = loss_r(F::real(z)); break;
    case op_imag: loss = loss_r(F::imag(z)); break;
    case op_complex: loss = loss_c(F::complex(r, r2)); break;
    case op_conj: loss = loss_c(F::conj(z)); break;
    case op_add: loss = loss_c(F::add(z, w)); break;
    case op_sub: loss = loss_c(F::sub(z, w)); break;
    case op_mul_real_scalar: loss = loss_c(F::mul(z, T(-1.5))); break;
    case op_mul_complex_scalar: loss = loss_c(F::mul(C(T(0.5), T(-2)), z)); break;
    case op_sum: loss = loss_s(F::sum(z)); break;
    case op_mean: loss = loss_s(F::mean(z)); break;
    case op_abs_squared: loss = loss_r(F::abs_squared(z)); break;
    case op_abs: loss = loss_r(F::abs(z)); break;
    case op_mul: loss = loss_c(F::mul(z, w)); break;
    case op_mul_zr: loss = loss_c(F::mul(z, r)); break;
    case op_mul_rz: loss = loss_c(F::mul(r, z)); break;
    case op_chain: loss = loss_r(F::abs(F::add(F::mul(z, w), F::conj(z)))); break;
    default: FAIL("unknown op");
  }
  loss = F::resolve(loss);
  res.loss = static_cast<double>(loss.local().to(Device::cpu()).data()[0]);
  if (!grads) return res;
  loss.backward();
  auto take = [&](const auto& v) {
    if (!v.has_grad()) {
      res.grads.emplace_back();
      return;
    }
    res.grad_specs_ok = res.grad_specs_ok && v.grad().spec() == v.value().spec();
    res.grads.push_back(flat(v.grad().full_tensor()));
  };
  take(z);
  take(w);
  take(r);
  take(r2);
  return res;
}

template <class T>
Res reference(int op) {
  static thread_local DeviceMesh self(std::make_shared<SelfComm>(), {1});
  return run_op<T>(self, Lay{"reference", {1}, {Replicate()}, {}}, op);
}

/// max_i |a_i - b_i| / max(1, max|b|) (infinite when the sizes differ).
double rel_err(const std::vector<cd>& a, const std::vector<cd>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

void require_match(const Res& got, const Res& ref, double tol) {
  CHECK(got.outs.size() == ref.outs.size());
  CHECK(got.grads.size() == ref.grads.size());
  for (std::size_t i = 0; i < std::min(got.outs.size(), ref.outs.size()); ++i) {
    INFO("output " << i);
    CHECK(rel_err(got.outs[i], ref.outs[i]) <= tol);
  }
  for (std::size_t i = 0; i < std::min(got.grads.size(), ref.grads.size()); ++i) {
    INFO("gradient of input " << i << " (z, w, r, r2)");
    CHECK(got.grads[i].empty() == ref.grads[i].empty());
    CHECK(rel_err(got.grads[i], ref.grads[i]) <= tol);
  }
  CHECK(std::abs(got.loss - ref.loss) <= tol * std::max(1.0, std::abs(ref.loss)));
  CHECK(got.grad_specs_ok);
}

}  // namespace

TEMPLATE_TEST_CASE("complex ops: sharded == unsharded, forward and every gradient (1-D/2-D meshes, uneven shards)",
                   "[nn][complex][mpi]", double, float) {
  using T = TestType;
  std::vector<Res> refs;
  for (int op = 0; op < kOps; ++op) refs.push_back(reference<T>(op));
  // The reference itself: gradients present exactly for the inputs the op reads.
  CHECK(!refs[op_mul].grads[0].empty());
  CHECK(!refs[op_mul].grads[1].empty());
  CHECK(refs[op_real].grads[1].empty());
  CHECK(!refs[op_mul_zr].grads[2].empty());
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& lay : layouts(comm->size())) {
      DeviceMesh mesh(comm, lay.mesh);
      for (int op = 0; op < kOps; ++op) {
        INFO(dtype_name(dtype_of<std::complex<T>>) << " " << lay.name << " on " << comm->size() << " ranks: " << op_label(op));
        require_match(run_op<T>(mesh, lay, op), refs[static_cast<std::size_t>(op)], tol<T>());
      }
    }
  });
}

TEMPLATE_TEST_CASE("complex ops: Partial(sum) inputs of the linear ops stay Partial and match the reference",
                   "[nn][complex][partial][mpi]", double, float) {
  using T = TestType;
  std::vector<Res> refs;
  for (int op = 0; op < kLinearOps; ++op) refs.push_back(reference<T>(op));
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& lay : partial_layouts(comm->size())) {
      DeviceMesh mesh(comm, lay.mesh);
      for (int op = 0; op < kLinearOps; ++op) {
        INFO(dtype_name(dtype_of<std::complex<T>>) << " " << lay.name << " on " << comm->size() << " ranks: " << op_label(op));
        require_match(run_op<T>(mesh, lay, op), refs[static_cast<std::size_t>(op)], tol<T>());
      }
      // The result of a linear op on a Partial input is left Partial (no communication).
      auto z = Var<std::complex<T>, 2>(
          DistTensor<std::complex<T>, 2>::distribute(rnd_cplx<T, 2>(kShape, 9), mesh, lay.pl, -1, lay.sizes), true);
      CHECK(F::conj(z).value().spec() == z.value().spec());
      CHECK(F::real(z).value().spec() == z.value().spec());
      CHECK(F::mul(z, T(2)).value().spec().has_partial());
    }
  });
}

TEST_CASE("complex ops: fp64 central finite differences of the gradient convention on sharded layouts",
          "[nn][complex][fd][mpi]") {
  // dL/dRe z_j + i dL/dIm z_j by central differences (h = 1e-6) for every element j, against the
  // gradient backward() gives; for mul(z, r) also the real operand's gradient.
  const int ops[] = {op_mul, op_abs, op_abs_squared, op_mul_zr, op_chain};
  for_each_comm_size([&](CommPtr comm) {
    const auto lays = layouts(comm->size());
    const Lay& lay = lays[comm->size() % 2 == 0 ? lays.size() - 2 : 0];  // 2-D uneven where possible
    DeviceMesh mesh(comm, lay.mesh);
    const double h = 1e-6;
    for (int op : ops) {
      const Res g = run_op<double>(mesh, lay, op);
      for (int input = 0; input < 3; ++input) {
        const auto& gi = g.grads[static_cast<std::size_t>(input)];
        if (gi.empty()) continue;
        for (index_t j = 0; j < numel(kShape); j += 3) {
          for (const cd dir : {cd(1, 0), cd(0, 1)}) {
            if (input == 2 && dir.imag() != 0) continue;  // r is real
            Perturb plus{input, j, h * dir}, minus{input, j, -h * dir};
            const double fd =
                (run_op<double>(mesh, lay, op, &plus, false).loss - run_op<double>(mesh, lay, op, &minus, false).loss) /
                (2 * h);
            const cd an = gi[static_cast<std::size_t>(j)];
            const double part = dir.real() != 0 ? an.real() : an.imag();
            INFO(op_label(op) << " on " << comm->size() << " ranks, input " << input << " element " << j << " d"
                              << (dir.real() != 0 ? "Re" : "Im"));
            CHECK(std::abs(fd - part) <= 1e-7 * std::max(1.0, std::abs(part)));
          }
        }
      }
    }
  });
}

TEST_CASE("complex ops: bad input is refused on every rank", "[nn][complex][errors][mpi]") {
  using C = std::complex<double>;
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm);
    auto mk = [&](const Shape<2>& s, std::vector<Placement> pl, const ShardSizes& sizes = {}) {
      return Var<C, 2>(DistTensor<C, 2>::distribute(rnd_cplx<double, 2>(s, 7), mesh, std::move(pl), -1, sizes), true);
    };
    auto z = mk(kShape, {Shard(0)});
    CHECK_THAT(error_of([&] { (void)F::max(z); }), ContainsSubstring("max") && ContainsSubstring("no order"));
    CHECK_THAT(error_of([&] { (void)F::max(z, {1}); }), ContainsSubstring("c128"));
    // Mismatched global shapes, placements, shard sizes.
    auto zt = mk({5, 7}, {Shard(0)});
    CHECK_THAT(error_of([&] { (void)F::add(z, zt); }), ContainsSubstring("add") && ContainsSubstring("global shape"));
    CHECK_THAT(error_of([&] { (void)F::mul(z, zt); }), ContainsSubstring("mul"));
    auto r = Var<double, 2>(DistTensor<double, 2>::distribute(rnd_real<double, 2>({5, 7}, 8), mesh, {Shard(0)}), true);
    CHECK_THAT(error_of([&] { (void)F::mul(z, r); }), ContainsSubstring("mul"));
    CHECK_THAT(error_of([&] { (void)F::complex(r, F::real(z)); }), ContainsSubstring("complex"));
    if (P > 1) {
      auto z1 = mk(kShape, {Shard(1)});
      CHECK_THAT(error_of([&] { (void)F::sub(z, z1); }), ContainsSubstring("sub") && ContainsSubstring("placements"));
      std::vector<index_t> sz(static_cast<std::size_t>(P), 1);
      sz[0] = 7 - (P - 1);
      auto zs = mk(kShape, {Shard(0)}, {sz, {}});
      if (!(zs.value().spec() == z.value().spec()))
        CHECK_THAT(error_of([&] { (void)F::mul(z, zs); }), ContainsSubstring("shard sizes"));
    }
    // Partial into the nonlinear ops.
    auto zp = mk(kShape, {Partial()});
    CHECK_THAT(error_of([&] { (void)F::abs(zp); }), ContainsSubstring("abs") && ContainsSubstring("Partial"));
    CHECK_THAT(error_of([&] { (void)F::abs_squared(zp); }), ContainsSubstring("Partial"));
    CHECK_THAT(error_of([&] { (void)F::mul(zp, zp); }), ContainsSubstring("Partial"));
    // Partial(max) is refused by the linear ops too (only Partial(sum) commutes with them).
    // (from_local may already refuse a complex Partial(max); either way it never reaches the op.)
    CHECK_THAT(error_of([&] {
                 auto zmax = Var<C, 2>(
                     DistTensor<C, 2>::from_local(rnd_cplx<double, 2>(kShape, 3), mesh, {Partial(ReduceOp::max)}), true);
                 (void)F::conj(zmax);
               }),
               ContainsSubstring("max"));
  });
}

TEMPLATE_TEST_CASE("complex ops on device tensors (fake CUDA backend) == on the host, forward and every gradient",
                   "[nn][complex][device][mpi]", double, float) {
  // The fake backend registers the CPU pointwise table (with its complex kernels) for CUDA, so
  // this checks the device route of the front (allocation on the device, results and gradients
  // left there, sum/mean through the table) at 1-4 ranks; the CUDA kernels themselves are
  // checked against the CPU in tests/nn/cuda_complex.cpp (GPU) and tests/gpusim/cuda_sim_complex.cpp.
  using T = TestType;
  FakeCudaBackend fake;
  const Device dev = Device::cuda(0);
  for_each_comm_size([&](CommPtr comm) {
    for (const auto& lay : layouts(comm->size())) {
      DeviceMesh mesh(comm, lay.mesh);
      for (int op = 0; op < kOps; ++op) {
        INFO(lay.name << ", " << op_label(op));
        const Res host = run_op<T>(mesh, lay, op);
        const Res onto = run_op<T>(mesh, lay, op, nullptr, true, dev);
        require_match(onto, host, 0.0);  // the same CPU kernels: bit for bit
      }
    }
  });
}

TEMPLATE_TEST_CASE("a chain of complex ops with inputs used many times: device (fake CUDA backend) == host",
                   "[nn][complex][device][mpi]", double, float) {
  // The chain of tests/gpusim/cuda_sim_complex.cpp: z and w each feed four or five ops, so their
  // gradients are accumulated (Var::accumulate_grad's clone and axpy on the device).
  using T = TestType;
  using C = std::complex<T>;
  FakeCudaBackend fake;
  for_each_comm_size([&](CommPtr comm) {
    DeviceMesh mesh(comm, {comm->size()});
    auto chain = [&](Device dev) {
      auto put = [&](const auto& full, bool rg) {
        using X = typename std::decay_t<decltype(full)>::value_type;
        return Var<X, 2>(DistTensor<X, 2>::distribute(full, mesh, {Shard(0)}).to(dev), rg);
      };
      auto z = put(rnd_cplx<T, 2>(kShape, 1), true), w = put(rnd_cplx<T, 2>(kShape, 2), true);
      auto r = put(rnd_real<T, 2>(kShape, 3), true);
      auto zw = F::add(F::mul(z, w), F::conj(z));
      auto u = F::sub(F::mul(zw, r), F::mul(z, C(T(0), T(0.5))));
      auto y = F::add(F::add(F::abs_squared(u), F::abs(F::sub(z, w))), F::sub(F::real(z), F::imag(w)));
      auto v = F::complex(F::real(w), r);
      auto total = F::add(F::add(F::resolve(F::sum(y)), F::real(F::resolve(F::mul(F::mean(z), C(T(2), T(-1)))))),
                          F::resolve(F::sum(F::real(F::mul(v, T(2))))));
      F::resolve(total).backward();
      return std::vector<std::vector<cd>>{flat(y.value().full_tensor()), flat(total.value().full_tensor()),
                                          flat(z.grad().full_tensor()), flat(w.grad().full_tensor()),
                                          flat(r.grad().full_tensor())};
    };
    const auto h = chain(Device::cpu()), d = chain(Device::cuda(0));
    for (std::size_t i = 0; i < h.size(); ++i) {
      INFO("result " << i << " (y, loss, grad z, grad w, grad r)");
      CHECK(rel_err(d[i], h[i]) == 0);
    }
  });
}

TEST_CASE("complex tensor ops on a device tensor (fake CUDA backend): axpy, scale, add, mul, sum", "[nn][complex][device][mpi]") {
  using C = std::complex<double>;
  FakeCudaBackend fake;
  const Device dev = Device::cuda(0);
  for_each_comm_size([&](CommPtr comm) {
    DeviceMesh mesh(comm);
    const auto zh = DistTensor<C, 2>::distribute(rnd_cplx<double, 2>(kShape, 3), mesh, {Shard(0)});
    const auto z = zh.local().contiguous();
    const auto a = z.to(dev), b = z.clone().to(dev);
    // real factors: the real kernel over the interleaved parts; complex ones: the complex kernel.
    axpy(C(2), a, b);
    scale(b, C(-0.5));
    auto bh = b.to(Device::cpu());
    for (index_t i = 0; i < bh.numel(); ++i) CHECK(std::abs(bh.data()[i] + 1.5 * z.data()[i]) < 1e-14);
    auto twice = z.clone();
    scale(twice, C(2));
    CHECK(max_rel_diff(add(a, a), twice) == 0);
    const auto c = z.clone().to(dev);
    axpy(C(0, 1), a, c);   // c = z + i z
    scale(c, C(1, -1));    // (1 - i)(1 + i) z = 2 z
    CHECK(max_rel_diff(c, twice) < 1e-15);
    CHECK(max_rel_diff(mul(a, a), mul(z, z)) == 0);
    CHECK(std::abs(sum(a) - sum(z)) <= 1e-14 * std::max(1.0, std::abs(sum(z))));
  });
}

}  // namespace st_nn_mpi_complex_ops

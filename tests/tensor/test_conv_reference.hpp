#pragma once
// Naive direct-loop references (accumulated in double) for the conv / pool tests, written
// independently of the im2col engine: conv as a gather over (ci, k), the input gradient and
// the transposed conv as a scatter over (o, k).
#include <cmath>
#include <random>
#include <shardtensor/nn/functional/conv_local.hpp>
#include <shardtensor/tensor/ops.hpp>

namespace shard::test {

using nn::functional::ConvOptions;

/// Converts a tensor to double (contiguous).
template <class T, int R>
Tensor<double, R> to_double(const Tensor<T, R>& a) {
  auto r = Tensor<double, R>::empty(a.shape());
  auto c = a.contiguous();
  for (index_t i = 0; i < c.numel(); ++i) r.data()[i] = static_cast<double>(c.data()[i]);
  return r;
}

/// Random tensor with values in [-1, 1).
template <class T, int R>
Tensor<T, R> random_tensor(const Shape<R>& s, std::uint64_t seed) {
  auto t = Tensor<T, R>::empty(s);
  t.fill_random(seed);
  return t;
}

/// Spatial multi-index helpers over S dims.
template <int S>
bool in_box(const Shape<S>& i, const Shape<S>& ext) {
  for (int d = 0; d < S; ++d)
    if (i[d] < 0 || i[d] >= ext[d]) return false;
  return true;
}

/// y = conv(x, w) + b (gather form), in double.
template <class T, int R>
Tensor<double, R> ref_conv(const Tensor<T, R>& x, const Tensor<T, R>& w, std::type_identity_t<const Tensor<T, 1>*> b,
                           const ConvOptions<R - 2>& p) {
  constexpr int S = R - 2;
  Shape<S> in{}, k{}, out{};
  for (int d = 0; d < S; ++d) {
    in[d] = x.size(2 + d);
    k[d] = w.size(2 + d);
    out[d] = conv_output_extent(in[d], k[d], p.stride[d], p.dilation[d], p.pad_lo[d], p.pad_hi[d]);
  }
  const index_t N = x.size(0), cout = w.size(0), cin_g = w.size(1), cout_g = cout / p.groups;
  Shape<R> ys{};
  ys[0] = N;
  ys[1] = cout;
  for (int d = 0; d < S; ++d) ys[2 + d] = out[d];
  auto y = Tensor<double, R>::zeros(ys);
  for (index_t lin = 0; lin < y.numel(); ++lin) {
    const auto yi = unravel(lin, ys);
    const index_t g = yi[1] / cout_g;
    double s = b ? static_cast<double>(b->data()[yi[1]]) : 0.0;
    for (index_t ci = 0; ci < cin_g; ++ci)
      for (index_t kl = 0; kl < numel(k); ++kl) {
        const auto kk = unravel(kl, k);
        Shape<S> ii{};
        for (int d = 0; d < S; ++d) ii[d] = yi[2 + d] * p.stride[d] + kk[d] * p.dilation[d] - p.pad_lo[d];
        if (!in_box<S>(ii, in)) continue;
        Shape<R> xi{}, wi{};
        xi[0] = yi[0];
        xi[1] = g * cin_g + ci;
        wi[0] = yi[1];
        wi[1] = ci;
        for (int d = 0; d < S; ++d) {
          xi[2 + d] = ii[d];
          wi[2 + d] = kk[d];
        }
        s += static_cast<double>(x.at(xi)) * static_cast<double>(w.at(wi));
      }
    y.at(yi) = s;
  }
  return y;
}

/// gx = conv^T(gy) for an input of spatial extent `in` (scatter form), in double.
template <class T, int R>
Tensor<double, R> ref_conv_backward_input(const Tensor<T, R>& gy, const Tensor<T, R>& w, const Shape<R - 2>& in,
                                          const ConvOptions<R - 2>& p) {
  constexpr int S = R - 2;
  Shape<S> k{}, out{};
  for (int d = 0; d < S; ++d) {
    k[d] = w.size(2 + d);
    out[d] = gy.size(2 + d);
  }
  const index_t cin_g = w.size(1), cout_g = w.size(0) / p.groups;
  Shape<R> xs{};
  xs[0] = gy.size(0);
  xs[1] = cin_g * p.groups;
  for (int d = 0; d < S; ++d) xs[2 + d] = in[d];
  auto gx = Tensor<double, R>::zeros(xs);
  for (index_t lin = 0; lin < gy.numel(); ++lin) {
    const auto yi = unravel(lin, gy.shape());
    const index_t g = yi[1] / cout_g;
    const double v = static_cast<double>(gy.at(yi));
    for (index_t ci = 0; ci < cin_g; ++ci)
      for (index_t kl = 0; kl < numel(k); ++kl) {
        const auto kk = unravel(kl, k);
        Shape<R> xi{}, wi{};
        xi[0] = yi[0];
        xi[1] = g * cin_g + ci;
        wi[0] = yi[1];
        wi[1] = ci;
        bool ok = true;
        for (int d = 0; d < S; ++d) {
          xi[2 + d] = yi[2 + d] * p.stride[d] + kk[d] * p.dilation[d] - p.pad_lo[d];
          ok = ok && xi[2 + d] >= 0 && xi[2 + d] < in[d];
          wi[2 + d] = kk[d];
        }
        if (ok) gx.at(xi) += v * static_cast<double>(w.at(wi));
      }
  }
  (void)out;
  return gx;
}

/// gw[co, ci, k] = sum_{n, o} gy[n, co, o] * x[n, g*cin_g + ci, o*s + k*d - lo], in double.
template <class T, int R>
Tensor<double, R> ref_conv_backward_weight(const Tensor<T, R>& x, const Tensor<T, R>& gy, const Shape<R - 2>& k,
                                           const ConvOptions<R - 2>& p) {
  constexpr int S = R - 2;
  Shape<S> in{};
  for (int d = 0; d < S; ++d) in[d] = x.size(2 + d);
  const index_t cout = gy.size(1), cin_g = x.size(1) / p.groups, cout_g = cout / p.groups;
  Shape<R> ws{};
  ws[0] = cout;
  ws[1] = cin_g;
  for (int d = 0; d < S; ++d) ws[2 + d] = k[d];
  auto gw = Tensor<double, R>::zeros(ws);
  for (index_t lin = 0; lin < gy.numel(); ++lin) {
    const auto yi = unravel(lin, gy.shape());
    const index_t g = yi[1] / cout_g;
    const double v = static_cast<double>(gy.at(yi));
    for (index_t ci = 0; ci < cin_g; ++ci)
      for (index_t kl = 0; kl < numel(k); ++kl) {
        const auto kk = unravel(kl, k);
        Shape<R> xi{}, wi{};
        xi[0] = yi[0];
        xi[1] = g * cin_g + ci;
        wi[0] = yi[1];
        wi[1] = ci;
        bool ok = true;
        for (int d = 0; d < S; ++d) {
          xi[2 + d] = yi[2 + d] * p.stride[d] + kk[d] * p.dilation[d] - p.pad_lo[d];
          ok = ok && xi[2 + d] >= 0 && xi[2 + d] < in[d];
          wi[2 + d] = kk[d];
        }
        if (ok) gw.at(wi) += v * static_cast<double>(x.at(xi));
      }
  }
  return gw;
}

/// Transposed conv (scatter form): y[n, g*cout_g + co, i*s + k*d - lo] += x[n, ci, i] * w[ci, co, k].
template <class T, int R>
Tensor<double, R> ref_conv_transpose(const Tensor<T, R>& x, const Tensor<T, R>& w, std::type_identity_t<const Tensor<T, 1>*> b,
                                     const ConvOptions<R - 2>& p, const Shape<R - 2>& out) {
  constexpr int S = R - 2;
  Shape<S> k{};
  for (int d = 0; d < S; ++d) k[d] = w.size(2 + d);
  const index_t cin_g = x.size(1) / p.groups, cout_g = w.size(1);
  Shape<R> ys{};
  ys[0] = x.size(0);
  ys[1] = cout_g * p.groups;
  for (int d = 0; d < S; ++d) ys[2 + d] = out[d];
  auto y = Tensor<double, R>::zeros(ys);
  if (b)
    for (index_t lin = 0; lin < y.numel(); ++lin) y.data()[lin] = static_cast<double>(b->data()[unravel(lin, ys)[1]]);
  for (index_t lin = 0; lin < x.numel(); ++lin) {
    const auto xi = unravel(lin, x.shape());
    const index_t g = xi[1] / cin_g;
    const double v = static_cast<double>(x.at(xi));
    for (index_t co = 0; co < cout_g; ++co)
      for (index_t kl = 0; kl < numel(k); ++kl) {
        const auto kk = unravel(kl, k);
        Shape<R> yi{}, wi{};
        yi[0] = xi[0];
        yi[1] = g * cout_g + co;
        wi[0] = xi[1];
        wi[1] = co;
        bool ok = true;
        for (int d = 0; d < S; ++d) {
          yi[2 + d] = xi[2 + d] * p.stride[d] + kk[d] * p.dilation[d] - p.pad_lo[d];
          ok = ok && yi[2 + d] >= 0 && yi[2 + d] < out[d];
          wi[2 + d] = kk[d];
        }
        if (ok) y.at(yi) += v * static_cast<double>(w.at(wi));
      }
  }
  return y;
}

/// Runs body(ctx) once per conv kernel selection (direct AVX-512/AVX2 where the CPU has them, and
/// im2col + BLAS), each under a ContextGuard'ed CPU context whose settings select the kernel
/// (body may change ctx.settings() further; the previous current context returns afterwards).
template <class F>
void for_each_conv_kernel(F&& body) {
  for (auto k : {ConvKernel::automatic, ConvKernel::direct_avx2, ConvKernel::im2col_blas}) {
    ExecContext ctx(Device::cpu());
    ctx.settings().conv_kernel = k;
    ContextGuard guard(ctx);
    INFO("conv kernel " << conv_kernel_isa(k));
    if constexpr (std::is_invocable_v<F&, ExecContext&>)
      body(ctx);
    else
      body();
  }
}

/// max_rel_diff of a T tensor against a double reference.
template <class T, int R>
double rel_err(const Tensor<T, R>& a, const Tensor<double, R>& ref) {
  return max_rel_diff(to_double(a), ref);
}

}  // namespace shard::test

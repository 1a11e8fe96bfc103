#pragma once
/// \file fft.hpp
/// Differentiable distributed FFTs on the tape, and the spectral multiply of a Fourier Neural
/// Operator layer.
///
///  - `F::fftn / ifftn / rfftn / irfftn` (numpy / PyTorch semantics, `norm` backward / ortho /
///    forward) over any dims of a sharded Var, on any mesh (slab on 1-D meshes, pencil on 2-D and
///    3-D ones), uneven shards, any extents. The plan (dist/fft.hpp) decides the local transforms
///    and the transposes; the output stays in the layout the last transform left, reported in its
///    placements. `modes` truncates the spectrum to the kept low modes right after each dim is
///    transformed (so transposes move only kept modes); the inverses take `sizes` (real-space
///    extents) and zero-pad.
///  - `F::ifftn_to / irfftn_to(X, like, ...)`: the exact inverse of `fftn / rfftn(x, ...)` for an x
///    laid out as `like`: the forward plan's stages reversed, so the result lands in `like`'s
///    layout (uneven sizes included) with the transposes on truncated data. X is first moved to
///    that plan's input layout if it is not there already (on the tape; free when it is).
///  - Gradients follow PyTorch's convention for complex tensors (conjugate Wirtinger: the
///    gradient of a real loss w.r.t. z is dL/dRe z + i dL/dIm z). Each transform's backward is the
///    adjoint plan (dist/fft.hpp, src/dist/fft_plan.cpp): the unnormalised opposite transform,
///    with the Hermitian weights of PyTorch's rfft / irfft backward for r2c / c2r.
///  - `F::spectral_mul(X, W)`: Y[b, o, k...] = sum_i X[b, i, k...] * W[i, o, k...] with W a real
///    Replicate parameter [Cin, Cout, k..., 2] holding (re, im) pairs (PyTorch's view_as_real of a
///    complex weight; optimisers treat it like PyTorch treats complex parameters). X's channel
///    dim must be unsharded; its mode dims may be sharded (each rank multiplies its block of
///    modes by the matching block of W). Gradients: X gets g * conj(W) summed over o; W gets
///    conj(X) * g summed over the batch, Partial(sum) over the mesh dims that shard X.
///
/// Recipe: checks and the tape node here; plan and transposes in dist/ (the fft plan over the
/// redistribute plan); local transforms in the fft exec family; the spectral multiply in the
/// spectral exec family (exec/spectral.hpp).
#include <complex>
#include <memory>
#include <type_traits>
#include <vector>

#include "shardtensor/dist/fft.hpp"
#include "shardtensor/exec/spectral.hpp"
#include "shardtensor/nn/functional/common.hpp"

namespace shard::nn::functional {

using shard::FftNorm;

namespace detail {

/// Records the plan as one node: forward = execute_fft, backward = execute_fft_adjoint.
template <class To, class Ti, int R>
Var<To, R> fft_node(const Var<Ti, R>& x, std::shared_ptr<const shard::detail::FftPlan> plan, const char* name) {
  const Device dev = x.value().device();
  Block out = shard::detail::execute_fft(*plan, as_block(x.local()), current_context(dev));
  return Var<To, R>::make(DistTensor<To, R>(plan->out, tensor_of<To, R>(out)), name, {x.ref()},
                          [x, plan, dev](const DistTensor<To, R>& g) {
                            const DistTensor<To, R> gn = autograd::gradient_as(plan->out, g, autograd::PartialGrad::resolve);
                            Block gx = shard::detail::execute_fft_adjoint(*plan, as_block(gn.local()), current_context(dev));
                            x.accumulate_grad(DistTensor<Ti, R>(plan->in, tensor_of<Ti, R>(gx)));
                          });
}

template <class C>
using real_of_t = typename C::value_type;

}  // namespace detail

/// Differentiable distributed c2c FFT over `dims` (numpy.fft.fftn); `modes` truncates.
template <class C, int R>
Var<C, R> fftn(const Var<C, R>& x, std::vector<int> dims = all_dims<R>(), FftNorm norm = FftNorm::backward,
               std::vector<index_t> modes = {}) {
  static_assert(shard::detail::is_std_complex<C>::value, "F::fftn: complex<float> or complex<double>");
  const auto xr = resolve(x);
  FftRequest req{exec::FftKind::c2c, false, std::move(dims), {}, std::move(modes), norm};
  return detail::fft_node<C>(xr, shard::detail::fft_plan(xr.value().spec(), dtype_of<C>, req), "fftn");
}

/// Differentiable distributed c2c inverse FFT (numpy.fft.ifftn); `sizes`/`modes` for truncated X.
template <class C, int R>
Var<C, R> ifftn(const Var<C, R>& x, std::vector<int> dims = all_dims<R>(), FftNorm norm = FftNorm::backward,
                std::vector<index_t> sizes = {}, std::vector<index_t> modes = {}) {
  static_assert(shard::detail::is_std_complex<C>::value, "F::ifftn: complex<float> or complex<double>");
  const auto xr = resolve(x);
  FftRequest req{exec::FftKind::c2c, true, std::move(dims), std::move(sizes), std::move(modes), norm};
  return detail::fft_node<C>(xr, shard::detail::fft_plan(xr.value().spec(), dtype_of<C>, req), "ifftn");
}

/// Differentiable distributed r2c FFT (numpy.fft.rfftn): the last of the sorted dims is halved.
template <class T, int R>
Var<std::complex<T>, R> rfftn(const Var<T, R>& x, std::vector<int> dims = all_dims<R>(),
                              FftNorm norm = FftNorm::backward, std::vector<index_t> modes = {}) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "F::rfftn: float or double");
  const auto xr = resolve(x);
  FftRequest req{exec::FftKind::r2c, false, std::move(dims), {}, std::move(modes), norm};
  return detail::fft_node<std::complex<T>>(xr, shard::detail::fft_plan(xr.value().spec(), dtype_of<T>, req), "rfftn");
}

/// Differentiable distributed c2r FFT (numpy.fft.irfftn); `sizes`: real-space extents.
template <class C, int R>
Var<detail::real_of_t<C>, R> irfftn(const Var<C, R>& x, std::vector<int> dims = all_dims<R>(),
                                    FftNorm norm = FftNorm::backward, std::vector<index_t> sizes = {},
                                    std::vector<index_t> modes = {}) {
  static_assert(shard::detail::is_std_complex<C>::value, "F::irfftn: complex<float> or complex<double>");
  const auto xr = resolve(x);
  FftRequest req{exec::FftKind::c2r, false, std::move(dims), std::move(sizes), std::move(modes), norm};
  return detail::fft_node<detail::real_of_t<C>>(xr, shard::detail::fft_plan(xr.value().spec(), dtype_of<C>, req),
                                                "irfftn");
}

namespace detail {

/// The exact inverse of the forward plan of `fwd` from `like` (see the file comment).
template <class To, class C, int R>
Var<To, R> inverse_to(const Var<C, R>& X, const DistSpec& like, DType like_dtype, const FftRequest& fwd, FftNorm norm,
                      const char* name) {
  auto plan = shard::detail::inverse_fft_plan(like, like_dtype, fwd, norm);
  auto xr = resolve(X);
  SHARD_CHECK(xr.value().spec().global_shape() == plan->in.global_shape(), name,
              "input of global shape {} is not the spectrum {} of the forward transform from {}",
              xr.value().spec().global_shape(), plan->in.global_shape(), like);
  if (!(xr.value().spec() == plan->in)) xr = autograd::redistribute(xr, plan->in);
  return fft_node<To>(xr, plan, name);
}

}  // namespace detail

/// Inverse of `fftn(x, dims, *, modes)` for x laid out as `like`, landing in `like`'s layout.
template <class C, int R>
Var<C, R> ifftn_to(const Var<C, R>& X, const DistSpec& like, std::vector<int> dims = all_dims<R>(),
                   FftNorm norm = FftNorm::backward, std::vector<index_t> modes = {}) {
  FftRequest fwd{exec::FftKind::c2c, false, std::move(dims), {}, std::move(modes), norm};
  return detail::inverse_to<C>(X, like, dtype_of<C>, fwd, norm, "ifftn");
}

/// Inverse of `rfftn(x, dims, *, modes)` for a real x laid out as `like` (its global shape gives
/// the real-space sizes), landing in `like`'s layout.
template <class C, int R>
Var<detail::real_of_t<C>, R> irfftn_to(const Var<C, R>& X, const DistSpec& like, std::vector<int> dims = all_dims<R>(),
                                       FftNorm norm = FftNorm::backward, std::vector<index_t> modes = {}) {
  FftRequest fwd{exec::FftKind::r2c, false, std::move(dims), {}, std::move(modes), norm};
  return detail::inverse_to<detail::real_of_t<C>>(X, like, dtype_of<detail::real_of_t<C>>, fwd, norm, "irfftn");
}

// ------------------------------------------------------------------ spectral multiply

namespace detail {

/// Checks of spectral_mul on specs (the same on every rank). Returns the output spec.
DistSpec spectral_mul_spec(const DistSpec& xs, const DistSpec& ws, DType xdt, DType wdt);

/// Schedule (src/nn/fft.cpp): this rank's Y block from its X block and the whole W.
void spectral_mul_forward(const DistSpec& xs, const DistSpec& ys, const Block& x, const Block& w_real, const Block& y,
                          ExecContext& ctx);
/// Backward: gx (X's block layout) and gw (the whole W, real pairs; this rank's contribution).
void spectral_mul_backward(const DistSpec& xs, const DistSpec& ys, const Block& x, const Block& w_real,
                           const Block& gy, const Block* gx, const Block* gw_real, ExecContext& ctx);

}  // namespace detail

/// Per-mode channel mixing of a spectrum (the FNO layer's multiply; see the file comment).
/// X: [B, Cin, k...] complex; W: [Cin, Cout, k..., 2] real Replicate (re, im). Y: [B, Cout, k...].
template <class T, int R, int RW>
Var<std::complex<T>, R> spectral_mul(const Var<std::complex<T>, R>& X, const Var<T, RW>& W) {
  static_assert(RW == R + 1, "F::spectral_mul: W is [Cin, Cout, k..., 2] for X [B, Cin, k...]");
  static_assert(R >= 3, "F::spectral_mul: X is [B, Cin, k...] with at least one mode dim");
  using C = std::complex<T>;
  const char* op = "spectral_mul";
  const auto x = resolve(X);
  const DistSpec xs = x.value().spec(), ws = W.value().spec();
  const DistSpec ys = detail::spectral_mul_spec(xs, ws, dtype_of<C>, dtype_of<T>);
  const Device dev = x.value().device();
  SHARD_CHECK(x.value().device() == W.value().device(), op, "operands on different devices: {} and {}",
              x.value().device(), W.value().device());
  SHARD_CHECK(W.local().is_contiguous(), op, "W must be contiguous");
  auto y = Tensor<C, R>::empty(DistTensor<C, R>::from_vec(ys.local_box().len), dev);
  detail::spectral_mul_forward(xs, ys, as_block(x.local()), as_block(W.local()), as_block(y), current_context(dev));
  return detail::make_var_n<C, R>(
      DistTensor<C, R>(ys, y), op, {x.ref(), W.ref()}, [x, W, xs, ys, ws, dev](const DistTensor<C, R>& g) {
        const DistTensor<C, R> gn = autograd::gradient_as(ys, g, autograd::PartialGrad::resolve);
        std::optional<Tensor<C, R>> gx;
        std::optional<Tensor<T, RW>> gw;
        Block bx, bw;
        if (x.requires_grad()) {
          gx = Tensor<C, R>::empty(x.local().shape(), dev);
          bx = as_block(*gx);
        }
        if (W.requires_grad()) {
          gw = Tensor<T, RW>::empty(W.local().shape(), dev);
          bw = as_block(*gw);
        }
        detail::spectral_mul_backward(xs, ys, as_block(x.local()), as_block(W.local()), as_block(gn.local()),
                                      gx ? &bx : nullptr, gw ? &bw : nullptr, current_context(dev));
        if (gx) x.accumulate_grad(DistTensor<C, R>(xs, *gx));
        if (gw) W.accumulate_grad(DistTensor<T, RW>(detail::param_grad_spec(ws, xs), *gw));
      });
}

/// The spectral convolution of an FNO layer on x [B, Cin, spatial...] with W [Cin, Cout, K..., 2]:
/// irfftn(spectral_mul(rfftn(x, modes), W)) over every spatial dim, with the spectrum truncated
/// to the kept modes right after each dim's transform (K_d = 2 m_d for all but the last spatial
/// dim, m_last for the halved one; nothing is cut where 2 m_d >= n_d), the channel dim never
/// sharded by the transposes, and the result in x's layout (uneven sizes included): the inverse
/// is the exact reverse of the forward plan, so its transposes move kept modes only.
template <class T, int R, int RW>
Var<T, R> spectral_conv(const Var<T, R>& x, const Var<T, RW>& W, const std::vector<index_t>& modes,
                        FftNorm norm = FftNorm::backward) {
  static_assert(RW == R + 1 && R >= 3, "F::spectral_conv: x [B, Cin, spatial...], W [Cin, Cout, K..., 2]");
  using C = std::complex<T>;
  const char* op = "spectral_conv";
  const auto xr = resolve(x);
  const DistSpec xs = xr.value().spec();
  SHARD_CHECK(static_cast<int>(modes.size()) == R - 2, op, "{} modes for {} spatial dims", modes.size(), R - 2);
  const auto wg = W.value().spec().global_shape();
  const auto& xg = xs.global_shape();
  SHARD_CHECK(static_cast<int>(wg.size()) == RW && wg[0] == xg[1], op,
              "W of shape {} for x of shape {}: W must be [Cin={}, Cout, K..., 2]", wg, xg, xg[1]);
  for (int d = 2; d < R; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const index_t n = xg[u], m = modes[u - 2];
    const bool last = d == R - 1;
    SHARD_CHECK(m >= 1 && (last ? m <= n / 2 + 1 : 2 * m <= n), op,
                "{} modes along spatial dim {} of extent {}: at most {} fit", m, d - 2, n, last ? n / 2 + 1 : n / 2);
  }
  std::vector<int> dims;
  for (int d = 2; d < R; ++d) dims.push_back(d);
  FftRequest req{exec::FftKind::r2c, false, dims, {}, modes, norm, {1}};
  auto X = detail::fft_node<C>(xr, shard::detail::fft_plan(xs, dtype_of<T>, req), "rfftn");
  auto Y = spectral_mul(X, W);
  auto yg = xg;
  yg[1] = wg[1];
  const DistSpec like = detail::derived_spec(xs, xs.placements(), yg);
  auto inv = shard::detail::inverse_fft_plan(like, dtype_of<T>, req, norm);
  if (!(Y.value().spec() == inv->in)) Y = autograd::redistribute(Y, inv->in);
  return detail::fft_node<T>(Y, inv, "irfftn");
}

}  // namespace shard::nn::functional

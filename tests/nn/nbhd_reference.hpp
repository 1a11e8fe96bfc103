#pragma once
// Dense reference of neighbourhood attention for the tests: the full N x N window mask built
// from the definition (query x sees key y iff, in every spatial dim, y = x + dilation * o for an
// offset o of the window, modulo the extent for periodic dims), applied as a 0 / -inf additive
// bias to the attention kernel family (exec::attention_forward / attention_backward), which is
// tested against an explicit softmax in tests/exec/test_attention_kernel.cpp.
#include <cmath>
#include <limits>
#include <vector>

#include <shardtensor/exec/attention.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

namespace shard::test {

/// out, dq, dk, dv of dense masked attention on full [B, S..., H, D] tensors (contiguous).
template <class T, int R>
struct DenseNbhd {
  Tensor<T, R> out, dq, dk, dv;
};

/// True if key position y is in the window of query position x (multi-indices over S dims).
inline bool nbhd_in_window(const std::vector<index_t>& x, const std::vector<index_t>& y,
                           const std::vector<index_t>& n, const F::NeighborhoodOptions& o) {
  for (std::size_t d = 0; d < x.size(); ++d) {
    const index_t w = o.window[d], dil = o.dilation.empty() ? 1 : o.dilation[d];
    const bool per = !o.periodic.empty() && o.periodic[d];
    bool hit = false;
    for (index_t off = -(w / 2); off <= w - 1 - w / 2 && !hit; ++off) {
      const index_t t = x[d] + dil * off;
      hit = per ? (((t - y[d]) % n[d]) + n[d]) % n[d] == 0 : t == y[d];
    }
    if (!hit) return false;
  }
  return true;
}

template <class T, int R>
DenseNbhd<T, R> dense_nbhd(const Tensor<T, R>& q0, const Tensor<T, R>& k0, const Tensor<T, R>& v0,
                           const Tensor<T, R>& dout0, const F::NeighborhoodOptions& o) {
  constexpr int S = R - 3;
  const auto q = q0.contiguous(), k = k0.contiguous(), v = v0.contiguous(), dout = dout0.contiguous();
  const index_t B = q.size(0), H = q.size(R - 2), D = q.size(R - 1), Dv = v.size(R - 1);
  std::vector<index_t> n(S);
  index_t N = 1;
  for (int d = 0; d < S; ++d) N *= (n[static_cast<std::size_t>(d)] = q.size(1 + d));
  auto unravel = [&](index_t t) {
    std::vector<index_t> x(S);
    for (int d = S - 1; d >= 0; --d) {
      x[static_cast<std::size_t>(d)] = t % n[static_cast<std::size_t>(d)];
      t /= n[static_cast<std::size_t>(d)];
    }
    return x;
  };
  std::vector<T> bias(static_cast<std::size_t>(N * N));
  for (index_t i = 0; i < N; ++i)
    for (index_t j = 0; j < N; ++j)
      bias[static_cast<std::size_t>(i * N + j)] =
          nbhd_in_window(unravel(i), unravel(j), n, o) ? T(0) : -std::numeric_limits<T>::infinity();
  DenseNbhd<T, R> r;
  Shape<R> os = q.shape();
  os[R - 1] = Dv;
  r.out = Tensor<T, R>::zeros(os);
  r.dq = Tensor<T, R>::zeros(q.shape());
  r.dk = Tensor<T, R>::zeros(k.shape());
  r.dv = Tensor<T, R>::zeros(v.shape());
  std::vector<T> lse(static_cast<std::size_t>(B * H * N));
  const exec::AttnGeom g{B, H, N, N, D, Dv};
  // token-major [B, N, H, d] tensors viewed as [B, H, N, d]
  auto in = [&](const Tensor<T, R>& t, index_t d) {
    return exec::attention_view(dtype_of<T>, Device::cpu(), t.data(), B, H, N, d, N * H * d, d, H * d);
  };
  exec::AttnMask m;
  m.scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(D));
  const index_t bshape[4] = {B, H, N, N}, bstrides[4] = {0, 0, N, 1};  // one [N, N] mask for every (b, h)
  const Block bias_b = Block::view(dtype_of<T>, Device::cpu(), bias.data(), bshape, 4, bstrides);
  const index_t nl = B * H * N;
  const Block lse_b = Block::view(dtype_of<T>, Device::cpu(), lse.data(), &nl, 1);
  auto& ctx = current_context(Device::cpu());
  exec::attention_forward(g, m, in(q, D), in(k, D), in(v, Dv), &bias_b, in(r.out, Dv), lse_b, ctx);
  const Block dq = in(r.dq, D), dk = in(r.dk, D), dv = in(r.dv, Dv);
  exec::attention_backward(g, m, in(q, D), in(k, D), in(v, Dv), &bias_b, in(r.out, Dv), in(dout, Dv), lse_b, &dq, &dk,
                           &dv, ctx);
  return r;
}

}  // namespace shard::test

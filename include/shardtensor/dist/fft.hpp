#pragma once
/// \file fft.hpp
/// The distributed FFT: a typed plan of local transforms (the fft kernel family, exec/fft.hpp)
/// and all-to-all transposes (the redistribute plan, dist/redistribute.hpp), built once per
/// (spec, kind, dims, modes, sizes, norm) on each rank, cached, and executed forward or as its
/// adjoint. The typed fronts below (fftn / ifftn / rfftn / irfftn on DistTensor) run it without
/// the tape; nn/functional/fft.hpp records it on the tape.
///
/// How the plan is made (heFFTe's reshape plans and the pencil decomposition are the model):
/// a dim can be transformed locally only where no mesh dim shards it ("complete"). Repeat until
/// every requested dim is done:
///  1. transform, in one local call, every not-yet-done requested dim that is complete (r2c: the
///     halved dim, dims.back(), must be in the first such stage; c2r: it must be in the last);
///  2. otherwise move one mesh dim off a not-yet-done sharded dim `d` onto a target dim, by one
///     redistribute step (an alltoallv over that mesh dim only): preferably a dim already
///     transformed and unsharded (the classic slab -> pencil transpose; after truncation it is
///     the short spectral dim, so the transpose moves only kept modes), else a dim that is not
///     transformed at all (a batch or channel dim) and unsharded, else a transformed dim that
///     is sharded already (it is then split over several mesh dims), else another batch dim;
///  3. only when no other dim exists (a 1-D tensor) the mesh dim becomes Replicate (an
///     allgather of that one dim, transformed, then sliced back: nothing else would work
///     without a four-step FFT).
/// The output stays in the layout the last transform left (reported in its placements): a
/// slab decomposition Shard(x) of [.., x, y] comes out Shard(y) of the spectrum; a pencil
/// Shard(x), Shard(y) of [.., x, y, z] comes out Shard(z), Shard(x) or similar. A forward ->
/// multiply -> inverse chain therefore transposes only inside the transforms: use
/// `inverse_fft_plan(target)` (the exact reverse of the target's forward plan) to land back in
/// the original layout, uneven sizes included.
///
/// Mode truncation (`modes`, for spectral convolutions): right after a dim is transformed its
/// spectrum is cut to the kept modes — a c2c dim of extent n keeps [0, m) and [n - m, n) (2m
/// entries, lowest |k| first then the negative ones, as FNO does; none cut when 2m >= n), the
/// halved dim keeps [0, m) — so every later transpose moves only kept modes. The inverse pads
/// the missing modes with zeros just before the dim is inverse-transformed.
///
/// Norm (numpy / PyTorch): backward (forward unscaled, inverse 1/n), ortho (1/sqrt(n) both ways),
/// forward (forward 1/n, inverse unscaled); n is the product of the real-space extents.
///
/// Partial inputs are refused (resolve them first; the nn ops do). Every check is made on specs
/// only, so every rank throws the same shard::Error before any collective.
#include <complex>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "shardtensor/dist/dist_spec.hpp"
#include "shardtensor/dist/dist_tensor.hpp"
#include "shardtensor/exec/fft.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard {

/// numpy's `norm`: which direction carries the 1/n (see the file comment).
enum class FftNorm : unsigned char { backward, ortho, forward };
const char* fft_norm_name(FftNorm n) noexcept;

/// What a distributed transform computes. `dims` are the transformed tensor dims (any order,
/// distinct; sorted by the plan). `sizes`: the real-space extent of each dim in `dims` (same
/// order as the sorted dims) for the inverse kinds (c2r needs the real extent of the halved dim;
/// with `modes` the extents before truncation); empty: derived (c2c: the input's extents; c2r:
/// 2 * (m - 1) for a halved dim of extent m, as numpy). `modes`: per dim in `dims`, the kept
/// modes (0: keep all); empty: no truncation.
struct FftRequest {
  exec::FftKind kind = exec::FftKind::c2c;
  bool inverse = false;  ///< c2c only; r2c is forward, c2r inverse
  std::vector<int> dims;
  std::vector<index_t> sizes;
  std::vector<index_t> modes;
  FftNorm norm = FftNorm::backward;
  /// Tensor dims the plan must never shard (e.g. the channels a spectral multiply mixes); a
  /// transpose then targets other dims only.
  std::vector<int> fixed;
};

namespace detail {

/// One stage of a distributed FFT on this rank.
struct FftStage {
  bool transform = false;  ///< false: a redistribution src -> dst (a transpose over one mesh dim)
  DistSpec src, dst;       ///< specs before and after the stage
  // ---- transform stages
  exec::FftKind kind = exec::FftKind::c2c;
  bool inverse = false;
  std::vector<int> dims;  ///< the tensor dims transformed here (ascending; complete on every rank)
  double scale = 1.0;     ///< the norm's factor, carried by one transform stage of the plan
  /// Real-space shape (r2c input / c2r output / c2c) of the local transform, before truncation
  /// (forward kinds) or after padding (inverse kinds); the spectral side is its complex_shape().
  std::vector<index_t> real_local;
  /// Per tensor dim: the kept extent of the spectral side when it is truncated, or -1.
  std::vector<index_t> kept;
  /// Per tensor dim: the halved dim's real extent (r2c/c2r), else -1 (for the Hermitian weights).
  index_t halved_real = -1;
  int halved_dim = -1;
  int mesh_dim = -1;       ///< redistribution: the mesh dim moved
  bool replicate_fallback = false;  ///< redistribution: Shard -> Replicate (a 1-D tensor)
};

/// A distributed FFT for this rank: in -> out through `stages` (Printable with fmt).
struct FftPlan {
  FftRequest request;      ///< dims sorted, sizes and modes completed
  DistSpec in, out;
  DType in_dtype = DType::c128, out_dtype = DType::c128;
  std::vector<FftStage> stages;
  double scale = 1.0;      ///< the total norm factor
  /// Number of transposes (redistribution stages).
  int transposes() const;
  /// Elements this rank sends to other ranks over the whole forward plan (planning data, no
  /// communication): what the truncation and the layout choices save is read here.
  index_t elements_sent() const;
  /// One line per stage, for logs and tests.
  std::string describe() const;
};

/// The forward plan of `req` from `in` (cached per process; planning never communicates).
/// Throws shard::Error (the same on every rank) for bad dims, sizes, modes, a Partial
/// placement, or a dtype that is not the kind's input dtype (`in_dtype`).
std::shared_ptr<const FftPlan> fft_plan(const DistSpec& in, DType in_dtype, const FftRequest& req);

/// The inverse of `fft_plan(target, target_dtype, forward)`: its stages reversed with each
/// transform inverted (c2c <-> c2c inverse, r2c <-> c2r; truncation <-> zero padding); in is
/// that plan's out, out is `target`. `norm` is the inverse's norm. Cached like fft_plan.
std::shared_ptr<const FftPlan> inverse_fft_plan(const DistSpec& target, DType target_dtype, const FftRequest& forward,
                                                FftNorm norm);

/// Runs `plan` on this rank's block `in` (contiguous or not; dtype plan.in_dtype, shape
/// plan.in.local_box().len) and returns the block of plan.out. Collective over the mesh dims
/// the transposes use. `in` is never modified.
Block execute_fft(const FftPlan& plan, const Block& in, ExecContext& ctx);

/// The adjoint of `plan` (PyTorch's convention for complex gradients: the gradient of a real
/// loss is dL/dRe + i dL/dIm): from the gradient block of plan.out to that of plan.in. A c2c
/// transform's adjoint is the unnormalised opposite transform times the same scale; r2c / c2r
/// carry the Hermitian weights of PyTorch's rfft / irfft backward (see src/dist/fft_plan.cpp).
Block execute_fft_adjoint(const FftPlan& plan, const Block& grad_out, ExecContext& ctx);

/// Plans held by the cache (tests).
std::size_t fft_plan_cache_size() noexcept;

/// Typed run of a plan on a DistTensor.
template <class To, class Ti, int R>
DistTensor<To, R> run_fft_plan(const FftPlan& plan, const DistTensor<Ti, R>& x) {
  Block out = execute_fft(plan, as_block(x.local()), current_context(x.device()));
  return DistTensor<To, R>(plan.out, tensor_of<To, R>(out));
}

template <class T>
struct is_std_complex : std::false_type {};
template <class T>
struct is_std_complex<std::complex<T>> : std::true_type {};

}  // namespace detail

/// All dims of a rank-R tensor (the default `dims`).
template <int R>
std::vector<int> all_dims() {
  std::vector<int> d(R);
  for (int i = 0; i < R; ++i) d[static_cast<std::size_t>(i)] = i;
  return d;
}

/// Distributed c2c forward FFT over `dims` (numpy.fft.fftn; see the file comment for the
/// layout of the result and `modes`).
template <class C, int R>
DistTensor<C, R> fftn(const DistTensor<C, R>& x, std::vector<int> dims = all_dims<R>(),
                      FftNorm norm = FftNorm::backward, std::vector<index_t> modes = {}) {
  static_assert(detail::is_std_complex<C>::value, "fftn: complex<float> or complex<double> input");
  FftRequest req{exec::FftKind::c2c, false, std::move(dims), {}, std::move(modes), norm};
  auto plan = detail::fft_plan(x.spec(), dtype_of<C>, req);
  return detail::run_fft_plan<C>(*plan, x);
}

/// Distributed c2c inverse FFT (numpy.fft.ifftn), from any layout (the plan chooses the
/// transposes); `sizes`: real-space extents when `x` holds truncated modes.
template <class C, int R>
DistTensor<C, R> ifftn(const DistTensor<C, R>& x, std::vector<int> dims = all_dims<R>(),
                       FftNorm norm = FftNorm::backward, std::vector<index_t> sizes = {},
                       std::vector<index_t> modes = {}) {
  static_assert(detail::is_std_complex<C>::value, "ifftn: complex<float> or complex<double> input");
  FftRequest req{exec::FftKind::c2c, true, std::move(dims), std::move(sizes), std::move(modes), norm};
  auto plan = detail::fft_plan(x.spec(), dtype_of<C>, req);
  return detail::run_fft_plan<C>(*plan, x);
}

/// Distributed r2c FFT (numpy.fft.rfftn): the last of the sorted dims is halved to n / 2 + 1.
template <class T, int R>
DistTensor<std::complex<T>, R> rfftn(const DistTensor<T, R>& x, std::vector<int> dims = all_dims<R>(),
                                     FftNorm norm = FftNorm::backward, std::vector<index_t> modes = {}) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "rfftn: float or double input");
  FftRequest req{exec::FftKind::r2c, false, std::move(dims), {}, std::move(modes), norm};
  auto plan = detail::fft_plan(x.spec(), dtype_of<T>, req);
  return detail::run_fft_plan<std::complex<T>>(*plan, x);
}

/// Distributed c2r FFT (numpy.fft.irfftn); `sizes`: the real-space extents of the dims (the
/// halved one's real extent decides odd / even; default 2 * (m - 1)).
template <class C, int R>
DistTensor<typename C::value_type, R> irfftn(const DistTensor<C, R>& x, std::vector<int> dims = all_dims<R>(),
                                             FftNorm norm = FftNorm::backward, std::vector<index_t> sizes = {},
                                             std::vector<index_t> modes = {}) {
  static_assert(detail::is_std_complex<C>::value, "irfftn: complex<float> or complex<double> input");
  FftRequest req{exec::FftKind::c2r, false, std::move(dims), std::move(sizes), std::move(modes), norm};
  auto plan = detail::fft_plan(x.spec(), dtype_of<C>, req);
  return detail::run_fft_plan<typename C::value_type>(*plan, x);
}

}  // namespace shard

template <> struct fmt::formatter<shard::FftNorm> : fmt::formatter<fmt::string_view> {
  template <class Ctx> auto format(shard::FftNorm n, Ctx& ctx) const {
    return fmt::formatter<fmt::string_view>::format(shard::fft_norm_name(n), ctx);
  }
};

#pragma once
/// \file reduction.hpp
/// Differentiable sum / mean / max over (possibly sharded) dims. Reductions keep the reduced dims
/// with extent 1 (keepdim); the all-dims forms return a global shape {1} Var<T,1>.
///
/// The result is left unresolved: on each mesh dim that shards a reduced dim it is Partial(sum)
/// (sum, mean) or Partial(max) (max); dims that are not reduced keep their Shard placements and
/// layouts. Resolve with F::resolve (one allreduce) when the value is needed; backward() may also
/// start from a Partial scalar directly.
///  - mean = sum scaled by 1 / (product of the GLOBAL extents of the reduced dims).
///  - Backward of sum/mean broadcasts the gradient back, sharded like the input.
///  - Backward of max sends the gradient to the positions that attain the global maximum; ties
///    (also across ranks) share it equally (like torch.amax). It costs two small allreduces over
///    the mesh dims that shard reduced dims (the global max and the tie count).
///  - Inputs may be Partial(sum) for sum/mean (linear); max refuses Partial inputs.
#include <limits>

#include "shardtensor/nn/functional/common.hpp"

namespace shard::nn::functional {

namespace detail {

/// Normalised, sorted, checked reduction dims (negative dims count from the end).
template <int R>
std::vector<int> normalise_dims(std::vector<int> dims, const char* op) {
  for (auto& d : dims) {
    SHARD_CHECK(d >= -R && d < R, op, "dim {} out of range for a rank-{} tensor", d, R);
    if (d < 0) d += R;
  }
  std::sort(dims.begin(), dims.end());
  SHARD_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), op, "repeated dim in {}", dims);
  return dims;
}

/// Strides that map an index of the full local shape `s` to the keepdim result (0 on reduced dims).
template <int R>
Shape<R> keepdim_strides(const Shape<R>& s, const std::vector<int>& dims) {
  Shape<R> os = s;
  for (int d : dims) os[d] = 1;
  Shape<R> st = contiguous_strides(os);
  for (int d : dims) st[d] = 0;
  return st;
}

/// Calls f(i, j) for each element i of a contiguous tensor of shape s with j its offset under strides st.
template <int R, class Fn>
void for_each_mapped(const Shape<R>& s, const Shape<R>& st, Fn f) {
  const index_t n = numel(s);
  if (n == 0) return;
  const index_t inner = R ? s[R - 1] : 1, outer = n / inner, is = R ? st[R - 1] : 0;
  for (index_t r = 0; r < outer; ++r) {
    index_t rem = r, off = 0;
    for (int d = R - 2; d >= 0; --d) {
      off += (rem % s[d]) * st[d];
      rem /= s[d];
    }
    for (index_t i = 0; i < inner; ++i) f(r * inner + i, off + i * is);
  }
}

/// Reduction kinds.
enum class ReduceKind { sum, mean, max };

/// The keepdim reduction behind sum/mean/max.
template <class T, int R>
Var<T, R> reduce(const Var<T, R>& x, std::vector<int> dims_in, ReduceKind kind) {
  static_assert(is_compute_type<T>, "reductions support float and double");
  const char* name = kind == ReduceKind::sum ? "sum" : kind == ReduceKind::mean ? "mean" : "max";
  check_host(x.value(), name, "input");
  const auto dims = normalise_dims<R>(std::move(dims_in), name);
  const DistSpec& xs = x.value().spec();
  for (const auto& p : xs.placements())
    SHARD_CHECK(!p.is_partial() || (kind != ReduceKind::max && p.op == ReduceOp::sum), name,
                "input has a Partial({}) placement ({}); resolve it first", p.op, xs);
  auto is_red = [&dims](int d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };
  const Shape<R> gshape = x.value().global_shape();
  const index_t count = global_count<R>(gshape, is_red);
  SHARD_CHECK(kind == ReduceKind::sum || count > 0, name, "reducing over an empty extent (global shape {}, dims {})",
              gshape, dims);
  const auto red_mdims = mesh_dims_sharding(xs, is_red);
  const ReduceOp pop = kind == ReduceKind::max ? ReduceOp::max : ReduceOp::sum;
  std::vector<index_t> og(gshape.begin(), gshape.end());
  for (int d : dims) og[static_cast<std::size_t>(d)] = 1;
  auto pl = xs.placements();
  for (int m : red_mdims) pl[static_cast<std::size_t>(m)] = Partial(pop);
  const DistSpec out_spec = derived_spec(xs, pl, og);

  const auto xl = x.local().contiguous();
  const Shape<R> s = xl.shape();
  const Shape<R> st = keepdim_strides<R>(s, dims);
  const auto out = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(out_spec.local_box().len));
  const T* px = xl.data();
  if (kind == ReduceKind::max) {
    out.fill(-std::numeric_limits<T>::infinity());
    T* po = out.data();
    for_each_mapped<R>(s, st, [&](index_t i, index_t j) { po[j] = std::max(po[j], px[i]); });
  } else {
    std::vector<double> acc(static_cast<std::size_t>(out.numel()), 0.0);
    for_each_mapped<R>(s, st, [&](index_t i, index_t j) { acc[static_cast<std::size_t>(j)] += px[i]; });
    const double f = kind == ReduceKind::mean ? 1.0 / static_cast<double>(count) : 1.0;
    for (std::size_t j = 0; j < acc.size(); ++j) out.data()[j] = static_cast<T>(acc[j] * f);
  }
  DistTensor<T, R> outv(out_spec, out);
  return Var<T, R>::make(outv, name, {x.ref()}, [x, xs, xl, outv, dims, kind, count, red_mdims](const DistTensor<T, R>& gin) {
    const auto g = align_grad(gin, outv.spec()).local().contiguous();
    const Shape<R> s = xl.shape();
    const Shape<R> st = keepdim_strides<R>(s, dims);
    auto gx = Tensor<T, R>::empty(s);
    T* pgx = gx.data();
    const T* pg = g.data();
    if (kind != ReduceKind::max) {
      const T f = kind == ReduceKind::mean ? static_cast<T>(1.0 / static_cast<double>(count)) : T(1);
      for_each_mapped<R>(s, st, [&](index_t i, index_t j) { pgx[i] = pg[j] * f; });
    } else {
      // Global maximum and the global number of positions attaining it, per result element.
      const CommPtr comm = comm_over(xs.mesh(), red_mdims);
      auto gmax = outv.local().clone();
      if (comm && comm->size() > 1 && gmax.numel() > 0)
        comm->allreduce(gmax.data(), gmax.data(), gmax.numel(), dtype_of<T>, ReduceOp::max);
      std::vector<double> ties(static_cast<std::size_t>(gmax.numel()), 0.0);
      const T* px = xl.data();
      const T* pm = gmax.data();
      for_each_mapped<R>(s, st, [&](index_t i, index_t j) {
        if (px[i] == pm[j]) ties[static_cast<std::size_t>(j)] += 1.0;
      });
      allreduce_sum(comm, ties.data(), static_cast<index_t>(ties.size()));
      for_each_mapped<R>(s, st, [&](index_t i, index_t j) {
        pgx[i] = px[i] == pm[j] ? static_cast<T>(pg[j] / ties[static_cast<std::size_t>(j)]) : T(0);
      });
    }
    x.accumulate_grad(DistTensor<T, R>(grad_spec(xs), gx));
  });
}

/// A Var whose global shape has one element, seen as global shape {1} (differentiable).
template <class T, int R>
Var<T, 1> to_scalar(const Var<T, R>& x) {
  const DistSpec& xs = x.value().spec();
  SHARD_CHECK(numel(x.value().global_shape()) == 1, "to_scalar", "global shape {} has more than one element",
              x.value().global_shape());
  for (const auto& p : xs.placements())
    SHARD_CHECK(!p.is_shard(), "to_scalar", "a one-element tensor cannot be sharded ({})", xs);
  DistSpec ss(xs.mesh(), xs.placements(), {1});
  auto local = x.local().contiguous().template reshape<1>(Shape<1>{1});
  return Var<T, 1>::make(DistTensor<T, 1>(ss, local), "to_scalar", {x.ref()}, [x, xs, ss](const DistTensor<T, 1>& gin) {
    auto g = align_grad(gin, ss).local().contiguous();
    Shape<R> ones{};
    ones.fill(1);
    x.accumulate_grad(DistTensor<T, R>(grad_spec(xs), g.template reshape<R>(ones)));
  });
}

template <int R>
std::vector<int> all_dims() {
  std::vector<int> d(R);
  for (int i = 0; i < R; ++i) d[static_cast<std::size_t>(i)] = i;
  return d;
}

}  // namespace detail

/// Sum over `dims` (keepdim); Partial(sum) on mesh dims that shard a reduced dim.
template <class T, int R>
Var<T, R> sum(const Var<T, R>& x, std::vector<int> dims) {
  return detail::reduce(x, std::move(dims), detail::ReduceKind::sum);
}
/// Mean over `dims` (keepdim): sum / global count; Partial(sum) on mesh dims that shard a reduced dim.
template <class T, int R>
Var<T, R> mean(const Var<T, R>& x, std::vector<int> dims) {
  return detail::reduce(x, std::move(dims), detail::ReduceKind::mean);
}
/// Max over `dims` (keepdim); Partial(max) on mesh dims that shard a reduced dim.
template <class T, int R>
Var<T, R> max(const Var<T, R>& x, std::vector<int> dims) {
  return detail::reduce(x, std::move(dims), detail::ReduceKind::max);
}
/// Sum of all elements: global shape {1}, Partial(sum) on every mesh dim that shards x.
template <class T, int R>
Var<T, 1> sum(const Var<T, R>& x) {
  return detail::to_scalar(sum(x, detail::all_dims<R>()));
}
/// Mean of all elements: global shape {1}, Partial(sum) on every mesh dim that shards x.
template <class T, int R>
Var<T, 1> mean(const Var<T, R>& x) {
  return detail::to_scalar(mean(x, detail::all_dims<R>()));
}
/// Max of all elements: global shape {1}, Partial(max) on every mesh dim that shards x.
template <class T, int R>
Var<T, 1> max(const Var<T, R>& x) {
  return detail::to_scalar(max(x, detail::all_dims<R>()));
}

}  // namespace shard::nn::functional

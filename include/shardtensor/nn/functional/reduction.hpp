#pragma once
/// \file reduction.hpp
/// Differentiable sum / mean / max over (possibly sharded) dims (recipe: checks and spec algebra
/// here, the schedule in src/nn/reduction.cpp, the reduce exec family). Reductions keep the reduced dims
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
///  - A strided local block (a view of user memory) is read in place, forward and backward (CPU;
///    the CUDA front makes one contiguous device copy); results are bitwise those of a copy.
#include "shardtensor/exec/reduce.hpp"
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

/// Reduction kinds.
enum class ReduceKind { sum, mean, max };

/// The schedule (src/nn/reduction.cpp). Forward: out = this rank's keepdim reduction of x (sum
/// and mean scaled by 1 / count for mean; x may be strided). No communication (the result is
/// Partial).
void reduce_forward(ReduceKind kind, index_t count, const Block& x, const Block& out, ExecContext& ctx);
/// Backward: gx (contiguous, x's shape) from the resolved output gradient g. sum/mean broadcast
/// g; max sends it to the positions attaining the global maximum (the allreduced `value`, the
/// forward's local result), ties shared, with two allreduces over `comm` (null: none).
void reduce_backward(ReduceKind kind, index_t count, const CommPtr& comm, const Block& x, const Block& value,
                     const Block& g, const Block& gx, ExecContext& ctx);

/// The keepdim reduction behind sum/mean/max.
template <class T, int R>
Var<T, R> reduce(const Var<T, R>& x, std::vector<int> dims_in, ReduceKind kind) {
  static_assert(is_float_type<T>, "reductions support float, double, bf16 and f16");
  const char* name = kind == ReduceKind::sum ? "sum" : kind == ReduceKind::mean ? "mean" : "max";
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

  // x as it is: a strided view (e.g. the interior of a user's halo-padded array) is read in place
  // by the CPU table and saved as it is (a stable view; a snapshot view was copied by local()).
  const Tensor<T, R> xl = x.local();
  const Device dev = xl.device();
  ExecContext& ctx = current_context(dev);
  const auto out = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(out_spec.local_box().len), dev);
  reduce_forward(kind, count, as_block(xl), as_block(out), ctx);
  DistTensor<T, R> outv(out_spec, out);
  return Var<T, R>::make(outv, name, {x.ref()}, [x, xs, xl, outv, kind, count, red_mdims](const DistTensor<T, R>& gin) {
    const auto g = autograd::gradient_as(outv.spec(), gin, autograd::PartialGrad::resolve).local().contiguous();
    const Device gdev = xl.device();
    auto gx = Tensor<T, R>::empty(xl.shape(), gdev);
    reduce_backward(kind, count, kind == ReduceKind::max ? comm_over(xs.mesh(), red_mdims) : CommPtr{}, as_block(xl),
                    as_block(outv.local()), as_block(g), as_block(gx), current_context(gdev));
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
    auto g = autograd::gradient_as(ss, gin, autograd::PartialGrad::resolve).local().contiguous();
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

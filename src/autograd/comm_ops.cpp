// Placement rules of the differentiable communication ops (see autograd/comm_ops.hpp).
#include "shardtensor/autograd/comm_ops.hpp"

namespace shard::autograd {

std::vector<Placement> gradient_placements(const std::vector<Placement>& value, const std::vector<Placement>& upstream,
                                           PartialGrad mode) {
  SHARD_CHECK(value.size() == upstream.size(), "gradient_placements", "{} value placements but {} gradient placements",
              value.size(), upstream.size());
  std::vector<Placement> out(value.size());
  for (std::size_t m = 0; m < value.size(); ++m) {
    const Placement& v = value[m];
    const Placement& u = upstream[m];
    if (v.is_shard()) out[m] = v;
    else if (v.is_partial()) out[m] = Replicate();
    else out[m] = mode == PartialGrad::keep && u.is_partial() && u.op == ReduceOp::sum ? Partial(ReduceOp::sum) : Replicate();
  }
  return out;
}

std::vector<Placement> local_op_input_grad_placements(const std::vector<Placement>& input,
                                                      const std::vector<Placement>& output,
                                                      const std::vector<Placement>& grad_out) {
  SHARD_CHECK(input.size() == output.size() && output.size() == grad_out.size(), "local_op_input_grad_placements",
              "placement lists of different lengths ({}, {}, {})", input.size(), output.size(), grad_out.size());
  std::vector<Placement> out(input.size());
  for (std::size_t m = 0; m < input.size(); ++m) {
    const Placement& x = input[m];
    if (x.is_shard()) out[m] = x;
    else if (x.is_partial()) out[m] = Replicate();
    else  // a replicated input: its per-rank gradients are contributions unless the op ran replicated
      out[m] = output[m].is_replicate() && grad_out[m].is_replicate() ? Replicate() : Partial(ReduceOp::sum);
  }
  return out;
}

}  // namespace shard::autograd

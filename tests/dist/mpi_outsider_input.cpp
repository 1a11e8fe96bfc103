// Bad input found by the outsider trial (tag [outsider]): each must be a shard::Error on every
// rank, never a hang, a crash or silently wrong data, and the communicator must stay in step.
//  - shapes whose element / byte count overflows int64 (2^32 x 2^32 wrapped to 0 elements and
//    allocated nothing; an upsample by 2^40 per dim sized its output from a wrapped count and hung
//    in the kernel);
//  - window parameters (padding, dilation, stride, kernel, scale) so large that derived extents
//    wrapped around (garbage pooled, misleading messages, errors from inside a kernel);
//  - operands on two DeviceMesh objects of the same shape: the message says what to do.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <shardtensor/nn/functional.hpp>

#include "support/mpi_harness.hpp"

namespace st_dist_mpi_outsider_input {

using namespace shard;
using namespace shard::test;
using Catch::Matchers::ContainsSubstring;

namespace {

/// Every rank of `comm` is here and in step (a collective after the error).
void in_step(Communicator& comm) {
  int one = 1;
  comm.allreduce(&one, &one, 1, DType::i32, ReduceOp::sum);
  CHECK(one == comm.size());
}

}  // namespace

TEST_CASE("shapes whose element or byte count overflows int64 are refused", "[dist][errors][outsider][mpi]") {
  CHECK(numel_fits(Shape<2>{index_t(1) << 31, index_t(1) << 31}, 1));
  CHECK(!numel_fits(Shape<2>{index_t(1) << 32, index_t(1) << 32}, 1));  // 2^64 wraps to 0
  CHECK(!numel_fits(Shape<2>{index_t(1) << 30, index_t(1) << 30}, 16)); // 2^64 bytes
  CHECK(numel_fits(Shape<3>{index_t(1) << 40, index_t(1) << 40, 0}, 8));  // empty is empty
  CHECK_THAT(error_of([] { Tensor<double, 2>::empty({index_t(1) << 32, index_t(1) << 32}); }),
             ContainsSubstring("overflows"));
  CHECK_THAT(error_of([] { Tensor<float, 3>::empty({index_t(1) << 21, index_t(1) << 21, index_t(1) << 21}); }),
             ContainsSubstring("overflows"));
  const index_t huge[2] = {index_t(1) << 32, index_t(1) << 32};
  CHECK_THAT(error_of([&] { Block::allocate(DType::f64, Device::cpu(), huge, 2); }), ContainsSubstring("overflows"));
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, {P});
    const index_t big = index_t(1) << 32;
    CHECK_THAT(error_of([&] { DistTensor<double, 2>::zeros({big, big}, mesh, {Shard(0)}); }),
               ContainsSubstring("overflows"));
    CHECK_THAT(error_of([&] { DistTensor<float, 2>::random({big, big}, mesh, {Replicate()}, 1); }),
               ContainsSubstring("overflows"));
    in_step(*comm);
    // An op whose output shape overflows: refused from the spec, on every rank, before any work.
    autograd::Var<double, 4> x(DistTensor<double, 4>::random({1, 2, 8, 8}, mesh, {Shard(2)}, 1), true);
    CHECK_THAT(error_of([&] { F::upsample(x, ResizeMode::nearest, {index_t(1) << 30, index_t(1) << 30}); }),
               ContainsSubstring("overflows"));
    CHECK_THAT(error_of([&] { F::upsample(x, ResizeMode::linear, {index_t(1) << 30, index_t(1) << 30}); }),
               ContainsSubstring("overflows"));
    in_step(*comm);
    auto y = F::upsample(x, ResizeMode::nearest, {2, 3});  // still works afterwards
    CHECK(y.value().global_shape() == Shape<4>{1, 2, 16, 24});
    CHECK_NOTHROW(F::sum(y).backward());
  });
}

TEST_CASE("operands on two DeviceMesh objects of one shape: the message says what to do",
          "[dist][errors][outsider][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh a(comm, {P}), b(comm, {P});  // an outsider's first program: one mesh per tensor
    autograd::Var<double, 4> x(DistTensor<double, 4>::random({1, 2, 8, 8}, a, {Shard(2)}, 1), true);
    autograd::Var<double, 4> y(DistTensor<double, 4>::random({1, 2, 8, 8}, b, {Shard(2)}, 2), true);
    autograd::Var<double, 4> w(DistTensor<double, 4>::random({3, 2, 3, 3}, b, {Replicate()}, 3), true);
    for (const std::string& msg :
         {error_of([&] { F::add(x, y); }), error_of([&] { F::mse_loss(x, y); }),
          error_of([&] { F::conv(x, w, std::nullopt, F::ConvOptions<2>::symmetric(1)); }),
          error_of([&] { x.value().redistribute(DistSpec(b, {Replicate()}, {1, 2, 8, 8})); })}) {
      INFO(msg);
      CHECK_THAT(msg, ContainsSubstring("different meshes") && ContainsSubstring("two different DeviceMesh objects") &&
                          ContainsSubstring("build the DeviceMesh once"));
    }
    in_step(*comm);
    CHECK_THAT(error_of([&] { F::add(x, autograd::Var<double, 4>(DistTensor<double, 4>::random(
                                           {1, 2, 8, 8}, DeviceMesh(comm, {1, P}), {Replicate(), Shard(2)}, 1))); }),
               ContainsSubstring("meshes of shapes"));
    // one mesh shared (copies included) works
    DeviceMesh a2 = a;
    autograd::Var<double, 4> z(DistTensor<double, 4>::random({1, 2, 8, 8}, a2, {Shard(2)}, 2), true);
    CHECK_NOTHROW(F::sum(F::add(x, z)).backward());
  });
}

TEST_CASE("window ops refuse parameters whose derived extents would overflow int64", "[nn][errors][outsider][mpi]") {
  for_each_comm_size([](CommPtr comm) {
    const int P = comm->size();
    DeviceMesh mesh(comm, {P});
    const index_t e62 = index_t(1) << 62, e40 = index_t(1) << 40;
    autograd::Var<double, 4> x(DistTensor<double, 4>::random({1, 2, 8, 8}, mesh, {Shard(2)}, 1), true);
    autograd::Var<double, 4> w(DistTensor<double, 4>::random({2, 2, 3, 3}, mesh, {Replicate()}, 2), true);
    using O2 = F::ConvOptions<2>;
    using OT = F::ConvTransposeOptions<2>;
    // padding / dilation 2^62 wrapped the padded extent and span negative; pool kernel 2^62 with
    // padding 2^62 - 1 was accepted and pooled garbage; conv_transpose stride 2^62 "gave an empty
    // output"; upsample by 2^62 failed inside the kernel.
    for (const std::string& msg :
         {error_of([&] { F::conv(x, w, std::nullopt, O2::symmetric(e62)); }),
          error_of([&] { F::conv(x, w, std::nullopt, O2::symmetric(1, 1, e62)); }),
          error_of([&] { F::conv(x, w, std::nullopt, O2::symmetric(1, e62)); }),
          error_of([&] { F::max_pool(x, PoolParams<2>{.kernel = {e62, 2}, .pad_lo = {e62 - 1, 0}, .pad_hi = {e62 - 1, 0}}); }),
          error_of([&] { F::avg_pool(x, PoolParams<2>{.kernel = {2, 2}, .stride = {e40, 1}}); }),
          error_of([&] { F::conv_transpose(x, w, std::nullopt, OT::symmetric(0, e62)); }),
          error_of([&] { F::conv_transpose(x, w, std::nullopt, OT::symmetric(0, 1, e40)); }),
          error_of([&] { F::upsample(x, ResizeMode::nearest, {e62, 1}); }),
          error_of([&] { F::upsample(x, ResizeMode::linear, {1, index_t(1) << 31}); })}) {
      INFO(msg);
      CHECK_THAT(msg, ContainsSubstring("at most 2147483647"));
    }
    in_step(*comm);
    // large accepted parameters still work where the result is small (not kMaxWindowParam itself:
    // the CPU conv's input gradient takes time linear in the stride)
    auto y = F::conv(x, w, std::nullopt, O2::symmetric(1, 4096));  // one output row/col
    CHECK(y.value().global_shape() == Shape<4>{1, 2, 1, 1});
    CHECK_NOTHROW(F::sum(y).backward());
  });
}

}  // namespace st_dist_mpi_outsider_input

// The one precision question (exec::native_storage, KernelTable::native_storage): every CPU kernel
// table's answer agrees with what its front then does. For each family that has a front taking
// bf16 / f16 blocks, the op runs on bf16 and on f16 operands and the number of f32 working blocks
// the front made (exec::detail::t_f32_work_blocks, counted by F32Work) is compared with the
// table's answer for that pass: native means none, not native means some. Also: f32 / f64 are
// native for every family; every family with a CPU table can be asked; the conv answer follows the
// geometry (stride 1 on the direct path: native; stride 2: widened).
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <vector>

#include "shardtensor/exec/attention.hpp"
#include "shardtensor/exec/conv.hpp"
#include "shardtensor/exec/gemm.hpp"
#include "shardtensor/exec/norm.hpp"
#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/exec/pool.hpp"
#include "shardtensor/exec/precision.hpp"
#include "shardtensor/exec/reduce.hpp"
#include "shardtensor/exec/resize.hpp"
#include "shardtensor/shardtensor.hpp"

namespace st_exec_test_precision_tables {

using namespace shard;
using exec::KernelFamily;
using exec::KernelPass;

namespace {

/// A contiguous CPU block of dtype L and shape `shape`, filled with small values.
template <class L>
struct Buf {
  std::vector<L> v;
  std::vector<index_t> shape;
  explicit Buf(std::vector<index_t> s, float base = 0.25f) : shape(std::move(s)) {
    index_t n = 1;
    for (index_t e : shape) n *= e;
    v.resize(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = L(base + 0.125f * static_cast<float>(i % 7));
  }
  Block block() { return Block::view(dtype_of<L>, Device::cpu(), v.data(), shape.data(), static_cast<int>(shape.size())); }
};

/// Working blocks the front made while running fn.
template <class Fn>
std::uint64_t f32_blocks(Fn&& fn) {
  const std::uint64_t before = exec::detail::t_f32_work_blocks;
  fn();
  return exec::detail::t_f32_work_blocks - before;
}

/// The table's answer and what the front did agree: native <=> no f32 working block.
void agree(const char* what, bool native, std::uint64_t blocks) {
  INFO(what << ": table answers native=" << native << ", the front made " << blocks << " f32 working blocks");
  CHECK(native == (blocks == 0));
}

}  // namespace

TEST_CASE("native_storage: f32 and f64 are native for every family with a CPU table", "[precision][tables]") {
  auto& ctx = current_context(Device::cpu());
  for (int f = 0; f < static_cast<int>(KernelFamily::count_); ++f) {
    const auto fam = static_cast<KernelFamily>(f);
    if (fam == KernelFamily::runtime || fam == KernelFamily::comm) {
      CHECK_THROWS_AS(exec::native_storage(fam, DType::bf16, KernelPass::forward, ctx, "test"), Error);
      continue;
    }
    if (fam == KernelFamily::tensor) continue;  // no CPU table: the host side is inline in tensor/
    INFO("family " << f);
    for (DType dt : {DType::f32, DType::f64})
      for (KernelPass p : {KernelPass::forward, KernelPass::backward_data, KernelPass::backward_weight,
                           KernelPass::backward_bias})
        CHECK(exec::native_storage(fam, dt, p, ctx, "test"));
    // bf16 / f16: any answer, but one (no throw) for every pass
    for (DType dt : {DType::bf16, DType::f16})
      for (KernelPass p : {KernelPass::forward, KernelPass::backward_data})
        CHECK_NOTHROW(exec::native_storage(fam, dt, p, ctx, "test"));
  }
}

TEMPLATE_TEST_CASE("native_storage: each CPU table's answer is what its front does", "[precision][tables]", bf16,
                   f16) {
  using L = TestType;
  const DType dt = dtype_of<L>;
  auto& ctx = current_context(Device::cpu());
  auto native = [&](KernelFamily f, KernelPass p) { return exec::native_storage(f, dt, p, ctx, "test"); };

  SECTION("pointwise") {
    Buf<L> x({256}), y({256}), dy({256}), dx({256}), b({256}, 0.5f);
    agree("unary", native(KernelFamily::pointwise, KernelPass::forward),
          f32_blocks([&] { exec::unary(exec::UnaryOp::relu, 0.0, x.block(), y.block(), ctx); }));
    agree("unary_backward", native(KernelFamily::pointwise, KernelPass::backward_data), f32_blocks([&] {
            exec::unary_backward(exec::UnaryOp::relu, 0.0, x.block(), y.block(), dy.block(), dx.block(), ctx);
          }));
    agree("binary", native(KernelFamily::pointwise, KernelPass::forward),
          f32_blocks([&] { exec::binary(exec::BinaryOp::add, x.block(), b.block(), y.block(), ctx); }));
  }
  SECTION("gemm") {
    Buf<L> a({8, 16}), bm({16, 4}), c({8, 4}), bias({4}), gb({4});
    agree("gemm", native(KernelFamily::gemm, KernelPass::forward),
          f32_blocks([&] { exec::gemm(exec::GemmGeometry{}, a.block(), bm.block(), c.block(), ctx); }));
    agree("add_bias", native(KernelFamily::gemm, KernelPass::forward),
          f32_blocks([&] { exec::add_bias({8, 4, 1}, bias.block(), c.block(), ctx); }));
    agree("bias_grad", native(KernelFamily::gemm, KernelPass::backward_bias),
          f32_blocks([&] { exec::bias_grad({8, 4, 1}, c.block(), gb.block(), ctx); }));
  }
  SECTION("norm") {
    Buf<L> x({2, 3, 16});
    exec::NormGeom g;
    g.kind = exec::NormKind::batch;
    g.A = 2;
    g.C = 3;
    g.S = 16;
    std::vector<double> mean(3, 0.0), out(3, 0.0), host(96, 0.0);
    agree("norm_sums", native(KernelFamily::norm, KernelPass::forward),
          f32_blocks([&] { exec::norm_sums(g, x.block(), nullptr, out.data(), ctx); }));
    std::vector<double> m2(3, 0.0), lmean(3, 0.0);
    agree("norm_moments", native(KernelFamily::norm, KernelPass::forward),
          f32_blocks([&] { exec::norm_moments(g, x.block(), out.data(), m2.data(), lmean.data(), ctx); }));
    agree("load_f64", native(KernelFamily::norm, KernelPass::forward),
          f32_blocks([&] { exec::load_f64(x.block(), host.data(), ctx); }));
  }
  SECTION("pool and resize") {
    Buf<L> x({2, 8, 8}), y({2, 4, 4}), gx({2, 8, 8});
    exec::PoolGeometry g;
    g.planes = 2;
    g.in = {1, 8, 8};
    g.out = {1, 4, 4};
    g.kernel = {1, 2, 2};
    g.stride = {1, 2, 2};
    agree("avg_pool_forward", native(KernelFamily::pool, KernelPass::forward),
          f32_blocks([&] { exec::avg_pool_forward(g, x.block(), y.block(), ctx); }));
    agree("avg_pool_backward", native(KernelFamily::pool, KernelPass::backward_data),
          f32_blocks([&] { exec::avg_pool_backward(g, y.block(), gx.block(), ctx); }));
    exec::ResizeGeometry r;
    r.planes = 2;
    r.scale = {1, 2, 2};
    r.global_in = {1, 4, 4};
    r.in_len = {1, 4, 4};
    r.out_len = {1, 8, 8};
    agree("resize_forward", native(KernelFamily::resize, KernelPass::forward),
          f32_blocks([&] { exec::resize_forward(r, y.block(), x.block(), ctx); }));
  }
  SECTION("reduce") {
    Buf<L> x({64}), out({1});
    agree("reduce_sum", native(KernelFamily::reduce, KernelPass::forward),
          f32_blocks([&] { exec::reduce_sum(x.block(), out.block(), 1.0, ctx); }));
  }
  SECTION("attention") {
    const exec::AttnGeom g{1, 2, 8, 8, 4, 4};
    Buf<L> q({1, 2, 8, 4}), k({1, 2, 8, 4}), v({1, 2, 8, 4}), o({1, 2, 8, 4});
    Buf<float> lse({1, 2, 8});
    agree("attention_forward", native(KernelFamily::attention, KernelPass::forward), f32_blocks([&] {
            exec::attention_forward(g, exec::AttnMask{}, q.block(), k.block(), v.block(), nullptr, o.block(),
                                    lse.block(), ctx);
          }));
  }
  SECTION("conv: the answer follows the geometry") {
    for (index_t stride : {1, 2}) {
      ConvGeometry g;
      g.spatial_dims = 2;
      g.batch = 2;
      g.in_channels = 4;
      g.out_channels = 8;
      g.in = {1, 8, 8};
      g.kernel = {1, 3, 3};
      g.stride = {1, stride, stride};
      g.pad_lo = {0, 1, 1};
      g.out = {1, (8 + 2 - 3) / stride + 1, (8 + 2 - 3) / stride + 1};
      Buf<L> x({2, 4, 8, 8}), w({8, 4, 3, 3}), y({2, 8, g.out[1], g.out[2]});
      INFO("stride " << stride);
      agree("conv_forward", exec::native_storage(KernelFamily::conv, dt, KernelPass::forward, ctx, "test", &g),
            f32_blocks([&] { exec::conv_forward(g, x.block(), w.block(), nullptr, y.block(), ctx); }));
      if (stride == 2) CHECK_FALSE(exec::native_storage(KernelFamily::conv, dt, KernelPass::forward, ctx, "test", &g));
    }
    Buf<L> gy({2, 8, 16}), gb({8});
    agree("conv_backward_bias", native(KernelFamily::conv, KernelPass::backward_bias),
          f32_blocks([&] { exec::conv_backward_bias(gy.block(), gb.block(), ctx); }));
  }
}

}  // namespace st_exec_test_precision_tables

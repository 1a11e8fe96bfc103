// Mixed precision on the CPU (issue 18 item 8): conv2d / conv3d forward + backward (input and
// weight gradients) at one rank in f32, bf16 and f16 storage, interleaved rounds in one process,
// medians; prints the CPU model and ISA beside every figure and the speed ratio f32 / low.
//   OMP_NUM_THREADS=2 build/bench/bench_precision [--rounds 7] [--case 2d|3d|pointwise|pool|all]
// Stride-1 bf16 / f16 convs run in the direct path without whole-tensor f32 copies (widened tile by
// tile); bf16 runs on the CPU's bf16 unit (cpu_bf16(): AMX tiles, or AVX-512 BF16 vdpbf16ps on AMD;
// SHARDTENSOR_CPU_BF16 lowers it) unless ExecSettings::native_low_precision is off. The per-pass
// table shows both bf16 variants.
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <shardtensor/core/cpu_isa.hpp>
#include <shardtensor/exec/conv.hpp>
#include <shardtensor/exec/pointwise.hpp>
#include <shardtensor/exec/pool.hpp>
#include <shardtensor/exec/resize.hpp>
#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

#include "bench_util.hpp"

using namespace shard;
namespace F = shard::nn::functional;
using autograd::Var;

namespace {

const DeviceMesh& mesh1() {
  static DeviceMesh m(std::make_shared<SelfComm>(), {1});
  return m;
}

/// One forward + backward of conv(x, w) in dtype T; returns milliseconds.
template <class T, int R>
double conv_step(const DistTensor<T, R>& x, const DistTensor<T, R>& w) {
  Var<T, R> xv(x, true), wv(w, true);
  const double t0 = bench::now_ms();
  auto y = F::conv(xv, wv, std::nullopt, F::ConvOptions<R - 2>::symmetric(1));
  F::sum(y).backward();
  return bench::now_ms() - t0;
}

template <int R>
void run_case(const char* name, const Shape<R>& xs, const Shape<R>& ws, int rounds) {
  const auto x32 = DistTensor<float, R>::random(xs, mesh1(), {Replicate()}, 1);
  const auto w32 = DistTensor<float, R>::random(ws, mesh1(), {Replicate()}, 2, RandomInit::uniform(-0.1, 0.1));
  const auto xb = shard::cast<bf16>(x32), wb = shard::cast<bf16>(w32);
  const auto xh = shard::cast<f16>(x32), wh = shard::cast<f16>(w32);
  conv_step(x32, w32), conv_step(xb, wb), conv_step(xh, wh);  // warm-up (plans, pools)
  std::vector<double> t32, tb, th;
  for (int r = 0; r < rounds; ++r) {
    t32.push_back(conv_step(x32, w32));
    tb.push_back(conv_step(xb, wb));
    th.push_back(conv_step(xh, wh));
  }
  const double m32 = bench::median(t32), mb = bench::median(tb), mh = bench::median(th);
  std::printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", name, m32, mb, mh, m32 / mb, m32 / mh);
  std::printf("RESULT %s f32_ms %.3f bf16_ms %.3f f16_ms %.3f ratio_bf16 %.3f ratio_f16 %.3f\n", name, m32, mb, mh,
              m32 / mb, m32 / mh);
}

/// Per pass, at the exec level (no tape): f32, bf16 on the CPU's bf16 unit (ExecSettings::
/// native_low_precision; cpu_bf16()), bf16 on the f32 micro-kernels (widened tile by
/// tile) and f16. Milliseconds, medians over the rounds.
void run_passes(const char* name, const ConvGeometry& g, int rounds) {
  const index_t nx = g.batch * g.in_channels * g.in[0] * g.in[1] * g.in[2];
  const index_t ny = g.batch * g.out_channels * g.out[0] * g.out[1] * g.out[2];
  const index_t nw = g.out_channels * g.in_channels / g.groups * g.kernel[0] * g.kernel[1] * g.kernel[2];
  auto make = [&](DType dt) {
    std::vector<Block> b;
    for (index_t n : {nx, nw, ny, nx, nw}) {
      Block blk = Block::allocate(DType::f32, Device::cpu(), &n, 1);
      float* f = static_cast<float*>(blk.data);
      for (index_t i = 0; i < n; ++i) f[i] = static_cast<float>((i * 7919 % 2003) / 1001.5 - 1.0);
      if (dt == DType::f32) {
        b.push_back(blk);
        continue;
      }
      Block lo = Block::allocate(dt, Device::cpu(), &n, 1);
      exec::convert(blk, lo, current_context());
      b.push_back(lo);
    }
    return b;
  };
  const char* labels[] = {"forward", "input grad", "weight grad"};
  struct Variant {
    const char* name;
    DType dt;
    bool native;
  };
  const Variant vars[] = {{"f32", DType::f32, true}, {"bf16 native", DType::bf16, true},
                          {"bf16 widened", DType::bf16, false}, {"f16", DType::f16, true}};
  std::vector<std::vector<Block>> bufs;
  for (const Variant& v : vars) bufs.push_back(make(v.dt));
  std::vector<double> t[4][3];
  for (int r = -1; r < rounds; ++r)
    for (int vi = 0; vi < 4; ++vi) {
      ExecContext ctx;
      ctx.settings().native_low_precision = vars[vi].native;
      const auto& b = bufs[static_cast<std::size_t>(vi)];
      for (int pass = 0; pass < 3; ++pass) {
        const double t0 = bench::now_ms();
        if (pass == 0) exec::conv_forward(g, b[0], b[1], nullptr, b[2], ctx);
        if (pass == 1) exec::conv_backward_input(g, b[2], b[1], nullptr, b[3], ctx);
        if (pass == 2) exec::conv_backward_weight(g, b[0], b[2], b[4], ctx);
        if (r >= 0) t[vi][pass].push_back(bench::now_ms() - t0);
      }
    }
  for (int pass = 0; pass < 3; ++pass) {
    const double m32 = bench::median(t[0][pass]);
    std::printf("| %s %s | %.2f | %.2f (%.2fx) | %.2f (%.2fx) | %.2f (%.2fx) |\n", name, labels[pass], m32,
                bench::median(t[1][pass]), m32 / bench::median(t[1][pass]), bench::median(t[2][pass]),
                m32 / bench::median(t[2][pass]), bench::median(t[3][pass]), m32 / bench::median(t[3][pass]));
  }
}

ConvGeometry geometry(int dims, index_t n, index_t c, index_t e) {
  ConvGeometry g;
  g.spatial_dims = dims;
  g.batch = n;
  g.in_channels = g.out_channels = c;
  for (int d = 3 - dims; d < 3; ++d) {
    g.in[d] = g.out[d] = e;
    g.kernel[d] = 3;
    g.pad_lo[d] = 1;
  }
  return g;
}

}  // namespace

/// One pointwise pass over n elements of dtype T (gelu forward + its backward + a mul), the
/// exec-level ops a bf16 model's activations go through; milliseconds.
template <class T>
double pointwise_step(const Tensor<T, 1>& x, const Tensor<T, 1>& g, Tensor<T, 1>& y, Tensor<T, 1>& dx) {
  auto& ctx = current_context(Device::cpu());
  const double t0 = bench::now_ms();
  exec::unary(exec::UnaryOp::gelu, 0, as_block(x), as_block(y), ctx);
  exec::unary_backward(exec::UnaryOp::gelu, 0, as_block(x), as_block(y), as_block(g), as_block(dx), ctx);
  exec::binary(exec::BinaryOp::mul, as_block(dx), as_block(g), as_block(y), ctx);
  return bench::now_ms() - t0;
}
/// The same pass on bf16 storage through f32 working copies in chunks of 2^16 elements per
/// operand (what exec/precision.hpp's chunked_f32 did for these ops before the pointwise kernels
/// took the storage type): per chunk, widen the inputs, run the f32 op, round the result.
double pointwise_step_copies(const Tensor<bf16, 1>& x, const Tensor<bf16, 1>& g, Tensor<bf16, 1>& y,
                             Tensor<bf16, 1>& dx) {
  auto& ctx = current_context(Device::cpu());
  const double t0 = bench::now_ms();
  const index_t n = x.numel(), chunk = index_t{1} << 16;
  // One chunked op: ins widened chunk by chunk, fn(f32 ins, f32 out), out rounded.
  auto chunked = [&](std::vector<Block> ins, const Block& out, auto fn) {
    for (index_t lo = 0; lo < n; lo += chunk) {
      const index_t len = std::min(chunk, n - lo);
      std::vector<Block> wi;
      for (const Block& b : ins) {
        Block w = Block::allocate(DType::f32, Device::cpu(), &len, 1);
        exec::convert(Block::view(b.dtype, b.device, static_cast<char*>(b.data) + lo * 2, &len, 1), w, ctx);
        wi.push_back(w);
      }
      Block wo = Block::allocate(DType::f32, Device::cpu(), &len, 1);
      fn(wi, wo);
      exec::convert(wo, Block::view(out.dtype, out.device, static_cast<char*>(out.data) + lo * 2, &len, 1), ctx);
    }
  };
  chunked({as_block(x)}, as_block(y), [&](const auto& i, const Block& o) { exec::unary(exec::UnaryOp::gelu, 0, i[0], o, ctx); });
  chunked({as_block(x), as_block(y), as_block(g)}, as_block(dx), [&](const auto& i, const Block& o) {
    exec::unary_backward(exec::UnaryOp::gelu, 0, i[0], i[1], i[2], o, ctx);
  });
  chunked({as_block(dx), as_block(g)}, as_block(y), [&](const auto& i, const Block& o) {
    exec::binary(exec::BinaryOp::mul, i[0], i[1], o, ctx);
  });
  return bench::now_ms() - t0;
}

void run_pointwise(index_t n, int rounds) {
  auto x32 = Tensor<float, 1>::empty({n}), g32 = Tensor<float, 1>::empty({n});
  for (index_t i = 0; i < n; ++i) {
    x32(i) = static_cast<float>((i * 7919) % 2001) / 500.0f - 2.0f;
    g32(i) = static_cast<float>((i * 104729) % 1001) / 1000.0f - 0.5f;
  }
  auto& ctx = current_context(Device::cpu());
  auto xb = Tensor<bf16, 1>::empty({n}), gb = Tensor<bf16, 1>::empty({n});
  exec::convert(as_block(x32), as_block(xb), ctx);
  exec::convert(as_block(g32), as_block(gb), ctx);
  auto y32 = Tensor<float, 1>::empty({n}), d32 = Tensor<float, 1>::empty({n});
  auto yb = Tensor<bf16, 1>::empty({n}), db = Tensor<bf16, 1>::empty({n});
  pointwise_step(x32, g32, y32, d32), pointwise_step(xb, gb, yb, db), pointwise_step_copies(xb, gb, yb, db);
  std::vector<double> t32, tb, tc;
  for (int r = 0; r < rounds; ++r) {
    t32.push_back(pointwise_step(x32, g32, y32, d32));
    tb.push_back(pointwise_step(xb, gb, yb, db));
    tc.push_back(pointwise_step_copies(xb, gb, yb, db));
  }
  const double m32 = bench::median(t32), mb = bench::median(tb), mc = bench::median(tc);
  std::printf("| gelu fwd + bwd + mul, %lld elements | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
              static_cast<long long>(n), m32, mb, mc, m32 / mb, mc / mb);
  std::printf("RESULT pointwise n %lld f32_ms %.3f bf16_native_ms %.3f bf16_copies_ms %.3f\n",
              static_cast<long long>(n), m32, mb, mc);
}

/// Pooling and upsampling passes of a U-Net level on [planes, 1, n, n] (n even): 2x2 average and
/// max pooling forward + backward, then 2x linear upsampling of the pooled field forward +
/// backward, all at the exec level. `via` runs one op: directly, or through f32 copies.
struct PoolPass {
  exec::PoolGeometry pg;
  exec::ResizeGeometry rg;
  index_t nin = 0, nout = 0;
  PoolPass(index_t planes, index_t n) {
    pg.planes = planes;
    pg.in = {1, n, n};
    pg.out = {1, n / 2, n / 2};
    pg.kernel = pg.stride = {1, 2, 2};
    rg.mode = ResizeMode::linear;
    rg.planes = planes;
    rg.scale = {1, 2, 2};
    rg.global_in = rg.in_len = {1, n / 2, n / 2};
    rg.out_len = {1, n, n};
    nin = planes * n * n;
    nout = planes * (n / 2) * (n / 2);
  }
};
/// Runs fn(in, out) on bf16 blocks through f32 working copies in chunks of whole planes of about
/// 2^16 elements (what the fronts did before the pool and resize tables took the storage type).
template <class Fn>
void plane_chunks(const Block& in, index_t per_in, const Block& out, index_t per_out, index_t planes, Fn fn) {
  auto& ctx = current_context(Device::cpu());
  const index_t step = std::max<index_t>(1, (index_t{1} << 16) / std::max(per_in, per_out));
  for (index_t p0 = 0; p0 < planes; p0 += step) {
    const index_t c = std::min(step, planes - p0), li = c * per_in, lo = c * per_out;
    Block wi = Block::allocate(DType::f32, Device::cpu(), &li, 1), wo = Block::allocate(DType::f32, Device::cpu(), &lo, 1);
    exec::convert(Block::view(in.dtype, in.device, static_cast<char*>(in.data) + p0 * per_in * 2, &li, 1), wi, ctx);
    fn(c, wi, wo);
    exec::convert(wo, Block::view(out.dtype, out.device, static_cast<char*>(out.data) + p0 * per_out * 2, &lo, 1), ctx);
  }
}
template <class T>
double pool_step(const PoolPass& p, const Tensor<T, 1>& x, const Tensor<T, 1>& gy, Tensor<T, 1>& y, Tensor<T, 1>& gx,
                 Tensor<std::int64_t, 1>& idx, bool copies) {
  auto& ctx = current_context(Device::cpu());
  const index_t pin = p.nin / p.pg.planes, pout = p.nout / p.pg.planes;
  const double t0 = bench::now_ms();
  if (!copies) {
    exec::avg_pool_forward(p.pg, as_block(x), as_block(y), ctx);
    exec::avg_pool_backward(p.pg, as_block(gy), as_block(gx), ctx);
    exec::max_pool_forward(p.pg, as_block(x), as_block(y), as_block(idx), ctx);
    exec::max_pool_backward(p.pg, as_block(gy), as_block(idx), as_block(gx), ctx);
    exec::resize_forward(p.rg, as_block(y), as_block(gx), ctx);
    exec::resize_backward(p.rg, as_block(gx), as_block(y), ctx);
  } else {
    auto geo = [](auto g, index_t c) { g.planes = c; return g; };
    plane_chunks(as_block(x), pin, as_block(y), pout, p.pg.planes, [&](index_t c, const Block& i, const Block& o) {
      exec::avg_pool_forward(geo(p.pg, c), i, o, ctx);
    });
    plane_chunks(as_block(gy), pout, as_block(gx), pin, p.pg.planes, [&](index_t c, const Block& i, const Block& o) {
      exec::avg_pool_backward(geo(p.pg, c), i, o, ctx);
    });
    index_t p0 = 0;
    plane_chunks(as_block(x), pin, as_block(y), pout, p.pg.planes, [&](index_t c, const Block& i, const Block& o) {
      const index_t len = c * pout;
      exec::max_pool_forward(geo(p.pg, c), i, o,
                             Block::view(DType::i64, Device::cpu(), idx.data() + p0 * pout, &len, 1), ctx);
      p0 += c;
    });
    p0 = 0;
    plane_chunks(as_block(gy), pout, as_block(gx), pin, p.pg.planes, [&](index_t c, const Block& i, const Block& o) {
      const index_t len = c * pout;
      exec::max_pool_backward(geo(p.pg, c), i, Block::view(DType::i64, Device::cpu(), idx.data() + p0 * pout, &len, 1),
                              o, ctx);
      p0 += c;
    });
    plane_chunks(as_block(y), pout, as_block(gx), pin, p.pg.planes, [&](index_t c, const Block& i, const Block& o) {
      exec::resize_forward(geo(p.rg, c), i, o, ctx);
    });
    plane_chunks(as_block(gx), pin, as_block(y), pout, p.pg.planes, [&](index_t c, const Block& i, const Block& o) {
      exec::resize_backward(geo(p.rg, c), i, o, ctx);
    });
  }
  return bench::now_ms() - t0;
}

void run_pool(index_t planes, index_t n, int rounds) {
  const PoolPass p(planes, n);
  auto& ctx = current_context(Device::cpu());
  auto x32 = Tensor<float, 1>::empty({p.nin}), g32 = Tensor<float, 1>::empty({p.nout});
  for (index_t i = 0; i < p.nin; ++i) x32(i) = static_cast<float>((i * 7919) % 2001) / 500.0f - 2.0f;
  for (index_t i = 0; i < p.nout; ++i) g32(i) = static_cast<float>((i * 104729) % 1001) / 1000.0f - 0.5f;
  auto xb = Tensor<bf16, 1>::empty({p.nin}), gb = Tensor<bf16, 1>::empty({p.nout});
  exec::convert(as_block(x32), as_block(xb), ctx);
  exec::convert(as_block(g32), as_block(gb), ctx);
  auto y32 = Tensor<float, 1>::empty({p.nout}), d32 = Tensor<float, 1>::empty({p.nin});
  auto yb = Tensor<bf16, 1>::empty({p.nout}), db = Tensor<bf16, 1>::empty({p.nin});
  auto idx = Tensor<std::int64_t, 1>::empty({p.nout});
  // The two bf16 routes give the same bits (the fronts' contract); checked once here.
  pool_step(p, x32, g32, y32, d32, idx, false);
  pool_step(p, xb, gb, yb, db, idx, true);
  const auto copy_y = yb.to(Device::cpu());
  pool_step(p, xb, gb, yb, db, idx, false);
  index_t differ = 0;
  for (index_t i = 0; i < p.nout; ++i) differ += copy_y(i).bits == yb(i).bits ? 0 : 1;
  std::vector<double> t32, tb, tc;
  for (int r = 0; r < rounds; ++r) {
    t32.push_back(pool_step(p, x32, g32, y32, d32, idx, false));
    tb.push_back(pool_step(p, xb, gb, yb, db, idx, false));
    tc.push_back(pool_step(p, xb, gb, yb, db, idx, true));
  }
  const double m32 = bench::median(t32), mb = bench::median(tb), mc = bench::median(tc);
  std::printf("| avg + max pool 2x2, linear upsample 2x (fwd + bwd), %lld x %lld^2 | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
              static_cast<long long>(planes), static_cast<long long>(n), m32, mb, mc, m32 / mb, mc / mb);
  std::printf("RESULT pool planes %lld n %lld f32_ms %.3f bf16_native_ms %.3f bf16_copies_ms %.3f routes_differ %lld\n",
              static_cast<long long>(planes), static_cast<long long>(n), m32, mb, mc, static_cast<long long>(differ));
}

int main(int argc, char** argv) {
  const int rounds = static_cast<int>(bench::arg_int(argc, argv, "--rounds", 7));
  const std::string which = bench::arg_str(argc, argv, "--case", "all");
  std::printf("bench_precision: CPU %s, ISA %s, bf16 unit %s, load %.2f, %d rounds (medians)\n",
              cpu_model_name().c_str(), to_string(cpu_isa()), to_string(cpu_bf16()), bench::load_average(), rounds);
  std::printf("| case (fwd + bwd) | f32 ms | bf16 ms | f16 ms | f32 / bf16 | f32 / f16 |\n|---|---:|---:|---:|---:|---:|\n");
  if (which == "all" || which == "2d")
    run_case<4>("conv2d 32->32 3x3, 2x32x128x128", {2, 32, 128, 128}, {32, 32, 3, 3}, rounds);
  if (which == "all" || which == "3d")
    run_case<5>("conv3d 16->16 3^3, 1x16x48^3", {1, 16, 48, 48, 48}, {16, 16, 3, 3, 3}, rounds);
  std::printf("\nper pass (exec level; native = the CPU's bf16 unit, cpu_bf16() = %s; widened = f32 kernels on bf16"
              " storage; ratios f32 / dtype)\n",
              to_string(cpu_bf16()));
  std::printf("| pass | f32 ms | bf16 native ms | bf16 widened ms | f16 ms |\n|---|---:|---:|---:|---:|\n");
  if (which == "all" || which == "2d") run_passes("conv2d 32ch 2x128^2", geometry(2, 2, 32, 128), rounds);
  if (which == "all" || which == "3d") run_passes("conv3d 16ch 48^3", geometry(3, 1, 16, 48), rounds);
  if (which == "all" || which == "pointwise") {
    std::printf("\npointwise on bf16 storage (exec level): native = f32 tiles on the stack, one rounding per result;\n"
                "copies = f32 working copies in chunks of 2^16 elements (the route it replaced)\n");
    std::printf("| ops | f32 ms | bf16 native ms | bf16 copies ms | f32 / native | copies / native |\n"
                "|---|---:|---:|---:|---:|---:|\n");
    run_pointwise(index_t{1} << 22, rounds);
  }
  if (which == "all" || which == "pool") {
    std::printf("\npooling and upsampling on bf16 storage (exec level): native = the pool / resize tables read bf16 in\n"
                "place; copies = f32 working copies in chunks of whole planes of ~2^16 elements (the route it replaced)\n");
    std::printf("| ops | f32 ms | bf16 native ms | bf16 copies ms | f32 / native | copies / native |\n"
                "|---|---:|---:|---:|---:|---:|\n");
    run_pool(64, 256, rounds);
  }
  return 0;
}

// Front of the fft kernel family: geometry, dtype and shape checks, then dispatch by device.
#include "shardtensor/exec/fft.hpp"

#include <algorithm>

#include "exec/fft_kernels.hpp"
#include "exec/front_util.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/memory.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

SHARD_KEEP_CPU_TABLE(fft);

std::vector<index_t> FftGeometry::complex_shape() const {
  std::vector<index_t> s = shape;
  if (kind != FftKind::c2c && !dims.empty()) {
    auto& n = s[static_cast<std::size_t>(dims.back())];
    n = n / 2 + 1;
  }
  return s;
}

namespace {

const char* kind_name(FftKind k) { return k == FftKind::c2c ? "c2c" : k == FftKind::r2c ? "r2c" : "c2r"; }

DType complex_of(DType real) { return real == DType::f32 ? DType::c64 : DType::c128; }

void check_shape(const char* op, const char* what, const Block& b, const std::vector<index_t>& want) {
  SHARD_CHECK(b.rank == static_cast<int>(want.size()) && b.shape_vec() == want, op, "{} has shape {}, expected {}",
              what, b.shape_vec(), want);
  SHARD_CHECK(b.is_contiguous(), op, "{} must be contiguous (shape {}, strides {})", what, b.shape_vec(),
              b.strides_vec());
}

}  // namespace

void fft(const FftGeometry& g, const Block& in, const Block& out, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "fft", "", &ctx);
  const char* op = "fft";
  const int R = static_cast<int>(g.shape.size());
  SHARD_CHECK(R >= 1 && R <= kMaxBlockRank, op, "rank {} outside 1..{}", R, kMaxBlockRank);
  SHARD_CHECK(!g.dims.empty(), op, "no dims to transform");
  for (std::size_t i = 0; i < g.dims.size(); ++i) {
    SHARD_CHECK(g.dims[i] >= 0 && g.dims[i] < R, op, "dim {} outside a rank-{} block", g.dims[i], R);
    SHARD_CHECK(i == 0 || g.dims[i] > g.dims[i - 1], op, "dims {} must be ascending and distinct", g.dims);
  }
  for (index_t e : g.shape) SHARD_CHECK(e >= 0, op, "negative extent in shape {}", g.shape);
  SHARD_CHECK(g.kind == FftKind::c2c || !g.inverse, op, "{}: the direction is fixed ({} is {})", kind_name(g.kind),
              kind_name(g.kind), g.kind == FftKind::r2c ? "forward" : "inverse");
  // The precision comes from the real side (r2c input, c2r output) or the complex dtype (c2c).
  const Block& real_side = g.kind == FftKind::r2c ? in : out;
  DType real = DType::f32;
  if (g.kind == FftKind::c2c) {
    SHARD_CHECK(in.dtype == DType::c64 || in.dtype == DType::c128, op, "c2c needs complex input (c64 or c128), got {}",
                in.dtype);
    real = in.dtype == DType::c64 ? DType::f32 : DType::f64;
    SHARD_CHECK(out.dtype == in.dtype, op, "c2c output dtype {} differs from the input's {}", out.dtype, in.dtype);
  } else {
    SHARD_CHECK(real_side.dtype == DType::f32 || real_side.dtype == DType::f64, op,
                "{} needs a real {} (f32 or f64), got {}", kind_name(g.kind),
                g.kind == FftKind::r2c ? "input" : "output", real_side.dtype);
    real = real_side.dtype;
    const Block& cplx = g.kind == FftKind::r2c ? out : in;
    SHARD_CHECK(cplx.dtype == complex_of(real), op, "{} pairs {} with {}, got {}", kind_name(g.kind), real,
                complex_of(real), cplx.dtype);
    SHARD_CHECK(in.data == nullptr || in.data != out.data, op, "{} cannot run in place", kind_name(g.kind));
  }
  SHARD_CHECK(in.device == ctx.device() && out.device == ctx.device(), op,
              "operands on different devices: input on {}, output on {}, execution context on {}", in.device,
              out.device, ctx.device());
  const auto cs = g.complex_shape();
  check_shape(op, "input", in, g.kind == FftKind::c2r ? cs : g.shape);
  check_shape(op, "output", out, g.kind == FftKind::r2c ? cs : g.shape);
  const auto& t = detail::front_table<FftKernels>(op, real, ctx.device(), ctx);
  index_t n = 1;
  for (index_t e : g.shape) n *= e;
  if (n == 0) return;
  shard::detail::bump_version(out.owner);
  t.fft(real, g, in.data, out.data, ctx);
}

}  // namespace shard::exec

#pragma once
// How the CUDA fft table (src/cuda/fft_cuda.cpp) splits a geometry into cuFFT executions. Plain
// C++ (no CUDA headers), so the CPU test tests/exec/test_fft_passes.cpp can run the same passes
// through FFTW's identical "advanced layout" and check them against the CPU table without a GPU.
//
// cuFFT's advanced layout (cufftMakePlanMany64) transforms rank 1..3 dims with one element stride
// and one batch stride: element (b, x) of a batch sits at b * dist + row_major(x, embed) * stride.
// That covers one run of consecutive transformed dims [a..b] of a row-major array viewed as
// [outer, dims a..b, inner] with stride = inner, but only one of outer / inner as the batch. So:
//  - the transformed dims are cut into runs of consecutive dims, and each run into chunks of at
//    most 3 dims (cuFFT's largest rank), taken from the run's end (so the chunk holding
//    dims.back(), the halved dim of r2c / c2r, is never a 1-dim leftover when avoidable);
//  - every chunk is one pass (separable transforms commute): c2c passes in any order; r2c does
//    its r2c pass (the chunk of dims.back()) first, then c2c passes on its complex output in
//    place; c2r does its c2c inverse passes first, in place on the scratch copy of its input,
//    then the c2r pass from the scratch into the output;
//  - a pass batches over the larger of outer / inner and loops over the smaller one (pointers
//    advanced by in_step / out_step elements per execution). Trailing chunks (inner = 1) and
//    leading ones (outer = 1) are one execution; a middle chunk of a [P, n, Q] array is min(P, Q)
//    executions of a max(P, Q) batch. The alternative (a transpose kernel moving the dims to the
//    end, then one execution) costs two extra passes over memory; the loop is kept until a
//    profile says otherwise.
#include <cstdint>
#include <vector>

#include "shardtensor/exec/fft.hpp"

namespace shard::exec::fft_passes {

enum class PassKind : unsigned char { c2c, r2c, c2r };
/// Which buffer a pass reads or writes: the caller's input, its output, or the c2r scratch copy.
enum class Buf : unsigned char { in, out, scratch };

/// One cuFFT plan (the fields of cufftMakePlanMany64) and how often it runs.
struct Pass {
  PassKind kind = PassKind::c2c;
  int rank = 1;                  ///< 1..3
  long long n[3] = {1, 1, 1};    ///< logical lengths (real-space extents)
  long long inembed[3] = {1, 1, 1}, onembed[3] = {1, 1, 1};
  long long istride = 1, idist = 1, ostride = 1, odist = 1, batch = 1;
  long long loops = 1;           ///< executions of the plan
  long long in_step = 0, out_step = 0;  ///< element offsets (input / output element type) per execution
  Buf src = Buf::in, dst = Buf::out;
};

inline long long prod(const std::vector<index_t>& s, std::size_t lo, std::size_t hi) {
  long long p = 1;
  for (std::size_t i = lo; i < hi; ++i) p *= static_cast<long long>(s[i]);
  return p;
}

/// The pass of chunk [a..b] (dims a..b consecutive) between arrays of shapes `is` and `os`,
/// which differ at most in dim b.
inline Pass make_pass(PassKind kind, const std::vector<index_t>& logical, const std::vector<index_t>& is,
                      const std::vector<index_t>& os, std::size_t a, std::size_t b, Buf src, Buf dst) {
  Pass p;
  p.kind = kind;
  p.rank = static_cast<int>(b - a + 1);
  for (int i = 0; i < p.rank; ++i) {
    const std::size_t d = a + static_cast<std::size_t>(i);
    p.n[i] = static_cast<long long>(logical[d]);
    p.inembed[i] = static_cast<long long>(is[d]);
    p.onembed[i] = static_cast<long long>(os[d]);
  }
  const long long outer = prod(is, 0, a), inner = prod(is, b + 1, is.size());
  const long long ni = prod(is, a, b + 1), no = prod(os, a, b + 1);
  p.istride = p.ostride = inner;
  if (outer <= inner) {  // batch over inner, loop over outer
    p.batch = inner;
    p.idist = p.odist = 1;
    p.loops = outer;
    p.in_step = ni * inner;
    p.out_step = no * inner;
  } else {  // batch over outer, loop over inner
    p.batch = outer;
    p.idist = ni * inner;
    p.odist = no * inner;
    p.loops = inner;
    p.in_step = p.out_step = 1;
  }
  p.src = src;
  p.dst = dst;
  return p;
}

/// The passes of `g` (validated by the front: dims ascending, distinct, in range), in order.
inline std::vector<Pass> schedule(const FftGeometry& g) {
  // Chunks [a, b] of consecutive dims, at most 3 long, cut from each run's end.
  std::vector<std::pair<std::size_t, std::size_t>> chunks;
  for (std::size_t i = 0; i < g.dims.size();) {
    std::size_t j = i;
    while (j + 1 < g.dims.size() && g.dims[j + 1] == g.dims[j] + 1) ++j;
    const auto a = static_cast<std::size_t>(g.dims[i]), b = static_cast<std::size_t>(g.dims[j]);
    std::vector<std::pair<std::size_t, std::size_t>> run;
    for (std::size_t hi = b + 1; hi > a;) {
      const std::size_t lo = hi - a > 3 ? hi - 3 : a;
      run.insert(run.begin(), {lo, hi - 1});
      hi = lo;
    }
    chunks.insert(chunks.end(), run.begin(), run.end());
    i = j + 1;
  }
  const auto cs = g.complex_shape();
  std::vector<Pass> passes;
  if (g.kind == FftKind::c2c) {
    for (const auto& [a, b] : chunks)
      passes.push_back(make_pass(PassKind::c2c, g.shape, cs, cs, a, b, passes.empty() ? Buf::in : Buf::out, Buf::out));
    return passes;
  }
  const auto last = chunks.back();
  chunks.pop_back();
  if (g.kind == FftKind::r2c) {
    passes.push_back(make_pass(PassKind::r2c, g.shape, g.shape, cs, last.first, last.second, Buf::in, Buf::out));
    for (const auto& [a, b] : chunks) passes.push_back(make_pass(PassKind::c2c, g.shape, cs, cs, a, b, Buf::out, Buf::out));
    return passes;
  }
  for (const auto& [a, b] : chunks)
    passes.push_back(make_pass(PassKind::c2c, g.shape, cs, cs, a, b, Buf::scratch, Buf::scratch));
  passes.push_back(make_pass(PassKind::c2r, g.shape, cs, g.shape, last.first, last.second, Buf::scratch, Buf::out));
  return passes;
}

}  // namespace shard::exec::fft_passes

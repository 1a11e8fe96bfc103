// CUDA implementation of the fft kernel family (exec/fft.hpp) over cuFFT: c2c forward / inverse,
// r2c and c2r, fp32 and fp64, over any subset of dims, batched over the others. Same semantics
// as the CPU table (src/exec/fft_cpu.cpp, FFTW): unnormalised, output times g.scale, the input
// never modified. Registered for DeviceKind::cuda when shardtensor::cuda is linked.
//
//  - Layout: a geometry becomes one or more cuFFT executions (src/cuda/fft_passes.hpp): each run
//    of consecutive transformed dims, in chunks of at most 3 dims, is one plan of cuFFT's advanced
//    layout (cufftMakePlanMany64, 64-bit sizes) batched over the larger of the dims before and
//    after it and looped over the smaller. A trailing or leading set of dims is one execution.
//  - Plans: created once per (device, precision, type, layout) with auto-allocation off, cached
//    for the process, never destroyed (as FFTW's in fft_cpu.cpp). A plan is shared by every
//    context of its device, so each execution binds it to the context's stream (cufftSetStream)
//    and to a work area taken from the context's workspace (cufftSetWorkArea), under the plan's
//    mutex (cuFFT plans are not safe to use from two threads at once); the queued kernels keep
//    the pointers they were launched with, so the next caller may rebind the plan at once. (The
//    same scheme as PyTorch's cuFFT plan cache.)
//  - c2r: cuFFT's out-of-place c2r overwrites its input, so the input is first copied to scratch
//    (after the work area, in the same workspace) and the c2c inverse passes and the c2r run on
//    the copy. For one transformed dim the copy's zero (and, for even n, Nyquist) frequencies get
//    a zero imaginary part first: FFTW's 1-D c2r ignores it, cuFFT's would not. For several dims
//    the input must be Hermitian-consistent (what r2c produces), as for FFTW.
//  - Scale: kernels/fft.cu (src/kernels_api/fft.hpp), in place on the output, when g.scale != 1.
// Every cuFFT / CUDA error is a shard::Error naming the call.
#include <cuda_runtime.h>
#include <cufft.h>

#include <algorithm>
#include <complex>
#include <map>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/family_util.hpp"
#include "cuda/fft_passes.hpp"
#include "exec/fft_kernels.hpp"
#include "kernels_api/fft.hpp"

namespace shard::exec {
namespace {

using fft_passes::Buf;
using fft_passes::Pass;
using fft_passes::PassKind;

constexpr const char* kOp = "fft (cuda)";

const char* cufft_result_name(cufftResult r) {
  switch (r) {
    case CUFFT_SUCCESS: return "CUFFT_SUCCESS";
    case CUFFT_INVALID_PLAN: return "CUFFT_INVALID_PLAN";
    case CUFFT_ALLOC_FAILED: return "CUFFT_ALLOC_FAILED";
    case CUFFT_INVALID_TYPE: return "CUFFT_INVALID_TYPE";
    case CUFFT_INVALID_VALUE: return "CUFFT_INVALID_VALUE";
    case CUFFT_INTERNAL_ERROR: return "CUFFT_INTERNAL_ERROR";
    case CUFFT_EXEC_FAILED: return "CUFFT_EXEC_FAILED";
    case CUFFT_SETUP_FAILED: return "CUFFT_SETUP_FAILED";
    case CUFFT_INVALID_SIZE: return "CUFFT_INVALID_SIZE";
    case CUFFT_UNALIGNED_DATA: return "CUFFT_UNALIGNED_DATA";
    case CUFFT_INVALID_DEVICE: return "CUFFT_INVALID_DEVICE";
    case CUFFT_NO_WORKSPACE: return "CUFFT_NO_WORKSPACE";
    case CUFFT_NOT_IMPLEMENTED: return "CUFFT_NOT_IMPLEMENTED";
    case CUFFT_NOT_SUPPORTED: return "CUFFT_NOT_SUPPORTED";
    default: return "unknown cufftResult";
  }
}

/// Throws shard::Error naming the cuFFT call unless r == CUFFT_SUCCESS.
void check_fft(cufftResult r, const char* call) {
  if (r != CUFFT_SUCCESS) SHARD_FAIL(kOp, "{} failed: {} ({})", call, cufft_result_name(r), static_cast<int>(r));
}
/// Throws shard::Error naming the CUDA call unless e == cudaSuccess.
void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess) SHARD_FAIL(kOp, "{} failed: {} ({})", call, cudaGetErrorString(e), static_cast<int>(e));
}

cufftType type_of(PassKind k, bool f64) {
  switch (k) {
    case PassKind::c2c: return f64 ? CUFFT_Z2Z : CUFFT_C2C;
    case PassKind::r2c: return f64 ? CUFFT_D2Z : CUFFT_R2C;
    default: return f64 ? CUFFT_Z2D : CUFFT_C2R;
  }
}

/// Whether plans allocate their own work areas (cuFFT auto-allocation; the default) or run in the
/// context's workspace (SHARDTENSOR_CUFFT_AUTOALLOC=0; read once). Seen on an H200 with CUDA 13.0
/// (2026-11-25): an in-place strided Z2Z (n 6, stride 20, dist 1, batch 20) whose plan reported a
/// 0-byte work area failed with CUFFT_EXEC_FAILED when handed a caller's work area, and ran with
/// auto-allocation; the whole fft test file passes with auto-allocation. Cost: each cached plan
/// holds its own work area (most plans need none).
bool auto_alloc() {
  static const bool on = [] {
    const char* e = std::getenv("SHARDTENSOR_CUFFT_AUTOALLOC");
    return !(e && e[0] == '0');
  }();
  return on;
}

/// A cached plan: the handle, its work-area size, and the lock held while it is bound and run.
struct Plan {
  cufftHandle h = 0;
  std::size_t work = 0;
  std::mutex mu;
};

/// Process-wide plans keyed by (device, cufftType, rank, n, inembed, onembed, strides, dists,
/// batch). Never destroyed: plans outlive static teardown (as the CPU table's FFTW plans).
class PlanCache {
 public:
  Plan& get(int dev, cufftType type, const Pass& p) {
    std::vector<long long> key{dev, static_cast<long long>(type), p.rank, p.istride, p.idist, p.ostride, p.odist,
                               p.batch};
    for (int i = 0; i < p.rank; ++i) {
      key.push_back(p.n[i]);
      key.push_back(p.inembed[i]);
      key.push_back(p.onembed[i]);
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    auto plan = std::make_unique<Plan>();
    check_fft(cufftCreate(&plan->h), "cufftCreate");
    // The work area: the plan's own (default), or the context's workspace at each execution
    // (SHARDTENSOR_CUFFT_AUTOALLOC=0), see auto_alloc().
    cufftResult r = auto_alloc() ? CUFFT_SUCCESS : cufftSetAutoAllocation(plan->h, 0);
    if (r == CUFFT_SUCCESS) {
      long long n[3], ie[3], oe[3];
      std::copy(p.n, p.n + 3, n);
      std::copy(p.inembed, p.inembed + 3, ie);
      std::copy(p.onembed, p.onembed + 3, oe);
      r = cufftMakePlanMany64(plan->h, p.rank, n, ie, p.istride, p.idist, oe, p.ostride, p.odist, type, p.batch,
                              &plan->work);
      if (r != CUFFT_SUCCESS) {
        cufftDestroy(plan->h);
        SHARD_FAIL(kOp, "cufftMakePlanMany64 failed: {} ({}) (rank {}, n [{}, {}, {}], stride {}, batch {})",
                   cufft_result_name(r), static_cast<int>(r), p.rank, p.n[0], p.n[1], p.n[2], p.istride, p.batch);
      }
    } else {
      cufftDestroy(plan->h);
      check_fft(r, "cufftSetAutoAllocation");
    }
    Plan& ref = *plan;
    plans_.emplace(std::move(key), std::move(plan));
    return ref;
  }

 private:
  std::mutex mu_;
  std::map<std::vector<long long>, std::unique_ptr<Plan>> plans_;
};

PlanCache& cache() {
  static PlanCache* c = new PlanCache();  // never destroyed (see above)
  return *c;
}

index_t numel_of(const std::vector<index_t>& s) {
  index_t n = 1;
  for (index_t e : s) n *= e;
  return n;
}

/// Elements (of the real side) one execution of an r2c / c2r pass spans from its first: cuFFT's
/// advanced layout, (batch - 1) * dist + (the last logical index) * stride, plus one.
std::size_t real_span(const Pass& p) {
  const bool r2c = p.kind == PassKind::r2c;
  const long long* emb = r2c ? p.inembed : p.onembed;
  const long long stride = r2c ? p.istride : p.ostride, dist = r2c ? p.idist : p.odist;
  long long last = 0;
  for (int k = 0; k < p.rank; ++k) {
    long long pitch = 1;
    for (int m = k + 1; m < p.rank; ++m) pitch *= emb[m];
    last += (p.n[k] - 1) * pitch;
  }
  return static_cast<std::size_t>((p.batch - 1) * dist + last * stride + 1);
}
/// Bytes of the realignment buffer pass `p` may need (0 for c2c).
std::size_t realign_bytes(const Pass& p, bool f64) {
  if (p.kind == PassKind::c2c) return 0;
  return real_span(p) * (f64 ? sizeof(double) : sizeof(float));
}

/// Runs pass `p` with plan `plan` from `src` to `dst` (element types per p.kind and precision).
/// cuFFT refuses (CUFFT_INVALID_VALUE at execution) an R2C input or C2R output pointer that is not
/// aligned to the COMPLEX element size (seen on an H200 with CUDA 13.0, 2026-11-25: a D2Z/R2C
/// input offset by one real fails, by two runs). A pass looping over an inner dim steps the real
/// pointer by one element, so such an execution goes through `realign` (256-byte aligned, of
/// realign_bytes(p)): r2c copies the span it reads there first; c2r copies the span there, lets
/// cuFFT write its elements into it, and copies the span back (the other executions' elements in
/// the span go back unchanged; executions are ordered on the stream).
void execute(const Pass& p, Plan& plan, bool f64, int sign, char* src, char* dst, void* work, char* realign,
             cudaStream_t s) {
  const std::size_t real = f64 ? sizeof(double) : sizeof(float), cplx = 2 * real;
  const std::size_t in_elem = p.kind == PassKind::r2c ? real : cplx;
  const std::size_t out_elem = p.kind == PassKind::c2r ? real : cplx;
  const std::size_t span_bytes = realign_bytes(p, f64);
  auto misaligned = [cplx](const char* q) { return reinterpret_cast<std::uintptr_t>(q) % cplx != 0; };
  std::lock_guard<std::mutex> lock(plan.mu);
  check_fft(cufftSetStream(plan.h, s), "cufftSetStream");
  if (!auto_alloc()) check_fft(cufftSetWorkArea(plan.h, work), "cufftSetWorkArea");
  for (long long l = 0; l < p.loops; ++l) {
    // On a failed execution, the pass and pointers in the message (a GPU-only failure is otherwise
    // hard to reproduce away from the machine).
    auto exec_check = [&](cufftResult r, const char* call, const char* ip, const char* op) {
      if (r == CUFFT_SUCCESS) return;
      SHARD_FAIL(kOp,
                 "{} failed: {} ({}); pass: kind {}, rank {}, n [{}, {}, {}], inembed [{}, {}, {}], onembed [{}, {}, "
                 "{}], istride {}, idist {}, ostride {}, odist {}, batch {}, execution {} of {}, in%256 {}, out%256 "
                 "{}, in-place {}, plan work {} B, work area %256 {}",
                 call, cufft_result_name(r), static_cast<int>(r), static_cast<int>(p.kind), p.rank, p.n[0], p.n[1],
                 p.n[2], p.inembed[0], p.inembed[1], p.inembed[2], p.onembed[0], p.onembed[1], p.onembed[2], p.istride,
                 p.idist, p.ostride, p.odist, p.batch, l + 1, p.loops, reinterpret_cast<std::uintptr_t>(ip) % 256,
                 reinterpret_cast<std::uintptr_t>(op) % 256, ip == op, plan.work,
                 reinterpret_cast<std::uintptr_t>(work) % 256);
    };
    char* i = src + static_cast<std::size_t>(l * p.in_step) * in_elem;
    char* o = dst + static_cast<std::size_t>(l * p.out_step) * out_elem;
    char* o_user = nullptr;  // c2r through `realign`: copy back here afterwards
    if (p.kind == PassKind::r2c && misaligned(i)) {
      check_cuda(cudaMemcpyAsync(realign, i, span_bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
      i = realign;
    } else if (p.kind == PassKind::c2r && misaligned(o)) {
      check_cuda(cudaMemcpyAsync(realign, o, span_bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
      o_user = o;
      o = realign;
    }
    if (f64) {
      switch (p.kind) {
        case PassKind::c2c:
          exec_check(cufftExecZ2Z(plan.h, reinterpret_cast<cufftDoubleComplex*>(i),
                                 reinterpret_cast<cufftDoubleComplex*>(o), sign), "cufftExecZ2Z", i, o);
          break;
        case PassKind::r2c:
          exec_check(cufftExecD2Z(plan.h, reinterpret_cast<cufftDoubleReal*>(i), reinterpret_cast<cufftDoubleComplex*>(o)), "cufftExecD2Z", i, o);
          break;
        case PassKind::c2r:
          exec_check(cufftExecZ2D(plan.h, reinterpret_cast<cufftDoubleComplex*>(i), reinterpret_cast<cufftDoubleReal*>(o)), "cufftExecZ2D", i, o);
          break;
      }
    } else {
      switch (p.kind) {
        case PassKind::c2c:
          exec_check(cufftExecC2C(plan.h, reinterpret_cast<cufftComplex*>(i), reinterpret_cast<cufftComplex*>(o), sign), "cufftExecC2C", i, o);
          break;
        case PassKind::r2c:
          exec_check(cufftExecR2C(plan.h, reinterpret_cast<cufftReal*>(i), reinterpret_cast<cufftComplex*>(o)), "cufftExecR2C", i, o);
          break;
        case PassKind::c2r:
          exec_check(cufftExecC2R(plan.h, reinterpret_cast<cufftComplex*>(i), reinterpret_cast<cufftReal*>(o)), "cufftExecC2R", i, o);
          break;
      }
    }
    if (o_user)
      check_cuda(cudaMemcpyAsync(o_user, realign, span_bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  }
}

struct CudaFft final : FftKernels {
  void fft(DType real, const FftGeometry& g, const void* in, void* out, ExecContext& ctx) const override {
    cuda_glue::DeviceScope scope(ctx, kOp);
    const auto s = static_cast<cudaStream_t>(ctx.stream().handle);
    const int dev = ctx.device().index;
    const bool f64 = real == DType::f64;
    const std::vector<Pass> passes = fft_passes::schedule(g);
    std::vector<Plan*> plans;
    std::size_t work = 0;
    for (const Pass& p : passes) {
      plans.push_back(&cache().get(dev, type_of(p.kind, f64), p));
      if (!auto_alloc()) work = std::max(work, plans.back()->work);  // auto-allocated plans own theirs
    }
    // One workspace: [cuFFT work area | c2r scratch copy of the input], 256-byte aligned.
    const std::size_t cplx = f64 ? sizeof(std::complex<double>) : sizeof(std::complex<float>);
    const std::size_t scratch_bytes =
        g.kind == FftKind::c2r ? static_cast<std::size_t>(numel_of(g.complex_shape())) * cplx : 0;
    const std::size_t work_bytes = (work + 255) / 256 * 256;
    const std::size_t scratch_pad = (scratch_bytes + 255) / 256 * 256;
    // The realignment buffer only where some execution's real pointer would be misaligned: an odd
    // real step between executions, or a real base pointer off the complex alignment (a view).
    std::size_t realign = 0;
    for (const Pass& p : passes) {
      if (p.kind == PassKind::c2c) continue;
      const bool r2c = p.kind == PassKind::r2c;
      const long long step = r2c ? p.in_step : p.out_step;
      const void* base = r2c ? in : out;  // r2c reads the input; c2r writes the output
      const bool odd_base = reinterpret_cast<std::uintptr_t>(base) % cplx != 0;
      if (odd_base || (p.loops > 1 && step % 2 != 0)) realign = std::max(realign, realign_bytes(p, f64));
    }
    char* ws = static_cast<char*>(ctx.workspace(std::max<std::size_t>(work_bytes + scratch_pad + realign, 1)));
    char* scratch = ws + work_bytes;
    char* realign_buf = scratch + scratch_pad;
    if (g.kind == FftKind::c2r) {
      check_cuda(cudaMemcpyAsync(scratch, in, scratch_bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
      if (g.dims.size() == 1) {
        const auto d = static_cast<std::size_t>(g.dims[0]);
        const auto cs = g.complex_shape();
        const auto outer = static_cast<kernels::fft_idx>(fft_passes::prod(cs, 0, d));
        const auto inner = static_cast<kernels::fft_idx>(fft_passes::prod(cs, d + 1, cs.size()));
        check_cuda(static_cast<cudaError_t>(kernels::fft_c2r_real_edges(f64 ? 1 : 0, outer, cs[d], inner,
                                                                          g.shape[d] % 2 == 0 ? 1 : 0, scratch, s)),
                   "fft_c2r_real_edges");
      }
    }
    const int sign = g.kind == FftKind::c2c ? (g.inverse ? CUFFT_INVERSE : CUFFT_FORWARD)
                                            : (g.kind == FftKind::r2c ? CUFFT_FORWARD : CUFFT_INVERSE);
    auto buf = [&](Buf b) -> char* {
      return b == Buf::in ? static_cast<char*>(const_cast<void*>(in)) : b == Buf::out ? static_cast<char*>(out) : scratch;
    };
    for (std::size_t i = 0; i < passes.size(); ++i)
      execute(passes[i], *plans[i], f64, sign, buf(passes[i].src), buf(passes[i].dst), ws, realign_buf, s);
    if (g.scale != 1.0) {
      const index_t n = g.kind == FftKind::c2r ? numel_of(g.shape) : 2 * numel_of(g.complex_shape());
      check_cuda(static_cast<cudaError_t>(kernels::fft_scale(f64 ? 1 : 0, n, g.scale, out, s)), "fft_scale");
    }
  }
};

const CudaFft g_cuda_fft;

}  // namespace

/// Referenced by the shardtensor::cuda registration anchor so that the linker keeps this file.
extern const int fft_cuda_anchor;
const int fft_cuda_anchor = (register_family(DeviceKind::cuda, KernelFamily::fft, &g_cuda_fft), 1);

}  // namespace shard::exec

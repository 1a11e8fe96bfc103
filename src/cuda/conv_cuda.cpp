// CUDA implementation of the conv kernel family (exec/conv_kernels.hpp) on cuDNN 9's legacy
// convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter with Nd descriptors;
// 1-D runs as 2-D with a unit dim). Per call:
//  * padding: cuDNN pads symmetrically. A dim whose output extent is what cuDNN computes with
//    pad_lo on both sides runs as is (the usual case, including the distributed conv's
//    halo-extended blocks, which need no padding); any other dim gets a zero-padded device copy
//    of the input of exactly the extent the outputs read (kernels/conv.cu shift_copy), and the
//    data gradient is computed on that extent and cropped back;
//  * algorithm: cudnnFind*AlgorithmEx once per problem key (shapes, dtype, math, determinism,
//    device), cached; only CUDNN_DETERMINISTIC algorithms under ExecSettings::deterministic. As
//    PyTorch's cudnn.benchmark: the candidates are timed with the largest workspace any of them
//    asks for, within what the caching allocator can actually give (free device memory + its
//    cached blocks, less a margin; halved while the allocation fails) and the user cap
//    SHARDTENSOR_CUDNN_WORKSPACE_MIB (unset: none), and the fastest that fits wins
//    (conv_algo_select.hpp, tested on the CPU);
//  * math: CUDNN_FMA_MATH for fp32 unless ExecSettings::allow_tf32 (no TF32), default for fp64;
//  * workspace: the padded copies in ExecContext::workspace; the algorithm's workspace from the
//    caching allocator for the call alone (given back on the call's stream right after it is
//    queued: the stream-ordered cache hands it to later work on that stream only), so it does not
//    stay allocated between calls and the trial workspace of a search is back in the cache before
//    the next one;
//  * one cuDNN handle per thread and device, set to the context's stream.
// Bias add and bias gradient are kernels/conv.cu kernels (fixed-order reduction in double).
// bf16 / f16 (native_storage: every pass): the descriptors carry the storage type and an f32 compute type, so
// cuDNN reads and writes bf16 / f16 and accumulates in f32 (tensor cores); the helper kernels are
// templated on the storage type. No f32 working copies.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cuda/conv_algo_select.hpp"
#include "cuda/family_util.hpp"
#include "exec/conv_kernels.hpp"
#include "kernels_api/conv.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/runtime/memory.hpp"

// The legacy convolution API is deprecated in cuDNN 9 but complete (Nd, groups, dilation,
// Find/Get algorithm search); the graph API would add nothing these ops need.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace shard::exec {
namespace {

using cuda_glue::storage_code;

using E3 = std::array<index_t, 3>;

void check_cudnn(cudnnStatus_t s, const char* op, const char* what) {
  SHARD_CHECK(s == CUDNN_STATUS_SUCCESS, op, "cuDNN {} failed: {}", what, cudnnGetErrorString(s));
}
void check_cuda(int code, const char* op, const char* what) {
  SHARD_CHECK(code == 0, op, "CUDA {} failed: {}", what, cudaGetErrorString(static_cast<cudaError_t>(code)));
}

/// One cuDNN handle per (thread, device), bound to the stream of each call.
cudnnHandle_t handle_for(const ExecContext& ctx, const char* op) {
  struct Handles {
    std::array<cudnnHandle_t, 16> h{};
    ~Handles() {
      for (auto x : h)
        if (x) cudnnDestroy(x);
    }
  };
  thread_local Handles handles;
  const int dev = ctx.device().index;
  SHARD_CHECK(dev >= 0 && dev < 16, op, "device index {} out of range", dev);
  check_cuda(cudaSetDevice(dev), op, "cudaSetDevice");
  auto& h = handles.h[static_cast<std::size_t>(dev)];
  if (!h) check_cudnn(cudnnCreate(&h), op, "cudnnCreate");
  check_cudnn(cudnnSetStream(h, static_cast<cudaStream_t>(ctx.stream().handle)), op, "cudnnSetStream");
  return h;
}

/// RAII cuDNN descriptors.
struct TensorDesc {
  cudnnTensorDescriptor_t d{};
  TensorDesc() { cudnnCreateTensorDescriptor(&d); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
};
struct FilterDesc {
  cudnnFilterDescriptor_t d{};
  FilterDesc() { cudnnCreateFilterDescriptor(&d); }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t d{};
  ConvDesc() { cudnnCreateConvolutionDescriptor(&d); }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
};

int to_int(index_t v, const char* op) {
  SHARD_CHECK(v >= 0 && v <= INT_MAX, op, "extent {} exceeds cuDNN's int range", v);
  return static_cast<int>(v);
}

index_t vol(const E3& e) { return e[0] * e[1] * e[2]; }

/// How a geometry maps onto cuDNN: per dim the input extent given to cuDNN, its symmetric pad and
/// the shift of a padded copy (0 and ext == in when the dim needs no copy).
struct Mapping {
  int nd = 2;             ///< cuDNN spatial dims (>= 2)
  bool copy = false;      ///< the input (or data gradient) goes through a padded copy
  E3 ext{1, 1, 1};        ///< input extent cuDNN sees
  E3 pad{0, 0, 0};        ///< symmetric pad cuDNN applies
  E3 offset{0, 0, 0};     ///< shift_copy offset of the padded copy (-pad_lo), 0 for dims as is
};

Mapping map_geometry(const ConvGeometry& g) {
  Mapping m;
  m.nd = std::max(2, g.spatial_dims);
  for (int d = 0; d < 3; ++d) {
    const index_t span = g.dilation[d] * (g.kernel[d] - 1) + 1;
    const index_t sym = g.in[d] + 2 * g.pad_lo[d] - span;  // cuDNN's out = sym / stride + 1 (sym >= 0)
    if (sym >= 0 && sym / g.stride[d] + 1 == g.out[d]) {
      m.ext[d] = g.in[d];
      m.pad[d] = g.pad_lo[d];
    } else {
      m.copy = true;
      m.ext[d] = (g.out[d] - 1) * g.stride[d] + span;  // exactly what the outputs read
      m.offset[d] = -g.pad_lo[d];
    }
  }
  return m;
}

/// The storage type of x, w, y: bf16 / f16 operands are read and written by cuDNN as they are.
cudnnDataType_t data_type(DType dt) {
  switch (dt) {
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f16: return CUDNN_DATA_HALF;
    default: return CUDNN_DATA_FLOAT;
  }
}
/// The convolution's compute (accumulation) type: f32 for f32, bf16 and f16 (never the pseudo-half
/// configurations), f64 for f64.
cudnnDataType_t compute_type(DType dt) { return dt == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT; }

/// Descriptors of one problem (x of extent m.ext, y of g.out, w, conv).
struct Descs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

void set_tensor(cudnnTensorDescriptor_t d, cudnnDataType_t t, int nd, index_t n, index_t c, const E3& e,
                const char* op) {
  std::array<int, 5> dims{}, strides{};
  dims[0] = to_int(n, op);
  dims[1] = to_int(c, op);
  for (int i = 0; i < nd; ++i) dims[2 + i] = to_int(e[3 - nd + i], op);
  long long acc = 1;
  for (int i = nd + 1; i >= 0; --i) {
    strides[i] = static_cast<int>(acc);
    acc *= std::max(dims[i], 1);
  }
  SHARD_CHECK(acc <= INT_MAX, op,
              "tensor [{}, {}, {}] has {} elements, more than cuDNN's 32-bit strides allow: split the batch or the "
              "domain",
              n, c, e, acc);
  check_cudnn(cudnnSetTensorNdDescriptor(d, t, nd + 2, dims.data(), strides.data()), op, "cudnnSetTensorNdDescriptor");
}

void make_descs(Descs& ds, DType dt, const ConvGeometry& g, const Mapping& m, const ExecSettings& s, const char* op) {
  const cudnnDataType_t t = data_type(dt);
  set_tensor(ds.x.d, t, m.nd, g.batch, g.in_channels, m.ext, op);
  set_tensor(ds.y.d, t, m.nd, g.batch, g.out_channels, g.out, op);
  std::array<int, 5> wd{};
  wd[0] = to_int(g.out_channels, op);
  wd[1] = to_int(g.in_channels / g.groups, op);
  std::array<int, 3> pad{}, stride{}, dil{};
  for (int i = 0; i < m.nd; ++i) {
    const int e = 3 - m.nd + i;
    wd[2 + i] = to_int(g.kernel[e], op);
    pad[i] = to_int(m.pad[e], op);
    stride[i] = to_int(g.stride[e], op);
    dil[i] = to_int(g.dilation[e], op);
  }
  check_cudnn(cudnnSetFilterNdDescriptor(ds.w.d, t, CUDNN_TENSOR_NCHW, m.nd + 2, wd.data()), op,
              "cudnnSetFilterNdDescriptor");
  check_cudnn(cudnnSetConvolutionNdDescriptor(ds.conv.d, m.nd, pad.data(), stride.data(), dil.data(),
                                              CUDNN_CROSS_CORRELATION, compute_type(dt)),
              op, "cudnnSetConvolutionNdDescriptor");
  check_cudnn(cudnnSetConvolutionGroupCount(ds.conv.d, to_int(g.groups, op)), op, "cudnnSetConvolutionGroupCount");
  ds.math = (dt == DType::f32 && !s.allow_tf32) ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  check_cudnn(cudnnSetConvolutionMathType(ds.conv.d, ds.math), op, "cudnnSetConvolutionMathType");
}

enum class Pass : int { forward, backward_data, backward_filter };

/// The chosen algorithm of one problem.
struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::size_t workspace = 0;
};

/// Cache key: everything that changes cuDNN's choice.
std::vector<long long> problem_key(Pass pass, DType dt, const ConvGeometry& g, const Mapping& m, const ExecSettings& s,
                                   int device) {
  std::vector<long long> k{static_cast<int>(pass), static_cast<int>(dt), device, s.deterministic, s.allow_tf32,
                           m.nd, g.batch, g.in_channels, g.out_channels, g.groups};
  for (int d = 0; d < 3; ++d)
    for (index_t v : {m.ext[d], g.out[d], g.kernel[d], g.stride[d], g.dilation[d], m.pad[d]}) k.push_back(v);
  return k;
}

std::mutex g_cache_mutex;
std::map<std::vector<long long>, Choice> g_cache;

/// SHARDTENSOR_CUDNN_WORKSPACE_MIB: the largest workspace an algorithm may use (unset: no cap
/// but the memory the allocator can give). Read once; a malformed value fails the first conv.
std::optional<std::size_t> workspace_cap(const char* op) {
  static std::string error;
  static const std::optional<std::size_t> cap =
      conv_select::parse_workspace_cap_mib(std::getenv("SHARDTENSOR_CUDNN_WORKSPACE_MIB"), &error);
  SHARD_CHECK(error.empty(), op, "{}", error);
  return cap;
}

/// The trial workspace of one search: the largest workspace an algorithm of the pass needs, within
/// what the caching allocator can give (and the cap), halved while the allocation fails. `bytes` is what was obtained (0: none, then only
/// workspace-free algorithms are timed).
struct TrialWorkspace {
  std::shared_ptr<void> mem;
  std::size_t bytes = 0;
};
/// What each algorithm of `pass` reports it needs for this problem (algorithms that do not
/// support it are left out).
std::vector<std::size_t> workspace_sizes(Pass pass, const Descs& ds, cudnnHandle_t h) {
  std::vector<std::size_t> out;
  std::size_t sz = 0;
  if (pass == Pass::forward) {
    for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++a)
      if (cudnnGetConvolutionForwardWorkspaceSize(h, ds.x.d, ds.w.d, ds.conv.d, ds.y.d,
                                                  static_cast<cudnnConvolutionFwdAlgo_t>(a), &sz) == CUDNN_STATUS_SUCCESS)
        out.push_back(sz);
  } else if (pass == Pass::backward_data) {
    for (int a = 0; a < CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT; ++a)
      if (cudnnGetConvolutionBackwardDataWorkspaceSize(h, ds.w.d, ds.y.d, ds.conv.d, ds.x.d,
                                                       static_cast<cudnnConvolutionBwdDataAlgo_t>(a),
                                                       &sz) == CUDNN_STATUS_SUCCESS)
        out.push_back(sz);
  } else {
    for (int a = 0; a < CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT; ++a)
      if (cudnnGetConvolutionBackwardFilterWorkspaceSize(h, ds.x.d, ds.y.d, ds.conv.d, ds.w.d,
                                                         static_cast<cudnnConvolutionBwdFilterAlgo_t>(a),
                                                         &sz) == CUDNN_STATUS_SUCCESS)
        out.push_back(sz);
  }
  return out;
}

TrialWorkspace trial_workspace(Pass pass, const Descs& ds, cudnnHandle_t h, const ExecContext& ctx, const char* op) {
  std::size_t free_b = 0, total_b = 0;
  check_cuda(cudaMemGetInfo(&free_b, &total_b), op, "cudaMemGetInfo");
  const std::size_t limit =
      conv_select::search_limit(free_b, memory_stats(DeviceKind::cuda).cached_bytes, workspace_cap(op));
  std::size_t want = conv_select::trial_request(workspace_sizes(pass, ds, h), limit);
  while (want > 0) {
    try {
      return {allocate_bytes(want, ctx.device()), want};
    } catch (const Error&) {  // out of memory (fragmentation, another process): ask for less
      want = conv_select::next_request(want);
    }
  }
  return {};
}

/// The fastest candidate the search returned that succeeded, fits `limit` bytes of workspace and
/// is allowed by the settings.
template <class Perf>
Choice pick(const Perf* res, int n, std::size_t limit, const ExecSettings& s, const char* op) {
  std::vector<conv_select::Candidate> cands;
  cands.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    cands.push_back({static_cast<int>(res[i].algo), static_cast<int>(res[i].mathType), res[i].memory, res[i].time,
                     res[i].status == CUDNN_STATUS_SUCCESS, res[i].determinism == CUDNN_DETERMINISTIC});
  const auto best = conv_select::pick_fastest(cands, s.deterministic, limit);
  SHARD_CHECK(best.has_value(), op, "cuDNN found no usable algorithm{} within a workspace of {} bytes",
              s.deterministic ? " (deterministic ones only)" : "", limit);
  return {best->algo, static_cast<cudnnMathType_t>(best->math), best->workspace};
}

/// The cached choice for this problem, searched with cudnnFind*Ex on the real buffers first time
/// (the search writes the output, which the caller then overwrites).
Choice choose(Pass pass, DType dt, const ConvGeometry& g, const Mapping& m, Descs& ds, cudnnHandle_t h,
              const void* a, const void* b, void* out, const ExecContext& ctx, const char* op) {
  const auto key = problem_key(pass, dt, g, m, ctx.settings(), ctx.device().index);
  {
    std::lock_guard lock(g_cache_mutex);
    if (auto it = g_cache.find(key); it != g_cache.end()) return it->second;
  }
  TrialWorkspace trial = trial_workspace(pass, ds, h, ctx, op);
  const std::size_t limit = trial.bytes;
  constexpr int kMax = 16;
  int n = 0;
  Choice c;
  if (pass == Pass::forward) {
    cudnnConvolutionFwdAlgoPerf_t res[kMax];
    check_cudnn(cudnnFindConvolutionForwardAlgorithmEx(h, ds.x.d, a, ds.w.d, b, ds.conv.d, ds.y.d, out, kMax, &n, res,
                                                       trial.mem.get(), limit),
                op, "cudnnFindConvolutionForwardAlgorithmEx");
    c = pick(res, n, limit, ctx.settings(), op);
  } else if (pass == Pass::backward_data) {
    cudnnConvolutionBwdDataAlgoPerf_t res[kMax];
    check_cudnn(cudnnFindConvolutionBackwardDataAlgorithmEx(h, ds.w.d, b, ds.y.d, a, ds.conv.d, ds.x.d, out, kMax, &n,
                                                            res, trial.mem.get(), limit),
                op, "cudnnFindConvolutionBackwardDataAlgorithmEx");
    c = pick(res, n, limit, ctx.settings(), op);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t res[kMax];
    check_cudnn(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, ds.x.d, a, ds.y.d, b, ds.conv.d, ds.w.d, out, kMax,
                                                              &n, res, trial.mem.get(), limit),
                op, "cudnnFindConvolutionBackwardFilterAlgorithmEx");
    c = pick(res, n, limit, ctx.settings(), op);
  }
  // The search ran on ctx's stream with the trial workspace; finish before it goes back to the
  // cache (whose blocks are stream-ordered by the thread's current stream, not necessarily ctx's).
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream().handle)), op, "cudaStreamSynchronize");
  trial.mem.reset();
  std::lock_guard lock(g_cache_mutex);
  g_cache.emplace(key, c);
  return c;
}

/// The algorithm's workspace for one call: cuda_glue::CallWorkspace (family_util.hpp).
using cuda_glue::CallWorkspace;

constexpr std::size_t kAlign = 256;
std::size_t aligned(std::size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

/// cuDNN's alpha = 1 / beta = 0 scaling factors, in the compute type (double for f64).
const void* one(DType dt) {
  static const float f1 = 1.0f;
  static const double d1 = 1.0;
  return dt == DType::f64 ? static_cast<const void*>(&d1) : static_cast<const void*>(&f1);
}
const void* zero(DType dt) {
  static const float f0 = 0.0f;
  static const double d0 = 0.0;
  return dt == DType::f64 ? static_cast<const void*>(&d0) : static_cast<const void*>(&f0);
}

void* stream_of(const ExecContext& ctx) { return ctx.stream().handle; }

void fill_zero(void* p, std::size_t bytes, const ExecContext& ctx, const char* op) {
  if (bytes) check_cuda(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(ctx.stream().handle)), op, "cudaMemsetAsync");
}

/// The zero-padded copy of x in ctx's workspace (`bytes` of it). The algorithm's workspace comes
/// from the caching allocator (CallWorkspace), so ctx's workspace is not resized, and the copy not
/// moved, before the call. Returns the copy.
const void* padded_input(DType dt, const ConvGeometry& g, const Mapping& m, const void* x, std::size_t bytes,
                         ExecContext& ctx, const char* op) {
  void* xp = ctx.workspace(bytes);
  check_cuda(kernels::conv::shift_copy(storage_code(dt), g.batch * g.in_channels, g.in.data(), m.ext.data(),
                                       m.offset.data(), x, xp, stream_of(ctx)),
             op, "shift_copy");
  return xp;
}

struct CudaConvKernels final : ConvKernels {
  // bf16 / f16: cuDNN reads and writes the storage type and accumulates in f32 (compute_type),
  // the helper kernels are templated on it; no f32 working copies.
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void forward(DType dt, const ConvGeometry& g, const void* x, const void* w, const void* bias, void* y,
               ExecContext& ctx) const override {
    const char* op = "conv_forward";
    const std::size_t es = dtype_size(dt);
    const index_t ny = g.batch * g.out_channels * vol(g.out);
    if (ny == 0) return;
    cudnnHandle_t h = handle_for(ctx, op);
    if (g.in_channels == 0) {
      fill_zero(y, static_cast<std::size_t>(ny) * es, ctx, op);
    } else {
      const Mapping m = map_geometry(g);
      Descs ds;
      make_descs(ds, dt, g, m, ctx.settings(), op);
      const std::size_t pad_bytes = m.copy ? aligned(static_cast<std::size_t>(g.batch * g.in_channels * vol(m.ext)) * es) : 0;
      const void* xs = m.copy ? padded_input(dt, g, m, x, pad_bytes, ctx, op) : x;
      const Choice c = choose(Pass::forward, dt, g, m, ds, h, xs, w, y, ctx, op);
      const CallWorkspace ws(c.workspace, ctx);
      check_cudnn(cudnnSetConvolutionMathType(ds.conv.d, c.math), op, "cudnnSetConvolutionMathType");
      check_cudnn(cudnnConvolutionForward(h, one(dt), ds.x.d, xs, ds.w.d, w, ds.conv.d,
                                          static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws.get(), c.workspace,
                                          zero(dt), ds.y.d, y),
                  op, "cudnnConvolutionForward");
    }
    if (bias)
      check_cuda(kernels::conv::bias_add(storage_code(dt), g.batch, g.out_channels, vol(g.out), bias, y,
                                         stream_of(ctx)),
                 op, "bias_add");
  }

  void backward_input(DType dt, const ConvGeometry& g, const void* gy, const void* w, const void* bias, void* gx,
                     ExecContext& ctx) const override {
    const char* op = "conv_backward_input";
    const std::size_t es = dtype_size(dt);
    const index_t nx = g.batch * g.in_channels * vol(g.in);
    if (nx == 0) return;
    cudnnHandle_t h = handle_for(ctx, op);
    if (g.out_channels == 0 || vol(g.out) == 0) {
      fill_zero(gx, static_cast<std::size_t>(nx) * es, ctx, op);
    } else {
      const Mapping m = map_geometry(g);
      Descs ds;
      make_descs(ds, dt, g, m, ctx.settings(), op);
      // With a padded mapping cuDNN writes the gradient of the padded extent; crop it afterwards.
      const std::size_t pad_bytes = m.copy ? aligned(static_cast<std::size_t>(g.batch * g.in_channels * vol(m.ext)) * es) : 0;
      void* target = m.copy ? ctx.workspace(pad_bytes) : gx;
      const Choice c = choose(Pass::backward_data, dt, g, m, ds, h, gy, w, target, ctx, op);
      const CallWorkspace ws(c.workspace, ctx);
      check_cudnn(cudnnSetConvolutionMathType(ds.conv.d, c.math), op, "cudnnSetConvolutionMathType");
      check_cudnn(cudnnConvolutionBackwardData(h, one(dt), ds.w.d, w, ds.y.d, gy, ds.conv.d,
                                               static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws.get(),
                                               c.workspace, zero(dt), ds.x.d, target),
                  op, "cudnnConvolutionBackwardData");
      if (m.copy) {
        const E3 crop{-m.offset[0], -m.offset[1], -m.offset[2]};
        check_cuda(kernels::conv::shift_copy(storage_code(dt), g.batch * g.in_channels, m.ext.data(), g.in.data(),
                                             crop.data(), target, gx, stream_of(ctx)),
                   op, "shift_copy");
      }
    }
    if (bias)
      check_cuda(kernels::conv::bias_add(storage_code(dt), g.batch, g.in_channels, vol(g.in), bias, gx, stream_of(ctx)),
                 op, "bias_add");
  }

  void backward_weight(DType dt, const ConvGeometry& g, const void* x, const void* gy, void* gw,
                       ExecContext& ctx) const override {
    const char* op = "conv_backward_weight";
    const std::size_t es = dtype_size(dt);
    const index_t nw = g.out_channels * (g.in_channels / g.groups) * vol(g.kernel);
    if (nw == 0) return;
    cudnnHandle_t h = handle_for(ctx, op);
    if (g.batch == 0 || vol(g.out) == 0) {
      fill_zero(gw, static_cast<std::size_t>(nw) * es, ctx, op);
      return;
    }
    const Mapping m = map_geometry(g);
    Descs ds;
    make_descs(ds, dt, g, m, ctx.settings(), op);
    const std::size_t pad_bytes = m.copy ? aligned(static_cast<std::size_t>(g.batch * g.in_channels * vol(m.ext)) * es) : 0;
    const void* xs = m.copy ? padded_input(dt, g, m, x, pad_bytes, ctx, op) : x;
    const Choice c = choose(Pass::backward_filter, dt, g, m, ds, h, xs, gy, gw, ctx, op);
    const CallWorkspace ws(c.workspace, ctx);
    check_cudnn(cudnnSetConvolutionMathType(ds.conv.d, c.math), op, "cudnnSetConvolutionMathType");
    check_cudnn(cudnnConvolutionBackwardFilter(h, one(dt), ds.x.d, xs, ds.y.d, gy, ds.conv.d,
                                               static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws.get(),
                                               c.workspace, zero(dt), ds.w.d, gw),
                op, "cudnnConvolutionBackwardFilter");
  }

  void backward_bias(DType dt, index_t batch, index_t channels, index_t positions, const void* gy, void* gb,
                     ExecContext& ctx) const override {
    const char* op = "conv_backward_bias";
    if (channels == 0) return;
    check_cuda(cudaSetDevice(ctx.device().index), op, "cudaSetDevice");
    auto* scratch = static_cast<double*>(
        ctx.workspace(static_cast<std::size_t>(kernels::conv::bias_grad_scratch(channels)) * sizeof(double)));
    check_cuda(kernels::conv::bias_grad(storage_code(dt), batch, channels, positions, gy, gb, scratch, stream_of(ctx)),
               op, "bias_grad");
  }
};

const CudaConvKernels g_cuda_conv;

/// Registers the CUDA table when shardtensor::cuda is linked (see include/shardtensor/runtime/registry.hpp).
struct Registrar {
  Registrar() { register_family(DeviceKind::cuda, KernelFamily::conv, &g_cuda_conv); }
} const g_registrar;

}  // namespace
}  // namespace shard::exec

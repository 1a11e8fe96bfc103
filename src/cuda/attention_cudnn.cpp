// cuDNN's fused attention as the CUDA attention table's kernel for bf16 / f16 (interface:
// src/cuda/attention_cudnn.hpp; which calls qualify and why: src/cuda/attention_cudnn_select.hpp).
//
//  * forward: graph::sdpa with generate_stats, attn_scale = our scale (float, as our own bf16
//    kernel uses it), our causal offsets as cuDNN's diagonal band; O is written in place (any
//    strides, e.g. token-major), Stats into our contiguous float lse (cuDNN's Stats is the natural
//    log-sum-exp of the scaled scores: our lse).
//  * backward: graph::sdpa_backward on q, k, v, the given (global) out and lse, dout. cuDNN writes
//    dQ, dK, dV; our contract adds: they go to contiguous scratch from the caching allocator and
//    are added into dq / dk / dv with the box family's strided add (kernels/box.cu, bf16 / f16
//    rounding of the sum as the own kernels do). ExecSettings::deterministic asks cuDNN for its
//    deterministic backward.
//  * graphs: built once per GraphKey (pass, dtype, device, sizes, canonical strides, mask, scale,
//    determinism) and kept in a cache per (thread, device) beside that thread's cuDNN handle for
//    the device (set to the context's stream at each call, as the conv table does): cuDNN does not
//    promise that one execution plan may run from several threads at once, and PyTorch keeps its
//    SDPA graph cache thread-local for the same reason. A shape cuDNN refuses (validate,
//    check_support, build_plans, or a failed execute) is cached as unsupported, written once to
//    stderr with the reason, and runs on the own kernels from then on; nothing here throws.
//  * workspace: from the caching allocator for the call alone (cuda_glue::CallWorkspace, as conv).
//  * SHARDTENSOR_CUDNN_ATTENTION=0 (read once) turns the path off; profiler rows
//    kernel/attention_cudnn (forward, backward) and kernel/attention_cudnn_build time it.
// Built without cudnn-frontend (no SHARDTENSOR_HAVE_CUDNN_FRONTEND) this file is the stub that
// declines every call.
#include "cuda/attention_cudnn.hpp"

#include <mutex>
#include <string>

#include "cuda/attention_cudnn_select.hpp"

#if SHARDTENSOR_HAVE_CUDNN_FRONTEND
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include <dlfcn.h>

#include <cudnn_frontend.h>

#include "cuda/family_util.hpp"
#include "kernels_api/box.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/profiler.hpp"
#include "shardtensor/runtime/memory.hpp"
#endif

namespace shard::exec::cudnn_attention {
namespace {

std::mutex g_counter_mutex;
Counters g_counters;

/// Counts a call left to the own kernels, and why; returns false (the try_* result).
bool decline(cudnn_sdpa::Pass pass, std::string why) {
  const std::lock_guard lock(g_counter_mutex);
  ++(pass == cudnn_sdpa::Pass::forward ? g_counters.forward_declined : g_counters.backward_declined);
  g_counters.last_reason = std::move(why);
  return false;
}

}  // namespace

Counters counters() {
  const std::lock_guard lock(g_counter_mutex);
  return g_counters;
}

void reset_counters() {
  const std::lock_guard lock(g_counter_mutex);
  g_counters = Counters{};
}

#if !SHARDTENSOR_HAVE_CUDNN_FRONTEND

bool compiled() { return false; }

bool try_forward(DType, const AttnGeom&, AttnIn, AttnIn, AttnIn, const AttnMask&, AttnOut, void*, ExecContext&) {
  return decline(cudnn_sdpa::Pass::forward, "built without cudnn-frontend (SHARDTENSOR_CUDNN_FRONTEND_DIR)");
}

bool try_backward(DType, const AttnGeom&, AttnIn, AttnIn, AttnIn, AttnIn, AttnIn, const void*, const AttnMask&,
                  AttnOut, AttnOut, AttnOut, ExecContext&) {
  return decline(cudnn_sdpa::Pass::backward, "built without cudnn-frontend (SHARDTENSOR_CUDNN_FRONTEND_DIR)");
}

#else

}  // namespace shard::exec::cudnn_attention (reopened below)

// Defined by the user of cudnn-frontend's dynamic-loading mode (cudnn_frontend_shim.h declares
// it); set once by cudnn_library_handle() before the first graph is built.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace shard::exec::cudnn_attention {

namespace {

namespace fe = cudnn_frontend;
namespace sel = cudnn_sdpa;
using sel::Pass;

/// Tensor uids of the variant packs (fixed, so a pack needs no lookup of the graph's tensors).
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

constexpr int kMaxDevices = 16;

/// Counts a call that ran on cuDNN.
void count_ran(Pass pass) {
  const std::lock_guard lock(g_counter_mutex);
  ++(pass == Pass::forward ? g_counters.forward_cudnn : g_counters.backward_cudnn);
}

bool enabled() {
  static const bool on = sel::switch_on(std::getenv("SHARDTENSOR_CUDNN_ATTENTION"));
  return on;
}

/// One graph of the cache: built (graph set, its workspace bytes) or refused (reason).
struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace = 0;
  std::string reason;
};

/// A thread's cuDNN handles (one per device) and graph cache. The cache goes before the handles.
struct ThreadState {
  std::array<cudnnHandle_t, kMaxDevices> handles{};
  std::unordered_map<sel::GraphKey, Entry, sel::GraphKeyHash> cache;
  ThreadState() = default;
  ThreadState(const ThreadState&) = delete;
  ThreadState& operator=(const ThreadState&) = delete;
  ~ThreadState() {
    cache.clear();
    for (auto h : handles)
      if (h) cudnnDestroy(h);
  }
};

ThreadState& thread_state() {
  thread_local ThreadState s;
  return s;
}

/// The device's compute capability and the loaded cuDNN's version (queried once per device).
bool device_caps(int dev, sel::DeviceCaps& out, std::string& why) {
  static std::mutex m;
  static std::array<sel::DeviceCaps, kMaxDevices> caps{};
  if (dev < 0 || dev >= kMaxDevices) {
    why = "device index " + std::to_string(dev) + " out of range";
    return false;
  }
  const std::lock_guard lock(m);
  auto& c = caps[static_cast<std::size_t>(dev)];
  if (c.sm == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      cudaGetLastError();
      why = "cannot query the compute capability of cuda:" + std::to_string(dev);
      return false;
    }
    c.sm = 10 * major + minor;
    c.cudnn_version = static_cast<long>(cudnnGetVersion());
  }
  out = c;
  return true;
}

/// Writes `what` to stderr once per distinct message (graph refusals and runtime failures only;
/// the static refusals of attention_cudnn_select.hpp are expected and stay in the counters).
void log_once(const std::string& what) {
  static std::mutex m;
  static std::unordered_set<std::string> seen;
  const std::lock_guard lock(m);
  if (seen.insert(what).second) std::fprintf(stderr, "shardtensor: %s\n", what.c_str());
}

std::string describe(const sel::GraphKey& k) {
  static const char* const masks[] = {"none", "causal top-left", "causal bottom-right"};
  return std::string(k.pass == Pass::forward ? "forward" : "backward") + " " + dtype_name(k.dt) +
         " B=" + std::to_string(k.B) + " H=" + std::to_string(k.H) + " Nq=" + std::to_string(k.Nq) +
         " Nk=" + std::to_string(k.Nk) + " D=" + std::to_string(k.D) + " mask " +
         masks[static_cast<int>(k.mask.kind)] + " (right bound " + std::to_string(k.mask.right_bound) + ")";
}

/// The context's device's cuDNN handle of this thread, bound to the context's stream.
cudnnHandle_t handle_for(ThreadState& st, const ExecContext& ctx, std::string& why) {
  const int dev = ctx.device().index;
  if (cudaSetDevice(dev) != cudaSuccess) {
    cudaGetLastError();
    why = "cudaSetDevice(" + std::to_string(dev) + ") failed";
    return nullptr;
  }
  auto& h = st.handles[static_cast<std::size_t>(dev)];
  if (!h) {
    const cudnnStatus_t s = cudnnCreate(&h);
    if (s != CUDNN_STATUS_SUCCESS) {
      h = nullptr;
      why = std::string("cudnnCreate failed: ") + cudnnGetErrorString(s);
      return nullptr;
    }
  }
  const cudnnStatus_t s = cudnnSetStream(h, static_cast<cudaStream_t>(ctx.stream().handle));
  if (s != CUDNN_STATUS_SUCCESS) {
    why = std::string("cudnnSetStream failed: ") + cudnnGetErrorString(s);
    return nullptr;
  }
  return h;
}

fe::DataType_t io_type(DType dt) { return dt == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF; }

/// A [B, H, n, D] operand of the graph with the key's strides for operand slot `i`.
std::shared_ptr<fe::graph::Tensor_attributes> operand(fe::graph::Graph& g, const char* name, std::int64_t uid,
                                                      const sel::GraphKey& k, index_t n, int i) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({k.B, k.H, n, k.D})
                      .set_stride({k.strides[i][0], k.strides[i][1], k.strides[i][2], 1}));
}

/// The [B, H, Nq, 1] float statistics (contiguous: our lse).
void as_stats(fe::graph::Tensor_attributes& t, const sel::GraphKey& k) {
  t.set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({k.B, k.H, k.Nq, 1}).set_stride({k.H * k.Nq, k.Nq, 1, 1});
}

/// Contiguous [B, H, n, D] strides (the backward's dQ / dK / dV scratch).
std::vector<std::int64_t> packed(const sel::GraphKey& k, index_t n) { return {k.H * n * k.D, n * k.D, k.D, 1}; }

template <class Attributes>
void apply_mask(Attributes& a, const sel::MaskPlan& m) {
  switch (m.kind) {
    case sel::MaskKind::none: break;
    case sel::MaskKind::top_left:
      a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT);
      a.set_diagonal_band_right_bound(static_cast<int>(m.right_bound));
      break;
    case sel::MaskKind::bottom_right:
      a.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT);
      a.set_diagonal_band_right_bound(0);
      break;
  }
}

/// The frontend's dynamic-loading mode (CMakeLists.txt) calls cuDNN through this handle: the
/// libcudnn this library links, found without loading anything new (RTLD_NOLOAD), else opened.
/// Null when neither works; build() then refuses every graph and attention runs on the own kernels.
void* cudnn_library_handle() {
  static void* const handle = [] {
    void* h = dlopen(SHARDTENSOR_CUDNN_SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(SHARDTENSOR_CUDNN_SONAME, RTLD_NOW);
    cudnn_frontend::cudnn_dlhandle = h;
    return h;
  }();
  return handle;
}

/// Builds the graph of `k` with handle h: the built entry, or one holding cuDNN's refusal.
Entry build(const sel::GraphKey& k, cudnnHandle_t h) {
  Entry e;
  if (!cudnn_library_handle()) {
    e.reason = std::string("dlopen(" SHARDTENSOR_CUDNN_SONAME ") failed for cudnn-frontend's dynamic loading");
    return e;
  }
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type(k.dt))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto Q = operand(*g, "Q", kQ, k, k.Nq, 0);
  auto K = operand(*g, "K", kK, k, k.Nk, 1);
  auto V = operand(*g, "V", kV, k, k.Nk, 2);
  const float scale = static_cast<float>(k.scale);
  if (k.pass == Pass::forward) {
    auto a = fe::graph::SDPA_attributes().set_name("shardtensor_sdpa").set_generate_stats(true).set_attn_scale(scale);
    apply_mask(a, k.mask);
    auto [O, Stats] = g->sdpa(Q, K, V, a);
    O->set_output(true).set_uid(kO).set_dim({k.B, k.H, k.Nq, k.D}).set_stride(
        {k.strides[3][0], k.strides[3][1], k.strides[3][2], 1});
    Stats->set_output(true);
    as_stats(*Stats, k);
  } else {
    auto O = operand(*g, "O", kO, k, k.Nq, 3);
    auto dO = operand(*g, "dO", kDO, k, k.Nq, 4);
    auto Stats = g->tensor(fe::graph::Tensor_attributes().set_name("Stats"));
    as_stats(*Stats, k);
    auto a = fe::graph::SDPA_backward_attributes()
                 .set_name("shardtensor_sdpa_backward")
                 .set_attn_scale(scale)
                 .set_deterministic_algorithm(k.deterministic);
    apply_mask(a, k.mask);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, a);
    dQ->set_output(true).set_uid(kDQ).set_dim({k.B, k.H, k.Nq, k.D}).set_stride(packed(k, k.Nq));
    dK->set_output(true).set_uid(kDK).set_dim({k.B, k.H, k.Nk, k.D}).set_stride(packed(k, k.Nk));
    dV->set_output(true).set_uid(kDV).set_dim({k.B, k.H, k.Nk, k.D}).set_stride(packed(k, k.Nk));
  }
  const auto step = [&e](fe::error_t st, const char* what) {
    if (st.is_good()) return true;
    e.reason = std::string(what) + ": " + st.err_msg;
    return false;
  };
  if (!step(g->validate(), "validate") || !step(g->build_operation_graph(h), "build_operation_graph") ||
      !step(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans") ||
      !step(g->check_support(h), "check_support") ||
      !step(g->build_plans(h, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans") ||
      !step(g->get_workspace_size(e.workspace), "get_workspace_size"))
    return e;
  e.graph = std::move(g);
  return e;
}

/// The cached entry of `k` (built on first use; refusals and exceptions become a refused entry).
const Entry& entry_for(ThreadState& st, const sel::GraphKey& k, cudnnHandle_t h, ExecContext& ctx) {
  if (auto it = st.cache.find(k); it != st.cache.end()) return it->second;
  Entry e;
  {
    SHARD_PROFILE_SCOPE("kernel", "attention_cudnn_build", "", &ctx);
    try {
      e = build(k, h);
    } catch (const std::exception& x) {
      e = Entry{};
      e.reason = std::string("exception: ") + x.what();
    } catch (...) {
      e = Entry{};
      e.reason = "unknown exception";
    }
  }
  {
    const std::lock_guard lock(g_counter_mutex);
    ++(e.graph ? g_counters.graphs_built : g_counters.graphs_unsupported);
  }
  if (!e.graph) log_once("cuDNN attention refused " + describe(k) + ": " + e.reason + "; using the own kernels");
  return st.cache.emplace(k, std::move(e)).first->second;
}


sel::Operand operand_of(const void* p, index_t sb, index_t sh, index_t sn) {
  return {sb, sh, sn, reinterpret_cast<std::uintptr_t>(p)};
}

/// The problem of one call as attention_cudnn_select.hpp sees it.
sel::Problem problem_of(Pass pass, DType dt, const AttnGeom& g, const AttnMask& m, const ExecContext& ctx) {
  sel::Problem p;
  p.pass = pass;
  p.dt = dt;
  p.g = g;
  p.scale = m.scale;
  p.causal = m.causal;
  p.q_pos0 = m.q_pos0;
  p.k_pos0 = m.k_pos0;
  p.bias = m.bias != nullptr;
  p.deterministic = ctx.settings().deterministic;
  return p;
}

/// Checks the switch, the device and the problem, and finds (or builds) the graph: the entry to
/// run with its handle and key, or null with `why`.
const Entry* prepare(const sel::Problem& p, ExecContext& ctx, cudnnHandle_t& h, sel::GraphKey& key,
                     std::string& why) {
  if (!enabled()) {
    why = "SHARDTENSOR_CUDNN_ATTENTION=0";
    return nullptr;
  }
  if (p.dt != DType::bf16 && p.dt != DType::f16) {  // the common f32 / f64 case, without a device query
    why = std::string("dtype ") + dtype_name(p.dt) + ": cuDNN SDPA takes bf16 / f16 only";
    return nullptr;
  }
  sel::DeviceCaps caps;
  if (!device_caps(ctx.device().index, caps, why)) return nullptr;
  sel::MaskPlan plan;
  why = sel::refusal(p, caps, plan);
  if (!why.empty()) return nullptr;
  ThreadState& st = thread_state();
  h = handle_for(st, ctx, why);
  if (!h) {
    log_once("cuDNN attention unavailable: " + why + "; using the own kernels");
    return nullptr;
  }
  key = sel::key_of(p, plan, ctx.device().index);
  const Entry& e = entry_for(st, key, h, ctx);
  if (!e.graph) {
    why = "cuDNN refused the graph: " + e.reason;
    return nullptr;
  }
  return &e;
}

/// Runs a built entry; false (logged once, the key marked refused) when cuDNN fails to launch.
bool execute(const Entry& e, cudnnHandle_t h, std::unordered_map<std::int64_t, void*>& pack, ExecContext& ctx,
             const sel::GraphKey& key, std::string& why) {
  const cuda_glue::CallWorkspace ws(static_cast<std::size_t>(e.workspace), ctx);
  fe::error_t st;
  try {
    st = e.graph->execute(h, pack, ws.get());
  } catch (const std::exception& x) {
    st = {fe::error_code_t::GRAPH_EXECUTION_FAILED, x.what()};
  }
  if (st.is_good()) return true;
  why = "cuDNN execute failed: " + st.err_msg;
  log_once("cuDNN attention " + describe(key) + ": " + why + "; using the own kernels from now on");
  ThreadState& ts = thread_state();
  if (auto it = ts.cache.find(key); it != ts.cache.end()) {
    it->second.graph.reset();
    it->second.reason = why;
  }
  return false;
}

}  // namespace

bool compiled() { return true; }

bool try_forward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, const AttnMask& m, AttnOut out, void* lse,
                 ExecContext& ctx) {
  sel::Problem p = problem_of(Pass::forward, dt, g, m, ctx);
  p.q = operand_of(q.data, q.sb, q.sh, q.sn);
  p.k = operand_of(k.data, k.sb, k.sh, k.sn);
  p.v = operand_of(v.data, v.sb, v.sh, v.sn);
  p.out = operand_of(out.data, out.sb, out.sh, out.sn);
  std::string why;
  cudnnHandle_t h = nullptr;
  sel::GraphKey key;
  const Entry* e = prepare(p, ctx, h, key, why);
  if (!e) return decline(Pass::forward, std::move(why));
  SHARD_PROFILE_SCOPE("kernel", "attention_cudnn", "forward", &ctx);
  std::unordered_map<std::int64_t, void*> pack = {{kQ, const_cast<void*>(q.data)},
                                                  {kK, const_cast<void*>(k.data)},
                                                  {kV, const_cast<void*>(v.data)},
                                                  {kO, out.data},
                                                  {kStats, lse}};
  if (!execute(*e, h, pack, ctx, key, why))
    return decline(Pass::forward, std::move(why));
  count_ran(Pass::forward);
  return true;
}

bool try_backward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, AttnIn out, AttnIn dout,
                  const void* lse, const AttnMask& m, AttnOut dq, AttnOut dk, AttnOut dv, ExecContext& ctx) {
  if (!dq.data && !dk.data && !dv.data) return decline(Pass::backward, "no gradient asked for");
  sel::Problem p = problem_of(Pass::backward, dt, g, m, ctx);
  p.q = operand_of(q.data, q.sb, q.sh, q.sn);
  p.k = operand_of(k.data, k.sb, k.sh, k.sn);
  p.v = operand_of(v.data, v.sb, v.sh, v.sn);
  p.out = operand_of(out.data, out.sb, out.sh, out.sn);
  p.dout = operand_of(dout.data, dout.sb, dout.sh, dout.sn);
  std::string why;
  cudnnHandle_t h = nullptr;
  sel::GraphKey key;
  const Entry* e = prepare(p, ctx, h, key, why);
  if (!e) return decline(Pass::backward, std::move(why));
  SHARD_PROFILE_SCOPE("kernel", "attention_cudnn", "backward", &ctx);
  // cuDNN writes dQ, dK, dV: contiguous scratch, added into the caller's gradients afterwards.
  const std::size_t esz = dtype_size(dt);
  const auto aligned = [](std::size_t b) { return (b + 255) / 256 * 256; };
  const std::size_t nq = aligned(static_cast<std::size_t>(g.B * g.H * g.Nq * g.D) * esz);
  const std::size_t nk = aligned(static_cast<std::size_t>(g.B * g.H * g.Nk * g.D) * esz);
  const cuda_glue::CallWorkspace scratch(nq + 2 * nk, ctx);
  char* sq = static_cast<char*>(scratch.get());
  char* sk = sq + nq;
  char* sv = sk + nk;
  std::unordered_map<std::int64_t, void*> pack = {
      {kQ, const_cast<void*>(q.data)}, {kK, const_cast<void*>(k.data)},     {kV, const_cast<void*>(v.data)},
      {kO, const_cast<void*>(out.data)}, {kDO, const_cast<void*>(dout.data)}, {kStats, const_cast<void*>(lse)},
      {kDQ, sq},                       {kDK, sk},                           {kDV, sv}};
  if (!execute(*e, h, pack, ctx, key, why))
    return decline(Pass::backward, std::move(why));
  const auto type = dt == DType::bf16 ? kernels::box_bf16 : kernels::box_f16;
  void* stream = ctx.stream().handle;
  const auto add = [&](AttnOut dst, const char* src, index_t n) {
    if (!dst.data) return;
    const std::int64_t shape[4] = {g.B, g.H, n, g.D};
    const std::int64_t ds[4] = {dst.sb, dst.sh, dst.sn, 1};
    const std::int64_t ss[4] = {g.H * n * g.D, n * g.D, g.D, 1};
    const int rc = kernels::box_add_launch(type, 4, shape, dst.data, ds, src, ss, stream);
    SHARD_CHECK(rc == 0, "attention_backward (cuda, cuDNN)", "adding the gradient failed: {}",
                kernels::box_error_string(rc));
  };
  add(dq, sq, g.Nq);
  add(dk, sk, g.Nk);
  add(dv, sv, g.Nk);
  count_ran(Pass::backward);
  return true;
}

#endif  // SHARDTENSOR_HAVE_CUDNN_FRONTEND

}  // namespace shard::exec::cudnn_attention

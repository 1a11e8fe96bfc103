// exec::DeviceRuntime on cudart, registered for DeviceKind::cuda when shardtensor::cuda is loaded.
//
// Device memory comes from a stream-aware caching allocator (the scheme of PyTorch's
// CUDACachingAllocator; cudaMalloc/cudaFree per tensor cost a device synchronisation each):
// - a block is handed out for use on a stream and freed on the stream it was last used on
//   (allocate_on / deallocate_on; tensor/memory.cpp passes the stream of the thread's current
//   context at allocation for both);
// - at the free, an event is recorded on that stream and the block is parked: an allocation on the
//   same stream may take it at once (its work is queued after the block's last use), an
//   allocation on any other stream only once the event has completed (polled, never waited for);
// - so a block freed while a kernel on a user's non-blocking stream still reads it is never
//   handed to another stream before that kernel finishes (allocation ordered on the legacy default
//   stream, as before, did not synchronise with non-blocking streams);
// - destroy_stream() synchronises the stream first and releases its parked blocks to every
//   stream; out of memory, or release_cached(), synchronises the device and returns the cached
//   blocks to the driver.
// Set SHARDTENSOR_CUDA_CACHE=0 to use plain cudaMalloc/cudaFree instead.
//
// Graph capture (begin_capture .. destroy_graph; the scheme of PyTorch's private graph pools):
// while a thread captures a stream of a device, every block it allocates or frees on that device
// belongs to the graph's pool. The pool serves the capture's allocations first (a block freed
// earlier in the capture is reused, as the replays reuse it in the same stream order), then takes
// ready blocks of the shared cache or the capturing stream's own parked ones, then cudaMalloc (in
// relaxed capture mode: it is not recorded, the graph keeps the address). No event is queried and
// none recorded for a pool block (cudaEventQuery is illegal during a capture). The pool's blocks
// go back to the shared cache only when the graph is destroyed, after its replays have finished:
// until then a replay may write any of them.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

namespace {
/// Graphs begun and not yet destroyed, in the whole process (cuda_glue::live_graphs).
std::atomic<int> g_live_graphs{0};
}  // namespace

namespace cuda_glue {
int live_graphs() noexcept { return g_live_graphs.load(std::memory_order_acquire); }
}  // namespace cuda_glue

namespace {

constexpr int kMaxDevices = 64;

// The profiler's row of the requests that reached the driver (the rest came from the cache).
constinit profile::Site g_prof_malloc{"alloc", "cuda", "cudaMalloc"};

/// cudaMalloc that may run inside this thread's capture (relaxed mode for the call: the
/// allocation is not part of the graph, which keeps the address for its replays).
cudaError_t malloc_maybe_capturing(void** p, std::size_t n, bool capturing) {
  if (!capturing) return cudaMalloc(p, n);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  const cudaError_t e = cudaMalloc(p, n);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return e;
}

cudaStream_t as_stream(Stream s) { return static_cast<cudaStream_t>(s.handle); }

/// Throws shard::Error naming `op`, the call and the device when `e` is an error (and clears
/// the sticky-free error state so later calls are not poisoned).
void check(cudaError_t e, const char* op, const char* call, int device) {
  if (e == cudaSuccess) [[likely]]
    return;
  cudaGetLastError();
  SHARD_FAIL(op, "{} failed on cuda:{}: {} ({})", call, device, cudaGetErrorString(e), cudaGetErrorName(e));
}

/// Makes `device` current for the scope, restoring the previous one (only calls cudaSetDevice
/// when it differs).
class DeviceScope {
 public:
  DeviceScope(int device, const char* op) {
    check(cudaGetDevice(&prev_), op, "cudaGetDevice", device);
    if (prev_ != device) check(cudaSetDevice(device), op, "cudaSetDevice", device);
    else prev_ = -1;
  }
  ~DeviceScope() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

class CudaRuntime final : public DeviceRuntime {
 public:
  int device_count() const noexcept override {
    std::call_once(count_once_, [this] {
      int n = 0;
      const cudaError_t e = cudaGetDeviceCount(&n);
      if (e != cudaSuccess) {
        cudaGetLastError();
        n = 0;
        count_error_ = e;
      }
      count_ = n;
    });
    return count_;
  }

  void check_device(int device, const char* op) const override {
    const int n = device_count();
    if (n == 0) {
      SHARD_FAIL(op, "device cuda:{} requested but no CUDA device is visible ({}; CUDA_VISIBLE_DEVICES={})", device,
                 count_error_ == cudaSuccess ? "cudaGetDeviceCount returned 0" : cudaGetErrorString(count_error_),
                 visible_devices());
    }
    SHARD_CHECK(device >= 0 && device < n, op,
                "device index cuda:{} is beyond the {} visible GPU(s) (valid: cuda:0..cuda:{}; CUDA_VISIBLE_DEVICES={})",
                device, n, n - 1, visible_devices());
  }

  void* allocate(std::size_t bytes, int device) const override { return allocate_on(bytes, device, Stream{}); }
  void deallocate(void* p, int device) const noexcept override { deallocate_on(p, device, Stream{}); }

  void* allocate_on(std::size_t bytes, int device, Stream stream) const override {
    check_device(device, "allocate");
    DeviceScope scope(device, "allocate");
    if (!caching() || device >= kMaxDevices) return malloc_or_fail(bytes, device);
    Cache& c = cache(device);
    const std::size_t n = round_size(bytes);
    {
      std::lock_guard<std::mutex> lk(c.mu);
      if (t_capture == &c) return pool_allocate(c, n, bytes, device, stream);
      if (!t_capture) poll(c);  // no event query while this thread captures
      std::size_t got = 0;
      if (void* p = take_cached(c, n, stream, got)) {
        c.live.emplace(p, got);
        return p;
      }
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_device(device);  // every parked block back to the driver, then once more
      e = cudaMalloc(&p, n);
    }
    if (e != cudaSuccess) fail_alloc(e, bytes, device);
    profile::count_alloc(g_prof_malloc, n);
    std::lock_guard<std::mutex> lk(c.mu);
    c.live.emplace(p, n);
    return p;
  }

  void deallocate_on(void* p, int device, Stream stream) const noexcept override {
    if (!p) return;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) {  // runtime already torn down (process exit)
      cudaGetLastError();
      return;
    }
    if (prev != device) cudaSetDevice(device);
    if (!caching() || device < 0 || device >= kMaxDevices) {
      if (cudaFree(p) != cudaSuccess) cudaGetLastError();  // e.g. cudaErrorCudartUnloading at exit
    } else {
      Cache& c = cache(device);
      std::lock_guard<std::mutex> lk(c.mu);
      const auto it = c.live.find(p);
      if (it == c.live.end()) {  // not from this allocator
        if (cudaFree(p) != cudaSuccess) cudaGetLastError();
      } else {
        const std::size_t n = it->second;
        c.live.erase(it);
        const auto owner = c.pool_of.find(p);
        if (owner != c.pool_of.end() || t_capture == &c) {
          // A graph's block (or one freed inside a capture: the graph may use it): back to the
          // graph's pool, never to the shared cache while the graph lives.
          Pool* pool = owner != c.pool_of.end() ? owner->second : c.capture_pool;
          if (owner == c.pool_of.end()) {
            c.pool_of.emplace(p, pool);
            pool->owned += n;
          }
          pool->free.emplace(n, p);
          c.pool_free += n;
          if (prev != device) cudaSetDevice(prev);
          return;
        }
        c.cached += n;
        if (stream.handle && is_destroyed(stream.handle)) {
          c.ready.emplace(n, p);  // destroy_stream() synchronised it: its work is complete
        } else {
          cudaEvent_t ev = nullptr;
          if (!c.spare_events.empty()) {
            ev = c.spare_events.back();
            c.spare_events.pop_back();
          } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
            ev = nullptr;
          }
          if (ev && cudaEventRecord(ev, as_stream(stream)) == cudaSuccess) {
            c.pending.push_back(Pending{p, n, stream.handle, ev});
          } else {
            // No event: wait for the device instead (correct, slow; never seen in practice).
            cudaGetLastError();
            if (ev) c.spare_events.push_back(ev);
            cudaDeviceSynchronize();
            cudaGetLastError();
            c.ready.emplace(n, p);
          }
        }
      }
    }
    if (prev != device) cudaSetDevice(prev);
  }

  void* allocate_pinned(std::size_t bytes) const override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      SHARD_FAIL("allocate_pinned", "cannot allocate {} bytes of pinned host memory: {}", bytes, cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate_pinned(void* p) const noexcept override {
    if (p && cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
  }

  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes, Stream stream,
            bool sync) const override {
    if (bytes == 0) return;
    const int device = dst_dev.is_cuda() ? dst_dev.index : src_dev.index;
    DeviceScope scope(device, "copy");
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)), "copy", "cudaMemcpyAsync", device);
    // Pageable host memory: the caller may reuse or read it as soon as we return.
    if (sync || (dst_dev.is_cpu() && !is_pinned(dst)) || (src_dev.is_cpu() && !is_pinned(src)))
      check(cudaStreamSynchronize(as_stream(stream)), "copy", "cudaStreamSynchronize", device);
  }

  void memset(void* dst, int value, std::size_t bytes, int device, Stream stream) const override {
    if (bytes == 0) return;
    DeviceScope scope(device, "memset");
    check(cudaMemsetAsync(dst, value, bytes, as_stream(stream)), "memset", "cudaMemsetAsync", device);
  }

  Stream create_stream(int device) const override {
    check_device(device, "create_stream");
    DeviceScope scope(device, "create_stream");
    cudaStream_t s = nullptr;
    // Blocking (synchronises with the legacy default stream): the allocator relies on it.
    check(cudaStreamCreateWithFlags(&s, cudaStreamDefault), "create_stream", "cudaStreamCreate", device);
    std::lock_guard<std::mutex> lk(streams_mu_);
    destroyed_.erase(s);  // a new stream may reuse a destroyed one's handle
    return Stream{s};
  }
  void destroy_stream(Stream s, int device) const noexcept override {
    if (!s.handle) return;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (prev != device) cudaSetDevice(device);
    // Blocks parked by this stream become reusable by every stream once its work is done; a
    // block freed on it later (a tensor that outlived its stream) goes straight to them.
    if (cudaStreamSynchronize(as_stream(s)) != cudaSuccess) cudaGetLastError();
    {
      std::lock_guard<std::mutex> lk(streams_mu_);
      destroyed_.insert(s.handle);
    }
    if (caching() && device >= 0 && device < kMaxDevices) {
      Cache& c = cache(device);
      std::lock_guard<std::mutex> lk(c.mu);
      for (auto it = c.pending.begin(); it != c.pending.end();) {
        if (it->stream == s.handle) {
          c.ready.emplace(it->bytes, it->p);
          c.spare_events.push_back(it->ev);
          it = c.pending.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (cudaStreamDestroy(as_stream(s)) != cudaSuccess) cudaGetLastError();
    if (prev != device) cudaSetDevice(prev);
  }
  void synchronize(Stream s, int device) const override {
    DeviceScope scope(device, "synchronize");
    check(cudaStreamSynchronize(as_stream(s)), "synchronize", "cudaStreamSynchronize", device);
  }

  void* create_event(int device) const override {
    check_device(device, "create_event");
    DeviceScope scope(device, "create_event");
    cudaEvent_t ev = nullptr;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "create_event", "cudaEventCreate", device);
    return ev;
  }
  void destroy_event(void* ev) const noexcept override {
    if (ev && cudaEventDestroy(static_cast<cudaEvent_t>(ev)) != cudaSuccess) cudaGetLastError();
  }
  void record_event(void* ev, Stream s, int device) const override {
    DeviceScope scope(device, "record_event");
    check(cudaEventRecord(static_cast<cudaEvent_t>(ev), as_stream(s)), "record_event", "cudaEventRecord", device);
  }
  void wait_event(Stream s, void* ev, int device) const override {
    DeviceScope scope(device, "wait_event");
    check(cudaStreamWaitEvent(as_stream(s), static_cast<cudaEvent_t>(ev), 0), "wait_event", "cudaStreamWaitEvent",
          device);
  }
  void synchronize_event(void* ev) const override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(ev)), "synchronize_event", "cudaEventSynchronize", -1);
  }
  bool query_event(void* ev) const override {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(ev));
    if (e == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    check(e, "query_event", "cudaEventQuery", -1);
    return true;
  }

  void* create_timing_event(int device) const override {
    check_device(device, "create_timing_event");
    DeviceScope scope(device, "create_timing_event");
    cudaEvent_t ev = nullptr;
    check(cudaEventCreate(&ev), "create_timing_event", "cudaEventCreate", device);
    return ev;
  }
  bool record_timing_event(void* ev, Stream s, int device) const override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(as_stream(s), &st), "record_timing_event", "cudaStreamIsCapturing", device);
    if (st != cudaStreamCaptureStatusNone) return false;
    record_event(ev, s, device);
    return true;
  }
  float elapsed_ms(void* start, void* stop) const override {
    float ms = -1.0f;
    const cudaError_t e = cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return -1.0f;
    }
    return ms;
  }

  bool supports_graphs() const noexcept override { return caching(); }

  void* begin_capture(Stream s, int device) const override {
    check_device(device, "begin_capture");
    SHARD_CHECK(s.handle != nullptr, "begin_capture", "the default stream of cuda:{} cannot be captured (capture a "
                "stream of create_stream)", device);
    SHARD_CHECK(caching(), "begin_capture", "graph capture needs the caching allocator (SHARDTENSOR_CUDA_CACHE=0 is set)");
    SHARD_CHECK(t_capture == nullptr, "begin_capture", "this thread is already capturing a graph");
    DeviceScope scope(device, "begin_capture");
    Cache& c = cache(device);
    auto* g = new Graph{device, as_stream(s), new Pool};
    {
      std::lock_guard<std::mutex> lk(c.mu);
      if (c.capture_pool) {
        delete g->pool;
        delete g;
        SHARD_FAIL("begin_capture", "another graph capture is in progress on cuda:{}", device);
      }
      c.capture_pool = g->pool;
    }
    const cudaError_t e = cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::lock_guard<std::mutex> lk(c.mu);
      release_pool(c, g->pool);
      delete g;
      SHARD_FAIL("begin_capture", "cudaStreamBeginCapture failed on cuda:{}: {} ({})", device, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    }
    t_capture = &c;
    g_live_graphs.fetch_add(1, std::memory_order_acq_rel);
    return g;
  }

  void end_capture(void* handle) const override {
    auto* g = static_cast<Graph*>(handle);
    SHARD_CHECK(g && g->capturing, "end_capture", "no capture in progress on this handle");
    DeviceScope scope(g->device, "end_capture");
    finish_capture(*g);
    if (!g->graph) {
      SHARD_FAIL("end_capture", "the capture on cuda:{} was invalidated ({}): something in the captured work "
                 "synchronised with the host, queried an event or used the default stream", g->device,
                 cudaGetErrorName(g->end_error));
    }
    check(cudaGraphInstantiateWithFlags(&g->exec, g->graph, 0), "end_capture", "cudaGraphInstantiateWithFlags", g->device);
  }

  void launch_graph(void* handle) const override {
    auto* g = static_cast<Graph*>(handle);
    SHARD_CHECK(g && g->exec, "launch_graph", "the graph was not captured and instantiated");
    DeviceScope scope(g->device, "launch_graph");
    check(cudaGraphLaunch(g->exec, g->stream), "launch_graph", "cudaGraphLaunch", g->device);
  }

  void destroy_graph(void* handle) const noexcept override {
    auto* g = static_cast<Graph*>(handle);
    if (!g) return;
    g_live_graphs.fetch_sub(1, std::memory_order_acq_rel);
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) {  // runtime torn down: nothing to give back
      cudaGetLastError();
      return;
    }
    if (prev != g->device) cudaSetDevice(g->device);
    if (g->capturing) finish_capture(*g);
    // The replays, and any other stream's work on a pool block (a block allocated before a failed
    // capture and freed in it; one freed after the capture by eager work elsewhere), must be done
    // before the blocks are ready for every stream: synchronise the device (this runs rarely).
    if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    cudaGetLastError();
    {
      Cache& c = cache(g->device);
      std::lock_guard<std::mutex> lk(c.mu);
      release_pool(c, g->pool);
    }
    const int device = g->device;
    delete g;
    if (prev != device) cudaSetDevice(prev);
  }

  bool is_capturing(Stream s, int device) const override {
    DeviceScope scope(device, "is_capturing");
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(as_stream(s), &st), "is_capturing", "cudaStreamIsCapturing", device);
    return st != cudaStreamCaptureStatusNone;
  }

  void device_uuid(int device, char out[64]) const override {
    check_device(device, "device_uuid");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "device_uuid", "cudaGetDeviceProperties", device);
    const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    std::snprintf(out, 64, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
                  u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  }

  std::size_t cached_bytes() const noexcept override {
    std::size_t total = 0;
    for (int d = 0; d < kMaxDevices; ++d) {
      Cache* c = caches_[d].load(std::memory_order_acquire);
      if (!c) continue;
      std::lock_guard<std::mutex> lk(c->mu);
      total += c->cached + c->pool_free;
    }
    return total;
  }

  void release_cached() const noexcept override {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (!caches_[d].load(std::memory_order_acquire)) continue;
      int prev = -1;
      if (cudaGetDevice(&prev) != cudaSuccess) {
        cudaGetLastError();
        return;
      }
      if (prev != d) cudaSetDevice(d);
      release_device(d);
      if (prev != d) cudaSetDevice(prev);
    }
  }

 private:
  /// A graph's private pool: blocks it owns and, of those, the ones not handed out.
  struct Pool {
    std::multimap<std::size_t, void*> free;
    std::size_t owned = 0;  // bytes
  };
  /// A freed block waiting for the event recorded on the stream it was freed on.
  struct Pending {
    void* p;
    std::size_t bytes;
    void* stream;  // its cudaStream_t (null: the legacy default stream)
    cudaEvent_t ev;
  };
  /// One device's cache (the device is current whenever it is touched).
  struct Cache {
    std::mutex mu;
    std::unordered_map<void*, std::size_t> live;  // handed out: rounded size
    std::vector<Pending> pending;                  // freed, event not yet seen complete
    std::multimap<std::size_t, void*> ready;       // reusable on every stream
    std::vector<cudaEvent_t> spare_events;
    std::size_t cached = 0;  // bytes in pending + ready
    // Graph pools (see the file comment).
    std::unordered_map<void*, Pool*> pool_of;  // every block a graph's pool owns (live or free)
    Pool* capture_pool = nullptr;               // the pool of the capture in progress
    std::size_t pool_free = 0;                  // bytes in the pools' free lists
  };
  /// The handle of begin_capture.
  struct Graph {
    int device;
    cudaStream_t stream;
    Pool* pool;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool capturing = true;
    cudaError_t end_error = cudaSuccess;
  };
  /// The cache whose device the calling thread is capturing (null: none).
  static inline thread_local Cache* t_capture = nullptr;

  /// Allocation inside a capture (c.mu held): the pool's free blocks, then the shared cache's
  /// ready blocks or the capturing stream's parked ones, then cudaMalloc; the block joins the pool.
  void* pool_allocate(Cache& c, std::size_t n, std::size_t bytes, int device, Stream stream) const {
    Pool& pool = *c.capture_pool;
    void* p = nullptr;
    std::size_t got = 0;
    auto f = pool.free.lower_bound(n);
    if (f != pool.free.end() && fits(f->first, n)) {
      p = f->second;
      got = f->first;
      pool.free.erase(f);
      c.pool_free -= got;
      c.live.emplace(p, got);
      return p;
    }
    p = take_cached(c, n, stream, got);
    if (!p) {
      const cudaError_t e = malloc_maybe_capturing(&p, n, true);
      if (e != cudaSuccess) fail_alloc(e, bytes, device);  // no release-and-retry: it would synchronise
      got = n;
      profile::count_alloc(g_prof_malloc, n);
    }
    pool.owned += got;
    c.pool_of.emplace(p, &pool);
    c.live.emplace(p, got);
    return p;
  }
  /// Best fit for n bytes among the blocks parked by `stream` (reusable at once: its later work is
  /// queued after their last use) and the ready ones; removed from the cache (c.mu held). Null
  /// when none fits.
  static void* take_cached(Cache& c, std::size_t n, Stream stream, std::size_t& got) {
    auto pend = c.pending.end();
    for (auto it = c.pending.begin(); it != c.pending.end(); ++it)
      if (it->stream == stream.handle && fits(it->bytes, n) && (pend == c.pending.end() || it->bytes < pend->bytes))
        pend = it;
    auto ready = c.ready.lower_bound(n);
    if (ready != c.ready.end() && !fits(ready->first, n)) ready = c.ready.end();
    void* p = nullptr;
    if (pend != c.pending.end() && (ready == c.ready.end() || pend->bytes <= ready->first)) {
      p = pend->p;
      got = pend->bytes;
      c.spare_events.push_back(pend->ev);  // re-recorded before its next use
      c.pending.erase(pend);
    } else if (ready != c.ready.end()) {
      p = ready->second;
      got = ready->first;
      c.ready.erase(ready);
    } else {
      return nullptr;
    }
    c.cached -= got;
    return p;
  }

  /// Returns `pool`'s blocks to the shared cache (free ones to the ready list, live ones become
  /// ordinary blocks freed later as usual) and deletes it (c.mu held, its graph's work complete).
  static void release_pool(Cache& c, Pool* pool) {
    for (auto& [n, p] : pool->free) {
      c.ready.emplace(n, p);
      c.cached += n;
      c.pool_free -= n;
    }
    std::erase_if(c.pool_of, [pool](const auto& kv) { return kv.second == pool; });
    if (c.capture_pool == pool) c.capture_pool = nullptr;
    delete pool;
  }

  /// Ends g's capture (keeping the graph when the capture is valid; else end_error says why)
  /// and clears the device's capture slot; the pool stays g's until destroy_graph.
  void finish_capture(Graph& g) const noexcept {
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(g.stream, &graph);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (graph) cudaGraphDestroy(graph);
      graph = nullptr;
      g.end_error = e;
    }
    g.graph = graph;
    g.capturing = false;
    Cache& c = cache(g.device);
    {
      std::lock_guard<std::mutex> lk(c.mu);
      if (c.capture_pool == g.pool) c.capture_pool = nullptr;
    }
    if (t_capture == &c) t_capture = nullptr;
  }

  static const char* visible_devices() {
    const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
    return v ? v : "(unset)";
  }
  static bool is_pinned(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeHost;
  }
  /// 512-byte granules below 1 MiB, 128 KiB above (fewer distinct sizes, better reuse).
  static std::size_t round_size(std::size_t bytes) {
    const std::size_t g = bytes < (std::size_t{1} << 20) ? 512 : std::size_t{128} << 10;
    return bytes == 0 ? g : (bytes + g - 1) / g * g;
  }
  /// Whether a cached block of `have` bytes may serve a request of `want` (at most 1/8 waste).
  static bool fits(std::size_t have, std::size_t want) { return have >= want && have <= want + want / 8; }

  static void* malloc_or_fail(std::size_t bytes, int device) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) fail_alloc(e, bytes, device);
    profile::count_alloc(g_prof_malloc, bytes);
    return p;
  }
  [[noreturn]] static void fail_alloc(cudaError_t e, std::size_t bytes, int device) {
    cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    SHARD_FAIL("allocate", "cannot allocate {} bytes on cuda:{}: {} (device free {} of {} bytes)", bytes, device,
               cudaGetErrorString(e), free_b, total_b);
  }

  /// Moves the pending blocks whose event has completed to the ready list (c.mu held). Events of
  /// one stream complete in the order they were recorded, and `pending` keeps that order, so the
  /// first incomplete event of a stream ends the queries for that stream: one query per stream
  /// plus one per completed block, not one per parked block per allocation.
  static void poll(Cache& c) {
    void* blocked[8];  // streams with an incomplete event (more than 8: the rest are queried one by one)
    int nblocked = 0;
    for (auto it = c.pending.begin(); it != c.pending.end();) {
      const bool skip = std::find(blocked, blocked + nblocked, it->stream) != blocked + nblocked;
      if (skip) {
        ++it;
        continue;
      }
      const cudaError_t e = cudaEventQuery(it->ev);
      if (e == cudaErrorNotReady) {
        cudaGetLastError();
        if (nblocked < 8) blocked[nblocked++] = it->stream;
        ++it;
        continue;
      }
      if (e != cudaSuccess) cudaGetLastError();  // an error: the event will not complete later
      c.ready.emplace(it->bytes, it->p);
      c.spare_events.push_back(it->ev);
      it = c.pending.erase(it);
    }
  }

  /// Synchronises `device` (current) and returns its parked blocks to the driver.
  void release_device(int device) const noexcept {
    Cache* c = caches_[device].load(std::memory_order_acquire);
    if (!c) return;
    cudaDeviceSynchronize();  // every pending block's event has completed after this
    cudaGetLastError();
    std::lock_guard<std::mutex> lk(c->mu);
    for (auto& pb : c->pending) {
      c->ready.emplace(pb.bytes, pb.p);
      c->spare_events.push_back(pb.ev);
    }
    c->pending.clear();
    for (auto& [n, p] : c->ready) {
      (void)n;
      if (cudaFree(p) != cudaSuccess) cudaGetLastError();
    }
    c->ready.clear();
    c->cached = 0;
  }

  static bool caching() noexcept {
    static const bool on = [] {
      const char* env = std::getenv("SHARDTENSOR_CUDA_CACHE");
      return !(env && std::strcmp(env, "0") == 0);
    }();
    return on;
  }
  Cache& cache(int device) const {
    Cache* c = caches_[device].load(std::memory_order_acquire);
    if (c) return *c;
    std::lock_guard<std::mutex> lk(streams_mu_);
    c = caches_[device].load(std::memory_order_relaxed);
    if (!c) {
      c = new Cache;  // never destroyed (see runtime())
      caches_[device].store(c, std::memory_order_release);
    }
    return *c;
  }
  bool is_destroyed(void* s) const noexcept {
    std::lock_guard<std::mutex> lk(streams_mu_);
    return destroyed_.count(s) != 0;
  }

  mutable std::once_flag count_once_;
  mutable int count_ = 0;
  mutable cudaError_t count_error_ = cudaSuccess;
  mutable std::mutex streams_mu_;
  mutable std::unordered_set<void*> destroyed_;  // streams destroyed by destroy_stream()
  mutable std::atomic<Cache*> caches_[kMaxDevices] = {};
};

// Never destroyed: deleters of device tensors that outlive main() still call it.
const CudaRuntime& runtime() {
  static const CudaRuntime* rt = new CudaRuntime;
  return *rt;
}
[[maybe_unused]] const bool registered = (register_family(DeviceKind::cuda, KernelFamily::runtime, &runtime()), true);

}  // namespace
}  // namespace shard::exec

#include "shardtensor/runtime/context.hpp"

#include <array>
#include <cstdlib>
#include <cstring>

#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#include "shardtensor/runtime/memory.hpp"

namespace shard {

bool collective_checks_default() noexcept {
  static const bool on = [] {
    const char* e = std::getenv("SHARDTENSOR_CHECK_COLLECTIVES");
    return e != nullptr && *e != '\0' && std::strcmp(e, "0") != 0;
  }();
  return on;
}

ExecContext::~ExecContext() = default;

void* ExecContext::workspace(std::size_t bytes) {
  if (bytes > ws_bytes_ || !ws_) {
    ws_.reset();  // free first: the old buffer is never needed again
    // Device memory is stream-ordered on the current context's stream (tensor/memory.cpp): the
    // workspace belongs to this context's stream, whichever context is current.
    ContextGuard on_this(*this);
    ws_ = allocate_bytes(bytes ? bytes : 1, device_);
    ws_bytes_ = bytes;
  }
  return ws_.get();
}

void ExecContext::synchronize() const {
  if (device_.is_cpu()) return;
  exec::cuda_runtime("ExecContext::synchronize").synchronize(stream_, device_.index);
}

namespace {
constexpr int kMaxDevices = 16;
struct ThreadContexts {
  ExecContext* current_cpu = nullptr;
  std::array<ExecContext*, kMaxDevices> current_cuda{};
  std::unique_ptr<ExecContext> own_cpu;
  std::array<std::unique_ptr<ExecContext>, kMaxDevices> own_cuda;
};
ThreadContexts& tls() {
  thread_local ThreadContexts t;
  return t;
}
ExecContext*& slot(Device dev) {
  auto& t = tls();
  if (dev.is_cpu()) return t.current_cpu;
  SHARD_CHECK(dev.index >= 0 && dev.index < kMaxDevices, "current_context", "device index {} out of range 0..{}",
              dev.index, kMaxDevices - 1);
  return t.current_cuda[static_cast<std::size_t>(dev.index)];
}
}  // namespace

ExecContext& current_context(Device dev) {
  ExecContext*& cur = slot(dev);
  if (cur) return *cur;
  auto& t = tls();
  if (dev.is_cpu()) {
    t.own_cpu = std::make_unique<ExecContext>(dev);
    cur = t.own_cpu.get();
  } else {
    exec::cuda_runtime("current_context").check_device(dev.index, "current_context");
    auto& own = t.own_cuda[static_cast<std::size_t>(dev.index)];
    own = std::make_unique<ExecContext>(dev);
    cur = own.get();
  }
  return *cur;
}

namespace exec {
Stream current_stream_if_any(Device dev) noexcept {
  if (!dev.is_cuda() || dev.index < 0 || dev.index >= kMaxDevices) return {};
  const ExecContext* cur = tls().current_cuda[static_cast<std::size_t>(dev.index)];
  return cur ? cur->stream() : Stream{};
}
}  // namespace exec

ContextGuard::ContextGuard(ExecContext& ctx) : dev_(ctx.device()) {
  ExecContext*& cur = slot(dev_);
  prev_ = cur;
  cur = &ctx;
}

ContextGuard::~ContextGuard() { slot(dev_) = prev_; }

}  // namespace shard

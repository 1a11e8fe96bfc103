#pragma once
/// \file consistency.hpp
/// Collective consistency checking (debug mode): before an entry point's first collective, every
/// rank agrees a fingerprint of the call — op name, dtype, global shape, placements, shard sizes,
/// mesh identity, the op's parameters and the call's sequence number on the communicator — so a
/// rank that calls with different arguments (or calls something else) gets shard::Error on EVERY
/// rank, naming the op, the first differing field and which ranks hold which value, instead of a
/// hang or silently wrong data. PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL is the model.
///
/// On with the environment variable SHARDTENSOR_CHECK_COLLECTIVES=1 (the default of
/// ExecSettings::check_collectives) or per context (ExecSettings::check_collectives, the calling
/// thread's current context for the data's device). The setting must be the same on every rank.
/// Off, an entry point pays one thread-local lookup and a branch. On, one allgather of a fixed
/// array of per-field 64-bit hashes per checked call; only on a mismatch are the differing
/// field's texts gathered (allgatherv) to print them.
///
/// Usage at the top of an entry point's collective part (fields added by name, in a fixed order):
///   if (detail::checking_collectives(dev)) [[unlikely]]
///     detail::CollectiveFingerprint("redistribute").dtype(dt).spec(src).spec(dst, "target ").agree(src.mesh());
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/hash.hpp"
#include "shardtensor/dist/dist_spec.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::detail {

/// True when collective consistency checking is on for work on `dev` (the calling thread's
/// current context for that device; ExecSettings::check_collectives).
inline bool checking_collectives(Device dev = Device::cpu()) {
  return current_context(dev).settings().check_collectives;
}

/// The fingerprint of one collective call: named fields with printable values, hashed per field.
/// "op" and "sequence" are always its first two fields.
class CollectiveFingerprint {
 public:
  /// Hash slots exchanged per call (fields beyond the last slot share it).
  static constexpr std::size_t kSlots = 24;

  explicit CollectiveFingerprint(std::string op);
  /// Adds field `name` whose value is printed with fmt ("{}").
  template <class V>
  CollectiveFingerprint& field(std::string_view name, const V& value) {
    return text(name, fmt::format("{}", value));
  }
  /// Adds field `name` with the value `value` (already text).
  CollectiveFingerprint& text(std::string_view name, std::string value);
  /// Adds "dtype".
  CollectiveFingerprint& dtype(DType dt);
  /// Adds "<what>global shape", "<what>placements", "<what>shard sizes" (every sharded dim's
  /// part sizes) and, once per fingerprint, "mesh".
  CollectiveFingerprint& spec(const DistSpec& s, std::string_view what = "");
  /// Adds "mesh": its shape, dim names and communicator size.
  CollectiveFingerprint& mesh(const DeviceMesh& m);

  /// Agrees the fingerprint over `comm` (collective: one allgather of kSlots + 1 words). The
  /// sequence number is `seq_comm`'s (default: `comm`'s) count of checked calls so far. Throws
  /// shard::Error on every rank of `comm` if any field differs between ranks.
  void agree(Communicator& comm, Communicator* seq_comm = nullptr);
  /// agree over the mesh's communicator.
  void agree(const DeviceMesh& m) { agree(*m.comm()); }

  /// The fields (name, value) in order (tests).
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
  bool has_mesh_ = false;
};

/// A 64-bit FNV-1a hash of a call's arguments: the key of the cheap checks that stay on without
/// the consistency mode, folded into a collective the call makes anyway (Communicator::check_all's
/// allgather, the norm / loss statistics allreduce; docs/architecture.md, "Cheap checks").
class CallKey {
 public:
  explicit CallKey(std::string_view op) { add(op); }
  CallKey& add(std::string_view s) {
    bytes(s.data(), s.size());
    return bytes("\x1f", 1);
  }
  template <class V>
    requires std::is_arithmetic_v<V> || std::is_enum_v<V>
  CallKey& add(V v) {
    return bytes(&v, sizeof v);
  }
  template <class V>
  CallKey& add(const std::vector<V>& v) {
    add(static_cast<std::uint64_t>(v.size()));
    for (const auto& x : v) add(x);
    return *this;
  }
  /// Global shape, placements, shard sizes and mesh shape (not local extents).
  CallKey& add(const DistSpec& s) {
    add(s.global_shape());
    for (const auto& p : s.placements()) add(p.kind).add(p.dim).add(p.op);
    add(s.sizes());
    return add(s.mesh().shape());
  }
  std::uint64_t value() const { return h_; }

 private:
  CallKey& bytes(const void* p, std::size_t n) {
    h_ = fnv1a(p, n, h_);
    return *this;
  }
  std::uint64_t h_ = kFnv1aOffset;
};

/// "none" for an empty vector of explicit sizes, else the sizes (a fingerprint value).
std::string sizes_text(const std::vector<std::vector<index_t>>& sizes);

}  // namespace shard::detail

// Collective consistency checking (include/shardtensor/dist/consistency.hpp): per-field FNV-1a
// hashes, one allgather of a fixed-size digest, and on a mismatch one allgatherv of the first
// differing field's text on every rank so that every rank throws the same message.
#include "shardtensor/dist/consistency.hpp"

#include <algorithm>
#include <array>
#include <map>

#include "shardtensor/core/error.hpp"

namespace shard::detail {

namespace {


/// What every rank sends: its field count and one hash per slot (0: no field there).
struct Digest {
  std::uint64_t count = 0;
  std::array<std::uint64_t, CollectiveFingerprint::kSlots> slot{};
};

constexpr char kSep = '\x1f';  // between a field's name and value in the gathered text

std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{} {{{}}}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ","));
}

std::string clipped(std::string s) {
  constexpr std::size_t kMax = 240;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

}  // namespace

CollectiveFingerprint::CollectiveFingerprint(std::string op) {
  fields_.reserve(12);
  fields_.emplace_back("op", std::move(op));
  fields_.emplace_back("sequence", std::string());  // filled by agree()
}

CollectiveFingerprint& CollectiveFingerprint::text(std::string_view name, std::string value) {
  fields_.emplace_back(std::string(name), std::move(value));
  return *this;
}

CollectiveFingerprint& CollectiveFingerprint::dtype(DType dt) { return text("dtype", fmt::format("{}", dt)); }

CollectiveFingerprint& CollectiveFingerprint::mesh(const DeviceMesh& m) {
  if (has_mesh_) return *this;
  has_mesh_ = true;
  return text("mesh", fmt::format("shape {} names {} over {} ranks", m.shape(), m.dim_names(), m.size()));
}

CollectiveFingerprint& CollectiveFingerprint::spec(const DistSpec& s, std::string_view what) {
  text(fmt::format("{}global shape", what), fmt::format("{}", s.global_shape()));
  text(fmt::format("{}placements", what), fmt::format("[{}]", fmt::join(s.placements(), ", ")));
  text(fmt::format("{}shard sizes", what), fmt::format("{}", s.sizes()));
  return mesh(s.mesh());
}

std::string sizes_text(const std::vector<std::vector<index_t>>& sizes) {
  return sizes.empty() ? std::string("none") : fmt::format("{}", sizes);
}

void CollectiveFingerprint::agree(Communicator& comm, Communicator* seq_comm) {
  fields_[1].second = std::to_string((seq_comm ? *seq_comm : comm).next_checked_call());
  if (comm.size() == 1) return;
  Digest mine;
  mine.count = fields_.size();
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    const std::size_t s = std::min(i, kSlots - 1);
    const std::uint64_t h =
        fnv1a(fields_[i].second, fnv1a(fields_[i].first, mine.slot[s] ? mine.slot[s] : kFnv1aOffset));
    mine.slot[s] = h | 1;  // never 0 (0 marks "no field")
  }
  const std::vector<Digest> all = comm.allgather_value(mine);
  // The first slot in which any two ranks differ (the same verdict on every rank).
  std::size_t bad = kSlots;
  for (std::size_t s = 0; s < kSlots && bad == kSlots; ++s)
    for (const Digest& d : all)
      if (d.slot[s] != all[0].slot[s]) {
        bad = s;
        break;
      }
  if (bad == kSlots) return;

  // Mismatch: gather every rank's text of that slot (name SEP value) to name the values.
  std::string t;
  if (bad < fields_.size()) {
    const std::size_t end = bad == kSlots - 1 ? fields_.size() : bad + 1;
    t = fields_[bad].first;
    t += kSep;
    for (std::size_t i = bad; i < end; ++i)
      t += (i > bad ? "; " + fields_[i].first + " " : std::string()) + fields_[i].second;
  } else {
    t = fmt::format("(no field){}(absent: this rank's call has {} fields)", kSep, fields_.size());
  }
  const int P = comm.size();
  std::vector<std::string> values;
  std::vector<std::vector<int>> groups;
  for (auto& [v, rs] : comm.group_texts(t)) {
    values.push_back(std::move(v));
    groups.push_back(std::move(rs));
  }
  auto name_of = [](const std::string& v) { return v.substr(0, v.find(kSep)); };
  auto value_of = [](const std::string& v) {
    const auto p = v.find(kSep);
    return p == std::string::npos ? v : v.substr(p + 1);
  };
  bool same_name = true;
  for (const auto& v : values) same_name = same_name && name_of(v) == name_of(values[0]);
  std::string have;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string v = same_name ? value_of(values[g]) : name_of(values[g]) + " = " + value_of(values[g]);
    have += fmt::format("{}{} {} {}", g ? ", " : "", ranks_text(groups[g]), groups[g].size() == 1 ? "has" : "have",
                        clipped(v));
  }
  const std::string field = same_name ? name_of(values[0]) : std::string("(different fields)");
  SHARD_FAIL(fields_[0].second.c_str(),
             "ranks disagree on this collective call (consistency check, SHARDTENSOR_CHECK_COLLECTIVES): field '{}' "
             "differs: {} (this is rank {} of {})",
             field, have, comm.rank(), P);
}

}  // namespace shard::detail

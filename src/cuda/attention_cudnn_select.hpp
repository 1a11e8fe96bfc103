#pragma once
/// \file attention_cudnn_select.hpp
/// The host-only logic of the CUDA attention table's cuDNN path (src/cuda/attention_cudnn.cpp),
/// kept free of CUDA / cuDNN headers so that tests/exec/test_attention_cudnn_select.cpp checks it
/// on the CPU: whether one call may run on cuDNN's fused attention (graph::sdpa / sdpa_backward)
/// and, if not, why; how our causal offsets become cuDNN's diagonal band; the key of the graph
/// cache; the SHARDTENSOR_CUDNN_ATTENTION switch.
///
/// Conventions checked against cudnn-frontend 1.23.0 (node/softmax.h, node/diagonal_band_mask.h,
/// utils/attn_score_modifiers.h, node/scaled_dot_product_flash_attention.h):
///  * Stats = max_j S_ij + log(sum_j exp(S_ij - max)), S = attn_scale * Q K^T (+ mask), natural
///    log, float, dims [B, H, Nq, 1] with strides [H*Nq, Nq, 1, 1]: our lse (scale included, base
///    e, contiguous [B, H, Nq] float) exactly; the backward recomputes P = exp(S - Stats).
///  * causal: a key column c is kept for query row r when r + shift >= c, shift = right_bound
///    (TOP_LEFT) or right_bound + Nk - Nq (BOTTOM_RIGHT); ours keeps k_pos0 + j <= q_pos0 + i,
///    i.e. shift = q_pos0 - k_pos0.
///  * head dims: multiples of 8, <= 256 on sm_90 (Hopper), <= 128 elsewhere (sm_80 and sm_100
///    keep 128 unless d_qk = 192 / d_v = 128, which we do not use); sm_80 or newer.
///  * s_q = s_kv = 1 is refused by the backward (so by both passes here).
///  * the backward writes (does not accumulate) dQ, dK, dV; there is no beta.
#include <cstdint>
#include <climits>
#include <cstring>
#include <string>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/hash.hpp"
#include "shardtensor/exec/attention.hpp"

namespace shard::exec::cudnn_sdpa {

enum class Pass : std::uint8_t { forward = 0, backward = 1 };

/// How a causal mask (or none) is given to cuDNN.
enum class MaskKind : std::uint8_t {
  none = 0,          ///< no mask (non-causal, or causal with every key visible to every query)
  top_left = 1,      ///< set_causal_mask + set_diagonal_band_right_bound(right_bound)
  bottom_right = 2,  ///< set_causal_mask_bottom_right (right_bound 0)
};

/// cuDNN's form of a mask.
struct MaskPlan {
  MaskKind kind = MaskKind::none;
  std::int64_t right_bound = 0;
  friend bool operator==(const MaskPlan&, const MaskPlan&) = default;
};

/// One [B, H, N, D] operand as the table sees it: element strides of b, h, n (d stride 1) and the
/// address (for the 16-byte alignment cuDNN's vector loads need).
struct Operand {
  index_t sb = 0, sh = 0, sn = 0;
  std::uintptr_t addr = 0;
};

/// What the device and library offer: compute capability as 10 * major + minor, cuDNN's
/// cudnnGetVersion() (e.g. 91900).
struct DeviceCaps {
  int sm = 0;
  long cudnn_version = 0;
};

/// One call of the table. `ops` holds q, k, v, out (and dout for the backward).
struct Problem {
  Pass pass = Pass::forward;
  DType dt = DType::f32;
  AttnGeom g;
  double scale = 1.0;
  bool causal = false;
  index_t q_pos0 = 0, k_pos0 = 0;
  bool bias = false;
  bool deterministic = false;
  Operand q, k, v, out, dout;
};

/// The largest head dim cuDNN's fp16/bf16 SDPA takes on compute capability `sm` (0: none).
inline index_t max_head_dim(int sm) {
  if (sm < 80) return 0;
  if (sm / 10 == 9) return 256;
  return 128;
}

/// Our causal offsets in cuDNN's terms, for Nq queries and Nk keys (both >= 1). Returns false
/// (and `why`) where cuDNN cannot express it: a shift < 0 leaves the first query rows with no
/// visible key (ours: lse -inf, out 0; cuDNN's result there is undefined).
inline bool mask_plan(bool causal, index_t q_pos0, index_t k_pos0, index_t Nq, index_t Nk, MaskPlan& out,
                      std::string* why = nullptr) {
  out = {};
  if (!causal) return true;
  const index_t shift = q_pos0 - k_pos0;  // key j visible to query i iff j <= i + shift
  if (shift < 0) {
    if (why) *why = "causal block with fully masked query rows (q_pos0 - k_pos0 = " + std::to_string(shift) + " < 0)";
    return false;
  }
  if (shift >= Nk - 1) return true;  // every key visible to every query: no mask
  if (shift == 0) {
    out = {MaskKind::top_left, 0};
  } else if (Nq <= Nk && shift == Nk - Nq) {
    out = {MaskKind::bottom_right, 0};
  } else {
    out = {MaskKind::top_left, static_cast<std::int64_t>(shift)};
  }
  return true;
}

/// Strides of a [B, H, N, D] operand with the ones of unit extents (which address nothing)
/// replaced by canonical values, so views that differ only there share a graph.
inline Operand canonical(Operand o, index_t B, index_t H, index_t N, index_t D) {
  if (N == 1) o.sn = D;
  if (H == 1) o.sh = N * o.sn > D ? N * o.sn : D;
  if (B == 1) o.sb = H * o.sh > N * o.sn ? H * o.sh : N * o.sn;
  return o;
}

/// Empty when `p` may run on cuDNN's SDPA on a device with `caps` (then `plan` is its mask);
/// otherwise why not (the table then runs its own kernels).
inline std::string refusal(const Problem& p, const DeviceCaps& caps, MaskPlan& plan) {
  const AttnGeom& g = p.g;
  if (p.dt != DType::bf16 && p.dt != DType::f16)
    return std::string("dtype ") + std::string(dtype_name(p.dt)) + ": cuDNN SDPA takes bf16 / f16 only";
  if (caps.sm < 80) return "compute capability " + std::to_string(caps.sm) + ": cuDNN SDPA needs sm_80 or newer";
  if (caps.cudnn_version < 90000)
    return "cuDNN " + std::to_string(caps.cudnn_version) + ": the SDPA graphs here need cuDNN 9";
  if (g.D != g.Dv) return "D = " + std::to_string(g.D) + " != Dv = " + std::to_string(g.Dv);
  if (g.D <= 0 || g.D % 8 != 0) return "head dim " + std::to_string(g.D) + " is not a positive multiple of 8";
  if (g.D > max_head_dim(caps.sm))
    return "head dim " + std::to_string(g.D) + " > " + std::to_string(max_head_dim(caps.sm)) + " on sm_" +
           std::to_string(caps.sm);
  if (p.bias) return "additive bias (own kernels)";
  if (g.B <= 0 || g.H <= 0 || g.Nq <= 0 || g.Nk <= 0) return "empty problem";
  if (g.Nq == 1 && g.Nk == 1) return "Nq = Nk = 1 (refused by cuDNN's SDPA backward)";
  if (g.Nq > INT32_MAX || g.Nk > INT32_MAX) return "a sequence longer than 2^31 - 1 (cuDNN's int band bounds)";
  if (!(p.scale == p.scale) || p.scale == 0) return "scale is zero or NaN";
  std::string why;
  if (!mask_plan(p.causal, p.q_pos0, p.k_pos0, g.Nq, g.Nk, plan, &why)) return why;
  struct Named {
    const char* name;
    const Operand* o;
    index_t n;
  };
  const Named ops[5] = {{"q", &p.q, g.Nq}, {"k", &p.k, g.Nk}, {"v", &p.v, g.Nk}, {"out", &p.out, g.Nq},
                        {"dout", &p.dout, g.Nq}};
  const int nops = p.pass == Pass::backward ? 5 : 4;
  for (int i = 0; i < nops; ++i) {
    const Operand c = canonical(*ops[i].o, g.B, g.H, ops[i].n, g.D);
    if (c.addr % 16 != 0) return std::string(ops[i].name) + " is not 16-byte aligned";
    const index_t s[3] = {c.sb, c.sh, c.sn};
    for (index_t x : s)
      if (x <= 0 || x % 8 != 0)
        return std::string(ops[i].name) + " strides (" + std::to_string(c.sb) + ", " + std::to_string(c.sh) + ", " +
               std::to_string(c.sn) + ") are not positive multiples of 8";
  }
  return {};
}

/// Key of one built graph: everything the graph depends on (pass, dtype, device, sizes, the
/// canonical strides of every operand, mask, scale, determinism). Pointers are not part of it.
struct GraphKey {
  Pass pass = Pass::forward;
  DType dt = DType::f32;
  int device = 0;
  bool deterministic = false;
  index_t B = 0, H = 0, Nq = 0, Nk = 0, D = 0;
  index_t strides[5][3] = {};  ///< q, k, v, out, dout (dout zero in the forward)
  MaskPlan mask;
  double scale = 1.0;
  friend bool operator==(const GraphKey& a, const GraphKey& b) {
    return a.pass == b.pass && a.dt == b.dt && a.device == b.device && a.deterministic == b.deterministic &&
           a.B == b.B && a.H == b.H && a.Nq == b.Nq && a.Nk == b.Nk && a.D == b.D &&
           std::memcmp(a.strides, b.strides, sizeof a.strides) == 0 && a.mask == b.mask &&
           std::memcmp(&a.scale, &b.scale, sizeof a.scale) == 0;
  }
};

/// The key of an eligible problem `p` (its mask plan `plan`) on device index `device`.
inline GraphKey key_of(const Problem& p, const MaskPlan& plan, int device) {
  GraphKey k;
  k.pass = p.pass;
  k.dt = p.dt;
  k.device = device;
  k.deterministic = p.pass == Pass::backward && p.deterministic;  // the forward is deterministic
  k.B = p.g.B;
  k.H = p.g.H;
  k.Nq = p.g.Nq;
  k.Nk = p.g.Nk;
  k.D = p.g.D;
  const Operand* ops[5] = {&p.q, &p.k, &p.v, &p.out, &p.dout};
  const index_t ns[5] = {p.g.Nq, p.g.Nk, p.g.Nk, p.g.Nq, p.g.Nq};
  const int nops = p.pass == Pass::backward ? 5 : 4;
  for (int i = 0; i < nops; ++i) {
    const Operand c = canonical(*ops[i], p.g.B, p.g.H, ns[i], p.g.D);
    k.strides[i][0] = c.sb;
    k.strides[i][1] = c.sh;
    k.strides[i][2] = c.sn;
  }
  k.mask = plan;
  k.scale = p.scale;
  return k;
}

/// FNV-1a over the key's fields (not its padding).
struct GraphKeyHash {
  std::size_t operator()(const GraphKey& k) const noexcept {
    using detail::fnv1a;
    std::uint64_t h = detail::kFnv1aOffset;
    const auto add = [&h](const auto& x) { h = fnv1a(&x, sizeof x, h); };
    add(static_cast<std::uint8_t>(k.pass));
    add(static_cast<int>(k.dt));
    add(k.device);
    add(static_cast<std::uint8_t>(k.deterministic));
    add(k.B);
    add(k.H);
    add(k.Nq);
    add(k.Nk);
    add(k.D);
    h = fnv1a(k.strides, sizeof k.strides, h);
    add(static_cast<std::uint8_t>(k.mask.kind));
    add(k.mask.right_bound);
    add(k.scale);
    return static_cast<std::size_t>(h);
  }
};

/// SHARDTENSOR_CUDNN_ATTENTION = `value`: unset, empty or anything but "0" / "off" / "false" /
/// "no" keeps the cuDNN path on.
inline bool switch_on(const char* value) {
  if (!value) return true;
  const std::string v(value);
  return !(v == "0" || v == "off" || v == "OFF" || v == "false" || v == "no");
}

}  // namespace shard::exec::cudnn_sdpa

// The host-only part of the CUDA attention table's cuDNN path (src/cuda/attention_cudnn_select.hpp,
// used by src/cuda/attention_cudnn.cpp), on the CPU: which calls run on cuDNN's fused attention and
// why the others do not (dtype, head dims per architecture, bias, strides, alignment, masks with
// fully masked rows), how our causal offsets become cuDNN's diagonal band, the graph cache's key
// and hash, and the SHARDTENSOR_CUDNN_ATTENTION switch.
#include <catch2/catch_test_macros.hpp>

#include <string>
#include <unordered_set>

// Not an installed header and not under the test binary's include path: reached relative to
// this file (plain C++, no CUDA headers).
#include "../../src/cuda/attention_cudnn_select.hpp"

namespace st_exec_test_attention_cudnn_select {

using namespace shard;
namespace cs = shard::exec::cudnn_sdpa;

namespace {

const cs::DeviceCaps kH100{90, 91900};
const cs::DeviceCaps kA100{80, 91900};

/// Token-major [B, N, H, D] operand at a 256-byte aligned address.
cs::Operand token_major(index_t N, index_t H, index_t D, std::uintptr_t addr = 0x10000) {
  return {N * H * D, D, H * D, addr};
}

/// A bf16 ring-attention-like problem: B 2, H 4, Nq = Nk = 100 (not a multiple of 64), D 64.
cs::Problem base(cs::Pass pass = cs::Pass::forward) {
  cs::Problem p;
  p.pass = pass;
  p.dt = DType::bf16;
  p.g = {2, 4, 100, 100, 64, 64};
  p.scale = 0.125;
  p.q = p.out = p.dout = token_major(100, 4, 64);
  p.k = p.v = token_major(100, 4, 64, 0x20000);
  return p;
}

std::string why(const cs::Problem& p, const cs::DeviceCaps& c = kH100) {
  cs::MaskPlan plan;
  return cs::refusal(p, c, plan);
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("cuDNN SDPA eligibility: bf16 / f16 with head dims multiple of 8 qualify", "[attention][cudnn]") {
  CHECK(why(base()).empty());
  CHECK(why(base(cs::Pass::backward)).empty());
  auto p = base();
  p.dt = DType::f16;
  CHECK(why(p).empty());
  p.g.D = p.g.Dv = 128;
  p.q = p.out = p.dout = token_major(100, 4, 128);
  p.k = p.v = token_major(100, 4, 128, 0x40000);
  CHECK(why(p).empty());
  CHECK(why(p, kA100).empty());
  // head-major [B, H, N, D] as well
  p.q = {4 * 100 * 128, 100 * 128, 128, 0x80000};
  CHECK(why(p).empty());
}

TEST_CASE("cuDNN SDPA eligibility: refusals say why", "[attention][cudnn]") {
  SECTION("f32 and f64 (cuDNN has no f32 SDPA)") {
    auto p = base();
    p.dt = DType::f32;
    CHECK(has(why(p), "dtype f32"));
    p.dt = DType::f64;
    CHECK(has(why(p), "dtype f64"));
  }
  SECTION("head dim not a multiple of 8, D != Dv, beyond the architecture's limit") {
    auto p = base();
    p.g.D = p.g.Dv = 72;  // a multiple of 8: fine
    p.q = p.out = p.dout = token_major(100, 4, 72);
    p.k = p.v = token_major(100, 4, 72, 0x40000);
    CHECK(why(p).empty());
    p.g.D = p.g.Dv = 60;
    CHECK(has(why(p), "not a positive multiple of 8"));
    p.g.D = 64;
    p.g.Dv = 32;
    CHECK(has(why(p), "D = 64 != Dv = 32"));
    p.g.D = p.g.Dv = 256;
    p.q = p.out = p.dout = token_major(100, 4, 256);
    p.k = p.v = token_major(100, 4, 256, 0x40000);
    CHECK(why(p, kH100).empty());                 // Hopper: up to 256
    CHECK(has(why(p, kA100), "head dim 256 > 128"));  // Ampere: 128
    CHECK(has(why(p, {100, 91900}), "> 128"));        // Blackwell: 128 (192/128 not used)
  }
  SECTION("old devices and old cuDNN") {
    CHECK(has(why(base(), {75, 91900}), "sm_80 or newer"));
    CHECK(has(why(base(), {90, 8907}), "cuDNN 9"));
  }
  SECTION("bias, a 1 x 1 problem, zero scale") {
    auto p = base();
    p.bias = true;
    CHECK(has(why(p), "bias"));
    p = base();
    p.g.Nq = p.g.Nk = 1;
    CHECK(has(why(p), "Nq = Nk = 1"));
    p = base();
    p.scale = 0;
    CHECK(has(why(p), "scale"));
  }
  SECTION("strides and alignment of every operand the pass reads") {
    auto p = base();
    p.k.sn = 100;  // not a multiple of 8 (16-byte rows)
    CHECK(has(why(p), "k strides"));
    p = base();
    p.out.addr += 8;  // 8-byte aligned only
    CHECK(has(why(p), "out is not 16-byte aligned"));
    p = base();
    p.dout.sn = 4;  // the forward does not read dout
    CHECK(why(p).empty());
    p.pass = cs::Pass::backward;
    CHECK(has(why(p), "dout strides"));
  }
}

TEST_CASE("cuDNN SDPA: causal offsets as cuDNN's diagonal band", "[attention][cudnn]") {
  cs::MaskPlan m;
  // key j visible to query i iff k_pos0 + j <= q_pos0 + i
  REQUIRE(cs::mask_plan(false, 0, 0, 10, 10, m));
  CHECK(m.kind == cs::MaskKind::none);
  REQUIRE(cs::mask_plan(true, 0, 0, 10, 10, m));  // ring's diagonal block, Ulysses' full causal
  CHECK((m == cs::MaskPlan{cs::MaskKind::top_left, 0}));
  REQUIRE(cs::mask_plan(true, 300, 300, 100, 128, m));  // diagonal block with uneven shards
  CHECK((m == cs::MaskPlan{cs::MaskKind::top_left, 0}));
  REQUIRE(cs::mask_plan(true, 28, 0, 100, 128, m));  // shift = Nk - Nq: bottom-right alignment
  CHECK((m == cs::MaskPlan{cs::MaskKind::bottom_right, 0}));
  REQUIRE(cs::mask_plan(true, 5, 0, 100, 100, m));  // any other shift >= 0: right bound = shift
  CHECK((m == cs::MaskPlan{cs::MaskKind::top_left, 5}));
  REQUIRE(cs::mask_plan(true, 100, 0, 100, 100, m));  // an earlier block: nothing masked
  CHECK(m.kind == cs::MaskKind::none);
  REQUIRE(cs::mask_plan(true, 99, 0, 100, 100, m));  // shift = Nk - 1: nothing masked either
  CHECK(m.kind == cs::MaskKind::none);
  std::string w;
  CHECK_FALSE(cs::mask_plan(true, 0, 1, 100, 100, m, &w));  // query 0 sees no key
  CHECK(has(w, "fully masked"));

  auto p = base();
  p.causal = true;
  p.q_pos0 = 0;
  p.k_pos0 = 50;
  CHECK(has(why(p), "fully masked query rows"));
}

TEST_CASE("cuDNN SDPA graph key: equal problems share a graph, any difference does not", "[attention][cudnn]") {
  const cs::MaskPlan none{};
  const auto p = base();
  const auto k0 = cs::key_of(p, none, 0);
  const cs::GraphKeyHash hash;
  {
    auto q = p;  // other addresses, same graph
    q.q.addr += 4096;
    q.k.addr += 1 << 20;
    CHECK(cs::key_of(q, none, 0) == k0);
    CHECK(hash(cs::key_of(q, none, 0)) == hash(k0));
  }
  {
    // strides of unit extents address nothing: canonical
    auto a = base(), b = base();
    a.g.B = b.g.B = 1;
    a.q.sb = 0;
    b.q.sb = 12345 * 8;
    CHECK(cs::key_of(a, none, 0) == cs::key_of(b, none, 0));
  }
  std::unordered_set<std::size_t> hashes{hash(k0)};
  int variants = 0;
  const auto differs = [&](const cs::Problem& q, const cs::MaskPlan& m, int dev) {
    const auto k = cs::key_of(q, m, dev);
    CHECK_FALSE(k == k0);
    hashes.insert(hash(k));
    ++variants;
  };
  auto q = p;
  q.pass = cs::Pass::backward;
  differs(q, none, 0);
  q = p;
  q.dt = DType::f16;
  differs(q, none, 0);
  differs(p, none, 1);
  q = p;
  q.g.B = 3;
  differs(q, none, 0);
  q = p;
  q.g.H = 8;
  differs(q, none, 0);
  q = p;
  q.g.Nq = 101;
  differs(q, none, 0);
  q = p;
  q.g.Nk = 101;
  differs(q, none, 0);
  q = p;
  q.g.D = q.g.Dv = 128;
  differs(q, none, 0);
  q = p;
  q.v.sn = 8 * 64;
  differs(q, none, 0);
  q = p;
  q.out.sh = 100 * 64;
  differs(q, none, 0);
  differs(p, {cs::MaskKind::top_left, 0}, 0);
  differs(p, {cs::MaskKind::top_left, 3}, 0);
  differs(p, {cs::MaskKind::bottom_right, 0}, 0);
  q = p;
  q.scale = 0.25;
  differs(q, none, 0);
  {
    // determinism matters to the backward only
    auto f = p;
    f.deterministic = true;
    CHECK(cs::key_of(f, none, 0) == k0);
    auto b = p;
    b.pass = cs::Pass::backward;
    auto bd = b;
    bd.deterministic = true;
    CHECK_FALSE(cs::key_of(b, none, 0) == cs::key_of(bd, none, 0));
    // dout's strides are part of the backward's key only
    auto fd = p;
    fd.dout.sn = 8;
    CHECK(cs::key_of(fd, none, 0) == k0);
  }
  CHECK(static_cast<int>(hashes.size()) == variants + 1);  // no collisions among these
}

TEST_CASE("SHARDTENSOR_CUDNN_ATTENTION switch", "[attention][cudnn]") {
  CHECK(cs::switch_on(nullptr));
  CHECK(cs::switch_on(""));
  CHECK(cs::switch_on("1"));
  CHECK(cs::switch_on("on"));
  CHECK_FALSE(cs::switch_on("0"));
  CHECK_FALSE(cs::switch_on("off"));
  CHECK_FALSE(cs::switch_on("false"));
  CHECK_FALSE(cs::switch_on("no"));
}

}  // namespace st_exec_test_attention_cudnn_select

#pragma once
/// \file cpu_isa.hpp
/// The one CPU instruction-set detector. Every ISA-dispatched CPU kernel (the direct conv path,
/// the attention row kernels, the BLAS core choice) asks `cpu_isa()`; nothing else calls
/// `__builtin_cpu_supports`. The environment variable `SHARDTENSOR_CPU_ISA=scalar|avx2|avx512`
/// lowers the level (capped at what the CPU has), so one machine can run every code path:
/// ctest runs the kernel-family tests once per level the machine supports.
#include <fmt/format.h>

#include <string>

namespace shard {

/// SIMD levels the CPU kernels are compiled for, in increasing order.
/// `avx2` means AVX2 + FMA; `avx512` means AVX-512 F, VL, BW and DQ.
enum class CpuIsa : unsigned char { scalar, avx2, avx512 };

/// The highest level this CPU supports (cpuid; independent of the environment).
CpuIsa cpu_isa_supported() noexcept;

/// The level the kernels use: `SHARDTENSOR_CPU_ISA` if set, capped at `cpu_isa_supported()`,
/// else `cpu_isa_supported()`. Read once per process. An unknown value throws `shard::Error`
/// naming the variable and the accepted values (at the first kernel that asks).
CpuIsa cpu_isa();

/// True when the kernels' level (cpu_isa()) is avx512, the CPU has AMX-TILE and AMX-BF16 and the
/// OS granted this process the AMX tile state (Linux arch_prctl ARCH_REQ_XCOMP_PERM, asked once):
/// the bf16 conv kernels on AMX tiles (exec/conv.hpp, ExecSettings::native_low_precision).
bool cpu_has_amx_bf16();

/// The bf16 dot-product units the bf16 conv kernels use (exec/conv.hpp,
/// ExecSettings::native_low_precision), in increasing order:
///  - `widened`: none; bf16 is widened to f32 in registers and the f32 micro-kernels run;
///  - `avx512_bf16`: AVX-512 BF16 `vdpbf16ps` (16 lanes, each summing a pair of bf16 products);
///  - `amx`: AMX-BF16 tiles (`tdpbf16ps`).
enum class CpuBf16 : unsigned char { widened, avx512_bf16, amx };

/// The highest bf16 unit this CPU supports at the kernels' level (`widened` below avx512).
CpuBf16 cpu_bf16_supported();

/// The bf16 unit the conv kernels use: `SHARDTENSOR_CPU_BF16=widened|avx512bf16|amx` if set
/// (capped at `cpu_bf16_supported()`), else the automatic choice: `amx` where the CPU has it;
/// `avx512_bf16` on AMD CPUs with AVX-512 BF16 (Zen 4: `vdpbf16ps` issues at the f32 FMA rate,
/// so twice the flops; docs/performance.md); `widened` otherwise (on Intel CPUs `vdpbf16ps`
/// issues at half the FMA rate and measured slower than the widened f32 kernels). Read once per
/// process; an unknown value throws `shard::Error` naming the variable and the accepted values.
CpuBf16 cpu_bf16();

/// Parses "widened", "avx512bf16" or "amx"; throws `shard::Error` on anything else.
CpuBf16 parse_cpu_bf16(const std::string& name);

/// "widened", "avx512bf16" or "amx".
const char* to_string(CpuBf16 unit) noexcept;

/// True when `SHARDTENSOR_CPU_ISA` is set (a lowered level is in effect or was asked for).
bool cpu_isa_overridden();

/// Parses "scalar", "avx2" or "avx512"; throws `shard::Error` on anything else.
CpuIsa parse_cpu_isa(const std::string& name);

/// "scalar", "avx2" or "avx512".
const char* to_string(CpuIsa isa) noexcept;

/// The CPU's model name (/proc/cpuinfo "model name"), "unknown" when unavailable; for
/// benchmark and test reports, which name the CPU and the ISA beside every figure.
std::string cpu_model_name();

}  // namespace shard

template <>
struct fmt::formatter<shard::CpuIsa> : fmt::formatter<fmt::string_view> {
  template <class Ctx>
  auto format(shard::CpuIsa isa, Ctx& ctx) const {
    return fmt::formatter<fmt::string_view>::format(shard::to_string(isa), ctx);
  }
};

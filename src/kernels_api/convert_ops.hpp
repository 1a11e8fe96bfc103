#pragma once
// The kernel firewall's name for the project's one bf16 / f16 <-> f32 conversion: the bit-level
// functions shard::cvt:: of shardtensor/core/storage_bits.hpp (plain C++17, no other project
// include; the kernels see include/ for that header only, docs/architecture.md "Layers and the
// guard"). Nothing is defined here.
#include "shardtensor/core/storage_bits.hpp"

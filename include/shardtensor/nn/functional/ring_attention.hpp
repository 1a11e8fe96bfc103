#pragma once
/// \file ring_attention.hpp
/// Forwarding include: ring and Ulysses attention live in nn/functional/attention.hpp.
#include "shardtensor/nn/functional/attention.hpp"

#pragma once
/// \file functional.hpp
/// Umbrella header of the domain-parallel functional ops, namespace shard::nn::functional (alias
/// shard::F). One include per op family; keep this a plain list.
#include "shardtensor/nn/functional/common.hpp"
#include "shardtensor/nn/functional/pointwise.hpp"
#include "shardtensor/nn/functional/activation.hpp"
#include "shardtensor/nn/functional/reduction.hpp"
#include "shardtensor/nn/functional/complex.hpp"
#include "shardtensor/nn/functional/linear.hpp"
#include "shardtensor/nn/functional/norm.hpp"
#include "shardtensor/nn/functional/concat.hpp"
#include "shardtensor/nn/functional/loss.hpp"
#include "shardtensor/nn/functional/window.hpp"
#include "shardtensor/nn/functional/conv.hpp"
#include "shardtensor/nn/functional/pool.hpp"
#include "shardtensor/nn/functional/upsample.hpp"
#include "shardtensor/nn/functional/layout.hpp"
#include "shardtensor/nn/functional/attention.hpp"
#include "shardtensor/nn/functional/cast.hpp"
#include "shardtensor/nn/functional/neighborhood_attention.hpp"
#include "shardtensor/nn/functional/fft.hpp"
#include "shardtensor/nn/functional/neighbors.hpp"
#include "shardtensor/nn/functional/point_grid.hpp"

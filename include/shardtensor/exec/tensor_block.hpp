#pragma once
#include "shardtensor/tensor/tensor_block.hpp"  // forwarder (issue 31): moved to shardtensor/tensor/tensor_block.hpp

#pragma once
#include "shardtensor/runtime/memory.hpp"  // forwarder (issue 31): moved to shardtensor/runtime/memory.hpp

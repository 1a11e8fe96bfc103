#pragma once
#include "shardtensor/runtime/profiler.hpp"  // forwarder (issue 31): moved to shardtensor/runtime/profiler.hpp

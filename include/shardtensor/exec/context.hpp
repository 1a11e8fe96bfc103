#pragma once
#include "shardtensor/runtime/context.hpp"  // forwarder (issue 31): moved to shardtensor/runtime/context.hpp

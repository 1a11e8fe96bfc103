#pragma once
// Precompiled header of the test executables (tests/CMakeLists.txt, SHARDTENSOR_TEST_PCH; issue 33).
// Every test TU used to parse Catch2 and the whole public API again: about 3 of the 6 s a small test
// file takes to compile at -O1. Only headers that almost every test includes belong here; a test
// still includes what it uses (the PCH is an accelerator, not a dependency: the suite builds with
// -DSHARDTENSOR_TEST_PCH=OFF, and public headers are checked to compile on their own elsewhere).
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <shardtensor/nn/functional.hpp>
#include <shardtensor/shardtensor.hpp>

// Never compiled: the object target header_probe (tests/CMakeLists.txt) only lends its compile
// flags, shardtensor's usage requirements included, to the header self-containment check
// (tests/support/header_check.sh).
#include <shardtensor/config.hpp>

#!/usr/bin/env bash
# Command (b): set up, build everything and run the whole test suite (serial tests, MPI tests at
# 1-4 ranks, consumer-project tests). Extra arguments go to ctest, e.g. -L consumer or -R mpi.
# Knobs: BUILD_DIR, JOBS, CMAKE_ARGS, MPIEXEC_FLAGS, SKIP_SETUP (see scripts/common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

setup_deps
# The benchmarks are never run by ctest: `all` syntax-checks them and their executables are built
# on demand (bench/CMakeLists.txt, SHARDTENSOR_BENCH_SYNTAX_ONLY; issue 33). CMAKE_ARGS may say
# otherwise.
# The examples are compiled at -O1 (SHARDTENSOR_EXAMPLE_OPT_FLAGS, examples/CMakeLists.txt): the
# tests run them for their results, and their compute is in the library.
bench_mode=()
[[ "$CMAKE_ARGS" == *SHARDTENSOR_BENCH_SYNTAX_ONLY* ]] || bench_mode+=(-DSHARDTENSOR_BENCH_SYNTAX_ONLY=ON)
[[ "$CMAKE_ARGS" == *SHARDTENSOR_EXAMPLE_OPT_FLAGS* ]] || bench_mode+=(-DSHARDTENSOR_EXAMPLE_OPT_FLAGS=-O1)
configure "${bench_mode[@]}"
build
t_build=$(( $(date +%s) - _t_start ))
log "ctest"
# Open MPI keeps every job's session directory under <tmp>/ompi.<host>.<uid> and the last job to
# end removes it; two launches that both find it missing race to create it, and the loser fails in
# orte_init ("mkdir ... File exists"; seen once, on a clean debootstrap bookworm). One idle
# one-rank job (`sleep`) holds that directory for the whole ctest run, so it is never recreated
# under concurrent launches. tests/examples/run_cases.sh also gives each of its parallel launches
# a session directory of its own.
keeper=""
if command -v mpiexec >/dev/null && mpiexec --version 2>/dev/null | grep -q "Open MPI"; then
  # shellcheck disable=SC2086
  mpiexec $MPIEXEC_FLAGS -n 1 sleep 100000 >/dev/null 2>&1 < /dev/null &
  keeper=$!
  trap '[ -n "$keeper" ] && kill "$keeper" 2>/dev/null; wait "$keeper" 2>/dev/null' EXIT
  sleep 1
fi
# ctest's own parallelism is the machine's width (JOBS); the MPI and example tests declare their
# ranks as PROCESSORS, so ctest never runs more ranks at once than it has slots for.
set +e
(cd "$BUILD_DIR" && ctest --output-on-failure --parallel "$JOBS" "$@") 2>&1 | tee "$BUILD_DIR/ctest.log"
rc=${PIPESTATUS[0]}
set -e
t_total=$(( $(date +%s) - _t_start ))
# Where the time went (docs/building.md, "Build and test time"): compile time per TU and target,
# ctest time per test.
bash "$ROOT/scripts/build_report.sh" "$BUILD_DIR" 20 || true
log "finished: setup+configure+build ${t_build}s, ctest $(( t_total - t_build ))s, total ${t_total}s, ctest exit $rc"
exit $rc

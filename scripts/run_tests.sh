#!/usr/bin/env bash
# Command (b): set up, build everything and run the whole test suite (serial tests, MPI tests at
# 1-4 ranks, consumer-project tests). Extra arguments go to ctest, e.g. -L consumer or -R mpi.
# Knobs: BUILD_DIR, JOBS, CMAKE_ARGS, MPIEXEC_FLAGS, SKIP_SETUP (see scripts/common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

setup_deps
configure
build
t_build=$(( $(date +%s) - _t_start ))
log "ctest"
rc=0
(cd "$BUILD_DIR" && ctest --output-on-failure --parallel "$JOBS" "$@") || rc=$?
log "finished: setup+configure+build ${t_build}s, total $(( $(date +%s) - _t_start ))s, ctest exit $rc"
exit $rc

#!/usr/bin/env bash
# Command (a): set up, build and run the main example under mpiexec.
#   scripts/run_example.sh                 # dist_demo at 4 ranks
#   EXAMPLE=<target> EXAMPLE_ARGS="..." NP=2 scripts/run_example.sh
# Knobs shared with run_tests.sh: BUILD_DIR, JOBS, CMAKE_ARGS, MPIEXEC_FLAGS, SKIP_SETUP (scripts/common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

EXAMPLE="${EXAMPLE:-dist_demo}"      # the main example (one CMake target under examples/)
EXAMPLE_ARGS="${EXAMPLE_ARGS:-}"     # its command-line arguments
NP="${NP:-4}"                        # MPI ranks

setup_deps
configure
build "$EXAMPLE"
log "run: mpiexec -n $NP $EXAMPLE $EXAMPLE_ARGS"
# shellcheck disable=SC2086
mpiexec -n "$NP" $MPIEXEC_FLAGS "$BUILD_DIR/examples/$EXAMPLE" $EXAMPLE_ARGS
log "done"

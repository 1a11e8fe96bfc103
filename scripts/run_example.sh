#!/usr/bin/env bash
# Command (a): set up, build and run the main example under mpiexec.
#   scripts/run_example.sh                 # unet_surrogate at 4 ranks on a 2x2 mesh
#   EXAMPLE=dist_demo scripts/run_example.sh   # the DistTensor tour instead
#   EXAMPLE=<target> EXAMPLE_ARGS="..." NP=2 scripts/run_example.sh
# Knobs shared with run_tests.sh: BUILD_DIR, JOBS, CMAKE_ARGS, MPIEXEC_FLAGS, SKIP_SETUP (scripts/common.sh).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MAIN_EXAMPLE=unet_surrogate                 # the main example: one CMake target under examples/
MAIN_EXAMPLE_ARGS="--mesh 2x2 --steps 200"  # and its arguments
EXAMPLE="${EXAMPLE:-$MAIN_EXAMPLE}"
if [ "$EXAMPLE" = "$MAIN_EXAMPLE" ]; then EXAMPLE_ARGS="${EXAMPLE_ARGS-$MAIN_EXAMPLE_ARGS}"; else EXAMPLE_ARGS="${EXAMPLE_ARGS-}"; fi
NP="${NP:-4}"                        # MPI ranks

setup_deps
# The example at the build type's flags (-O3), also where command (b) compiled the examples at -O1
# in the same build dir (SHARDTENSOR_EXAMPLE_OPT_FLAGS, examples/CMakeLists.txt). CMAKE_ARGS may say otherwise.
opt=()
[[ "$CMAKE_ARGS" == *SHARDTENSOR_EXAMPLE_OPT_FLAGS* ]] || opt=(-DSHARDTENSOR_EXAMPLE_OPT_FLAGS=)
configure "${opt[@]}"
build "$EXAMPLE"
log "run: mpiexec -n $NP $EXAMPLE $EXAMPLE_ARGS"
# shellcheck disable=SC2086
mpiexec -n "$NP" $MPIEXEC_FLAGS "$BUILD_DIR/examples/$EXAMPLE" $EXAMPLE_ARGS
log "done"

# Shared by scripts/run_example.sh and scripts/run_tests.sh (sourced, not run).
# Environment knobs (all optional):
#   BUILD_DIR      build directory                       (default: <repo>/build)
#   JOBS           parallel compile jobs                 (default: 2)
#   CMAKE_ARGS     extra cmake configure arguments, e.g. "-DSHARDTENSOR_ENABLE_CUDA=OFF"
#   MPIEXEC_FLAGS  extra mpiexec flags                   (default: oversubscribe, shared-memory transport)
#   SKIP_SETUP=1   do not run scripts/setup.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
JOBS="${JOBS:-2}"
CMAKE_ARGS="${CMAKE_ARGS:-}"
if [ -z "${MPIEXEC_FLAGS+x}" ]; then
  MPIEXEC_FLAGS="--oversubscribe --mca pml ob1 --mca btl self,vader"
  [ "$(id -u)" -eq 0 ] && MPIEXEC_FLAGS="--allow-run-as-root $MPIEXEC_FLAGS"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

_t_start=$(date +%s)
log() { printf '[%s +%4ds] %s\n' "$(basename "$0")" "$(( $(date +%s) - _t_start ))" "$*"; }

setup_deps() {
  if [ "${SKIP_SETUP:-0}" = 1 ]; then log "setup skipped (SKIP_SETUP=1)"; return; fi
  log "setup: installing missing dependencies"
  bash "$ROOT/scripts/setup.sh"
}

configure() {
  local launch=()
  # ccache when present (setup.sh installs it): a rebuild after a pull, or in a second clone,
  # recompiles only what changed. CCACHE_DISABLE=1 turns it off.
  if command -v ccache >/dev/null 2>&1 && [ "${CCACHE_DISABLE:-0}" != 1 ]; then
    launch=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  log "configure: $BUILD_DIR $CMAKE_ARGS ${launch[*]}"
  # shellcheck disable=SC2086
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "${launch[@]}" $CMAKE_ARGS "$@"
}

build() {
  log "build (-j$JOBS): ${*:-all}"
  if [ $# -gt 0 ]; then
    cmake --build "$BUILD_DIR" --parallel "$JOBS" --target "$@"
  else
    cmake --build "$BUILD_DIR" --parallel "$JOBS"
  fi
}

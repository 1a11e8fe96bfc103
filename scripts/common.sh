# Shared by scripts/run_example.sh and scripts/run_tests.sh (sourced, not run).
# Environment knobs (all optional):
#   BUILD_DIR      build directory                       (default: <repo>/build)
#   JOBS           parallel compile jobs and ctest slots (default: the machine's cores, nproc)
#   CMAKE_ARGS     extra cmake configure arguments, e.g. "-DSHARDTENSOR_ENABLE_CUDA=OFF"
#   MPIEXEC_FLAGS  extra mpiexec flags                   (default: oversubscribe, shared-memory transport)
#   SKIP_SETUP=1   do not run scripts/setup.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
JOBS="${JOBS:-$(env -u OMP_NUM_THREADS nproc 2>/dev/null || echo 2)}"
CMAKE_ARGS="${CMAKE_ARGS:-}"
if [ -z "${MPIEXEC_FLAGS+x}" ]; then
  # mpi_yield_when_idle: waiting ranks yield their core (4 ranks on 2 cores; docs/building.md)
  MPIEXEC_FLAGS="--oversubscribe --mca pml ob1 --mca btl self,vader --mca mpi_yield_when_idle 1"
  [ "$(id -u)" -eq 0 ] && MPIEXEC_FLAGS="--allow-run-as-root $MPIEXEC_FLAGS"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# hwloc's "gl" component (Debian's libhwloc-plugins, loaded by Open MPI in every process) probes
# X displays :0-:9 to name GPUs attached to them; where the host name is not in /etc/hosts each
# probe waits for a DNS timeout: 5.7 s per process against 0.6 s (measured in a debootstrap
# bookworm without /etc/hosts; docs/building.md). Nothing here uses display GPUs' names.
export HWLOC_COMPONENTS="${HWLOC_COMPONENTS--gl}"

_t_start=$(date +%s)
log() { printf '[%s +%4ds] %s\n' "$(basename "$0")" "$(( $(date +%s) - _t_start ))" "$*"; }

setup_deps() {
  if [ "${SKIP_SETUP:-0}" = 1 ]; then log "setup skipped (SKIP_SETUP=1)"; return; fi
  log "setup: installing missing dependencies"
  bash "$ROOT/scripts/setup.sh"
}

# The bench scripts that draw plots install gnuplot on demand (scripts/setup.sh leaves it out
# unless SETUP_WITH_PLOTS=1: the README commands do not need it).
need_plots() {
  command -v gnuplot >/dev/null 2>&1 || SETUP_WITH_PLOTS=1 bash "$ROOT/scripts/setup.sh" ||
    echo "note: gnuplot could not be installed; the plots are skipped" >&2
}
# True when an NVIDIA GPU is visible (nvidia-smi lists one).
gpu_visible() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

configure() {
  local launch=() extra=()
  # ccache when present (setup.sh installs it): a rebuild after a pull, or in a second clone,
  # recompiles only what changed. CCACHE_DISABLE=1 turns it off. The sloppiness lets ccache
  # cache the TUs that use the test executables' precompiled header.
  if command -v ccache >/dev/null 2>&1 && [ "${CCACHE_DISABLE:-0}" != 1 ]; then
    launch=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
  fi
  # Ninja when present (setup.sh installs it) for a new build dir: it schedules the 2 cores
  # better than make and its log (.ninja_log) gives the per-TU compile times of
  # scripts/build_report.sh. An existing build dir keeps its generator.
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1 && [[ "$CMAKE_ARGS" != *"-G"* ]]; then
    extra+=(-G Ninja)
  fi
  # No GPU visible (CI, a login node): the CUDA kernels are compiled to PTX for compute_90 only
  # (CMake's "90-virtual": no sm_80/sm_90 machine code, which a GPU-less machine cannot run
  # anyway; a Hopper GPU would JIT the PTX). Every kernel still goes through nvcc's front end and
  # NVVM once; ptxas is skipped. Issue 33: ptxas was 58% of kernels/attention.cu's compile
  # (72.8 -> 30.7 CPU s), and each extra architecture had added ~40%. A GPU machine, or
  # CMAKE_ARGS with CMAKE_CUDA_ARCHITECTURES, gets what it asks for (CPU_ONLY_CUDA_ARCH=90 gives
  # sm_90 machine code here too).
  if [[ "$CMAKE_ARGS" != *CMAKE_CUDA_ARCHITECTURES* ]] && ! gpu_visible; then
    extra+=(-DCMAKE_CUDA_ARCHITECTURES="${CPU_ONLY_CUDA_ARCH:-90-virtual}")
  fi
  log "configure: $BUILD_DIR $CMAKE_ARGS ${launch[*]} ${extra[*]} $*"
  # shellcheck disable=SC2086
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "${launch[@]}" "${extra[@]}" $CMAKE_ARGS "$@"
}

build() {
  log "build (-j$JOBS): ${*:-all}"
  if [ $# -gt 0 ]; then
    cmake --build "$BUILD_DIR" --parallel "$JOBS" --target "$@"
  else
    cmake --build "$BUILD_DIR" --parallel "$JOBS"
  fi
}

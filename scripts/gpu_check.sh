#!/usr/bin/env bash
# The one command a session runs on the GPU machine (no apt, no network): build from the offline
# bundle, run the CUDA tests at 1 rank, the MPI(/CUDA) tests at 2 and 4 ranks sharing the GPU, and
# the GPU benchmarks (bench/run_gpu*.sh). See docs/building.md, "Offline build".
#   here, once:   scripts/setup.sh --download .deps          (.deps is git-ignored; ~21 MiB)
#   device tool:  run(command="bash scripts/gpu_check.sh", carry=[".deps"])
# Logs go to $OUT (at most 8 files): summary.txt setup.log configure.log build.log tests.log
# mpi_tests.log bench.log fallback.log. If the bundle's MPI cannot run (or MPI does not configure),
# a second build with SHARDTENSOR_ENABLE_MPI=OFF runs the serial + CUDA tests (fallback.log).
# Knobs: DEPS_DIR (.deps)  DEPS_PREFIX (/tmp/st-deps)  BUILD_DIR (/tmp/st-gpu-build)  JOBS (nproc)
#   CUDA_ARCH (90)  NPS ("2 4")  BUILD_TIMEOUT (420 s)  TEST_TIMEOUT (240 s per run)  BENCH_TIMEOUT (240 s in all)
#   DEADLINE (540 s: later phases are skipped past it)  SKIP_BENCH=1  CMAKE_ARGS (extra)
#   FALLBACK=1 (go straight to the MPI-off build).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/gpu_check_out}"; mkdir -p "$OUT"
DEPS_DIR="${DEPS_DIR:-$ROOT/.deps}"
DEPS_PREFIX="${DEPS_PREFIX:-/tmp/st-deps}"
B="${BUILD_DIR:-/tmp/st-gpu-build}"
JOBS="${JOBS:-$(nproc)}"
CUDA_ARCH="${CUDA_ARCH:-90}"
NPS="${NPS:-2 4}"
TEST_TIMEOUT="${TEST_TIMEOUT:-240}"
BUILD_TIMEOUT="${BUILD_TIMEOUT:-420}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-240}"
DEADLINE="${DEADLINE:-540}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Root on the device; vader's single-copy (CMA/ptrace) is often refused inside VMs/containers.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2054
MPIFLAGS=(--oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader
          --mca btl_vader_single_copy_mechanism none)
[ "$(id -u)" -eq 0 ] && MPIFLAGS=(--allow-run-as-root "${MPIFLAGS[@]}")

T0=$(date +%s)
SUM="$OUT/summary.txt"; : > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE - $(elapsed) )); }
RESULTS=()
# phase NAME LOG LIMIT cmd...: runs cmd with a time limit (bounded by DEADLINE), appends to LOG,
# records status and seconds.
phase() {
  local name=$1 log=$2 limit=$3; shift 3
  local l; l=$(left)
  if [ "$l" -le 10 ]; then RESULTS+=("$name: SKIPPED (deadline)"); note "== $name: skipped (deadline)"; return 99; fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t rc; t=$(date +%s)
  echo "== $name (limit ${limit}s) $(date -u +%T)" | tee -a "$log"
  timeout -k 10 "$limit" "$@" >> "$log" 2>&1; rc=$?
  local s=$(( $(date +%s) - t )) st=PASS
  [ $rc -ne 0 ] && st="FAIL(rc=$rc)"; [ $rc -eq 124 ] && st="TIMEOUT"
  RESULTS+=("$name: $st ${s}s")
  note "== $name: $st in ${s}s (elapsed $(elapsed)s)"
  tail -n 4 "$log" | sed 's/^/   | /'
  return $rc
}

note "gpu_check $(date -u +%FT%TZ) on $(hostname) $(uname -m), tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
{ if command -v nvidia-smi >/dev/null; then nvidia-smi 2>&1; else echo "nvidia-smi: not available"; fi; } | tee -a "$SUM"
{ command -v nvcc >/dev/null && nvcc --version | tail -2; cmake --version | head -1
  g++ --version | head -1; command -v ninja >/dev/null && echo "ninja $(ninja --version)"
  (. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); ldd --version 2>&1 | head -1; } 2>&1 | tee -a "$SUM"

# --- 1. dependencies from the bundle -------------------------------------------------------------
MPI=ON
if [ "${FALLBACK:-0}" = 1 ]; then
  MPI=OFF; note "FALLBACK=1: MPI-off build only"
elif [ -d "$DEPS_DIR" ] && ls "$DEPS_DIR"/*.deb >/dev/null 2>&1; then
  if phase setup "$OUT/setup.log" 120 bash scripts/setup.sh --from "$DEPS_DIR" --prefix "$DEPS_PREFIX"; then
    set +u; . "$DEPS_PREFIX/env.sh"; set -u
    note "deps prefix $DEPS_PREFIX: mpiexec $(command -v mpiexec)"
    # shellcheck disable=SC2016
    phase mpi_smoke "$OUT/setup.log" 60 mpiexec "${MPIFLAGS[@]}" -n 2 sh -c 'echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE"' || MPI=OFF
  else MPI=OFF; fi
else
  note "no bundle in $DEPS_DIR (make it here with scripts/setup.sh --download .deps and carry .deps)"
  command -v mpiexec >/dev/null || MPI=OFF
fi

# --- 2. cuDNN / NCCL / cuBLAS: the toolkit's, else the ones PyTorch's wheels ship --------------
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_ROOT=$(dirname "$(dirname "$NVCC")")
SHIM=/tmp/st-cuda-shim; rm -rf "$SHIM"; mkdir -p "$SHIM/include" "$SHIM/lib"
NV=$(python3 -c 'import nvidia, sys; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
have_nccl=0
for pair in cudnn.h:cudnn nccl.h:nccl cublas_v2.h:cublas; do
  h=${pair%%:*} lib=${pair##*:}
  if ls "$CUDA_ROOT"/include/"$h" "$CUDA_ROOT"/targets/*/include/"$h" >/dev/null 2>&1; then
    note "cuda deps: $h in the toolkit"; [ "$lib" = nccl ] && have_nccl=1; continue
  fi
  hp=$([ -n "$NV" ] && find "$NV" -maxdepth 4 -name "$h" 2>/dev/null | head -1)
  if [ -z "$hp" ]; then note "cuda deps: $h not found (toolkit or python nvidia-* wheels)"; continue; fi
  inc=$(dirname "$hp"); libdir=$(dirname "$inc")/lib
  ln -sf "$inc/$lib"*.h "$SHIM/include/" 2>/dev/null
  for so in "$libdir/lib$lib"*.so.*; do
    [ -e "$so" ] || continue
    base=$(basename "$so"); ln -sf "$so" "$SHIM/lib/$base"; ln -sf "$so" "$SHIM/lib/${base%%.so.*}.so"
  done
  note "cuda deps: $h from $inc (shim $SHIM)"; [ "$lib" = nccl ] && have_nccl=1
done
export CPATH="$SHIM/include${CPATH:+:$CPATH}" LIBRARY_PATH="$SHIM/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$SHIM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:+$CMAKE_PREFIX_PATH:}$SHIM"
export CMAKE_INCLUDE_PATH="$SHIM/include${CMAKE_INCLUDE_PATH:+:$CMAKE_INCLUDE_PATH}"
export CMAKE_LIBRARY_PATH="${CMAKE_LIBRARY_PATH:+$CMAKE_LIBRARY_PATH:}$SHIM/lib"
export NCCL_ROOT="${NCCL_ROOT:-$SHIM}" CUDNN_ROOT="${CUDNN_ROOT:-$SHIM}"

# --- 3. configure + build ------------------------------------------------------------------------
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
launch=(); command -v ccache >/dev/null && launch=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
nccl=(); [ $have_nccl = 0 ] && nccl=(-DSHARDTENSOR_ENABLE_NCCL=OFF)
# (phase runs commands under timeout, so these are arrays, not shell functions)
conf_args() {  # $1 MPI ON/OFF -> CONF
  CONF=("${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" -DSHARDTENSOR_ENABLE_CUDA=ON
        -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DSHARDTENSOR_ENABLE_MPI="$1" -DSHARDTENSOR_CONSUMER_TESTS=OFF
        "${nccl[@]}" "${launch[@]}")
  # shellcheck disable=SC2206
  [ -n "${CMAKE_ARGS:-}" ] && CONF+=($CMAKE_ARGS)
}
keep_going=(); [ ${#gen[@]} -gt 0 ] && keep_going=(-- -k 0)   # build everything that builds
has_target() { cmake --build "$1" --target help 2>/dev/null | grep -qE "(^|[ .:])$2(:| |$)"; }

conf_args ON; rm -rf "$B"
if [ $MPI = ON ] && ! phase configure "$OUT/configure.log" 180 cmake -S "$ROOT" -B "$B" "${CONF[@]}"; then
  note "MPI build did not configure: falling back to SHARDTENSOR_ENABLE_MPI=OFF"; MPI=OFF
fi
if [ $MPI = ON ]; then
  phase build "$OUT/build.log" "$BUILD_TIMEOUT" cmake --build "$B" --parallel "$JOBS" "${keep_going[@]}"
  for x in shardtensor_tests shardtensor_cuda_tests shardtensor_mpi_tests shardtensor_cuda_mpi_tests; do
    if [ -x "$B/tests/$x" ]; then note "built: tests/$x"
    elif has_target "$B" "$x"; then note "NOT built: tests/$x (see build.log)"
    else note "no target $x in this tree"; fi
  done
fi

# --- 4. tests ------------------------------------------------------------------------------------
# tests/CMakeLists.txt: shardtensor_tests (serial CPU), shardtensor_cuda_tests (serial GPU),
# shardtensor_mpi_tests (MPI, CPU), shardtensor_cuda_mpi_tests (MPI + GPU); absent ones are skipped.
run_tests() {  # $1 build dir, $2 log: serial suites, the GPU one at 1 rank
  local bd=$1 log=$2
  [ -x "$bd/tests/shardtensor_tests" ] &&
    phase "serial tests" "$log" "$TEST_TIMEOUT" "$bd/tests/shardtensor_tests"
  [ -x "$bd/tests/shardtensor_cuda_tests" ] &&
    phase "cuda tests" "$log" "$TEST_TIMEOUT" "$bd/tests/shardtensor_cuda_tests"
  return 0
}
if [ $MPI = ON ]; then
  run_tests "$B" "$OUT/tests.log"
  cm="$B/tests/shardtensor_cuda_mpi_tests"
  [ -x "$cm" ] && phase "cuda mpi tests np1" "$OUT/tests.log" "$TEST_TIMEOUT" mpiexec "${MPIFLAGS[@]}" -n 1 "$cm"
  for np in $NPS; do   # ranks share the one GPU
    [ -x "$cm" ] &&
      phase "cuda mpi tests np$np" "$OUT/mpi_tests.log" "$TEST_TIMEOUT" mpiexec "${MPIFLAGS[@]}" -n "$np" "$cm"
    [ -x "$B/tests/shardtensor_mpi_tests" ] &&
      phase "mpi tests np$np" "$OUT/mpi_tests.log" "$TEST_TIMEOUT" mpiexec "${MPIFLAGS[@]}" -n "$np" "$B/tests/shardtensor_mpi_tests"
  done
fi

# --- 5. GPU benchmarks ---------------------------------------------------------------------------
if [ $MPI = ON ] && [ "${SKIP_BENCH:-0}" != 1 ]; then
  for s in "$ROOT"/bench/run_gpu*.sh; do
    [ -f "$s" ] || continue
    phase "bench $(basename "$s")" "$OUT/bench.log" "$BENCH_TIMEOUT" env BUILD_DIR="$B" bash "$s"
  done
fi

# --- 6. fallback: no MPI -------------------------------------------------------------------------
if [ $MPI = OFF ]; then
  FB="$B-nompi"
  conf_args OFF; rm -rf "$FB"
  if phase "configure (MPI off)" "$OUT/fallback.log" 180 cmake -S "$ROOT" -B "$FB" "${CONF[@]}"; then
    phase "build (MPI off)" "$OUT/fallback.log" "$BUILD_TIMEOUT" cmake --build "$FB" --parallel "$JOBS" "${keep_going[@]}"
    run_tests "$FB" "$OUT/fallback.log"
  fi
fi

# --- summary -------------------------------------------------------------------------------------
note ""; note "== summary (total $(elapsed)s, MPI=$MPI, CUDA arch $CUDA_ARCH)"
for r in "${RESULTS[@]}"; do note "  $r"; done
for f in "$OUT"/*.log; do   # keep each file under the 16 MiB return limit
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 15000000 ] && { tail -c 15000000 "$f" > "$f.t"; mv "$f.t" "$f"; }
done
fails=$(printf '%s\n' "${RESULTS[@]}" | grep -cvE ': PASS ' || true)
note "== $fails phase(s) not passed; logs in $OUT"
[ "$fails" -eq 0 ]

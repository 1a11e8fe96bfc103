#!/usr/bin/env bash
# The GPU machine's checks, in phases that each fit one device call (<= 600 s) and leave their
# work in the checkout for the next call (docs/building.md, "The GPU machine"):
#   gpu_check.sh build   unpack the offline bundle (.deps, carried; with .deps/cudnn-frontend for
#                        cuDNN attention, issue 32) with setup.sh --from,
#                        configure (CUDA on, sm_90) and build the CUDA targets only: the two GPU
#                        test binaries, the GPU benchmarks, unet_surrogate. Incremental: run it
#                        again if it ran out of time.
#   gpu_check.sh test    every CUDA test: shardtensor_cuda_tests (1 process), then
#                        shardtensor_cuda_mpi_tests at 1 rank and at 2, 3, 4 ranks sharing the GPU
#                        (the MPI fallback); checks that every tests/**/cuda_*.cpp,
#                        tests/**/mpi_cuda_*.cpp and test_cuda_tensor.cpp has test cases in the
#                        binary run, and that no test skipped for want of a GPU while one is
#                        visible. The CPU suite is not run here (CI runs it).
#   gpu_check.sh bench   bench/run_gpu_*.sh, each under a time budget (BENCH_ONLY="vit nbhd": those
#                        alone, in that order; default unet unet_small attention norm vit nbhd conv halo knn,
#                        then any other); one summary file with the GPU's name, the date and every
#                        ratio line the scripts print.
#   gpu_check.sh profile where the U-Net step's time goes (after `build`): the step of
#                        bench/run_gpu_unet.sh (1024^2, width 32, depth 3, batch 4, fp32, TF32 off;
#                        PROF_WARMUP=2 untimed then PROF_STEPS=4 timed steps) under
#                        SHARDTENSOR_PROFILE=1 (per-rank tables of the whole run in
#                        ours_profile_r0.txt) with --profile-window (the library's per-op table
#                        over the timed steps), and bench/torch_unet_gpu.py --profile (torch.profiler
#                        on one steady-state step of the same model). summary.txt: the steady-state
#                        ratio line, the two tables' top rows side by side (per step), then both
#                        tables in full.
#   gpu_check.sh list    (no GPU needed) the source check of `test` alone, against a build dir.
#   gpu_check.sh examples  unet / vit / fno / pointcloud_surrogate with --device cuda at 1, 2 and 4
#                        ranks sharing the GPU; each final_loss must agree with the example's
#                        --device cpu run to EX_REL (1e-4) (issue 31's acceptance; ~1 min).
#   gpu_check.sh all     build, test, examples, profile, bench in one call (what fits in DEADLINE).
# Device calls (the machine is warm for only ~30 s after a call: issue the next at once):
#   run(command="bash scripts/gpu_check.sh build", carry=[".deps"], timeout_s=600)
#   run(command="bash scripts/gpu_check.sh test", timeout_s=600)
#   run(command="bash scripts/gpu_check.sh profile", timeout_s=600)
#   run(command="bash scripts/gpu_check.sh bench", timeout_s=600)
# Each phase writes $OUT/summary.txt and at most 3 logs (8 files come back per call), prints a
# short summary at the end, and exits non-zero if a step did not pass.
# Knobs: OUT (logs; default gpu_check_out/<phase>)  GPU_WORK (build-gpu: build dir + deps prefix,
#   git-ignored, kept between calls)  DEPS_DIR (.deps)  JOBS (nproc)  CUDA_ARCH (90)  NPS ("1 2 3 4": rank counts of
#   the MPI binary)  SERIAL (1: run shardtensor_cuda_tests; 0: only the MPI binary)
#   BUILD_TIMEOUT (520 s)  TEST_TIMEOUT (240 s per binary run)  BENCH_BUDGET (130 s per script)
#   PROF_STEPS (4) PROF_WARMUP (2) PROF_BUDGET (240 s per side) PROF_ROWS (40) PYTHON (python3)
#   DEADLINE (570 s per phase; later steps are skipped past it)  FRESH=1 (wipe the build dir)
#   CMAKE_ARGS (extra configure args)  FALLBACK=1 (MPI off: no cuda_mpi_tests).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
PHASE="${1:-all}"
case "$PHASE" in build|test|examples|profile|bench|list|all) ;; *) echo "usage: $0 build|test|examples|profile|bench|list|all" >&2; exit 2 ;; esac
OUT="${OUT:-$ROOT/gpu_check_out/$PHASE}"; mkdir -p "$OUT"
W="${GPU_WORK:-$ROOT/build-gpu}"; mkdir -p "$W"
B="${BUILD_DIR:-$W/build}"
DEPS_DIR="${DEPS_DIR:-$ROOT/.deps}"
DEPS_PREFIX="${DEPS_PREFIX:-$W/deps}"   # not under .deps: a carried .deps replaces that folder
NCPU=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)   # nproc honours OMP_NUM_THREADS
JOBS="${JOBS:-$NCPU}"
CUDA_ARCH="${CUDA_ARCH:-90}"
NPS="${NPS:-1 2 3 4}"
BUILD_TIMEOUT="${BUILD_TIMEOUT:-520}"
TEST_TIMEOUT="${TEST_TIMEOUT:-240}"
BENCH_BUDGET="${BENCH_BUDGET:-130}"
DEADLINE="${DEADLINE:-570}"
[ "$PHASE" = all ] && DEADLINE="${DEADLINE_ALL:-$DEADLINE}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Root on the device; vader's single-copy (CMA/ptrace) is often refused inside containers. The
# OMPI_MCA_* variables also reach the mpiexec calls inside bench/run_gpu_*.sh.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
MPIFLAGS=(--oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && MPIFLAGS=(--allow-run-as-root "${MPIFLAGS[@]}")
CUDA_TEST_TARGETS=(shardtensor_cuda_tests shardtensor_cuda_mpi_tests)
BENCH_TARGETS=(bench_conv_gpu bench_attention_gpu bench_halo_gpu bench_norm_gpu bench_nbhd_gpu bench_vit unet_surrogate vit_surrogate fno_surrogate
               pointcloud_surrogate bench_dist_neighbors)

T0=$(date +%s)
SUM="$OUT/summary.txt"; : > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE - $(elapsed) )); }
RESULTS=()
# step NAME LOG LIMIT cmd...: runs cmd under a time limit (bounded by DEADLINE), appends its
# output to LOG, records PASS/FAIL/TIMEOUT and seconds.
step() {
  local name=$1 log=$2 limit=$3; shift 3
  local l; l=$(left)
  if [ "$l" -le 10 ]; then RESULTS+=("$name: SKIPPED (phase deadline ${DEADLINE}s)"); note "== $name: skipped (deadline)"; return 99; fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t rc; t=$(date +%s)
  echo "== $name (limit ${limit}s) $(date -u +%T)" | tee -a "$log"
  timeout -k 10 "$limit" "$@" >> "$log" 2>&1; rc=$?
  local s=$(( $(date +%s) - t )) st=PASS
  [ $rc -ne 0 ] && st="FAIL(rc=$rc)"; [ $rc -eq 124 ] || [ $rc -eq 137 ] && st="TIMEOUT"
  if [ $rc -eq 4 ] && [ "${CATCH_SKIP_RC:-0}" = 1 ]; then  # Catch2 (and mpi_main.cpp): every case skipped
    if gpu_visible; then st="FAIL(every test case skipped although a GPU is visible)"
    else st="PASS(every test case skipped: no GPU visible)"; rc=0; fi
  fi
  RESULTS+=("$name: $st ${s}s")
  note "== $name: $st in ${s}s (elapsed $(elapsed)s)"
  tail -n 4 "$log" | sed 's/^/   | /'
  return $rc
}
fail_note() { RESULTS+=("$1: FAIL"); note "== $1: FAIL"; }
has_target() {  # Makefiles: the help target lists it; Ninja: build.ninja has a rule for it
  grep -qE "^(build )?$1:" "$B/build.ninja" "$B/Makefile" 2>/dev/null ||
    cmake --build "$B" --target help 2>/dev/null | grep -qE "(^|[ .:])$1(:| |$)"
}
gpu_visible() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

note "gpu_check $PHASE $(date -u +%FT%TZ) on $(hostname) $(uname -m), tree $(git rev-parse --short HEAD 2>/dev/null || echo '?'), build dir $B"
if [ "$PHASE" = build ] || [ "$PHASE" = all ]; then
  { if command -v nvidia-smi >/dev/null; then nvidia-smi 2>&1; else echo "nvidia-smi: not available"; fi; } | tee -a "$SUM"
  { command -v nvcc >/dev/null && nvcc --version | tail -2; cmake --version | head -1
    g++ --version | head -1; command -v ninja >/dev/null && echo "ninja $(ninja --version)"
    (. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); ldd --version 2>&1 | head -1; } 2>&1 | tee -a "$SUM"
elif [ "$PHASE" != list ]; then
  note "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none visible)"
fi

# --- dependencies: the bundle's prefix (made by `build`, reused by later phases) -----------------
# state file: MPI=ON|OFF as configured by `build`
STATE="$W/state"
deps_env() {
  if [ -f "$DEPS_PREFIX/env.sh" ]; then set +u; . "$DEPS_PREFIX/env.sh"; set -u; return 0; fi
  return 1
}
setup_deps() {  # unpack .deps into the prefix unless done; 0 when env.sh is sourced
  deps_env && { note "deps: $DEPS_PREFIX (already unpacked)"; return 0; }
  if [ -d "$DEPS_DIR" ] && ls "$DEPS_DIR"/*.deb >/dev/null 2>&1; then
    step setup "$OUT/setup.log" 150 bash scripts/setup.sh --from "$DEPS_DIR" --prefix "$DEPS_PREFIX" && deps_env
    return
  fi
  note "no bundle in $DEPS_DIR (make it here with scripts/setup.sh --download .deps and carry .deps)"
  return 1
}

# --- cuDNN / NCCL / cuBLAS: the toolkit's, else the ones PyTorch's wheels ship ------------------
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_ROOT=$(dirname "$(dirname "$NVCC")")
SHIM="$W/cuda-shim"
have_nccl=0
cuda_shim() {  # quiet=1: no notes (later phases only need the library path)
  rm -rf "$SHIM"; mkdir -p "$SHIM/include" "$SHIM/lib"
  local NV pair h lib hp inc libdir so base
  NV=$(python3 -c 'import nvidia, sys; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
  for pair in cudnn.h:cudnn nccl.h:nccl cublas_v2.h:cublas; do
    h=${pair%%:*} lib=${pair##*:}
    if ls "$CUDA_ROOT"/include/"$h" "$CUDA_ROOT"/targets/*/include/"$h" >/dev/null 2>&1; then
      [ "${1:-0}" = 1 ] || note "cuda deps: $h in the toolkit"; [ "$lib" = nccl ] && have_nccl=1; continue
    fi
    hp=$([ -n "$NV" ] && find "$NV" -maxdepth 4 -name "$h" 2>/dev/null | head -1)
    if [ -z "$hp" ]; then [ "${1:-0}" = 1 ] || note "cuda deps: $h not found (toolkit or python nvidia-* wheels)"; continue; fi
    inc=$(dirname "$hp"); libdir=$(dirname "$inc")/lib
    ln -sf "$inc/$lib"*.h "$SHIM/include/" 2>/dev/null
    for so in "$libdir/lib$lib"*.so.*; do
      [ -e "$so" ] || continue
      base=$(basename "$so"); ln -sf "$so" "$SHIM/lib/$base"; ln -sf "$so" "$SHIM/lib/${base%%.so.*}.so"
    done
    [ "${1:-0}" = 1 ] || note "cuda deps: $h from $inc (shim $SHIM)"; [ "$lib" = nccl ] && have_nccl=1
  done
  export CPATH="$SHIM/include${CPATH:+:$CPATH}" LIBRARY_PATH="$SHIM/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$SHIM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:+$CMAKE_PREFIX_PATH:}$SHIM"
  export CMAKE_INCLUDE_PATH="$SHIM/include${CMAKE_INCLUDE_PATH:+:$CMAKE_INCLUDE_PATH}"
  export CMAKE_LIBRARY_PATH="${CMAKE_LIBRARY_PATH:+$CMAKE_LIBRARY_PATH:}$SHIM/lib"
  export NCCL_ROOT="${NCCL_ROOT:-$SHIM}" CUDNN_ROOT="${CUDNN_ROOT:-$SHIM}"
}

# --- the source check: every CUDA test source has test cases in the binary that is run ----------
# Catch2 v3 `--list-tests -v high` prints each case's file:line; compare with the sources.
check_sources() {
  local expect got missing=0 f bin
  expect=$( (cd "$ROOT" && ls tests/*/cuda_*.cpp tests/*/mpi_cuda_*.cpp tests/tensor/test_cuda_tensor.cpp 2>/dev/null) | sort -u)
  got=""
  for bin in "$B/tests/shardtensor_cuda_tests" "$B/tests/shardtensor_cuda_mpi_tests"; do
    [ -x "$bin" ] || { note "sources: $bin not built"; continue; }
    # the MPI binary lists without mpiexec (singleton MPI_Init)
    got+=$(timeout 60 "$bin" --list-tests -v high 2>/dev/null | grep -oE "tests/[a-z_]+/[A-Za-z0-9_]+\.cpp" | sort -u)$'\n'
  done
  for f in $expect; do
    if grep -qx "$f" <<<"$got"; then note "  source ok: $f ($(grep -c . <<<"$(echo "$got" | grep -x "$f")") binary)"
    else note "  source MISSING from the binaries: $f"; missing=1; fi
  done
  for f in $(echo "$got" | grep -v '^$' | sort -u); do
    grep -qx "$f" <<<"$expect" || note "  extra source in a CUDA binary: $f"
  done
  if [ $missing = 0 ]; then RESULTS+=("sources: PASS ($(wc -w <<<"$expect") CUDA test sources, each in a binary)")
  else RESULTS+=("sources: FAIL (a CUDA test source has no test case in the binaries)"); fi
  return $missing
}

# --- phases --------------------------------------------------------------------------------------
phase_build() {
  local MPI=ON
  if [ "${FALLBACK:-0}" = 1 ]; then MPI=OFF; note "FALLBACK=1: MPI-off build"
  elif setup_deps; then
    note "deps prefix $DEPS_PREFIX: mpiexec $(command -v mpiexec)"
    # shellcheck disable=SC2016
    step mpi_smoke "$OUT/setup.log" 60 mpiexec "${MPIFLAGS[@]}" -n 2 sh -c 'echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE"' || MPI=OFF
  else
    command -v mpiexec >/dev/null || MPI=OFF
  fi
  cuda_shim
  local gen=() launch=() nccl=() conf
  command -v ninja >/dev/null && gen=(-G Ninja)
  command -v ccache >/dev/null && launch=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  [ $have_nccl = 0 ] && nccl=(-DSHARDTENSOR_ENABLE_NCCL=OFF)
  conf=("${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" -DSHARDTENSOR_ENABLE_CUDA=ON
        -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DSHARDTENSOR_CONSUMER_TESTS=OFF "${nccl[@]}" "${launch[@]}")
  # cudnn-frontend (issue 32: bf16/f16 attention on cuDNN SDPA): ../shared does not travel to the
  # device; copy it into the carried bundle (cp -r ../shared/third_party/cudnn-frontend .deps/).
  local fe="${CUDNN_FRONTEND_DIR:-$DEPS_DIR/cudnn-frontend/include}"
  [ -f "$fe/cudnn_frontend.h" ] && conf+=(-DSHARDTENSOR_CUDNN_FRONTEND_DIR="$fe")
  # shellcheck disable=SC2206
  [ -n "${CMAKE_ARGS:-}" ] && conf+=($CMAKE_ARGS)
  [ "${FRESH:-0}" = 1 ] && rm -rf "$B"
  if [ -f "$B/CMakeCache.txt" ] && [ -f "$STATE" ] && grep -qx "MPI=$MPI" "$STATE"; then
    note "build dir $B already configured ($(cat "$STATE")): building incrementally (FRESH=1 to start over)"
    if [ -f "$fe/cudnn_frontend.h" ] && ! grep -qx "SHARDTENSOR_CUDNN_FRONTEND_DIR:PATH=$fe" "$B/CMakeCache.txt"; then
      step "configure (cudnn-frontend)" "$OUT/configure.log" 120 cmake "$B" -DSHARDTENSOR_CUDNN_FRONTEND_DIR="$fe" || return 1
    fi
  else
    rm -rf "$B"
    if ! step configure "$OUT/configure.log" 180 cmake -S "$ROOT" -B "$B" "${conf[@]}" -DSHARDTENSOR_ENABLE_MPI="$MPI"; then
      [ $MPI = OFF ] && return 1
      note "MPI build did not configure: falling back to SHARDTENSOR_ENABLE_MPI=OFF"; MPI=OFF; rm -rf "$B"
      step "configure (MPI off)" "$OUT/configure.log" 180 cmake -S "$ROOT" -B "$B" "${conf[@]}" -DSHARDTENSOR_ENABLE_MPI=OFF || return 1
    fi
    echo "MPI=$MPI" > "$STATE"
  fi
  local fed; fed=$(sed -n 's/^SHARDTENSOR_CUDNN_FRONTEND_DIR:PATH=//p' "$B/CMakeCache.txt" 2>/dev/null)
  if [ -n "$fed" ] && [ -f "$fed/cudnn_frontend.h" ]; then
    note "cuDNN attention: on (cudnn-frontend $fed)"
  else
    note "cuDNN attention: OFF (no cudnn-frontend: cp -r ../shared/third_party/cudnn-frontend .deps/ and carry .deps)"
  fi
  local targets=() t keep=()
  for t in "${CUDA_TEST_TARGETS[@]}" "${BENCH_TARGETS[@]}"; do
    if has_target "$t"; then targets+=("$t"); else note "no target $t in this configuration"; fi
  done
  [ ${#gen[@]} -gt 0 ] && keep=(-- -k 0)   # Ninja: build everything that builds
  step build "$OUT/build.log" "$BUILD_TIMEOUT" cmake --build "$B" --parallel "$JOBS" --target "${targets[@]}" "${keep[@]}"
  local rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && note "build ran out of time: run 'gpu_check.sh build' again (incremental)"
  for t in "${targets[@]}"; do
    local p; p=$(find "$B" -maxdepth 3 -type f -name "$t" -perm -u+x 2>/dev/null | head -1)
    if [ -n "$p" ]; then note "built: ${p#"$B"/}"; else note "NOT built: $t (see build.log)"; fi
  done
  return $rc
}

phase_test() {
  [ -x "$B/tests/shardtensor_cuda_tests" ] || {
    note "no $B/tests/shardtensor_cuda_tests: run 'gpu_check.sh build' first (a machine given back between calls starts bare)"
    fail_note "cuda tests"; return 1; }
  deps_env || setup_deps || note "no deps prefix: MPI runs use the system's mpiexec, if any"
  cuda_shim 1
  check_sources
  local log="$OUT/tests.log" mlog="$OUT/mpi_tests.log" cm="$B/tests/shardtensor_cuda_mpi_tests" np
  export CATCH_SKIP_RC=1
  if [ "${SERIAL:-1}" = 1 ]; then
    step "cuda tests" "$log" "$TEST_TIMEOUT" "$B/tests/shardtensor_cuda_tests" --colour-mode none
    note "   $(grep -E '^(test cases|All tests passed)' "$log" | tail -1)"
    # issue 32: the [cudnn][attention] cases must have run cuDNN's SDPA, not the fallback
    if gpu_visible && grep -q "built without cudnn-frontend" "$log"; then
      RESULTS+=("cudnn attention: FAIL (built without cudnn-frontend: carry .deps/cudnn-frontend, build again)")
    fi
    grep -E "^shardtensor: cuDNN attention" "$log" | sort -u | head -20 | while read -r l; do note "   $l"; done
    # issue 30 item 5: cuDNN's bf16 / f16 conv against its f32 result, per pass (tests/exec/cuda_lowp_libraries.cpp)
    grep -E "^cuda conv (bf16|f16) case" "$log" | sort -u | head -8 | while read -r l; do note "   $l"; done
    # issue 32 items 2-3: which attention cases ran on the wmma kernels (tests' WARN lines)
    grep -hE "(attention|neighbourhood attention) cases on the tensor-core kernels|attention on the tensor cores:" \
      "$log" | sort -u | head -6 | while read -r l; do note "   $l"; done
    # issue 32 item 2: the wmma attention kernels on every case, cuDNN off (f16 / bf16 / TF32)
    step "cuda tests [tc], cuDNN attention off" "$OUT/tc_tests.log" 300 \
      env SHARDTENSOR_CUDNN_ATTENTION=0 "$B/tests/shardtensor_cuda_tests" "[tc]" --colour-mode none
    note "   $(grep -E '^(test cases|All tests passed)' "$OUT/tc_tests.log" | tail -1)"
    grep -E "attention on the tensor cores:|f16 attention cases on the tensor-core" "$OUT/tc_tests.log" | sort -u | head -4 |
      while read -r l; do note "   $l"; done
  fi
  if [ -x "$cm" ]; then
    for np in $NPS; do   # ranks share the one GPU: device communication falls back to MPI
      step "cuda mpi tests np$np" "$mlog" "$TEST_TIMEOUT" mpiexec "${MPIFLAGS[@]}" -n "$np" "$cm" --colour-mode none
      note "   $(grep -E '^(test cases|All tests passed)' "$mlog" | tail -1)"
    done
  else
    note "no $cm (MPI off in this build: $(cat "$STATE" 2>/dev/null))"
  fi
  if gpu_visible && grep -qiE "no CUDA device visible|GPU tests skipped" "$log" "$mlog" 2>/dev/null; then
    RESULTS+=("skips: FAIL (tests skipped for want of a GPU while nvidia-smi lists one)")
    note "== tests skipped although a GPU is visible: $(cat "$log" "$mlog" 2>/dev/null | grep -ciE 'no CUDA device visible') skip messages"
  elif ! gpu_visible; then
    note "== no GPU visible: the CUDA tests skip with a message (that is the expected result off the GPU machine)"
  fi
}

# The examples on the GPU (issue 31's acceptance): each trains with --device cuda at 1, 2 and 4
# ranks sharing the GPU, and its final_loss must agree with the same example's --device cpu run at
# 1 rank to EX_REL (fp32, TF32 off: the examples' default). Small sizes: a minute in all.
EX_REL="${EX_REL:-1e-4}"
example_runs() {  # one line per example: name|flags|extra flags of the cuda runs only|tolerance (default EX_REL)
  # bf16 ViT runs (issue 32): attention on cuDNN / the wmma kernels, which round P and dS to bf16,
  # against the CPU's bf16 run (f32 working copies): a loose bound, bf16 training noise over 10 steps
  cat <<'EXR'
unet_surrogate|--steps 20 --grid 32 --width 8 --depth 2 --seed 3 --log-every 10
unet_surrogate|--steps 20 --grid 32 --width 8 --depth 2 --seed 3 --log-every 10|--cuda-graph
vit_surrogate|--steps 10 --seed 3 --log-every 5|--cuda-graph
fno_surrogate|--steps 10 --seed 3 --log-every 5|--cuda-graph
vit_surrogate|--steps 10 --seed 3 --log-every 5
fno_surrogate|--steps 10 --seed 3 --log-every 5
pointcloud_surrogate|--steps 20 --points 3000 --grid 8 --seed 1 --log-every 10
vit_surrogate|--steps 10 --seed 3 --log-every 5 --precision bf16 --dim 32 --heads 4||5e-2
vit_surrogate|--steps 10 --seed 3 --log-every 5 --precision bf16 --dim 32 --heads 4 --attention neighborhood||5e-2
EXR
}
phase_examples() {
  deps_env || setup_deps || note "no deps prefix: MPI runs use the system's mpiexec, if any"
  cuda_shim 1
  local log="$OUT/examples.log" name flags exe ref loss np rel ok
  local cflags tol
  while IFS='|' read -r name flags cflags tol; do
    tol=${tol:-$EX_REL}
    exe="$B/examples/$name"
    [ -x "$exe" ] || { note "no $exe: run 'gpu_check.sh build' first"; fail_note "example $name"; continue; }
    # shellcheck disable=SC2086
    step "example $name cpu np1" "$log" 120 mpiexec "${MPIFLAGS[@]}" -n 1 "$exe" $flags --device cpu || continue
    ref=$(grep -o 'final_loss=[^ ]*' "$log" | tail -1 | cut -d= -f2)
    for np in 1 2 4; do
      # shellcheck disable=SC2086
      step "example $name $cflags cuda np$np" "$log" 120 mpiexec "${MPIFLAGS[@]}" -n "$np" "$exe" $flags $cflags --device cuda || continue
      [ -z "$cflags" ] || note "   $(grep '^cuda graph:' "$log" | tail -2 | tr '\n' ' ')"
      loss=$(grep -o 'final_loss=[^ ]*' "$log" | tail -1 | cut -d= -f2)
      rel=$(awk -v a="$loss" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; printf "%.3g", (m > 0 ? d / m : d) }')
      ok=$(awk -v r="$rel" -v t="$tol" 'BEGIN { print (r <= t) ? "agrees" : "DIFFERS" }')
      note "   $name $flags $cflags np$np cuda final_loss=$loss, cpu np1 $ref: relative $rel ($ok, tolerance $tol)"
      [ "$ok" = agrees ] || RESULTS+=("example $name $cflags cuda np$np: FAIL (final_loss $loss vs cpu $ref, relative $rel)")
    done
  done < <(example_runs)
}

# The U-Net step of bench/run_gpu_unet.sh, profiled on both sides (see the header). The summary's
# side-by-side view parses our table loosely: the first line naming a "calls" column is the
# header, columns are split at runs of 2+ spaces or '|', the device-time column is the first whose
# header says "device", the label is the header's name/pass columns (or the first column); rows
# that do not parse are left out of the side-by-side view but kept in the full table below it.
phase_profile() {
  local ex="$B/examples/unet_surrogate"
  [ -x "$ex" ] || { note "no $ex: run 'gpu_check.sh build' first"; fail_note profile; return 1; }
  deps_env || setup_deps || note "no deps prefix: MPI runs use the system's mpiexec, if any"
  cuda_shim 1
  local steps="${PROF_STEPS:-4}" warm="${PROF_WARMUP:-2}" budget="${PROF_BUDGET:-240}" rows="${PROF_ROWS:-40}"
  local py="${PYTHON:-python3}" ours="$OUT/ours.log" torch="$OUT/torch.log" rc=0
  local cfg=(--grid 1024 --width 32 --depth 3 --batch 4)
  rm -f "$OUT"/ours_profile_r*.txt
  step "profile ours" "$ours" "$budget" env SHARDTENSOR_PROFILE=1 SHARDTENSOR_PROFILE_FILE="$OUT/ours_profile_r%r.txt" \
    mpiexec "${MPIFLAGS[@]}" -n 1 "$ex" --device cuda "${cfg[@]}" --samples 4 --steps "$((steps + warm))" \
    --warmup "$warm" --log-every "$((steps + warm))" --profile-window || rc=1
  step "profile torch" "$torch" "$budget" "$py" "$ROOT/bench/torch_unet_gpu.py" "${cfg[@]}" --steps "$steps" \
    --warmup "$warm" --profile --profile-rows "$rows" || rc=1
  local ps="$OUT/profile_summary.txt"
  "$py" - "$ours" "$torch" "$steps" "$warm" "$rows" > "$ps" 2>&1 <<'PY' || rc=1
import re, sys
ours_log, torch_log, steps, warm, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def read(p):
    try:
        return open(p, errors="replace").read()
    except OSError:
        return ""
o, t = read(ours_log), read(torch_log)
def block(text, start, end):
    m = re.search(re.escape(start) + r"[^\n]*\n(.*?)^" + re.escape(end), text, re.S | re.M)
    return m.group(1) if m else ""
def num(pat, s):
    m = re.search(pat, s)
    return float(m.group(1)) if m else None
steady = next((l for l in o.splitlines() if l.startswith("steady state:")), "")
tline = next((l for l in t.splitlines() if l.startswith("torch_unet ")), "")
kv = dict(f.split("=", 1) for f in tline.split()[1:] if "=" in f)
os_, ts = num(r"([0-9.]+) s/step", steady), float(kv["s_per_step"]) if "s_per_step" in kv else None
og, tg = num(r"steady state ([0-9.]+) MiB\)", steady), float(kv["peak_mib"]) if "peak_mib" in kv else None
print(f"U-Net step 1024^2, width 32, depth 3, batch 4, fp32, TF32 off; {steps} timed steps after {warm} warm-up")
print("ours : " + (steady or "(no 'steady state:' line: see ours.log)"))
print("torch: " + (tline or "(no 'torch_unet' line: see torch.log)"))
if os_ and ts:
    mem = f"; GPU peak steady state ours {og:.1f} MiB, torch {tg:.1f} MiB (ours/torch {og / tg:.3f})" if og and tg else ""
    print(f"ratio (steady state): shardtensor {os_ * 1e3:.2f} ms/step, torch {ts * 1e3:.2f} ms/step, speed ratio "
          f"torch/ours {ts / os_:.3f}{mem}")
else:
    print("ratio (steady state): not measured (a side did not finish)")

ours_table = block(o, "=== shardtensor profile", "=== end shardtensor profile")
torch_table = block(t, "=== torch.profiler", "=== end torch.profiler")
# ours: rows (label, calls, host ms per step, device ms per step). Leading columns are read from
# the left (label columns, then calls, then host time), the device-time column from the right
# (its place among the trailing columns), so a header whose neighbouring titles are one space
# apart ("host us host us/call") does not shift it; "-" reads as 0.
def parse_ours(table):
    lines = table.splitlines()
    hi = next((i for i, l in enumerate(lines) if re.search(r"\bcalls\b", l, re.I)), None)
    if hi is None:
        return []
    split = lambda l: [c.strip() for c in re.split(r"\s{2,}|\|", l.strip()) if c.strip()]
    head = [h.lower() for h in split(lines[hi])]
    calls = next((i for i, h in enumerate(head) if h == "calls" or h.startswith("calls")), None)
    if calls is None:
        return []
    dev = next((i for i, h in enumerate(head) if h.startswith("device") or " device" in h), None)
    dev_right = len(head) - dev if dev is not None else None
    host = calls + 1 if calls + 1 < len(head) and "host" in head[calls + 1] else None
    def val(x):
        try:
            return float(x.split()[0])
        except (ValueError, IndexError):
            return 0.0
    out = []
    for l in lines[hi + 1:]:
        c = split(l)
        if len(c) < calls + 2 or not c[calls].isdigit():
            continue
        label = " ".join(c[:calls]) if calls else c[0]
        d = val(c[-dev_right]) if dev_right and dev_right <= len(c) - calls - 1 else 0.0
        h = val(c[host]) / 1e3 if host is not None and host < len(c) else 0.0
        out.append((label, c[calls], h / max(steps, 1), d / max(steps, 1)))
    return sorted(out, key=lambda r: (-r[3], -r[2]))
def parse_torch(text):
    out = []
    for l in text.splitlines():
        m = re.match(r"TORCH_PROF device_ms ([0-9.]+) cpu_ms ([0-9.]+) calls (\d+) name (.*)", l)
        if m:
            out.append((m.group(4), m.group(3), float(m.group(1))))
    return out
ro, rt = parse_ours(ours_table), parse_torch(t)
W = 40
print()
print(f"side by side, ms per step (ours: the library's table over the {steps} timed steps / {steps}, sorted by device "
      f"then host time; torch: one step, device time; torch rows overlap: an aten op's time includes its kernels')")
print(f"{'ours (category family/pass)':{W}s} {'calls':>6s} {'host ms':>9s} {'dev ms':>9s} | "
      f"{'torch (op or kernel)':{W}s} {'calls':>6s} {'dev ms':>9s}")
print("-" * (2 * W + 48))
for i in range(min(max(len(ro), len(rt)), rows)):
    a = ro[i] if i < len(ro) else None
    b = rt[i] if i < len(rt) else ("", "", None)
    fa = f"{a[0][:W]:{W}s} {a[1]:>6s} {a[2]:9.3f} {a[3]:9.3f}" if a is not None else " " * (W + 27)
    fb = f"{b[0][:W]:{W}s} {b[1]:>6s} {b[2]:9.3f}" if b[2] is not None else ""
    print(f"{fa} | {fb}")
if not ro:
    print("(our table did not parse: see the full table below)")
print()
print(f"== shardtensor: the library's table over the {steps} timed steps (--profile-window, rank 0)")
print(ours_table or "(none: see ours.log)")
print("== torch.profiler: one steady-state step, key_averages(sort_by='cuda_time_total')")
print(torch_table or "(none: see torch.log)")
PY
  note ""; note "== profile summary ($ps):"; cat "$ps" >> "$SUM"; cat "$ps"
  local f
  for f in "$OUT"/ours_profile_r*.txt; do
    [ -f "$f" ] && note "whole-run table (SHARDTENSOR_PROFILE=1, warm-up and algorithm search included): $f"
  done
  if [ $rc = 0 ]; then RESULTS+=("profile: PASS"); else RESULTS+=("profile: FAIL (see ours.log, torch.log)"); fi
  return $rc
}

phase_bench() {
  [ -d "$B/bench" ] || { note "no $B/bench: run 'gpu_check.sh build' first"; fail_note bench; return 1; }
  deps_env || setup_deps || note "no deps prefix: MPI runs use the system's mpiexec, if any"
  cuda_shim 1
  local bs="$OUT/bench_summary.txt" s name blog="$OUT/bench.log"
  { echo "GPU benchmarks $(date -u +%FT%TZ), tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none visible)"
    echo "host: $NCPU cores, load $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$bs"
  # BENCH_ONLY: the scripts to run, in order (names without run_gpu_ / .sh); default: the open
  # issues' headline measurements first (past DEADLINE the rest are skipped), then any other
  local order="${BENCH_ONLY:-unet unet_small attention norm vit nbhd conv halo knn}" scripts=() n
  for n in $order; do scripts+=("$ROOT/bench/run_gpu_$n.sh"); done
  if [ -z "${BENCH_ONLY:-}" ]; then
    for s in "$ROOT"/bench/run_gpu_*.sh; do
      case " ${scripts[*]} " in *" $s "*) ;; *) scripts+=("$s") ;; esac
    done
  fi
  for s in "${scripts[@]}"; do
    [ -f "$s" ] || { note "no $s"; continue; }
    name=$(basename "$s" .sh)
    local before; before=$(wc -l < "$blog" 2>/dev/null || echo 0)
    step "bench $name" "$blog" "$BENCH_BUDGET" env BUILD_DIR="$B" bash "$s"
    # every table row and ratio line the script printed, under its name
    { echo; echo "## $name ($(printf '%s\n' "${RESULTS[@]}" | grep "bench $name:" | tail -1 | sed 's/^[^:]*: //'))"
      tail -n +"$((before + 1))" "$blog" | grep -E '^\||ratio|^case |^RESULT |SKIP|cuda graph' || echo "(no table: see bench.log)"; } >> "$bs"
  done
  note ""; note "== bench summary ($bs):"; sed 's/^/   /' "$bs" | tee -a "$SUM" >/dev/null; cat "$bs"
}

case "$PHASE" in
  build) phase_build ;;
  test) phase_test ;;
  examples) phase_examples ;;
  profile) phase_profile ;;
  bench) phase_bench ;;
  list) check_sources ;;
  all) phase_build && phase_test; phase_examples; phase_profile; phase_bench ;;
esac

# --- summary -------------------------------------------------------------------------------------
note ""; note "== gpu_check $PHASE: summary (total $(elapsed)s, CUDA arch $CUDA_ARCH, $(cat "$STATE" 2>/dev/null || echo 'not configured'))"
for r in "${RESULTS[@]}"; do note "  $r"; done
for f in "$OUT"/*.log; do   # keep each file under the 16 MiB return limit
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 15000000 ] && { tail -c 15000000 "$f" > "$f.t"; mv "$f.t" "$f"; }
done
fails=$(printf '%s\n' "${RESULTS[@]}" | grep -cvE ': PASS' || true)
note "== $fails step(s) not passed; logs in $OUT"
[ "$fails" -eq 0 ]

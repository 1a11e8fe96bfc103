#!/usr/bin/env bash
# The GPU simulator lane: runs the project's CUDA kernels and runtime glue on the CPU in GPGPU-Sim
# (functional mode). Not part of CI (slow, and CI has no simulator source). docs/building.md,
# section "GPU simulator lane", explains it.
#
#   scripts/gpusim.sh [SIM_SRC]        (or GPUSIM_SRC=... scripts/gpusim.sh)
#
# SIM_SRC: an extracted GPGPU-Sim source tree, e.g. the accel-sim dev snapshot:
#   git --git-dir=<mirror of github.com/accel-sim/gpgpu-sim_distribution> archive dev | tar -x -C SIM_SRC
# Steps (each skipped when already done):
#   1. apt: Debian non-free (nvidia-cuda-toolkit 11.8, signed-by the Debian archive key), g++-11,
#      bison, flex, zlib1g-dev, xutils-dev;
#   2. the simulator: a copy of SIM_SRC under $GPUSIM_WORK/sim with scripts/gpusim/gpgpu-sim.patch
#      applied, built against CUDA 11.8 (CUDA 13's ptxas rejects sm_70; the snapshot predates 12);
#   3. the project for the simulator in build-gpusim/: nvcc 11.8, -cudart shared, PTX for
#      compute_70 only (SHARDTENSOR_GPUSIM=ON: no cuDNN/cuBLAS/NCCL; tests/gpusim);
#   4. ctest -L gpusim: every test in a scratch folder, per-test results and times, and a last
#      line "N passed, M failed" (tests that need cuDNN/cuBLAS/NCCL are reported as skipped).
# Environment: GPUSIM_SRC, GPUSIM_WORK (default: build-gpusim/sim-work), GPUSIM_BUILD (default:
# build-gpusim), GPUSIM_JOBS (default 2), GPUSIM_TESTS (a ctest -R regex, default all).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC=${1:-${GPUSIM_SRC:-}}
BUILD=${GPUSIM_BUILD:-$ROOT/build-gpusim}
WORK=${GPUSIM_WORK:-$BUILD/sim-work}
JOBS=${GPUSIM_JOBS:-2}
PATCH=$ROOT/scripts/gpusim/gpgpu-sim.patch
[ -n "$SRC" ] && [ -d "$SRC" ] || { echo "usage: scripts/gpusim.sh SIM_SRC (or GPUSIM_SRC=...)" >&2; exit 2; }
SRC=$(cd "$SRC" && pwd)
mkdir -p "$WORK"
t0=$(date +%s)
step() { echo "== gpusim: $* ($(( $(date +%s) - t0 )) s)"; }

# ---- 1. packages
step "packages"
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
if ! dpkg -s nvidia-cuda-toolkit >/dev/null 2>&1; then
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  uri=${uri:-http://deb.debian.org/debian}
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri bookworm contrib non-free" |
    $SUDO tee /etc/apt/sources.list.d/gpusim-nonfree.list >/dev/null
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends nvidia-cuda-toolkit >/dev/null
fi
need=()
for p in g++-11 bison flex zlib1g-dev xutils-dev; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
[ ${#need[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null

# A CUDA_INSTALL_PATH of symlinks over Debian's split 11.8 layout (the simulator's build and its
# cuobjdump calls at run time both use it).
C=$WORK/cuda118
mkdir -p "$C/bin"
for f in /usr/lib/nvidia-cuda-toolkit/bin/*; do ln -sf "$f" "$C/bin/"; done
for t in cuobjdump ptxas nvdisasm fatbinary nvlink; do [ -e /usr/bin/$t ] && ln -sf /usr/bin/$t "$C/bin/$t"; done
ln -sfn /usr/include "$C/include"
ln -sfn "/usr/lib/$(gcc -print-multiarch)" "$C/lib64"
SIMPATH=$C/bin:/usr/lib/ccache:/usr/bin:/bin  # never CUDA 13's tools

# ---- 2. the simulator (patched copy of SIM_SRC)
SIM=$WORK/sim
stamp="$(sha1sum "$PATCH" | cut -c1-12) $SRC"
if [ "$(cat "$SIM/.shardtensor-patch" 2>/dev/null)" != "$stamp" ]; then
  step "copying the simulator source and applying $(basename "$PATCH")"
  rm -rf "$SIM"; mkdir -p "$SIM"
  (cd "$SRC" && tar -c --exclude=./build --exclude=./lib --exclude=.git .) | tar -x -C "$SIM"
  if ! patch -d "$SIM" -p1 --quiet --forward --dry-run <"$PATCH" >/dev/null 2>&1; then
    echo "scripts/gpusim.sh: $(basename "$PATCH") does not apply to $SRC: give the unpatched" \
      "simulator source (a tree that already carries this patch, or an older one, cannot take it)" >&2
    exit 1
  fi
  patch -d "$SIM" -p1 --quiet --forward <"$PATCH"
  # The simulator's build stamps a git revision into the library: give the copy a repository.
  (cd "$SIM" && git init -q && git add -A >/dev/null &&
    git -c user.email=gpusim@local -c user.name=gpusim commit -qm "GPGPU-Sim + shardtensor patch" >/dev/null)
  echo "$stamp" >"$SIM/.shardtensor-patch"
fi
LIBDIR=$(find "$SIM/lib" -name libcudart.so.11.0 -printf '%h\n' 2>/dev/null | head -1 || true)
if [ -z "$LIBDIR" ] || [ "$(find "$SIM/libcuda" "$SIM/src" -newer "$LIBDIR/libcudart.so" -type f -name '*.[chly]*' | head -1)" ]; then
  step "building the simulator (-j$JOBS, a few minutes)"
  (cd "$SIM" && export CUDA_INSTALL_PATH=$C PATH=$SIMPATH &&
    bash -c "source setup_environment release >/dev/null && make -j$JOBS >make.log 2>&1") ||
    { tail -30 "$SIM/make.log"; exit 1; }
  LIBDIR=$(find "$SIM/lib" -name libcudart.so.11.0 -printf '%h\n' | head -1)
fi
echo "simulator libcudart: $LIBDIR"
CFG=$WORK/config
mkdir -p "$CFG"
cp "$SIM"/configs/tested-cfgs/SM7_QV100/* "$CFG"/
sed -i 's/^-gpgpu_ptx_sim_mode 0/-gpgpu_ptx_sim_mode 1/' "$CFG/gpgpusim.config"   # functional only
grep -q '^-gpgpu_ptx_sim_mode 1' "$CFG/gpgpusim.config"

# ---- 3. the project's CUDA tests for the simulator
step "configuring and building $BUILD (-j$JOBS)"
export PATH=$C/bin:/usr/lib/ccache:$PATH
configure() {
  cmake -S "$ROOT" -B "$BUILD" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release \
    -DSHARDTENSOR_GPUSIM=ON -DSHARDTENSOR_ENABLE_CUDA=ON -DSHARDTENSOR_ENABLE_NCCL=OFF \
    -DSHARDTENSOR_ENABLE_HDF5=OFF -DSHARDTENSOR_BUILD_BENCH=OFF -DSHARDTENSOR_BUILD_EXAMPLES=OFF \
    -DSHARDTENSOR_INSTALL=OFF -DCMAKE_CUDA_COMPILER="$C/bin/nvcc" -DCMAKE_CUDA_HOST_COMPILER=g++-11 \
    -DCUDAToolkit_ROOT="$C" -DCMAKE_CUDA_ARCHITECTURES=70-virtual \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache \
    -DGPUSIM_LIBDIR="$LIBDIR" -DGPUSIM_CONFIG="$CFG" -DGPUSIM_CUDA="$C" >"$BUILD.configure.log" 2>&1
}
# When a cached compiler changes, CMake deletes the cache and configures again WITHOUT the -D
# options (seen: SHARDTENSOR_GPUSIM=OFF, then "Could NOT find CUDNN"): configure once more then.
gpusim_on() { grep -q '^SHARDTENSOR_GPUSIM:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; }
if ! configure || ! gpusim_on; then
  echo "gpusim: configure again (the CMake cache had been reset; SHARDTENSOR_GPUSIM must be ON)"
  configure && gpusim_on || { tail -30 "$BUILD.configure.log"; exit 1; }
fi
targets=(shardtensor_gpusim_tests)
grep -q shardtensor_gpusim_mpi_tests "$BUILD/tests/gpusim/Makefile" 2>/dev/null && targets+=(shardtensor_gpusim_mpi_tests)
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" >"$BUILD.build.log" 2>&1 ||
  { grep -E 'error|Error' "$BUILD.build.log" | head -30; exit 1; }

# ---- 4. run
step "running ctest -L gpusim"
cd "$BUILD"
set +e
ctest -L gpusim ${GPUSIM_TESTS:+-R "$GPUSIM_TESTS"} --output-on-failure --timeout 1800 2>&1 | tee "$BUILD/gpusim-ctest.log"
set -e
passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$BUILD/gpusim-ctest.log" || true)
failed=$(grep -cE 'Test +#[0-9]+: .*\*\*\*(Failed|Exception|Timeout)|Test +#[0-9]+: .* (Failed|Timeout)' "$BUILD/gpusim-ctest.log" || true)
skipped=$(grep -cE 'Test +#[0-9]+: .*(Skipped|Not Run)' "$BUILD/gpusim-ctest.log" || true)
echo "gpusim lane: $skipped skipped (need cuDNN/cuBLAS/NCCL or a GPU), total time $(( $(date +%s) - t0 )) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

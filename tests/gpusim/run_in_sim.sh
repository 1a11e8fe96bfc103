#!/bin/sh
# Runs a test program inside GPGPU-Sim (functional mode), in a scratch folder of its own (one per
# MPI rank: the simulator writes _cuobjdump_* / *.ptx files into the working directory).
#   run_in_sim.sh SCRATCH PROGRAM [ARGS...]
# Environment (set by tests/gpusim/CMakeLists.txt): GPUSIM_LIBDIR, GPUSIM_CONFIG, GPUSIM_CUDA,
# GPUSIM_KERNEL_LIB (the library whose embedded PTX the simulator loads: libshardtensor_cuda.so).
set -e
scratch=$1; shift
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
dir=$scratch/rank$rank
rm -rf "$dir"; mkdir -p "$dir"
if [ -z "$GPUSIM_LIBDIR" ] || [ ! -e "$GPUSIM_LIBDIR/libcudart.so.11.0" ]; then
  echo "run_in_sim.sh: GPUSIM_LIBDIR ($GPUSIM_LIBDIR) holds no simulator libcudart.so.11.0" >&2; exit 2
fi
cp "$GPUSIM_CONFIG"/* "$dir"/
cd "$dir"
export LD_LIBRARY_PATH="$GPUSIM_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CUDA_INSTALL_PATH="$GPUSIM_CUDA" PATH="$GPUSIM_CUDA/bin:$PATH"
# The simulator extracts PTX with cuobjdump from the program binary; the kernels live in
# libshardtensor_cuda.so, which PYTORCH_BIN (the simulator's hook for kernels in a library) names.
export PYTORCH_BIN="$GPUSIM_KERNEL_LIB"
"$@" >sim.log 2>&1 && rc=0 || rc=$?
# The test's own output (Catch2) without the simulator's chatter; the full log stays in sim.log.
grep -v -E '^(GPGPU-Sim|GPGPU-sim|self exe|Running md5sum|Extracting specific|Processing kernel|Loading PTXInfo|Adding|Warning: cannot find|       |  ptxas|ptxas info|-|\*\*\*|gpgpu_|Parsing|DRAM|RETURN|launching|kernel_|Destroy|event update|GPU ) *' sim.log | grep -v '^[0-9a-f]\{32\} ' | tail -60 || true
[ $rc -ne 0 ] && echo "(exit $rc; full simulator log: $dir/sim.log)"
exit $rc

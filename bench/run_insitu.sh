#!/usr/bin/env bash
# Overhead of in-situ training (issue 8, scope 6): runs examples/insitu_advection with the
# surrogate off, on with stable (zero-copy) views and on with snapshot views (each with and without
# ghost reuse), REPEATS times each,
# and prints the median over the repeats of each run's median simulation step, median surrogate
# phase and page faults per step. Prints the machine load before and after.
#   bench/run_insitu.sh [build-dir] [np] [repeats] [example flags...]
# e.g. bench/run_insitu.sh build 3 5 --nx 512 --ny 382 --steps 200 --every 10
set -euo pipefail
BUILD=${1:-build}; NP=${2:-3}; REPEATS=${3:-5}; shift 3 || true
ARGS=("$@"); [ ${#ARGS[@]} -eq 0 ] && ARGS=(--nx 512 --ny 382 --steps 200 --every 10)
EXE="$BUILD/examples/insitu_advection"
bash "$(dirname "$0")/need_bench.sh" --timed "$BUILD" insitu_advection
MPI=(mpiexec --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader -n "$NP")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
med() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/^$1=\([-0-9.e+]*\).*/\1/p"; }
echo "# $(date -u '+%Y-%m-%d %H:%M UTC')  $(uname -n)  np=$NP  repeats=$REPEATS  OMP_NUM_THREADS=$OMP_NUM_THREADS  flags: ${ARGS[*]}"
echo "# load before: $(uptime)"
# Modes: the surrogate off; on with stable / snapshot views, each with ghost reuse (the conv reads
# the simulation's ghost cells, the default) and without (--ghost-reuse off: the library's own
# halo exchange). The repeats are interleaved over the modes, so load drift hits every mode alike.
MODES=("off" "on --view stable" "on --view stable --ghost-reuse off" "on --view snapshot"
       "on --view snapshot --ghost-reuse off")
declare -A OUT
for ((r = 0; r < REPEATS; ++r)); do
  for mode in "${MODES[@]}"; do
    OUT[$mode]+="$("${MPI[@]}" "$EXE" "${ARGS[@]}" --diag-every 1000000 --surrogate $mode)"$'\n'
  done
done
printf "%-26s %14s %14s %16s %14s %16s %16s\n" mode sim_ms/step sim_minflt/step surr_ms/phase surr_ms/step total_ms/step surr_minflt/phase
for mode in "${MODES[@]}"; do
  col() { echo "${OUT[$mode]}" | field "$1" | med; }
  label="${mode//--view /}"; label="${label//--ghost-reuse off/no-ghost-reuse}"
  printf "%-26s %14s %14s %16s %14s %16s %16s\n" "$label" "$(col sim_ms_per_step)" "$(col sim_minflt_per_step)" \
    "$(col surrogate_ms_per_phase)" "$(col surrogate_ms_per_sim_step)" "$(col total_ms_per_sim_step)" "$(col surrogate_minflt_per_phase)"
done
echo "# load after: $(uptime)"

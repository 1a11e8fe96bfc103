#!/usr/bin/env bash
# Runs the command lines of tests/examples/bad_flags.cmake, several at once (issue 33: 144
# sequential mpiexec launches, each mostly waiting on start-up, took minutes with the CPU idle).
# Usage: run_cases.sh <dir> <ncases> <jobs> <mpiexec> [mpiexec flags...] -- <exe>
# Case i is <dir>/<i>.np (rank count) and <dir>/<i>.args (one argument per line); its stdout,
# stderr and exit code go to <dir>/<i>.out, <i>.err and <i>.rc. bad_flags.cmake checks them.
set -uo pipefail
dir=$1 ncases=$2 jobs=$3
shift 3
launcher=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
shift
exe=$1
# A one-rank case that exits non-zero kept Open MPI's mpiexec ~2 s in its grace period for the
# job's other ranks (odls_base_sigkill_timeout, 1 s, twice) with the CPU idle: 2.34 s against
# 0.27 s per launch with the grace at 0 (unet_surrogate --steps abc, 2-core AMD EPYC). With one
# rank there is no other rank to wait for, so its grace is 0. Launches of 2 or more ranks keep the
# default: there a rank that exits first could get the others killed before rank 0 has printed.
# Only for Open MPI's launcher (the flags already name --mca).
onerank=()
for a in "${launcher[@]}"; do
  if [ "$a" = "--mca" ]; then onerank=(--mca odls_base_sigkill_timeout 0); break; fi
done
run_case() {
  local i=$1 np args=() extra=()
  np=$(cat "$dir/$i.np")
  mapfile -t args < "$dir/$i.args"
  [ "$np" = 1 ] && extra=("${onerank[@]}")
  # Each launch gets a session directory base of its own. Concurrent Open MPI launches share
  # <tmp>/ompi.<host>.<uid>, which the last job to finish removes; two launches that both find it
  # missing race to create it and the loser fails in orte_init ("A call to mkdir was unable to
  # create the desired directory ... File exists"; seen once in a clean debootstrap bookworm,
  # where no stale job keeps that directory alive). Short path under /tmp: the PMIx sockets live
  # there (108-character limit).
  local sess rc
  sess=$(mktemp -d "${TMPDIR:-/tmp}/stbf.XXXXXX")
  OMPI_MCA_orte_tmpdir_base=$sess timeout 300 "${launcher[0]}" -n "$np" "${launcher[@]:1}" "${extra[@]}" "$exe" "${args[@]}" > "$dir/$i.out" 2> "$dir/$i.err" < /dev/null
  rc=$?
  rm -rf "$sess"
  echo "$rc" > "$dir/$i.rc"
}
running=0
for ((i = 0; i < ncases; ++i)); do
  run_case "$i" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait

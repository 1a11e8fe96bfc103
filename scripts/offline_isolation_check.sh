#!/usr/bin/env bash
# Proves that a prefix made by `scripts/setup.sh --from` needs none of the system's copies of the
# bundled packages (development machine only: Debian with those packages installed, root, and
# unshare(1)). In a private mount namespace -- the rest of the machine is untouched -- every file
# the system's copies of the bundle's packages installed is masked with /dev/null; then, with an
# empty environment plus PREFIX/env.sh, it runs ompi_info, ldd of the test binaries and mpiexec.
#   scripts/offline_isolation_check.sh BUNDLE_DIR PREFIX BUILD_DIR [NP...]     (NP default: 2 4)
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BUNDLE_DIR PREFIX BUILD_DIR [NP...]" >&2; exit 2; }
BUNDLE=$(cd "$1" && pwd); PREFIX=$(cd "$2" && pwd); BUILD=$(cd "$3" && pwd); shift 3
NPS=("$@"); [ ${#NPS[@]} -gt 0 ] || NPS=(2 4)
[ "$(id -u)" -eq 0 ] || { echo "needs root (mount namespace)" >&2; exit 2; }

if [ "${_ISOLATED:-0}" != 1 ]; then
  exec unshare --mount --propagation private env _ISOLATED=1 bash "$0" "$BUNDLE" "$PREFIX" "$BUILD" "${NPS[@]}"
fi

# --- inside the private mount namespace ---
n=0
for pkg in $(awk -F'\t' '!/^#/ {print $1}' "$BUNDLE/MANIFEST.tsv"); do
  while IFS= read -r f; do
    case $f in /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*) continue ;; esac
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    mount --bind /dev/null "$f" && n=$((n+1))
  done < <(dpkg -L "$pkg" 2>/dev/null || true)
done
echo "isolation: masked $n system files of $(grep -vc '^#' "$BUNDLE/MANIFEST.tsv") bundled packages"
# The masks bite: the system's Open MPI and fmt are unusable now.
if /usr/bin/mpiexec --version >/dev/null 2>&1; then echo "isolation: system mpiexec still runs" >&2; exit 1; fi
[ -s /usr/lib/x86_64-linux-gnu/libfmt.so.9 ] && { echo "isolation: libfmt not masked" >&2; exit 1; }
echo "isolation: system mpiexec and libfmt are masked"

log=$(mktemp)
env -i HOME="$HOME" PATH=/usr/bin:/bin PREFIX="$PREFIX" BUILD="$BUILD" NPS="${NPS[*]}" bash -c '
  set -euo pipefail
  . "$PREFIX/env.sh"
  echo "env: $(env | grep -cE "^(OPAL|PMIX)_") OPAL/PMIX vars; mpiexec = $(command -v mpiexec)"
  ompi_info --path prefix; ompi_info --path pkgdatadir; ompi_info --parsable | grep -m1 "ompi:version:full"
  for b in "$BUILD"/tests/shardtensor_tests "$BUILD"/tests/shardtensor_mpi_tests; do
    [ -x "$b" ] || continue
    echo "ldd $(basename "$b"):"
    ldd "$b" | grep -E "mpi|fmt|benchmark|openblas|gfortran|hwloc|pmix|event|not found" | sed "s/^/   /"
    if ldd "$b" | grep -q "not found"; then echo "missing libraries" >&2; exit 1; fi
  done
  if [ -x "$BUILD/tests/shardtensor_tests" ]; then
    "$BUILD/tests/shardtensor_tests" 2>&1 | tail -n 2
  fi
  flags="--oversubscribe --mca pml ob1 --mca btl self,vader"; [ "$(id -u)" -eq 0 ] && flags="--allow-run-as-root $flags"
  for np in $NPS; do
    echo "mpiexec -n $np shardtensor_mpi_tests:"
    OMP_NUM_THREADS=1 mpiexec $flags -n "$np" "$BUILD/tests/shardtensor_mpi_tests" 2>&1 | tail -n 3
  done
' 2>&1 | tee "$log"
# A masked system file that something opened reads as empty ("file too short", ...).
if grep -qE "file too short|cannot open shared object|not found" "$log"; then
  echo "isolation: FAIL (something reached for a system copy; see above)"; exit 1
fi
echo "isolation: PASS"

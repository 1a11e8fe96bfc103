#!/usr/bin/env bash
# Installs what shardtensor needs from Debian's apt (bookworm + bookworm-backports for Catch2 3).
# Idempotent: does nothing when everything is already present.
# Offline bundle (no package manager / no network on the target; docs/building.md):
#   scripts/setup.sh --download DIR              collect the .deb closure into DIR (needs apt)
#   scripts/setup.sh --from DIR [--prefix P]     extract it into P, write P/env.sh
set -euo pipefail
case "${1:-}" in
  --download|--from) exec bash "$(dirname "${BASH_SOURCE[0]}")/offline_deps.sh" "$@" ;;
esac

need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

main_pkgs=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libfmt-dev libcli11-dev
           libbenchmark-dev libopenblas-dev libhdf5-openmpi-dev libfftw3-dev libnanoflann-dev ccache
           ninja-build)
# Issue 16's benchmarks (bench/, never the library or the tests): FFTW's MPI transforms (CMake
# finds them optionally; small, installed unless SETUP_NO_BENCH=1). PyTorch (the torch.fft / conv /
# attention references in bench/*.py) is big (~190 MB of .debs with its closure, ~830 MB
# installed) and only installed on request: SETUP_WITH_TORCH=1 scripts/setup.sh.
[ "${SETUP_NO_BENCH:-0}" = 1 ] || main_pkgs+=(libfftw3-mpi-dev)
[ "${SETUP_WITH_TORCH:-0}" = 1 ] && main_pkgs+=(python3-torch)
# gnuplot draws the benchmarks' plots only (bench/run_vit.sh, run_redistribute.sh,
# run_nowcast_referee.sh install it on demand with SETUP_WITH_PLOTS=1). Its closure is 43 packages
# (fonts, cairo/pango, image and video codecs for libgd): not installed for the README commands
# (issue 33).
[ "${SETUP_WITH_PLOTS:-0}" = 1 ] && main_pkgs+=(gnuplot-nox)
for p in "${main_pkgs[@]}"; do have "$p" || need+=("$p"); done
catch_ok=1
if ! have libcatch2-dev; then catch_ok=0
elif ! dpkg-query -W -f='${Version}' libcatch2-dev | grep -q '^3'; then catch_ok=0; fi

if [ ${#need[@]} -eq 0 ] && [ $catch_ok -eq 1 ]; then
  echo "setup: all dependencies present"; exit 0
fi

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ $catch_ok -eq 0 ]; then
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  if ! grep -rqs "${codename}-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "deb http://deb.debian.org/debian ${codename}-backports main" | \
      $SUDO tee /etc/apt/sources.list.d/shardtensor-backports.list >/dev/null
  fi
fi
# dpkg syncs every unpacked file to disk (fsync), which was half of the install on a fresh 2-core
# machine: a minimal bookworm (debootstrap --variant=minbase) installing this list took 114 s to
# unpack and configure, 60 s with --force-unsafe-io (the download 11 s; issue 33). The cost: a
# power loss during the install can leave some of these packages' files empty, and the fix is to
# reinstall them; a crash of the install alone loses nothing. SETUP_SAFE_IO=1 keeps dpkg's syncs.
dpkg_opts=(-o Dpkg::Options::=--force-unsafe-io)
[ "${SETUP_SAFE_IO:-0}" = 1 ] && dpkg_opts=()
$SUDO apt-get update -qq
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${dpkg_opts[@]}" "${need[@]}"
fi
if [ $catch_ok -eq 0 ]; then
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  $SUDO apt-get install -y -qq --no-install-recommends "${dpkg_opts[@]}" -t "${codename}-backports" libcatch2-dev
fi
echo "setup: done"

#!/usr/bin/env bash
# Offline dependency bundle (called by scripts/setup.sh --download / --from; see docs/building.md,
# "Offline build").
#   offline_deps.sh --download DIR             on Debian 12 with apt + network: collect the .deb
#                                              closure the build needs into DIR (+ DIR/MANIFEST.tsv)
#   offline_deps.sh --from DIR [--prefix P]    anywhere (no package manager, no network): extract
#                                              DIR/*.deb into P (default DIR/prefix), make it
#                                              relocated, write P/env.sh
set -euo pipefail

# What the build needs (the closure of these is collected).
ROOTS=(openmpi-bin libopenmpi-dev libfmt-dev libcli11-dev libcatch2-dev libbenchmark-dev libopenblas-dev libhdf5-openmpi-dev libfftw3-dev libfftw3-mpi-dev libnanoflann-dev)
# python3-torch (bench/torch_fft.py, issue 16) only on request: its closure is ~190 MB of .debs,
# past the 64 MiB a device call carries (.deps), and no GPU benchmark needs it. Unverified offline.
[ "${OFFLINE_WITH_TORCH:-0}" = 1 ] && ROOTS+=(python3-torch)
# Left out of the closure: what every glibc Linux (with a C/C++ compiler) has, the compilers
# themselves, ssh (remote launch only), docs, the -dev packages libopenmpi-dev needs only for
# static linking, and hwloc's optional plugins (they drag X11/OpenCL; hwloc runs without them).
EXCLUDE='^(libc6|libc6-dev|libc-dev-bin|libc-bin|libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base|libcrypt1|libcrypt-dev|zlib1g|zlib1g-dev|libzstd1|liblzma5|libbz2-1\.0|libssl3|libudev1|libcap2|libsystemd0|libselinux1|libpcre2-.*|libgcrypt20|libgpg-error0|liblz4-1|libuuid1|libblkid1|libmount1|libtinfo6|debconf|dpkg|perl-base|perl|tar|sensible-utils|init-system-helpers|lsb-base|libdb5\.3|libffi8|libgmp10|coreutils|base-files|bash|ucf|adduser|passwd|login|libaudit.*|libpam.*|libsemanage.*|libsepol.*|libcap-ng0|gcc(-[0-9]+)?|g\+\+(-[0-9]+)?|cpp(-[0-9]+)?|gfortran(-[0-9]+)?|flang-[0-9]+|binutils.*|libgcc-[0-9]+-dev|libstdc\+\+-[0-9]+-dev|libgfortran-[0-9]+-dev|linux-libc-dev|openssh-client|libjs-.*|libibverbs-dev|libhwloc-dev|libevent-dev|libpmix-dev|libnl-.*-dev|libhwloc-plugins)$'

die() { echo "offline_deps: error: $*" >&2; exit 1; }
say() { echo "offline_deps: $*"; }

# ---------------------------------------------------------------------------------------------
# --download
# ---------------------------------------------------------------------------------------------
APT_OPTS=()
APT_TMP=""
apt_setup() {
  command -v apt-get >/dev/null || die "--download needs apt (Debian 12 / bookworm)"
  [ "$(id -u)" -eq 0 ] && APT_OPTS+=(-o APT::Sandbox::User=root)
  local cand
  cand=$(apt-cache policy libcatch2-dev 2>/dev/null | awk '/Candidate:/ {print $2}')
  if [[ "${OFFLINE_PRIVATE_APT:-0}" = 1 || ! "$cand" =~ ^3 ]]; then
    # Catch2 3 is in bookworm-backports: use private apt lists with it added (no root needed,
    # the system's apt configuration is left alone).
    local codename tmp
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    tmp=$(mktemp -d /tmp/offline-apt.XXXXXX)
    APT_TMP=$tmp   # removed when --download ends
    mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
    echo "deb http://deb.debian.org/debian ${codename}-backports main" > "$tmp/extra.list"
    APT_OPTS+=(-o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache"
               -o "Dir::Etc::sourcelist=$tmp/extra.list")
    say "private apt lists in $tmp (adds ${codename}-backports for Catch2 3)"
    apt-get "${APT_OPTS[@]}" update -qq || die "apt-get update failed"
    cand=$(apt-cache "${APT_OPTS[@]}" policy libcatch2-dev | awk '/Candidate:/ {print $2}')
    [[ "$cand" =~ ^3 ]] || die "no Catch2 3 candidate for libcatch2-dev (got '$cand')"
  fi
}

# Prints the dependency closure of the arguments (Depends + Pre-Depends, first usable
# alternative, virtual packages -> first provider), skipping EXCLUDE and what it alone needs.
closure() {
  declare -A seen=()
  local queue=("$@") p group c pick skip
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}; queue=("${queue[@]:1}")
    [[ -n ${seen[$p]:-} || $p =~ $EXCLUDE ]] && continue
    seen[$p]=1; echo "$p"
    while read -r group; do
      [ -z "$group" ] && continue
      skip=0; pick=""
      for c in $group; do   # an alternative the system has or we already took satisfies the group
        if [[ $c =~ $EXCLUDE || -n ${seen[$c]:-} ]]; then skip=1; break; fi
        [ -z "$pick" ] && pick=$c
      done
      [ $skip = 0 ] && [ -n "$pick" ] && queue+=("$pick")
    done < <(apt-cache "${APT_OPTS[@]}" depends --no-recommends --no-suggests --no-conflicts \
               --no-breaks --no-replaces --no-enhances "$p" | awk '
      NR == 1 { next }
      /^ [ |](Pre)?Depends:/ { if (cur != "" && !prevalt) { print cur; cur = "" }
                               prevalt = ($0 ~ /^ \|/); cur = (cur == "" ? $2 : cur " " $2); next }
      /^    / { cur = cur " " $1; next }
      END { if (cur != "") print cur }' | sed -E 's/<[^>]*>//g')
  done
}

do_download() {
  local dir=$1
  mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
  trap '[ -n "$APT_TMP" ] && rm -rf "$APT_TMP"' EXIT
  apt_setup
  mapfile -t pkgs < <(closure "${ROOTS[@]}")
  [ ${#pkgs[@]} -gt 0 ] || die "empty closure"
  say "${#pkgs[@]} packages: ${pkgs[*]}"
  rm -f "$dir"/*.deb
  (cd "$dir" && apt-get "${APT_OPTS[@]}" download "${pkgs[@]}") || die "apt-get download failed"
  local m=$dir/MANIFEST.tsv
  {
    echo "# shardtensor offline bundle: written by scripts/setup.sh --download on $(date -u +%FT%TZ)"
    echo "# host: $(. /etc/os-release && echo "$PRETTY_NAME"), arch $(dpkg --print-architecture)"
    echo "# roots: ${ROOTS[*]}"
    echo "# excluded (system or not needed): $EXCLUDE"
    printf '# package\tversion\tarch\tbytes\tfile\tsha256\n'
    local f
    for f in "$dir"/*.deb; do
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" \
        "$(dpkg-deb -f "$f" Architecture)" "$(stat -c %s "$f")" "$(basename "$f")" \
        "$(sha256sum "$f" | cut -d' ' -f1)"
    done
  } > "$m"
  say "bundle: $dir ($(ls "$dir"/*.deb | wc -l) .deb, $(du -sh "$dir" | cut -f1)); manifest $m"
}

# ---------------------------------------------------------------------------------------------
# --from
# ---------------------------------------------------------------------------------------------
# ar + tar, or python3, where dpkg-deb is absent.
py_ar_extract() {   # $1 deb, $2 member prefix (data.tar / control.tar), $3 destination
  python3 - "$1" "$2" "$3" <<'PY'
import io, sys, tarfile
deb, member, dest = sys.argv[1:]
with open(deb, 'rb') as f:
    assert f.read(8) == b'!<arch>\n', 'not an ar archive'
    while True:
        hdr = f.read(60)
        if len(hdr) < 60: sys.exit(f'{member}.* not found in {deb}')
        name, size = hdr[:16].decode().strip().rstrip('/'), int(hdr[48:58])
        data = f.read(size); f.read(size % 2)
        if name.startswith(member):
            if name.endswith('.zst'): sys.exit('zstd member needs dpkg-deb or tar+zstd')
            tarfile.open(fileobj=io.BytesIO(data)).extractall(dest)
            break
PY
}

# OFFLINE_EXTRACT=dpkg|ar|python forces one way (tests); by default the first that exists.
extract_deb() {   # $1 deb, $2 data destination, $3 control destination
  local how=${OFFLINE_EXTRACT:-}
  mkdir -p "$3"
  if [[ -z $how || $how == dpkg ]] && command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$2" && dpkg-deb -e "$1" "$3" && return
  fi
  if [[ -z $how || $how == ar ]] && command -v ar >/dev/null && command -v tar >/dev/null; then
    local t; t=$(mktemp -d)
    if (cd "$t" && ar x "$1") && tar -xf "$t"/data.tar.* -C "$2" && tar -xf "$t"/control.tar.* -C "$3"; then
      rm -rf "$t"; return
    fi
    rm -rf "$t"
  fi
  command -v python3 >/dev/null || die "cannot extract $1: no dpkg-deb, ar+tar or python3"
  py_ar_extract "$1" data.tar "$2" && py_ar_extract "$1" control.tar "$3"
}

relpath() {   # $1 target, $2 directory  ->  target relative to directory
  realpath -m --relative-to="$2" "$1" 2>/dev/null ||
    python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$1" "$2"
}

# The links update-alternatives would make (mpiexec, mpicxx, libopenblas.so, cblas.h, ...):
# read from the packages' postinst scripts, made relative inside the prefix.
make_alternatives() {
  local P=$1 ctl=$2 s
  for s in "$ctl"/*/postinst; do
    [ -f "$s" ] || continue
    # join continued lines, then split each update-alternatives call into words
    sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$s" | grep -E '^[[:space:]]*update-alternatives' |
    while read -r -a w; do
      local i=0 n=${#w[@]} link target
      while [ $i -lt $n ]; do
        case ${w[$i]} in
          --install) link=${w[$((i+1))]}; target=${w[$((i+3))]}; i=$((i+5)) ;;
          --slave)   link=${w[$((i+1))]}; target=${w[$((i+3))]}; i=$((i+4)) ;;
          *) i=$((i+1)); continue ;;
        esac
        [[ $link == /* && $target == /* && $link$target != *'$'* ]] || continue
        [ -e "$P$target" ] || continue
        [ -e "$P$link" ] || [ -L "$P$link" ] && continue
        mkdir -p "$(dirname "$P$link")"
        ln -s "$(relpath "$P$target" "$(dirname "$P$link")")" "$P$link"
      done
    done || true
  done
}

do_from() {
  local dir=$1 P=${2:-}
  [ -d "$dir" ] || die "no bundle directory $dir"
  dir=$(cd "$dir" && pwd)
  ls "$dir"/*.deb >/dev/null 2>&1 || die "no .deb files in $dir (make it with --download)"
  [ -n "$P" ] || P=$dir/prefix
  mkdir -p "$P"; P=$(cd "$P" && pwd)
  local ctl; ctl=$(mktemp -d)
  local f n=0
  for f in "$dir"/*.deb; do
    extract_deb "$f" "$P" "$ctl/$(basename "$f" .deb)"; n=$((n+1))
  done
  say "extracted $n packages into $P"
  make_alternatives "$P" "$ctl"
  rm -rf "$ctl"

  # Absolute symlinks (none in bookworm's set today, but ar/tar keeps whatever is there).
  local l t
  while IFS= read -r -d '' l; do
    t=$(readlink "$l")
    [[ $t == /* ]] || continue
    ln -sfn "$(relpath "$P$t" "$(dirname "$l")")" "$l"
  done < <(find "$P" -type l -print0)

  # Text files that name /usr: pkg-config, CMake package files, PMIx's component path.
  local usr_re='(^|[="'"'"' (;:,]|-I|-L)/usr(/|"|$)'
  while IFS= read -r -d '' f; do
    grep -qE "$usr_re" "$f" || continue
    sed -i -E "s#$usr_re#\\1$P/usr\\2#g" "$f"
  done < <(find "$P" \( -name '*.pc' -o -name '*.cmake' -o -name 'pmix-mca-params.conf' \) -type f -print0)

  local ma; ma=$(cd "$P/usr/lib" && ls -d *-linux-gnu 2>/dev/null | head -1)
  [ -n "$ma" ] || die "no usr/lib/<multiarch> directory in $P"
  local L=$P/usr/lib/$ma
  local pmix; pmix=$(ls -d "$L"/pmix* 2>/dev/null | head -1)
  # Library dirs (some bookworm packages, e.g. libnl-3-200, still install into /lib/<multiarch>).
  local d ldp=""
  for d in "usr/lib/$ma" "usr/lib/$ma/openmpi/lib" "lib/$ma"; do
    [ -d "$P/$d" ] && ldp="${ldp:+$ldp:}\$_p/$d"
  done
  cat > "$P/env.sh" <<EOF
# shardtensor offline dependencies: source this file (written by scripts/setup.sh --from).
_p='$P'
export SHARDTENSOR_DEPS_PREFIX="\$_p"
export PATH="\$_p/usr/bin\${PATH:+:\$PATH}"
export LD_LIBRARY_PATH="$ldp\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="\$_p/usr:\$_p/usr/lib/$ma/cmake:\$_p/usr/lib/cmake\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export CMAKE_LIBRARY_PATH="\$_p/usr/lib/$ma\${CMAKE_LIBRARY_PATH:+:\$CMAKE_LIBRARY_PATH}"
export PKG_CONFIG_PATH="\$_p/usr/lib/$ma/pkgconfig:\$_p/usr/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
# cblas.h / openblas_config.h live in the multiarch include dir, which the compiler searches
# only under /usr.
export CPATH="\$_p/usr/include/$ma\${CPATH:+:\$CPATH}"
# Open MPI 4.1 relocation: every install dir follows OPAL_PREFIX except sysconfdir.
export OPAL_PREFIX="\$_p/usr"
export OPAL_SYSCONFDIR="\$_p/etc/openmpi"
# Its PMIx (external, own prefix): help files, components, pmix-mca-params.conf.
export PMIX_PREFIX="${pmix:-\$_p/usr}"
unset _p
EOF
  say "wrote $P/env.sh"
  # Self-check: the prefix's Open MPI answers from the prefix.
  if (set +u; . "$P/env.sh"; "$P/usr/bin/ompi_info" --path prefix 2>&1 | grep -q "$P/usr"); then
    say "ompi_info: prefix $P/usr (ok)"
  else
    echo "offline_deps: warning: the prefix's ompi_info did not run or did not relocate" >&2
  fi
  say "use: . $P/env.sh"
}

case "${1:-}" in
  --download) [ $# -eq 2 ] || die "usage: $0 --download DIR"; do_download "$2" ;;
  --from)
    [ $# -ge 2 ] || die "usage: $0 --from DIR [--prefix PREFIX]"
    d=$2; p=""; shift 2
    while [ $# -gt 0 ]; do
      case $1 in --prefix) p=${2:?--prefix needs a value}; shift 2 ;; *) die "unknown argument $1" ;; esac
    done
    do_from "$d" "$p" ;;
  *) die "usage: $0 --download DIR | --from DIR [--prefix PREFIX]" ;;
esac

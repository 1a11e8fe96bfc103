#!/usr/bin/env bash
# Build step header_self_containment (tests/CMakeLists.txt): every public header compiles on its own. One generated TU per
# header (#include <that header> and nothing else) is compiled with -fsyntax-only (no object
# file), `jobs` compiler processes at once, with the flags of a target that links shardtensor
# (written at generate time by tests/CMakeLists.txt). A step of the build since issue 33.
# Usage: header_check.sh <flags-file> <tu-dir> <jobs|auto> [<include-dir>]
#   flags-file:  line 1 the C++ compiler, then one compiler argument per line
#   tu-dir:      the generated <header>.cpp files
#   jobs:        compiler processes at once; auto: the machine's cores (not OMP_NUM_THREADS)
#   include-dir: the project's include/ (enables the shared bases below)
#
# Shared bases (issue 33). Most headers include dist/dist_tensor.hpp or core/error.hpp, directly
# or through others, and parsing those (and the fmt / standard headers behind them) was most of
# each header's check. Each base is precompiled once (-x c++-header) and a header whose include
# closure contains the base is checked with `-include <base>` (the precompiled copy). That hides
# nothing: the base's whole closure (project, fmt and standard headers, macros) is already in the
# header's own closure, so the header sees no declaration it would not see on its own. The
# closure is read from the headers' unconditional `#include <shardtensor/...>` lines (an include
# under #if does not count). A base itself, and a header without a base, is checked plainly.
# -Winvalid-pch: a precompiled base that cannot be used is a warning, and warnings fail the check.
set -uo pipefail
flags_file=$1 tu_dir=$2 jobs=${3:-auto} inc_dir=${4:-}
[ "$jobs" = auto ] && jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 2)
[ -s "$flags_file" ] || { echo "header_check: no flags file $flags_file" >&2; exit 1; }
mapfile -t tus < <(find "$tu_dir" -name '*.cpp' | sort)
[ ${#tus[@]} -gt 0 ] || { echo "header_check: no generated TUs under $tu_dir" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log_dir=$work/logs
mkdir -p "$log_dir"
mapfile -t flags < "$flags_file"
cxx=${flags[0]}
args=()
for a in "${flags[@]:1}"; do [ -n "$a" ] && args+=("$a"); done

# The unconditional project includes of a header (relative to include/), one per line.
direct_includes() {
  awk '/^[ \t]*#[ \t]*if/ {d++} /^[ \t]*#[ \t]*endif/ {d--}
       d == 0 && /^[ \t]*#[ \t]*include[ \t]*[<"]shardtensor\// {
         s = $0; sub(/^[^<"]*[<"]/, "", s); sub(/[>"].*$/, "", s); print s }' "$1"
}
declare -A deps=()
bases=(shardtensor/dist/dist_tensor.hpp shardtensor/core/error.hpp)
declare -A base_of=()
if [ -n "$inc_dir" ] && [ -d "$inc_dir/shardtensor" ]; then
  while IFS= read -r h; do
    deps[$h]=$(direct_includes "$inc_dir/$h" | tr '\n' ' ')
  done < <(cd "$inc_dir" && find shardtensor -name '*.hpp' | sort)
  # closure_has <header> <base>: the base is in the header's include closure.
  closure_has() {
    local -A seen=()
    local stack=("$1") h d
    while [ ${#stack[@]} -gt 0 ]; do
      h=${stack[-1]}; unset 'stack[-1]'
      for d in ${deps[$h]:-}; do
        [ "$d" = "$2" ] && return 0
        [ -n "${seen[$d]:-}" ] && continue
        seen[$d]=1; stack+=("$d")
      done
    done
    return 1
  }
  for tu in "${tus[@]}"; do
    h=$(sed -n 's/^#include <\(.*\)>$/\1/p' "$tu" | head -1)
    for b in "${bases[@]}"; do
      if [ "$h" != "$b" ] && [ -n "${deps[$h]+x}" ] && closure_has "$h" "$b"; then base_of[$tu]=$b; break; fi
    done
  done
  # Precompile the bases that some header uses (in parallel).
  for i in "${!bases[@]}"; do
    used=0
    for tu in "${tus[@]}"; do [ "${base_of[$tu]:-}" = "${bases[$i]}" ] && { used=1; break; }; done
    [ $used = 1 ] || continue
    printf '#include <%s>\n' "${bases[$i]}" > "$work/base$i.hpp"
    "$cxx" "${args[@]}" -x c++-header "$work/base$i.hpp" -o "$work/base$i.hpp.gch" > "$log_dir/base$i.log" 2>&1 &
  done
  wait
  for i in "${!bases[@]}"; do
    if [ -f "$work/base$i.hpp" ] && [ ! -s "$work/base$i.hpp.gch" ]; then
      echo "header_check: precompiling ${bases[$i]} failed:"; cat "$log_dir/base$i.log"; exit 1
    fi
  done
fi

# Headers that are nothing but #include lines (forwarders such as exec/context.hpp, umbrellas
# such as nn/functional.hpp) are not compiled on their own: every project header they include is
# itself one of the checked headers, so they compile on their own when those do (a clash between
# two of them would be a redefinition that every test TU, which includes them all through the
# tests' precompiled header, reports). Only lines that are blank, // comments, #pragma once or
# #include <...> / "..." qualify; a project include outside the checked set disqualifies the header.
declare -A checked=()
for tu in "${tus[@]}"; do checked[$(sed -n 's/^#include <\(.*\)>$/\1/p' "$tu" | head -1)]=1; done
only_includes() {  # only_includes <header path>: 0 when the header qualifies
  local f=$1 line inc
  [ -f "$f" ] || return 1
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
      ''|//*|'#pragma once') continue ;;
    esac
    [[ "$line" =~ ^[[:space:]]*$ || "$line" =~ ^[[:space:]]*// ]] && continue
    if [[ "$line" =~ ^#include\ [\<\"]([^\>\"]+)[\>\"][[:space:]]*(//.*)?$ ]]; then
      inc=${BASH_REMATCH[1]}
      [[ "$inc" == shardtensor/* && -z "${checked[$inc]:-}" ]] && return 1
      continue
    fi
    return 1
  done < "$f"
  return 0
}

# One line per TU: the TU and the -include of its base (or nothing).
: > "$work/plan"
nbase=0
nforward=0
for tu in "${tus[@]}"; do
  h=$(sed -n 's/^#include <\(.*\)>$/\1/p' "$tu" | head -1)
  if [ -n "$inc_dir" ] && only_includes "$inc_dir/$h"; then nforward=$((nforward + 1)); continue; fi
  pre=""
  for i in "${!bases[@]}"; do
    [ "${base_of[$tu]:-}" = "${bases[$i]}" ] && { pre="$work/base$i.hpp"; nbase=$((nbase + 1)); }
  done
  printf '%s\t%s\n' "$tu" "$pre" >> "$work/plan"
done
printf '%s\n' "${args[@]}" > "$work/args"
export cxx log_dir work
tr '\n' '\0' < "$work/plan" | xargs -0 -P "$jobs" -n 1 bash -c '
  IFS=$'"'"'\t'"'"' read -r tu pre <<< "$1"
  mapfile -t a < "$work/args"
  inc=(); [ -n "$pre" ] && inc=(-Winvalid-pch -include "$pre")
  if ! "$cxx" "${a[@]}" "${inc[@]}" -fsyntax-only "$tu" > "$log_dir/$(basename "$tu").log" 2>&1; then
    echo "$tu" >> "$log_dir/failed"
  fi' _
failed=0
if [ -s "$log_dir/failed" ]; then
  while read -r tu; do
    echo "header_check: $(sed -n 2p "$tu" | sed 's/#include //') does not compile on its own:"
    cat "$log_dir/$(basename "$tu").log"
  done < "$log_dir/failed"
  echo "header_check: $(wc -l < "$log_dir/failed") of ${#tus[@]} headers failed" >&2
  failed=1
fi
# Warnings fail the check too (-Wall -Wextra are in the flags): a header must be clean on its own.
for tu in "${tus[@]}"; do
  grep -qxF "$tu" "$log_dir/failed" 2>/dev/null && continue
  if [ -s "$log_dir/$(basename "$tu").log" ]; then
    echo "header_check: warnings in $(sed -n 2p "$tu" | sed 's/#include //'):"; cat "$log_dir/$(basename "$tu").log"; failed=1
  fi
done
[ $failed = 0 ] || exit 1
echo "header_check: all ${#tus[@]} public headers compile on their own (-fsyntax-only, -j$jobs; $nbase of them over a precompiled base whose closure they include; $nforward made only of includes of checked headers)"

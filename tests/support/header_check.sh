#!/usr/bin/env bash
# ctest header_self_containment: every public header compiles on its own. One generated TU per
# header (#include <that header> and nothing else) is compiled with -fsyntax-only (no object
# file), `jobs` compiler processes at once, with the flags of a target that links shardtensor
# (written at generate time by tests/CMakeLists.txt). It is not part of the build.
# Usage: header_check.sh <flags-file> <tu-dir> <jobs>
#   flags-file: line 1 the C++ compiler, then one compiler argument per line
#   tu-dir:     the generated <header>.cpp files
set -uo pipefail
flags_file=$1 tu_dir=$2 jobs=${3:-2}
[ -s "$flags_file" ] || { echo "header_check: no flags file $flags_file" >&2; exit 1; }
mapfile -t tus < <(find "$tu_dir" -name '*.cpp' | sort)
[ ${#tus[@]} -gt 0 ] || { echo "header_check: no generated TUs under $tu_dir" >&2; exit 1; }
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT
export flags_file log_dir
printf '%s\0' "${tus[@]}" | xargs -0 -P "$jobs" -n 1 bash -c '
  f=(); while IFS= read -r a; do [ -n "$a" ] && f+=("$a"); done < "$flags_file"
  if ! "${f[0]}" "${f[@]:1}" -fsyntax-only "$1" > "$log_dir/$(basename "$1").log" 2>&1; then
    echo "$1" >> "$log_dir/failed"
  fi' _
if [ -s "$log_dir/failed" ]; then
  while read -r tu; do
    echo "header_check: $(sed -n 2p "$tu" | sed 's/#include //') does not compile on its own:"
    cat "$log_dir/$(basename "$tu").log"
  done < "$log_dir/failed"
  echo "header_check: $(wc -l < "$log_dir/failed") of ${#tus[@]} headers failed" >&2
  exit 1
fi
# Warnings fail the check too (-Wall -Wextra are in the flags): a header must be clean on its own.
warned=0
for tu in "${tus[@]}"; do
  if [ -s "$log_dir/$(basename "$tu").log" ]; then
    echo "header_check: warnings in $(sed -n 2p "$tu" | sed 's/#include //'):"; cat "$log_dir/$(basename "$tu").log"; warned=1
  fi
done
[ $warned = 0 ] || exit 1
echo "header_check: all ${#tus[@]} public headers compile on their own (-fsyntax-only, -j$jobs)"

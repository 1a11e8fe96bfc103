#!/usr/bin/env bash
# Compiler launcher of bench_syntax_check (bench/CMakeLists.txt, SHARDTENSOR_BENCH_SYNTAX_ONLY):
# runs the compile line it is given with -fsyntax-only (parsing, semantic analysis and template
# instantiation; no code generation), then writes an empty file at the -o path so that the build
# tool records the step as done. The depfile (-MD -MF) is still written by the compiler.
set -u
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
"$@" -fsyntax-only || exit $?
[ -n "$out" ] && : > "$out"
exit 0

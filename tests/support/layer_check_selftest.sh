#!/usr/bin/env bash
# ctest layer_dependencies_selftest: layer_check.sh itself can fail, and says why. It builds small
# source trees under <work-dir> and runs the guard on them:
#   clean      two folders (high -> low), same-folder private includes, a commented-out include,
#              an allowed backend pair (cuda -> exec's private table, kernels -> kernels_api):
#              must pass;
#   cycle      clean + src/low/oops.cpp including high's public header: must fail naming the
#              cycle and the file:line of each edge;
#   private    clean + src/high/peek.cpp including src/low/detail.hpp: must fail naming it;
#   backend    clean + src/cuda/leak.cpp including src/low/detail.hpp (cuda -> low is not an
#              allowed pair, though cuda -> exec is): must fail naming it.
# Usage: layer_check_selftest.sh <work-dir>
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:?usage: layer_check_selftest.sh <work-dir>}
rm -rf "$work" && mkdir -p "$work" || exit 2
failures=0

put() {  # put <file> <lines...>
  mkdir -p "$(dirname "$1")"
  local f=$1; shift
  printf '%s\n' "$@" > "$f"
}
clean_tree() {
  local t=$1
  put "$t/include/shardtensor/low/low.hpp" '#pragma once' '#include <vector>'
  put "$t/include/shardtensor/high/high.hpp" '#pragma once' '#include "shardtensor/low/low.hpp"'
  put "$t/src/low/detail.hpp" '#pragma once'
  put "$t/src/low/low.cpp" '#include "shardtensor/low/low.hpp"' '#include "detail.hpp"' '#include "low/detail.hpp"' \
      '// #include "shardtensor/high/high.hpp" (a comment, not an include)'
  put "$t/src/high/high.cpp" '#include "shardtensor/high/high.hpp"' '#include <fmt/format.h>'
  put "$t/src/exec/conv_kernels.hpp" '#pragma once' '#include "shardtensor/low/low.hpp"'
  put "$t/src/cuda/conv_cuda.cpp" '#include "exec/conv_kernels.hpp"' '#include "kernels_api/conv.hpp"' '#include <cuda_runtime.h>'
  put "$t/src/kernels_api/conv.hpp" '#pragma once'
  put "$t/kernels/conv.cu" '#include "kernels_api/conv.hpp"'
}
# expect <case> <want-rc> <needle>...: runs the guard on $work/<case>, checks rc and each needle
expect() {
  local name=$1 want=$2; shift 2
  local out rc
  out=$(bash "$here/layer_check.sh" "$work/$name" 2>&1); rc=$?
  local ok=1
  [ "$rc" = "$want" ] || { echo "selftest $name: exit $rc, expected $want"; ok=0; }
  for needle in "$@"; do
    grep -qF -- "$needle" <<< "$out" || { echo "selftest $name: output lacks: $needle"; ok=0; }
  done
  if [ $ok = 1 ]; then echo "selftest $name: ok (exit $rc)"; else
    failures=$((failures + 1)); echo "---- output of layer_check.sh on $name:"; echo "$out"; echo "----"
  fi
}
reject() {  # reject <case> <needle>: the output must NOT contain needle
  local out; out=$(bash "$here/layer_check.sh" "$work/$1" 2>&1)
  if grep -qF -- "$2" <<< "$out"; then echo "selftest $1: output wrongly contains: $2"; failures=$((failures + 1)); fi
}

clean_tree "$work/clean"
expect clean 0 "layer_check: OK" "high -> low" "cuda -> exec" "kernels -> kernels_api"
reject clean "FAIL"

clean_tree "$work/cycle"
put "$work/cycle/src/low/oops.cpp" '// planted' '#include <string>' '#include "shardtensor/high/high.hpp"'
expect cycle 1 "FAIL: folder include cycle among {" \
  "low -> high: src/low/oops.cpp:3: #include \"shardtensor/high/high.hpp\"" \
  "high -> low: include/shardtensor/high/high.hpp:2: #include \"shardtensor/low/low.hpp\""
reject cycle "private header"

clean_tree "$work/private"
put "$work/private/src/high/peek.cpp" '#include "shardtensor/high/high.hpp"' '#include "low/detail.hpp"'
expect private 1 "FAIL: 1 private header(s) included from another folder" \
  "src/high/peek.cpp:2: #include \"low/detail.hpp\"  (folder high includes src/low/detail.hpp, private to low)"
reject private "cycle"

clean_tree "$work/backend"
put "$work/backend/src/cuda/leak.cpp" '#include "low/detail.hpp"'
expect backend 1 "src/cuda/leak.cpp:1: #include \"low/detail.hpp\"  (folder cuda includes src/low/detail.hpp, private to low)"
reject backend "src/cuda/conv_cuda.cpp"

if [ $failures -gt 0 ]; then echo "layer_check_selftest: $failures case(s) FAILED"; exit 1; fi
echo "layer_check_selftest: all cases behave (the guard passes a clean tree and fails each planted one)"

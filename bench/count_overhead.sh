#!/usr/bin/env bash
# Instructions per op of each bench_overhead case, load-independent: runs `BIN --count=CASE:N`
# under callgrind at N=1000 and N=3000 and prints (Ir(3000) - Ir(1000)) / 2000.
#   bench/count_overhead.sh build/bench/bench_overhead
set -euo pipefail
bin=${1:-build/bench/bench_overhead}
tmp=$(mktemp -d)
ir() { valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bin" --count="$1:$2" 2>&1 |
       sed -n 's/.*Collected : \([0-9]*\).*/\1/p'; }
for c in recorded no_grad no_grad_guard forward_backward; do
  lo=$(ir "$c" 1000); hi=$(ir "$c" 3000)
  echo "$c: $(( (hi - lo) / 2000 )) instructions per op"
done
rm -rf "$tmp"

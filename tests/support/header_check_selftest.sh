#!/usr/bin/env bash
# ctest header_check_selftest: the header self-containment check (header_check.sh, a step of the
# build) can fail. A small tree gets a header that uses std::vector without including <vector>,
# one that compiles but warns (-Wextra: unused parameter) and one that is fine; the check must
# fail naming the first two and not the third, and pass on the good header alone.
# Usage: header_check_selftest.sh <flags-file> <work-dir>
set -uo pipefail
flags_file=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work/include/shardtensor" "$work/tus" "$work/good_tus"
cat > "$work/include/shardtensor/st_selftest_missing.hpp" <<'H'
#pragma once
inline std::vector<int> st_selftest_v() { return {1, 2}; }
H
cat > "$work/include/shardtensor/st_selftest_warns.hpp" <<'H'
#pragma once
inline int st_selftest_w(int unused) { return 1; }
H
cat > "$work/include/shardtensor/st_selftest_good.hpp" <<'H'
#pragma once
#include <vector>
inline std::vector<int> st_selftest_g() { return {1, 2}; }
H
# A forwarder of the good header is not compiled (it is made only of includes of checked
# headers); a forwarder of a header outside the checked set is compiled, and fails with it.
printf '#pragma once\n// forwarder\n#include \"shardtensor/st_selftest_good.hpp\"  // quoted\n' > "$work/include/shardtensor/st_selftest_fwd.hpp"
cp "$work/include/shardtensor/st_selftest_missing.hpp" "$work/include/shardtensor/st_selftest_unchecked.hpp"
printf '#pragma once\n#include <shardtensor/st_selftest_unchecked.hpp>\n' > "$work/include/shardtensor/st_selftest_fwd_bad.hpp"
for h in missing warns good fwd fwd_bad; do
  printf '// selftest\n#include <shardtensor/st_selftest_%s.hpp>\n' "$h" > "$work/tus/st_selftest_$h.cpp"
done
cp "$work/tus/st_selftest_good.cpp" "$work/tus/st_selftest_fwd.cpp" "$work/good_tus/"
# The build's flags with the planted tree first on the include path.
{ head -1 "$flags_file"; echo "-I$work/include"; tail -n +2 "$flags_file"; } > "$work/flags.txt"
fail=0
out=$(bash "$here/header_check.sh" "$work/flags.txt" "$work/tus" 2 "$work/include" 2>&1); rc=$?
if [ $rc -eq 0 ]; then echo "selftest: the check passed a tree with a broken header:"; echo "$out"; fail=1; fi
grep -q "st_selftest_missing.hpp> does not compile on its own" <<< "$out" ||
  { echo "selftest: the missing include was not reported:"; echo "$out"; fail=1; }
grep -q "warnings in <shardtensor/st_selftest_warns.hpp>" <<< "$out" ||
  { echo "selftest: the warning was not reported:"; echo "$out"; fail=1; }
grep -q "st_selftest_fwd_bad.hpp> does not compile on its own" <<< "$out" ||
  { echo "selftest: the forwarder of an unchecked broken header was not reported:"; echo "$out"; fail=1; }
grep -q "st_selftest_good\|st_selftest_fwd.hpp" <<< "$out" && { echo "selftest: the good header or its forwarder was reported:"; echo "$out"; fail=1; }
out=$(bash "$here/header_check.sh" "$work/flags.txt" "$work/good_tus" 2 "$work/include" 2>&1) ||
  { echo "selftest: the check failed a good header:"; echo "$out"; fail=1; }
grep -q "; 1 made only of includes of checked headers" <<< "$out" ||
  { echo "selftest: the forwarder of the good header was compiled:"; echo "$out"; fail=1; }
[ $fail = 0 ] && echo "header_check_selftest: a missing include, a warning and a forwarder of an unchecked broken header fail the check; a good header and its forwarder pass"
exit $fail

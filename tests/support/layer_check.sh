#!/usr/bin/env bash
# ctest layer_dependencies (issue 31): the folders of the library form a graph without cycles, and
# no folder includes another folder's private header except the backend pairs allowed below.
# Usage: layer_check.sh <root>
#   root: a source tree with include/shardtensor/<folder>/, src/<folder>/ and kernels/ (the repo
#         root; tests/support/layer_check_selftest.sh runs it on small planted trees).
#
# Every `#include` line of every file under include/shardtensor, src and kernels is read (a line
# that starts with `#include`, so commented-out ones do not count) and resolved the way the
# compiler's -I list does it:
#   "shardtensor/<folder>/x.hpp" or <shardtensor/...>   public header of <folder> (include/)
#   "x.hpp" next to the including file                   that file's folder
#   "<folder>/x.hpp" under src/                          private header of <folder> (src/)
#   anything else (standard, fmt, MPI, CUDA, ...)        not ours: ignored
# The folder of a file: include/shardtensor/<folder>/..., src/<folder>/..., a file directly in
# src/ is the folder of its stem (src/kernels_api.hpp: kernels_api), kernels/ is "kernels";
# include/shardtensor/config.hpp (generated) counts as core, shardtensor.hpp as "umbrella".
# Checks, each listing the offending file:line:
#   (a) a cycle between folders (an include of folder B from folder A is an edge A -> B);
#   (b) a private header (src/<B>/..., kernels/...) included from a file of another folder A,
#       unless A -> B is an allowed backend pair.
# Prints the folder graph (edges with their include counts) either way. Exit 0 when clean.
set -uo pipefail
root=${1:?usage: layer_check.sh <root>}
cd "$root" || { echo "layer_check: no directory $root" >&2; exit 2; }

# Allowed backend pairs (docs/architecture.md, "Layers and the guard"): the CUDA backend in
# src/cuda implements exec's private kernel-family interfaces (src/exec/<family>_kernels.hpp) and
# calls the launchers behind the kernel firewall (src/kernels_api*); exec's CPU tables share the
# firewall's bf16/f16 conversion and pointwise formulas (kernels_api/convert_ops.hpp,
# pointwise_ops.hpp) with the kernels; kernels/*.cu include only the firewall.
allow="cuda>exec cuda>kernels_api exec>kernels_api kernels>kernels_api"

dirs=()
for d in include/shardtensor src kernels; do [ -d "$d" ] && dirs+=("$d"); done
[ ${#dirs[@]} -gt 0 ] || { echo "layer_check: nothing to scan under $root" >&2; exit 2; }
list=$(mktemp)
trap 'rm -f "$list"' EXIT
find "${dirs[@]}" -type f \( -name '*.hpp' -o -name '*.h' -o -name '*.cpp' -o -name '*.cc' -o -name '*.cu' \
  -o -name '*.cuh' -o -name '*.inc' \) | LC_ALL=C sort > "$list"
[ -s "$list" ] || { echo "layer_check: no source files under $root" >&2; exit 2; }

# shellcheck disable=SC2046
LC_ALL=C awk -v listfile="$list" -v allow="$allow" '
function folder_of(p,   n, a, f) {
  n = split(p, a, "/")
  if (a[1] == "include") {
    if (n >= 4) return a[3]
    return a[3] == "config.hpp" ? "core" : "umbrella"
  }
  if (a[1] == "src") {
    if (n >= 3) return a[2]
    f = a[2]; sub(/\.[^.]*$/, "", f); return f
  }
  if (a[1] == "kernels") return "kernels"
  return ""
}
function is_private(p) { return p !~ /^include\// }
function dirname(p) { if (p !~ /\//) return "."; sub(/\/[^\/]*$/, "", p); return p }
function normalize(p,   n, a, out, m, i) {      # folds "." and ".." components
  n = split(p, a, "/"); m = 0
  for (i = 1; i <= n; ++i) {
    if (a[i] == "" || a[i] == ".") continue
    if (a[i] == ".." && m > 0 && stack[m] != "..") { --m; continue }
    stack[++m] = a[i]
  }
  out = ""
  for (i = 1; i <= m; ++i) out = out (i > 1 ? "/" : "") stack[i]
  return out
}
function add_node(x) { if (!(x in node_id)) { node_id[x] = ++nn; node_name[nn] = x } }
BEGIN {
  na = split(allow, al, " ")
  for (i = 1; i <= na; ++i) allowed[al[i]] = 1
}
FILENAME == listfile { exists[$0] = 1; nfiles++; next }
{
  line = $0
  if (line !~ /^[ \t]*#[ \t]*include[ \t]*[<"]/) next
  sub(/^[ \t]*#[ \t]*include[ \t]*/, "", line)
  q = substr(line, 1, 1)
  close_ch = (q == "<") ? ">" : "\""
  rest = substr(line, 2)
  e = index(rest, close_ch)
  if (e == 0) next
  t = substr(rest, 1, e - 1)
  from = FILENAME
  if (t ~ /^shardtensor\//) target = "include/" t
  else if (q == "\"") {
    target = normalize(dirname(from) "/" t)
    if (!(target in exists)) {
      target = normalize("src/" t)
      if (!(target in exists)) next
    }
  } else next
  fa = folder_of(from); fb = folder_of(target)
  if (fa == "" || fb == "") next
  nincludes++
  if (fa == fb) next
  loc = from ":" FNR ": #include " q t close_ch
  add_node(fa); add_node(fb)
  key = fa SUBSEP fb
  if (!(key in ecount)) { ewhere[key] = loc; edges[++ne] = key }
  ecount[key]++
  if (is_private(target) && !((fa ">" fb) in allowed)) {
    bad[++nbad] = loc "  (folder " fa " includes " target ", private to " fb ")"
  } else if (is_private(target)) used_allow[fa ">" fb] = 1
}
END {
  for (i = 1; i <= ne; ++i) {
    split(edges[i], ab, SUBSEP)
    adj[node_id[ab[1]], node_id[ab[2]]] = 1
    reach[node_id[ab[1]], node_id[ab[2]]] = 1
  }
  for (k = 1; k <= nn; ++k) for (i = 1; i <= nn; ++i) if ((i, k) in reach)
    for (j = 1; j <= nn; ++j) if ((k, j) in reach) reach[i, j] = 1
  ncyc = 0
  for (r = 1; r <= nn; ++r) {
    if (!((r, r) in reach) || (r in done)) continue
    # r is in a cycle: its strongly connected component, and one shortest cycle through r (BFS)
    members = ""
    for (j = 1; j <= nn; ++j) if (((r, j) in reach) && ((j, r) in reach)) { done[j] = 1; members = members " " node_name[j] }
    split("", pred); split("", seen); head = 1; tail = 0; found = 0
    for (j = 1; j <= nn; ++j) if ((r, j) in adj) { if (j == r) continue; queue[++tail] = j; seen[j] = 1; pred[j] = r }
    while (head <= tail && !found) {
      u = queue[head++]
      if ((u, r) in adj) { last = u; found = 1; break }
      for (j = 1; j <= nn; ++j) if (((u, j) in adj) && !(j in seen)) { seen[j] = 1; pred[j] = u; queue[++tail] = j }
    }
    m = 0; u = last
    while (u != r) { path[++m] = u; u = pred[u] }
    cyc[++ncyc] = "folder include cycle among {" substr(members, 2) "}:"
    txt = node_name[r]
    for (i = m; i >= 1; --i) txt = txt " -> " node_name[path[i]]
    cyc[ncyc] = cyc[ncyc] " " txt " -> " node_name[r]
    prev = r
    for (i = m; i >= 0; --i) {
      nxt = (i >= 1) ? path[i] : r
      key = node_name[prev] SUBSEP node_name[nxt]
      cyc[ncyc] = cyc[ncyc] "\n    " node_name[prev] " -> " node_name[nxt] ": " ewhere[key] \
                  (ecount[key] > 1 ? "  (+" (ecount[key] - 1) " more)" : "")
      prev = nxt
    }
  }
  printf "layer_check: %d files, %d includes of our own headers, %d folder edges\n", nfiles, nincludes, ne
  # the graph, sorted by (from, to)
  for (i = 1; i <= ne; ++i) { split(edges[i], ab, SUBSEP); sorted[i] = ab[1] " -> " ab[2] "\t" ecount[edges[i]] }
  for (i = 2; i <= ne; ++i) { v = sorted[i]; j = i - 1; while (j >= 1 && sorted[j] > v) { sorted[j + 1] = sorted[j]; --j } sorted[j + 1] = v }
  for (i = 1; i <= ne; ++i) { split(sorted[i], sv, "\t"); printf "  %-28s %d\n", sv[1], sv[2] }
  for (i = 1; i <= na; ++i) if (!(al[i] in used_allow)) printf "layer_check: note: allowed backend pair %s is not used\n", al[i]
  status = 0
  if (ncyc > 0) {
    status = 1
    for (i = 1; i <= ncyc; ++i) printf "layer_check: FAIL: %s\n", cyc[i]
  }
  if (nbad > 0) {
    status = 1
    printf "layer_check: FAIL: %d private header(s) included from another folder (allowed backend pairs: %s):\n", nbad, allow
    for (i = 1; i <= nbad; ++i) printf "    %s\n", bad[i]
  }
  if (status == 0) {
    # layers, bottom to top: the level of a folder is 1 + the highest level of the folders it includes
    for (pass = 1; pass <= nn; ++pass)
      for (i = 1; i <= ne; ++i) {
        split(edges[i], ab, SUBSEP)
        if (level[ab[1]] < level[ab[2]] + 1) level[ab[1]] = level[ab[2]] + 1
      }
    top = 0
    for (i = 1; i <= nn; ++i) if (level[node_name[i]] > top) top = level[node_name[i]]
    printf "layer_check: layers, bottom to top (a folder includes only folders on lower lines):\n"
    for (l = 0; l <= top; ++l) {
      row = ""
      for (i = 1; i <= nn; ++i) if (level[node_name[i]] + 0 == l) row = row " " node_name[i]
      # sort the row
      nr = split(substr(row, 2), rw, " ")
      for (i = 2; i <= nr; ++i) { v = rw[i]; j = i - 1; while (j >= 1 && rw[j] > v) { rw[j + 1] = rw[j]; --j } rw[j + 1] = v }
      row = ""; for (i = 1; i <= nr; ++i) row = row (i > 1 ? " " : "") rw[i]
      printf "  %d: %s\n", l, row
    }
    print "layer_check: OK: no folder cycle, no private header included across folders"
  }
  exit status
}' "$list" $(cat "$list")

#!/bin/sh
# Fails when a kernel of LIB whose PTX entry name matches PATTERN contains an fma instruction.
#   check_ptx_no_fma.sh CUOBJDUMP LIB PATTERN
# Why: the neighbors family promises the CPU's squared distances bit for bit, so nvcc must never
# contract its multiply-adds (kernels/neighbors.cu uses the _rn intrinsics). GPGPU-Sim cannot see
# a contraction (it evaluates fma as a multiply and an add, two roundings), so the lane checks the
# PTX itself.
set -e
cuobjdump=$1 lib=$2 pattern=$3
"$cuobjdump" -ptx "$lib" | awk -v pat="$pattern" '
  /\.entry / { inside = ($0 ~ pat); if (inside) entries++ }
  inside && /^[ \t]*fma\./ { bad++; print "fma in " pat ": " $0 }
  inside && /^}/ { inside = 0 }
  END {
    if (entries == 0) { print "no PTX entry matches " pat; exit 1 }
    print entries " PTX entries match " pat ", " bad + 0 " fma instruction(s)"
    exit bad > 0
  }'

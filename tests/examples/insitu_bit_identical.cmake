# The in-situ example's contract (issue 8, scope 6), examples/insitu_advection.cpp:
#  1. the simulation's diagnostics ("diag ..." lines, %.17g) are bit-identical with the surrogate
#     off and on (stable zero-copy views and snapshot views), at 3 ranks (uneven rows 12,12,13);
#  2. the surrogate trains: its last loss is below its first;
#  3. the surrogate is the unsharded computation: its first and last losses at 3 ranks (3x1) and 4
#     ranks (2x2, uneven rows and columns) agree with the 1-rank run to 1e-10 relative (fp64);
#  4. ghost reuse (the conv reads the simulation's ghost cells, the default) gives bit-identical
#     losses to the library's own exchange (--ghost-reuse off), stable and snapshot views, 3 and 4 ranks.
# Usage: cmake -DEXE=<insitu_advection> -DMPIEXEC=<mpiexec> "-DFLAGS=<mpiexec flags>" -P this-file
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
set(args --nx 51 --ny 37 --steps 40 --every 5 --train-iters 4 --diag-every 5 --seed 3)

# run(var np extra-args...): runs the example, fails on a non-zero exit, stores stdout in var.
function(run var np)
  execute_process(COMMAND ${MPIEXEC} -n ${np} ${flags} ${EXE} ${args} ${ARGN}
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 300)
  string(REPLACE ";" " " desc "${ARGN}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "insitu_advection ${desc} (np ${np}) failed (${rc}):\n${out}\n${err}")
  endif()
  if(err MATCHES "still holds its communicator")
    message(FATAL_ERROR "insitu_advection ${desc} (np ${np}): the library leaked its communicator:\n${err}")
  endif()
  message(STATUS "ran: np ${np} ${desc}")
  set(${var} "${out}" PARENT_SCOPE)
endfunction()

# diag_lines(var text): the "diag ..." lines of text, in order (a CMake list).
function(diag_lines var text)
  string(REGEX MATCHALL "diag step[^\n]*" lines "${text}")
  set(${var} "${lines}" PARENT_SCOPE)
endfunction()

# losses(prefix text): prefix_first / prefix_last from "surrogate_loss first=A last=B".
function(losses prefix text)
  if(NOT text MATCHES "surrogate_loss first=([-+0-9.eEna]+) last=([-+0-9.eEna]+)")
    message(FATAL_ERROR "no surrogate_loss line in:\n${text}")
  endif()
  set(${prefix}_first "${CMAKE_MATCH_1}" PARENT_SCOPE)
  set(${prefix}_last "${CMAKE_MATCH_2}" PARENT_SCOPE)
endfunction()

# 1. bit-identical diagnostics, surrogate off vs on (both view policies)
run(off 3 --surrogate off)
run(on 3 --surrogate on --view stable)
run(snap 3 --surrogate on --view snapshot)
diag_lines(d_off "${off}")
diag_lines(d_on "${on}")
diag_lines(d_snap "${snap}")
list(LENGTH d_off n)
if(NOT n EQUAL 8)
  message(FATAL_ERROR "expected 8 diag lines (40 steps, every 5), got ${n}:\n${off}")
endif()
if(NOT "${d_off}" STREQUAL "${d_on}")
  message(FATAL_ERROR "diagnostics differ with the surrogate on (stable views):\noff:\n${off}\non:\n${on}")
endif()
if(NOT "${d_off}" STREQUAL "${d_snap}")
  message(FATAL_ERROR "diagnostics differ with the surrogate on (snapshot views):\noff:\n${off}\non:\n${snap}")
endif()
if(off MATCHES "surrogate step")
  message(FATAL_ERROR "--surrogate off ran the surrogate:\n${off}")
endif()
if(NOT on MATCHES "surrogate step")
  message(FATAL_ERROR "--surrogate on did not run the surrogate:\n${on}")
endif()
message(STATUS "${n} diag lines bit-identical with the surrogate off / on (stable) / on (snapshot)")

# 2. it trains; 3. the losses equal the 1-rank run (and snapshot views give the same numbers)
losses(l3 "${on}")
losses(ls "${snap}")
run(one 1 --surrogate on)
run(four 4 --surrogate on --grid 2x2)
losses(l1 "${one}")
losses(l4 "${four}")
if(NOT four MATCHES "rows per rank \\{18,19\\}, columns per rank \\{25,26\\}")
  message(FATAL_ERROR "unexpected decomposition at 2x2:\n${four}")
endif()
execute_process(COMMAND awk "BEGIN { exit (${l3_last} < 0.5 * ${l3_first}) ? 0 : 1 }" RESULT_VARIABLE cmp)
if(NOT cmp EQUAL 0)
  message(FATAL_ERROR "the surrogate did not train: loss ${l3_first} -> ${l3_last}")
endif()
foreach(pair "l3_first;l1_first" "l3_last;l1_last" "l4_first;l1_first" "l4_last;l1_last" "ls_first;l1_first"
             "ls_last;l1_last")
  list(GET pair 0 a)
  list(GET pair 1 b)
  execute_process(COMMAND awk "BEGIN { d = ${${a}} - ${${b}}; if (d < 0) d = -d; r = ${${b}}; if (r < 0) r = -r; exit (d <= 1e-10 * r) ? 0 : 1 }"
    RESULT_VARIABLE cmp)
  if(NOT cmp EQUAL 0)
    message(FATAL_ERROR "${a}=${${a}} differs from ${b}=${${b}} by more than 1e-10 relative")
  endif()
endforeach()
message(STATUS "surrogate loss ${l1_first} -> ${l1_last} at 1 rank; 3 ranks (${l3_first} -> ${l3_last}) and 2x2 (${l4_first} -> ${l4_last}) agree to 1e-10")

# 4. ghost reuse on (the default, above) vs off: the same losses, bit for bit
run(on_nogr 3 --surrogate on --view stable --ghost-reuse off)
run(snap_nogr 3 --surrogate on --view snapshot --ghost-reuse off)
run(four_nogr 4 --surrogate on --grid 2x2 --ghost-reuse off)
losses(l3n "${on_nogr}")
losses(lsn "${snap_nogr}")
losses(l4n "${four_nogr}")
foreach(pair "l3_first;l3n_first" "l3_last;l3n_last" "ls_first;lsn_first" "ls_last;lsn_last" "l4_first;l4n_first"
             "l4_last;l4n_last")
  list(GET pair 0 a)
  list(GET pair 1 b)
  if(NOT "${${a}}" STREQUAL "${${b}}")
    message(FATAL_ERROR "ghost reuse changes the surrogate: ${a}=${${a}} but without it ${b}=${${b}}")
  endif()
endforeach()
diag_lines(d_nogr "${on_nogr}")
if(NOT "${d_off}" STREQUAL "${d_nogr}")
  message(FATAL_ERROR "diagnostics differ with the surrogate on (no ghost reuse):\noff:\n${off}\non:\n${on_nogr}")
endif()
message(STATUS "ghost reuse on / off: bit-identical surrogate losses at 3 ranks (stable, snapshot) and 2x2")

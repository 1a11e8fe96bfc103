# The in-situ example under the collective watchdog (docs/embedding.md, "Communicator"): rank 1
# of the simulation stalls for 120 s before the first surrogate phase; the other ranks wait in
# the library's first collective and, with --comm-timeout 2, the job must end well before the
# stall is over, non-zero, with the watchdog's message naming the library's communicator.
# Usage: cmake -DEXE=<insitu_advection> -DMPIEXEC=<mpiexec> "-DFLAGS=<mpiexec flags>" -P this-file
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} -n 3 ${flags} ${EXE} --nx 51 --ny 37 --steps 10 --every 5 --comm-timeout 2
                        --stall-rank 1 --stall-seconds 120
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 100)
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the stalled run exited 0 after ${elapsed} s:\n${out}\n${err}")
endif()
if(NOT "${out}${err}" MATCHES "shardtensor watchdog: rank [02] of communicator 'insitu surrogate' \\(MPI, 3 ranks")
  message(FATAL_ERROR "no watchdog message (exit ${rc}, ${elapsed} s):\n${out}\n${err}")
endif()
if(elapsed GREATER 60)
  message(FATAL_ERROR "the job took ${elapsed} s to end (timeout 2 s, stall 120 s)")
endif()
message(STATUS "stalled rank: job ended by the watchdog after ${elapsed} s (exit ${rc})")

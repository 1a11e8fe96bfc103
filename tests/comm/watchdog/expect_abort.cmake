# Runs `MPIEXEC -n NP FLAGS EXE MODE` (a watchdog_stall mode) and checks that the job ends with a
# non-zero exit code within BOUND seconds (the stalled rank sleeps 120 s, so a job that only ends
# when it wakes fails the bound) and prints EXPECT (a regex) on its output.
# Usage: cmake -DEXE=.. -DMPIEXEC=.. "-DFLAGS=.." -DNP=3 -DMODE=allreduce "-DEXPECT=regex" -DBOUND=40 -P this-file
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} -n ${NP} ${flags} ${EXE} ${MODE} 120
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 100)
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
message(STATUS "mode ${MODE}: exit '${rc}' after ${elapsed} s\n${out}\n${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "mode ${MODE}: the job exited 0; the watchdog should have aborted it")
endif()
if(elapsed GREATER BOUND)
  message(FATAL_ERROR "mode ${MODE}: the job took ${elapsed} s (bound ${BOUND} s): the watchdog did not end it")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "mode ${MODE}: no watchdog message matching '${EXPECT}'")
endif()

# Checkpoint / resume of a training example (issue 8, scope 5):
#  (a) at one rank count and mesh, N steps straight through and N/2 steps (--stop-after, with
#      --checkpoint) followed by --resume up to N print the identical final_loss= line (bitwise:
#      string equality of the printed value);
#  (b) the same N/2 checkpoint resumed at other rank counts and meshes ends within 1e-4 relative
#      of the straight run.
# Usage: cmake -DEXE=<example> -DMPIEXEC=<mpiexec> "-DFLAGS=<mpiexec flags>" "-DARGS=<example flags>"
#              -DSTEPS=<N> -DNP=<ranks of (a)> "-DOTHER=<np[,flags...]>|<np[,flags...]>" -DDIR=<scratch dir>
#              -P this-file
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
separate_arguments(args UNIX_COMMAND "${ARGS}")
math(EXPR half "${STEPS} / 2")
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")

# run(<out var> np args...): runs the example, fails on a non-zero exit, returns its final_loss.
function(run outvar np)
  string(REPLACE ";" " " desc "np ${np} ${ARGN}")
  execute_process(COMMAND ${MPIEXEC} -n ${np} ${flags} ${EXE} ${args} --steps ${STEPS} ${ARGN}
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 600)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run '${desc}' failed (${rc}):\n${out}\n${err}")
  endif()
  if(NOT out MATCHES "final_loss=([-+0-9.eE]+)")
    message(FATAL_ERROR "run '${desc}' printed no final_loss:\n${out}")
  endif()
  message(STATUS "${desc}: final_loss=${CMAKE_MATCH_1}")
  set(${outvar} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  set(last_out "${out}" PARENT_SCOPE)
endfunction()

string(REPLACE "," ";" np_a "${NP}")
list(POP_FRONT np_a np)
run(straight ${np} ${np_a})
run(first ${np} ${np_a} --stop-after ${half} --checkpoint ${DIR}/ck.h5 --checkpoint-every 1)
if(NOT EXISTS "${DIR}/ck.h5" OR EXISTS "${DIR}/ck.h5.tmp")
  message(FATAL_ERROR "no checkpoint ${DIR}/ck.h5 after the first half (or a left-over .tmp)")
endif()
file(COPY_FILE "${DIR}/ck.h5" "${DIR}/half.h5")
run(resumed ${np} ${np_a} --checkpoint ${DIR}/ck.h5 --resume)
if(NOT last_out MATCHES "resumed from [^\n]* at step ${half}")
  message(FATAL_ERROR "the resumed run did not start at step ${half}:\n${last_out}")
endif()
if(NOT resumed STREQUAL straight)
  message(FATAL_ERROR "(a) resumed final_loss=${resumed} differs from the straight run's ${straight} at np ${NP}")
endif()
message(STATUS "(a) bitwise: ${resumed} == ${straight}")

string(REPLACE "|" ";" others "${OTHER}")
set(i 0)
foreach(other IN LISTS others)
  string(REPLACE "," ";" o "${other}")
  list(POP_FRONT o onp)
  math(EXPR i "${i} + 1")
  file(COPY_FILE "${DIR}/half.h5" "${DIR}/other${i}.h5")
  run(loss ${onp} ${o} --checkpoint ${DIR}/other${i}.h5 --resume)
  execute_process(COMMAND awk "BEGIN { d = ${loss} - ${straight}; if (d < 0) d = -d; r = ${straight}; if (r < 0) r = -r; exit (d <= 1e-4 * r) ? 0 : 1 }"
    RESULT_VARIABLE cmp)
  if(NOT cmp EQUAL 0)
    message(FATAL_ERROR "(b) resumed at '${other}': final_loss ${loss} differs from ${straight} by more than 1e-4 relative")
  endif()
  message(STATUS "(b) resumed at '${other}': ${loss} within 1e-4 of ${straight}")
endforeach()
file(REMOVE_RECURSE "${DIR}")

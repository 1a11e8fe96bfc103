# Runs an example at 1, 2, 3 and 4 ranks (and on a 2x2 mesh, and data x domain 2 x 2) with one
# seed and checks that every final_loss agrees with the 1-rank value to REL relative (default 1e-4,
# fp32; the bf16 / fp16 runs pass their own, measured).
# Usage: cmake -DEXE=<unet_surrogate> -DMPIEXEC=<mpiexec> "-DFLAGS=<mpiexec flags>"
#              ["-DARGS=<example flags>"] ["-DRUNS=<np[,flags...]>|<np[,flags...]>..."] [-DREL=<tol>]
#              ["-DKEYS=<key>;<key>..."] -P this-file
# KEYS: further `key=<value>` lines the example prints (e.g. the nowcaster's val_mse_dbz2 and
# val_csi) that must agree with the first run's to REL as well.
# (ARGS defaults to the U-Net example's flags below, RUNS to the runs below; the first run is
# the reference.)
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
if(DEFINED ARGS AND NOT ARGS STREQUAL "")
  separate_arguments(args UNIX_COMMAND "${ARGS}")
else()
  set(args --steps 20 --grid 32 --width 8 --depth 2 --seed 3 --log-every 10)
endif()
if(DEFINED RUNS AND NOT RUNS STREQUAL "")
  string(REPLACE "|" ";" runs "${RUNS}")
else()
  set(runs "1" "2" "3" "4" "4,--mesh,2x2" "4,--mesh,2x1,--data,2")
endif()
if(NOT DEFINED REL OR REL STREQUAL "")
  set(REL 1e-4)
endif()
set(ref "")
foreach(run IN LISTS runs)
  string(REPLACE ";" " " desc "${run}")
  string(REPLACE "," ";" run "${run}")
  list(POP_FRONT run np)
  execute_process(COMMAND ${MPIEXEC} -n ${np} ${flags} ${EXE} ${args} ${run}
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run '${desc}' failed (${rc}):\n${out}\n${err}")
  endif()
  if(NOT out MATCHES "final_loss=([-+0-9.eE]+)")
    message(FATAL_ERROR "run '${desc}' printed no final_loss:\n${out}")
  endif()
  set(loss "${CMAKE_MATCH_1}")
  message(STATUS "np ${desc}: final_loss=${loss}")
  foreach(key IN LISTS KEYS)
    if(NOT out MATCHES "${key}=([-+0-9.eE]+)")
      message(FATAL_ERROR "run '${desc}' printed no ${key}=:\n${out}")
    endif()
    set(val "${CMAKE_MATCH_1}")
    message(STATUS "np ${desc}: ${key}=${val}")
    if(NOT DEFINED ref_${key})
      set(ref_${key} "${val}")
    else()
      execute_process(COMMAND awk "BEGIN { d = ${val} - ${ref_${key}}; if (d < 0) d = -d; r = ${ref_${key}}; if (r < 0) r = -r; exit (d <= ${REL} * r) ? 0 : 1 }"
        RESULT_VARIABLE cmp)
      if(NOT cmp EQUAL 0)
        message(FATAL_ERROR "${key} ${val} at '${desc}' differs from ${ref_${key}} of the first run by more than ${REL} relative")
      endif()
    endif()
  endforeach()
  if(ref STREQUAL "")
    set(ref "${loss}")
  else()
    # |loss - ref| <= 1e-4 * |ref|, in integer arithmetic on scaled values (CMake has no floats).
    execute_process(COMMAND awk "BEGIN { d = ${loss} - ${ref}; if (d < 0) d = -d; r = ${ref}; if (r < 0) r = -r; exit (d <= ${REL} * r) ? 0 : 1 }"
      RESULT_VARIABLE cmp)
    if(NOT cmp EQUAL 0)
      message(FATAL_ERROR "final_loss ${loss} at '${desc}' differs from ${ref} at 1 rank by more than ${REL} relative")
    endif()
  endif()
endforeach()

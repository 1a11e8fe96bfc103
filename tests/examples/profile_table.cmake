# The profiler's table at exit (issue 30 item 1): a small U-Net run with SHARDTENSOR_PROFILE=1
# prints one table per rank, every line rank-prefixed, with the conv rows, the halo and collective
# rows (2 ranks) and the allocator rows; SHARDTENSOR_PROFILE_FILE=<dir>/p_%r.txt writes one file
# per rank instead; SHARDTENSOR_PROFILE=garbage fails with a message naming the variable.
# Usage: cmake -DEXE=<unet_surrogate> -DMPIEXEC=<mpiexec> "-DFLAGS=<mpiexec flags>" -P this-file
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
set(args --steps 3 --grid 32 --width 4 --depth 2 --log-every 3)
set(dir "${CMAKE_CURRENT_BINARY_DIR}/profile_table")
file(REMOVE_RECURSE "${dir}")
file(MAKE_DIRECTORY "${dir}")

function(require text regex what)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "${what}: no match for '${regex}' in:\n${text}")
  endif()
endfunction()

# 1 rank, table on stderr.
execute_process(COMMAND ${CMAKE_COMMAND} -E env SHARDTENSOR_PROFILE=1 ${MPIEXEC} ${flags} -n 1 ${EXE} ${args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "1-rank run failed (${rc}):\n${out}\n${err}")
endif()
require("${err}" "\\[rank 0\\] shardtensor profile, rank 0" "1 rank, stderr")
require("${err}" "\\[rank 0\\] category +name/pass +calls +host us +host us/call +device ms +bytes" "1 rank, columns")
foreach(row "op +conv/forward +[1-9]" "op +conv/backward_weight +[1-9]" "op +norm/moments" "autograd +backward +3 "
            "optim +adam/step +3 " "alloc +cpu/request +[1-9]")
  require("${err}" "\\[rank 0\\] ${row}" "1 rank")
endforeach()

# 2 ranks, one file per rank.
execute_process(COMMAND ${CMAKE_COMMAND} -E env SHARDTENSOR_PROFILE=1 "SHARDTENSOR_PROFILE_FILE=${dir}/p_%r.txt"
                        ${MPIEXEC} ${flags} -n 2 ${EXE} ${args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "2-rank run failed (${rc}):\n${out}\n${err}")
endif()
foreach(r 0 1)
  if(NOT EXISTS "${dir}/p_${r}.txt")
    message(FATAL_ERROR "SHARDTENSOR_PROFILE_FILE: ${dir}/p_${r}.txt was not written")
  endif()
  file(READ "${dir}/p_${r}.txt" t)
  foreach(row "shardtensor profile, rank ${r}" "op +conv/forward +[1-9]" "halo +halo/forward_start +[1-9]"
              "halo +halo/adjoint_finish +[1-9]" "comm +allreduce +[1-9][0-9]* +[0-9.]+ +[0-9.]+ +- +[0-9.]+ (B|KiB|MiB)")
    require("${t}" "\\[rank ${r}\\] ${row}" "rank ${r} file")
  endforeach()
endforeach()

# A bad value is an error, not ignored.
execute_process(COMMAND ${CMAKE_COMMAND} -E env SHARDTENSOR_PROFILE=garbage ${MPIEXEC} ${flags} -n 1 ${EXE} ${args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "SHARDTENSOR_PROFILE=garbage was accepted:\n${out}\n${err}")
endif()
require("${out}${err}" "SHARDTENSOR_PROFILE: 'garbage' is not a setting" "garbage")
message(STATUS "profile tables: ok")

# Builds and runs the consumer project (this directory) against shardtensor; run with cmake -P.
#   -DMODE=package  : install shardtensor into WORK_DIR/prefix — from the build tree INSTALL_FROM
#                     when given (cmake --install), else configure + build + install it from
#                     SOURCE_DIR —, then build the consumer with find_package(shardtensor
#                     [COMPONENTS cuda]) from that prefix
#   -DMODE=cpu_only : build a CPU-only consumer against the install at PREFIX (made by MODE=package)
#                     with the CUDA toolkit hidden (no nvcc on PATH, CUDAToolkit_ROOT at an empty
#                     directory, the toolkit's prefixes ignored); check that neither the program nor
#                     libshardtensor.so needs a CUDA library (readelf -d) and run it
#   -DMODE=subdir   : build the consumer with add_subdirectory(SOURCE_DIR); the library as one unity
#                     TU (fastest at -O0, and it proves the library's private names do not collide)
# Other inputs: SOURCE_DIR WORK_DIR GENERATOR BUILD_TYPE CXX_COMPILER ENABLE_MPI ENABLE_CUDA
# ENABLE_NCCL CUDA_ARCHITECTURES JOBS MPIEXEC MPIEXEC_NUMPROC_FLAG MPIEXEC_FLAGS (space-separated) NP
# PREFIX (cpu_only) CUDA_ROOTS (cpu_only: toolkit directories to hide, ;-separated) INSTALL_FROM
# (package) CXX_LAUNCHER (e.g. ccache, for the inner builds of the library).
cmake_minimum_required(VERSION 3.24)
foreach(_v MODE SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "run_consumer.cmake: -D${_v}=... is required")
  endif()
endforeach()
if(NOT DEFINED JOBS)
  set(JOBS 2)
endif()
if(NOT DEFINED NP)
  set(NP 2)
endif()
set(_consumer_src "${CMAKE_CURRENT_LIST_DIR}")

# Options shared by every inner configure: same compiler, build type and feature set as the
# outer build, no tests/benchmarks/examples, nothing found through the user package registry.
set(_common -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
set(_feature_flags "")
if(GENERATOR)
  list(PREPEND _common -G "${GENERATOR}")
endif()
if(DEFINED BUILD_TYPE)  # empty: no optimisation flags (consumer_subdir, see consumer_tests.cmake)
  list(APPEND _common "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()
if(CXX_COMPILER)
  list(APPEND _common -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
set(_launcher "")
if(CXX_LAUNCHER)
  set(_launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER})
endif()
foreach(_f MPI CUDA NCCL)
  if(DEFINED ENABLE_${_f})
    list(APPEND _feature_flags -DSHARDTENSOR_ENABLE_${_f}=${ENABLE_${_f}})
  endif()
endforeach()
if(ENABLE_CUDA AND CUDA_ARCHITECTURES)
  list(APPEND _feature_flags "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}")
endif()

# Runs one step; prints its output only when it fails.
function(step name)
  string(TIMESTAMP _t0 "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  string(TIMESTAMP _t1 "%s")
  math(EXPR _dt "${_t1} - ${_t0}")
  if(NOT _rc EQUAL 0)
    message("${_out}")
    message(FATAL_ERROR "consumer (${MODE}): step '${name}' failed (exit ${_rc}): ${ARGN}")
  endif()
  message(STATUS "consumer (${MODE}): ${name} ok (${_dt} s)")
  set(step_output "${_out}" PARENT_SCOPE)
endfunction()

# Fails unless `readelf -d FILE` lists no CUDA library as NEEDED.
function(check_no_cuda_needed file)
  if(NOT READELF)
    message(FATAL_ERROR "consumer (${MODE}): readelf not found; cannot check ${file}")
  endif()
  execute_process(COMMAND ${READELF} -d "${file}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "consumer (${MODE}): readelf -d ${file} failed: ${_err}")
  endif()
  string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*" _needed "${_out}")
  if(NOT _needed)
    message(FATAL_ERROR "consumer (${MODE}): readelf -d ${file} listed no NEEDED entries (bad parse?)")
  endif()
  foreach(_n IN LISTS _needed)
    if(_n MATCHES "lib(cudart|cuda|nccl|cudnn|cublas|cublasLt|shardtensor_cuda)[.]so")
      message(FATAL_ERROR "consumer (${MODE}): ${file} needs a CUDA library: ${_n}")
    endif()
  endforeach()
  list(LENGTH _needed _count)
  message(STATUS "consumer (${MODE}): ${file}: ${_count} NEEDED entries, none of them a CUDA library")
endfunction()
find_program(READELF NAMES readelf)

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(_env "")  # command prefix for the consumer configure (cpu_only: hide the CUDA toolkit)
if(MODE STREQUAL "package")
  set(_prefix "${WORK_DIR}/prefix")
  if(INSTALL_FROM)
    step("install shardtensor from ${INSTALL_FROM}" ${CMAKE_COMMAND} --install "${INSTALL_FROM}" --prefix "${_prefix}")
  else()
    step("configure shardtensor" ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/shardtensor-build" ${_common}
         ${_feature_flags} ${_launcher}
         -DCMAKE_INSTALL_PREFIX=${_prefix} -DSHARDTENSOR_BUILD_TESTS=OFF -DSHARDTENSOR_BUILD_BENCH=OFF
         -DSHARDTENSOR_BUILD_EXAMPLES=OFF)
    step("build shardtensor" ${CMAKE_COMMAND} --build "${WORK_DIR}/shardtensor-build" --parallel ${JOBS})
    step("install shardtensor" ${CMAKE_COMMAND} --install "${WORK_DIR}/shardtensor-build")
  endif()
  file(GLOB_RECURSE _cfg "${_prefix}/*/shardtensorConfig.cmake")
  foreach(_f include/shardtensor/shardtensor.hpp include/shardtensor/config.hpp)
    if(NOT EXISTS "${_prefix}/${_f}")
      message(FATAL_ERROR "consumer (package): ${_f} was not installed")
    endif()
  endforeach()
  if(NOT _cfg)
    message(FATAL_ERROR "consumer (package): no shardtensorConfig.cmake under ${_prefix}")
  endif()
  step("configure consumer" ${CMAKE_COMMAND} -S "${_consumer_src}" -B "${WORK_DIR}/consumer-build" ${_common}
       -DSHARDTENSOR_CONSUMER_MODE=package -DCMAKE_PREFIX_PATH=${_prefix})
elseif(MODE STREQUAL "cpu_only")
  if(NOT PREFIX OR NOT EXISTS "${PREFIX}")
    message(FATAL_ERROR "consumer (cpu_only): -DPREFIX=<installed shardtensor> is required (made by consumer_install)")
  endif()
  # A toolkit installed into the system directories (Debian's nvidia-cuda-toolkit puts nvcc in
  # /usr/bin and libcudart in /usr/lib/<triplet>, e.g. after scripts/gpusim.sh) cannot be hidden
  # without hiding the compiler and make too: report the test as skipped (ctest matches the line
  # through SKIP_REGULAR_EXPRESSION), never as passed.
  foreach(_sys /usr/bin /bin /usr/sbin)
    if(EXISTS "${_sys}/nvcc")
      message("consumer (cpu_only): SKIPPED: a CUDA toolkit is installed in the system directories "
              "(${_sys}/nvcc), so a machine without the toolkit cannot be simulated here")
      return()
    endif()
  endforeach()
  # Hide the toolkit: an empty CUDAToolkit_ROOT (FindCUDAToolkit then searches nowhere else once
  # nvcc is off PATH), no CUDA_PATH/CUDA_HOME, and the toolkit's prefixes on the ignore lists.
  set(_no_cuda "${WORK_DIR}/no-cuda-here")
  file(MAKE_DIRECTORY "${_no_cuda}")
  set(_hide ${CUDA_ROOTS} /usr/local/cuda)
  file(GLOB _versioned LIST_DIRECTORIES true /usr/local/cuda-*)
  list(APPEND _hide ${_versioned})
  foreach(_r IN LISTS _hide)
    if(EXISTS "${_r}")
      file(REAL_PATH "${_r}" _real)
      list(APPEND _hide "${_real}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _hide)
  set(_ignore_paths "")
  foreach(_r IN LISTS _hide)
    foreach(_sub bin include lib lib64 targets/x86_64-linux/lib targets/x86_64-linux/include)
      list(APPEND _ignore_paths "${_r}/${_sub}")
    endforeach()
  endforeach()
  set(_path "")
  string(REPLACE ":" ";" _path_list "$ENV{PATH}")
  # Directories holding an nvcc (or a wrapper script of it, like /usr/local/bin here) are ignored
  # by find_program and dropped from PATH.
  foreach(_p IN LISTS _path_list ITEMS /usr/local/bin /usr/local/sbin /usr/bin /bin /opt/bin)
    if(EXISTS "${_p}/nvcc")
      list(APPEND _ignore_paths "${_p}")
    endif()
  endforeach()
  foreach(_p IN LISTS _path_list)
    set(_keep ON)
    foreach(_r IN LISTS _hide)
      string(FIND "${_p}" "${_r}" _at)
      if(_at EQUAL 0)
        set(_keep OFF)
      endif()
    endforeach()
    if(_keep AND NOT EXISTS "${_p}/nvcc")
      list(APPEND _path "${_p}")
    endif()
  endforeach()
  string(REPLACE ";" ":" _path "${_path}")
  set(_env ${CMAKE_COMMAND} -E env --unset=CUDA_PATH --unset=CUDA_HOME --unset=CUDAToolkit_ROOT --unset=CUDNN_ROOT
           --unset=NCCL_ROOT --unset=LD_LIBRARY_PATH --unset=LIBRARY_PATH --unset=CPATH "PATH=${_path}")
  # The lists go in through an initial-cache script (-C): step() would split a ;-list argument.
  list(REMOVE_DUPLICATES _ignore_paths)
  file(WRITE "${WORK_DIR}/hide-cuda.cmake"
       "set(CUDAToolkit_ROOT \"${_no_cuda}\" CACHE PATH \"\")\n"
       "set(CMAKE_IGNORE_PREFIX_PATH \"${_hide}\" CACHE STRING \"\")\n"
       "set(CMAKE_IGNORE_PATH \"${_ignore_paths}\" CACHE STRING \"\")\n")
  step("configure consumer (CUDA toolkit hidden)" ${_env} ${CMAKE_COMMAND} -C "${WORK_DIR}/hide-cuda.cmake"
       -S "${_consumer_src}" -B "${WORK_DIR}/consumer-build" ${_common} -DSHARDTENSOR_CONSUMER_MODE=cpu_only
       -DCMAKE_PREFIX_PATH=${PREFIX})
elseif(MODE STREQUAL "subdir")
  step("configure consumer" ${CMAKE_COMMAND} -S "${_consumer_src}" -B "${WORK_DIR}/consumer-build" ${_common}
       ${_feature_flags} ${_launcher} -DSHARDTENSOR_CONSUMER_MODE=subdir -DSHARDTENSOR_SOURCE_DIR=${SOURCE_DIR}
       -DSHARDTENSOR_UNITY_BUILD=ON -DSHARDTENSOR_UNITY_BATCH_SIZE=0)
else()
  message(FATAL_ERROR "run_consumer.cmake: MODE must be package or subdir, not '${MODE}'")
endif()
string(REGEX MATCH "consumer: shardtensor [^\n]*" _line "${step_output}")
message(STATUS "${_line}")
step("build consumer" ${_env} ${CMAKE_COMMAND} --build "${WORK_DIR}/consumer-build" --parallel ${JOBS})

set(_exe "${WORK_DIR}/consumer-build/shardtensor_consumer")
if(MODE STREQUAL "cpu_only")
  file(GLOB _core_libs "${PREFIX}/lib*/libshardtensor.so")
  if(NOT _core_libs)
    message(FATAL_ERROR "consumer (cpu_only): no libshardtensor.so under ${PREFIX}/lib*")
  endif()
  foreach(_f "${_exe}" ${_core_libs})
    check_no_cuda_needed("${_f}")
  endforeach()
endif()
# Run without the CUDA library directories on LD_LIBRARY_PATH (the program reports any CUDA
# library that still gets mapped into it).
if(ENABLE_MPI AND MPIEXEC)
  separate_arguments(_flags UNIX_COMMAND "${MPIEXEC_FLAGS}")
  step("run consumer (${NP} ranks)" ${_env} ${MPIEXEC} ${MPIEXEC_NUMPROC_FLAG} ${NP} ${_flags} "${_exe}")
else()
  step("run consumer" ${_env} "${_exe}")
endif()
message(STATUS "${step_output}")
if(NOT step_output MATCHES "consumer: shardtensor .*: OK")
  message(FATAL_ERROR "consumer (${MODE}): the program did not report OK")
endif()

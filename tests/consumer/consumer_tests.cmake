# ctest tests that build tests/consumer against shardtensor as a user would (included from
# tests/CMakeLists.txt).
#   consumer_install   install THIS build (cmake --install, the package a user gets from these
#                      sources and settings: MPI/CUDA/NCCL as configured), consumer via
#                      find_package (+ COMPONENTS cuda). It does not rebuild the library.
#   consumer_cpu_only  a CPU-only consumer of that same install with the CUDA toolkit hidden at
#                      configure time and no CUDA library needed or loaded at run time
#   consumer_subdir    consumer via add_subdirectory: builds the library again inside the consumer,
#                      CPU-only (MPI as configured): what it checks is the add_subdirectory wiring,
#                      and nvcc would only recompile the kernels that consumer_install's package
#                      already carries (README (b) on 2 cores, issue 14).
set(_consumer_cuda_arch "")
if(SHARDTENSOR_ENABLE_CUDA)
  list(GET CMAKE_CUDA_ARCHITECTURES 0 _consumer_cuda_arch)
endif()
set(_consumer_mpiexec_flags "")
if(SHARDTENSOR_ENABLE_MPI)
  string(JOIN " " _consumer_mpiexec_flags ${SHARDTENSOR_MPIEXEC_FLAGS})
endif()
foreach(_mode package subdir)
  if(_mode STREQUAL "package")
    set(_name consumer_install)
    set(_install_from ${PROJECT_BINARY_DIR})
    set(_cuda ${SHARDTENSOR_ENABLE_CUDA})
    set(_nccl ${SHARDTENSOR_ENABLE_NCCL})
  else()
    set(_name consumer_subdir)
    set(_install_from "")
    set(_cuda OFF)
    set(_nccl OFF)
  endif()
  # consumer_subdir compiles the library once more, inside the consumer; what it checks is the
  # add_subdirectory wiring (targets, options, no tests/benchmarks/examples as a subproject) and a
  # run of the consumer, not the optimiser: it builds without optimisation flags (an empty
  # CMAKE_BUILD_TYPE), which halves that compile (issue 33; e.g. src/dist/redistribute.cpp 8.2 s
  # at -O3, 3.7 s at -O0), and as one unity TU (run_consumer.cmake): the library at -O0 took 278
  # CPU s file by file and 34 CPU s as one TU. ccache cannot serve it from the outer build: its objects' dependency
  # targets (-MT) differ, and ccache hashes them. consumer_install reuses the outer build itself.
  set(_build_type ${CMAKE_BUILD_TYPE})
  if(_mode STREQUAL "subdir")
    set(_build_type "")
  endif()
  add_test(NAME ${_name}
    COMMAND ${CMAKE_COMMAND}
      -DMODE=${_mode}
      -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
      -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/${_name}
      -DINSTALL_FROM=${_install_from}
      "-DGENERATOR=${CMAKE_GENERATOR}"
      -DBUILD_TYPE=${_build_type}
      -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
      "-DCXX_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}"
      -DENABLE_MPI=${SHARDTENSOR_ENABLE_MPI}
      -DENABLE_CUDA=${_cuda}
      -DENABLE_NCCL=${_nccl}
      -DCUDA_ARCHITECTURES=${_consumer_cuda_arch}
      -DJOBS=2
      -DMPIEXEC=${MPIEXEC_EXECUTABLE}
      -DMPIEXEC_NUMPROC_FLAG=${MPIEXEC_NUMPROC_FLAG}
      "-DMPIEXEC_FLAGS=${_consumer_mpiexec_flags}"
      -DNP=2
      -P ${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake)
  # PROCESSORS 1 (issue 33): each consumer test keeps about one core busy (its build is one or two
  # TUs at a time; 2-core AMD EPYC, idle: consumer_subdir 40.6 s wall for 45.4 CPU s,
  # consumer_install 12.2 for 12.1, consumer_cpu_only 12.0 for 12.0), so holding both ctest slots
  # left a core idle for about a minute of (b).
  set_tests_properties(${_name} PROPERTIES LABELS consumer TIMEOUT 1800 PROCESSORS 1
    ENVIRONMENT "OMP_NUM_THREADS=1")
endforeach()
set_tests_properties(consumer_install PROPERTIES FIXTURES_SETUP shardtensor_consumer_prefix)

set(_consumer_cuda_roots "")
if(SHARDTENSOR_ENABLE_CUDA)
  set(_consumer_cuda_roots "${CUDAToolkit_LIBRARY_ROOT}")
  if(CUDAToolkit_BIN_DIR)
    get_filename_component(_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
    list(APPEND _consumer_cuda_roots "${_root}")
  endif()
endif()
string(REPLACE ";" "\\;" _consumer_cuda_roots "${_consumer_cuda_roots}")
add_test(NAME consumer_cpu_only
  COMMAND ${CMAKE_COMMAND}
    -DMODE=cpu_only
    -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
    -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer_cpu_only
    -DPREFIX=${CMAKE_CURRENT_BINARY_DIR}/consumer_install/prefix
    "-DCUDA_ROOTS=${_consumer_cuda_roots}"
    "-DGENERATOR=${CMAKE_GENERATOR}"
    -DBUILD_TYPE=${CMAKE_BUILD_TYPE}
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DENABLE_MPI=${SHARDTENSOR_ENABLE_MPI}
    -DENABLE_CUDA=${SHARDTENSOR_ENABLE_CUDA}
    -DJOBS=2
    -DMPIEXEC=${MPIEXEC_EXECUTABLE}
    -DMPIEXEC_NUMPROC_FLAG=${MPIEXEC_NUMPROC_FLAG}
    "-DMPIEXEC_FLAGS=${_consumer_mpiexec_flags}"
    -DNP=2
    -P ${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake)
set_tests_properties(consumer_cpu_only PROPERTIES LABELS consumer TIMEOUT 600 PROCESSORS 1
  FIXTURES_REQUIRED shardtensor_consumer_prefix ENVIRONMENT "OMP_NUM_THREADS=1"
  SKIP_REGULAR_EXPRESSION "consumer \\(cpu_only\\): SKIPPED")

# ctest tests that build tests/consumer against shardtensor as a user would (included from
# tests/CMakeLists.txt). The inner builds mirror this build's MPI/CUDA/NCCL settings; with CUDA
# they compile for the first architecture only, to keep the tests fast.
#   consumer_install   build + install shardtensor, consumer via find_package (+ COMPONENTS cuda)
#   consumer_cpu_only  a CPU-only consumer of that same install with the CUDA toolkit hidden at
#                      configure time and no CUDA library needed or loaded at run time
#   consumer_subdir    consumer via add_subdirectory
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
  else()
    set(_name consumer_subdir)
  endif()
  add_test(NAME ${_name}
    COMMAND ${CMAKE_COMMAND}
      -DMODE=${_mode}
      -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
      -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/${_name}
      "-DGENERATOR=${CMAKE_GENERATOR}"
      -DBUILD_TYPE=${CMAKE_BUILD_TYPE}
      -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
      -DENABLE_MPI=${SHARDTENSOR_ENABLE_MPI}
      -DENABLE_CUDA=${SHARDTENSOR_ENABLE_CUDA}
      -DENABLE_NCCL=${SHARDTENSOR_ENABLE_NCCL}
      -DCUDA_ARCHITECTURES=${_consumer_cuda_arch}
      -DJOBS=2
      -DMPIEXEC=${MPIEXEC_EXECUTABLE}
      -DMPIEXEC_NUMPROC_FLAG=${MPIEXEC_NUMPROC_FLAG}
      "-DMPIEXEC_FLAGS=${_consumer_mpiexec_flags}"
      -DNP=2
      -P ${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake)
  set_tests_properties(${_name} PROPERTIES LABELS consumer TIMEOUT 1800 PROCESSORS 2
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
set_tests_properties(consumer_cpu_only PROPERTIES LABELS consumer TIMEOUT 600 PROCESSORS 2
  FIXTURES_REQUIRED shardtensor_consumer_prefix ENVIRONMENT "OMP_NUM_THREADS=1")

# Test registration helpers (hpc-conventions §3.4, Cabana/AMReX style).
#
# wlb4d_add_test(NAME SOURCES src... [DEPS target...] [LABELS l...] [TIMEOUT s] [ARGS a...])
#   one gtest executable run directly (serial); label `unit` by default.
# wlb4d_add_mpi_test(NAME SOURCES src... NPROCS n... [DEPS ...] [LABELS ...] [TIMEOUT s] [ARGS ...])
#   one gtest executable, one ctest entry per rank count, run through mpiexec;
#   label `mpi`. A timeout is a failure.
# Every test executable uses tests/common/test_main.cpp (MPI + Kokkos + gtest).

set(WLB4D_TEST_ENV "OMP_NUM_THREADS=1;OMP_PROC_BIND=false;KOKKOS_NUM_THREADS=1")

function(_wlb4d_test_exe name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${A_SOURCES} ${PROJECT_SOURCE_DIR}/tests/common/test_main.cpp)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common)
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest wlb4d::core wlb4d_warnings)
  target_compile_definitions(${name} PRIVATE
    WLB4D_SOURCE_DIR="${PROJECT_SOURCE_DIR}" WLB4D_BINARY_DIR="${PROJECT_BINARY_DIR}")
endfunction()

function(wlb4d_add_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;DEPS;LABELS;ARGS" ${ARGN})
  _wlb4d_test_exe(${name} SOURCES ${A_SOURCES} DEPS ${A_DEPS})
  if(NOT A_LABELS)
    set(A_LABELS unit)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND $<TARGET_FILE:${name}> ${A_ARGS}
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
                       ENVIRONMENT "${WLB4D_TEST_ENV}")
endfunction()

function(wlb4d_add_mpi_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;DEPS;LABELS;ARGS;NPROCS" ${ARGN})
  _wlb4d_test_exe(${name} SOURCES ${A_SOURCES} DEPS ${A_DEPS})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  foreach(np IN LISTS A_NPROCS)
    add_test(NAME ${name}_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS} ${A_ARGS}
             WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    set(_procs ${np})
    if(_procs GREATER 2)
      set(_procs 2)   # oversubscribed here; PROCESSORS only throttles ctest -j
    endif()
    set_tests_properties(${name}_np${np} PROPERTIES LABELS "mpi;${A_LABELS}" TIMEOUT ${A_TIMEOUT}
                         PROCESSORS ${_procs} ENVIRONMENT "${WLB4D_TEST_ENV}")
  endforeach()
endfunction()

# wlb4d_add_app_test(NAME COMMAND cmd... [NPROCS n] [LABELS ...] [TIMEOUT s] [WILL_FAIL] [PASS_REGEX r] [FAIL_REGEX r])
#   runs a program (usually an app) — through mpiexec when NPROCS is given.
function(wlb4d_add_app_test name)
  cmake_parse_arguments(A "WILL_FAIL" "NPROCS;TIMEOUT;PASS_REGEX;FAIL_REGEX" "COMMAND;LABELS" ${ARGN})
  if(A_NPROCS)
    set(_cmd ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${A_NPROCS} ${MPIEXEC_PREFLAGS} ${A_COMMAND})
  else()
    set(_cmd ${A_COMMAND})
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  if(NOT A_LABELS)
    set(A_LABELS regression)
  endif()
  add_test(NAME ${name} COMMAND ${_cmd} WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
                       ENVIRONMENT "${WLB4D_TEST_ENV}")
  if(A_WILL_FAIL)
    set_tests_properties(${name} PROPERTIES WILL_FAIL TRUE)
  endif()
  if(A_PASS_REGEX)
    set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "${A_PASS_REGEX}")
  endif()
  if(A_FAIL_REGEX)
    set_tests_properties(${name} PROPERTIES FAIL_REGULAR_EXPRESSION "${A_FAIL_REGEX}")
  endif()
endfunction()

# The std-only core's sources, in one place for every build of it: the wheel (CMakeLists.txt), the
# sanitizer checks (tests/native) and the perf driver (benchmarks/native). A new core file goes here only.
# bindings.cpp, the one pybind11 file, is not the core and is not listed.
set(PFB_CORE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/ring_common.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_in_flight.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_write.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_take.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_evict.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_state.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_delta.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_admission.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_accounting.cpp
  ${CMAKE_CURRENT_LIST_DIR}/compact_rows.cpp
  ${CMAKE_CURRENT_LIST_DIR}/compact_blocks.cpp)

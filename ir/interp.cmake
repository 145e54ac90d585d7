# interp.cmake — the reference interpreter (included by ir/CMakeLists.txt).
# ir/interp.c drives a step (weights, buffer placement, checks of the step);
# ir/interp_kernels.c holds one kernel per op of ir/ops.def.
add_library(kiln_interp STATIC
  ${CMAKE_CURRENT_LIST_DIR}/interp.c
  ${CMAKE_CURRENT_LIST_DIR}/interp_kernels.c)
target_link_libraries(kiln_interp PUBLIC kiln_ir kiln_kv kiln_support m Threads::Threads)

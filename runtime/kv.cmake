# kv.cmake — the paged KV cache's block manager (included by runtime/CMakeLists.txt).
# A library of its own so the reference interpreter can use it without the rest of the runtime.
add_library(kiln_kv STATIC ${CMAKE_CURRENT_LIST_DIR}/kv_cache.c)
target_link_libraries(kiln_kv PUBLIC kiln_support)

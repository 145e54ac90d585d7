# kiln_text: tokenizers (Hugging Face tokenizer.json BPE, llama2.c tokenizer.bin)
# and sampling. Included by runtime/CMakeLists.txt; tests/tokenizer includes it
# too when the runtime has not, so the file guards against a second inclusion.
# Needs Debian's libpcre2-dev (the pre-tokenizer regexes) and libcjson-dev.
if(TARGET kiln_text)
  return()
endif()

if(NOT TARGET PkgConfig::PCRE2)
  pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET GLOBAL libpcre2-8)
endif()

add_library(kiln_text STATIC
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.c
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bpe.c
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_hf.c
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_json.c
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_llama2c.c
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_map.c
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_regex.c
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_utf8.c
  ${CMAKE_CURRENT_LIST_DIR}/sampler.c)
target_include_directories(kiln_text PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(kiln_text PUBLIC kiln_support PkgConfig::CJSON PkgConfig::PCRE2 m)

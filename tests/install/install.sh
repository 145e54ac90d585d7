#!/usr/bin/env bash
# A deployment as README's "Deploying an engine" describes it: install kiln
# into a temporary prefix, build the C API's example (runtime/example/generate.c)
# against the installed copy alone — `cc generate.c $(pkg-config --cflags --libs
# kiln)`, nothing of the source or build tree — and run it: it must generate
# what the installed `kiln run` generates, linked with libkiln.so and with
# libkiln.a. Also pins what is installed, what libkiln.so exports (kiln.h's
# functions, nothing internal) and that nothing of the compiler (NVRTC, LLVM,
# the flex/bison frontend, passes, codegen) is in libkiln or needed by it.
. "$KILN_SOURCE/tests/cli/lib.sh"
: "${KILN_BUILD_DIR:?}" "${KILN_CMAKE:?}" "${KILN_CC:?}" "${KILN_LIBDIR:?}" "${KILN_INCLUDEDIR:?}" "${KILN_BINDIR:?}"
: "${KILN_VERSION:?}" "${KILN_SOVERSION:?}"
read -r -a app_flags <<<"${KILN_APP_FLAGS:-}"   # the sanitizers, in a sanitizer build
p="$work/prefix"
lib="$p/$KILN_LIBDIR"
if ! "$KILN_CMAKE" --install "$KILN_BUILD_DIR" --prefix "$p" >"$work/install.log" 2>&1; then
  echo "FAIL cmake --install"; sed 's/^/    /' "$work/install.log"; exit 1
fi

# what is installed: the CLI, the one header, libkiln (shared and static), kiln.pc
want_tree="$KILN_BINDIR/kiln
$KILN_INCLUDEDIR/kiln.h
$KILN_LIBDIR/libkiln.a
$KILN_LIBDIR/libkiln.so -> libkiln.so.$KILN_SOVERSION
$KILN_LIBDIR/libkiln.so.$KILN_SOVERSION -> libkiln.so.$KILN_VERSION
$KILN_LIBDIR/libkiln.so.$KILN_VERSION
$KILN_LIBDIR/pkgconfig/kiln.pc"
got_tree=$(cd "$p" && { find . -type f -printf '%P\n'; find . -type l -printf '%P -> %l\n'; } | LC_ALL=C sort)
expect_same installed-files "$want_tree" "$got_tree"
so="$lib/libkiln.so.$KILN_VERSION"
expect_same soname "libkiln.so.$KILN_SOVERSION" \
  "$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"

# exports: exactly the functions kiln.h declares (the name before a
# declaration's first parenthesis), so each needs its KILN_API
want_syms=$(sed -nE 's/^[^ /*#][^(]*[^a-z_](kiln_[a-z_]+)\(.*/\1/p' "$p/$KILN_INCLUDEDIR/kiln.h" | LC_ALL=C sort)
got_syms=$(nm -D --defined-only "$so" | awk '{print $3}' | LC_ALL=C sort)
[ "$(wc -l <<<"$want_syms")" -ge 10 ] && passes=$((passes+1)) \
  || { echo "FAIL kiln.h: found no kiln_ functions: '$want_syms'"; failures=$((failures+1)); }
expect_same exported-symbols "$want_syms" "$got_syms"
# nothing of the compiler: no undefined references to NVRTC, LLVM, flex/bison
# (yy*) or the compiler's modules, in the shared or the static library, and no
# such library needed
compiler_syms='nvrtc|llvm|^yy|^kf_|^kp_|^kcu_|^kd_|^kc_'
expect_same shared-undefined "" "$(nm -D --undefined-only "$so" | awk '{print $2}' | grep -iE "$compiler_syms")"
expect_same shared-needed "" "$(LD_LIBRARY_PATH="$lib" ldd "$so" | grep -iE 'nvrtc|llvm|libfl|libcuda')"
expect_same static-symbols "" "$(nm "$lib/libkiln.a" | awk 'NF >= 2 {print $NF}' | grep -iE "$compiler_syms")"

# kiln.h alone, as C and as C++, with the installed include folder only
for lang in c c++; do
  if [ "$lang" = c ]; then cc=("$KILN_CC" -std=c99); else cc=("${KILN_CXX:-}" -std=c++11); fi
  if [ -z "${cc[0]}" ]; then echo "FAIL header-$lang: no C++ compiler (install g++)"; failures=$((failures+1)); continue; fi
  if out=$(printf '#include <kiln.h>\nint main(void) { return kiln_sampling_greedy().top_k; }\n' \
             | "${cc[@]}" -Wall -Wextra -pedantic -Werror -fsyntax-only -I"$p/$KILN_INCLUDEDIR" -x "$lang" - 2>&1); then
    passes=$((passes+1))
  else
    echo "FAIL header-$lang: kiln.h does not compile on its own"; echo "$out" | sed 's/^/    /'; failures=$((failures+1))
  fi
done

# pkg-config: the installed prefix, and -lkiln alone for the shared library
export PKG_CONFIG_PATH="$lib/pkgconfig"
read -r -a libs <<<"$(pkg-config --libs kiln)"
expect_same pkg-config-libs "-L$lib -lkiln" "${libs[*]}"
[[ " $(pkg-config --cflags kiln) " == *" -I$p/$KILN_INCLUDEDIR "* ]] && passes=$((passes+1)) \
  || { echo "FAIL pkg-config --cflags: '$(pkg-config --cflags kiln)'"; failures=$((failures+1)); }

# the example against the installed copy: shared, then static
ex="$KILN_SOURCE/runtime/example/generate.c"
read -r -a cflags <<<"$(pkg-config --cflags kiln)"
read -r -a static_libs <<<"$(pkg-config --static --libs kiln)"
static_libs=("${static_libs[@]/#-lkiln/$lib/libkiln.a}")   # libkiln.a, not the .so beside it
built=1
for how in shared static; do
  if [ $how = shared ]; then l=("${libs[@]}"); else l=("${static_libs[@]}"); fi
  if ! out=$("$KILN_CC" "${app_flags[@]}" "$ex" "${cflags[@]}" "${l[@]}" -o "$work/generate-$how" 2>&1); then
    echo "FAIL build the example ($how) against the installed kiln"; echo "$out" | sed 's/^/    /'
    failures=$((failures+1)); built=0
  fi
done
if [ $built = 0 ]; then finish; exit 1; fi
expect_same shared-links-libkiln "libkiln.so.$KILN_SOVERSION" \
  "$(readelf -d "$work/generate-shared" | sed -n 's/.*(NEEDED).*\[\(libkiln[^]]*\)\]/\1/p')"
expect_same static-needs-no-libkiln "" "$(readelf -d "$work/generate-static" | grep -o 'libkiln[^]]*')"

"$p/$KILN_BINDIR/kiln" build "$KILN_SHARED/models/tinystories-656k" -o "$work/ts.engine" >/dev/null \
  || { echo "FAIL installed kiln build"; exit 1; }
# all must succeed and print the story: programs failing alike (all empty) is
# a failure, not a match
want=$("$p/$KILN_BINDIR/kiln" run "$work/ts.engine" --prompt "Once upon a time" -n 40 2>/dev/null) \
  || { echo "FAIL installed kiln run: exit $?"; failures=$((failures+1)); }
[[ "$want" == "Once upon a time"?* ]] && passes=$((passes+1)) \
  || { echo "FAIL kiln run printed no story: '$want'"; failures=$((failures+1)); }
got=$(LD_LIBRARY_PATH="$lib" "$work/generate-shared" "$work/ts.engine" "Once upon a time" 40) \
  || { echo "FAIL example (shared): exit $?"; failures=$((failures+1)); }
expect_same example-shared-text "$want" "$got"
got=$(env -u LD_LIBRARY_PATH "$work/generate-static" "$work/ts.engine" "Once upon a time" 40) \
  || { echo "FAIL example (static): exit $?"; failures=$((failures+1)); }
expect_same example-static-text "$want" "$got"
expect_fail example-bad-engine "$work/none.engine: error: cannot open: No such file or directory" -- \
  env LD_LIBRARY_PATH="$lib" "$work/generate-shared" "$work/none.engine" "hi"
finish

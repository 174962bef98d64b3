#!/usr/bin/env bash
# The C ABI check that CI runs: builds libav_core_capi (shared and static, release), checks
# that include/av_core.h compiles as C and as C++, compiles the C example
# (examples/c/estimator_demo.c, linked against the shared library) and the C error-path tests
# (examples/c/error_paths.c, linked against the static library) with the system C compiler,
# and runs both: under valgrind (--error-exitcode=1 --leak-check=full) when it is installed,
# else built with AddressSanitizer when the compiler supports it, else plainly (with a
# warning). Any compiler warning, failed test, leak or invalid access fails the script.
#
# Usage: scripts/check_capi.sh [--build-only]
#   --build-only   build the library and the two programs, run nothing (tests/capi/test_capi.py
#                  uses this, then runs target/capi/estimator_demo itself)
# Environment: CC (default cc), CXX (default c++; the C++ header check is skipped if absent),
#              AVC_NO_VALGRIND=1 to skip valgrind even when installed.
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
case "${1:-}" in
    "") ;;
    --build-only) build_only=1 ;;
    *) echo "usage: $0 [--build-only]" >&2; exit 2 ;;
esac

CC="${CC:-cc}"
CXX="${CXX:-c++}"
lib_dir="$PWD/target/release"
out_dir="$PWD/target/capi"
mkdir -p "$out_dir"

echo "== cargo build -p av_core_capi --release (libav_core_capi.so + libav_core_capi.a)" >&2
cargo build -p av_core_capi --release --quiet >&2

# What Rust's standard library needs from the system when linking the static library. This
# is what `cargo rustc -p av_core_capi --release -- --print native-static-libs` reports on
# Linux with glibc; see docs/c-api.md for other platforms.
case "$(uname -s)" in
    Darwin) native_libs=(-framework CoreFoundation -liconv -lSystem -lc -lm) ;;
    *) native_libs=(-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc) ;;
esac

runner=()
sanitize=()
checker="unchecked"
if [[ "${AVC_NO_VALGRIND:-0}" != 1 ]] && command -v valgrind >/dev/null 2>&1; then
    runner=(valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible)
    checker="valgrind"
elif echo 'int main(void){return 0;}' |
    "$CC" -x c -fsanitize=address -o "$out_dir/asan_probe" - >/dev/null 2>&1; then
    sanitize=(-fsanitize=address -fno-omit-frame-pointer)
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=1"
    checker="AddressSanitizer"
else
    echo "warning: neither valgrind nor AddressSanitizer available; running unchecked" >&2
fi

cflags=(-std=c11 -O1 -g -Wall -Wextra -Wpedantic -Werror -Iinclude "${sanitize[@]}")

echo "== header compiles as C11 and C++" >&2
printf '#include "av_core.h"\nint main(void) { return avc_abi_version() == AVC_ABI_VERSION ? 0 : 1; }\n' |
    "$CC" "${cflags[@]}" -fsyntax-only -x c -
if command -v "$CXX" >/dev/null 2>&1; then
    printf '#include "av_core.h"\nint main() { return avc_abi_version() == AVC_ABI_VERSION ? 0 : 1; }\n' |
        "$CXX" -std=c++11 -Wall -Wextra -Werror -Iinclude -fsyntax-only -x c++ -
fi

echo "== compile examples/c (demo: shared library; error paths: static library)" >&2
"$CC" "${cflags[@]}" examples/c/estimator_demo.c -L"$lib_dir" -lav_core_capi \
    -Wl,-rpath,"$lib_dir" -o "$out_dir/estimator_demo"
"$CC" "${cflags[@]}" -pthread examples/c/error_paths.c "$lib_dir/libav_core_capi.a" \
    "${native_libs[@]}" -o "$out_dir/error_paths"

if [[ $build_only == 1 ]]; then
    echo "$out_dir/estimator_demo"
    exit 0
fi

echo "== run estimator_demo ($checker)" >&2
"${runner[@]}" "$out_dir/estimator_demo"
echo "== run error_paths ($checker)" >&2
"${runner[@]}" "$out_dir/error_paths"
echo "== C ABI checks passed" >&2

#!/usr/bin/env bash
# Builds examples/llama_cpp/av_spec.c into target/llama_cpp/av_spec: llama.cpp from the
# installed llama-cpp-python (its headers in site-packages/include, its libllama.so and
# libggml*.so in site-packages/llama_cpp/lib, found through the Python that has it; rpath
# set, so the program runs without LD_LIBRARY_PATH) and av_core's C ABI as the static library
# (cargo build -p av_core_capi --release). Prints the program's path on stdout.
#
# Usage: examples/llama_cpp/build.sh [--sanitize]
#   --sanitize   build target/llama_cpp/av_spec_asan instead, with AddressSanitizer and
#                UndefinedBehaviorSanitizer (valgrind cannot run llama.cpp's libraries when
#                they were built for the host's AVX-512)
# Environment: PYTHON (default python3): the interpreter llama-cpp-python is installed in;
#              CC (default cc).
set -euo pipefail
cd "$(dirname "$0")/../.."

sanitize=()
binary=av_spec
case "${1:-}" in
    "") ;;
    --sanitize) sanitize=(-fsanitize=address,undefined -fno-omit-frame-pointer); binary=av_spec_asan ;;
    *) echo "usage: $0 [--sanitize]" >&2; exit 2 ;;
esac

PYTHON="${PYTHON:-python3}"
CC="${CC:-cc}"
out_dir="$PWD/target/llama_cpp"
lib_dir="$PWD/target/release"
mkdir -p "$out_dir"

error() {
    echo "build.sh: error: $*" >&2
    exit 2
}

# Where llama-cpp-python put llama.cpp: found without importing it (an import loads the
# libraries, which is not needed to build against them).
paths=$("$PYTHON" - <<'EOF'
import importlib.util
import pathlib

spec = importlib.util.find_spec("llama_cpp")
if spec is None or spec.origin is None:
    raise SystemExit("")
package = pathlib.Path(spec.origin).parent
print(package.parent / "include")
print(package / "lib")
EOF
) || true
[[ -n "$paths" ]] || error "llama-cpp-python is not installed for $PYTHON (pip install llama-cpp-python==0.3.36)"
include_dir=$(sed -n 1p <<<"$paths")
llama_lib_dir=$(sed -n 2p <<<"$paths")
[[ -f "$include_dir/llama.h" && -f "$include_dir/ggml.h" ]] ||
    error "llama.h / ggml.h not found in $include_dir (llama-cpp-python installs them there)"
[[ -f "$llama_lib_dir/libllama.so" || -f "$llama_lib_dir/libllama.dylib" ]] ||
    error "libllama not found in $llama_lib_dir"
# The llama.cpp API the program calls (renamed in past releases): one clear line if a function
# is missing, rather than a page of compiler errors.
for function in llama_model_load_from_file llama_init_from_model llama_model_get_vocab \
    llama_vocab_n_tokens llama_vocab_get_text llama_n_ctx_seq llama_get_memory \
    llama_memory_seq_rm llama_batch_init llama_decode llama_get_logits_ith llama_tokenize; do
    grep -q "\b$function\b" "$include_dir/llama.h" ||
        error "$include_dir/llama.h lacks $function: this llama.cpp is too old or too new (the example is written against llama-cpp-python 0.3.36)"
done

echo "== cargo build -p av_core_capi --release" >&2
cargo build -p av_core_capi --release --quiet >&2

case "$(uname -s)" in
    Darwin) native_libs=(-framework CoreFoundation -liconv -lSystem -lc -lm) ;;
    *) native_libs=(-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc) ;;
esac

echo "== $CC examples/llama_cpp/av_spec.c (llama.cpp from $llama_lib_dir)" >&2
# -isystem: warnings in llama.cpp's headers are not ours to fix; ours fail the build.
"$CC" -std=c11 -O2 -g -Wall -Wextra -Wpedantic -Werror "${sanitize[@]}" -Iinclude \
    -isystem "$include_dir" examples/llama_cpp/av_spec.c "$lib_dir/libav_core_capi.a" \
    -L"$llama_lib_dir" -lllama -lggml -lggml-base -Wl,-rpath,"$llama_lib_dir" \
    "${native_libs[@]}" -o "$out_dir/$binary"
echo "$out_dir/$binary"

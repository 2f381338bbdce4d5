#!/usr/bin/env bash
# Builds llama.cpp's `llama-bench` and `llama-tokenize` (CPU backend) from the `llama-cpp-python`
# sdist on PyPI, whose vendor/llama.cpp is a pinned llama.cpp tree, into the cache directory, for
# side-by-side runs with `cargo xtask bench --llama-bench PATH` and the tokenizer tests' reference
# ids (see tools/llama3_vocab.py). Nothing lands in the checkout. About 8 minutes on 2 cores.
# Prints llama-bench's path last (llama-tokenize is beside it).
#
#   scripts/build-llama-bench.sh [VERSION]     (default: the newest sdist pip finds)
#
# Needs cmake and a C++ compiler (`apt-get install -y cmake g++`) and pip.
set -euo pipefail

version="${1:-}"
cache="${BURN_GGUF_CACHE:-$HOME/.cache/burn-gguf}/llama.cpp"
bin="$cache/build/bin/llama-bench"
if [[ -x "$bin" && -z "$version" ]]; then
    echo "$bin"
    exit 0
fi
command -v cmake >/dev/null || { echo "cmake is needed: apt-get install -y cmake" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
spec="llama-cpp-python${version:+==$version}"
# Only llama-cpp-python itself as the sdist: its build requirements (cmake, ninja, ...) as
# wheels, since building those from source takes far longer than llama.cpp.
python3 -m pip download --no-deps --no-binary llama-cpp-python -q -d "$work" "$spec"
sdist="$(ls "$work"/llama_cpp_python-*.tar.gz)"
tar -xzf "$sdist" -C "$work"
src="$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp)"

rm -rf "$cache"
mkdir -p "$cache"
cp -r "$src" "$cache/src"
echo "$(basename "$sdist")" >"$cache/SOURCE"
cmake -S "$cache/src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF >"$cache/cmake.log"
cmake --build "$cache/build" --target llama-bench llama-tokenize -j "$(nproc)" >"$cache/build.log"
echo "$bin"

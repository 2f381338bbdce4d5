#!/usr/bin/env bash
# Prompt speed side by side with llama.cpp: each `burn-gguf` binary given runs `run --json` on
# data/prompt-512-gemma.txt (512 Gemma 3 tokens with BOS) with Gemma 3 270M Q4_K_M, alternating
# with llama.cpp's `llama-bench -p 512 -n 0` (scripts/build-llama-bench.sh builds it), after one
# warm-up run of each binary (kernel compiles, matmul autotuning). Prints prompt tokens/s.
#
#   scripts/prefill-vs-llama.sh [ROUNDS] BIN...     (e.g. an older build's binary, then this one)
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${1:-2}"
shift || true
[ $# -gt 0 ] || { echo "usage: scripts/prefill-vs-llama.sh [ROUNDS] BIN..." >&2; exit 1; }
bench="$(scripts/build-llama-bench.sh | tail -1)"
model="$(cargo xtask fetch-model gemma3-270m | tail -1)"
prompt="$(cat data/prompt-512-gemma.txt)"

tps() {
    "$1" run -m "$model" -p "$prompt" -n 2 --temp 0 --json 2>/dev/null | python3 -c \
        'import json,sys; t=json.load(sys.stdin)["timings"]; print(t["prompt_tokens"], "tokens,", round(t["prompt_tokens_per_s"], 2), "tokens/s")'
}
for bin in "$@"; do
    echo "warm-up $bin: $(tps "$bin")"
done
for r in $(seq "$rounds"); do
    for bin in "$@"; do
        echo "round $r $bin: $(tps "$bin")"
    done
    echo "round $r llama.cpp pp512: $("$bench" -m "$model" -p 512 -n 0 -r 1 -o csv 2>/dev/null \
        | tail -1 | awk -F, '{gsub(/"/, "", $(NF-1)); print $(NF-1)}') tokens/s"
done

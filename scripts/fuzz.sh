#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ (the GGUF reader on arbitrary and on structured input,
# every block decoder on arbitrary blocks), each until SECONDS have passed or FUZZ_RUNS (default
# 10 million) inputs have run, whichever comes first. Fails on the first crash, leak, timeout or
# out-of-memory, and names the input libFuzzer saved under fuzz/artifacts/.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 seconds, every target)
#
# Needs the nightly toolchain (sanitizers) and cargo-fuzz, which it installs when absent. The
# corpus grows under fuzz/corpus/<target> (ignored by git); the full log of each run is
# fuzz/logs/<target>.log. Build artifacts go to $HOME/.cache/burn-gguf/fuzz-target.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(gguf_bytes gguf_structured block_decode)
fi
runs="${FUZZ_RUNS:-10000000}"
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$HOME/.cache/burn-gguf/fuzz-target}"

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz.sh: the nightly toolchain is required (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! command -v cargo-fuzz >/dev/null; then
    cargo install --locked cargo-fuzz
fi

mkdir -p fuzz/logs
for t in "${targets[@]}"; do
    corpus="fuzz/corpus/$t"
    mkdir -p "$corpus"
    if [ "$t" = gguf_bytes ]; then
        # Seeds: gguf-py's little- and big-endian files.
        cp -n crates/gguf/tests/data/*.gguf "$corpus/"
    fi
    log="fuzz/logs/$t.log"
    echo "== $t: up to ${seconds}s or $runs runs"
    status=0
    (cd fuzz && cargo +nightly fuzz run -O "$t" "corpus/$t" -- \
        -max_total_time="$seconds" -runs="$runs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1) >"$log" 2>&1 || status=$?
    # The last progress line (executions, coverage, corpus) and the final statistics.
    grep -E '^#[0-9]+' "$log" | tail -n 1 || true
    grep -E '^(Done|stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb|new_units_added))' "$log" || true
    if [ "$status" -ne 0 ]; then
        echo "fuzz.sh: $t FAILED (exit $status); see $log" >&2
        grep -E 'artifact_prefix|Test unit written|panicked|ERROR' "$log" | head -n 20 >&2 || true
        exit "$status"
    fi
done

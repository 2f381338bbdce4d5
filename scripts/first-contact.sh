#!/usr/bin/env bash
# Times the README's set-up and main job the way a new user meets them: a fresh clone of this
# checkout, an empty target directory, cargo home and model cache (the system packages and the
# Rust toolchain are taken as installed). Every output line is stamped with the seconds since its
# command started; the log goes to stdout. Usage: scripts/first-contact.sh [WORK_DIR]
# (default: a new temporary folder; it needs about 8 GB).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
git clone -q "$repo" "$work/burn-gguf"
# The tests and the examples read ../shared beside the checkout.
[ -e "$repo/../shared" ] && ln -s "$(cd "$repo/../shared" && pwd)" "$work/shared"
cd "$work/burn-gguf"
export CARGO_HOME="$work/cargo-home" CARGO_TARGET_DIR="$work/target" BURN_GGUF_CACHE="$work/cache"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$work/xdg}"
mkdir -p "$CARGO_HOME" "$XDG_RUNTIME_DIR" && chmod 0700 "$XDG_RUNTIME_DIR"
timed() {
    echo "== $* ($(date -u +%FT%TZ))"
    local t0
    t0=$(date +%s.%N)
    "$@" 2>&1 | while IFS= read -r line; do
        printf '%8.1f %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$line"
    done
    echo "== exit ${PIPESTATUS[0]} after $(echo "$(date +%s.%N) - $t0" | bc) s"
}
timed cargo build
timed cargo run -- run -m gemma3-270m -p "Once upon a time" -n 32 --temp 0

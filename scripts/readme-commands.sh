#!/usr/bin/env bash
# Runs every `cargo run` command README.md shows (in code blocks and inline), as written, from the
# checkout's root, with no XDG_RUNTIME_DIR set (as in a fresh shell) and standard input closed.
# Each must exit 0 and print no line starting with `error:`; `serve` must answer /health, then
# stop on SIGTERM. CI runs this (.ci/run).
#
#   scripts/readme-commands.sh [README]
set -euo pipefail
cd "$(dirname "$0")/.."
readme="${1:-README.md}"
log="$(mktemp -d)"

mapfile -t commands < <(python3 - "$readme" <<'EOF'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
seen = []
# Lines of fenced code blocks, then inline `...` spans.
for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
    for line in block.splitlines():
        line = line.split("  #")[0].strip()
        if line.startswith("cargo run"):
            seen.append(line)
for span in re.findall(r"`(cargo run[^`]*)`", text):
    seen.append(span.strip())
for c in dict.fromkeys(seen):
    print(c)
EOF
)
[[ ${#commands[@]} -gt 0 ]] || { echo "readme-commands: no cargo run command in $readme" >&2; exit 1; }

failed=0
for i in "${!commands[@]}"; do
    cmd="${commands[$i]}"
    out="$log/$i.out"
    echo "readme-commands: $cmd"
    if [[ "$cmd" == *" serve "* ]]; then
        env -u XDG_RUNTIME_DIR bash -c "$cmd" </dev/null >"$out" 2>&1 &
        pid=$!
        ok=0
        for _ in $(seq 1 600); do
            if python3 -c 'import urllib.request,sys; urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=2)' 2>/dev/null; then
                ok=1
                break
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 1
        done
        # SIGTERM to the server itself (a child of cargo run), then wait for cargo.
        pkill -TERM -f "target/debug/burn-gguf serve" || true
        wait "$pid" || ok=0
    else
        ok=1
        env -u XDG_RUNTIME_DIR timeout 900 bash -c "$cmd" </dev/null >"$out" 2>&1 || ok=0
    fi
    if grep -q '^error:' "$out"; then
        echo "readme-commands: '$cmd' printed an error: line:" >&2
        grep '^error:' "$out" | head -5 >&2
        ok=0
    fi
    if [[ $ok -ne 1 ]]; then
        echo "readme-commands: FAILED: $cmd" >&2
        tail -20 "$out" >&2
        failed=$((failed + 1))
    fi
done
echo "readme-commands: $(( ${#commands[@]} - failed )) passed, $failed failed"
[[ $failed -eq 0 ]]

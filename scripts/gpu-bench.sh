#!/usr/bin/env bash
# Runs `cargo xtask bench` on a machine with a GPU but no Rust toolchain.
#
#   bash scripts/gpu-bench.sh prepare   # here: build xtask, pack it into .bench/, fetch the
#                                       # Vulkan loader packages into .gl/
#   bash scripts/gpu-bench.sh run       # there (x86-64, root, NVIDIA driver, .bench and .gl
#                                       # carried): unpack the loaders, run the full benchmark
#
# `run` writes $OUT/bench-gpu.json and $OUT/bench-gpu.log ($OUT defaults to ./bench-out). It
# runs the full benchmark (every type and shape, 1 and 8 rows, the Burn path, prefill) with
# --min-time $BENCH_MIN_TIME (0.15 s) and the tiny Qwen3 Q4_K_M fixture end to end (Gemma 3 270M
# does not travel), stopped after $BENCH_TIMEOUT seconds (360) if it runs long; the JSON is
# rewritten after every measurement, so a stopped run keeps what it measured ("complete": false).
#
# GPU_BENCH_SKIP_LOADERS=1 skips unpacking .gl into / (to try `run` on a machine that has them).
#
# The wgpu backend: cubecl-wgpu 0.11.3 tries Vulkan, then DX12, then OpenGL, and takes the first
# with a GPU adapter (it does not read WGPU_BACKEND); the benchmark prints every adapter it sees
# and the backend chosen.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BENCH_DIR=.bench
GL_DIR=.gl
TINY_MODEL=tiny-qwen3-Q4_K_M.gguf

die() {
    echo "gpu-bench: error: $*" >&2
    exit 1
}

prepare() {
    command -v cargo >/dev/null || die "cargo not found"
    command -v strip >/dev/null || die "strip not found (binutils)"
    command -v xz >/dev/null || die "xz not found (xz-utils)"
    echo "== building xtask"
    cargo build -p xtask
    local target="${CARGO_TARGET_DIR:-target}"
    local bin="$target/debug/xtask"
    [ -x "$bin" ] || die "no binary at $bin"
    mkdir -p "$BENCH_DIR"
    echo "== stripping and compressing $bin"
    strip -o "$BENCH_DIR/xtask" "$bin"
    (cd "$BENCH_DIR" && sha256sum xtask >xtask.sha256)
    rm -f "$BENCH_DIR/xtask.xz"
    xz -9 -T0 "$BENCH_DIR/xtask"
    local fixtures="../shared/fixtures/gguf"
    if [ -f "$fixtures/$TINY_MODEL" ]; then
        install -m 0644 "$fixtures/$TINY_MODEL" "$BENCH_DIR/$TINY_MODEL"
    else
        echo "gpu-bench: $fixtures/$TINY_MODEL not found: the GPU run will skip end to end" >&2
        rm -f "$BENCH_DIR/$TINY_MODEL"
    fi
    echo "== Vulkan loader packages into $GL_DIR"
    mkdir -p "$GL_DIR" /tmp/amd64/partial
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    # shellcheck disable=SC2086 # $o is several options on purpose
    apt-get $o update
    # shellcheck disable=SC2086
    (cd "$GL_DIR" && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    echo "== payload (carry .bench and .gl):"
    du -ch "$BENCH_DIR" "$GL_DIR" | tail -n 1
    ls -l "$BENCH_DIR" "$GL_DIR"
}

run() {
    local out="${OUT:-$PWD/bench-out}"
    mkdir -p "$out"
    [ -f "$BENCH_DIR/xtask.xz" ] || die "$BENCH_DIR/xtask.xz missing: run 'prepare' here and carry $BENCH_DIR"
    [ -n "${GPU_BENCH_SKIP_LOADERS:-}" ] || compgen -G "$GL_DIR/*.deb" >/dev/null ||
        die "no packages in $GL_DIR: run 'prepare' and carry $GL_DIR"

    if [ -n "${GPU_BENCH_SKIP_LOADERS:-}" ]; then
        echo "== GPU_BENCH_SKIP_LOADERS set: using this machine's loaders"
    else
        echo "== Vulkan/GL loaders from $GL_DIR"
        for f in "$GL_DIR"/*.deb; do dpkg -x "$f" /; done
        ldconfig
    fi
    local icds
    icds=$(ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json 2>/dev/null || true)
    if [ -z "$icds" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then
        local nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
        [ -f "$nv" ] || echo "gpu-bench: warning: no Vulkan ICD found and no $nv" >&2
        export VK_DRIVER_FILES=$nv
        export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
        echo "no Vulkan ICD in the standard places: VK_DRIVER_FILES=$VK_DRIVER_FILES"
    else
        echo "Vulkan ICDs: ${icds:-VK_DRIVER_FILES=$VK_DRIVER_FILES}"
    fi

    # Mesa's and the EGL loader's probes complain without one.
    if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
        export XDG_RUNTIME_DIR=/tmp/xdg-gpu-bench
        mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
    fi

    echo "== unpacking the benchmark"
    local bin=/tmp/gpu-bench/xtask
    mkdir -p "$(dirname "$bin")"
    if command -v xz >/dev/null; then
        xz -dc "$BENCH_DIR/xtask.xz" >"$bin"
    elif command -v python3 >/dev/null; then
        python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as f, open(sys.argv[2], "wb") as o: shutil.copyfileobj(f, o)' \
            "$BENCH_DIR/xtask.xz" "$bin"
    else
        die "neither xz nor python3 to decompress $BENCH_DIR/xtask.xz"
    fi
    if [ -f "$BENCH_DIR/xtask.sha256" ]; then
        (cd "$(dirname "$bin")" && sha256sum -c --quiet "$OLDPWD/$BENCH_DIR/xtask.sha256") ||
            die "the unpacked binary does not match $BENCH_DIR/xtask.sha256"
    fi
    chmod +x "$bin"

    {
        echo "== machine"
        uname -a
        date -u
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
        fi
        if command -v vulkaninfo >/dev/null; then
            vulkaninfo --summary || true
        else
            echo "(no vulkaninfo here; the benchmark prints the adapters wgpu sees)"
        fi
    } 2>&1 | tee "$out/bench-gpu.log"

    local e2e=(--no-e2e)
    [ -f "$BENCH_DIR/$TINY_MODEL" ] && e2e=(--model "$BENCH_DIR/$TINY_MODEL")
    local limit="${BENCH_TIMEOUT:-360}"
    local args=(bench --json "$out/bench-gpu.json" --min-time "${BENCH_MIN_TIME:-0.15}" "${e2e[@]}")
    echo "== $bin ${args[*]} (stopped after ${limit} s)" | tee -a "$out/bench-gpu.log"
    local status=0
    timeout --signal=INT --kill-after=20 "$limit" "$bin" "${args[@]}" 2>&1 |
        tee -a "$out/bench-gpu.log" || status=$?
    case $status in
    0) echo "== done: $out/bench-gpu.json, $out/bench-gpu.log" ;;
    124 | 137)
        echo "gpu-bench: stopped after ${limit} s; $out/bench-gpu.json holds what was measured (\"complete\": false)" |
            tee -a "$out/bench-gpu.log" >&2
        exit "$status"
        ;;
    *) die "the benchmark failed (exit $status); see $out/bench-gpu.log" ;;
    esac
}

case "${1:-}" in
prepare) prepare ;;
run) run ;;
*)
    echo "usage: bash scripts/gpu-bench.sh prepare|run" >&2
    exit 2
    ;;
esac

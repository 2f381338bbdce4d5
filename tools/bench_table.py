#!/usr/bin/env python3
"""Prints the README's GEMV table (markdown) from a `cargo xtask bench --json FILE` file.

Usage: python3 tools/bench_table.py benchmarks/lavapipe-DATE.json

Columns as in README.md "Benchmarks"; the last is the acceptance bound "packed beats dense by at
least half the byte ratio": packed/dense must be at most 2 x weight bytes / f32 bytes.
"""
import json
import sys


def sig3(x: float) -> str:
    """Three significant digits, no exponent (29.3, 7.74, 189)."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        data = json.load(f)
    print("| type | shape | m | kernel ms | GB/s | read GB/s | ratio | dense ms | pk/dense "
          "| half byte ratio (pk/dense <=) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for g in data["gemv"]:
        bound = 2 * g["weight_bytes"] / (g["rows"] * g["cols"] * 4)
        dense = g.get("dense_seconds")
        print(
            f"| {g['type']} | {g['rows']}x{g['cols']} | {g['batch']} | {sig3(g['seconds'] * 1e3)} "
            f"| {g['gbps']:.2f} | {g['read_gbps']:.2f} | {g['ratio_to_read']:.2f} "
            f"| {sig3(dense * 1e3) if dense else '-'} "
            f"| {g['packed_over_dense']:.3f} | {bound:.3f} |"
        )


if __name__ == "__main__":
    main()

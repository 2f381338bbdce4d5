#!/usr/bin/env python3
"""Writes the byte-order test files of crates/gguf/tests/data with gguf-py (PyPI `gguf`).

`gguf-py-le.gguf` is a little-endian GGUF v3 file written by gguf-py's GGUFWriter: metadata of
several types and one small tensor of each type that gguf-py's gguf_convert_endian.py can
convert (F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q6_K, MXFP4). `gguf-py-be.gguf` is the same file
converted to big-endian by gguf_convert_endian.py. The Rust reader must read both to the same
metadata and the same (little-endian) tensor bytes: an independent check of its byte swap.

Run from the repository root: python3 tools/make_endian_fixtures.py
"""
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

OUT = Path("crates/gguf/tests/data")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    le = OUT / "gguf-py-le.gguf"
    be = OUT / "gguf-py-be.gguf"
    rng = np.random.default_rng(20261130)
    w = gguf.GGUFWriter(str(le), "llama")
    w.add_uint32("test.u32", 123456789)
    w.add_int64("test.i64", -(2**40) - 7)
    w.add_float32("test.f32", -1.25e-3)
    w.add_float64("test.f64", 3.141592653589793)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "big-endian ✓")
    w.add_array("test.i32s", [1, -2, 300000])
    w.add_array("test.strings", ["a", "", "ünï"])
    w.add_tensor("f32", rng.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 16)).astype(np.float16))
    bf16 = rng.integers(0, 2**16, size=(2, 8), dtype=np.uint16).view(np.uint8).reshape(2, 16)
    w.add_tensor("bf16", bf16, raw_dtype=Q.BF16)
    for ty in (Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.MXFP4):
        block_elems, block_bytes = gguf.constants.GGML_QUANT_SIZES[ty]
        data = rng.integers(0, 256, size=(2, 2 * block_bytes), dtype=np.uint8)
        w.add_tensor(ty.name.lower(), data, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    shutil.copyfile(le, be)
    # The converter asks for confirmation on stdin.
    subprocess.run(
        [sys.executable, "-m", "gguf.scripts.gguf_convert_endian", str(be), "big"],
        input=b"YES\n",
        check=True,
    )
    print(f"wrote {le} ({le.stat().st_size} bytes) and {be} ({be.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

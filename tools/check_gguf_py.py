#!/usr/bin/env python3
"""Reads a GGUF file written by burn-gguf's writer with gguf-py (the `gguf` package on PyPI)
and checks it against the manifest the writer example made: every metadata key with its GGUF
type and exact value, and every tensor's name, ggml type, shape and bytes.

    cargo run -p gguf --example write_every_type -- DIR
    python3 tools/check_gguf_py.py DIR/every_type.gguf DIR/every_type.json

Exits non-zero, naming the key or tensor, on the first difference.
"""
import json
import struct
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType


def fail(msg: str) -> None:
    print(f"check_gguf_py: {msg}", file=sys.stderr)
    sys.exit(1)


def scalar(field, index):
    part = field.parts[index]
    if field.types[-1] == GGUFValueType.STRING or (
        len(field.types) == 1 and field.types[0] == GGUFValueType.STRING
    ):
        return bytes(part).decode("utf-8")
    return part[0]


def expected_scalar(spec):
    v = spec
    if isinstance(v, dict) and "f32_bits" in v:
        return struct.unpack("<f", struct.pack("<I", v["f32_bits"]))[0], "f32"
    if isinstance(v, dict) and "f64_bits" in v:
        return struct.unpack("<d", struct.pack("<Q", v["f64_bits"]))[0], "f64"
    return v, None


def same(got, want, kind):
    if kind == "f32":
        return np.float32(got).tobytes() == np.float32(want).tobytes()
    if kind == "f64":
        return np.float64(got).tobytes() == np.float64(want).tobytes()
    if isinstance(want, bool):
        return bool(got) == want
    if isinstance(want, int):
        return int(got) == want
    return got == want


def main() -> None:
    path, manifest_path = sys.argv[1], sys.argv[2]
    manifest = json.load(open(manifest_path))
    reader = GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    if set(fields) != set(manifest["metadata"]):
        fail(f"keys differ: {sorted(set(fields) ^ set(manifest['metadata']))}")
    for key, spec in manifest["metadata"].items():
        field = fields[key]
        if field.types[0].name != spec["type"]:
            fail(f"key '{key}': type {field.types[0].name}, expected {spec['type']}")
        if spec["type"] == "ARRAY":
            if field.types[1].name != spec["element_type"]:
                fail(f"key '{key}': element type {field.types[1].name}, expected {spec['element_type']}")
            got = [field.parts[i] for i in field.data]
            if len(got) != len(spec["value"]):
                fail(f"key '{key}': {len(got)} elements, expected {len(spec['value'])}")
            for i, (g, w) in enumerate(zip(got, spec["value"])):
                g = bytes(g).decode("utf-8") if spec["element_type"] == "STRING" else g[0]
                want, kind = expected_scalar(w)
                if not same(g, want, kind):
                    fail(f"key '{key}'[{i}]: {g!r}, expected {want!r}")
        else:
            got = field.parts[field.data[0]]
            got = bytes(got).decode("utf-8") if spec["type"] == "STRING" else got[0]
            want, kind = expected_scalar(spec["value"])
            if not same(got, want, kind):
                fail(f"key '{key}': {got!r}, expected {want!r}")
    tensors = {t.name: t for t in reader.tensors}
    if len(tensors) != len(manifest["tensors"]):
        fail(f"{len(tensors)} tensors, expected {len(manifest['tensors'])}")
    for spec in manifest["tensors"]:
        t = tensors.get(spec["name"])
        if t is None:
            fail(f"tensor '{spec['name']}' missing")
        if int(t.tensor_type) != spec["type_id"]:
            fail(f"tensor '{spec['name']}': type {t.tensor_type.name}, expected {spec['type']}")
        if [int(d) for d in t.shape] != spec["ne"]:
            fail(f"tensor '{spec['name']}': shape {list(t.shape)}, expected {spec['ne']}")
        got = np.ascontiguousarray(t.data).tobytes()
        if got.hex() != spec["hex"]:
            fail(f"tensor '{spec['name']}': bytes differ")
    print(
        f"check_gguf_py: {path}: {len(fields)} metadata keys and {len(tensors)} tensors "
        f"({', '.join(s['type'] for s in manifest['tensors'])}) read back identically with gguf-py"
    )


if __name__ == "__main__":
    main()

"""Generates crates/ggml-codec/src/grids.rs from the PyPI package `gguf` 0.19.0 (MIT).

Usage:
    python3 -m pip install gguf==0.19.0      # pulls numpy
    python3 crates/ggml-codec/tools/gen_grids.py crates/ggml-codec/src/grids.rs

The tables come from `gguf/quants.py`: per IQ type class, `grid_shape`, `grid_map` and
`grid_hex` (hex-encoded, packed indices into `grid_map`, decoded as `init_grid` there does),
`IQ2_XXS.ksigns`, `IQ4_NL.kvalues` and `MXFP4.kvalues`. The tables gguf-py does not carry are
derived here: `kmask_iq2xs` (`1 << j`) and `ksigns64` (from `ksigns_iq2xs`). Each is laid out
as ggml lays it out (names and element types of ggml; a `u64` / `u32` entry packs 8 / 4 byte
values, value `j` in byte `j`, little-endian).

Everything from the MARKER line on in the existing output (the tests) is kept.
"""
import sys
from math import ceil, log2

import gguf
from gguf import quants

try:
    from importlib.metadata import version as _dist_version
    GGUF_VERSION = _dist_version('gguf')
except Exception:  # pragma: no cover
    GGUF_VERSION = getattr(gguf, '__version__', '?')
assert GGUF_VERSION == '0.19.0', f'expected gguf 0.19.0, found {GGUF_VERSION}'

MARKER = '// ---- end of generated tables ----'
out_path = sys.argv[1]
try:
    old = open(out_path).read()
    tail = old[old.index(MARKER):] if MARKER in old else MARKER + '\n'
except FileNotFoundError:
    tail = MARKER + '\n'


def decode_grid(cls):
    """The grid of an IQ class as a list of rows of `grid_map` values (as `init_grid` decodes it)."""
    n_rows, n_cols = cls.grid_shape
    gmap = cls.grid_map
    bits = ceil(log2(len(gmap)))
    assert bits != 0, cls.__name__
    per_byte = 8 // bits
    step = 8 // per_byte
    mask = (1 << bits) - 1
    hexs = cls.grid_hex
    assert len(hexs) % 2 == 0
    # Each pair of hex characters is one byte, high nibble first (upper or lower case digits).
    nib = [((c + 9) if c > 0x40 else c) & 0x0F for c in hexs]
    packed = [(nib[i] << 4) | nib[i + 1] for i in range(0, len(nib), 2)]
    idx = [(b >> s) & mask for b in packed for s in range(0, 8, step)]
    assert len(idx) == n_rows * n_cols, (cls.__name__, len(idx), n_rows * n_cols)
    vals = [gmap[i] for i in idx]
    rows = [vals[r * n_cols:(r + 1) * n_cols] for r in range(n_rows)]
    # Cross-check against gguf-py's own decoder.
    cls.init_grid()
    ref = cls.grid.reshape(cls.grid_shape)
    for r in range(n_rows):
        for c in range(n_cols):
            assert float(ref[r, c]) == float(rows[r][c]), (cls.__name__, r, c)
    return rows


def pack_le(row):
    """Packs byte values (0..255, or -128..127 stored as their two's complement) little-endian."""
    v = 0
    for j, b in enumerate(row):
        assert -128 <= b <= 255, b
        v |= (b & 0xFF) << (8 * j)
    return v


ksigns_iq2xs = list(quants.IQ2_XXS.ksigns)
assert len(ksigns_iq2xs) == 128
for name in ('IQ2_XS', 'IQ2_S', 'IQ3_XXS', 'IQ3_S', 'IQ1_S', 'IQ1_M'):
    ks = getattr(getattr(quants, name), 'ksigns', None)
    assert ks is None or list(ks) == ksigns_iq2xs, name
kmask_iq2xs = [1 << j for j in range(8)]
ksigns64 = [pack_le([0xFF if s & kmask_iq2xs[j] else 0x00 for j in range(8)]) for s in ksigns_iq2xs]

iq2xxs_grid = [pack_le(r) for r in decode_grid(quants.IQ2_XXS)]
iq2xs_grid = [pack_le(r) for r in decode_grid(quants.IQ2_XS)]
iq2s_grid = [pack_le(r) for r in decode_grid(quants.IQ2_S)]
iq3xxs_grid = [pack_le(r) for r in decode_grid(quants.IQ3_XXS)]
iq3s_grid = [pack_le(r) for r in decode_grid(quants.IQ3_S)]
iq1s_rows = decode_grid(quants.IQ1_S)
assert quants.IQ1_M.grid_hex is None or decode_grid(quants.IQ1_M) == iq1s_rows
iq1s_grid = [pack_le(r) for r in iq1s_rows]

kvalues_iq4nl = list(quants.IQ4_NL.kvalues)
kvalues_fp4 = list(quants.MXFP4.kvalues)
assert list(quants.NVFP4.kvalues) == kvalues_fp4

# (ggml type, ggml name, ggml size expression, Rust name, values)
tables = [
    ('uint8_t', 'kmask_iq2xs', '8', 'kmask_iq2xs', kmask_iq2xs),
    ('uint8_t', 'ksigns_iq2xs', '128', 'ksigns_iq2xs', ksigns_iq2xs),
    ('uint64_t', 'ksigns64', '128', 'ksigns64', ksigns64),
    ('uint64_t', 'iq2xxs_grid', '256', 'iq2xxs_grid', iq2xxs_grid),
    ('uint64_t', 'iq2xs_grid', '512', 'iq2xs_grid', iq2xs_grid),
    ('uint64_t', 'iq2s_grid', '1024', 'iq2s_grid', iq2s_grid),
    ('uint32_t', 'iq3xxs_grid', '256', 'iq3xxs_grid', iq3xxs_grid),
    ('uint32_t', 'iq3s_grid', '512', 'iq3s_grid', iq3s_grid),
    ('int8_t', 'kvalues_iq4nl', '16', 'kvalues_iq4nl', kvalues_iq4nl),
    ('int8_t', 'kvalues_fp4', '16', 'kvalues_mxfp4', kvalues_fp4),
    ('uint64_t', 'iq1s_grid', 'NGRID_IQ1S', 'iq1s_grid', iq1s_grid),
]
sizes = {'NGRID_IQ1S': 2048}

tys = {'uint8_t': 'u8', 'int8_t': 'i8', 'uint32_t': 'u32', 'uint64_t': 'u64'}
docs = {
 'kmask_iq2xs': 'Bit `j` mask (`1 << j`), used to test the sign bit of value `j` of an 8-value group.',
 'ksigns_iq2xs': 'Sign patterns: a 7-bit index gives 8 sign bits (bit `j` set = value `j` negative); the 8th sign makes the count of negatives even.',
 'ksigns64': 'The [`ksigns_iq2xs`] patterns expanded to 8 bytes (0xff = negative, 0x00 = positive), for SIMD/GPU sign application.',
 'iq2xxs_grid': 'IQ2_XXS codebook: 256 groups of 8 unsigned magnitudes (one per byte, little-endian), each 0x08, 0x19 or 0x2b.',
 'iq2xs_grid': 'IQ2_XS codebook: 512 groups of 8 magnitudes (one per byte, little-endian).',
 'iq2s_grid': 'IQ2_S codebook: 1024 groups of 8 magnitudes (one per byte, little-endian).',
 'iq3xxs_grid': 'IQ3_XXS codebook: 256 groups of 4 magnitudes (one per byte, little-endian).',
 'iq3s_grid': 'IQ3_S codebook: 512 groups of 4 magnitudes (one per byte, little-endian).',
 'kvalues_iq4nl': 'IQ4_NL / IQ4_XS non-linear 4-bit values (indexed by the nibble).',
 'kvalues_fp4': 'E2M1 (FP4) values, doubled, shared by MXFP4 and NVFP4 (indexed by the nibble; bit 3 is the sign). ggml also names it `kvalues_mxfp4`.',
 'iq1s_grid': 'IQ1_S / IQ1_M codebook: 2048 groups of 8 signed values in {-1, 0, 1} (one `i8` per byte, little-endian).',
}


def fmt(rty, v):
    if rty == 'u64':
        assert 0 <= v < 1 << 64
        return f'0x{v:016x}'
    if rty == 'u32':
        assert 0 <= v < 1 << 32
        return f'0x{v:08x}'
    if rty == 'u8':
        assert 0 <= v < 256
        return str(v)
    if rty == 'i8':
        assert -128 <= v < 128
        return str(v)
    raise ValueError(rty)


out = [
'//! The IQ codebooks and small lookup tables of ggml, rebuilt value for value from the PyPI',
f'//! package `gguf` {GGUF_VERSION} (MIT; `gguf/quants.py`: the IQ classes\' `grid_map` / `grid_hex`,',
'//! `IQ2_XXS.ksigns`, `IQ4_NL.kvalues`, `MXFP4.kvalues`). `kmask_iq2xs` and `ksigns64`, which',
'//! gguf-py does not carry, are derived from those (`1 << j`, `ksigns_iq2xs`). Every decoder',
'//! using them is bit-exact against the ggml 0.25.3 fixtures.',
'//! Names, element types and layout are those of ggml\'s `ggml-common.h` tables (`uint64_t` ->',
'//! `u64`, ...; `kvalues_mxfp4` is ggml\'s `kvalues_fp4`); a `u64` / `u32` grid entry packs',
'//! 8 / 4 byte values, value `j` in byte `j` (little-endian), as ggml reads them through a',
'//! `const uint8_t *` on a little-endian machine.',
'//!',
'//! This is the only copy in the workspace: the CPU decoders read them here, and GPU kernels upload',
'//! them from here. Generated by `tools/gen_grids.py` from the `gguf` package; do not edit the',
'//! tables by hand.',
'',
'#![allow(non_upper_case_globals)]',
'']
for ty, name, size, rname, vals in tables:
    n = int(size) if size.isdigit() else sizes[size]
    assert len(vals) == n, (name, len(vals), n)
    rty = tys[ty]
    out.append(f'/// {docs[name]}')
    out.append('///')
    out.append(f'/// ggml-common.h: `GGML_TABLE_BEGIN({ty}, {name}, {size})`.')
    out.append('#[rustfmt::skip]')
    out.append(f'pub const {rname}: [{rty}; {n}] = [')
    per = 8 if rty in ('u64', 'u32') else 16
    for i in range(0, n, per):
        out.append('    ' + ' '.join(fmt(rty, v) + ',' for v in vals[i:i + per]))
    out.append('];')
    out.append('')
open(out_path, 'w').write('\n'.join(out) + '\n' + tail)
print(f'gguf {GGUF_VERSION}:', ', '.join(t[3] for t in tables))

//! Codebook (IQ) types. Every one has 8 sub-blocks of 32 per 256-element super-block, so chunk
//! `c` is sub-block `ib = c`; a sub-block is 4 groups of 8 values, each group an entry of the
//! type's grid (or two 4-value entries for the IQ3 types) with 8 sign bits. The grid comes from
//! the kernels' `grid` buffer ([`Grid`]); the math and its order of operations follow
//! `dequantize_row_iq*` of ggml-quants.c, so results are bit-exact.
use super::*;

/// ggml's `ksigns_iq2xs[i]` for a 7-bit `i`: `i` plus bit 7 set when `i` has an odd number of set
/// bits (so every group has an even number of minus signs).
#[cube]
pub(crate) fn ksigns_iq2xs(i: u32) -> u32 {
    let mut p = i ^ (i >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    i | ((p & 1) << 7)
}

/// One 8-value group: values `0..4` are the bytes of `g0`, `4..8` those of `g1`, negated
/// where bit `j` of `signs` is set; written to `out[base..base + 8]`: the values of a
/// [`ChunkForm::Scaled`] chunk, whose scale `db` makes ggml's `db * grid * sign` (IQ3).
#[cube]
fn signed_group8(g0: u32, g1: u32, signs: u32, out: &mut Array<f32>, base: u32) {
    #[unroll]
    for j in 0..4u32 {
        let v0 = f32::cast_from((g0 >> (8 * j)) & 0xFF);
        let v1 = f32::cast_from((g1 >> (8 * j)) & 0xFF);
        out[(base + j) as usize] = with_sign_bit(v0, signs, j);
        out[(base + j + 4) as usize] = with_sign_bit(v1, signs, comptime!(j + 4));
    }
}

/// `v` negated when bit `j` of `signs` is set: the bit moved to the float's sign bit and
/// XORed in (two integer operations and a XOR, where a test and a select took five). Exact,
/// as a negation is.
#[cube]
fn with_sign_bit(v: f32, signs: u32, #[comptime] j: u32) -> f32 {
    let bit = if comptime!(j == 31) {
        signs & 0x8000_0000
    } else {
        (signs << comptime!(31 - j)) & 0x8000_0000
    };
    f32::reinterpret(u32::reinterpret(v) ^ bit)
}

/// The 2-bit codes of entry `idx` of a [`Grid::Codes`] grid, value `j` at bits `2j..2j + 2`
/// (bits 16 and up are the next entry's, or zero).
#[cube]
fn entry_codes(grid: &[u32], idx: u32) -> u32 {
    grid[(idx / 2) as usize] >> (16 * (idx % 2))
}

/// The 8 values of IQ2 grid entry `idx` ([`Grid::Codes`]), negated where bit `j` of `signs`
/// is set, to `out[base..base + 8]`: the values of a [`ChunkForm::Scaled`] chunk, whose scale
/// `db` makes ggml's `db * grid * sign`.
#[cube]
fn iq2_group8(grid: &[u32], idx: u32, signs: u32, out: &mut Array<f32>, base: u32) {
    let codes = entry_codes(grid, idx);
    #[unroll]
    for j in 0..8u32 {
        // Code `c` of value `j` as the shift `8c` of its byte in IQ2_LEVELS_WORD.
        let shift = if comptime!(j >= 2) {
            (codes >> comptime!(2 * j - 3)) & 0x18
        } else {
            (codes << comptime!(3 - 2 * j)) & 0x18
        };
        let v = f32::cast_from((IQ2_LEVELS_WORD >> shift) & 0xFF);
        out[(base + j) as usize] = with_sign_bit(v, signs, j);
    }
}

/// `IQ2_XXS`, llama.cpp `block_iq2_xxs { ggml_half d; uint16_t qs[32]; }` (66 bytes): sub-block
/// `ib` is two u32 `a0, a1` at `qs + 8ib`; byte `l` of `a0` indexes `iq2xxs_grid` for group `l`,
/// bits `7l..7l + 7` of `a1` index `ksigns_iq2xs`, `a1 >> 28` is the scale:
/// `y = d * (0.5 + s) * 0.25 * grid * sign`.
pub struct IQ2XXS;
impl BlockFormat for IQ2XXS {
    const TYPE: GgmlType = GgmlType::IQ2_XXS;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 66;
    const GRID: Grid = Grid::Codes {
        table: &ggml_codec::grids::iq2xxs_grid,
        levels: IQ2_LEVELS,
    };
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ2XXS {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let a0 = read_u32(w, block + 2 + 8 * chunk);
        let a1 = read_u32(w, block + 6 + 8 * chunk);
        let db = d * (0.5 + f32::cast_from(a1 >> 28)) * 0.25;
        set_scales(out, db, db);
        #[unroll]
        for l in 0..4u32 {
            let signs = ksigns_iq2xs((a1 >> (7 * l)) & 127);
            iq2_group8(grid, (a0 >> (8 * l)) & 0xFF, signs, out, 8 * l);
        }
    }
}

/// `IQ2_XS`, llama.cpp `block_iq2_xs { ggml_half d; uint16_t qs[32]; uint8_t scales[8]; }`
/// (74 bytes): `qs[4ib + l]` has the `iq2xs_grid` index in bits 0..9 and the `ksigns_iq2xs` index
/// in bits 9..16; groups 0-1 and 2-3 use the low and high nibble of `scales[ib]`:
/// `y = d * (0.5 + s) * 0.25 * grid * sign`.
pub struct IQ2XS;
impl BlockFormat for IQ2XS {
    const TYPE: GgmlType = GgmlType::IQ2_XS;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 74;
    const GRID: Grid = Grid::Codes {
        table: &ggml_codec::grids::iq2xs_grid,
        levels: IQ2_LEVELS,
    };
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ2XS {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let sc = read_u8(w, block + 66 + chunk);
        let db0 = d * (0.5 + f32::cast_from(sc & 0x0F)) * 0.25;
        let db1 = d * (0.5 + f32::cast_from(sc >> 4)) * 0.25;
        set_scales(out, db0, db1);
        #[unroll]
        for h in 0..2u32 {
            let pair = read_u32(w, block + 2 + 8 * chunk + 4 * h);
            #[unroll]
            for i in 0..2u32 {
                let q = (pair >> (16 * i)) & 0xFFFF;
                iq2_group8(grid, q & 511, ksigns_iq2xs(q >> 9), out, 8 * (2 * h + i));
            }
        }
    }
}

/// `IQ2_S`, llama.cpp `block_iq2_s { ggml_half d; uint8_t qs[64]; uint8_t qh[8];
/// uint8_t scales[8]; }` (82 bytes): group `l` of sub-block `ib` indexes `iq2s_grid` with
/// `qs[4ib + l] | ((qh[ib] >> 2l) & 3) << 8`, takes its signs from `qs[32 + 4ib + l]`, and the
/// scale in nibble `l / 2` of `scales[ib]`: `y = d * (0.5 + s) * 0.25 * grid * sign`.
pub struct IQ2S;
impl BlockFormat for IQ2S {
    const TYPE: GgmlType = GgmlType::IQ2_S;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 82;
    const GRID: Grid = Grid::Codes {
        table: &ggml_codec::grids::iq2s_grid,
        levels: IQ2_LEVELS,
    };
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ2S {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let sc = read_u8(w, block + 74 + chunk);
        let db0 = d * (0.5 + f32::cast_from(sc & 0x0F)) * 0.25;
        let db1 = d * (0.5 + f32::cast_from(sc >> 4)) * 0.25;
        let qs = read_u32(w, block + 2 + 4 * chunk);
        let signs = read_u32(w, block + 34 + 4 * chunk);
        let qh = read_u8(w, block + 66 + chunk);
        set_scales(out, db0, db1);
        #[unroll]
        for l in 0..4u32 {
            let idx = ((qs >> (8 * l)) & 0xFF) | ((qh << (8 - 2 * l)) & 0x300);
            iq2_group8(grid, idx, (signs >> (8 * l)) & 0xFF, out, 8 * l);
        }
    }
}

/// `IQ3_XXS`, llama.cpp `block_iq3_xxs { ggml_half d; uint8_t qs[3 * QK_K / 8]; }` (98 bytes):
/// `qs[8ib..8ib + 8]` index `iq3xxs_grid` (4 values each, two per group); the u32 at
/// `qs + 64 + 4ib` has the `ksigns_iq2xs` index of group `l` in bits `7l..7l + 7` and the scale in
/// its top 4 bits: `y = d * (0.5 + s) * 0.5 * grid * sign`.
pub struct IQ3XXS;
impl BlockFormat for IQ3XXS {
    const TYPE: GgmlType = GgmlType::IQ3_XXS;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 98;
    const GRID: Grid = Grid::U32(&ggml_codec::grids::iq3xxs_grid);
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ3XXS {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let aux = read_u32(w, block + 66 + 4 * chunk);
        let db = d * (0.5 + f32::cast_from(aux >> 28)) * 0.5;
        set_scales(out, db, db);
        #[unroll]
        for h in 0..2u32 {
            let q = read_u32(w, block + 2 + 8 * chunk + 4 * h);
            #[unroll]
            for i in 0..2u32 {
                let l = 2 * h + i;
                let g0 = grid[((q >> (16 * i)) & 0xFF) as usize];
                let g1 = grid[((q >> (16 * i + 8)) & 0xFF) as usize];
                let signs = ksigns_iq2xs((aux >> (7 * l)) & 127);
                signed_group8(g0, g1, signs, out, 8 * l);
            }
        }
    }
}

/// `IQ3_S`, llama.cpp `block_iq3_s { ggml_half d; uint8_t qs[64]; uint8_t qh[8];
/// uint8_t signs[32]; uint8_t scales[4]; }` (110 bytes): each `qs` byte plus one bit of `qh[ib]`
/// indexes `iq3s_grid` (4 values); `signs[4ib + l]` has group `l`'s sign bits; sub-block `ib`
/// takes nibble `ib % 2` of `scales[ib / 2]`: `y = d * (1 + 2s) * grid * sign`.
pub struct IQ3S;
impl BlockFormat for IQ3S {
    const TYPE: GgmlType = GgmlType::IQ3_S;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 110;
    const GRID: Grid = Grid::U32(&ggml_codec::grids::iq3s_grid);
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ3S {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let sc = (read_u8(w, block + 106 + chunk / 2) >> (4 * (chunk % 2))) & 0x0F;
        let db = d * f32::cast_from(1 + 2 * sc);
        set_scales(out, db, db);
        let qh = read_u8(w, block + 66 + chunk);
        let signs = read_u32(w, block + 74 + 4 * chunk);
        #[unroll]
        for h in 0..2u32 {
            let q = read_u32(w, block + 2 + 8 * chunk + 4 * h);
            #[unroll]
            for i in 0..2u32 {
                let l = 2 * h + i;
                let i0 = ((q >> (16 * i)) & 0xFF) | ((qh << (8 - 2 * l)) & 256);
                let i1 = ((q >> (16 * i + 8)) & 0xFF) | ((qh << (7 - 2 * l)) & 256);
                let (g0, g1) = (grid[i0 as usize], grid[i1 as usize]);
                signed_group8(g0, g1, (signs >> (8 * l)) & 0xFF, out, 8 * l);
            }
        }
    }
}

/// The 8 level codes of `iq1s_grid` entry `idx` ([`Grid::Codes`], [`IQ1_LEVELS`]) as floats
/// in `out[base..base + 8]`: a code `c` is the value plus one, so with the group offset
/// `delta - 1` ([`iq1_factors`]) the weight is `dl * (c + (delta - 1))`, exact in the sum as
/// ggml's `grid + delta` is: the same one rounding.
#[cube]
fn iq1_codes8(grid: &[u32], idx: u32, out: &mut Array<f32>, base: u32) {
    let codes = entry_codes(grid, idx);
    #[unroll]
    for j in 0..8u32 {
        out[(base + j) as usize] = f32::cast_from((codes >> (2 * j)) & 3);
    }
}

/// Group `l`'s offset for a delta sign `neg` ([`iq1_codes8`]), in `out[FACTOR_OFFSETS + l]`.
#[cube]
fn iq1_offset(neg: bool, out: &mut Array<f32>, l: u32) {
    out[(FACTOR_OFFSETS + l) as usize] = select(neg, -IQ1_DELTA - 1.0, IQ1_DELTA - 1.0);
}

/// `IQ1S_DELTA` (= `IQ1M_DELTA`, ggml-common.h).
const IQ1_DELTA: f32 = ggml_codec::blocks::IQ1S_DELTA;

/// `IQ1_S`, llama.cpp `block_iq1_s { ggml_half d; uint8_t qs[32]; uint16_t qh[8]; }` (50 bytes):
/// group `l` of sub-block `ib` indexes `iq1s_grid` with `qs[4ib + l] | ((qh[ib] >> 3l) & 7) << 8`;
/// bits 12..15 of `qh[ib]` are the scale and bit 15 the delta's sign:
/// `y = d * (2s + 1) * (grid ± IQ1S_DELTA)`.
pub struct IQ1S;
impl BlockFormat for IQ1S {
    const TYPE: GgmlType = GgmlType::IQ1_S;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 50;
    const GRID: Grid = Grid::Codes {
        table: &ggml_codec::grids::iq1s_grid,
        levels: IQ1_LEVELS,
    };
    const FORM: ChunkForm = ChunkForm::ScaledOffsets;
}
#[cube]
impl BlockDecode for IQ1S {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let qh = read_u16(w, block + 34 + 2 * chunk);
        let dl = d * f32::cast_from(2 * ((qh >> 12) & 7) + 1);
        let neg = (qh & 0x8000) != 0;
        let qs = read_u32(w, block + 2 + 4 * chunk);
        set_scales(out, dl, dl);
        #[unroll]
        for l in 0..4u32 {
            let idx = ((qs >> (8 * l)) & 0xFF) | (((qh >> (3 * l)) & 7) << 8);
            iq1_codes8(grid, idx, out, 8 * l);
            iq1_offset(neg, out, l);
        }
    }
}

/// `IQ1_M`, llama.cpp `block_iq1_m { uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8]; }`
/// (56 bytes): `scales` is 4 u16 `sc` whose top nibbles make the fp16 `d`; sub-block `ib` has
/// 3-bit scales at bits `6 (ib % 2)` (groups 0-1) and `+ 3` (groups 2-3) of `sc[ib / 2]`. Group
/// `l` indexes `iq1s_grid` with `qs[4ib + l]` plus 3 high bits from nibble `l % 2` of
/// `qh[2ib + l / 2]`, whose bit 3 is the delta's sign: `y = d * (2s + 1) * (grid ± IQ1M_DELTA)`.
pub struct IQ1M;
impl BlockFormat for IQ1M {
    const TYPE: GgmlType = GgmlType::IQ1_M;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 56;
    const GRID: Grid = Grid::Codes {
        table: &ggml_codec::grids::iq1s_grid,
        levels: IQ1_LEVELS,
    };
    const FORM: ChunkForm = ChunkForm::ScaledOffsets;
}
#[cube]
impl BlockDecode for IQ1M {
    fn decode_chunk(w: &[u32], grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let s01 = read_u32(w, block + 48);
        let s23 = read_u32(w, block + 52);
        let bits = ((s01 >> 12) & 0x000F)
            | ((s01 >> 24) & 0x00F0)
            | ((s23 >> 4) & 0x0F00)
            | ((s23 >> 16) & 0xF000);
        let d = f16_to_f32(bits);
        let sc = select(chunk < 4, s01, s23) >> (16 * ((chunk / 2) % 2) + 6 * (chunk % 2));
        let dl1 = d * f32::cast_from(2 * (sc & 7) + 1);
        let dl2 = d * f32::cast_from(2 * ((sc >> 3) & 7) + 1);
        let qs = read_u32(w, block + 4 * chunk);
        let qh = read_u16(w, block + 32 + 2 * chunk);
        set_scales(out, dl1, dl2);
        #[unroll]
        for l in 0..4u32 {
            let h = (qh >> (8 * (l / 2))) & 0xFF;
            let idx = ((qs >> (8 * l)) & 0xFF) | ((h << (8 - 4 * (l % 2))) & 0x700);
            let neg = (h & (0x08u32 << (4 * (l % 2)))) != 0;
            iq1_codes8(grid, idx, out, 8 * l);
            iq1_offset(neg, out, l);
        }
    }
}

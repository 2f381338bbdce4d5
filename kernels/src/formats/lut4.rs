//! Types whose 4-bit codes index a 16-entry value table: `IQ4_NL`, `IQ4_XS` (`kvalues_iq4nl`),
//! `MXFP4` (E2M1 with an E8M0 scale) and `NVFP4` (E2M1 with UE4M3 scales); llama.cpp
//! `ggml-common.h`, `dequantize_row_iq4_*`, `dequantize_row_mxfp4`, `dequantize_row_nvfp4`.
use super::*;

/// Packs bytes `4k..4k + 4` of a 16-entry int8 table little-endian into one word (entry `4k` in
/// the low byte), so kernels can hold the table in four `u32` constants.
const fn pack_i8x4(table: &[i8; 16], k: usize) -> u32 {
    (table[4 * k] as u8 as u32)
        | ((table[4 * k + 1] as u8 as u32) << 8)
        | ((table[4 * k + 2] as u8 as u32) << 16)
        | ((table[4 * k + 3] as u8 as u32) << 24)
}

/// `kvalues_iq4nl` (ggml-common.h), packed from `ggml_codec::grids::kvalues_iq4nl`.
const KV_IQ4NL_0: u32 = pack_i8x4(&ggml_codec::grids::kvalues_iq4nl, 0);
const KV_IQ4NL_1: u32 = pack_i8x4(&ggml_codec::grids::kvalues_iq4nl, 1);
const KV_IQ4NL_2: u32 = pack_i8x4(&ggml_codec::grids::kvalues_iq4nl, 2);
const KV_IQ4NL_3: u32 = pack_i8x4(&ggml_codec::grids::kvalues_iq4nl, 3);

/// `kvalues_mxfp4` / `kvalues_fp4` (ggml-common.h, doubled E2M1 values), packed from
/// `ggml_codec::grids::kvalues_mxfp4`.
const KV_FP4_0: u32 = pack_i8x4(&ggml_codec::grids::kvalues_mxfp4, 0);
const KV_FP4_1: u32 = pack_i8x4(&ggml_codec::grids::kvalues_mxfp4, 1);
const KV_FP4_2: u32 = pack_i8x4(&ggml_codec::grids::kvalues_mxfp4, 2);
const KV_FP4_3: u32 = pack_i8x4(&ggml_codec::grids::kvalues_mxfp4, 3);

/// Entry `q` (0..16) of a 16-entry int8 table packed in words `t0..t3`, as f32.
#[cube]
fn lut16_i8(t0: u32, t1: u32, t2: u32, t3: u32, q: u32) -> f32 {
    let hi = (q & 4) != 0;
    let lo_pair = select(hi, t1, t0);
    let hi_pair = select(hi, t3, t2);
    let word = select((q & 8) != 0, hi_pair, lo_pair);
    i8_to_f32((word >> (8 * (q & 3))) & 0xFF)
}

/// `kvalues_iq4nl[q]` as f32.
#[cube]
pub(crate) fn kvalue_iq4nl(q: u32) -> f32 {
    lut16_i8(KV_IQ4NL_0, KV_IQ4NL_1, KV_IQ4NL_2, KV_IQ4NL_3, q)
}

/// `kvalues_mxfp4[q]` (the doubled E2M1 value of nibble `q`) as f32.
#[cube]
pub(crate) fn kvalue_fp4(q: u32) -> f32 {
    lut16_i8(KV_FP4_0, KV_FP4_1, KV_FP4_2, KV_FP4_3, q)
}

/// ggml's `GGML_E8M0_TO_FP32_HALF` on the E8M0 byte `e`: `2^(e - 128)` built from its bits
/// (`e < 2` gives the subnormals `2^-128`, `2^-127`; `e = 255` gives `2^127`).
#[cube]
pub(crate) fn e8m0_to_f32_half(e: u32) -> f32 {
    let sub = 0x0020_0000u32 << (e & 1);
    let normal = (e - 1) << 23;
    f32::reinterpret(select(e < 2, sub, normal))
}

/// ggml's `ggml_ue4m3_to_fp32` on the UE4M3 byte `x`, halved (matching the doubled E2M1
/// values): `0` and `0x7F` give 0, exponent 0 is subnormal (`man * 2^-10` after halving),
/// otherwise `(1 + man / 8) * 2^(exp - 8)`. Bit 7 is ignored except in the zero test.
#[cube]
pub(crate) fn ue4m3_to_f32_half(x: u32) -> f32 {
    let exp = (x >> 3) & 0xF;
    let man = x & 7;
    let normal = f32::reinterpret(((exp + 119) << 23) | (man << 20));
    let sub = f32::cast_from(man) * 0.000_976_562_5;
    let r = select(exp == 0, sub, normal);
    select(x == 0x7F, 0.0f32, select(x == 0, 0.0f32, r))
}

/// `IQ4_NL`, llama.cpp `block_iq4_nl { ggml_half d; uint8_t qs[16]; }` (18 bytes): nibbles laid
/// out as in Q4_0, `y = d * kvalues_iq4nl[q]`.
pub struct IQ4NL;
impl BlockFormat for IQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 18;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ4NL {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        set_scales(out, d, d);
        iq4_nibbles(w, block + 2, out);
    }
}

/// The 32 `kvalues_iq4nl[q]` of the 16 IQ4 nibble bytes at byte `qs`: element `j < 16` from the
/// low nibble of byte `j`, `j + 16` from its high nibble; the values of a [`ChunkForm::Scaled`]
/// chunk whose scale `d` makes `y = d * kvalues_iq4nl[q]` (IQ4_NL and IQ4_XS).
#[cube]
fn iq4_nibbles(w: &[u32], qs: u32, out: &mut Array<f32>) {
    #[unroll]
    for k in 0..4u32 {
        let word = read_u32(w, qs + 4 * k);
        #[unroll]
        for i in 0..4u32 {
            let b = (word >> (8 * i)) & 0xFF;
            out[(4 * k + i) as usize] = kvalue_iq4nl(b & 0x0F);
            out[(4 * k + i + 16) as usize] = kvalue_iq4nl(b >> 4);
        }
    }
}

/// `IQ4_XS`, llama.cpp `block_iq4_xs { ggml_half d; uint16_t scales_h; uint8_t scales_l[4];
/// uint8_t qs[128]; }` (136 bytes, 256 elements): eight sub-blocks of 32 (one per chunk) with a
/// 6-bit scale `ls` (low 4 bits in nibble `ib % 2` of `scales_l[ib / 2]`, top 2 bits at bit `2 ib`
/// of `scales_h`); `y = d * (ls - 32) * kvalues_iq4nl[q]`, nibbles as in IQ4_NL.
pub struct IQ4XS;
impl BlockFormat for IQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 136;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for IQ4XS {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let dh = read_u32(w, block);
        let d = f16_to_f32(dh & 0xFFFF);
        let scales_h = dh >> 16;
        let sl = (read_u8(w, block + 4 + chunk / 2) >> (4 * (chunk % 2))) & 0x0F;
        let ls = sl | (((scales_h >> (2 * chunk)) & 3) << 4);
        let dl = d * (f32::cast_from(ls) - 32.0);
        set_scales(out, dl, dl);
        iq4_nibbles(w, block + 8 + 16 * chunk, out);
    }
}

/// `MXFP4`, llama.cpp `block_mxfp4 { uint8_t e; uint8_t qs[16]; }` (17 bytes, so blocks start at
/// any byte offset): E8M0 shared scale, E2M1 nibbles laid out as in Q4_0;
/// `y = kvalues_mxfp4[q] * GGML_E8M0_TO_FP32_HALF(e)`.
pub struct MXFP4;
impl BlockFormat for MXFP4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 17;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for MXFP4 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = e8m0_to_f32_half(read_u8(w, block));
        set_scales(out, d, d);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 1 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let b = (word >> (8 * i)) & 0xFF;
                out[(4 * k + i) as usize] = kvalue_fp4(b & 0x0F);
                out[(4 * k + i + 16) as usize] = kvalue_fp4(b >> 4);
            }
        }
    }
}

/// `NVFP4`, llama.cpp `block_nvfp4 { uint8_t d[4]; uint8_t qs[32]; }` (36 bytes, 64 elements):
/// four sub-blocks of 16 with UE4M3 scales `d[s]`; sub-block `s` reads `qs[8s..8s + 8]`, value
/// `j < 8` the low nibble of byte `j`, `j + 8` its high nibble;
/// `y = kvalues_mxfp4[q] * ggml_ue4m3_to_fp32(d[s]) / 2`. Chunk `c` is sub-blocks `2c`, `2c + 1`.
pub struct NVFP4;
impl BlockFormat for NVFP4 {
    const TYPE: GgmlType = GgmlType::NVFP4;
    const BLOCK_ELEMS: u32 = 64;
    const BLOCK_BYTES: u32 = 36;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for NVFP4 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let scales = read_u16(w, block + 2 * chunk);
        let qs = block + 4 + 16 * chunk;
        set_scales(
            out,
            ue4m3_to_f32_half(scales & 0xFF),
            ue4m3_to_f32_half(scales >> 8),
        );
        #[unroll]
        for h in 0..2u32 {
            #[unroll]
            for k in 0..2u32 {
                let word = read_u32(w, qs + 8 * h + 4 * k);
                #[unroll]
                for i in 0..4u32 {
                    let b = (word >> (8 * i)) & 0xFF;
                    out[(16 * h + 4 * k + i) as usize] = kvalue_fp4(b & 0x0F);
                    out[(16 * h + 4 * k + i + 8) as usize] = kvalue_fp4(b >> 4);
                }
            }
        }
    }
}

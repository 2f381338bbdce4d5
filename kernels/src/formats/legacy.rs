//! The legacy block types, 32 elements a block: `F32`, `F16` and `BF16` read as pseudo-blocks,
//! `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` and `Q8_0` (llama.cpp `ggml-common.h`, `dequantize_row_q*`).
use super::*;

/// `F32`: 32 little-endian f32 per pseudo-block (128 bytes, always word aligned).
pub struct F32;
impl BlockFormat for F32 {
    const TYPE: GgmlType = GgmlType::F32;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 128;
}
#[cube]
impl BlockDecode for F32 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let base = block / 4;
        #[unroll]
        for j in 0..32u32 {
            out[j as usize] = f32::reinterpret(w[(base + j) as usize]);
        }
    }
}

/// `F16`: 32 IEEE binary16 per pseudo-block (64 bytes, word aligned).
pub struct F16;
impl BlockFormat for F16 {
    const TYPE: GgmlType = GgmlType::F16;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 64;
}
#[cube]
impl BlockDecode for F16 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let base = block / 4;
        #[unroll]
        for k in 0..16u32 {
            let word = w[(base + k) as usize];
            out[(2 * k) as usize] = f16_to_f32(word & 0xFFFF);
            out[(2 * k + 1) as usize] = f16_to_f32(word >> 16);
        }
    }
}

/// `BF16`: 32 bfloat16 per pseudo-block (64 bytes, word aligned).
pub struct BF16;
impl BlockFormat for BF16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 64;
}
#[cube]
impl BlockDecode for BF16 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let base = block / 4;
        #[unroll]
        for k in 0..16u32 {
            let word = w[(base + k) as usize];
            out[(2 * k) as usize] = bf16_to_f32(word & 0xFFFF);
            out[(2 * k + 1) as usize] = bf16_to_f32(word >> 16);
        }
    }
}

/// `Q8_0`, llama.cpp `block_q8_0 { ggml_half d; int8_t qs[32]; }` (34 bytes): `y = d * qs`.
pub struct Q8_0;
impl BlockFormat for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 34;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for Q8_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        set_scales(out, d, d);
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, block + 2 + 4 * k);
            #[unroll]
            for j in 0..4u32 {
                out[(4 * k + j) as usize] = byte_i8_to_f32(word, j);
            }
        }
    }
}

/// `Q5_0`, llama.cpp `block_q5_0 { ggml_half d; uint8_t qh[4]; uint8_t qs[16]; }` (22 bytes):
/// element `j < 16` is the low nibble of `qs[j]` with bit `j` of `qh` as bit 4, element `j + 16`
/// the high nibble with bit `j + 16`; `y = d * (q - 16)`.
pub struct Q5_0;
impl BlockFormat for Q5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 22;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for Q5_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        set_scales(out, d, d);
        let qh = read_u32(w, block + 2);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 6 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let j = 4 * k + i;
                let b = (word >> (8 * i)) & 0xFF;
                let xh0 = ((qh >> j) << 4) & 0x10;
                let xh1 = (qh >> (j + 12)) & 0x10;
                out[j as usize] = f32::cast_from((b & 0x0F) | xh0) - 16.0;
                out[(j + 16) as usize] = f32::cast_from((b >> 4) | xh1) - 16.0;
            }
        }
    }
}

/// `Q4_0`, llama.cpp `block_q4_0 { ggml_half d; uint8_t qs[16]; }` (18 bytes): element `j < 16`
/// is the low nibble of `qs[j]`, element `j + 16` the high nibble; `y = d * (q - 8)`.
pub struct Q4_0;
impl BlockFormat for Q4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 18;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for Q4_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        set_scales(out, d, d);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 2 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let b = (word >> (8 * i)) & 0xFF;
                out[(4 * k + i) as usize] = f32::cast_from(b & 0x0F) - 8.0;
                out[(4 * k + i + 16) as usize] = f32::cast_from(b >> 4) - 8.0;
            }
        }
    }
}

/// `Q4_1`, llama.cpp `block_q4_1 { ggml_half d; ggml_half m; uint8_t qs[16]; }` (20 bytes):
/// nibbles as in Q4_0; `y = d * q + m`.
pub struct Q4_1;
impl BlockFormat for Q4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 20;
    const FORM: ChunkForm = ChunkForm::ScaledBiases;
}
#[cube]
impl BlockDecode for Q4_1 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let m = f16_to_f32(dm >> 16);
        set_scales(out, d, d);
        set_biases(out, m, m);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 4 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let b = (word >> (8 * i)) & 0xFF;
                out[(4 * k + i) as usize] = f32::cast_from(b & 0x0F);
                out[(4 * k + i + 16) as usize] = f32::cast_from(b >> 4);
            }
        }
    }
}

/// `Q5_1`, llama.cpp `block_q5_1 { ggml_half d; ggml_half m; uint8_t qh[4]; uint8_t qs[16]; }`
/// (24 bytes): 5-bit quants as in Q5_0; `y = d * q + m`.
pub struct Q5_1;
impl BlockFormat for Q5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 24;
    const FORM: ChunkForm = ChunkForm::ScaledBiases;
}
#[cube]
impl BlockDecode for Q5_1 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let m = f16_to_f32(dm >> 16);
        set_scales(out, d, d);
        set_biases(out, m, m);
        let qh = read_u32(w, block + 4);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 8 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let j = 4 * k + i;
                let b = (word >> (8 * i)) & 0xFF;
                let xh0 = ((qh >> j) << 4) & 0x10;
                let xh1 = (qh >> (j + 12)) & 0x10;
                out[j as usize] = f32::cast_from((b & 0x0F) | xh0);
                out[(j + 16) as usize] = f32::cast_from((b >> 4) | xh1);
            }
        }
    }
}

//! The ternary and 1-/2-bit types: `TQ1_0`, `TQ2_0`, `Q1_0` and `Q2_0` (llama.cpp
//! `ggml-common.h`, `dequantize_row_tq*`, `dequantize_row_q1_0`, `dequantize_row_q2_0`).
use super::*;

/// `TQ2_0`, llama.cpp `block_tq2_0 { uint8_t qs[64]; ggml_half d; }` (66 bytes, 256 elements):
/// 2-bit ternary quants, `y = d * (q - 1)`. Element `n` is bits `2 * ((n % 128) / 32)` of byte
/// `32 * (n / 128) + n % 32`, so chunk `c` takes bits `2 * (c % 4)` of `qs[32 * (c / 4)..][..32]`.
pub struct TQ2_0;
impl BlockFormat for TQ2_0 {
    const TYPE: GgmlType = GgmlType::TQ2_0;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 66;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for TQ2_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block + 64));
        set_scales(out, d, d);
        let qs = block + 32 * (chunk / 4);
        let shift = 2 * (chunk % 4);
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            #[unroll]
            for i in 0..4u32 {
                let q = (word >> (8 * i)) & 3;
                out[(4 * k + i) as usize] = f32::cast_from(q) - 1.0;
            }
        }
    }
}

/// `3^n` for `n` in 0..5.
#[cube]
fn pow3_u8(n: u32) -> u32 {
    select(n >= 4, 81u32, (0x1B09_0301u32 >> (8 * (n & 3))) & 0xFF)
}

/// `TQ1_0`, llama.cpp `block_tq1_0 { uint8_t qs[48]; uint8_t qh[4]; ggml_half d; }` (54 bytes,
/// 256 elements): base-3 packed trits, `y = d * (t - 1)` with trit `n` of byte `q` equal to
/// `((uint8)(q * 3^n) * 3) >> 8`. Chunk `c < 5` is trit `c` of `qs[0..32]`; chunks 5 and 6 are
/// trits `2 (c - 5)` and `2 (c - 5) + 1` of `qs[32..48]`; chunk 7 is trit 4 of `qs[32..48]`,
/// then value `16 + 4n + j` is trit `n` of `qh[j]`.
pub struct TQ1_0;
impl BlockFormat for TQ1_0 {
    const TYPE: GgmlType = GgmlType::TQ1_0;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 54;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for TQ1_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block + 52));
        set_scales(out, d, d);
        let lo = chunk < 5;
        // 0, 1, 2 for chunks 5, 6, 7 (unused below 5).
        let c5 = (chunk + 3) % 8;
        let is7 = chunk == 7;
        #[unroll]
        for k in 0..8u32 {
            // Bytes `4k..4k + 4` of the chunk come from one 4-byte run with one power of 3.
            let addr_a = block + 32 + 4 * (k % 4);
            let n_a = 2 * c5 + k / 4;
            let addr_hi = select(k < 4, addr_a, select(is7, block + 48, addr_a));
            let n_hi = select(k < 4, n_a, select(is7, k % 4, n_a));
            let addr = select(lo, block + 4 * k, addr_hi);
            let p = pow3_u8(select(lo, chunk, n_hi));
            let word = read_u32(w, addr);
            #[unroll]
            for i in 0..4u32 {
                let q = (word >> (8 * i)) & 0xFF;
                let t = (((q * p) & 0xFF) * 3) >> 8;
                out[(4 * k + i) as usize] = f32::cast_from(t) - 1.0;
            }
        }
    }
}

/// `Q1_0`, llama.cpp `block_q1_0 { ggml_half d; uint8_t qs[16]; }` (18 bytes, 128 elements):
/// element `j` is bit `j % 8` of `qs[j / 8]`, `y = bit ? d : -d`.
pub struct Q1_0;
impl BlockFormat for Q1_0 {
    const TYPE: GgmlType = GgmlType::Q1_0;
    const BLOCK_ELEMS: u32 = 128;
    const BLOCK_BYTES: u32 = 18;
}
#[cube]
impl BlockDecode for Q1_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        let neg_d = -d;
        let bits = read_u32(w, block + 2 + 4 * chunk);
        #[unroll]
        for j in 0..32u32 {
            out[j as usize] = select(((bits >> j) & 1) != 0, d, neg_d);
        }
    }
}

/// `Q2_0`, llama.cpp `block_q2_0 { ggml_half d; uint8_t qs[16]; }` (18 bytes, 64 elements):
/// element `j` is bits `2 * (j % 4)` of `qs[j / 4]`, `y = (q - 1) * d`.
pub struct Q2_0;
impl BlockFormat for Q2_0 {
    const TYPE: GgmlType = GgmlType::Q2_0;
    const BLOCK_ELEMS: u32 = 64;
    const BLOCK_BYTES: u32 = 18;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for Q2_0 {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        set_scales(out, d, d);
        #[unroll]
        for k in 0..2u32 {
            let word = read_u32(w, block + 2 + 8 * chunk + 4 * k);
            #[unroll]
            for j in 0..16u32 {
                let q = (word >> (2 * j)) & 3;
                out[(16 * k + j) as usize] = f32::cast_from(q) - 1.0;
            }
        }
    }
}

//! The K-quants, 256-element super-blocks of 16 or 8 sub-blocks with packed sub-block scales:
//! `Q2_K` to `Q6_K` (llama.cpp `ggml-common.h` `block_q*_K`, `dequantize_row_q*_K`).
use super::*;

/// llama.cpp `get_scale_min_k4(j, scales)` for the 12 packed bytes at byte `scales`: the 6-bit
/// scale in bits 0..8 of the result, the 6-bit min in bits 8..16.
#[cube]
pub(crate) fn scale_min_k4(w: &[u32], scales: u32, j: u32) -> u32 {
    let lo = j % 4;
    let a = read_u8(w, scales + lo);
    let b = read_u8(w, scales + lo + 4);
    let c = read_u8(w, scales + lo + 8);
    let high = j >= 4;
    let sc = select(high, (c & 0x0F) | ((a >> 6) << 4), a & 63);
    let m = select(high, (c >> 4) | ((b >> 6) << 4), b & 63);
    sc | (m << 8)
}

/// `Q4_K`, llama.cpp `block_q4_K { ggml_half d; ggml_half dmin; uint8_t scales[12];
/// uint8_t qs[128]; }` (144 bytes, 256 elements): eight sub-blocks of 32 with 6-bit scale and
/// min packed in `scales` (`get_scale_min_k4`); `y = d * sc * q - dmin * m`. One chunk is one
/// sub-block: chunk `c` reads the low (`c` even) or high nibbles of `qs[32 * (c / 2)..][..32]`.
pub struct Q4K;
impl BlockFormat for Q4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 144;
    const FORM: ChunkForm = ChunkForm::ScaledBiases;
}
#[cube]
impl BlockDecode for Q4K {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let dmin = f16_to_f32(dm >> 16);
        let sm = scale_min_k4(w, block + 4, chunk);
        let d1 = d * f32::cast_from(sm & 0xFF);
        let m1 = dmin * f32::cast_from(sm >> 8);
        set_scales(out, d1, d1);
        set_biases(out, -m1, -m1);
        let qs = block + 16 + 32 * (chunk / 2);
        let shift = (chunk % 2) * 4;
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            #[unroll]
            for i in 0..4u32 {
                let q = (word >> (8 * i)) & 0x0F;
                out[(4 * k + i) as usize] = f32::cast_from(q);
            }
        }
    }
}

/// `Q6_K`, llama.cpp `block_q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16];
/// ggml_half d; }` (210 bytes, 256 elements): 6-bit quants split in low 4 bits (`ql`) and high
/// 2 bits (`qh`), 16 sub-blocks of 16 with int8 scales; `y = d * sc * (q - 32)`. Chunk `c`
/// covers elements `128 * (c / 4) + 32 * (c % 4)..` of the block.
pub struct Q6K;
impl BlockFormat for Q6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 210;
    const FORM: ChunkForm = ChunkForm::Scaled;
}
#[cube]
impl BlockDecode for Q6K {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let n = chunk / 4;
        let q = chunk % 4;
        let d = f16_to_f32(read_u16(w, block + 208));
        let ql = block + 64 * n + 32 * (q % 2);
        let ql_shift = (q / 2) * 4;
        let qh = block + 128 + 32 * n;
        let qh_shift = 2 * q;
        let sc = block + 192 + 8 * n + 2 * q;
        let d0 = d * i8_to_f32(read_u8(w, sc));
        let d1 = d * i8_to_f32(read_u8(w, sc + 1));
        // Elements 0..16 use scale `sc`, 16..32 scale `sc + 1`.
        set_scales(out, d0, d1);
        #[unroll]
        for k in 0..8u32 {
            let lw = read_u32(w, ql + 4 * k) >> ql_shift;
            let hw = read_u32(w, qh + 4 * k) >> qh_shift;
            #[unroll]
            for i in 0..4u32 {
                let v = ((lw >> (8 * i)) & 0x0F) | (((hw >> (8 * i)) & 0x03) << 4);
                out[(4 * k + i) as usize] = f32::cast_from(v) - 32.0;
            }
        }
    }
}

/// `Q2_K`, llama.cpp `block_q2_K { uint8_t scales[16]; uint8_t qs[64]; ggml_half d;
/// ggml_half dmin; }` (84 bytes, 256 elements): 2-bit quants, 16 sub-blocks of 16 with a 4-bit
/// scale (low nibble) and min (high nibble); `y = d * sc * q - dmin * m`. Chunk `c` takes bits
/// `2 * (c % 4)` of `qs[32 * (c / 4)..][..32]`, with scales `8 * (c / 4) + 2 * (c % 4)` and `+ 1`.
pub struct Q2K;
impl BlockFormat for Q2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 84;
    const FORM: ChunkForm = ChunkForm::ScaledBiases;
}
#[cube]
impl BlockDecode for Q2K {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let n = chunk / 4;
        let shift = 2 * (chunk % 4);
        let d = f16_to_f32(read_u16(w, block + 80));
        let dmin = f16_to_f32(read_u16(w, block + 82));
        let s = block + 8 * n + 2 * (chunk % 4);
        let sc0 = read_u8(w, s);
        let sc1 = read_u8(w, s + 1);
        let d0 = d * f32::cast_from(sc0 & 0x0F);
        let m0 = dmin * f32::cast_from(sc0 >> 4);
        let d1 = d * f32::cast_from(sc1 & 0x0F);
        let m1 = dmin * f32::cast_from(sc1 >> 4);
        set_scales(out, d0, d1);
        set_biases(out, -m0, -m1);
        let qs = block + 16 + 32 * n;
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            #[unroll]
            for i in 0..4u32 {
                let q = (word >> (8 * i)) & 3;
                out[(4 * k + i) as usize] = f32::cast_from(q);
            }
        }
    }
}

/// `Q3_K`, llama.cpp `block_q3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12];
/// ggml_half d; }` (110 bytes, 256 elements): 2 low bits in `qs`, the high bit in `hmask`
/// (clear means minus 4), 16 sub-blocks of 16 with 6-bit scales packed in `scales`;
/// `y = d * (sc - 32) * q`. Chunk `c` is laid out as in Q2_K, with `hmask` bit `c`.
pub struct Q3K;
impl BlockFormat for Q3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 110;
    const FORM: ChunkForm = ChunkForm::Scaled;
}

/// Scale `k` (0..16) of a Q3_K block, from its 12 packed bytes at byte `scales`, minus 32.
#[cube]
fn q3k_scale(w: &[u32], scales: u32, k: u32) -> f32 {
    let g = k / 4;
    let b = k % 4;
    let lo = (read_u8(w, scales + (g % 2) * 4 + b) >> ((g / 2) * 4)) & 0x0F;
    let hi = (read_u8(w, scales + 8 + b) >> (2 * g)) & 3;
    f32::cast_from(lo | (hi << 4)) - 32.0
}

#[cube]
impl BlockDecode for Q3K {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let n = chunk / 4;
        let j = chunk % 4;
        let d = f16_to_f32(read_u16(w, block + 108));
        let d0 = d * q3k_scale(w, block + 96, 8 * n + 2 * j);
        let d1 = d * q3k_scale(w, block + 96, 8 * n + 2 * j + 1);
        let qs = block + 32 + 32 * n;
        set_scales(out, d0, d1);
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> (2 * j);
            let hm = read_u32(w, block + 4 * k) >> chunk;
            #[unroll]
            for i in 0..4u32 {
                let q = f32::cast_from((word >> (8 * i)) & 3);
                let h = select(((hm >> (8 * i)) & 1) == 1, 0.0f32, 4.0f32);
                out[(4 * k + i) as usize] = q - h;
            }
        }
    }
}

/// `Q5_K`, llama.cpp `block_q5_K { ggml_half d; ggml_half dmin; uint8_t scales[12];
/// uint8_t qh[32]; uint8_t qs[128]; }` (176 bytes, 256 elements): Q4_K's layout plus a fifth bit
/// per element in `qh` (bit `c` for chunk `c`); `y = d * sc * q - dmin * m`.
pub struct Q5K;
impl BlockFormat for Q5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const BLOCK_ELEMS: u32 = 256;
    const BLOCK_BYTES: u32 = 176;
    const FORM: ChunkForm = ChunkForm::ScaledBiases;
}
#[cube]
impl BlockDecode for Q5K {
    fn decode_chunk(w: &[u32], _grid: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let dmin = f16_to_f32(dm >> 16);
        let sm = scale_min_k4(w, block + 4, chunk);
        let d1 = d * f32::cast_from(sm & 0xFF);
        let m1 = dmin * f32::cast_from(sm >> 8);
        set_scales(out, d1, d1);
        set_biases(out, -m1, -m1);
        let qs = block + 48 + 32 * (chunk / 2);
        let shift = (chunk % 2) * 4;
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            let hw = read_u32(w, block + 16 + 4 * k) >> chunk;
            #[unroll]
            for i in 0..4u32 {
                let q = ((word >> (8 * i)) & 0x0F) | (((hw >> (8 * i)) & 1) << 4);
                out[(4 * k + i) as usize] = f32::cast_from(q);
            }
        }
    }
}

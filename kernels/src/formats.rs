//! Block decoders: one per ggml type, behind one `#[cube]` trait.
//!
//! Every decoder turns one 32-element *chunk* of a block into registers. A chunk is the unit of
//! work of every op (GEMV lanes, dequantize threads), so ops are written once, generic over
//! [`BlockDecode`]. Layouts follow llama.cpp `ggml/src/ggml-common.h`; the math follows
//! `ggml/src/ggml-quants.c` `dequantize_row_*`. The CPU codec (`ggml-codec`) is the oracle.
//!
//! `F32`, `F16` and `BF16` have one element per ggml block; here they are read as pseudo-blocks
//! of 32 elements, so their rows must be a multiple of 32 long (the host checks).
use crate::words::{bf16_to_f32, f16_to_f32, i8_to_f32, read_u8, read_u16, read_u32};
use cubecl::prelude::*;
use gguf::GgmlType;

/// Elements decoded per [`BlockDecode::decode_chunk`] call, for every type.
pub const CHUNK_ELEMS: u32 = 32;

/// Host-side constants of a block format (plain Rust, read inside kernels with `comptime!`).
pub trait BlockFormat: 'static + Send + Sync {
    /// The ggml type this decoder reads.
    const TYPE: GgmlType;
    /// Elements per (pseudo-)block along a row.
    const BLOCK_ELEMS: u32;
    /// Bytes per (pseudo-)block.
    const BLOCK_BYTES: u32;
    /// Chunks of [`CHUNK_ELEMS`] per block.
    const CHUNKS: u32 = Self::BLOCK_ELEMS / CHUNK_ELEMS;
}

/// Decodes chunk `chunk` (0..CHUNKS) of the block starting at byte `block` of the word stream
/// `w` into `out[0..32]`, in row order.
#[cube]
pub trait BlockDecode: BlockFormat {
    fn decode_chunk(w: &[u32], block: u32, chunk: u32, out: &mut Array<f32>);
}

/// `F32`: 32 little-endian f32 per pseudo-block (128 bytes, always word aligned).
pub struct F32;
impl BlockFormat for F32 {
    const TYPE: GgmlType = GgmlType::F32;
    const BLOCK_ELEMS: u32 = 32;
    const BLOCK_BYTES: u32 = 128;
}
#[cube]
impl BlockDecode for F32 {
    fn decode_chunk(w: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
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
    fn decode_chunk(w: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
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
    fn decode_chunk(w: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
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
}
#[cube]
impl BlockDecode for Q8_0 {
    fn decode_chunk(w: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, block + 2 + 4 * k);
            #[unroll]
            for j in 0..4u32 {
                out[(4 * k + j) as usize] = i8_to_f32((word >> (8 * j)) & 0xFF) * d;
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
}
#[cube]
impl BlockDecode for Q5_0 {
    fn decode_chunk(w: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
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
                out[j as usize] = (f32::cast_from((b & 0x0F) | xh0) - 16.0) * d;
                out[(j + 16) as usize] = (f32::cast_from((b >> 4) | xh1) - 16.0) * d;
            }
        }
    }
}

/// llama.cpp `get_scale_min_k4(j, scales)` for the 12 packed bytes at byte `scales`: the 6-bit
/// scale in bits 0..8 of the result, the 6-bit min in bits 8..16.
#[cube]
pub fn scale_min_k4(w: &[u32], scales: u32, j: u32) -> u32 {
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
}
#[cube]
impl BlockDecode for Q4K {
    fn decode_chunk(w: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let dmin = f16_to_f32(dm >> 16);
        let sm = scale_min_k4(w, block + 4, chunk);
        let d1 = d * f32::cast_from(sm & 0xFF);
        let m1 = dmin * f32::cast_from(sm >> 8);
        let qs = block + 16 + 32 * (chunk / 2);
        let shift = (chunk % 2) * 4;
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            #[unroll]
            for i in 0..4u32 {
                let q = (word >> (8 * i)) & 0x0F;
                out[(4 * k + i) as usize] = d1 * f32::cast_from(q) - m1;
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
}
#[cube]
impl BlockDecode for Q6K {
    fn decode_chunk(w: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
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
        #[unroll]
        for k in 0..8u32 {
            let lw = read_u32(w, ql + 4 * k) >> ql_shift;
            let hw = read_u32(w, qh + 4 * k) >> qh_shift;
            let dk = select(k < 4, d0, d1);
            #[unroll]
            for i in 0..4u32 {
                let v = ((lw >> (8 * i)) & 0x0F) | (((hw >> (8 * i)) & 0x03) << 4);
                out[(4 * k + i) as usize] = dk * (f32::cast_from(v) - 32.0);
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
}
#[cube]
impl BlockDecode for Q4_0 {
    fn decode_chunk(w: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let d = f16_to_f32(read_u16(w, block));
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 2 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let b = (word >> (8 * i)) & 0xFF;
                out[(4 * k + i) as usize] = (f32::cast_from(b & 0x0F) - 8.0) * d;
                out[(4 * k + i + 16) as usize] = (f32::cast_from(b >> 4) - 8.0) * d;
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
}
#[cube]
impl BlockDecode for Q4_1 {
    fn decode_chunk(w: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let m = f16_to_f32(dm >> 16);
        #[unroll]
        for k in 0..4u32 {
            let word = read_u32(w, block + 4 + 4 * k);
            #[unroll]
            for i in 0..4u32 {
                let b = (word >> (8 * i)) & 0xFF;
                out[(4 * k + i) as usize] = f32::cast_from(b & 0x0F) * d + m;
                out[(4 * k + i + 16) as usize] = f32::cast_from(b >> 4) * d + m;
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
}
#[cube]
impl BlockDecode for Q5_1 {
    fn decode_chunk(w: &[u32], block: u32, _chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let m = f16_to_f32(dm >> 16);
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
                out[j as usize] = f32::cast_from((b & 0x0F) | xh0) * d + m;
                out[(j + 16) as usize] = f32::cast_from((b >> 4) | xh1) * d + m;
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
}
#[cube]
impl BlockDecode for Q2K {
    fn decode_chunk(w: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
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
        let qs = block + 16 + 32 * n;
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            let dk = select(k < 4, d0, d1);
            let mk = select(k < 4, m0, m1);
            #[unroll]
            for i in 0..4u32 {
                let q = (word >> (8 * i)) & 3;
                out[(4 * k + i) as usize] = dk * f32::cast_from(q) - mk;
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
    fn decode_chunk(w: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let n = chunk / 4;
        let j = chunk % 4;
        let d = f16_to_f32(read_u16(w, block + 108));
        let d0 = d * q3k_scale(w, block + 96, 8 * n + 2 * j);
        let d1 = d * q3k_scale(w, block + 96, 8 * n + 2 * j + 1);
        let qs = block + 32 + 32 * n;
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> (2 * j);
            let hm = read_u32(w, block + 4 * k) >> chunk;
            let dk = select(k < 4, d0, d1);
            #[unroll]
            for i in 0..4u32 {
                let q = f32::cast_from((word >> (8 * i)) & 3);
                let h = select(((hm >> (8 * i)) & 1) == 1, 0.0f32, 4.0f32);
                out[(4 * k + i) as usize] = dk * (q - h);
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
}
#[cube]
impl BlockDecode for Q5K {
    fn decode_chunk(w: &[u32], block: u32, chunk: u32, out: &mut Array<f32>) {
        let dm = read_u32(w, block);
        let d = f16_to_f32(dm & 0xFFFF);
        let dmin = f16_to_f32(dm >> 16);
        let sm = scale_min_k4(w, block + 4, chunk);
        let d1 = d * f32::cast_from(sm & 0xFF);
        let m1 = dmin * f32::cast_from(sm >> 8);
        let qs = block + 48 + 32 * (chunk / 2);
        let shift = (chunk % 2) * 4;
        #[unroll]
        for k in 0..8u32 {
            let word = read_u32(w, qs + 4 * k) >> shift;
            let hw = read_u32(w, block + 16 + 4 * k) >> chunk;
            #[unroll]
            for i in 0..4u32 {
                let q = ((word >> (8 * i)) & 0x0F) | (((hw >> (8 * i)) & 1) << 4);
                out[(4 * k + i) as usize] = d1 * f32::cast_from(q) - m1;
            }
        }
    }
}

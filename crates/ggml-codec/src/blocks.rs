//! One `#[repr(C)]` struct per ggml block type, with the field names of llama.cpp
//! `ggml/src/ggml-common.h`, and its reference decoder ported from `ggml/src/ggml-quants.c`
//! (`dequantize_row_*`), with the f32 operations in the same order so results are bit-exact.
//!
//! Every field is a byte array (fp16 values are stored as `[u8; 2]` little-endian bits), so every
//! struct has alignment 1 and a `&[u8]` at any offset can be cast to a slice of blocks with
//! [`bytemuck::try_cast_slice`].

use bytemuck::{Pod, Zeroable};
use gguf::GgmlType;

use crate::grids::{
    iq1s_grid, iq2s_grid, iq2xs_grid, iq2xxs_grid, iq3s_grid, iq3xxs_grid, kmask_iq2xs,
    ksigns_iq2xs, kvalues_iq4nl, kvalues_mxfp4,
};

/// Elements per k-quant super-block (`QK_K`).
pub const QK_K: usize = 256;

/// Decodes little-endian fp16 bits (`ggml_half`) to f32, exactly (`GGML_FP16_TO_FP32`).
#[inline]
pub fn fp16_to_f32(bits: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(bits)).to_f32()
}

/// Decodes little-endian bf16 bits to f32, exactly (`GGML_BF16_TO_FP32`: the bits shifted up by 16).
#[inline]
pub fn bf16_to_f32(bits: [u8; 2]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes(bits)) << 16)
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K super-block, from its 12
/// packed `scales` bytes (ggml-quants.c `get_scale_min_k4`).
///
/// Sub-blocks 0..4 keep their scale in the low 6 bits of byte `j` and their min in byte `j + 4`;
/// sub-blocks 4..8 take their low 4 bits from byte `j + 4` (scale: low nibble, min: high nibble)
/// and their top 2 bits from the high bits of bytes `j - 4` (scale) and `j` (min) (case C08).
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// A ggml block: a fixed number of values stored in a fixed number of bytes.
///
/// Implemented by every block struct of this module (like candle's `k_quants::GgmlType`).
pub trait GgmlBlock: Pod {
    /// The ggml type this block encodes.
    const TYPE: GgmlType;
    /// Values per block (equals `TYPE.block_size()`).
    const BLOCK_SIZE: usize;

    /// Decodes the block into `out`, which must hold exactly [`BLOCK_SIZE`](Self::BLOCK_SIZE)
    /// values. Bit-exact with ggml's `dequantize_row_*` / `to_float`.
    ///
    /// # Panics
    /// If `out.len() < BLOCK_SIZE`.
    fn dequantize(&self, out: &mut [f32]);
}

macro_rules! size_check {
    ($t:ty, $n:expr) => {
        const _: () = assert!(std::mem::size_of::<$t>() == $n);
        const _: () = assert!(std::mem::align_of::<$t>() == 1);
    };
}

/// One F32 value, little-endian (a 1-element "block").
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockF32 {
    /// IEEE f32 bits, little-endian.
    pub bits: [u8; 4],
}
size_check!(BlockF32, 4);

impl GgmlBlock for BlockF32 {
    const TYPE: GgmlType = GgmlType::F32;
    const BLOCK_SIZE: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = f32::from_le_bytes(self.bits);
    }
}

/// One F16 value (`ggml_half`), little-endian.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockF16 {
    /// IEEE binary16 bits, little-endian.
    pub bits: [u8; 2],
}
size_check!(BlockF16, 2);

impl GgmlBlock for BlockF16 {
    const TYPE: GgmlType = GgmlType::F16;
    const BLOCK_SIZE: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = fp16_to_f32(self.bits);
    }
}

/// One BF16 value (`ggml_bf16_t`), little-endian.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockBF16 {
    /// bfloat16 bits (the top half of an f32), little-endian.
    pub bits: [u8; 2],
}
size_check!(BlockBF16, 2);

impl GgmlBlock for BlockBF16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const BLOCK_SIZE: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = bf16_to_f32(self.bits);
    }
}

/// `block_q4_0` (ggml-common.h): 32 values, `x = d * (q - 8)` with 4-bit `q`.
/// Value `j < 16` is the low nibble of `qs[j]`, value `j + 16` its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Nibbles.
    pub qs: [u8; 16],
}
size_check!(BlockQ4_0, 18);

impl GgmlBlock for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const BLOCK_SIZE: usize = 32;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        for j in 0..16 {
            let x0 = (self.qs[j] & 0x0F) as i32 - 8;
            let x1 = (self.qs[j] >> 4) as i32 - 8;
            out[j] = x0 as f32 * d;
            out[j + 16] = x1 as f32 * d;
        }
    }
}

/// `block_q4_1` (ggml-common.h): 32 values, `x = d * q + m` with 4-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Min, fp16 bits.
    pub m: [u8; 2],
    /// Nibbles, as in Q4_0.
    pub qs: [u8; 16],
}
size_check!(BlockQ4_1, 20);

impl GgmlBlock for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const BLOCK_SIZE: usize = 32;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        let m = fp16_to_f32(self.m);
        for j in 0..16 {
            let x0 = (self.qs[j] & 0x0F) as f32;
            let x1 = (self.qs[j] >> 4) as f32;
            out[j] = x0 * d + m;
            out[j + 16] = x1 * d + m;
        }
    }
}

/// `block_q5_0` (ggml-common.h): 32 values, `x = d * (q - 16)` with 5-bit `q`: low 4 bits as in
/// Q4_0, the 5th bit of value `j` is bit `j` of the little-endian u32 `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// 5th bits, a little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; 16],
}
size_check!(BlockQ5_0, 22);

impl GgmlBlock for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const BLOCK_SIZE: usize = 32;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        let qh = u32::from_le_bytes(self.qh);
        for j in 0..16 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((self.qs[j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = ((self.qs[j] >> 4) | xh_1) as i32 - 16;
            out[j] = x0 as f32 * d;
            out[j + 16] = x1 as f32 * d;
        }
    }
}

/// `block_q5_1` (ggml-common.h): 32 values, `x = d * q + m` with 5-bit `q` laid out as in Q5_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Min, fp16 bits.
    pub m: [u8; 2],
    /// 5th bits, a little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; 16],
}
size_check!(BlockQ5_1, 24);

impl GgmlBlock for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const BLOCK_SIZE: usize = 32;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        let m = fp16_to_f32(self.m);
        let qh = u32::from_le_bytes(self.qh);
        for j in 0..16 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((self.qs[j] & 0x0F) | xh_0) as f32;
            let x1 = ((self.qs[j] >> 4) | xh_1) as f32;
            out[j] = x0 * d + m;
            out[j + 16] = x1 * d + m;
        }
    }
}

/// `block_q8_0` (ggml-common.h): 32 values, `x = d * q` with signed 8-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Quants.
    pub qs: [i8; 32],
}
size_check!(BlockQ8_0, 34);

impl GgmlBlock for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BLOCK_SIZE: usize = 32;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        for (o, &q) in out[..32].iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

/// `block_q2_K` (ggml-common.h): 256 values in 16 sub-blocks of 16,
/// `x = d * (scales[s] & 0xF) * q - dmin * (scales[s] >> 4)` with 2-bit `q`.
///
/// Each 128-value half uses 32 `qs` bytes: value `32*j + l` (`j` in 0..4, `l` in 0..32) of the half
/// is bits `2j..2j+2` of byte `l`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Per sub-block: scale in the low nibble, min in the high nibble.
    pub scales: [u8; 16],
    /// 2-bit quants.
    pub qs: [u8; 64],
    /// Super-block scale for the scales, fp16 bits.
    pub d: [u8; 2],
    /// Super-block scale for the mins, fp16 bits.
    pub dmin: [u8; 2],
}
size_check!(BlockQ2K, 84);

impl GgmlBlock for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        let min = fp16_to_f32(self.dmin);
        let mut is = 0;
        let mut y = 0;
        for n in 0..2 {
            let q = &self.qs[32 * n..32 * n + 32];
            for j in 0..4 {
                let shift = 2 * j;
                for half in 0..2 {
                    let sc = self.scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for l in 0..16 {
                        out[y] = dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml;
                        y += 1;
                    }
                }
            }
        }
    }
}

/// `block_q3_K` (ggml-common.h): 256 values in 16 sub-blocks of 16, `x = d * (sc - 32) * (q - 4)`
/// with a 3-bit `q` (2 low bits in `qs` as in Q2_K, high bit in `hmask`; a *clear* high bit
/// subtracts 4) and 6-bit scales packed in 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bits: value `32*k + l` uses bit `k` of byte `l`.
    pub hmask: [u8; 32],
    /// Low 2 bits.
    pub qs: [u8; 64],
    /// 16 6-bit scales: low 4 bits in bytes 0..8 (nibbles), top 2 bits in bytes 8..12.
    pub scales: [u8; 12],
    /// Super-block scale, fp16 bits.
    pub d: [u8; 2],
}
size_check!(BlockQ3K, 110);

impl BlockQ3K {
    /// The 6-bit scale of sub-block `j` (0..16), minus 32.
    #[inline]
    pub fn scale(&self, j: usize) -> i8 {
        let s = &self.scales;
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    }
}

impl GgmlBlock for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d_all = fp16_to_f32(self.d);
        let mut is = 0;
        let mut y = 0;
        let mut m: u8 = 1;
        for n in 0..2 {
            let q = &self.qs[32 * n..32 * n + 32];
            for j in 0..4 {
                let shift = 2 * j;
                for half in 0..2 {
                    let dl = d_all * self.scale(is) as f32;
                    is += 1;
                    for l in 0..16 {
                        let i = l + 16 * half;
                        let low = ((q[i] >> shift) & 3) as i32;
                        let sub = if self.hmask[i] & m != 0 { 0 } else { 4 };
                        out[y] = dl * (low - sub) as f32;
                        y += 1;
                    }
                }
                m <<= 1;
            }
        }
    }
}

/// `block_q4_K` (ggml-common.h): 256 values in 8 sub-blocks of 32,
/// `x = (d * sc) * q - dmin * m` with 4-bit `q` and 6-bit `sc`, `m` (see [`get_scale_min_k4`]).
///
/// Each 64-value chunk `c` uses `qs[32c..32c+32]`: low nibbles are sub-block `2c`, high nibbles
/// sub-block `2c + 1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale for the scales, fp16 bits.
    pub d: [u8; 2],
    /// Super-block scale for the mins, fp16 bits.
    pub dmin: [u8; 2],
    /// 8 scales and 8 mins, 6 bits each, packed (`get_scale_min_k4`).
    pub scales: [u8; 12],
    /// 4-bit quants.
    pub qs: [u8; 128],
}
size_check!(BlockQ4K, 144);

impl GgmlBlock for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        let min = fp16_to_f32(self.dmin);
        for c in 0..4 {
            let q = &self.qs[32 * c..32 * c + 32];
            let (sc, m) = get_scale_min_k4(2 * c, &self.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = get_scale_min_k4(2 * c + 1, &self.scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            let y = &mut out[64 * c..64 * c + 64];
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xF) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// `block_q5_K` (ggml-common.h): 256 values in 8 sub-blocks of 32,
/// `x = (d * sc) * q - dmin * m` with 5-bit `q`: low 4 bits as in Q4_K, and the 5th bit of value
/// `l` of sub-block `s` is bit `s` of `qh[l]` (case C09).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale for the scales, fp16 bits.
    pub d: [u8; 2],
    /// Super-block scale for the mins, fp16 bits.
    pub dmin: [u8; 2],
    /// 8 scales and 8 mins, 6 bits each, packed (`get_scale_min_k4`).
    pub scales: [u8; 12],
    /// 5th bits.
    pub qh: [u8; 32],
    /// Low 4 bits.
    pub qs: [u8; 128],
}
size_check!(BlockQ5K, 176);

impl GgmlBlock for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        let min = fp16_to_f32(self.dmin);
        for c in 0..4 {
            let ql = &self.qs[32 * c..32 * c + 32];
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            let (sc, m) = get_scale_min_k4(2 * c, &self.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = get_scale_min_k4(2 * c + 1, &self.scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            let y = &mut out[64 * c..64 * c + 64];
            for l in 0..32 {
                let h1 = if self.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if self.qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
                y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

/// `block_q6_K` (ggml-common.h): 256 values in 16 sub-blocks of 16, `x = (d * scales[s]) * (q - 32)`
/// with 6-bit `q` (low 4 bits in `ql`, top 2 bits in `qh`) and signed 8-bit scales.
///
/// Each 128-value half `n` uses `ql[64n..64n+64]` and `qh[32n..32n+32]`: for `l` in 0..32, values
/// `l`, `l+32`, `l+64`, `l+96` take the low/high nibbles of `ql[l]`, `ql[l+32]` and bit pairs 0, 2,
/// 4, 6 of `qh[l]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits.
    pub ql: [u8; 128],
    /// Top 2 bits.
    pub qh: [u8; 64],
    /// Signed 8-bit sub-block scales.
    pub scales: [i8; 16],
    /// Super-block scale, fp16 bits.
    pub d: [u8; 2],
}
size_check!(BlockQ6K, 210);

impl GgmlBlock for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        for n in 0..2 {
            let ql = &self.ql[64 * n..64 * n + 64];
            let qh = &self.qh[32 * n..32 * n + 32];
            let sc = &self.scales[8 * n..8 * n + 8];
            let y = &mut out[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * sc[is] as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scale conversions and sign helpers shared by the types below (ggml-impl.h, ggml-quants.c).
// ---------------------------------------------------------------------------------------------

/// `2^n` as an f32, exactly, for `n` in the normal range `-126..=127`.
#[inline]
fn exp2i(n: i32) -> f32 {
    debug_assert!((-126..=127).contains(&n));
    f32::from_bits(((n + 127) as u32) << 23)
}

/// Decodes an E8M0 scale to half its value, `2^(x - 128)`, exactly like ggml's
/// `GGML_E8M0_TO_FP32_HALF` (ggml-impl.h `ggml_e8m0_to_fp32_half`): `x < 2` gives the subnormals
/// `2^-128` / `2^-127`, and `x = 255` gives `2^127` (ggml does not treat it as NaN). The halving
/// matches the doubled E2M1 values of [`kvalues_mxfp4`].
#[inline]
pub fn e8m0_to_fp32_half(x: u8) -> f32 {
    let bits = if x < 2 {
        0x0020_0000u32 << x
    } else {
        u32::from(x - 1) << 23
    };
    f32::from_bits(bits)
}

/// Decodes an NVFP4 UE4M3 scale (unsigned, 4 exponent bits with bias 7, 3 mantissa bits) to half
/// its value, exactly like ggml's `ggml_ue4m3_to_fp32` (ggml-impl.h): `0` and `0x7F` give 0,
/// exponent 0 is subnormal (`man * 2^-9`), otherwise `(1 + man / 8) * 2^(exp - 7)`; the result is
/// halved to match the doubled E2M1 values. Bit 7 is ignored. All steps are exact in f32.
#[inline]
pub fn ue4m3_to_fp32(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0xF);
    let man = f32::from(x & 0x7);
    let raw = if exp == 0 {
        man * exp2i(-9)
    } else {
        (1.0 + man / 8.0) * exp2i(exp - 7)
    };
    raw * 0.5
}

/// `-1.0` if bit `j` of `signs` is set, else `1.0` (ggml's `signs & kmask_iq2xs[j] ? -1.f : 1.f`).
#[inline]
fn sign(signs: u8, j: usize) -> f32 {
    if signs & kmask_iq2xs[j] != 0 {
        -1.0
    } else {
        1.0
    }
}

/// The little-endian u16 at index `i` of a byte array holding `uint16_t` values.
#[inline]
fn u16_at(bytes: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])
}

/// The little-endian u32 at byte offset `o`.
#[inline]
fn u32_at(bytes: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]])
}

/// One ternary digit of a TQ1_0 byte: ggml's `((uint16_t)(uint8_t)(q * 3^n) * 3) >> 8`, in 0..3.
#[inline]
fn tq1_trit(q: u8, pow3: u8) -> i16 {
    ((u16::from(q.wrapping_mul(pow3)) * 3) >> 8) as i16
}

// ---------------------------------------------------------------------------------------------
// Ternary types (BitNet b1.58 / TriLM).
// ---------------------------------------------------------------------------------------------

/// `block_tq1_0` (ggml-common.h): 256 ternary values `x = d * (t - 1)`, `t` in {0, 1, 2}, 1.6875
/// bits per value.
///
/// `qs` packs 5 trits per byte as a base-3 fixed-point fraction (the byte is
/// `ceil(t0t1t2t3t4 (base 3) * 256 / 243)`; trit `n` is `(uint8)(byte * 3^n) * 3 >> 8`): bytes
/// 0..32 hold values `32n + m` (trit `n` of byte `m`), bytes 32..48 hold values `160 + 16n + m` (trit `n` of byte `32 + m`).
/// `qh` packs 4 trits per byte the same way (trit 0 is the most significant): value `240 + 4n + j`
/// is trit `n` of `qh[j]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockTQ1_0 {
    /// 5 trits per byte.
    pub qs: [u8; 48],
    /// 4 trits per byte.
    pub qh: [u8; 4],
    /// Scale, fp16 bits.
    pub d: [u8; 2],
}
size_check!(BlockTQ1_0, 54);

impl GgmlBlock for BlockTQ1_0 {
    const TYPE: GgmlType = GgmlType::TQ1_0;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];
        let d = fp16_to_f32(self.d);
        let mut y = 0;
        for (chunk, width) in [(&self.qs[..32], 32), (&self.qs[32..], 16)] {
            for &p in &POW3[..5] {
                for &q in &chunk[..width] {
                    out[y] = (tq1_trit(q, p) - 1) as f32 * d;
                    y += 1;
                }
            }
        }
        for &p in &POW3[..4] {
            for &q in &self.qh {
                out[y] = (tq1_trit(q, p) - 1) as f32 * d;
                y += 1;
            }
        }
    }
}

/// `block_tq2_0` (ggml-common.h): 256 ternary values `x = d * (q - 1)` with 2-bit `q`.
///
/// Bit planes over 32-byte chunks (case C11): value `n` is bits `2 * ((n % 128) / 32)` .. `+2` of
/// byte `32 * (n / 128) + n % 32`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockTQ2_0 {
    /// 2-bit quants, 4 planes per 32-byte chunk.
    pub qs: [u8; 64],
    /// Scale, fp16 bits.
    pub d: [u8; 2],
}
size_check!(BlockTQ2_0, 66);

impl GgmlBlock for BlockTQ2_0 {
    const TYPE: GgmlType = GgmlType::TQ2_0;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        let mut y = 0;
        for chunk in self.qs.chunks_exact(32) {
            for l in 0..4 {
                for &b in chunk {
                    let q = ((b >> (2 * l)) & 3) as i8;
                    out[y] = (q - 1) as f32 * d;
                    y += 1;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1- and 2-bit ggml-only types (ggml type ids 41 and 42).
// ---------------------------------------------------------------------------------------------

/// `block_q1_0` (ggml-common.h, ggml type id 41): 128 values `x = bit ? d : -d`; value `j` is bit
/// `j % 8` of `qs[j / 8]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ1_0 {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Sign bits (set = `+d`).
    pub qs: [u8; 16],
}
size_check!(BlockQ1_0, 18);

impl GgmlBlock for BlockQ1_0 {
    const TYPE: GgmlType = GgmlType::Q1_0;
    const BLOCK_SIZE: usize = 128;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        let neg_d = -d;
        for (j, o) in out[..128].iter_mut().enumerate() {
            *o = if (self.qs[j / 8] >> (j % 8)) & 1 != 0 {
                d
            } else {
                neg_d
            };
        }
    }
}

/// `block_q2_0` (ggml-common.h, ggml type id 42): 64 values `x = (q - 1) * d` with 2-bit `q`
/// (`-d`, 0, `d`, `2d`); value `j` is bits `2 * (j % 4)` .. `+2` of `qs[j / 4]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ2_0 {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// 2-bit quants, 4 consecutive values per byte.
    pub qs: [u8; 16],
}
size_check!(BlockQ2_0, 18);

impl GgmlBlock for BlockQ2_0 {
    const TYPE: GgmlType = GgmlType::Q2_0;
    const BLOCK_SIZE: usize = 64;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        for (j, o) in out[..64].iter_mut().enumerate() {
            let q = (self.qs[j / 4] >> (2 * (j % 4))) & 3;
            *o = (i32::from(q) - 1) as f32 * d;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Non-linear 4-bit types: IQ4_NL, IQ4_XS, MXFP4, NVFP4.
// ---------------------------------------------------------------------------------------------

/// `block_iq4_nl` (ggml-common.h): 32 values `x = d * kvalues_iq4nl[q]` with 4-bit `q`, nibbles
/// laid out as in Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ4NL {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Nibbles (indices into [`kvalues_iq4nl`]).
    pub qs: [u8; 16],
}
size_check!(BlockIQ4NL, 18);

impl GgmlBlock for BlockIQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const BLOCK_SIZE: usize = 32;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        for j in 0..16 {
            out[j] = d * f32::from(kvalues_iq4nl[(self.qs[j] & 0xF) as usize]);
            out[j + 16] = d * f32::from(kvalues_iq4nl[(self.qs[j] >> 4) as usize]);
        }
    }
}

/// `block_iq4_xs` (ggml-common.h): 256 values in 8 sub-blocks of 32,
/// `x = d * (ls - 32) * kvalues_iq4nl[q]`; the 6-bit `ls` of sub-block `ib` has its low 4 bits in
/// nibble `ib % 2` of `scales_l[ib / 2]` and its top 2 bits in bits `2ib..2ib+2` of `scales_h`.
/// Each sub-block's 16 `qs` bytes are laid out as in IQ4_NL.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ4XS {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Top 2 bits of the 8 sub-block scales, a little-endian u16.
    pub scales_h: [u8; 2],
    /// Low 4 bits of the 8 sub-block scales.
    pub scales_l: [u8; 4],
    /// Nibbles (indices into [`kvalues_iq4nl`]).
    pub qs: [u8; 128],
}
size_check!(BlockIQ4XS, 136);

impl GgmlBlock for BlockIQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        let scales_h = u16::from_le_bytes(self.scales_h);
        for ib in 0..8 {
            let ls = i32::from((self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF)
                | (i32::from((scales_h >> (2 * ib)) & 3) << 4);
            let dl = d * (ls - 32) as f32;
            let qs = &self.qs[16 * ib..16 * ib + 16];
            let y = &mut out[32 * ib..32 * ib + 32];
            for j in 0..16 {
                y[j] = dl * f32::from(kvalues_iq4nl[(qs[j] & 0xF) as usize]);
                y[j + 16] = dl * f32::from(kvalues_iq4nl[(qs[j] >> 4) as usize]);
            }
        }
    }
}

/// `block_mxfp4` (ggml-common.h, OCP microscaling FP4): 32 values
/// `x = kvalues_mxfp4[q] * 2^(e - 128)` (doubled E2M1 values times half the E8M0 scale, see
/// [`e8m0_to_fp32_half`]), nibbles laid out as in Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockMXFP4 {
    /// Shared scale, E8M0 (a biased power-of-two exponent).
    pub e: u8,
    /// E2M1 nibbles (indices into [`kvalues_mxfp4`]).
    pub qs: [u8; 16],
}
size_check!(BlockMXFP4, 17);

impl GgmlBlock for BlockMXFP4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const BLOCK_SIZE: usize = 32;
    fn dequantize(&self, out: &mut [f32]) {
        let d = e8m0_to_fp32_half(self.e);
        for j in 0..16 {
            out[j] = f32::from(kvalues_mxfp4[(self.qs[j] & 0xF) as usize]) * d;
            out[j + 16] = f32::from(kvalues_mxfp4[(self.qs[j] >> 4) as usize]) * d;
        }
    }
}

/// `block_nvfp4` (ggml-common.h, NVIDIA FP4): 64 values in 4 sub-blocks of 16, each with its own
/// UE4M3 scale: `x = kvalues_mxfp4[q] * ue4m3_to_fp32(d[s])`. Sub-block `s` uses `qs[8s..8s+8]`:
/// value `j < 8` is the low nibble of byte `j`, value `j + 8` its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockNVFP4 {
    /// Sub-block scales, UE4M3.
    pub d: [u8; 4],
    /// E2M1 nibbles (indices into [`kvalues_mxfp4`]).
    pub qs: [u8; 32],
}
size_check!(BlockNVFP4, 36);

impl GgmlBlock for BlockNVFP4 {
    const TYPE: GgmlType = GgmlType::NVFP4;
    const BLOCK_SIZE: usize = 64;
    fn dequantize(&self, out: &mut [f32]) {
        for s in 0..4 {
            let d = ue4m3_to_fp32(self.d[s]);
            let qs = &self.qs[8 * s..8 * s + 8];
            let y = &mut out[16 * s..16 * s + 16];
            for j in 0..8 {
                y[j] = f32::from(kvalues_mxfp4[(qs[j] & 0xF) as usize]) * d;
                y[j + 8] = f32::from(kvalues_mxfp4[(qs[j] >> 4) as usize]) * d;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Codebook (IQ) types: values come from the grids of `crate::grids`.
// ---------------------------------------------------------------------------------------------

/// `IQ1S_DELTA` / `IQ1M_DELTA` (ggml-common.h): the offset added to every IQ1 grid value.
pub const IQ1S_DELTA: f32 = 0.125;

/// `block_iq2_xxs` (ggml-common.h): 256 values in 8 sub-blocks of 32, 2.0625 bits per value.
///
/// Sub-block `ib` is the two little-endian u32 `a0, a1` at `qs[8ib..8ib+8]`: byte `l` of `a0`
/// indexes [`iq2xxs_grid`] for values `8l..8l+8`, bits `7l..7l+7` of `a1` index [`ksigns_iq2xs`]
/// for their signs, and `a1 >> 28` is the 4-bit scale: `x = d * (0.5 + s) * 0.25 * grid * sign`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ2XXS {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// 32 little-endian `uint16_t` (read as 16 u32 pairs).
    pub qs: [u8; 64],
}
size_check!(BlockIQ2XXS, 66);

impl GgmlBlock for BlockIQ2XXS {
    const TYPE: GgmlType = GgmlType::IQ2_XXS;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        for ib in 0..8 {
            let aux0 = &self.qs[8 * ib..8 * ib + 4];
            let aux1 = u32_at(&self.qs, 8 * ib + 4);
            let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
            for l in 0..4 {
                let grid = iq2xxs_grid[aux0[l] as usize].to_le_bytes();
                let signs = ksigns_iq2xs[((aux1 >> (7 * l)) & 127) as usize];
                let y = &mut out[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..8 {
                    y[j] = db * f32::from(grid[j]) * sign(signs, j);
                }
            }
        }
    }
}

/// `block_iq2_xs` (ggml-common.h): 256 values in 8 sub-blocks of 32, 2.3125 bits per value.
///
/// Each little-endian u16 `qs[i]` covers 8 values: bits 0..9 index [`iq2xs_grid`], bits 9..16
/// index [`ksigns_iq2xs`]. Sub-block `ib` has two 4-bit scales in `scales[ib]` (low nibble for its
/// first 16 values): `x = d * (0.5 + s) * 0.25 * grid * sign`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ2XS {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// 32 little-endian `uint16_t`: grid index and sign index.
    pub qs: [u8; 64],
    /// Two 4-bit scales per sub-block.
    pub scales: [u8; 8],
}
size_check!(BlockIQ2XS, 74);

impl GgmlBlock for BlockIQ2XS {
    const TYPE: GgmlType = GgmlType::IQ2_XS;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        for ib in 0..8 {
            let db = [
                d * (0.5 + (self.scales[ib] & 0xF) as f32) * 0.25,
                d * (0.5 + (self.scales[ib] >> 4) as f32) * 0.25,
            ];
            for l in 0..4 {
                let q = u16_at(&self.qs, 4 * ib + l);
                let grid = iq2xs_grid[(q & 511) as usize].to_le_bytes();
                let signs = ksigns_iq2xs[(q >> 9) as usize];
                let y = &mut out[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..8 {
                    y[j] = db[l / 2] * f32::from(grid[j]) * sign(signs, j);
                }
            }
        }
    }
}

/// `block_iq2_s` (ggml-common.h): 256 values in 8 sub-blocks of 32, 2.5625 bits per value.
///
/// Group `l` (8 values) of sub-block `ib` indexes [`iq2s_grid`] with
/// `qs[4ib + l] | ((qh[ib] >> 2l) & 3) << 8`, takes its 8 sign bits from `qs[32 + 4ib + l]`, and
/// uses the scale in nibble `l / 2` of `scales[ib]`: `x = d * (0.5 + s) * 0.25 * grid * sign`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ2S {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Low 8 bits of the grid indices (bytes 0..32), then the sign bytes (32..64).
    pub qs: [u8; 64],
    /// High 2 bits of the grid indices, 4 groups per byte.
    pub qh: [u8; 8],
    /// Two 4-bit scales per sub-block.
    pub scales: [u8; 8],
}
size_check!(BlockIQ2S, 82);

impl GgmlBlock for BlockIQ2S {
    const TYPE: GgmlType = GgmlType::IQ2_S;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        let (qs, signs) = self.qs.split_at(32);
        for ib in 0..8 {
            let db = [
                d * (0.5 + (self.scales[ib] & 0xF) as f32) * 0.25,
                d * (0.5 + (self.scales[ib] >> 4) as f32) * 0.25,
            ];
            for l in 0..4 {
                let dl = db[l / 2];
                let idx = usize::from(qs[4 * ib + l])
                    | ((usize::from(self.qh[ib]) << (8 - 2 * l)) & 0x300);
                let grid = iq2s_grid[idx].to_le_bytes();
                let s = signs[4 * ib + l];
                let y = &mut out[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..8 {
                    y[j] = dl * f32::from(grid[j]) * sign(s, j);
                }
            }
        }
    }
}

/// `block_iq3_xxs` (ggml-common.h): 256 values in 8 sub-blocks of 32, 3.0625 bits per value.
///
/// `qs[0..64]` index [`iq3xxs_grid`] (4 values each); `qs[64..96]` holds one little-endian u32
/// per sub-block: bits `7l..7l+7` index [`ksigns_iq2xs`] for group `l` of 8 values and the top 4
/// bits are the scale: `x = d * (0.5 + s) * 0.5 * grid * sign`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ3XXS {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Grid indices (64 bytes), then scales and signs (8 little-endian u32).
    pub qs: [u8; 96],
}
size_check!(BlockIQ3XXS, 98);

impl GgmlBlock for BlockIQ3XXS {
    const TYPE: GgmlType = GgmlType::IQ3_XXS;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        for ib in 0..8 {
            let aux32 = u32_at(&self.qs, 64 + 4 * ib);
            let db = d * (0.5 + (aux32 >> 28) as f32) * 0.5;
            let qs = &self.qs[8 * ib..8 * ib + 8];
            for l in 0..4 {
                let signs = ksigns_iq2xs[((aux32 >> (7 * l)) & 127) as usize];
                let grid1 = iq3xxs_grid[qs[2 * l] as usize].to_le_bytes();
                let grid2 = iq3xxs_grid[qs[2 * l + 1] as usize].to_le_bytes();
                let y = &mut out[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..4 {
                    y[j] = db * f32::from(grid1[j]) * sign(signs, j);
                    y[j + 4] = db * f32::from(grid2[j]) * sign(signs, j + 4);
                }
            }
        }
    }
}

/// `block_iq3_s` (ggml-common.h): 256 values in 8 sub-blocks of 32, 3.4375 bits per value.
///
/// Each `qs` byte plus one bit of `qh` (bit `k` of `qh[ib]` for the `k`-th index of sub-block
/// `ib`) indexes [`iq3s_grid`] (4 values); `signs[4ib + l]` holds the 8 sign bits of group `l`;
/// sub-blocks `2p` and `2p + 1` use the low and high nibble of `scales[p]`:
/// `x = d * (1 + 2s) * grid * sign`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ3S {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Low 8 bits of the grid indices.
    pub qs: [u8; 64],
    /// 9th bit of the grid indices, one byte per sub-block.
    pub qh: [u8; 8],
    /// Sign bits, one byte per 8 values.
    pub signs: [u8; 32],
    /// 4-bit scales, two sub-blocks per byte.
    pub scales: [u8; 4],
}
size_check!(BlockIQ3S, 110);

impl GgmlBlock for BlockIQ3S {
    const TYPE: GgmlType = GgmlType::IQ3_S;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        for ib in 0..8 {
            let sc = self.scales[ib / 2] >> (4 * (ib % 2));
            let db = d * (1 + 2 * i32::from(sc & 0xF)) as f32;
            let qs = &self.qs[8 * ib..8 * ib + 8];
            let qh = usize::from(self.qh[ib]);
            for l in 0..4 {
                let grid1 = iq3s_grid[usize::from(qs[2 * l]) | ((qh << (8 - 2 * l)) & 256)];
                let grid2 = iq3s_grid[usize::from(qs[2 * l + 1]) | ((qh << (7 - 2 * l)) & 256)];
                let (grid1, grid2) = (grid1.to_le_bytes(), grid2.to_le_bytes());
                let s = self.signs[4 * ib + l];
                let y = &mut out[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..4 {
                    y[j] = db * f32::from(grid1[j]) * sign(s, j);
                    y[j + 4] = db * f32::from(grid2[j]) * sign(s, j + 4);
                }
            }
        }
    }
}

/// The 8 values of IQ1 grid entry `idx`, each plus `delta`, times `dl` (shared by IQ1_S, IQ1_M).
#[inline]
fn iq1_group(y: &mut [f32], idx: usize, dl: f32, delta: f32) {
    let grid = iq1s_grid[idx].to_le_bytes();
    for j in 0..8 {
        y[j] = dl * (f32::from(grid[j] as i8) + delta);
    }
}

/// `block_iq1_s` (ggml-common.h): 256 values in 8 sub-blocks of 32, 1.5625 bits per value.
///
/// Group `l` (8 values) of sub-block `ib` indexes [`iq1s_grid`] with
/// `qs[4ib + l] | ((qh[ib] >> 3l) & 7) << 8`, where `qh[ib]` is a little-endian u16 whose bits
/// 12..15 are the 3-bit scale and bit 15 the sign of the delta:
/// `x = d * (2s + 1) * (grid ± IQ1S_DELTA)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ1S {
    /// Scale, fp16 bits.
    pub d: [u8; 2],
    /// Low 8 bits of the grid indices.
    pub qs: [u8; 32],
    /// 8 little-endian `uint16_t`: high index bits, scale, delta sign.
    pub qh: [u8; 16],
}
size_check!(BlockIQ1S, 50);

impl GgmlBlock for BlockIQ1S {
    const TYPE: GgmlType = GgmlType::IQ1_S;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = fp16_to_f32(self.d);
        for ib in 0..8 {
            let qh = u16_at(&self.qh, ib);
            let dl = d * (2 * i32::from((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1S_DELTA
            } else {
                IQ1S_DELTA
            };
            for l in 0..4 {
                let idx =
                    usize::from(self.qs[4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
                iq1_group(&mut out[32 * ib + 8 * l..], idx, dl, delta);
            }
        }
    }
}

/// `block_iq1_m` (ggml-common.h): 256 values in 8 sub-blocks of 32, 1.75 bits per value; no
/// separate `d` field.
///
/// `scales` is 4 little-endian u16 `sc`: the fp16 super-block scale is the top nibbles of
/// `sc[0..4]` (`sc[k] >> 12` is bits `4k..4k+4`); sub-block `ib` has two 3-bit scales at bits
/// `6 * (ib % 2)` and `+3` of `sc[ib / 2]` (for its first and second 16 values). Group `l` indexes
/// [`iq1s_grid`] with `qs[4ib + l]` plus 3 high bits from nibble `l % 2` of `qh[2ib + l / 2]`,
/// whose bit 3 is the delta sign: `x = d * (2s + 1) * (grid ± IQ1M_DELTA)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ1M {
    /// Low 8 bits of the grid indices.
    pub qs: [u8; 32],
    /// High 3 index bits and the delta sign bit, one nibble per 8-value group.
    pub qh: [u8; 16],
    /// 3-bit sub-block scales and the fp16 super-block scale (4 little-endian u16).
    pub scales: [u8; 8],
}
size_check!(BlockIQ1M, 56);

impl GgmlBlock for BlockIQ1M {
    const TYPE: GgmlType = GgmlType::IQ1_M;
    const BLOCK_SIZE: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let sc = [0, 1, 2, 3].map(|k| u16_at(&self.scales, k));
        let scale =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
        let d = fp16_to_f32(scale.to_le_bytes());
        for ib in 0..8 {
            let s = sc[ib / 2] >> (6 * (ib % 2));
            let dl1 = d * (2 * i32::from(s & 0x7) + 1) as f32;
            let dl2 = d * (2 * i32::from((s >> 3) & 0x7) + 1) as f32;
            let qs = &self.qs[4 * ib..4 * ib + 4];
            let qh = [
                usize::from(self.qh[2 * ib]),
                usize::from(self.qh[2 * ib + 1]),
            ];
            let delta = |b: usize| if b != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
            for l in 0..4 {
                let h = qh[l / 2];
                let idx = usize::from(qs[l]) | ((h << (8 - 4 * (l % 2))) & 0x700);
                let dl = if l < 2 { dl1 } else { dl2 };
                let dt = delta(h & (0x08 << (4 * (l % 2))));
                iq1_group(&mut out[32 * ib + 8 * l..], idx, dl, dt);
            }
        }
    }
}

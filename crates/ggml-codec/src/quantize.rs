//! Reference quantizers for the simple block types, ported from llama.cpp `ggml/src/ggml-quants.c`
//! (`quantize_row_*_ref`) and `ggml-impl.h` (fp16 / bf16 conversion). They reproduce ggml's bytes
//! exactly (same f32 operations, same rounding and truncation).

use crate::blocks::{
    BlockMXFP4, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockTQ1_0, BlockTQ2_0,
    QK_K, e8m0_to_fp32_half,
};
use crate::grids::kvalues_mxfp4;

/// Encodes an f32 as little-endian fp16 bits, rounding to nearest even (`GGML_FP32_TO_FP16`).
#[inline]
pub fn f32_to_fp16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// Encodes an f32 as little-endian bf16 bits like ggml's `ggml_compute_fp32_to_bf16`: NaN stays a
/// (quiet) NaN, everything else rounds to nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> [u8; 2] {
    let u = x.to_bits();
    let bits = if (u & 0x7fff_ffff) > 0x7f80_0000 {
        (u >> 16) | 64
    } else {
        u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16
    };
    (bits as u16).to_le_bytes()
}

fn check_len(src: &[f32], qk: usize, name: &str) {
    assert!(
        src.len().is_multiple_of(qk),
        "{name}: input length {} is not a multiple of the block size {qk}",
        src.len()
    );
}

/// C's `MAX(a, b)` macro (`a > b ? a : b`), which differs from `f32::max` for NaN.
#[inline]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// The value of largest magnitude (first one wins ties), as the ggml quantizers find it.
#[inline]
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Quantizes to F16: little-endian fp16 bits per value (2 bytes each).
pub fn quantize_f16(src: &[f32]) -> Vec<u8> {
    src.iter().flat_map(|&x| f32_to_fp16(x)).collect()
}

/// Quantizes to BF16: little-endian bf16 bits per value (2 bytes each).
pub fn quantize_bf16(src: &[f32]) -> Vec<u8> {
    src.iter().flat_map(|&x| f32_to_bf16(x)).collect()
}

/// Quantizes to Q8_0 blocks (34 bytes per 32 values), exactly like ggml `quantize_row_q8_0_ref`:
/// `d = absmax / 127`, `q = round(x / d)`.
///
/// # Panics
/// If `src.len()` is not a multiple of 32.
pub fn quantize_q8_0(src: &[f32]) -> Vec<u8> {
    check_len(src, 32, "quantize_q8_0");
    let mut out = Vec::with_capacity(src.len() / 32 * 34);
    for x in src.chunks_exact(32) {
        let amax = x.iter().fold(0.0f32, |a, &v| c_max(a, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; 32];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
        let block = BlockQ8_0 {
            d: f32_to_fp16(d),
            qs,
        };
        out.extend_from_slice(bytemuck::bytes_of(&block));
    }
    out
}

/// Quantizes to Q4_0 blocks (18 bytes per 32 values), exactly like ggml `quantize_row_q4_0_ref`:
/// `d = max / -8` where `max` is the value of largest magnitude, `q = min(15, trunc(x / d + 8.5))`.
///
/// # Panics
/// If `src.len()` is not a multiple of 32.
pub fn quantize_q4_0(src: &[f32]) -> Vec<u8> {
    check_len(src, 32, "quantize_q4_0");
    let mut out = Vec::with_capacity(src.len() / 32 * 18);
    for x in src.chunks_exact(32) {
        let d = signed_absmax(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let xi0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let xi1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            qs[j] = xi0 | (xi1 << 4);
        }
        let block = BlockQ4_0 {
            d: f32_to_fp16(d),
            qs,
        };
        out.extend_from_slice(bytemuck::bytes_of(&block));
    }
    out
}

/// Quantizes to Q4_1 blocks (20 bytes per 32 values), exactly like ggml `quantize_row_q4_1_ref`:
/// `d = (max - min) / 15`, `m = min`, `q = min(15, trunc((x - min) / d + 0.5))`.
///
/// # Panics
/// If `src.len()` is not a multiple of 32.
pub fn quantize_q4_1(src: &[f32]) -> Vec<u8> {
    check_len(src, 32, "quantize_q4_1");
    let mut out = Vec::with_capacity(src.len() / 32 * 20);
    for x in src.chunks_exact(32) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let xi0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let xi1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            qs[j] = xi0 | (xi1 << 4);
        }
        let block = BlockQ4_1 {
            d: f32_to_fp16(d),
            m: f32_to_fp16(min),
            qs,
        };
        out.extend_from_slice(bytemuck::bytes_of(&block));
    }
    out
}

/// Quantizes to Q5_0 blocks (22 bytes per 32 values), exactly like ggml `quantize_row_q5_0_ref`:
/// `d = max / -16`, `q = min(31, trunc(x / d + 16.5))`.
///
/// # Panics
/// If `src.len()` is not a multiple of 32.
pub fn quantize_q5_0(src: &[f32]) -> Vec<u8> {
    check_len(src, 32, "quantize_q5_0");
    let mut out = Vec::with_capacity(src.len() / 32 * 22);
    for x in src.chunks_exact(32) {
        let d = signed_absmax(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        let mut qh = 0u32;
        for j in 0..16 {
            let xi0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
            let xi1 = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
            qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= u32::from((xi0 & 0x10) >> 4) << j;
            qh |= u32::from((xi1 & 0x10) >> 4) << (j + 16);
        }
        let block = BlockQ5_0 {
            d: f32_to_fp16(d),
            qh: qh.to_le_bytes(),
            qs,
        };
        out.extend_from_slice(bytemuck::bytes_of(&block));
    }
    out
}

/// Quantizes to Q5_1 blocks (24 bytes per 32 values), exactly like ggml `quantize_row_q5_1_ref`:
/// `d = (max - min) / 31`, `m = min`, `q = trunc((x - min) / d + 0.5)`.
///
/// # Panics
/// If `src.len()` is not a multiple of 32.
pub fn quantize_q5_1(src: &[f32]) -> Vec<u8> {
    check_len(src, 32, "quantize_q5_1");
    let mut out = Vec::with_capacity(src.len() / 32 * 24);
    for x in src.chunks_exact(32) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        let mut qh = 0u32;
        for j in 0..16 {
            let xi0 = ((x[j] - min) * id + 0.5) as u8;
            let xi1 = ((x[j + 16] - min) * id + 0.5) as u8;
            qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= u32::from((xi0 & 0x10) >> 4) << j;
            qh |= u32::from((xi1 & 0x10) >> 4) << (j + 16);
        }
        let block = BlockQ5_1 {
            d: f32_to_fp16(d),
            m: f32_to_fp16(min),
            qh: qh.to_le_bytes(),
            qs,
        };
        out.extend_from_slice(bytemuck::bytes_of(&block));
    }
    out
}

/// Min and max as the ggml Q4_1 / Q5_1 quantizers compute them (starting from ±FLT_MAX).
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// C's `lroundf` for the ternary quantizers: round half away from zero (`f32::round`), then to an
/// integer. Only used on values in about `-1..=1`.
#[inline]
fn lroundf(x: f32) -> i32 {
    x.round() as i32
}

/// The absmax scale of the ternary quantizers: `(d, id)` with `d = max |x|` (C `MAX`, so a NaN is
/// skipped unless first) and `id = 1 / d` (0 when `d == 0`).
fn ternary_scale(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |a, &v| c_max(a, v.abs()));
    let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
    (amax, id)
}

/// Packs `values.len() / trits` groups of `trits` ternary digits (`round(x * id) + 1`, the first
/// value most significant; values of a group are `stride` apart) into TQ1_0 bytes: the base-3
/// number times 3^(5 - trits), then `ceil(q * 256 / 243)`.
fn tq1_pack(x: &[f32], id: f32, stride: usize, trits: usize, out: &mut [u8]) {
    for (m, o) in out.iter_mut().enumerate().take(stride) {
        let mut q: u8 = 0;
        for n in 0..trits {
            let xi = lroundf(x[m + n * stride] * id) + 1;
            q = q.wrapping_mul(3).wrapping_add(xi as u8);
        }
        for _ in trits..5 {
            q = q.wrapping_mul(3);
        }
        *o = (u16::from(q) * 256).div_ceil(243) as u8;
    }
}

/// Quantizes to TQ1_0 blocks (54 bytes per 256 values), exactly like ggml
/// `quantize_row_tq1_0_ref`: `d = max |x|`, each value becomes the trit `round(x / d) + 1`, packed
/// 5 per byte (4 per byte in `qh`) as [`BlockTQ1_0`] describes.
///
/// # Panics
/// If `src.len()` is not a multiple of 256.
pub fn quantize_tq1_0(src: &[f32]) -> Vec<u8> {
    check_len(src, QK_K, "quantize_tq1_0");
    let mut out = Vec::with_capacity(src.len() / QK_K * 54);
    for x in src.chunks_exact(QK_K) {
        let (d, id) = ternary_scale(x);
        let mut block = BlockTQ1_0 {
            qs: [0; 48],
            qh: [0; 4],
            d: f32_to_fp16(d),
        };
        tq1_pack(&x[..160], id, 32, 5, &mut block.qs[..32]);
        tq1_pack(&x[160..240], id, 16, 5, &mut block.qs[32..]);
        tq1_pack(&x[240..], id, 4, 4, &mut block.qh);
        out.extend_from_slice(bytemuck::bytes_of(&block));
    }
    out
}

/// Quantizes to TQ2_0 blocks (66 bytes per 256 values), exactly like ggml
/// `quantize_row_tq2_0_ref`: `d = max |x|`, `q = round(x / d) + 1` in 2 bits, four bit planes per
/// 32-byte chunk as [`BlockTQ2_0`] describes.
///
/// # Panics
/// If `src.len()` is not a multiple of 256.
pub fn quantize_tq2_0(src: &[f32]) -> Vec<u8> {
    check_len(src, QK_K, "quantize_tq2_0");
    let mut out = Vec::with_capacity(src.len() / QK_K * 66);
    for x in src.chunks_exact(QK_K) {
        let (d, id) = ternary_scale(x);
        let mut block = BlockTQ2_0 {
            qs: [0; 64],
            d: f32_to_fp16(d),
        };
        for (j, xs) in x.chunks_exact(128).enumerate() {
            for m in 0..32 {
                let mut q: u8 = 0;
                for n in 0..4 {
                    let xi = lroundf(xs[m + n * 32] * id) + 1;
                    q = q.wrapping_add(((xi & 3) as u8) << (2 * n));
                }
                block.qs[32 * j + m] = q;
            }
        }
        out.extend_from_slice(bytemuck::bytes_of(&block));
    }
    out
}

/// ggml's `best_index_mxfp4`: the index of the doubled E2M1 value nearest to `x / e` (the first
/// one wins ties).
#[inline]
fn best_index_mxfp4(x: f32, e: f32) -> u8 {
    let mut best_index = 0;
    let mut best_err = (f32::from(kvalues_mxfp4[0]) * e - x).abs();
    for (i, &k) in kvalues_mxfp4.iter().enumerate().skip(1) {
        let err = (f32::from(k) * e - x).abs();
        if err < best_err {
            best_index = i as u8;
            best_err = err;
        }
    }
    best_index
}

/// Quantizes to MXFP4 blocks (17 bytes per 32 values), exactly like ggml
/// `quantize_row_mxfp4_ref`: the E8M0 exponent is `floor(log2(max |x|)) - 2 + 127` (0 for an
/// all-zero block; computed with the platform `log2f` and truncated to 8 bits as the C cast does
/// on x86), and each value takes the nearest doubled E2M1 value times half the scale.
///
/// # Panics
/// If `src.len()` is not a multiple of 32.
pub fn quantize_mxfp4(src: &[f32]) -> Vec<u8> {
    check_len(src, 32, "quantize_mxfp4");
    let mut out = Vec::with_capacity(src.len() / 32 * 17);
    for x in src.chunks_exact(32) {
        let mut amax = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        let e = if amax > 0.0 {
            // (uint8_t)(float): through a wide integer, keeping the low 8 bits.
            (amax.log2().floor() - 2.0 + 127.0) as i64 as u8
        } else {
            0
        };
        let d = e8m0_to_fp32_half(e);
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let x0 = best_index_mxfp4(x[j], d);
            let x1 = best_index_mxfp4(x[j + 16], d);
            qs[j] = x0 | (x1 << 4);
        }
        let block = BlockMXFP4 { e, qs };
        out.extend_from_slice(bytemuck::bytes_of(&block));
    }
    out
}

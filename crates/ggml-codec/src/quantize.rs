//! Reference quantizers for the simple block types, ported from llama.cpp `ggml/src/ggml-quants.c`
//! (`quantize_row_*_ref`) and `ggml-impl.h` (fp16 / bf16 conversion). They reproduce ggml's bytes
//! exactly (same f32 operations, same rounding and truncation).

use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};

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

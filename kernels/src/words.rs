//! Reading a little-endian byte stream that lives on the device as `u32` words.
//!
//! A GGUF tensor is uploaded unchanged, padded with zeros to whole 4-word vectors with a few
//! spare words (see [`crate::words_for_bytes`]). Most ggml block sizes are not multiples of 4
//! (Q8_0 is 34 bytes, Q5_0 22, Q6_K 210), so block fields start at any byte offset: these helpers
//! turn a byte address into word loads and shifts. WGSL has no 8/16-bit storage types, so this is
//! the only portable way to read them; fp16 scales are decoded from their bits in the same way, so
//! no kernel needs `shader-f16`.
use cubecl::prelude::*;

/// Byte `byte` of the stream, in the low 8 bits.
#[cube]
pub(crate) fn read_u8(w: &[u32], byte: u32) -> u32 {
    (w[(byte / 4) as usize] >> ((byte % 4) * 8)) & 0xFF
}

/// The little-endian u16 at an **even** byte offset, in the low 16 bits (never straddles a word).
#[cube]
pub(crate) fn read_u16(w: &[u32], byte: u32) -> u32 {
    (w[(byte / 4) as usize] >> ((byte % 4) * 8)) & 0xFFFF
}

/// The little-endian u32 at any byte offset (a funnel shift of two words; the stream's extra
/// padding word keeps the second load in bounds).
#[cube]
pub(crate) fn read_u32(w: &[u32], byte: u32) -> u32 {
    let i = byte / 4;
    let s = (byte % 4) * 8;
    let lo = w[i as usize];
    let hi = w[(i + 1) as usize];
    select(s == 0, lo, (lo >> s) | (hi << ((32 - s) % 32)))
}

/// IEEE binary16 bits (low 16 bits of `h`) to f32 with integer operations only: zero,
/// subnormals, infinities and NaN included.
#[cube]
pub(crate) fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1F;
    let mant = h & 0x3FF;
    let normal = f32::reinterpret(sign | ((exp + 112) << 23) | (mant << 13));
    // Subnormal: mant * 2^-24, computed in float so no f32 denormal is produced.
    let sub_abs = f32::cast_from(mant) * 5.960_464_5e-8;
    let sub = select(sign != 0, -sub_abs, sub_abs);
    let infnan = f32::reinterpret(sign | 0x7F80_0000 | (mant << 13));
    let r = select(exp == 0, sub, normal);
    select(exp == 31, infnan, r)
}

/// bfloat16 bits (low 16 bits of `h`) to f32: the upper half of an f32.
#[cube]
pub(crate) fn bf16_to_f32(h: u32) -> f32 {
    f32::reinterpret(h << 16)
}

/// Byte `j` (0..4) of `word` as a signed 8-bit integer, as f32: the byte shifted to the top and
/// back down with an arithmetic shift (two shifts and a conversion, where [`i8_to_f32`] of the
/// masked byte takes four operations and a conversion).
#[cube]
pub(crate) fn byte_i8_to_f32(word: u32, j: u32) -> f32 {
    let top = i32::cast_from(word << (24 - 8 * j));
    f32::cast_from(top >> 24i32)
}

/// A signed 8-bit integer in the low byte of `b`, as f32.
#[cube]
pub(crate) fn i8_to_f32(b: u32) -> f32 {
    f32::cast_from(b ^ 0x80) - 128.0
}

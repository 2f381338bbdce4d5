//! Rotary position embedding, one kernel (llama.cpp `ggml_rope_ext`): each pair of a head's
//! dimensions rotates by its position's angle, `(x1 cos - x2 sin, x1 sin + x2 cos)`.
//!
//! From Burn tensor ops it was eight kernels for each of `q` and `k` per layer on lavapipe
//! (four multiplies, a subtract, an add, and a concatenation as two slice assignments).
use cubecl::prelude::*;

/// One unit per rotated pair: `x`, `y` `[n, heads, 2 * half]` f32, `cos`, `sin` `[n, half]` f32
/// (the angles of token `t`'s pair `i`). With `neox` pair `i` is dimensions `(i, i + half)`
/// (GPT-NeoX style: Qwen, Gemma), otherwise `(2i, 2i + 1)` (llama.cpp's normal style).
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn rope(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    y: &mut [f32],
    n: u32,
    heads: u32,
    half: u32,
    #[comptime] neox: bool,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let pos = cube * CUBE_DIM_X + UNIT_POS_X;
    if pos < n * heads * half {
        let i = pos % half;
        let row = pos / half;
        let t = row / heads;
        let c = cos[(t * half + i) as usize];
        let s = sin[(t * half + i) as usize];
        let base = row * 2 * half;
        let (a, b) = if comptime!(neox) {
            (base + i, base + i + half)
        } else {
            (base + 2 * i, base + 2 * i + 1)
        };
        let x1 = x[a as usize];
        let x2 = x[b as usize];
        y[a as usize] = x1 * c - x2 * s;
        y[b as usize] = x1 * s + x2 * c;
    }
}

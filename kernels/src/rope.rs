//! Rotary position embedding, one kernel (llama.cpp `ggml_rope_ext`): each pair of a head's
//! dimensions rotates by its position's angle, `(x1 cos - x2 sin, x1 sin + x2 cos)`.
//!
//! From Burn tensor ops it was eight kernels for each of `q` and `k` per layer on lavapipe
//! (four multiplies, a subtract, an add, and a concatenation as two slice assignments).
use crate::{KernelError, cube_count_for, shape_err};
use cubecl::client::Client;
use cubecl::prelude::*;

/// One unit per rotated pair: `x`, `y` `[n, heads, 2 * half]` f32, `cos`, `sin` `[n, half]` f32
/// (the angles of token `t`'s pair `i`). With `neox` pair `i` is dimensions `(i, i + half)`
/// (GPT-NeoX style: Qwen, Gemma), otherwise `(2i, 2i + 1)` (llama.cpp's normal style).
#[cube(launch_unchecked, create_dummy_kernel)]
pub(crate) fn rope(
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

/// Rotary position embedding of `x` `[n, heads, 2 * half]` into `y` (same shape), pair `i` of
/// token `t` rotated by the angle whose cosine and sine are `cos[t, i]` and `sin[t, i]`
/// (`[n, half]` each), `rope()`; `neox` pairs `(i, i + half)`, otherwise `(2i, 2i + 1)`.
/// All f32.
///
/// # Errors
/// `n * heads * 2 * half` past `u32::MAX`, or buffers shorter than the shapes.
#[allow(clippy::too_many_arguments)]
pub fn launch_rope(
    client: &Client,
    x: BufferArg,
    cos: BufferArg,
    sin: BufferArg,
    y: BufferArg,
    n: usize,
    heads: usize,
    half: usize,
    neox: bool,
) -> Result<(), KernelError> {
    const OP: &str = "rope";
    let total = n
        .checked_mul(heads)
        .and_then(|v| v.checked_mul(half))
        .and_then(|v| v.checked_mul(2))
        .filter(|t| *t <= u32::MAX as usize);
    let table = n.checked_mul(half);
    let (Some(total), Some(table)) = (total, table) else {
        return Err(shape_err(
            OP,
            format!("{n} x {heads} x {} values: too many", 2 * half),
        ));
    };
    if x.len() < total || y.len() < total || cos.len() < table || sin.len() < table {
        return Err(shape_err(
            OP,
            format!(
                "x has {}, y {}, cos {} and sin {} values, {n} x {heads} x {} and {n} x {half} \
                 needed",
                x.len(),
                y.len(),
                cos.len(),
                sin.len(),
                2 * half
            ),
        ));
    }
    let units = (total / 2) as u32;
    if units == 0 {
        return Ok(());
    }
    let per_cube = 64u32;
    // SAFETY: units at or past n * heads * half do nothing; the others read and write x and y
    // below n * heads * 2 * half and the tables below n * half, all checked above.
    unsafe {
        rope::launch_unchecked(
            client,
            cube_count_for(units.div_ceil(per_cube)),
            CubeDim::new_1d(per_cube),
            x,
            cos,
            sin,
            y,
            n as u32,
            heads as u32,
            half as u32,
            neox,
        )
    };
    Ok(())
}

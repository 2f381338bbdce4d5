//! RMSNorm over the last dimension with its weight, one kernel: `y = x / sqrt(mean(x^2) + eps) * w`
//! (llama.cpp `ggml_rms_norm` followed by `ggml_mul` with the norm weight, which its GPU
//! backends fuse the same way).
//!
//! Written from Burn tensor ops, one norm was three to seven kernels on lavapipe (square, mean,
//! add, sqrt, reciprocal, two multiplies: Burn's fusion merged some of them, depending on what
//! else was queued), six norms per Gemma 3 layer.
use crate::{KernelError, cube_count_for, shape_err};
use cubecl::client::Client;
use cubecl::prelude::*;

/// One unit per row: `x`, `y` `[rows, cols]` f32, `w` `[cols]` f32. The sum of squares runs in
/// f32 in element order; the result is `(x * inv) * w` with `inv = 1 / sqrt(sum / cols + eps)`,
/// ggml's order of operations.
#[cube(launch_unchecked, create_dummy_kernel)]
pub(crate) fn rms_norm(x: &[f32], w: &[f32], y: &mut [f32], rows: u32, cols: u32, eps: f32) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let row = cube * CUBE_DIM_X + UNIT_POS_X;
    if row < rows {
        let base = row * cols;
        let mut sum = 0.0f32;
        for i in 0..cols {
            let v = x[(base + i) as usize];
            sum += v * v;
        }
        let inv = 1.0f32 / f32::sqrt(sum / f32::cast_from(cols) + eps);
        for i in 0..cols {
            y[(base + i) as usize] = x[(base + i) as usize] * inv * w[i as usize];
        }
    }
}

/// The residual step between two sub-layers, one kernel: `x_out = x + o'` with `o' =
/// rms_norm(o, w_pre)` when `pre` (Gemma's post-attention and post-FFN norms) or `o' = o`, then
/// `h = rms_norm(x_out, w)`: the new residual stream and the next sub-layer's normalised input
/// (llama.cpp's `add` followed by `rms_norm` and `mul`, which its Vulkan backend fuses the same
/// way). One unit per row; `x`, `o`, `x_out`, `h` `[rows, cols]` f32, `w_pre`, `w` `[cols]`
/// f32. Each norm computes exactly as [`rms_norm()`] does, so the result equals the unfused ops
/// bit for bit.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_rms_norm(
    x: &[f32],
    o: &[f32],
    w_pre: &[f32],
    w: &[f32],
    x_out: &mut [f32],
    h: &mut [f32],
    rows: u32,
    cols: u32,
    eps: f32,
    #[comptime] pre: bool,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let row = cube * CUBE_DIM_X + UNIT_POS_X;
    if row < rows {
        let base = row * cols;
        let mut inv_o = 1.0f32;
        if comptime!(pre) {
            let mut sum = 0.0f32;
            for i in 0..cols {
                let v = o[(base + i) as usize];
                sum += v * v;
            }
            inv_o = 1.0f32 / f32::sqrt(sum / f32::cast_from(cols) + eps);
        }
        let mut sum = 0.0f32;
        for i in 0..cols {
            let mut v = o[(base + i) as usize];
            if comptime!(pre) {
                v = v * inv_o * w_pre[i as usize];
            }
            let s = x[(base + i) as usize] + v;
            x_out[(base + i) as usize] = s;
            sum += s * s;
        }
        let inv = 1.0f32 / f32::sqrt(sum / f32::cast_from(cols) + eps);
        for i in 0..cols {
            h[(base + i) as usize] = x_out[(base + i) as usize] * inv * w[i as usize];
        }
    }
}

/// RMSNorm of each row with its weight: `y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w`,
/// `rms_norm()`. `x`, `y`: `[rows, cols]` f32; `w`: `[cols]` f32.
///
/// # Errors
/// `cols` of 0, `rows * cols` past `u32::MAX`, or buffers shorter than the shapes.
pub fn launch_rms_norm(
    client: &Client,
    x: BufferArg,
    w: BufferArg,
    y: BufferArg,
    rows: usize,
    cols: usize,
    eps: f32,
) -> Result<(), KernelError> {
    const OP: &str = "rms_norm";
    let total = rows.checked_mul(cols).filter(|t| *t <= u32::MAX as usize);
    let Some(total) = total.filter(|_| cols > 0) else {
        return Err(shape_err(
            OP,
            format!("{rows} rows of {cols}: empty rows or more than u32::MAX values"),
        ));
    };
    if x.len() < total || y.len() < total || w.len() < cols {
        return Err(shape_err(
            OP,
            format!(
                "x has {}, y {} and w {} values, {rows} x {cols} and {cols} needed",
                x.len(),
                y.len(),
                w.len()
            ),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let per_cube = 64u32;
    let count = cube_count_for((rows as u32).div_ceil(per_cube));
    // SAFETY: units past `rows` do nothing; reads and writes are below rows * cols <= the
    // lengths of x and y, and below cols <= w's.
    unsafe {
        rms_norm::launch_unchecked(
            client,
            count,
            CubeDim::new_1d(per_cube),
            x,
            w,
            y,
            rows as u32,
            cols as u32,
            eps,
        )
    };
    Ok(())
}

/// The residual step, `add_rms_norm()`: `x_out = x + o'` (`o' = rms_norm(o, w_pre)`
/// when `w_pre` is given, else `o`) and `h = rms_norm(x_out, w)`. `x`, `o`, `x_out`, `h`:
/// `[rows, cols]` f32; `w_pre`, `w`: `[cols]` f32 (pass any buffer as `w_pre` with
/// `pre = false`: it is not read).
///
/// # Errors
/// `cols` of 0, `rows * cols` past `u32::MAX`, or buffers shorter than the shapes.
#[allow(clippy::too_many_arguments)]
pub fn launch_add_rms_norm(
    client: &Client,
    x: BufferArg,
    o: BufferArg,
    w_pre: BufferArg,
    w: BufferArg,
    x_out: BufferArg,
    h: BufferArg,
    rows: usize,
    cols: usize,
    eps: f32,
    pre: bool,
) -> Result<(), KernelError> {
    const OP: &str = "add_rms_norm";
    let total = rows.checked_mul(cols).filter(|t| *t <= u32::MAX as usize);
    let Some(total) = total.filter(|_| cols > 0) else {
        return Err(shape_err(
            OP,
            format!("{rows} rows of {cols}: empty rows or more than u32::MAX values"),
        ));
    };
    let short = [&x, &o, &x_out, &h].iter().any(|b| b.len() < total)
        || w.len() < cols
        || (pre && w_pre.len() < cols);
    if short {
        return Err(shape_err(
            OP,
            format!(
                "x {}, o {}, x_out {}, h {}, w_pre {}, w {} values for {rows} x {cols}",
                x.len(),
                o.len(),
                x_out.len(),
                h.len(),
                w_pre.len(),
                w.len()
            ),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let per_cube = 64u32;
    // SAFETY: units past `rows` do nothing; reads and writes are below rows * cols, checked
    // against x, o, x_out and h, and the weights are read below cols (w_pre only with `pre`).
    unsafe {
        add_rms_norm::launch_unchecked(
            client,
            cube_count_for((rows as u32).div_ceil(per_cube)),
            CubeDim::new_1d(per_cube),
            x,
            o,
            w_pre,
            w,
            x_out,
            h,
            rows as u32,
            cols as u32,
            eps,
            pre,
        )
    };
    Ok(())
}

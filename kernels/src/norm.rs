//! RMSNorm over the last dimension with its weight, one kernel: `y = x / sqrt(mean(x^2) + eps) * w`
//! (llama.cpp `ggml_rms_norm` followed by `ggml_mul` with the norm weight, which its GPU
//! backends fuse the same way).
//!
//! Written from Burn tensor ops, one norm was three to seven kernels on lavapipe (square, mean,
//! add, sqrt, reciprocal, two multiplies: Burn's fusion merged some of them, depending on what
//! else was queued), six norms per Gemma 3 layer.
use cubecl::prelude::*;

/// One unit per row: `x`, `y` `[rows, cols]` f32, `w` `[cols]` f32. The sum of squares runs in
/// f32 in element order; the result is `(x * inv) * w` with `inv = 1 / sqrt(sum / cols + eps)`,
/// ggml's order of operations.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn rms_norm(x: &[f32], w: &[f32], y: &mut [f32], rows: u32, cols: u32, eps: f32) {
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

//! Gated linear unit of a feed-forward block, one kernel: `act(gate) * up` elementwise, with
//! ggml's GELU (tanh approximation; llama.cpp `ggml_geglu`) or SiLU (`ggml_swiglu`).
//!
//! From Burn tensor ops the GELU form was ten kernels per Gemma 3 layer on lavapipe.
use crate::{KernelError, cube_count_for, shape_err};
use cubecl::client::Client;
use cubecl::prelude::*;

/// `sqrt(2 / pi)`, ggml's `SQRT_2_OVER_PI`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// ggml's `GELU_COEF_A`.
const GELU_COEF_A: f32 = 0.044_715;

/// A GEMV epilogue code (`crate::gemv::gemv_glu()`, `crate::gemv::gemv_rows()`): no epilogue.
pub const GLU_NONE: u32 = 0;
/// A GEMV epilogue code: `gelu_tanh(gate) * up` of a stacked gate/up projection.
pub const GLU_GELU: u32 = 1;
/// A GEMV epilogue code: `silu(gate) * up` of a stacked gate/up projection.
pub const GLU_SILU: u32 = 2;

/// The GEMV epilogue code of a gated activation: [`GLU_GELU`] with `gelu`, else [`GLU_SILU`].
pub const fn glu_code(gelu: bool) -> u32 {
    if gelu { GLU_GELU } else { GLU_SILU }
}

/// The gate's activation: ggml's GELU (tanh approximation, its argument clamped to ±15) with
/// `gelu`, SiLU otherwise (see [`glu()`]).
#[cube]
pub(crate) fn glu_act(x: f32, #[comptime] gelu: bool) -> f32 {
    if comptime!(gelu) {
        let inner = (x + x * x * x * GELU_COEF_A) * SQRT_2_OVER_PI;
        x * (f32::tanh(clamp(inner, -15.0, 15.0)) + 1.0) * 0.5
    } else {
        x / (1.0 + f32::exp(-x))
    }
}

/// One unit per element of `y` `[rows, width]`: `y[r, i] = act(gate[r * stride + i]) *
/// up[r * stride + up_off + i]`, all f32. `gate` and `up` may be one buffer holding both halves
/// of a stacked gate/up projection (`stride = 2 * width`, `up_off = width`), or two buffers of
/// `[rows, width]` (`stride = width`, `up_off = 0`). With `gelu`,
/// `act(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, the tanh's argument clamped to
/// ±15 (where f32 tanh is ±1 already: some shader compilers' tanh overflows to NaN beyond);
/// otherwise SiLU, `act(x) = x / (1 + exp(-x))`.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn glu(
    gate: &[f32],
    up: &[f32],
    y: &mut [f32],
    rows: u32,
    width: u32,
    stride: u32,
    up_off: u32,
    #[comptime] gelu: bool,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let i = cube * CUBE_DIM_X + UNIT_POS_X;
    if i < rows * width {
        let r = i / width;
        let c = i % width;
        let a = glu_act(gate[(r * stride + c) as usize], gelu);
        y[i as usize] = a * up[(r * stride + up_off + c) as usize];
    }
}

/// `y[r, i] = act(gate[r * stride + i]) * up[r * stride + up_off + i]` for `y` `[rows, width]`,
/// `glu()`: ggml's GELU (tanh approximation) with `gelu`, SiLU otherwise; all f32. Two
/// `[rows, width]` buffers take `stride = width`, `up_off = 0`; one stacked gate/up projection
/// `[rows, 2 * width]` takes the same buffer twice with `stride = 2 * width`, `up_off = width`.
///
/// # Errors
/// `up_off + width` past `stride`, sizes past `u32::MAX`, or buffers shorter than the shapes.
#[allow(clippy::too_many_arguments)]
pub fn launch_glu(
    client: &Client,
    gate: BufferArg,
    up: BufferArg,
    y: BufferArg,
    rows: usize,
    width: usize,
    stride: usize,
    up_off: usize,
    gelu: bool,
) -> Result<(), KernelError> {
    const OP: &str = "glu";
    let len = rows.checked_mul(width);
    let src = rows.checked_mul(stride);
    let (Some(len), Some(src)) = (len, src) else {
        return Err(shape_err(OP, format!("{rows} rows of {stride}: too many")));
    };
    if len > u32::MAX as usize
        || src > u32::MAX as usize
        || width > stride
        || up_off.checked_add(width).is_none_or(|e| e > stride)
        || gate.len() < src
        || up.len() < src
        || y.len() < len
    {
        return Err(shape_err(
            OP,
            format!(
                "gate has {}, up {} and y {} values for {rows} rows of {width} (stride \
                 {stride}, up at {up_off})",
                gate.len(),
                up.len(),
                y.len()
            ),
        ));
    }
    if len == 0 {
        return Ok(());
    }
    let per_cube = 64u32;
    // SAFETY: units at or past rows * width do nothing; the others write below rows * width
    // and read below rows * stride, checked against every buffer above.
    unsafe {
        glu::launch_unchecked(
            client,
            cube_count_for((len as u32).div_ceil(per_cube)),
            CubeDim::new_1d(per_cube),
            gate,
            up,
            y,
            rows as u32,
            width as u32,
            stride as u32,
            up_off as u32,
            gelu,
        )
    };
    Ok(())
}

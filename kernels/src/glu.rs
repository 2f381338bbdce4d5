//! Gated linear unit of a feed-forward block, one kernel: `act(gate) * up` elementwise, with
//! ggml's GELU (tanh approximation; llama.cpp `ggml_geglu`) or SiLU (`ggml_swiglu`).
//!
//! From Burn tensor ops the GELU form was ten kernels per Gemma 3 layer on lavapipe.
use cubecl::prelude::*;

/// `sqrt(2 / pi)`, ggml's `SQRT_2_OVER_PI`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// ggml's `GELU_COEF_A`.
const GELU_COEF_A: f32 = 0.044_715;

/// One unit per element: `y[i] = act(gate[i]) * up[i]` for `i < len`, all f32. With `gelu`,
/// `act(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, the tanh's argument clamped to
/// ±15 (where f32 tanh is ±1 already: some shader compilers' tanh overflows to NaN beyond);
/// otherwise SiLU, `act(x) = x / (1 + exp(-x))`.
#[cube(launch_unchecked, create_dummy_kernel)]
pub fn glu(gate: &[f32], up: &[f32], y: &mut [f32], len: u32, #[comptime] gelu: bool) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let i = cube * CUBE_DIM_X + UNIT_POS_X;
    if i < len {
        let x = gate[i as usize];
        let a = if comptime!(gelu) {
            let inner = (x + x * x * x * GELU_COEF_A) * SQRT_2_OVER_PI;
            x * (f32::tanh(clamp(inner, -15.0, 15.0)) + 1.0) * 0.5
        } else {
            x / (1.0 + f32::exp(-x))
        };
        y[i as usize] = a * up[i as usize];
    }
}

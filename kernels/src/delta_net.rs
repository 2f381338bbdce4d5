//! Linear attention over a recurrent state (Qwen3.5's gated delta net, llama.cpp
//! `src/models/qwen35.cpp` and the CPU `ggml_ssm_conv` / `ggml_gated_delta_net` in
//! `ggml-cpu/ops.cpp`), one launch each: the short causal convolution with its rolling window
//! ([`launch_causal_conv`]) and the delta rule with its gates ([`launch_gated_delta_net`]).
//!
//! Both take the token rows of a pass as `rows` `[n * 2]` u32 (slot, position per row, as the
//! KV-cache kernels do): consecutive rows of one slot at consecutive positions are a *run*
//! (a sequence's prompt, or one decode token), walked in order by the units of its first row,
//! so a prompt in one pass leaves exactly the state stepping through it token by token does. A
//! run that starts at position 0 starts from a zero state and an empty window. Rows whose slot
//! is not below `slots` are skipped.
use crate::KernelError;
use cubecl::client::Client;
use cubecl::prelude::*;

/// Whether row `t` starts a run: the first row, or one whose previous row is not its slot's
/// previous position.
#[cube]
fn run_start(rows: &[u32], t: u32, slot: u32, pos: u32) -> bool {
    let prev = select(t > 0, t - 1, 0);
    let same = rows[(2 * prev) as usize] == slot && rows[(2 * prev + 1) as usize] + 1 == pos;
    t == 0 || !same
}

/// Rows of the run starting at row `t` (slot `slot`, position `pos`), among `n`.
#[cube]
fn run_len(rows: &[u32], t: u32, n: u32, slot: u32, pos: u32) -> u32 {
    let mut len = 1u32;
    let mut open = true;
    while open {
        let r = t + len;
        if r < n {
            if rows[(2 * r) as usize] == slot && rows[(2 * r + 1) as usize] == pos + len {
                len += 1;
            } else {
                open = false;
            }
        } else {
            open = false;
        }
    }
    len
}

/// Causal depthwise convolution and SiLU: one unit per row and channel; the units of a run's
/// first row walk the run. Input row `t` is `x[t * x_stride..][..ch]` (the first columns of a
/// wider projection). Output row `t`, channel `c`:
/// `silu(sum_j input(t - (d_conv - 1) + j) * weight[c, j])`, where inputs before the run come
/// from the slot's `window` rows (`[slots * (d_conv - 1), ch]`, oldest first; zeros when the
/// run starts at position 0). Afterwards the window holds the run's last `d_conv - 1` inputs.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn causal_conv(
    x: &[f32],
    weight: &[f32],
    rows: &[u32],
    window: &mut [f32],
    out: &mut [f32],
    n: u32,
    ch: u32,
    x_stride: u32,
    d_conv: u32,
    slots: u32,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let id = cube * CUBE_DIM_X + UNIT_POS_X;
    let t = id / ch;
    let c = id % ch;
    // Out-of-range units read row 0 (in range) and then do nothing.
    let at = select(t < n, t, 0);
    let slot = rows[(2 * at) as usize];
    let pos = rows[(2 * at + 1) as usize];
    if t < n && slot < slots && run_start(rows, at, slot, pos) {
        let len = run_len(rows, t, n, slot, pos);
        let taps = d_conv - 1;
        let held = slot * taps;
        let fresh = pos == 0;
        // Input `ii - taps` of the run (`ii` from 0): a row of `x`, or before the run the
        // window's row `ii`.
        for s in 0..len {
            let mut acc = 0.0f32;
            for j in 0..d_conv {
                let ii = s + j;
                let mut v = 0.0f32;
                if ii >= taps {
                    v = x[((t + ii - taps) * x_stride + c) as usize];
                } else if !fresh {
                    v = window[((held + ii) * ch + c) as usize];
                }
                acc += v * weight[(c * d_conv + j) as usize];
            }
            out[((t + s) * ch + c) as usize] = acc / (1.0 + f32::exp(-acc));
        }
        // New window row `r` is input `len + r - taps`: it reads window row `len + r` > `r`,
        // not yet overwritten.
        for r in 0..taps {
            let ii = len + r;
            let mut v = 0.0f32;
            if ii >= taps {
                v = x[((t + ii - taps) * x_stride + c) as usize];
            } else if !fresh {
                v = window[((held + ii) * ch + c) as usize];
            }
            window[((held + r) * ch + c) as usize] = v;
        }
    }
}

/// The gated delta rule: one unit per row, value head `h` and state column `j`; the units of
/// a run's first row walk the run, each updating column `j` of head `h`'s state `S`
/// (`[d_k, d_v]`, at row `slot * n_head_v + h` of `state`). Row `t` of `qkv` (stride
/// `qkv_stride`) holds `q` (`n_head_k * d_k`), `k` (as many) and `v` (`n_head_v * d_v`); row
/// `t` of `gates` (stride `gate_stride`) holds `beta` at `beta_off` and `alpha` right after
/// (`n_head_v` each). Per token, with `q`, `k` of key head `h % n_head_k` L2-normalised (`x / sqrt(sum x^2 + eps)`) and `q` scaled by
/// `1 / sqrt(d_k)`, `g = softplus(alpha + dt_bias) * a` (softplus `x` past 20) and
/// `b = sigmoid(beta)`:
/// `S <- S exp(g)`, `d_j = (v_j - (S^T k)_j) b`, `S[:, j] <- S[:, j] + k d_j`,
/// `o_j = (S^T q)_j`.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated_delta_net(
    qkv: &[f32],
    gates: &[f32],
    dt_bias: &[f32],
    a: &[f32],
    rows: &[u32],
    state: &mut [f32],
    out: &mut [f32],
    n: u32,
    n_head_k: u32,
    n_head_v: u32,
    d_k: u32,
    d_v: u32,
    qkv_stride: u32,
    gate_stride: u32,
    beta_off: u32,
    slots: u32,
    eps: f32,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let id = cube * CUBE_DIM_X + UNIT_POS_X;
    let per_row = n_head_v * d_v;
    let t = id / per_row;
    let h = (id / d_v) % n_head_v;
    let j = id % d_v;
    let at = select(t < n, t, 0);
    let slot = rows[(2 * at) as usize];
    let pos = rows[(2 * at + 1) as usize];
    if t < n && slot < slots && run_start(rows, at, slot, pos) {
        let len = run_len(rows, t, n, slot, pos);
        // Column j of the state: S[i, j] at col + i * d_v.
        let col = (slot * n_head_v + h) * d_k * d_v + j;
        if pos == 0 {
            for i in 0..d_k {
                state[(col + i * d_v) as usize] = 0.0;
            }
        }
        let g_head = h % n_head_k;
        let key_dim = n_head_k * d_k;
        let q_scale = 1.0f32 / f32::sqrt(f32::cast_from(d_k));
        for s in 0..len {
            let tt = t + s;
            let q_off = tt * qkv_stride + g_head * d_k;
            let k_off = q_off + key_dim;
            let mut qq = 0.0f32;
            let mut kk = 0.0f32;
            for i in 0..d_k {
                let qi = qkv[(q_off + i) as usize];
                let ki = qkv[(k_off + i) as usize];
                qq += qi * qi;
                kk += ki * ki;
            }
            let q_inv = q_scale / f32::sqrt(qq + eps);
            let k_inv = 1.0f32 / f32::sqrt(kk + eps);
            let gate = tt * gate_stride + beta_off + h;
            let xa = gates[(gate + n_head_v) as usize] + dt_bias[h as usize];
            let mut sp = xa;
            if xa <= 20.0 {
                sp = f32::log1p(f32::exp(xa));
            }
            let decay = f32::exp(sp * a[h as usize]);
            let b = 1.0f32 / (1.0 + f32::exp(-gates[gate as usize]));
            let mut sk = 0.0f32;
            for i in 0..d_k {
                sk += state[(col + i * d_v) as usize] * qkv[(k_off + i) as usize];
            }
            let vo = (tt * n_head_v + h) * d_v + j;
            let vi = tt * qkv_stride + 2 * key_dim + h * d_v + j;
            let d = (qkv[vi as usize] - sk * k_inv * decay) * b;
            let mut o = 0.0f32;
            for i in 0..d_k {
                let si = (col + i * d_v) as usize;
                let sn = state[si] * decay + qkv[(k_off + i) as usize] * k_inv * d;
                state[si] = sn;
                o += sn * qkv[(q_off + i) as usize];
            }
            out[vo as usize] = o * q_inv;
        }
    }
}

/// Sizes of a gated delta-net layer (llama.cpp `ssm.*` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    /// Key (and query) heads, `ssm.group_count`.
    pub n_head_k: usize,
    /// Value heads, `ssm.time_step_rank`: a multiple of `n_head_k`; value head `h` reads key
    /// head `h % n_head_k` (tiled, as llama.cpp's converter orders them).
    pub n_head_v: usize,
    /// Values per key head, `ssm.state_size`.
    pub d_k: usize,
    /// Values per value head, `ssm.state_size`.
    pub d_v: usize,
}

impl DeltaNetShape {
    /// Query (= key) width, `n_head_k * d_k`.
    pub fn key_dim(&self) -> usize {
        self.n_head_k * self.d_k
    }

    /// Value width, `n_head_v * d_v` (`ssm.inner_size`).
    pub fn value_dim(&self) -> usize {
        self.n_head_v * self.d_v
    }
}

/// Where [`launch_gated_delta_net`] finds its inputs in the rows of its two input buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetStrides {
    /// Row stride of `qkv` (at least `2 * key_dim + value_dim`).
    pub qkv_stride: usize,
    /// Row stride of `gates`.
    pub gate_stride: usize,
    /// Column of `beta` in `gates`; `alpha` follows it.
    pub beta_off: usize,
}

fn fits_u32(values: &[Option<usize>]) -> bool {
    values
        .iter()
        .all(|v| v.is_some_and(|v| v <= u32::MAX as usize))
}

/// The causal convolution and SiLU of the `causal_conv` kernel: `x` `[n, x_stride]` (the inputs in
/// its first `ch` columns), `weight` `[ch, d_conv]` (ggml `ssm_conv1d` `{d_conv, ch}`), `rows`
/// `[n * 2]` u32, `window` `[slots * (d_conv - 1), ch]` (updated in place), `out` `[n, ch]`, all
/// f32 but `rows`.
///
/// # Errors
/// `d_conv` below 2, `x_stride` below `ch`, a buffer shorter than the shapes, or index
/// arithmetic past `u32`.
#[allow(clippy::too_many_arguments)]
pub fn launch_causal_conv(
    client: &Client,
    x: BufferArg,
    weight: BufferArg,
    rows: BufferArg,
    window: BufferArg,
    out: BufferArg,
    n: usize,
    ch: usize,
    x_stride: usize,
    d_conv: usize,
    slots: usize,
) -> Result<(), KernelError> {
    const OP: &str = "causal_conv";
    let x_len = n.checked_mul(x_stride);
    let out_len = n.checked_mul(ch);
    let w_len = ch.checked_mul(d_conv);
    let win_len = slots
        .checked_mul(d_conv.saturating_sub(1))
        .and_then(|r| r.checked_mul(ch));
    if d_conv < 2 || x_stride < ch || !fits_u32(&[x_len, out_len, w_len, win_len, n.checked_mul(2)])
    {
        return Err(crate::shape_err(
            OP,
            format!(
                "n {n}, ch {ch}, x_stride {x_stride}, d_conv {d_conv}, slots {slots}: d_conv < \
                 2, x_stride < ch, or too large"
            ),
        ));
    }
    let [x_len, out_len, w_len, win_len] = [x_len, out_len, w_len, win_len].map(|v| v.unwrap_or(0));
    if x.len() < x_len
        || out.len() < out_len
        || weight.len() < w_len
        || window.len() < win_len
        || rows.len() < 2 * n
    {
        return Err(crate::shape_err(
            OP,
            format!(
                "buffers of x {}, out {}, weight {}, window {}, rows {} values are too short \
                 for n {n}, ch {ch}, d_conv {d_conv}, slots {slots}",
                x.len(),
                out.len(),
                weight.len(),
                window.len(),
                rows.len()
            ),
        ));
    }
    if out_len == 0 {
        return Ok(());
    }
    let units = out_len as u32;
    let per_cube = 64u32;
    // SAFETY: units past n * ch do nothing; a unit reads rows below 2n (its own, the previous
    // and the run's next ones), x and out rows of its run (below n), weights below ch * d_conv
    // and window rows of its slot (below slots, checked), all within the lengths checked.
    unsafe {
        causal_conv::launch_unchecked(
            client,
            crate::cube_count_for(units.div_ceil(per_cube)),
            CubeDim::new_1d(per_cube),
            x,
            weight,
            rows,
            window,
            out,
            n as u32,
            ch as u32,
            x_stride as u32,
            d_conv as u32,
            slots as u32,
        )
    };
    Ok(())
}

/// The gated delta rule of the `gated_delta_net` kernel: `qkv` `[n, qkv_stride]` (`q`, `k`
/// `n_head_k * d_k` each, then `v` `n_head_v * d_v`, from column 0), `gates` `[n, gate_stride]`
/// (the raw `beta` projection at column `beta_off`, `alpha` right after, `n_head_v` each),
/// `dt_bias`, `a` `[n_head_v]` (`ssm_dt.bias`, `ssm_a`), `rows` `[n * 2]` u32, `state`
/// `[slots * n_head_v, d_k, d_v]` (updated in place), `out` `[n, n_head_v * d_v]`, all f32
/// but `rows`.
///
/// # Errors
/// A zero size, `n_head_v` not a multiple of `n_head_k`, strides narrower than their columns,
/// a buffer shorter than the shapes, or index arithmetic past `u32`.
#[allow(clippy::too_many_arguments)]
pub fn launch_gated_delta_net(
    client: &Client,
    qkv: BufferArg,
    gates: BufferArg,
    dt_bias: BufferArg,
    a: BufferArg,
    rows: BufferArg,
    state: BufferArg,
    out: BufferArg,
    n: usize,
    slots: usize,
    s: DeltaNetShape,
    strides: DeltaNetStrides,
    eps: f32,
) -> Result<(), KernelError> {
    const OP: &str = "gated_delta_net";
    let DeltaNetStrides {
        qkv_stride,
        gate_stride,
        beta_off,
    } = strides;
    let qkv_cols = s
        .key_dim()
        .checked_mul(2)
        .and_then(|k| k.checked_add(s.value_dim()));
    let gate_cols = s
        .n_head_v
        .checked_mul(2)
        .and_then(|g| g.checked_add(beta_off));
    let qk_len = n.checked_mul(qkv_stride);
    let v_len = n.checked_mul(s.value_dim());
    let g_len = n.checked_mul(gate_stride);
    let state_len = slots
        .checked_mul(s.n_head_v)
        .and_then(|r| r.checked_mul(s.d_k))
        .and_then(|r| r.checked_mul(s.d_v));
    let ok = s.n_head_k > 0
        && s.d_k > 0
        && s.d_v > 0
        && s.n_head_v.is_multiple_of(s.n_head_k)
        && qkv_cols.is_some_and(|c| c <= qkv_stride)
        && gate_cols.is_some_and(|c| c <= gate_stride)
        && fits_u32(&[qk_len, v_len, g_len, state_len, n.checked_mul(2)]);
    if !ok {
        return Err(crate::shape_err(
            OP,
            format!(
                "{s:?}, {strides:?}, n {n}, slots {slots}: a zero size, heads that do not \
                 tile, strides narrower than their columns, or too large"
            ),
        ));
    }
    let [qk_len, v_len, g_len, state_len] =
        [qk_len, v_len, g_len, state_len].map(|v| v.unwrap_or(0));
    if qkv.len() < qk_len
        || out.len() < v_len
        || gates.len() < g_len
        || dt_bias.len() < s.n_head_v
        || a.len() < s.n_head_v
        || state.len() < state_len
        || rows.len() < 2 * n
    {
        return Err(crate::shape_err(
            OP,
            format!(
                "{s:?}, {strides:?}, n {n}, slots {slots}: buffers of qkv {}, out {}, gates {}, \
                 dt_bias {}, a {}, state {}, rows {} values are too short",
                qkv.len(),
                out.len(),
                gates.len(),
                dt_bias.len(),
                a.len(),
                state.len(),
                rows.len()
            ),
        ));
    }
    if v_len == 0 {
        return Ok(());
    }
    let units = v_len as u32;
    let per_cube = 64u32;
    // SAFETY: units past n * n_head_v * d_v do nothing; a unit reads rows below 2n, qkv, gates
    // and out rows of its run (below n, columns below their strides), its head's dt_bias and a
    // (below n_head_v) and its slot's state rows (below slots, checked), all within the
    // lengths checked.
    unsafe {
        gated_delta_net::launch_unchecked(
            client,
            crate::cube_count_for(units.div_ceil(per_cube)),
            CubeDim::new_1d(per_cube),
            qkv,
            gates,
            dt_bias,
            a,
            rows,
            state,
            out,
            n as u32,
            s.n_head_k as u32,
            s.n_head_v as u32,
            s.d_k as u32,
            s.d_v as u32,
            qkv_stride as u32,
            gate_stride as u32,
            beta_off as u32,
            slots as u32,
            eps,
        )
    };
    Ok(())
}

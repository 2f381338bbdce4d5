//! The step between the Q/K/V projections and attention, one launch (`qk_rope_cache()`):
//! llama.cpp's `rms_norm` + `mul` of Q and K, `rope_ext` of both, and the `set_rows` copies of K
//! and V into the cache, fused. Optional per-head RMSNorm of Q and K, RoPE from a table of
//! angles that lives on the device, Q to its own buffer, K and V written into the paged cache at
//! each token's slot and position (the cache layout, the `rows` buffer and its block table are
//! described in [`crate::attention`]).
use crate::KernelError;
use cubecl::client::Client;
use cubecl::prelude::*;

/// One unit per head row of one token: `n * (n_head + 2 * n_head_kv)` units. Row `j` of token
/// `t` is query head `j` (`j < n_head`), key head `j - n_head`, or value head
/// `j - n_head - n_head_kv`.
///
/// - `qk` `[n, qk_stride]`: query heads at columns `0..n_head * 2 * half`, key heads from
///   column `k_off`; `v` `[n, v_stride]`: value heads from column `v_off` (`qk` and `v` may be
///   the same buffer: one projection of Q, K and V together).
/// - With `norm`, query and key heads are RMS-normalised with `norms` (`[2, 2 * half]`: the
///   query weights, then the key weights): `x * (1 / sqrt(mean(x^2) + eps)) * w`, ggml's
///   order.
/// - Token `t` is at slot `rows[2t]`, position `p = rows[2t + 1]`, in block `b = rows[table_at
///   + slot * width + p / block]`; a token with a slot not below `slots`, a position not below
///   `positions` (at most `width * block` and the RoPE table's rows) or a block not below
///   `blocks` is skipped.
/// - RoPE of position `p` on the first `2 * rot_half` values of each head from `table`: the
///   cosines `[positions, rot_half]` from 0 and the sines from `sin_off` (row `p` holds the
///   angles of position `p`); `neox` pairs
///   `(i, i + rot_half)`, otherwise `(2i, 2i + 1)`; the values past `2 * rot_half` are copied
///   (llama.cpp `rope_ext` with `n_dims` < `ne0`: Qwen3.5's partial rotary).
/// - Queries go to `q_out` `[n, n_head, 2 * half]`; keys and values of KV head `g` to `k_cache`
///   / `v_cache` `[n_head_kv, blocks * block, 2 * half]` at row `(g * blocks + b) * block + p %
///   block`.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn qk_rope_cache(
    qk: &[f32],
    v: &[f32],
    norms: &[f32],
    table: &[f32],
    rows: &[u32],
    q_out: &mut [f32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    n: u32,
    n_head: u32,
    n_head_kv: u32,
    half: u32,
    rot_half: u32,
    qk_stride: u32,
    k_off: u32,
    v_stride: u32,
    v_off: u32,
    slots: u32,
    width: u32,
    block: u32,
    blocks: u32,
    table_at: u32,
    positions: u32,
    sin_off: u32,
    eps: f32,
    #[comptime] norm: bool,
    #[comptime] neox: bool,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let row = cube * CUBE_DIM_X + UNIT_POS_X;
    let per_token = n_head + 2 * n_head_kv;
    let t = row / per_token;
    // Out-of-range units read row 0 (in range) and then do nothing.
    let at = select(row < n * per_token, t * 2, 0);
    let slot = rows[at as usize];
    let pos = rows[(at + 1) as usize];
    let live = row < n * per_token && slot < slots && pos < positions;
    let b = rows[select(live, table_at + slot * width + pos / block, 0) as usize];
    if live && b < blocks {
        let hd = 2 * half;
        let j = row % per_token;
        // KV head `g` of the token is at cache row `g * stride + base`.
        let stride = blocks * block;
        let base = b * block + pos % block;
        if j >= n_head + n_head_kv {
            // A value head: copied into the cache as it is.
            let g = j - n_head - n_head_kv;
            let src = t * v_stride + v_off + g * hd;
            let dst = (g * stride + base) * hd;
            for d in 0..hd {
                v_cache[(dst + d) as usize] = v[(src + d) as usize];
            }
        } else {
            let is_q = j < n_head;
            let src = select(
                is_q,
                t * qk_stride + j * hd,
                t * qk_stride + k_off + (j - n_head) * hd,
            );
            let mut inv = 1.0f32;
            if comptime!(norm) {
                let mut sum = 0.0f32;
                for d in 0..hd {
                    let x = qk[(src + d) as usize];
                    sum += x * x;
                }
                inv = 1.0f32 / f32::sqrt(sum / f32::cast_from(hd) + eps);
            }
            for i in 0..rot_half {
                let (a, b) = if comptime!(neox) {
                    (i, i + rot_half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let mut x1 = qk[(src + a) as usize];
                let mut x2 = qk[(src + b) as usize];
                if comptime!(norm) {
                    let wa = norms[(select(is_q, 0, hd) + a) as usize];
                    let wb = norms[(select(is_q, 0, hd) + b) as usize];
                    x1 = x1 * inv * wa;
                    x2 = x2 * inv * wb;
                }
                let c = table[(pos * rot_half + i) as usize];
                let s = table[(sin_off + pos * rot_half + i) as usize];
                let y1 = x1 * c - x2 * s;
                let y2 = x1 * s + x2 * c;
                if is_q {
                    let dst = (t * n_head + j) * hd;
                    q_out[(dst + a) as usize] = y1;
                    q_out[(dst + b) as usize] = y2;
                } else {
                    let dst = ((j - n_head) * stride + base) * hd;
                    k_cache[(dst + a) as usize] = y1;
                    k_cache[(dst + b) as usize] = y2;
                }
            }
            // Past the rotated values: normalised and copied.
            for d in 2 * rot_half..hd {
                let mut x = qk[(src + d) as usize];
                if comptime!(norm) {
                    x = x * inv * norms[(select(is_q, 0, hd) + d) as usize];
                }
                if is_q {
                    q_out[((t * n_head + j) * hd + d) as usize] = x;
                } else {
                    k_cache[(((j - n_head) * stride + base) * hd + d) as usize] = x;
                }
            }
        }
    }
}

/// Shapes of one [`launch_qk_rope_cache`] call. Heads are `head_dim` f32 values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkRopeShape {
    /// Tokens (rows of the projections).
    pub n: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Values per head (even).
    pub head_dim: usize,
    /// Values of each head RoPE rotates, from its first (even, at most `head_dim`; llama.cpp
    /// `rope.dimension_count`); the rest are copied.
    pub rope_dims: usize,
    /// Row stride of the Q/K projection buffer, in values.
    pub qk_stride: usize,
    /// Column of the first key head in the Q/K buffer (query heads start at 0).
    pub k_off: usize,
    /// Row stride of the V projection buffer.
    pub v_stride: usize,
    /// Column of the first value head in the V buffer.
    pub v_off: usize,
    /// How the caches are paged: blocks, and the block table after the rows
    /// ([`crate::attention::KvPaging`]).
    pub paging: crate::attention::KvPaging,
    /// Bound on the tokens' positions: at most `paging.width * paging.block` and the rows of
    /// the RoPE tables; a token at or past it is skipped.
    pub positions: usize,
}

/// Normalises (with `norm`: `norms` `[2, head_dim]`, the query weights then the key weights,
/// and `eps`), rotates and stores one
/// step's heads, `qk_rope_cache()`: queries of `qk` to `q_out` `[n, n_head, head_dim]`, keys
/// of `qk` and values of `v` into `k_cache` / `v_cache` `[n_head_kv, blocks * block,
/// head_dim]` at each token's slot and position (`rows` `[2n + slots * width]` u32: the rows,
/// then the block table of `paging`). `table`: `[2, rows,
/// rope_dims / 2]` f32, cosines then sines of at least `positions` rows (its second half
/// starts the sines). Without `norm`, `norms` is not read.
///
/// Nine buffers (ten bindings with CubeCL's own): within the 10 storage buffers per stage
/// browsers' WebGPU devices offer.
///
/// # Errors
/// An odd `head_dim` or `rope_dims`, `rope_dims` past `head_dim`, heads that do not fit their
/// strides, `positions` past a slot's `width * block`, a buffer shorter than the shapes, or
/// index arithmetic past `u32`.
#[allow(clippy::too_many_arguments)]
pub fn launch_qk_rope_cache(
    client: &Client,
    qk: BufferArg,
    v: BufferArg,
    norms: BufferArg,
    table: BufferArg,
    rows: BufferArg,
    q_out: BufferArg,
    k_cache: BufferArg,
    v_cache: BufferArg,
    s: QkRopeShape,
    norm: Option<f32>,
    neox: bool,
) -> Result<(), KernelError> {
    const OP: &str = "qk_rope_cache";
    let hd = s.head_dim;
    let end = Some(s.positions);
    let need = |a: usize, b: usize| a.checked_mul(b);
    let q_len = need(s.n, s.n_head).and_then(|v| need(v, hd));
    let pg = s.paging;
    let cache_len = pg.cache_values(s.n_head_kv, hd);
    let rows_len = need(s.n, 2).and_then(|v| v.checked_add(pg.table_values()?));
    let table_len = need(s.positions, s.rope_dims / 2);
    let qk_cols = need(s.n_head, hd).and_then(|q| {
        s.k_off
            .checked_add(need(s.n_head_kv, hd)?)
            .map(|k| k.max(q))
    });
    let v_cols = need(s.n_head_kv, hd).and_then(|v| v.checked_add(s.v_off));
    let (
        Some(end),
        Some(q_len),
        Some(cache_len),
        Some(rows_len),
        Some(table_len),
        Some(qk_cols),
        Some(v_cols),
    ) = (end, q_len, cache_len, rows_len, table_len, qk_cols, v_cols)
    else {
        return Err(crate::shape_err(OP, format!("{s:?}: sizes overflow")));
    };
    let fits_u32 = [
        q_len,
        cache_len,
        rows_len,
        table_len,
        s.n * s.qk_stride,
        s.n * s.v_stride,
    ]
    .iter()
    .all(|&v| v <= u32::MAX as usize);
    if hd == 0
        || !hd.is_multiple_of(2)
        || !s.rope_dims.is_multiple_of(2)
        || s.rope_dims > hd
        || qk_cols > s.qk_stride
        || v_cols > s.v_stride
        || !fits_u32
        || !pg.fits_u32(s.n_head_kv, hd)
    {
        return Err(crate::shape_err(
            OP,
            format!(
                "{s:?}: heads do not fit their strides, head_dim or rope_dims is odd or too \
                 large, or the paging does not fit u32"
            ),
        ));
    }
    if pg.positions().is_none_or(|p| end > p) {
        return Err(crate::shape_err(
            OP,
            format!("positions up to {end} do not fit a slot of {pg:?}"),
        ));
    }
    if rows.len() < rows_len {
        return Err(crate::shape_err(
            OP,
            format!(
                "{} values of rows for {} tokens and a block table of {pg:?}",
                rows.len(),
                s.n
            ),
        ));
    }
    let norm_len = if norm.is_some() { hd } else { 0 };
    if qk.len() < s.n * s.qk_stride
        || v.len() < s.n * s.v_stride
        || q_out.len() < q_len
        || k_cache.len() < cache_len
        || v_cache.len() < cache_len
        || table.len() / 2 < table_len
        || norms.len() < 2 * norm_len
    {
        return Err(crate::shape_err(
            OP,
            format!(
                "{s:?}: buffers of qk {}, v {}, q_out {}, caches {}/{}, table {}, norms {} \
                 values are too short",
                qk.len(),
                v.len(),
                q_out.len(),
                k_cache.len(),
                v_cache.len(),
                table.len(),
                norms.len()
            ),
        ));
    }
    // The sines start half-way through the table.
    let sin_off = table.len() / 2;
    if table.len() > u32::MAX as usize {
        return Err(crate::shape_err(
            OP,
            format!("a table of {} values: past u32", table.len()),
        ));
    }
    let units = s.n * (s.n_head + 2 * s.n_head_kv);
    if units == 0 {
        return Ok(());
    }
    let units = u32::try_from(units)
        .map_err(|_| crate::shape_err(OP, format!("{units} head rows: too many")))?;
    let per_cube = 64u32;
    // SAFETY: units past the last head row, and tokens whose slot, position or block is out
    // of range, do nothing; every index is below the lengths checked above (rows below 2n +
    // slots * width, a live token's table entry within its slot's width as its position is
    // below width * block, query heads below q_len, cache rows below n_head_kv * blocks *
    // block, table rows below
    // positions in each half of the table, projection columns below their strides, norm
    // weights below 2 * head_dim).
    unsafe {
        qk_rope_cache::launch_unchecked(
            client,
            crate::cube_count_for(units.div_ceil(per_cube)),
            CubeDim::new_1d(per_cube),
            qk,
            v,
            norms,
            table,
            rows,
            q_out,
            k_cache,
            v_cache,
            s.n as u32,
            s.n_head as u32,
            s.n_head_kv as u32,
            (hd / 2) as u32,
            (s.rope_dims / 2) as u32,
            s.qk_stride as u32,
            s.k_off as u32,
            s.v_stride as u32,
            s.v_off as u32,
            pg.slots as u32,
            pg.width as u32,
            pg.block as u32,
            pg.blocks as u32,
            (2 * s.n) as u32,
            s.positions as u32,
            sin_off as u32,
            norm.unwrap_or(0.0),
            norm.is_some(),
            neox,
        )
    };
    Ok(())
}

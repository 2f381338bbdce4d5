//! Attention over a per-layer KV cache that lives on the device, in two kernels (the cache is
//! written by `crate::kv_cache::qk_rope_cache()`):
//!
//! - `attention()`: grouped-query attention of 1..n query rows over the cached keys and values,
//!   causal, with an optional sliding window. One cube per (query row, head, split of the key
//!   axis); the scores of a split live in workgroup shared memory, so the softmax is exact
//!   within a split, and the splits are merged with the online-softmax rule (llama.cpp's
//!   flash-attention decode: `flash_attn_ext` with `split_k`, then its reduce step).
//! - `attention_combine()`: that merge, when the keys needed more than one split.
//!
//! The cache of one layer is paged, as vLLM's PagedAttention and llama.cpp's unified KV cache
//! share one pool of cells among sequences: `[n_head_kv, blocks * block, head_dim]` f32 (Burn
//! order), `blocks` blocks of `block` positions for each KV head. A block table gives each
//! sequence (slot) its blocks in position order, so position `p` of KV head `g` of slot `c` is
//! at `((g * blocks + b) * block + p % block) * head_dim` with `b` the table's entry `p / block`
//! of slot `c` ([`KvPaging`]). Each token row of a launch names its slot and position in a
//! `rows` buffer (`[n, 2]` u32: slot, position), which the block table follows (`[slots,
//! width]` u32: one buffer, so a kernel binds no more storage buffers than a browser offers),
//! so one launch serves a prompt's rows in one slot (positions `past..past + n`) or one decode
//! row of each of several sequences at their own positions (batched decode); a row whose slot or
//! position is out of range does nothing. One block per slot of `capacity` positions, block `c`
//! for slot `c`, is the unpaged layout ([`KvPaging::contiguous`]).
use crate::KernelError;
use crate::gemv::Vec4;
use cubecl::client::Client;
use cubecl::prelude::*;

/// Keys one cube of `attention()` scores: the length of its shared scores array. Keys past it
/// go to further cubes, merged by `attention_combine()`.
pub const ATTENTION_SPLIT: u32 = 256;
/// Units in one cube of `attention()` (a power of two: the softmax reductions are trees).
pub const ATTENTION_UNITS: u32 = 64;
/// Most query heads one cube of `attention()` takes (heads sharing a KV head).
pub const ATTENTION_MAX_HEADS: usize = 8;

/// Lanes per key in `attention()`'s scores as the library launches it: 1 on a software device
/// ([`crate::is_software_device`]; there the lanes of a plane are one thread's SIMD lanes, so
/// a key per lane reads the query with one scalar load for all of them where lanes along the
/// head dimension gather both the query and the key), else [`plane_lanes`].
pub fn attention_lanes(client: &Client) -> u32 {
    if crate::is_software_device(client) {
        1
    } else {
        plane_lanes(client)
    }
}

/// A plane per key: the device's plane width where it is fixed, a power of two from 2 to
/// [`ATTENTION_UNITS`], and the device runs plane ops ([`crate::plane_ops`]); else 1 (a key
/// per unit).
pub fn plane_lanes(client: &Client) -> u32 {
    let hw = &client.properties().hardware;
    let width = hw.plane_size_max;
    let fixed = hw.plane_size_min == width
        && width.is_power_of_two()
        && (2..=ATTENTION_UNITS).contains(&width);
    if fixed && crate::plane_ops(client) {
        width
    } else {
        1
    }
}

/// Query heads one cube of `attention()` takes for `rep` query heads per KV head: the largest
/// power of two up to [`ATTENTION_MAX_HEADS`] that divides `rep`.
pub fn attention_heads(rep: usize) -> usize {
    let mut heads = ATTENTION_MAX_HEADS;
    while heads > 1 && !rep.is_multiple_of(heads) {
        heads /= 2;
    }
    heads
}

/// One cube of [`ATTENTION_UNITS`] units (a power of two) per (query row `t`, block of `heads`
/// query heads that share one KV head, split `s` of the key axis), cubes numbered
/// `((t - t0) * (n_head / heads) + b) * splits + s` (a launch covers query rows `t0..n`), as
/// llama.cpp's flash-attention decode groups a KV head's query heads: each key and value is
/// read once for the block. Query `t` reads slot `c = rows[2t]` of the paged caches
/// (`[n_head_kv, blocks * block, head_dim]`, the slot's blocks at `rows[table_at + c * width
/// ..]`: [`KvPaging`]), sits at position `p = rows[2t + 1]` and sees
/// keys `j <= p` with `p - j < window` (`window == 0`: no window) from `lo = p + 1 - window` (0
/// without a window or before it fills); query head `h` reads KV head `h / rep` of its slot. A
/// row whose slot or position is out of range does nothing. The cube scores keys
/// `lo + s * split ..` (at most `split`) for each of its heads into shared memory with
/// `scale * dot(q, k)` (soft-capped when `softcap > 0`: [`soft_cap()`]), takes each head's
/// softmax (maximum and sum as trees over the units) and the weighted sums of the values.
///
/// With `direct` (one split covers every key) it writes `out` `[n, n_head, head_dim]`;
/// otherwise the unnormalised sums to `part_acc` `[n - t0, n_head, splits, head_dim]` and the
/// split's maximum score and sum of exponentials to `part_ml` `[n - t0, n_head, splits, 2]`
/// (a split with no visible key has a sum of 0).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    q: &[Vec4<f32>],
    k_cache: &[Vec4<f32>],
    v_cache: &[Vec4<f32>],
    rows: &[u32],
    out: &mut [Vec4<f32>],
    part_acc: &mut [Vec4<f32>],
    part_ml: &mut [f32],
    n: u32,
    n_head: u32,
    rep: u32,
    head_dim: u32,
    slots: u32,
    width: u32,
    block: u32,
    blocks: u32,
    table_at: u32,
    window: u32,
    splits: u32,
    t0: u32,
    scale: f32,
    softcap: f32,
    #[comptime] split: u32,
    #[comptime] heads: u32,
    #[comptime] lanes: u32,
    #[comptime] direct: bool,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let unit = UNIT_POS_X;
    let units = CUBE_DIM_X;
    let s = cube % splits;
    let head_blocks = n_head / heads;
    // Row-block pair within this launch, and overall.
    let tb = cube / splits;
    let h0 = (tb % head_blocks) * heads;
    let t_local = tb / head_blocks;
    let t = t0 + t_local;
    // Whole cubes past the last query (cube counts are rounded up), and rows whose slot or
    // position is out of range, do nothing; the condition is the same for every unit of a
    // cube, so the barriers below stay uniform.
    let at = select(t < n, t * 2, 0);
    let slot = rows[at as usize];
    let p = rows[(at + 1) as usize];
    let live = t < n && slot < slots && p < width * block;
    let mut lo = 0u32;
    if window > 0 && p + 1 > window {
        lo = p + 1 - window;
    }
    let k0 = lo + s * split;
    // Visible keys of this split: [k_start, k_end).
    let k_start = k0;
    let k_end = min(k0 + split, p + 1);
    // The KV head of the block, and the slot's row of the block table.
    let kvh = h0 / rep;
    let tab = table_at + select(live, slot, 0) * width;
    let mut scores = Shared::<[f32]>::new_slice(comptime!((split * heads) as usize));
    // Per head, each unit's running maximum and sum (then trees over the units).
    let mut mx = Shared::<[f32]>::new_slice(comptime!((ATTENTION_UNITS * heads) as usize));
    let mut sm = Shared::<[f32]>::new_slice(comptime!((ATTENTION_UNITS * heads) as usize));
    #[unroll]
    for r in 0..heads {
        // The running maximum before any score: -f32::MAX, finite (WGSL has no infinity
        // literals).
        mx[(r * units + unit) as usize] = f32::min_value();
        sm[(r * units + unit) as usize] = 0.0f32;
    }

    // Scores for every head of the block, each key's row read once (as 4-value vectors) for
    // all the heads. With `lanes > 1`, a plane of `lanes` units per key (each lane a slice of
    // the head's vectors, added by a plane sum: the key's row is read once, by consecutive
    // lanes); otherwise one key per unit.
    let hd4 = head_dim / 4;
    let mut part = Array::<f32>::new(comptime!(heads as usize));
    let lane = unit % lanes;
    let planes = units / lanes;
    // The same key for every lane of a plane, so the plane sums stay uniform.
    let mut j = k_start + unit / lanes;
    while live && j < k_end {
        let k_base = kv_row(rows, tab, j, kvh, block, blocks) * hd4;
        key_dots(
            q, k_cache, &mut part, k_base, t, n_head, h0, hd4, lane, lanes, heads,
        );
        #[unroll]
        for r in 0..heads {
            let mut dot = part[r as usize];
            if comptime!(lanes > 1) {
                dot = plane_sum(dot);
            }
            if lane == 0 {
                scores[(r * split + j - k0) as usize] = soft_cap(dot * scale, softcap);
            }
        }
        j += planes;
    }
    sync_cube();
    // Each unit's largest score of its keys, per head.
    let mut j = k_start + unit;
    while live && j < k_end {
        #[unroll]
        for r in 0..heads {
            let sc = scores[(r * split + j - k0) as usize];
            let at = (r * units + unit) as usize;
            mx[at] = select(sc > mx[at], sc, mx[at]);
        }
        j += units;
    }
    sync_cube();
    // Each head's maximum: a tree over the units.
    let mut stride = units / 2;
    while stride > 0 {
        if unit < stride {
            #[unroll]
            for r in 0..heads {
                let a = mx[(r * units + unit) as usize];
                let b = mx[(r * units + unit + stride) as usize];
                mx[(r * units + unit) as usize] = select(b > a, b, a);
            }
        }
        sync_cube();
        stride /= 2;
    }
    // Exponentials in place, each unit summing its own, then their sums by the same tree.
    let mut j = k_start + unit;
    while live && j < k_end {
        #[unroll]
        for r in 0..heads {
            let at = (r * split + j - k0) as usize;
            let e = f32::exp(scores[at] - mx[(r * units) as usize]);
            scores[at] = e;
            sm[(r * units + unit) as usize] += e;
        }
        j += units;
    }
    sync_cube();
    let mut stride = units / 2;
    while stride > 0 {
        if unit < stride {
            #[unroll]
            for r in 0..heads {
                let b = sm[(r * units + unit + stride) as usize];
                sm[(r * units + unit) as usize] += b;
            }
        }
        sync_cube();
        stride /= 2;
    }
    // The weighted sums of the values: one 4-value vector of the head dimension per unit at a
    // time, for every head of the block (each value vector read once for all of them). The
    // score index does not depend on the unit, so the units read the same score (on a
    // CPU-emulated device one scalar load for the SIMD lanes instead of a gather).
    let mut acc = Array::<f32>::new(comptime!((heads * 4) as usize));
    let mut d4 = unit;
    while live && d4 < hd4 {
        #[unroll]
        for e in 0..comptime!(heads * 4) {
            acc[e as usize] = 0.0;
        }
        let mut i = k_start;
        while i < k_end {
            // The keys of one block: one read of the block table for them.
            let run_end = min(k_end, (i / block + 1) * block);
            let row0 = kv_row(rows, tab, i, kvh, block, blocks);
            let start = i;
            while i < run_end {
                let v = v_cache[((row0 + i - start) * hd4 + d4) as usize];
                #[unroll]
                for r in 0..heads {
                    let p = scores[(r * split + i - k0) as usize];
                    #[unroll]
                    for c in 0..4u32 {
                        let at = (r * 4 + c) as usize;
                        acc[at] = fma(p, v.extract(c as usize), acc[at]);
                    }
                }
                i += 1;
            }
        }
        #[unroll]
        for r in 0..heads {
            let h = h0 + r;
            let mut o = Vec4::<f32>::empty();
            #[unroll]
            for c in 0..4u32 {
                let a = acc[(r * 4 + c) as usize];
                if comptime!(direct) {
                    o.insert(c as usize, a / sm[(r * units) as usize]);
                } else {
                    o.insert(c as usize, a);
                }
            }
            if comptime!(direct) {
                out[((t * n_head + h) * hd4 + d4) as usize] = o;
            } else {
                let th = t_local * n_head + h;
                part_acc[((th * splits + s) * hd4 + d4) as usize] = o;
            }
        }
        d4 += units;
    }
    if comptime!(!direct) {
        if live && unit < heads {
            let th = t_local * n_head + h0 + unit;
            let at = ((th * splits + s) * 2) as usize;
            part_ml[at] = mx[(unit * units) as usize];
            part_ml[at + 1] = sm[(unit * units) as usize];
        }
    }
}

/// The cache row (`[n_head_kv * blocks * block]` rows of `head_dim` values) of position `j` of
/// KV head `kvh` in the slot whose block table starts at `rows[tab]`: block `rows[tab + j /
/// block]` (clamped to the cache, so a bad table reads a wrong key, never past the buffer).
#[cube]
pub(crate) fn kv_row(rows: &[u32], tab: u32, j: u32, kvh: u32, block: u32, blocks: u32) -> u32 {
    let b = min(rows[(tab + j / block) as usize], blocks - 1);
    (kvh * blocks + b) * block + j % block
}

/// `part[r] = q_r . k` for the `heads` query heads `h0..h0 + heads` of query row `t` and the
/// key row at vector `k_base` of `k_cache`, over the head's 4-value vectors `lane, lane +
/// lanes, ...` (`hd4` vectors a head): each key vector is loaded once for every head.
#[cube]
#[allow(clippy::too_many_arguments)]
fn key_dots(
    q: &[Vec4<f32>],
    k_cache: &[Vec4<f32>],
    part: &mut Array<f32>,
    k_base: u32,
    t: u32,
    n_head: u32,
    h0: u32,
    hd4: u32,
    lane: u32,
    #[comptime] lanes: u32,
    #[comptime] heads: u32,
) {
    #[unroll]
    for r in 0..heads {
        part[r as usize] = 0.0;
    }
    let mut d = lane;
    while d < hd4 {
        let k = k_cache[(k_base + d) as usize];
        #[unroll]
        for r in 0..heads {
            let qv = q[((t * n_head + h0 + r) * hd4 + d) as usize];
            let mut sum = part[r as usize];
            #[unroll]
            for c in 0..4u32 {
                sum = fma(qv.extract(c as usize), k.extract(c as usize), sum);
            }
            part[r as usize] = sum;
        }
        d += lanes;
    }
}

/// Gemma 2's attention-logit soft-capping (llama.cpp `build_attn_mha`, `attn_soft_cap`):
/// `cap * tanh(x / cap)` when `cap > 0`, else `x`. The argument of `tanh` is clamped to
/// `[-15, 15]` first (where `tanh` is 1 to f32 precision): some drivers compute `tanh` from
/// exponentials that overflow to NaN on large inputs.
#[cube]
pub(crate) fn soft_cap(x: f32, cap: f32) -> f32 {
    let mut y = x;
    if cap > 0.0 {
        y = cap * f32::tanh(f32::clamp(x / cap, -15.0, 15.0));
    }
    y
}

/// Merges [`attention()`]'s splits: one unit per output value `(th, d)` of `rows` row-head
/// pairs, written to `out[out_off + th * head_dim + d]`: `sum_s e_s acc_s[d] / sum_s e_s l_s`
/// with `e_s = exp(m_s - max_s m_s)` over the splits with a visible key (`l_s > 0`).
#[cube(launch_unchecked, create_dummy_kernel)]
pub(crate) fn attention_combine(
    part_acc: &[f32],
    part_ml: &[f32],
    out: &mut [f32],
    rows: u32,
    head_dim: u32,
    splits: u32,
    out_off: u32,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let at = cube * CUBE_DIM_X + UNIT_POS_X;
    if at < rows * head_dim {
        let th = at / head_dim;
        let d = at % head_dim;
        // The running maximum before any score: -f32::MAX, finite (WGSL has no infinity literals).
        let mut m = f32::min_value();
        for s in 0..splits {
            let ml = ((th * splits + s) * 2) as usize;
            if part_ml[ml + 1] > 0.0 {
                let ms = part_ml[ml];
                m = select(ms > m, ms, m);
            }
        }
        let mut num = 0.0f32;
        let mut den = 0.0f32;
        for s in 0..splits {
            let ml = ((th * splits + s) * 2) as usize;
            let l = part_ml[ml + 1];
            if l > 0.0 {
                let e = f32::exp(part_ml[ml] - m);
                num += e * part_acc[((th * splits + s) * head_dim + d) as usize];
                den += e * l;
            }
        }
        out[(out_off + at) as usize] = num / den;
    }
}

/// How a layer's KV caches are paged (the module's layout): each cache is `[n_head_kv, blocks *
/// block, head_dim]` f32, and the `rows` buffer of a launch holds, after its `2 * n` values
/// (each token's slot and position), the block table `[slots, width]` u32: entry `i` of slot
/// `c` is the block of its positions `i * block .. (i + 1) * block`. Entries past a slot's
/// blocks are never read for the rows a launch names (a slot's positions stop below its
/// blocks), and an entry not below `blocks` is clamped when read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvPaging {
    /// Sequences: rows of the block table.
    pub slots: usize,
    /// Entries per slot in the block table: a slot holds at most `width * block` positions.
    pub width: usize,
    /// Positions per block.
    pub block: usize,
    /// Blocks each cache holds: its second dimension is `blocks * block`.
    pub blocks: usize,
}

impl KvPaging {
    /// The unpaged layout: one block of `capacity` positions per slot, block `c` for slot `c`
    /// (its table is `0..slots`: [`KvPaging::contiguous_table`]).
    pub fn contiguous(slots: usize, capacity: usize) -> Self {
        Self {
            slots,
            width: 1,
            block: capacity,
            blocks: slots,
        }
    }

    /// The block table of [`KvPaging::contiguous`]: `[0, 1, .., slots - 1]`.
    pub fn contiguous_table(slots: usize) -> Vec<u32> {
        (0..slots).map(|c| c as u32).collect()
    }

    /// Most positions one slot holds: `width * block` (`None` past `usize`).
    pub fn positions(&self) -> Option<usize> {
        self.width.checked_mul(self.block)
    }

    /// Values of one cache, `n_head_kv * blocks * block * head_dim` (`None` past `usize`).
    pub fn cache_values(&self, n_head_kv: usize, head_dim: usize) -> Option<usize> {
        n_head_kv
            .checked_mul(self.blocks)?
            .checked_mul(self.block)?
            .checked_mul(head_dim)
    }

    /// Values of the block table: `slots * width` (`None` past `usize`).
    pub fn table_values(&self) -> Option<usize> {
        self.slots.checked_mul(self.width)
    }

    /// Whether the block table's entries index within `u32` (the kernels' arithmetic): blocks
    /// and positions per slot, and cache rows, `n_head_kv * blocks * block`.
    pub(crate) fn fits_u32(&self, n_head_kv: usize, head_dim: usize) -> bool {
        let max = u32::MAX as usize;
        self.block > 0
            && self.blocks > 0
            && self.positions().is_some_and(|p| p <= max)
            && self
                .cache_values(n_head_kv, head_dim)
                .is_some_and(|v| v <= max)
            && self.table_values().is_some_and(|v| v <= max)
    }
}

/// Shapes of one [`launch_attention`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Query rows, each at its own slot and position (the `rows` buffer).
    pub n: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (divides `n_head`).
    pub n_head_kv: usize,
    /// Values per head.
    pub head_dim: usize,
    /// How the caches are paged: blocks, and the block table after the rows.
    pub paging: KvPaging,
    /// Sliding window: a query at `p` sees keys `j` with `p - j < window` (`None`: all).
    pub window: Option<usize>,
    /// The most keys any query row sees (`min(p + 1, window)` for the largest position
    /// `p`): the key axis is split into `ceil(keys / ATTENTION_SPLIT)` parts.
    pub keys: usize,
}

/// Most f32 values of split partials one [`launch_attention`] allocates at a time: longer
/// prompts run in chunks of query rows.
const ATTENTION_SCRATCH_VALUES: usize = 8 << 20;

/// Causal grouped-query attention of `q` `[n, n_head, head_dim]` over keys and values
/// `[n_head_kv, blocks * block, head_dim]` paged as `s.paging` says, query row `t` over slot
/// `rows[2t]` up to position `rows[2t + 1]` (`rows` `[2n + slots * width]` u32: the rows, then
/// the block table; positions up to it filled), into `out`
/// `[n, n_head, head_dim]`: softmax of `scale * q k^T` over the visible keys (each score
/// soft-capped as `cap * tanh(score / cap)` with `softcap` `Some(cap)`, Gemma 2), times `v`
/// (`attention()`, and `attention_combine()` when `keys` is more than [`ATTENTION_SPLIT`]).
/// All f32. A row whose slot or position is out of range is left unwritten.
///
/// # Errors
/// `n_head` not a multiple of `n_head_kv`, `keys` of 0 or past a slot's positions, a window
/// of 0, buffers shorter than the shapes, or index arithmetic past `u32`.
#[allow(clippy::too_many_arguments)]
pub fn launch_attention(
    client: &Client,
    q: BufferArg,
    k_cache: BufferArg,
    v_cache: BufferArg,
    rows: BufferArg,
    out: BufferArg,
    s: AttentionShape,
    scale: f32,
    softcap: Option<f32>,
) -> Result<(), KernelError> {
    let lanes = attention_lanes(client);
    launch_attention_lanes(
        client, q, k_cache, v_cache, rows, out, s, scale, softcap, lanes,
    )
}

/// [`launch_attention`] with `lanes` per key in the scores (1: a key per unit; more: a plane
/// of that width per key, which the device must run).
///
/// # Errors
/// As [`launch_attention`]; `lanes` not a power of two up to [`ATTENTION_UNITS`], or a
/// soft-cap that is not positive and finite.
#[allow(clippy::too_many_arguments)]
pub fn launch_attention_lanes(
    client: &Client,
    q: BufferArg,
    k_cache: BufferArg,
    v_cache: BufferArg,
    rows: BufferArg,
    out: BufferArg,
    s: AttentionShape,
    scale: f32,
    softcap: Option<f32>,
    lanes: u32,
) -> Result<(), KernelError> {
    const OP: &str = "attention";
    if softcap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
        return Err(crate::shape_err(
            OP,
            format!("soft-cap {softcap:?}: not positive and finite"),
        ));
    }
    let softcap = softcap.unwrap_or(0.0);
    if !lanes.is_power_of_two() || lanes > ATTENTION_UNITS {
        return Err(crate::shape_err(
            OP,
            format!("{lanes} lanes per key: not a power of two up to {ATTENTION_UNITS}"),
        ));
    }
    let hd = s.head_dim;
    let pg = s.paging;
    let q_len = s.n.checked_mul(s.n_head).and_then(|v| v.checked_mul(hd));
    let cache_len = pg.cache_values(s.n_head_kv, hd);
    let rows_len =
        s.n.checked_mul(2)
            .and_then(|v| v.checked_add(pg.table_values()?));
    let (Some(q_len), Some(cache_len), Some(rows_len)) = (q_len, cache_len, rows_len) else {
        return Err(crate::shape_err(OP, format!("{s:?}: sizes overflow")));
    };
    if s.n_head_kv == 0
        || hd == 0
        || !hd.is_multiple_of(4)
        || !s.n_head.is_multiple_of(s.n_head_kv)
        || s.window == Some(0)
        || s.keys == 0
        || pg.positions().is_none_or(|p| s.keys > p)
        || !pg.fits_u32(s.n_head_kv, hd)
        || q_len.max(rows_len) > u32::MAX as usize
        || rows.len() < rows_len
    {
        return Err(crate::shape_err(
            OP,
            format!(
                "{s:?}: heads, window, keys, paging or rows ({} values) that do not fit (the \
                 head size must be a multiple of 4)",
                rows.len()
            ),
        ));
    }
    if q.len() < q_len
        || out.len() < q_len
        || k_cache.len() < cache_len
        || v_cache.len() < cache_len
    {
        return Err(crate::shape_err(
            OP,
            format!(
                "{s:?}: q {}, out {}, caches {}/{} values are too short",
                q.len(),
                out.len(),
                k_cache.len(),
                v_cache.len()
            ),
        ));
    }
    if s.n == 0 || s.n_head == 0 {
        return Ok(());
    }
    let splits = s.keys.div_ceil(ATTENTION_SPLIT as usize);
    // Query heads per cube: those sharing a KV head, at most ATTENTION_MAX_HEADS (a power of
    // two dividing the group).
    let heads = attention_heads(s.n_head / s.n_head_kv);
    let rep = (s.n_head / s.n_head_kv) as u32;
    let window = s.window.map_or(0, |w| w.min(u32::MAX as usize) as u32);
    let dim = CubeDim::new_1d(ATTENTION_UNITS);
    let args = |t: usize| {
        (
            s.n as u32,
            s.n_head as u32,
            rep,
            hd as u32,
            [pg.slots, pg.width, pg.block, pg.blocks, 2 * s.n].map(|v| v as u32),
            window,
            splits as u32,
            t as u32,
        )
    };
    // The buffers' bindings and lengths in f32: the attention kernel reads q, the caches and
    // writes its outputs as 4-value vectors (a quarter as many elements), the combine kernel
    // as f32.
    let [q, k_cache, v_cache, rows, out] = [q, k_cache, v_cache, rows, out].map(|a| {
        let len = a.len();
        match a {
            BufferArg::Handle { handle } => Ok((handle.handle, len)),
            BufferArg::Alias { .. } => Err(crate::shape_err(OP, "aliased buffer".into())),
        }
    });
    let (q, k_cache, v_cache, rows, out) = (q?, k_cache?, v_cache?, rows?, out?);
    // SAFETY (both): the same buffer, as its f32 values or as whole vectors of four.
    let f32s = |(b, len): &(cubecl::server::BufferBinding, usize)| unsafe {
        BufferArg::from_raw_parts_binding(b.clone(), *len)
    };
    let vec4s = |(b, len): &(cubecl::server::BufferBinding, usize)| unsafe {
        BufferArg::from_raw_parts_binding(b.clone(), *len / 4)
    };
    if splits == 1 {
        let cubes = u32::try_from(s.n * (s.n_head / heads))
            .map_err(|_| crate::shape_err(OP, format!("{s:?}: too many query heads")))?;
        let (n, nh, rep, hd, [slots, width, block, blocks, table_at], window, splits, t0) = args(0);
        // SAFETY: one-vector placeholders for the partials, which a direct launch never
        // touches.
        let none = |bytes: usize| unsafe { BufferArg::from_raw_parts(client.empty(bytes), 1) };
        // SAFETY: cubes past the last query row, and rows whose slot or position is out of
        // range, do nothing; rows are read below 2n + slots * width (a live row's slot below
        // slots and its positions below width * block), q and out below n * n_head * head_dim
        // values, the caches below n_head_kv * blocks * block * head_dim (table entries
        // clamped below blocks), the shared scores below ATTENTION_SPLIT (each cube's
        // keys lie in [lo + s * split, lo + (s + 1) * split)); head_dim is a multiple of 4, so
        // vector indices stay below a quarter of those.
        unsafe {
            attention::launch_unchecked(
                client,
                crate::cube_count_for(cubes),
                dim,
                vec4s(&q),
                vec4s(&k_cache),
                vec4s(&v_cache),
                f32s(&rows),
                vec4s(&out),
                none(16),
                none(4),
                n,
                nh,
                rep,
                hd,
                slots,
                width,
                block,
                blocks,
                table_at,
                window,
                splits,
                t0,
                scale,
                softcap,
                ATTENTION_SPLIT,
                heads as u32,
                lanes,
                true,
            )
        };
        return Ok(());
    }
    // Query rows per launch, so the partials stay within ATTENTION_SCRATCH_VALUES.
    let per_row = s.n_head * splits * hd;
    let per_launch = (ATTENTION_SCRATCH_VALUES / per_row).clamp(1, s.n);
    let (acc_len, ml_len) = (per_launch * per_row, per_launch * s.n_head * splits * 2);
    let acc = client.empty(acc_len * 4);
    let ml = client.empty(ml_len * 4);
    for t0 in (0..s.n).step_by(per_launch) {
        let chunk = per_launch.min(s.n - t0);
        let cubes = u32::try_from(chunk * (s.n_head / heads) * splits)
            .map_err(|_| crate::shape_err(OP, format!("{s:?}: too many splits")))?;
        let (n, nh, rep, hd_u, [slots, width, block, blocks, table_at], window, splits_u, t0_u) =
            args(t0);
        let n = n.min((t0 + chunk) as u32);
        // SAFETY: as above for q, out and the caches; the partials are written below
        // chunk * n_head * splits * (head_dim | 2) values, within `acc` and `ml` (acc_len is a
        // multiple of head_dim, so of 4).
        unsafe {
            attention::launch_unchecked(
                client,
                crate::cube_count_for(cubes),
                dim,
                vec4s(&q),
                vec4s(&k_cache),
                vec4s(&v_cache),
                f32s(&rows),
                vec4s(&out),
                BufferArg::from_raw_parts(acc.clone(), acc_len / 4),
                BufferArg::from_raw_parts(ml.clone(), ml_len),
                n,
                nh,
                rep,
                hd_u,
                slots,
                width,
                block,
                blocks,
                table_at,
                window,
                splits_u,
                t0_u,
                scale,
                softcap,
                ATTENTION_SPLIT,
                heads as u32,
                lanes,
                false,
            );
            attention_combine::launch_unchecked(
                client,
                crate::cube_count_for(((chunk * s.n_head * hd) as u32).div_ceil(64)),
                CubeDim::new_1d(64),
                BufferArg::from_raw_parts(acc.clone(), acc_len),
                BufferArg::from_raw_parts(ml.clone(), ml_len),
                f32s(&out),
                (chunk * s.n_head) as u32,
                hd as u32,
                splits_u,
                (t0 * s.n_head * hd) as u32,
            );
        }
    }
    Ok(())
}

//! Attention over a KV cache that lives on the device, as Burn ops: the step that writes a
//! token's heads into the cache ([`qk_rope_cache`]) and attention over it ([`attention`]),
//! one kernel each on a CubeCL device, Burn ops elsewhere; and the RoPE angle table
//! ([`RopeTable`]) both read.
//!
//! A layer's cache is a pair of f32 tensors `[n_head_kv, blocks * block, head_dim]` (keys,
//! values): a pool of blocks of `block` positions that the sequences (slots) of a batch share,
//! each holding the blocks a block table gives it (vLLM's PagedAttention; llama.cpp's unified
//! KV cache), written in place: a decode step copies nothing but the new tokens' heads.
//! [`CacheRows`] says which slot and position each token row of a pass has, and carries the
//! block table, so one launch serves one sequence's prompt or a batch of sequences.
use crate::nn::{RopeStyle, is_cube, rms_norm, rope};
use crate::ops::GgmlOps;
use burn::backend::Dispatch;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
pub use ggml_kernels::{AttentionShape, KvPaging, QkRopeShape};

/// Rotary angles of positions `0..positions`: `cos` and `sin` of
/// `p * base^(-2i / dims) / freq_factors[i]`, `[positions, dims / 2]` f32 each, computed in
/// f64 on the host once and kept on the device in one buffer (the cosines, then the sines:
/// one binding of the KV-cache kernel, which browsers' ten storage buffers per stage
/// require). `dims` is the head size, or the rotated part of it with partial rotary
/// (llama.cpp `rope.dimension_count`).
#[derive(Clone, Debug)]
pub struct RopeTable {
    /// `[positions, head_dim / 2]`: a view of the first half of the table.
    pub cos: Tensor<2>,
    /// `[positions, head_dim / 2]`: a view of the second half of the table.
    pub sin: Tensor<2>,
    /// `[2 * positions * head_dim / 2]`: `cos` then `sin`, row-major.
    table: Tensor<1>,
}

impl RopeTable {
    /// The table of `positions` positions rotating `head_dim` (even) values of each head with
    /// RoPE base `base`; `freq_factors` (`head_dim / 2` values, llama.cpp `rope_freqs`) divide
    /// the frequencies where given.
    pub fn new(
        positions: usize,
        head_dim: usize,
        base: f32,
        freq_factors: Option<&[f32]>,
        device: &Device,
    ) -> Self {
        let half = head_dim / 2;
        let len = positions * half;
        let mut values = vec![0f32; 2 * len];
        for p in 0..positions {
            for i in 0..half {
                let factor = freq_factors.map_or(1.0, |f| f[i] as f64);
                let theta = (base as f64).powf(-2.0 * i as f64 / head_dim as f64) / factor;
                let a = p as f64 * theta;
                values[p * half + i] = a.cos() as f32;
                values[len + p * half + i] = a.sin() as f32;
            }
        }
        let table = Tensor::<1>::from_data(TensorData::new(values, [2 * len]), device);
        let half_of = |at: usize| table.clone().narrow(0, at, len).reshape([positions, half]);
        Self {
            cos: half_of(0),
            sin: half_of(len),
            table,
        }
    }

    /// Positions the table holds.
    pub fn positions(&self) -> usize {
        self.cos.dims()[0]
    }
}

/// The per-head RMSNorm of Q and K: their weights and epsilon.
#[derive(Clone, Copy, Debug)]
pub struct QkNorm<'a> {
    /// `[2 * head_dim]` f32: `attn_q_norm`, then `attn_k_norm` (one buffer, as the KV-cache
    /// kernel binds it: [`QkNorm::stack`] makes it).
    pub weights: &'a Tensor<1>,
    /// `layer_norm_rms_epsilon`.
    pub eps: f32,
}

impl QkNorm<'_> {
    /// The query and key norms' weights (`[head_dim]` each) as one `[2 * head_dim]` tensor.
    pub fn stack(q: Tensor<1>, k: Tensor<1>) -> Tensor<1> {
        Tensor::cat(vec![q, k], 0)
    }
}

/// Where each token row of a forward pass sits in a layer's paged KV caches: its cache slot
/// (which sequence) and its position in that sequence, and each slot's blocks (the block
/// table: [`KvPaging`]). On the host for checks and the Burn-op fallback, and on the device
/// (`[2n + slots * width]` u32: slot and position per row, then the table) for the kernels.
///
/// A batched decode step is one row per sequence, each in its own slot at its own position; a
/// prompt is a run of rows of one slot.
#[derive(Clone, Debug)]
pub struct CacheRows {
    rows: Vec<(usize, usize)>,
    /// Per slot, its blocks in position order.
    tables: Vec<Vec<u32>>,
    paging: KvPaging,
    pub(crate) device: Tensor<1, Int>,
}

impl CacheRows {
    /// Rows at `(slot, position)` each, in the order of the forward pass's token rows, over
    /// caches of `blocks` blocks of `block` positions, slot `c` holding blocks `tables[c]` (its
    /// positions `i * block .. (i + 1) * block` in block `tables[c][i]`).
    ///
    /// # Panics
    /// A row whose slot has no table or whose position is past its slot's blocks, a table
    /// entry not below `blocks`, a block of 0 positions, or a value past `u32::MAX`
    /// (programming errors of the caller: the tables come from its allocator).
    pub fn new(
        rows: Vec<(usize, usize)>,
        tables: &[Vec<u32>],
        block: usize,
        blocks: usize,
        device: &Device,
    ) -> Self {
        let width = tables.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let paging = KvPaging {
            slots: tables.len(),
            width,
            block,
            blocks,
        };
        assert!(
            block > 0
                && tables.iter().flatten().all(|&b| (b as usize) < blocks)
                && rows
                    .iter()
                    .all(|&(c, p)| tables.get(c).is_some_and(|t| p / block < t.len())),
            "CacheRows: rows {rows:?} over block tables {tables:?} of {paging:?}"
        );
        let u32_of = |v: usize| u32::try_from(v).expect("cache slots and positions fit u32");
        // Entries past a slot's blocks: never read for its rows (the kernels clamp them).
        let flat: Vec<u32> = rows
            .iter()
            .flat_map(|&(c, p)| [u32_of(c), u32_of(p)])
            .chain(tables.iter().flat_map(|t| {
                let pad = width - t.len();
                t.iter().copied().chain(std::iter::repeat_n(u32::MAX, pad))
            }))
            .collect();
        let len = flat.len();
        let device = Tensor::from_data(TensorData::new(flat, [len]), (device, DType::U32));
        Self {
            rows,
            tables: tables.to_vec(),
            paging,
            device,
        }
    }

    /// Rows `t..t + n` of these, over the same block tables.
    pub(crate) fn sub(&self, t: usize, n: usize) -> Self {
        let rows = self.rows[t..t + n].to_vec();
        Self::new(
            rows,
            &self.tables,
            self.paging.block,
            self.paging.blocks,
            &self.device.device(),
        )
    }

    /// The rows, `(slot, position)` each.
    pub fn rows(&self) -> &[(usize, usize)] {
        &self.rows
    }

    /// The caches' paging and the block table's shape, as the kernels take it.
    pub fn paging(&self) -> KvPaging {
        self.paging
    }

    /// Token rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// One past the largest position (0 without rows).
    pub fn end(&self) -> usize {
        self.rows.iter().map(|r| r.1 + 1).max().unwrap_or(0)
    }

    /// The most keys any row sees: `min(p + 1, window)` for its position `p`.
    pub fn keys(&self, window: Option<usize>) -> usize {
        self.rows
            .iter()
            .map(|&(_, p)| window.map_or(p + 1, |w| (p + 1).min(w)))
            .max()
            .unwrap_or(0)
    }

    /// Runs of consecutive rows in one slot at consecutive positions: `(first row, slot,
    /// first position, rows)` each (one run for a sequence's rows).
    pub(crate) fn runs(&self) -> Vec<(usize, usize, usize, usize)> {
        let mut runs: Vec<(usize, usize, usize, usize)> = Vec::new();
        for (t, &(c, p)) in self.rows.iter().enumerate() {
            match runs.last_mut() {
                Some((_, rc, rp, len)) if *rc == c && *rp + *len == p => *len += 1,
                _ => runs.push((t, c, p, 1)),
            }
        }
        runs
    }

    /// Slot `slot`'s blocks, in position order.
    ///
    /// # Panics
    /// A slot without a table.
    pub fn table(&self, slot: usize) -> &[u32] {
        &self.tables[slot]
    }
}

/// Where positions `from..from + n` of a slot whose blocks are `table` (in position order,
/// `block` positions each) lie along a paged cache's second dimension (`[n_head_kv, blocks *
/// block, head_dim]`): `(start, len)` pieces in position order, blocks that follow each other
/// merged (one piece for a slot whose blocks do).
///
/// # Panics
/// Positions past the table's blocks, or a block of 0 positions.
pub fn block_pieces(table: &[u32], block: usize, from: usize, n: usize) -> Vec<(usize, usize)> {
    assert!(block > 0, "block_pieces: blocks of 0 positions");
    let mut pieces: Vec<(usize, usize)> = Vec::new();
    let mut p = from;
    while p < from + n {
        let len = (block - p % block).min(from + n - p);
        let start = table[p / block] as usize * block + p % block;
        match pieces.last_mut() {
            Some((s, l)) if *s + *l == start => *l += len,
            _ => pieces.push((start, len)),
        }
        p += len;
    }
    pieces
}

/// Positions `from..from + n` of a slot whose blocks are `table` ([`block_pieces`]) in a
/// layer's paged cache `[n_head_kv, blocks * block, head_dim]`, as `[n_head_kv, n, head_dim]`:
/// a view when they lie in blocks that follow each other, else the pieces concatenated.
///
/// # Panics
/// As [`block_pieces`], or `n` of 0.
pub fn slot_positions(
    cache: &Tensor<3>,
    table: &[u32],
    block: usize,
    from: usize,
    n: usize,
) -> Tensor<3> {
    assert!(n > 0, "slot_positions: no position");
    let mut pieces: Vec<Tensor<3>> = block_pieces(table, block, from, n)
        .into_iter()
        .map(|(start, len)| cache.clone().narrow(1, start, len))
        .collect();
    if pieces.len() == 1 {
        pieces.pop().expect("one piece")
    } else {
        Tensor::cat(pieces, 1)
    }
}

/// Writes one step's heads into a layer's KV cache: from the projections `qk` `[n, qk_stride]`
/// (query heads from column 0, key heads from `layout.k_off`) and `v` `[n, v_stride]` (value
/// heads from `layout.v_off`; `qk` and `v` may be one stacked Q/K/V projection), optionally
/// RMS-normalises Q and K per head (`norm`), rotates them by each token's position in `rows`
/// (`table`, `style`), and stores K and V into `k_cache` / `v_cache` `[n_head_kv, blocks *
/// block, head_dim]` at each token's slot and position, in the block `rows`' table gives.
/// Returns the queries `[n, n_head, head_dim]` and the caches. `layout.paging`,
/// `layout.positions` and `layout.rope_dims` are set here (the paging of `rows`; the table's
/// rows, at most a slot's positions; twice its columns: a table of fewer than `head_dim / 2`
/// angles rotates only the first values of each head).
///
/// On a CubeCL device this is one kernel ([`GgmlOps::ggml_qk_rope_cache`]) that writes the
/// caches in place (copying them first only if another tensor shares their buffers);
/// elsewhere Burn ops (`slice_assign`, per run of rows in one slot and block).
///
/// # Panics
/// If the shapes disagree with `layout` or a row's slot or position is out of range (a
/// programming error in the caller), or on a CubeCL device if the kernel's checks fail.
#[allow(clippy::too_many_arguments)]
pub fn qk_rope_cache(
    qk: Tensor<2>,
    v: Tensor<2>,
    norm: Option<QkNorm<'_>>,
    table: &RopeTable,
    style: RopeStyle,
    k_cache: Tensor<3>,
    v_cache: Tensor<3>,
    rows: &CacheRows,
    layout: QkRopeShape,
) -> (Tensor<3>, Tensor<3>, Tensor<3>) {
    let QkRopeShape {
        n,
        n_head,
        n_head_kv,
        head_dim: hd,
        ..
    } = layout;
    let paging = rows.paging();
    let layout = QkRopeShape {
        paging,
        positions: table.positions().min(paging.width * paging.block),
        rope_dims: 2 * table.cos.dims()[1],
        ..layout
    };
    let cache = [n_head_kv, paging.blocks * paging.block, hd];
    assert!(
        qk.dims() == [n, layout.qk_stride]
            && v.dims() == [n, layout.v_stride]
            && k_cache.dims() == cache
            && v_cache.dims() == cache
            && rows.len() == n
            && rows.rows().iter().all(|&(_, p)| p < layout.positions),
        "qk_rope_cache: qk {:?}, v {:?}, caches {:?}/{:?}, {} table positions for {layout:?}, \
         rows {:?}",
        qk.dims(),
        v.dims(),
        k_cache.dims(),
        v_cache.dims(),
        table.positions(),
        rows.rows()
    );
    if is_cube(&qk.device()) {
        // The table as an unused placeholder when there is no norm: the kernel does not read
        // the norms then.
        let (norms, eps) = match norm {
            Some(QkNorm { weights, eps }) => (weights.clone(), Some(eps)),
            None => (table.table.clone(), None),
        };
        let (q, k_cache, v_cache) = Dispatch::ggml_qk_rope_cache(
            qk.into_dispatch(),
            v.into_dispatch(),
            norms.into_dispatch(),
            table.table.clone().into_dispatch(),
            rows.device.clone().into_dispatch(),
            k_cache.into_dispatch(),
            v_cache.into_dispatch(),
            layout,
            eps,
            style == RopeStyle::Neox,
        );
        return (
            Tensor::from_dispatch(q),
            Tensor::from_dispatch(k_cache),
            Tensor::from_dispatch(v_cache),
        );
    }
    let mut q = qk
        .clone()
        .narrow(1, 0, n_head * hd)
        .reshape([n, n_head, hd]);
    let mut k = qk
        .narrow(1, layout.k_off, n_head_kv * hd)
        .reshape([n, n_head_kv, hd]);
    let v = v
        .narrow(1, layout.v_off, n_head_kv * hd)
        .reshape([n, n_head_kv, hd]);
    if let Some(QkNorm { weights, eps }) = norm {
        q = rms_norm(q, &weights.clone().narrow(0, 0, hd), eps);
        k = rms_norm(k, &weights.clone().narrow(0, hd, hd), eps);
    }
    let (mut k_cache, mut v_cache) = (k_cache, v_cache);
    let mut qs = Vec::new();
    for (t, slot, past, len) in rows.runs() {
        let cos = table.cos.clone().narrow(0, past, len);
        let sin = table.sin.clone().narrow(0, past, len);
        qs.push(rope(q.clone().narrow(0, t, len), &cos, &sin, style));
        let k = rope(k.clone().narrow(0, t, len), &cos, &sin, style).swap_dims(0, 1);
        let v = v.clone().narrow(0, t, len).swap_dims(0, 1);
        let mut o = 0;
        for (start, n) in block_pieces(rows.table(slot), paging.block, past, len) {
            let at = [0..n_head_kv, start..start + n, 0..hd];
            k_cache = k_cache.slice_assign(at.clone(), k.clone().narrow(1, o, n));
            v_cache = v_cache.slice_assign(at, v.clone().narrow(1, o, n));
            o += n;
        }
    }
    (Tensor::cat(qs, 0), k_cache, v_cache)
}

/// Query rows of one sequence up to which a pass's attention runs in the attention kernel: a
/// decode step, a batch of decode steps, or a speculative verify pass (the rows of the fused
/// GEMV, [`crate::tensor::GEMV_BATCH_ROWS`]). A longer run of rows (a prompt) takes the
/// matmul path ([`attention`]).
pub const ATTENTION_KERNEL_ROWS: usize = crate::tensor::GEMV_BATCH_ROWS;

/// Most scores one step of the matmul path holds (`[n_head, rows, keys]` f32, 64 MiB): a long
/// prompt runs in chunks of query rows.
const MATMUL_PATH_SCORES: usize = 16 << 20;

/// Causal grouped-query attention of `q` `[n, n_head, head_dim]` over a layer's paged caches
/// `[n_head_kv, blocks * block, head_dim]`: query row `t` at slot `c` and position `p`
/// (`rows`) sees the keys of its slot at positions up to `p` (within `layout.window` when
/// set); softmax of `scale * q k^T` over them (each score `x` soft-capped as
/// `cap * tanh(x / cap)` with `softcap` `Some(cap)`: Gemma 2's `attn_logit_softcapping`),
/// times the values; query head `h` reads KV head
/// `h / (n_head / n_head_kv)`. Returns `[n, n_head * head_dim]` f32. `layout.keys` and
/// `layout.paging` are set here from `rows`.
///
/// Two paths, chosen per run of rows in one slot ([`CacheRows`]):
/// - runs of up to [`ATTENTION_KERNEL_ROWS`] rows, on a CubeCL device whose compiler takes
///   workgroup shared memory: one kernel for all of them (plus a small combine kernel past
///   [`ggml_kernels::attention::ATTENTION_SPLIT`] visible keys; [`GgmlOps::ggml_attention`]),
///   which never builds a mask: each row alone, as a decode step computes it, so a
///   speculative verify pass gives the rows what decoding them one by one gives;
/// - a longer run (a prompt), and every run elsewhere: the matmul path, Burn ops per chunk of
///   query rows (`q k^T` of a KV head's query heads as one matmul, the additive causal and
///   window mask, softmax, times `v`), so a prompt's keys and values are read once per chunk
///   instead of once per query row (the slot's positions as [`slot_positions`] gathers them:
///   a view where its blocks follow each other, else a copy). On lavapipe a 561-token Gemma 3
///   270M prompt spent 36.2 s of its 61.7 s prefill in the kernel's 18 launches (2026-12-07,
///   `CUBECL_DEBUG_OPTION=profile`).
///
/// # Panics
/// If the shapes disagree with `layout`, a row's slot or position is out of range or the
/// soft-cap is not positive and finite (programming errors in the caller), or on a CubeCL
/// device if the kernel's checks fail.
pub fn attention(
    q: Tensor<3>,
    k_cache: &Tensor<3>,
    v_cache: &Tensor<3>,
    rows: &CacheRows,
    layout: AttentionShape,
    scale: f32,
    softcap: Option<f32>,
) -> Tensor<2> {
    let AttentionShape {
        n,
        n_head,
        n_head_kv,
        head_dim: hd,
        window,
        ..
    } = layout;
    let paging = rows.paging();
    let layout = AttentionShape {
        keys: rows.keys(window),
        paging,
        ..layout
    };
    let cache = [n_head_kv, paging.blocks * paging.block, hd];
    assert!(
        q.dims() == [n, n_head, hd]
            && k_cache.dims() == cache
            && v_cache.dims() == cache
            && rows.len() == n
            && n_head_kv > 0
            && n_head.is_multiple_of(n_head_kv)
            && softcap.is_none_or(|c| c.is_finite() && c > 0.0),
        "attention: q {:?}, caches {:?}/{:?} for {layout:?}, rows {:?}, soft-cap {softcap:?}",
        q.dims(),
        k_cache.dims(),
        v_cache.dims(),
        rows.rows()
    );
    let device = q.device();
    // The kernel reads heads as 4-value vectors.
    let kernel = is_cube(&device)
        && hd.is_multiple_of(4)
        && crate::cube_client(&device).is_some_and(|c| ggml_kernels::shared_memory_ok(&c));
    let launch = |q: Tensor<3>, rows: &Tensor<1, Int>, layout: AttentionShape| {
        Tensor::from_dispatch(Dispatch::ggml_attention(
            q.into_dispatch(),
            k_cache.clone().into_dispatch(),
            v_cache.clone().into_dispatch(),
            rows.clone().into_dispatch(),
            layout,
            scale,
            softcap.unwrap_or(0.0),
        ))
    };
    let runs = rows.runs();
    let short = |len: usize| kernel && len <= ATTENTION_KERNEL_ROWS;
    if runs.iter().all(|r| short(r.3)) {
        return launch(q, &rows.device, layout);
    }
    let mut outs = Vec::with_capacity(runs.len());
    for (t, slot, past, len) in runs {
        let q_run = q.clone().narrow(0, t, len);
        if short(len) {
            let sub = rows.sub(t, len);
            let layout = AttentionShape {
                n: len,
                keys: sub.keys(window),
                ..layout
            };
            outs.push(launch(q_run, &sub.device, layout));
        } else {
            let cache = SlotCache {
                k: k_cache,
                v: v_cache,
                rows,
                slot,
                n_head_kv,
            };
            outs.push(attention_matmul(q_run, cache, past, window, scale, softcap));
        }
    }
    Tensor::cat(outs, 0)
}

/// One slot of a layer's caches.
struct SlotCache<'a> {
    k: &'a Tensor<3>,
    v: &'a Tensor<3>,
    rows: &'a CacheRows,
    slot: usize,
    n_head_kv: usize,
}

/// [`attention`]'s matmul path for one run of query rows `q` `[len, n_head, head_dim]` at
/// positions `past..past + len` of `cache`'s slot: in chunks of query rows whose scores fit
/// [`MATMUL_PATH_SCORES`], each over the keys its rows can see (from the window's start).
fn attention_matmul(
    q: Tensor<3>,
    cache: SlotCache<'_>,
    past: usize,
    window: Option<usize>,
    scale: f32,
    softcap: Option<f32>,
) -> Tensor<2> {
    let [len, n_head, hd] = q.dims();
    let n_head_kv = cache.n_head_kv;
    let rep = n_head / n_head_kv;
    let device = q.device();
    let chunk = (MATMUL_PATH_SCORES / (n_head * (past + len)).max(1)).clamp(1, len);
    let mut outs = Vec::with_capacity(len.div_ceil(chunk));
    for c0 in (0..len).step_by(chunk) {
        let c = chunk.min(len - c0);
        // Query positions first..first + c see keys k0..first + c.
        let first = past + c0;
        let k0 = window.map_or(0, |w| (first + 1).saturating_sub(w));
        let keys = first + c - k0;
        let (table, block) = (cache.rows.table(cache.slot), cache.rows.paging().block);
        let heads = |t: &Tensor<3>| slot_positions(t, table, block, k0, keys);
        let (k, v) = (heads(cache.k), heads(cache.v));
        // Query heads g*rep..(g+1)*rep share KV head g.
        let qg = q
            .clone()
            .narrow(0, c0, c)
            .swap_dims(0, 1)
            .reshape([n_head_kv, rep * c, hd]);
        let scores = qg.matmul(k.swap_dims(1, 2)) * scale as f64; // [nkv, rep*c, keys]
        let mut scores = scores.reshape([n_head_kv, rep, c, keys]);
        if let Some(cap) = softcap {
            // As the kernel: tanh's argument clamped where tanh is 1 to f32 precision.
            scores = (scores / cap as f64).clamp(-15.0, 15.0).tanh() * cap as f64;
        }
        if let Some(mask) = attention_mask(first, c, window, k0, &device) {
            scores = scores + mask.unsqueeze::<4>();
        }
        let probs = softmax(scores, 3).reshape([n_head_kv, rep * c, keys]);
        outs.push(
            probs
                .matmul(v)
                .reshape([n_head, c, hd])
                .swap_dims(0, 1)
                .reshape([c, n_head * hd]),
        );
    }
    Tensor::cat(outs, 0)
}

/// Additive mask `[n, total - k0]` for queries at positions `first..first + n` over keys
/// `k0..total` (`total = first + n`): causal, and within `window` tokens when given; `None`
/// when nothing is masked.
fn attention_mask(
    first: usize,
    n: usize,
    window: Option<usize>,
    k0: usize,
    device: &Device,
) -> Option<Tensor<2>> {
    let keys = first + n - k0;
    let mut m = vec![0.0f32; n * keys];
    let mut masked = false;
    for t in 0..n {
        let p = first + t;
        for j in 0..keys {
            let s = k0 + j;
            if !(s <= p && window.is_none_or(|w| p - s < w)) {
                m[t * keys + j] = f32::NEG_INFINITY;
                masked = true;
            }
        }
    }
    masked.then(|| Tensor::from_data(TensorData::new(m, [n, keys]), device))
}
